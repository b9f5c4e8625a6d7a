//! `cfp demo`: the whole system in one command on the embedded emulator — a container with N
//! partitions served on loopback, a steady writer, M `cfp worker` processes, and on a schedule a
//! crash (kill -9), a partition split, one more worker, and a final drain — then a verification
//! table (written, delivered, lost, duplicates, failover and rebalance times). Lost documents make
//! it fail. [`fleet`] runs the worker processes, `script` the schedule, [`view`] what it shows.

pub mod fleet;
mod script;
pub mod view;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::cosmos::{CosmosError, DocumentContainer, MonitoredContainer, StartFrom};
use crate::emulator::{ContainerSpec, EmulatorError, bind};
use crate::processor::leases::lease::LeaseSnapshot;
use crate::processor::{CosmosLeaseStore, Lease, LeaseStore, estimate_leases};
use crate::worker::WorkerError;
use fleet::LEASE_EXPIRATION;

const DATABASE: &str = "demo";
const CONTAINER: &str = "items";

/// How the demo runs.
#[derive(Debug, Clone, Copy)]
pub struct DemoSettings {
    /// How long documents are written (the drain comes after).
    pub duration: Duration,
    /// Workers at the start.
    pub workers: usize,
    /// Physical partitions of the container.
    pub partitions: u32,
    /// Documents written per second.
    pub rate: u32,
}

/// Why the demo failed.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The emulator could not start.
    #[error(transparent)]
    Emulator(#[from] EmulatorError),
    /// Cosmos failed.
    #[error(transparent)]
    Cosmos(#[from] CosmosError),
    /// The containers could not be opened.
    #[error(transparent)]
    Open(#[from] WorkerError),
    /// A worker process could not start.
    #[error("cannot start a worker process: {0}")]
    Spawn(std::io::Error),
    /// The settings make no sense.
    #[error("{0}")]
    Settings(String),
    /// Documents were written and never delivered.
    #[error("{lost} of {written} written documents were never delivered")]
    Lost {
        /// Never delivered.
        lost: usize,
        /// Written.
        written: usize,
    },
}

/// What the demo measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Verification {
    /// Documents written.
    pub written: usize,
    /// Distinct documents delivered.
    pub delivered: usize,
    /// Written and never delivered.
    pub lost: usize,
    /// Deliveries beyond the first of a document (at-least-once).
    pub duplicates: usize,
    /// From the kill -9 until the survivors owned all the dead worker's leases.
    pub failover: Option<Duration>,
    /// From adding a worker until it owned its fair share.
    pub rebalance: Option<Duration>,
    /// Physical partitions before and after the split.
    pub partitions: (usize, usize),
    /// Leases before and after the split.
    pub leases: (usize, usize),
    /// From the end of writing until everything was delivered.
    pub drain: Option<Duration>,
}

impl Verification {
    /// Nothing measured yet, on a container of `partitions` partitions.
    fn empty(partitions: usize) -> Self {
        Self {
            written: 0,
            delivered: 0,
            lost: 0,
            duplicates: 0,
            failover: None,
            rebalance: None,
            partitions: (partitions, partitions),
            leases: (0, 0),
            drain: None,
        }
    }

    /// The table printed at the end.
    pub fn table(&self) -> String {
        let seconds = |d: Option<Duration>| d.map_or_else(|| "-".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()));
        let mut out = String::new();
        let rows = [
            ("written", self.written.to_string()),
            ("delivered (unique)", self.delivered.to_string()),
            ("lost", self.lost.to_string()),
            (
                "duplicates",
                format!("{} (at-least-once: redelivered after the crash)", self.duplicates),
            ),
            (
                "failover (kill -9)",
                format!(
                    "{} (lease expiration {} s)",
                    seconds(self.failover),
                    LEASE_EXPIRATION.as_secs()
                ),
            ),
            ("rebalance (+1 worker)", seconds(self.rebalance)),
            (
                "split",
                format!(
                    "partitions {} → {}, leases {} → {}",
                    self.partitions.0, self.partitions.1, self.leases.0, self.leases.1
                ),
            ),
            ("drain", seconds(self.drain)),
        ];
        let _ = writeln!(out, "verification");
        for (name, value) in rows {
            let _ = writeln!(out, "  {name:<22} {value}");
        }
        let _ = writeln!(
            out,
            "result: {}",
            if self.lost == 0 {
                "OK, nothing lost"
            } else {
                "FAILED, documents lost"
            }
        );
        out
    }
}

