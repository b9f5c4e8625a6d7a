//! Hostile HTTP clients against the shared server loop (`cfp emulator` here; the worker's and the
//! operator's metrics ports use the same loop): a client that never finishes its headers is
//! dropped, an oversized body is refused with 413, malformed JSON gets a 4xx — and the server
//! keeps answering everyone else.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{http_get, start_emulator, terminate};

fn address(endpoint: &str) -> std::net::SocketAddr {
    let url = url::Url::parse(endpoint).unwrap();
    format!("{}:{}", url.host_str().unwrap(), url.port().unwrap())
        .parse()
        .unwrap()
}

/// Sends `request` (raw HTTP/1.1) and returns the status code of the answer.
async fn raw_status(address: std::net::SocketAddr, request: &[u8]) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_huge_and_malformed_requests_do_not_take_the_server_down() {
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:2").await;
    let address = address(&endpoint);

    // Slowloris: headers that never end.
    let mut slow = tokio::net::TcpStream::connect(address).await.unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        .await
        .unwrap();
    let started = Instant::now();

    // Meanwhile others are served.
    let (status, body) = http_get(address, "/").await;
    assert_eq!(status, 200, "{body}");

    // An oversized body is refused, not buffered.
    let huge = vec![b'x'; 5 * 1024 * 1024];
    let mut request = format!(
        "POST /dbs/db/colls/items/docs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        huge.len()
    )
    .into_bytes();
    request.extend_from_slice(&huge);
    let oversized = raw_status(address, &request).await;

    // Malformed JSON gets a client error.
    let malformed = raw_status(
        address,
        b"POST /dbs/db/colls/items/docs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nx-ms-documentdb-partitionkey: [\"a\"]\r\nContent-Length: 9\r\nConnection: close\r\n\r\n{\"id\": \"a",
    )
    .await;

    // The slow client is dropped after the header timeout.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(20), slow.read_to_end(&mut rest)).await;
    let dropped_after = started.elapsed();
    let (after, _) = http_get(address, "/").await;
    println!(
        "hostile clients: slowloris dropped after {dropped_after:.1?}; 5 MiB body → {oversized}; malformed JSON → {malformed}; the emulator still answers: {after}"
    );
    assert!(closed.is_ok(), "the slow connection was not dropped within 20 s");
    assert!(dropped_after < Duration::from_secs(15), "{dropped_after:?}");
    assert_eq!(oversized, 413);
    assert!((400..500).contains(&malformed), "malformed JSON answered {malformed}");
    assert_eq!(after, 200);
    terminate(&mut emulator).await;
}
