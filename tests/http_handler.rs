//! Delivering batches to the user's code over HTTP: retries, `Retry-After`, timeouts, halting on
//! a poison batch or dead-lettering it, CloudEvents checked by the CloudEvents Python SDK, and the
//! `cfp worker` / `cfp deadletter` command lines. The user's endpoint is a real HTTP server in the
//! test; Cosmos is the SDK's emulator (in-process, or `cfp emulator` for the command lines).

use std::collections::{BTreeMap, HashSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use changefeed_operator::cosmos::StartFrom;
use changefeed_operator::processor::{
    CosmosDeadLetters, HttpFormat, HttpHandler, HttpHandlerConfig, OnExhausted, ProcessorHandle, RetryPolicy,
    estimate_leases,
};
use changefeed_operator::worker::metrics::WorkerMetrics;
use http_body_util::BodyExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::common::DiesWithTest;
use crate::common::{
    CFP, DB, Env, ITEMS, cfp_worker, cfp_write, eventually, free_port, http_get, start_emulator, terminate,
};

/// One request the endpoint received, and what it answered.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub(crate) at: Instant,
    pub(crate) headers: BTreeMap<String, String>,
    pub(crate) body: Value,
    pub(crate) status: u16,
}

/// How the endpoint answers request number `n` (0-based): status, `Retry-After`, delay first.
pub(crate) type Rule = Arc<dyn Fn(&Value, usize) -> (u16, Option<&'static str>, Duration) + Send + Sync>;

fn ok() -> Rule {
    Arc::new(|_, _| (200, None, Duration::ZERO))
}

/// Fails (500) every request whose batch holds document `n`.
fn poison(n: u64) -> Rule {
    Arc::new(move |body, _| {
        if documents(body).iter().any(|d| d["n"].as_u64() == Some(n)) {
            (500, None, Duration::ZERO)
        } else {
            (200, None, Duration::ZERO)
        }
    })
}

/// The documents of a JSON or CloudEvents body.
fn documents(body: &Value) -> Vec<Value> {
    match body {
        Value::Array(events) => events.iter().map(|e| e["data"].clone()).collect(),
        _ => body["documents"].as_array().cloned().unwrap_or_default(),
    }
}

/// The user's handler: a real HTTP server recording every request.
pub(crate) struct Endpoint {
    pub(crate) url: String,
    received: Arc<Mutex<Vec<Received>>>,
    rule: Arc<Mutex<Rule>>,
    stop: CancellationToken,
}

impl Endpoint {
    pub(crate) async fn start(rule: Rule) -> Self {
        Self::start_on(0, rule).await
    }

    async fn start_on(port: u16, rule: Rule) -> Self {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let rule = Arc::new(Mutex::new(rule));
        let stop = CancellationToken::new();
        let (log, answer) = (received.clone(), rule.clone());
        tokio::spawn(changefeed_operator::http_server::serve(
            listener,
            stop.clone(),
            move |request| {
                let (log, answer) = (log.clone(), answer.clone());
                async move {
                    if request.uri().path() == "/ready" {
                        return changefeed_operator::http_server::response(200, "text/plain", "ready");
                    }
                    let at = Instant::now();
                    let headers: BTreeMap<String, String> = request
                        .headers()
                        .iter()
                        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or_default().to_owned()))
                        .collect();
                    let bytes = request
                        .into_body()
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                    let number = log.lock().unwrap().len();
                    let rule = answer.lock().unwrap().clone();
                    let (status, retry_after, delay) = rule(&body, number);
                    log.lock().unwrap().push(Received {
                        at,
                        headers,
                        body,
                        status,
                    });
                    tokio::time::sleep(delay).await;
                    let mut response =
                        changefeed_operator::http_server::response(status, "text/plain", format!("answer {status}"));
                    if (300..400).contains(&status) {
                        response
                            .headers_mut()
                            .insert("location", hyper::header::HeaderValue::from_static("/login"));
                    }
                    if let Some(seconds) = retry_after {
                        response
                            .headers_mut()
                            .insert("retry-after", hyper::header::HeaderValue::from_static(seconds));
                    }
                    response
                }
            },
        ));
        Self {
            url: format!("http://127.0.0.1:{port}/changes"),
            received,
            rule,
            stop,
        }
    }

    fn set_rule(&self, rule: Rule) {
        *self.rule.lock().unwrap() = rule;
    }

    pub(crate) fn requests(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// Ids of the documents in requests answered 2xx.
    pub(crate) fn delivered(&self) -> HashSet<String> {
        self.requests()
            .iter()
            .filter(|r| (200..300).contains(&r.status))
            .flat_map(|r| documents(&r.body))
            .filter_map(|d| d["id"].as_str().map(str::to_owned))
            .collect()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub(crate) fn config(url: &str, format: HttpFormat, timeout: Duration) -> HttpHandlerConfig {
    HttpHandlerConfig {
        url: url.parse().expect("url"),
        format,
        timeout,
        headers: vec![("Authorization".into(), "Bearer s3cret".into())],
        readiness_path: None,
        source: "cosmosdb://localhost/dbs/db/colls/items".into(),
    }
}

fn retry(max_attempts: u32, on_exhausted: OnExhausted) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
        on_exhausted,
    }
}