/// Runs the demo, printing as it goes; returns what it measured (an error when anything was lost).
pub async fn run(settings: DemoSettings) -> Result<Verification, DemoError> {
    if settings.workers == 0 || settings.partitions == 0 || settings.rate == 0 {
        return Err(DemoError::Settings(
            "--workers, --partitions and --rate must be at least 1".into(),
        ));
    }
    let spec = ContainerSpec {
        database: DATABASE.into(),
        container: CONTAINER.into(),
        partition_key: "/pk".into(),
        partitions: settings.partitions,
    };
    let (emulator, listener) = bind(SocketAddr::from(([127, 0, 0, 1], 0)), &[spec]).await?;
    let stop = CancellationToken::new();
    let server = tokio::spawn({
        let (emulator, stop) = (emulator.clone(), stop.clone());
        async move { emulator.serve(listener, stop).await }
    });
    let result = async {
        let mut demo = script::Demo::start(settings, emulator).await?;
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
            if demo.step().await? {
                break;
            }
        }
        Ok::<_, DemoError>(demo.finish().await)
    }
    .await;
    stop.cancel();
    let _ = server.await;
    let verification = result?;
    if verification.lost > 0 {
        return Err(DemoError::Lost {
            lost: verification.lost,
            written: verification.written,
        });
    }
    Ok(verification)
}

/// When the scripted events happen.
struct Schedule {
    kill: Duration,
    split: Duration,
    add: Duration,
}

impl Schedule {
    fn new(duration: Duration) -> Self {
        Self {
            kill: duration.mul_f64(0.25),
            split: duration.mul_f64(0.45),
            add: duration.mul_f64(0.6),
        }
    }
}

#[derive(Default)]
struct Done {
    kill: bool,
    split: bool,
    add: bool,
}

/// Live lease owners and how many leases each holds (expired owners count as none).
async fn owners(store: &CosmosLeaseStore) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    let Ok(snapshot) = store.snapshot().await else {
        return counts;
    };
    if !snapshot.initialized {
        // The bootstrap is still creating the leases: a partial count is not the lease set.
        return counts;
    }
    let now = OffsetDateTime::now_utc();
    for lease in &snapshot.leases {
        let owner = if !owner_alive(&snapshot, lease, now) {
            String::new()
        } else {
            lease.owner.clone().unwrap_or_default()
        };
        *counts.entry(owner).or_default() += 1;
    }
    counts
}

/// Whether `lease` has an owner that showed a sign of life within the lease expiration by the
/// wall-clock stamps it wrote: a write of the lease, or a beat of a heartbeat that keeps its
/// leases alive (the demo's workers share this machine's clock; instances never judge each other
/// by these stamps).
fn owner_alive(snapshot: &LeaseSnapshot, lease: &Lease, now: OffsetDateTime) -> bool {
    let Some(owner) = lease.owner.as_deref().filter(|o| !o.is_empty()) else {
        return false;
    };
    let beat_alive = snapshot.keepers.iter().any(|k| k == owner)
        && snapshot
            .instances
            .iter()
            .any(|(name, beat)| name == owner && *beat + LEASE_EXPIRATION >= now);
    beat_alive || !lease.is_expired(now, LEASE_EXPIRATION)
}

async fn estimate(monitored: &MonitoredContainer, store: &CosmosLeaseStore) -> Option<u64> {
    let leases = store.snapshot().await.ok()?.leases;
    let estimates = estimate_leases(monitored, &leases, StartFrom::Beginning, 16)
        .await
        .ok()?;
    Some(estimates.iter().map(|e| e.lag).sum())
}

/// Writes `demo-<n>` documents at a steady rate until stopped.
struct Writer {
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
    ids: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    fn start(items: DocumentContainer, rate: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let ids = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let (stop, count, ids) = (stop.clone(), count.clone(), ids.clone());
            async move {
                let per_tick = (rate / 10).max(1);
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                let mut next: u64 = 0;
                while !stop.load(Ordering::SeqCst) {
                    tick.tick().await;
                    let batch: Vec<u64> = (next..next + u64::from(per_tick)).collect();
                    next += u64::from(per_tick);
                    let written: Vec<Option<String>> = futures::stream::iter(batch)
                        .map(|n| write_one(&items, n))
                        .buffer_unordered(16)
                        .collect()
                        .await;
                    let written: Vec<String> = written.into_iter().flatten().collect();
                    count.fetch_add(written.len() as u64, Ordering::SeqCst);
                    ids.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .extend(written);
                }
            }
        });
        Self { stop, count, ids, task }
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    fn written(&self) -> Vec<String> {
        self.ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn idle(&self) -> bool {
        self.task.is_finished()
    }
}

/// Upserts `demo-<n>`, retrying what a client retries; `None` when it could not be written.
async fn write_one(items: &DocumentContainer, n: u64) -> Option<String> {
    let id = format!("demo-{n}");
    let pk = format!("pk-{}", n % 64);
    let doc = serde_json::json!({"id": id, "pk": pk, "n": n});
    for attempt in 0..20 {
        match items.upsert(&pk, &doc).await {
            Ok(_) => return Some(id),
            Err(error) if error.kind.is_retryable() || error.kind == crate::cosmos::ErrorKind::RangeGone => {
                tokio::time::sleep(Duration::from_millis(50 * (attempt + 1))).await;
            }
            Err(error) => {
                tracing::warn!(document = %id, %error, "write failed");
                return None;
            }
        }
    }
    None
}
