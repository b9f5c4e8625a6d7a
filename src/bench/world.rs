//! The in-process world the benchmarks run in: the SDK's in-memory emulator, a monitored
//! container with a backlog, and processors with a counting handler.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::json;

use super::BenchError;
use super::counting_store::CountingStore;
use crate::cosmos::{CosmosAccount, DocumentContainer, StartFrom};
use crate::emulator::Emulator;
use crate::processor::{Batch, ChangeHandler, HandlerError, LeaseStore, Processor, ProcessorHandle, ProcessorOptions};
use crate::worker::{WorkerSettings, open};

/// The database of the benchmark containers.
pub const DB: &str = "bench";
/// The monitored container.
pub const ITEMS: &str = "items";
/// The lease container.
pub const LEASES: &str = "leases";

/// An emulator with a monitored container of `partitions` physical partitions.
pub struct World {
    /// The in-memory account.
    emulator: Emulator,
    /// The account.
    pub account: CosmosAccount,
    /// The monitored container, for writes.
    pub items: DocumentContainer,
}

/// Documents handled, by id, and when the first arrived.
#[derive(Default)]
pub struct Received {
    /// Deliveries so far.
    pub count: AtomicUsize,
    /// Batches handled so far.
    pub batches: AtomicUsize,
    /// Deliveries per document id (with `record_ids`).
    pub ids: Mutex<HashMap<String, u32>>,
    /// When the first batch arrived.
    pub first: Mutex<Option<Instant>>,
    /// Write-to-handler delays in microseconds (documents carrying `writtenAtMicros`).
    pub delays: Mutex<Vec<u64>>,
    /// Whether to keep every id (duplicates) — off for throughput runs.
    pub record_ids: bool,
    /// How long the handler takes per batch (a handler that does work).
    pub handler_time: Duration,
    /// When the first batch was done, and its size.
    pub first_done: std::sync::OnceLock<(Instant, usize)>,
    /// When the latest batch was done.
    pub last_done: Mutex<Option<Instant>>,
}

impl Received {
    /// Deliveries of ids delivered more than once.
    pub fn duplicates(&self) -> usize {
        let ids = self.ids.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        ids.values().map(|n| n.saturating_sub(1) as usize).sum()
    }
}

/// A handler that only counts (and records ids or delays when asked).
pub struct CountingHandler(pub Arc<Received>);

#[async_trait]
impl ChangeHandler for CountingHandler {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        let received = &self.0;
        {
            let mut first = received.first.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            first.get_or_insert_with(Instant::now);
        }
        let now = now_micros();
        let delays: Vec<u64> = batch
            .documents
            .iter()
            .filter_map(|d| d.get("writtenAtMicros").and_then(serde_json::Value::as_u64))
            .map(|at| now.saturating_sub(at))
            .collect();
        if !delays.is_empty() {
            received
                .delays
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend(delays);
        }
        if received.record_ids {
            let mut ids = received.ids.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for id in batch
                .documents
                .iter()
                .filter_map(|d| d.get("id").and_then(serde_json::Value::as_str))
            {
                *ids.entry(id.to_owned()).or_default() += 1;
            }
        }
        if !received.handler_time.is_zero() {
            tokio::time::sleep(received.handler_time).await;
        }
        let done = Instant::now();
        received.first_done.get_or_init(|| (done, batch.documents.len()));
        *received
            .last_done
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(done);
        received.count.fetch_add(batch.documents.len(), Ordering::SeqCst);
        received.batches.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Microseconds since the epoch.
pub fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

impl World {
    /// A fresh account with a monitored container of `partitions` physical partitions.
    pub async fn new(partitions: u32) -> Result<Self, BenchError> {
        let (emulator, account) = Emulator::in_process_with(DB, ITEMS, partitions).await?;
        let items = account.documents(DB, ITEMS).await?;
        Ok(Self {
            emulator,
            account,
            items,
        })
    }

    /// Creates `container` in [`DB`] with `partitions` physical partitions, partitioned on
    /// `partition_key`, at a provisioned throughput of `ru` RU/s as the SDK emulator models it:
    /// writes past each partition's share of it in a second are answered 429.
    pub async fn provision(
        &self,
        container: &str,
        partition_key: &str,
        partitions: u32,
        ru: u64,
    ) -> Result<(), BenchError> {
        let spec = crate::emulator::ContainerSpec {
            database: DB.into(),
            container: container.into(),
            partition_key: partition_key.into(),
            partitions,
        };
        Ok(self.emulator.create_container_with_throughput(&spec, Some(ru)).await?)
    }

    /// Changes `container`'s provisioned throughput to `ru` RU/s, as the management plane does
    /// ([`Emulator::set_throughput`]).
    pub fn set_throughput(&self, container: &str, ru: u64) {
        self.emulator.set_throughput(DB, container, ru);
    }

    /// What `container` of [`DB`] answered so far (requests, 429s, request units).
    pub fn load(&self, container: &str) -> crate::emulator::ContainerLoad {
        self.emulator.load(DB, container)
    }