/// Starts one instance delivering over HTTP to `endpoint`, with its metrics.
async fn start(
    env: &Env,
    endpoint: &Endpoint,
    format: HttpFormat,
    policy: RetryPolicy,
    timeout: Duration,
) -> (ProcessorHandle, Arc<WorkerMetrics>, Arc<CosmosDeadLetters>) {
    let mut options = env.options("a");
    options.retry = policy;
    options.start_from = StartFrom::Beginning;
    start_with(env, endpoint, (format, timeout), options).await
}

/// Like [`start`], with `options`.
async fn start_with(
    env: &Env,
    endpoint: &Endpoint,
    (format, timeout): (HttpFormat, Duration),
    options: changefeed_operator::processor::ProcessorOptions,
) -> (ProcessorHandle, Arc<WorkerMetrics>, Arc<CosmosDeadLetters>) {
    let handler = Arc::new(HttpHandler::new(config(&endpoint.url, format, timeout)).expect("handler"));
    let metrics = WorkerMetrics::new(&options.processor_name).expect("metrics");
    env.account
        .ensure_container(DB, "deadletters", "/id")
        .await
        .expect("dead-letter container");
    let letters = Arc::new(CosmosDeadLetters::new(
        env.account.documents(DB, "deadletters").await.expect("dead letters"),
    ));
    let handle = env
        .processor(options, handler)
        .await
        .with_observer(metrics.clone())
        .with_dead_letters(letters.clone())
        .start()
        .await
        .expect("start");
    (handle, metrics, letters)
}

