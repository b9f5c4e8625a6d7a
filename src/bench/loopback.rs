//! `cfp worker` processes against `cfp emulator` on loopback: the throughput of one process and
//! of four sharing the backlog (each owning a quarter of the leases), interleaved rounds.

use std::time::Instant;

use super::BenchError;
use super::figures::PATIENCE;
use super::processes::{cpu_seconds, emulator, metric, worker, write_loopback_backlog};
use super::world::wait_until;
use super::{BenchSettings, Figure};

/// Waits (at most [`PATIENCE`]) until `check` holds; when it did.
pub async fn reached<F, Fut>(what: &str, check: F) -> Result<Instant, BenchError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_until(PATIENCE, check)
        .await
        .map(|_| Instant::now())
        .ok_or_else(|| BenchError::from(format!("{what}: timed out")))
}

/// What one round of processes draining the backlog measured.
pub struct Round {
    /// Documents/s from the first document to the last.
    pub rate: f64,
    /// Seconds from process start to the first document.
    pub first: f64,
    /// CPU seconds the processes spent from their start until the backlog was drained.
    pub cpu: f64,
}

/// `instances` worker processes of a new processor over the backlog of `bench/items`.
pub async fn workers_round(
    endpoint: &str,
    processor: &str,
    instances: usize,
    documents: usize,
) -> Result<Round, BenchError> {
    let spawned = Instant::now();
    let mut workers = Vec::new();
    for n in 0..instances {
        workers.push(worker(endpoint, "items", processor, &format!("w{n}"), &[])?);
    }
    let ports: Vec<u16> = workers.iter().map(|(_, port)| *port).collect();
    let processed = || async {
        let mut total = 0.0;
        for port in &ports {
            total += metric(*port, "cfp_documents_processed_total").await;
        }
        total
    };
    let first = reached("the first document", || async { processed().await > 0.0 }).await?;
    let last = reached("the whole backlog", || async { processed().await >= documents as f64 }).await?;
    let cpu = workers.iter().filter_map(|(child, _)| cpu_seconds(child.0.id()?)).sum();
    drop(workers);
    Ok(Round {
        rate: documents as f64 / last.duration_since(first).as_secs_f64().max(0.001),
        first: first.duration_since(spawned).as_secs_f64(),
        cpu,
    })
}

/// Throughput of 4 worker processes against 1 over the same loopback backlog (8 partitions).
pub async fn scale(settings: &BenchSettings) -> Result<Vec<Figure>, BenchError> {
    let (_emulator, endpoint) = emulator(&["bench/items:/pk:8"]).await?;
    let documents = write_loopback_backlog(&endpoint, settings.loopback_documents()).await?;
    let (mut one, mut four) = (Vec::new(), Vec::new());
    for round in 0..settings.rounds {
        one.push(
            workers_round(&endpoint, &format!("one{round}-"), 1, documents)
                .await?
                .rate,
        );
        four.push(
            workers_round(&endpoint, &format!("four{round}-"), 4, documents)
                .await?
                .rate,
        );
    }
    let median = super::figures::median;
    Ok(vec![Figure::ratio(
        "throughput with 4 worker processes (documents/s, loopback, 8 partitions)",
        median(four),
        "1 worker process, same backlog",
        median(one),
        "–",
    )])
}