    /// Writes documents `range` (64 at a time), spread over 997 logical partitions.
    pub async fn write(&self, range: std::ops::Range<usize>) -> Result<(), BenchError> {
        let results: Vec<Result<(), BenchError>> = futures::stream::iter(range)
            .map(|n| self.write_one(n, None))
            .buffer_unordered(64)
            .collect()
            .await;
        results.into_iter().collect()
    }

    /// Writes document `n`, stamped with its write time when `stamped`.
    pub async fn write_one(&self, n: usize, stamped: Option<u64>) -> Result<(), BenchError> {
        let pk = format!("pk-{}", n % 997);
        let mut doc = json!({"id": format!("doc-{n}"), "pk": pk, "n": n});
        if let Some(at) = stamped {
            doc["writtenAtMicros"] = json!(at);
        }
        self.items.upsert(&pk, &doc).await.map(|_| ()).map_err(BenchError::from)
    }

    /// Processor options with the default timings scaled by `scale` (1.0: the defaults).
    pub fn options(processor: &str, instance: &str, scale: f64) -> ProcessorOptions {
        let mut options = ProcessorOptions::new(processor, instance);
        options.start_from = StartFrom::Beginning;
        options.acquire_interval = options.acquire_interval.mul_f64(scale);
        options.renew_interval = options.renew_interval.mul_f64(scale);
        options.expiration = options.expiration.mul_f64(scale);
        options.min_backoff = Duration::from_millis(50);
        options.max_backoff = Duration::from_secs(2);
        options
    }

    /// Opens the processor's containers; its lease store, counted.
    pub async fn store(
        &self,
        options: &ProcessorOptions,
    ) -> Result<(CountingStore, crate::cosmos::MonitoredContainer), BenchError> {
        let (monitored, store) = open(&self.account, &self.account, &settings(options)).await?;
        Ok((CountingStore::new(Arc::new(store)), monitored))
    }

    /// Starts a processor delivering to a counting handler.
    pub async fn start(
        &self,
        options: ProcessorOptions,
        received: Arc<Received>,
    ) -> Result<ProcessorHandle, BenchError> {
        self.start_counted(options, received).await.map(|(handle, _)| handle)
    }

    /// Like [`World::start`], also returning the counted lease store.
    pub async fn start_counted(
        &self,
        options: ProcessorOptions,
        received: Arc<Received>,
    ) -> Result<(ProcessorHandle, Arc<CountingStore>), BenchError> {
        let (store, monitored) = self.store(&options).await?;
        let store = Arc::new(store);
        let handle = Processor::new(monitored, store.clone(), Arc::new(CountingHandler(received)), options)
            .start()
            .await?;
        Ok((handle, store))
    }

    /// Starts a processor delivering to `handler`.
    pub async fn start_with(
        &self,
        options: ProcessorOptions,
        handler: Arc<dyn ChangeHandler>,
    ) -> Result<ProcessorHandle, BenchError> {
        let (store, monitored) = self.store(&options).await?;
        Ok(Processor::new(monitored, Arc::new(store), handler, options)
            .start()
            .await?)
    }

    /// Lease count per owner of `processor` now (unowned under "").
    pub async fn owners(&self, processor: &str) -> Result<HashMap<String, usize>, BenchError> {
        let options = ProcessorOptions::new(processor, "observer");
        let (store, _) = self.store(&options).await?;
        let snapshot = store.snapshot().await?;
        let mut counts = HashMap::new();
        for lease in snapshot.leases {
            *counts.entry(lease.owner.unwrap_or_default()).or_default() += 1;
        }
        Ok(counts)
    }
}

/// Waits up to `patience` until `store` lists `leases` leases, each carrying its owner's report
/// that it caught up (written once per lease after a few quiet empty pages): the steady state
/// the estimate and idle figures are measured in.
pub async fn caught_up_reports(store: &dyn LeaseStore, leases: usize, patience: Duration) -> Result<(), BenchError> {
    wait_until(patience, || async {
        store.snapshot().await.is_ok_and(|snapshot| {
            snapshot.leases.len() == leases
                && snapshot
                    .leases
                    .iter()
                    .all(|l| crate::processor::leases::lag_report::reported_lag(l) == Some(0))
        })
    })
    .await
    .map(|_| ())
    .ok_or_else(|| "the leases did not report that they caught up".into())
}

/// Polls `check` every 20 ms until it holds or `timeout` passes; how long it took.
pub async fn wait_until<F, Fut>(timeout: Duration, mut check: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while started.elapsed() < timeout {
        if check().await {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// A worker of the benchmark's container and lease container (both in [`DB`]) with `options`.
pub(super) fn settings(options: &ProcessorOptions) -> WorkerSettings {
    WorkerSettings {
        database: DB.into(),
        container: ITEMS.into(),
        lease_database: DB.into(),
        lease_container: LEASES.into(),
        create_leases: true,
        options: options.clone(),
    }
}