fn metric(metrics: &WorkerMetrics, prefix: &str) -> f64 {
    metrics
        .render()
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn expected(range: std::ops::Range<usize>) -> HashSet<String> {
    range.map(|n| format!("doc-{n}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_requests_are_retried_until_every_document_arrives() {
    let env = Env::new(4).await;
    let endpoint = Endpoint::start(Arc::new(|_, n| {
        if n < 5 {
            (500, None, Duration::ZERO)
        } else {
            (200, None, Duration::ZERO)
        }
    }))
    .await;
    let (handle, metrics, _) = start(
        &env,
        &endpoint,
        HttpFormat::Json,
        retry(10, OnExhausted::Halt),
        Duration::from_secs(10),
    )
    .await;
    env.write(0..1000).await;
    let all = eventually(Duration::from_secs(30), || async { endpoint.delivered().len() == 1000 }).await;
    let requests = endpoint.requests();
    let errors = metric(&metrics, "cfp_handler_errors_total");
    let first = &requests[0];
    println!(
        "first 5 requests answered 500: {} of 1000 delivered in {} requests, handler errors {errors}, lost {}",
        endpoint.delivered().len(),
        requests.len(),
        expected(0..1000).difference(&endpoint.delivered()).count()
    );
    assert!(all);
    assert_eq!(errors, 5.0);
    assert_eq!(first.headers["authorization"], "Bearer s3cret");
    assert_eq!(first.headers["x-cfp-processor"], "proc");
    assert_eq!(first.headers["content-type"], "application/json");
    for field in ["processor", "lease", "feedRange", "batch", "documents"] {
        assert!(first.body.get(field).is_some(), "body has {field}");
    }
    // Retries of one batch keep its id and count the attempts.
    let retried: Vec<&Received> = requests
        .iter()
        .filter(|r| r.headers["x-cfp-batch"] == first.headers["x-cfp-batch"])
        .collect();
    let attempts: Vec<&str> = retried.iter().map(|r| r.headers["x-cfp-attempt"].as_str()).collect();
    assert_eq!(attempts[..2], ["1", "2"]);
    handle.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_document_is_dead_lettered_and_the_lease_moves_on() {
    let env = Env::new(4).await;
    let endpoint = Endpoint::start(poison(500)).await;
    let (handle, metrics, letters) = start(
        &env,
        &endpoint,
        HttpFormat::Json,
        retry(3, OnExhausted::DeadLetter),
        Duration::from_secs(10),
    )
    .await;
    let started = Instant::now();
    env.write(0..1000).await;
    let mut others = expected(0..1000);
    others.remove("doc-500");
    let done = eventually(Duration::from_secs(30), || async {
        endpoint.delivered() == others && letters.list("proc").await.is_ok_and(|l| l.len() == 1)
    })
    .await;
    assert!(done, "delivered {} of 999", endpoint.delivered().len());
    let letter = letters.list("proc").await.unwrap().remove(0);
    // Every lease checkpointed past its batches: nothing left.
    let monitored = env.account.monitored(DB, ITEMS).await.unwrap();
    let caught_up = eventually(Duration::from_secs(10), || async {
        let leases = env.leases().await;
        estimate_leases(&monitored, &leases, StartFrom::Beginning, 8)
            .await
            .is_ok_and(|e| e.iter().all(|l| l.lag == 0))
    })
    .await;
    println!(
        "poison doc-500 among 1000: dead-lettered as {} after {} attempts (error {:?}); 999 others delivered in {:.1?}; dead-lettered metric {}; leases caught up {caught_up}",
        letter.id,
        letter.attempts,
        letter.error,
        started.elapsed(),
        metric(&metrics, "cfp_documents_dead_lettered_total")
    );
    assert_eq!(letter.document["id"], "doc-500");
    assert_eq!(letter.attempts, 3);
    assert_eq!(letter.processor, "proc");
    assert!(letter.error.contains("500"), "{}", letter.error);
    assert!(letter.first_failure <= letter.last_failure);
    assert!(!letter.lease.is_empty());
    assert!(caught_up);
    assert_eq!(metric(&metrics, "cfp_documents_dead_lettered_total"), 1.0);
    handle.stop().await;
}

/// In the all-versions-and-deletes mode a dead letter keeps what happened to its document (the
/// operation, its LSN and time, the previous image), so that `cfp deadletter replay` delivers a
/// delete as a delete, not the deleted document's last image as an upsert. (The emulator's
/// change feed has creates only: the change kept is a create's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_of_the_all_versions_mode_keeps_what_happened_to_the_document() {
    let env = Env::new(1).await;
    let endpoint = Endpoint::start(poison(3)).await;
    let mut options = env.options("a");
    options.mode = changefeed_operator::cosmos::FeedMode::AllVersionsAndDeletes;
    options.start_from = StartFrom::Now;
    options.retry = retry(2, OnExhausted::DeadLetter);
    let (handle, _, letters) = start_with(&env, &endpoint, (HttpFormat::Json, Duration::from_secs(10)), options).await;
    env.write(0..10).await;
    let lettered = eventually(Duration::from_secs(20), || async {
        letters.list("proc").await.is_ok_and(|l| l.len() == 1)
    })
    .await;
    handle.stop().await;
    assert!(lettered, "doc-3 was not dead-lettered");
    let letter = letters.list("proc").await.unwrap().remove(0);
    println!(
        "a dead letter of the all-versions mode: document {}, change {:?}",
        letter.document["id"], letter.change
    );
    let change = letter.change.expect("the change is kept");
    assert_eq!(change.operation_type, changefeed_operator::cosmos::Operation::Create);
    assert!(change.lsn.is_some() && change.timestamp.is_some(), "{change:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn halt_holds_the_poison_batch_until_the_handler_is_fixed() {
    let env = Env::new(4).await;
    let endpoint = Endpoint::start(poison(500)).await;
    let (handle, metrics, letters) = start(
        &env,
        &endpoint,
        HttpFormat::Json,
        retry(2, OnExhausted::Halt),
        Duration::from_secs(10),
    )
    .await;
    env.write(0..1000).await;
    let stuck = eventually(Duration::from_secs(20), || async {
        metrics
            .render()
            .lines()
            .any(|l| l.starts_with("cfp_lease_stuck{") && l.ends_with(" 1"))
    })
    .await;
    assert!(stuck, "a lease reports stuck");
    // The other leases keep flowing: new writes outside the stuck lease arrive.
    env.write(1000..1200).await;
    let monitored = env.account.monitored(DB, ITEMS).await.unwrap();
    let flowing = eventually(Duration::from_secs(20), || async {
        let leases = env.leases().await;
        let Ok(estimates) = estimate_leases(&monitored, &leases, StartFrom::Beginning, 8).await else {
            return false;
        };
        estimates.iter().filter(|e| e.lag > 0).count() == 1
    })
    .await;
    let leases = env.leases().await;
    let marked: Vec<&str> = leases
        .iter()
        .filter(|l| l.properties.contains_key("handlerFailing"))
        .map(|l| l.lease_token.as_str())
        .collect();
    let before_fix = endpoint.delivered();
    assert!(flowing, "only the stuck lease has work left");
    assert!(!before_fix.contains("doc-500"));
    assert_eq!(marked.len(), 1, "the stuck lease is marked for the operator");
    assert!(
        letters.list("proc").await.unwrap().is_empty(),
        "halt dead-letters nothing"
    );
    endpoint.set_rule(ok());
    let all = eventually(Duration::from_secs(20), || async {
        endpoint.delivered() == expected(0..1200)
    })
    .await;
    let cleared = eventually(Duration::from_secs(10), || async {
        env.leases()
            .await
            .iter()
            .all(|l| !l.properties.contains_key("handlerFailing"))
    })
    .await;
    println!(
        "halt: lease {marked:?} stuck on doc-500 (cfp_lease_stuck 1, handlerFailing set) while the others flowed ({} of 1200 delivered); after the fix {} of 1200 delivered, lost {}, stuck gauge cleared {}",
        before_fix.len(),
        endpoint.delivered().len(),
        expected(0..1200).difference(&endpoint.delivered()).count(),
        !metrics
            .render()
            .lines()
            .any(|l| l.starts_with("cfp_lease_stuck{") && l.ends_with(" 1"))
    );
    assert!(all && cleared);
    handle.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured_and_timeouts_are_failures() {
    let env = Env::new(1).await;
    env.write(0..10).await;
    let endpoint = Endpoint::start(Arc::new(|_, n| match n {
        0 => (429, Some("1"), Duration::ZERO),
        1 => (200, None, Duration::from_secs(2)),
        _ => (200, None, Duration::ZERO),
    }))
    .await;
    // Retry-After is kept within the backoff range: up to 2 s here.
    let policy = RetryPolicy {
        max_backoff: Duration::from_secs(2),
        ..retry(10, OnExhausted::Halt)
    };
    let (handle, metrics, _) = start(&env, &endpoint, HttpFormat::Json, policy, Duration::from_millis(500)).await;
    assert!(eventually(Duration::from_secs(20), || async { endpoint.requests().len() >= 3 }).await);
    let requests = endpoint.requests();
    let after_429 = requests[1].at - requests[0].at;
    let after_timeout = requests[2].at - requests[1].at;
    println!(
        "429 with Retry-After: 1 → next attempt after {after_429:.2?} (backoff would be 20 ms); a 2 s answer with a 500 ms timeout → retried after {after_timeout:.2?}; handler errors {}",
        metric(&metrics, "cfp_handler_errors_total")
    );
    assert!(after_429 >= Duration::from_millis(950), "{after_429:?}");
    assert!(
        after_timeout < Duration::from_millis(1500),
        "the timeout ended the attempt: {after_timeout:?}"
    );
    assert_eq!(metric(&metrics, "cfp_handler_errors_total"), 2.0);
    assert_eq!(requests[2].headers["x-cfp-attempt"], "3");
    handle.stop().await;
}

/// An endpoint that redirects (an auth proxy sending to its login page, an ingress sending to
/// https) has not handled the batch: every 3xx is a failure — never followed, where a 302 turns
/// the POST into a GET without the documents whose 2xx would checkpoint them unseen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_a_failure_never_a_delivery() {
    for redirect in [301, 302, 303, 307, 308] {
        let env = Env::new(1).await;
        env.write(0..10).await;
        // The batch's POST is redirected to /login; whatever comes there (no documents) gets 200.
        let endpoint = Endpoint::start(Arc::new(move |body, _| {
            (if body.is_null() { 200 } else { redirect }, None, Duration::ZERO)
        }))
        .await;
        let (handle, metrics, _) = start(
            &env,
            &endpoint,
            HttpFormat::Json,
            retry(100, OnExhausted::Halt),
            Duration::from_secs(5),
        )
        .await;
        let failed = eventually(Duration::from_secs(10), || async {
            metric(&metrics, "cfp_handler_errors_total") >= 2.0
        })
        .await;
        let monitored = env.account.monitored(DB, ITEMS).await.unwrap();
        let leases = env.leases().await;
        let lag: u64 = estimate_leases(&monitored, &leases, StartFrom::Beginning, 8)
            .await
            .unwrap()
            .iter()
            .map(|l| l.lag)
            .sum();
        let followed = endpoint.requests().iter().filter(|r| r.body.is_null()).count();
        println!(
            "an endpoint answering {redirect}: handler errors {}, requests following the redirect {followed}, lag left {lag} of 10",
            metric(&metrics, "cfp_handler_errors_total")
        );
        handle.stop().await;
        assert!(failed, "{redirect}: the redirect was taken for a delivery");
        assert_eq!(followed, 0, "{redirect}: the redirect was followed");
        assert_eq!(lag, 10, "{redirect}: checkpointed past documents nobody handled");
    }
}

/// `Retry-After` is kept within the retry policy's backoff range: `0` and a date in the past wait
/// the initial backoff (never a retry at once, also while halted), a day waits the longest
/// backoff (rather than parking the lease until a stall restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_clamped_to_the_backoff_range() {
    let env = Env::new(1).await;
    env.write(0..3).await;
    let endpoint = Endpoint::start(Arc::new(|_, n| match n {
        0 => (429, Some("0"), Duration::ZERO),
        1 => (503, Some("Sun, 06 Nov 1994 08:49:37 GMT"), Duration::ZERO),
        2 => (429, Some("86400"), Duration::ZERO),
        _ => (200, None, Duration::ZERO),
    }))
    .await;
    let policy = RetryPolicy {
        max_attempts: 10,
        initial_backoff: Duration::from_millis(400),
        max_backoff: Duration::from_millis(1500),
        on_exhausted: OnExhausted::Halt,
    };
    let (handle, _, _) = start(&env, &endpoint, HttpFormat::Json, policy, Duration::from_secs(5)).await;
    let answered = eventually(Duration::from_secs(15), || async { endpoint.delivered().len() == 3 }).await;
    let requests = endpoint.requests();
    let gaps: Vec<Duration> = requests.windows(2).map(|w| w[1].at - w[0].at).collect();
    println!("Retry-After 0, a past date, 86400 with backoff 400 ms..1.5 s: waits {gaps:.2?}");
    assert!(answered, "not delivered after a day's Retry-After: waits {gaps:?}");
    assert!(gaps[0] >= Duration::from_millis(380), "Retry-After 0: {:?}", gaps[0]);
    assert!(gaps[1] >= Duration::from_millis(380), "a past date: {:?}", gaps[1]);
    assert!(
        gaps[2] >= Duration::from_millis(1400) && gaps[2] < Duration::from_secs(4),
        "a day: {:?}",
        gaps[2]
    );
    handle.stop().await;
}

/// Answers the first request 500 with a body of `size` bytes streamed as fast as the client
/// takes it, every later one 200; returns the URL and how many bytes of the big body were sent
/// before the client closed the connection.
async fn huge_error_endpoint(
    size: u64,
) -> (
    String,
    Arc<std::sync::atomic::AtomicU64>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/changes", listener.local_addr().expect("address"));
    let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (sent_, requests_) = (sent.clone(), requests.clone());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (sent, requests) = (sent_.clone(), requests_.clone());
            tokio::spawn(async move {
                loop {
                    // One request: headers, then the body its Content-Length announces.
                    let mut buffer = Vec::new();
                    let mut chunk = [0u8; 8192];
                    let header_end = loop {
                        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                            break end + 4;
                        }
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buffer[..header_end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buffer.len() < header_end + length {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    }
                    if requests.fetch_add(1, Ordering::SeqCst) > 0 {
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                        if socket.write_all(ok).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    let head = format!(
                        "HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\ncontent-length: {size}\r\n\r\n"
                    );
                    if socket.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let block = vec![b'x'; 64 * 1024];
                    let mut left = size;
                    while left > 0 {
                        let n = left.min(block.len() as u64) as usize;
                        if socket.write_all(&block[..n]).await.is_err() {
                            return;
                        }
                        sent.fetch_add(n as u64, Ordering::SeqCst);
                        left -= n as u64;
                    }
                }
            });
        }
    });
    (url, sent, requests)
}

/// An error reply's body is read only as far as the log line needs: a handler answering 500 with
/// a 256 MiB body sends little of it before the worker closes that connection, and the batch is
/// retried and delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_reply_with_a_huge_body_is_not_read_whole() {
    use std::sync::atomic::Ordering;
    let size: u64 = 256 * 1024 * 1024;
    let env = Env::new(1).await;
    env.write(0..3).await;
    let (url, sent, requests) = huge_error_endpoint(size).await;
    let mut options = env.options("a");
    options.retry = retry(10, OnExhausted::Halt);
    let handler = Arc::new(HttpHandler::new(config(&url, HttpFormat::Json, Duration::from_secs(30))).expect("handler"));
    let handle = env.processor(options, handler).await.start().await.expect("start");
    let retried = eventually(Duration::from_secs(30), || async {
        requests.load(Ordering::SeqCst) >= 2
    })
    .await;
    // The big body's sender stops once the connection is closed (or the body is done).
    let last = std::sync::atomic::AtomicU64::new(sent.load(Ordering::SeqCst));
    let settled = eventually(Duration::from_secs(10), || async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = sent.load(Ordering::SeqCst);
        last.swap(now, Ordering::SeqCst) == now
    })
    .await;
    let sent = sent.load(Ordering::SeqCst);
    println!(
        "a 500 with a {} MiB body: {:.1} MiB of it sent before the worker closed the connection; requests {}",
        size >> 20,
        sent as f64 / 1048576.0,
        requests.load(Ordering::SeqCst)
    );
    assert!(retried, "the batch was not retried");
    assert!(settled);
    assert!(sent < size / 8, "the worker read {sent} bytes of the error body");
    handle.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_events_validate_with_the_cloudevents_sdk_and_keep_their_ids_on_redelivery() {
    let env = Env::new(1).await;
    env.write(0..20).await;
    let endpoint = Endpoint::start(Arc::new(|_, n| {
        if n == 0 {
            (500, None, Duration::ZERO)
        } else {
            (200, None, Duration::ZERO)
        }
    }))
    .await;
    let (handle, _, _) = start(
        &env,
        &endpoint,
        HttpFormat::CloudEvents,
        retry(5, OnExhausted::Halt),
        Duration::from_secs(10),
    )
    .await;
    assert!(eventually(Duration::from_secs(20), || async { endpoint.delivered().len() == 20 }).await);
    let requests = endpoint.requests();
    let (first, second) = (&requests[0], &requests[1]);
    assert_eq!(first.headers["content-type"], "application/cloudevents-batch+json");
    assert_eq!(first.headers["x-cfp-batch"], second.headers["x-cfp-batch"]);
    let ids = |r: &Received| -> Vec<String> {
        r.body
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ids(first), ids(second), "redelivery keeps the event ids");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), serde_json::to_vec(&second.body).unwrap()).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/cloudevents_check.py");
    let output = std::process::Command::new("python3")
        .arg(script)
        .arg(file.path())
        .output()
        .expect("python3");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the CloudEvents SDK rejected the batch: {stderr}"
    );
    let validated: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    println!(
        "CloudEvents: {} events validated by the CloudEvents Python SDK; redelivery (attempt {}) kept the ids, e.g. {:?}",
        validated.len(),
        second.headers["x-cfp-attempt"],
        validated.first()
    );
    assert_eq!(validated, ids(second));
    handle.stop().await;
}

async fn cfp(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(CFP)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("run cfp")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cfp_worker_posts_batches_and_cfp_deadletter_replays_the_poison() {
    let (mut emulator, endpoint_url) = start_emulator("db/items:/pk:2").await;
    let (handler_port, metrics_port) = (free_port(), free_port());
    let handler_url = format!("http://127.0.0.1:{handler_port}/changes");
    let log_path = std::env::temp_dir().join(format!("cfp-http-worker-{handler_port}.log"));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut worker = cfp_worker(&endpoint_url)
        .args([
            "--handler",
            "http",
            "--handler-url",
            &handler_url,
            "--handler-readiness-path",
            "/ready",
        ])
        .args([
            "--handler-header",
            "X-Tenant=t1",
            "--max-attempts",
            "2",
            "--initial-backoff",
            "10ms",
        ])
        .args([
            "--max-backoff",
            "50ms",
            "--on-exhausted",
            "dead-letter",
            "--dead-letter-container",
            "deadletters",
        ])
        .args(["--poll-interval", "100ms", "--metrics-port", &metrics_port.to_string()])
        .env("CFP_HANDLER_HEADER_Authorization", "Bearer s3cret")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], metrics_port));
    // Not ready while the handler does not answer.
    assert!(
        eventually(Duration::from_secs(20), || async {
            http_get(metrics, "/healthz").await.0 == 200
        })
        .await
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = http_get(metrics, "/readyz").await;
    let endpoint = Endpoint::start_on(handler_port, poison(7)).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            http_get(metrics, "/readyz").await.0 == 200
        })
        .await
    );
    cfp_write(&endpoint_url, 0, 50).await;
    let mut others = expected(0..50);
    others.remove("doc-7");
    assert!(eventually(Duration::from_secs(20), || async { endpoint.delivered() == others }).await);
    let letters_args = [
        "--endpoint",
        &endpoint_url,
        "--dead-letter-database",
        "db",
        "--dead-letter-container",
        "deadletters",
    ];
    let listed = eventually(Duration::from_secs(20), || async {
        let output = cfp(&[&["deadletter", "list", "-o", "json"][..], &letters_args[..]].concat()).await;
        serde_json::from_slice::<Vec<Value>>(&output.stdout).is_ok_and(|l| l.len() == 1)
    })
    .await;
    assert!(listed, "doc-7 dead-lettered");
    let list = cfp(&[&["deadletter", "list", "-o", "json"][..], &letters_args[..]].concat()).await;
    let letters: Vec<Value> = serde_json::from_slice(&list.stdout).unwrap();
    let table = cfp(&[&["deadletter", "list"][..], &letters_args[..]].concat()).await;
    let request = &endpoint.requests()[0];
    assert_eq!(request.headers["authorization"], "Bearer s3cret");
    assert_eq!(request.headers["x-tenant"], "t1");

    // The handler is fixed: replay delivers the dead letter and removes it.
    endpoint.set_rule(ok());
    let replay = cfp(&[
        &[
            "deadletter",
            "replay",
            "--handler",
            "http",
            "--handler-url",
            &handler_url,
        ][..],
        &letters_args[..],
    ]
    .concat())
    .await;
    let after = cfp(&[&["deadletter", "list", "-o", "json"][..], &letters_args[..]].concat()).await;
    let remaining: Vec<Value> = serde_json::from_slice(&after.stdout).unwrap();
    terminate(&mut worker).await;
    let worker_log = std::fs::read_to_string(&log_path).unwrap_or_default();
    println!(
        "cfp worker --handler http: /readyz {} before the handler answered, 200 after; 49 of 50 delivered, doc-7 dead-lettered ({} attempts); cfp deadletter list:\n{}replay: {} → delivered doc-7: {}, dead letters left {}",
        before.0,
        letters[0]["attempts"],
        String::from_utf8_lossy(&table.stdout),
        String::from_utf8_lossy(&replay.stderr)
            .lines()
            .last()
            .unwrap_or_default(),
        endpoint.delivered().contains("doc-7"),
        remaining.len()
    );
    assert_eq!(before.0, 503);
    assert_eq!(letters[0]["document"]["id"], "doc-7");
    assert_eq!(letters[0]["attempts"], 2);
    assert!(replay.status.success(), "{}", String::from_utf8_lossy(&replay.stderr));
    assert!(endpoint.delivered().contains("doc-7"));
    assert!(remaining.is_empty());
    assert!(!worker_log.contains("s3cret"), "a header value was logged");
    terminate(&mut emulator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_python_handler_receives_every_document() {
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:4").await;
    let port = free_port();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/example_handler.py");
    let mut python = tokio::process::Command::new("python3")
        .arg(script)
        .arg(port.to_string())
        .stdout(Stdio::piped())
        .dies_with_test()
        .spawn()
        .expect("python3");
    let stdout = python.stdout.take().unwrap();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    tokio::spawn(async move {
        use tokio::io::AsyncBufReadExt;
        let mut reader = tokio::io::BufReader::new(stdout).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            sink.lock().unwrap().push(line);
        }
    });
    let url = format!("http://127.0.0.1:{port}/changes");
    let mut worker = cfp_worker(&endpoint)
        .args([
            "--handler",
            "http",
            "--handler-url",
            &url,
            "--handler-readiness-path",
            "/ready",
        ])
        .args(["--poll-interval", "100ms"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    cfp_write(&endpoint, 0, 300).await;
    let ids = || -> HashSet<String> {
        lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| v["id"].as_str().map(str::to_owned))
            .collect()
    };
    let all = eventually(Duration::from_secs(30), || async { ids().len() == 300 }).await;
    println!(
        "the documented Python handler: {} of 300 documents received through cfp worker --handler http",
        ids().len()
    );
    assert!(all);
    terminate(&mut worker).await;
    terminate(&mut emulator).await;
}
