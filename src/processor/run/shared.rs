//! What a processor's tasks share: the wiring (monitored container, lease store, handler,
//! options, dead letters), its [`Health`], its [`Telemetry`], and the map of owned leases.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::cosmos::{EpkRange, MonitoredContainer};
use crate::processor::budgets::reads::{ReadAllowance, read_part};
use crate::processor::budgets::share::{Holding, Listed, ProvisionedThroughput, part_of};
use crate::processor::budgets::writes::WriteBudget;
use crate::processor::handlers::dead_letters::DeadLetterStore;
use crate::processor::handlers::manual::Handler;
use crate::processor::leases::heartbeat::Liveness;
use crate::processor::leases::lease::LeaseStore;
use crate::processor::leases::name_claim::NameClaim;
use crate::processor::leases::owned::OwnedLease;
use crate::processor::leases::work_report::WorkTimings;
use crate::processor::leases::worker_capacity::WorkerCapacity;
use crate::processor::options::{ProcessorOptions, ReadBudget};
use crate::processor::report::telemetry::Telemetry;
use crate::processor::run::crash_gate::CrashGate;
use crate::processor::run::health::Health;

/// The partition key ranges `(id, range)` as listed, and when.
type PartitionList = (tokio::time::Instant, Vec<(String, EpkRange)>);

/// The processor's parts, shared by the coordinator, the renewer and the lease tasks.
pub(crate) struct Shared {
    /// The container whose change feed is read.
    pub(crate) monitored: MonitoredContainer,
    /// Where the leases are (behind the [`CrashGate`]: every request passes it).
    pub(crate) store: Arc<dyn LeaseStore>,
    /// Closed by an abort: from then on nothing is sent to the lease store.
    pub(crate) gate: Arc<CrashGate>,
    /// Who receives the batches.
    pub(crate) handler: Handler,
    /// How the processor works.
    pub(crate) options: ProcessorOptions,
    /// Where documents the handler keeps failing go (with the `DeadLetter` retry policy).
    pub(crate) dead_letters: OnceLock<Arc<dyn DeadLetterStore>>,
    /// Ready, alive, problems.
    pub(crate) health: Health,
    /// Observer, events, error log.
    pub(crate) telemetry: Telemetry,
    /// The leases processed here now.
    pub(crate) owned: OwnedLeases,
    /// Acquire cycles started so far.
    pub(crate) cycles: AtomicU64,
    /// Woken when a write of an owned lease met a handoff request: an acquire cycle now.
    pub(crate) requested: Arc<tokio::sync::Notify>,
    /// Whether the heartbeat keeps the leases alive or each lease is renewed on its own.
    pub(crate) liveness: Arc<Liveness>,
    /// How this instance spends the lease container's request units (heartbeats before checkpoints).
    pub(crate) budget: Arc<WriteBudget>,
    /// The lease container's provisioned throughput, as last read.
    throughput: tokio::sync::Mutex<ProvisionedThroughput>,
    /// How this instance spends the fleet's read budget (every change feed read).
    pub(crate) reads: Arc<ReadAllowance>,
    /// What this worker handles a second while it has work (every lease write carries it).
    pub(crate) worker_capacity: Arc<WorkerCapacity>,
    /// The monitored container's provisioned throughput, as last read (for a read budget of a
    /// percentage of it).
    monitored_throughput: tokio::sync::Mutex<ProvisionedThroughput>,
    /// Whether it was said that a percentage read budget cannot be applied.
    unpaced_said: std::sync::atomic::AtomicBool,
    /// The other instances the last listing showed here, sorted.
    pub(crate) others: Mutex<Vec<String>>,
    /// This process's incarnation of the instance name: random, new at every start. Its
    /// heartbeat carries it, and every lease it acquires gets an epoch made from it.
    pub(crate) incarnation: String,
    /// Acquisitions made so far (the other half of an ownership epoch).
    acquisitions: AtomicU64,
    /// This process's hold on its instance name (its heartbeat).
    pub(crate) name: NameClaim,
    /// The monitored container's partition key ranges as last listed, and when.
    partitions: tokio::sync::Mutex<Option<PartitionList>>,
}

impl Shared {
    /// The parts of a processor that has not started.
    pub(crate) fn new(
        monitored: MonitoredContainer,
        store: Arc<dyn LeaseStore>,
        handler: Handler,
        options: ProcessorOptions,
    ) -> Self {
        let liveness = Arc::new(Liveness::new(options.liveness));
        let gate = Arc::new(CrashGate::new(store));
        let incarnation = format!("{:016x}", fastrand::u64(..));
        // Counts what the store charged against this instance's share of the container's budget.
        let budget = Arc::new(WriteBudget::metered(gate.clone()));
        let timings = WorkTimings::new(options.acquire_interval, options.expiration);
        let worker_capacity = Arc::new(WorkerCapacity::new(timings.rate_time_constant));
        Self {
            name: NameClaim::new(&options.instance, &incarnation, options.pod_uid.clone()),
            monitored: monitored.with_read_bucket(options.read_throughput_bucket),
            store: gate.clone(),
            gate,
            handler,
            options,
            dead_letters: OnceLock::new(),
            health: Health::default(),
            telemetry: Telemetry::default(),
            owned: OwnedLeases::default(),
            cycles: AtomicU64::new(0),
            requested: Arc::new(tokio::sync::Notify::new()),
            liveness,
            budget,
            throughput: tokio::sync::Mutex::default(),
            reads: Arc::default(),
            worker_capacity,
            monitored_throughput: tokio::sync::Mutex::default(),
            unpaced_said: std::sync::atomic::AtomicBool::new(false),
            others: Mutex::default(),
            incarnation,
            acquisitions: AtomicU64::new(0),
            partitions: tokio::sync::Mutex::new(None),
        }
    }

    /// Gives this instance, holding `mine` of the leases `listed` among `instances`, its parts of
    /// the lease container's budget and of the read budget.
    pub(crate) async fn share_budgets(&self, mine: Holding, listed: Listed, instances: usize) {
        self.share_budget(part_of(mine, listed, instances)).await;
        let reads = read_part(mine.owned, listed.leases, listed.free, instances);
        self.share_reads(reads, mine.owned).await;
    }

    /// Gives this instance `part` of the lease container's provisioned throughput (read again
    /// now and then): see [`crate::processor::budgets::share::part_of`].
    pub(crate) async fn share_budget(&self, part: f64) {
        let provisioned = self
            .throughput
            .lock()
            .await
            .current("leases", self.store.provisioned_throughput())
            .await;
        self.budget.share_out(provisioned.map(|units| units as f64), part);
    }

    /// Gives this instance `part` of the fleet's read budget, for the `leases` it reads (a
    /// percentage of the monitored container's throughput read again now and then): see
    /// [`crate::processor::budgets::reads`].
    async fn share_reads(&self, part: f64, leases: usize) {
        let Some(budget) = self.options.read_budget else {
            return;
        };
        let provisioned = match budget {
            ReadBudget::RequestUnits(_) => None,
            ReadBudget::PercentOfProvisioned(_) => {
                let monitored = self.monitored.provisioned_throughput();
                let units = self
                    .monitored_throughput
                    .lock()
                    .await
                    .current("monitored", monitored)
                    .await;
                if units.is_none() && !self.unpaced_said.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        %budget,
                        "the read budget is a percentage of the monitored container's provisioned throughput, which has none of its own or could not be read: reads are not paced (set request units instead)"
                    );
                }
                units
            }
        };
        self.reads.set(budget.units(provisioned), part, leases);
    }

    /// A new ownership epoch for a lease acquisition: this incarnation and a counter, so that no
    /// two acquisitions — of this process or any other — write the same one.
    pub(crate) fn next_epoch(&self) -> String {
        let n = self.acquisitions.fetch_add(1, Ordering::SeqCst) + 1;
        format!("{}.{n}", self.incarnation)
    }

    /// Whether `epoch` is one this process wrote ([`Shared::next_epoch`]).
    pub(crate) fn wrote_epoch(&self, epoch: &str) -> bool {
        epoch
            .strip_prefix(self.incarnation.as_str())
            .is_some_and(|rest| rest.starts_with('.'))
    }

    /// The id of the partition key range that is exactly `range` (listed again when the last
    /// listing is older than the acquire interval and does not have it); `None` when none is or
    /// the listing failed. Ids are listed only when the routing map has such a range.
    pub(crate) async fn partition_of(&self, range: &EpkRange) -> Option<String> {
        let exact = |r: &EpkRange| r == range;
        if !self.routing_map_shows(exact).await {
            return None;
        }
        self.find_partition(exact, false).await.map(|(id, _)| id)
    }

    /// The partition key range that `range` is a strict part of, as after a merge (listed again
    /// when `fresh`, or when the last listing is older than the acquire interval and does not
    /// have it); `None` when none is or the listing failed. Without `fresh`, ids are listed only
    /// when the routing map shows such a range.
    pub(crate) async fn partition_around(&self, range: &EpkRange, fresh: bool) -> Option<(String, EpkRange)> {
        let around = |r: &EpkRange| r != range && r.contains(range);
        if !fresh && !self.routing_map_shows(around).await {
            return None;
        }
        self.find_partition(around, fresh).await
    }

    /// Whether the SDK's cached routing map (one request at most, no change feed read) has a
    /// range `pick` accepts; `true` when it cannot be read, so that the listing decides. Listing
    /// the ids reads every partition's change feed, which a lease's start should not wait on.
    async fn routing_map_shows(&self, pick: impl Fn(&EpkRange) -> bool) -> bool {
        match self.monitored.feed_ranges(false).await {
            Ok(ranges) => ranges.iter().any(pick),
            Err(_) => true,
        }
    }

    /// The first partition key range `pick` accepts, from the cached listing when it is recent
    /// (or has one) and `fresh` is not asked for.
    async fn find_partition(&self, pick: impl Fn(&EpkRange) -> bool, fresh: bool) -> Option<(String, EpkRange)> {
        let mut cached = self.partitions.lock().await;
        let find = |list: &[(String, EpkRange)]| list.iter().find(|(_, r)| pick(r)).cloned();
        if let Some((at, list)) = cached.as_ref()
            && !fresh
            && (at.elapsed() < self.options.acquire_interval || find(list).is_some())
        {
            return find(list);
        }
        match self.monitored.partition_key_ranges().await {
            Ok(list) => {
                let found = find(&list);
                *cached = Some((tokio::time::Instant::now(), list));
                found
            }
            Err(error) => {
                tracing::debug!(%error, "listing the partition key ranges failed");
                None
            }
        }
    }

    /// Another instance here to give a stalled lease to (one drawn at random), if any.
    pub(crate) fn another_instance(&self) -> Option<String> {
        let others = self.others.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (!others.is_empty()).then(|| others[fastrand::usize(..others.len())].clone())
    }

    /// A simulated crash: nothing reaches the lease store from now on (a request under way may
    /// still land, as with a process killed while it waited), and no batch reaches the handler.
    pub(crate) fn crash(&self) {
        self.gate.close();
        self.health.mark_aborted();
    }

    /// The acquire cycles started so far (the first is number 1).
    pub(crate) fn cycle(&self) -> u64 {
        self.cycles.load(Ordering::SeqCst)
    }
}

/// The leases this instance processes, by lease id. A panic elsewhere while the map was held
/// does not make it unusable (a poisoned lock must never read as "owns nothing").
#[derive(Default)]
pub(crate) struct OwnedLeases {
    map: Mutex<HashMap<String, Arc<OwnedLease>>>,
}

impl OwnedLeases {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<OwnedLease>>> {
        self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds `owned`; `false` (and nothing changes) when its lease is processed here already.
    pub(crate) fn insert(&self, owned: Arc<OwnedLease>) -> bool {
        let mut map = self.map();
        if map.contains_key(owned.id()) {
            return false;
        }
        map.insert(owned.id().to_owned(), owned);
        true
    }

    /// Forgets the lease `id`.
    pub(crate) fn remove(&self, id: &str) {
        self.map().remove(id);
    }

    /// The leases owned now.
    pub(crate) fn all(&self) -> Vec<Arc<OwnedLease>> {
        self.map().values().cloned().collect()
    }

    /// How many leases are owned now.
    pub(crate) fn count(&self) -> usize {
        self.map().len()
    }

    /// Whether lease `id` is processed here.
    pub(crate) fn contains(&self, id: &str) -> bool {
        self.map().contains_key(id)
    }

    /// The ids of the leases owned now.
    pub(crate) fn ids(&self) -> std::collections::HashSet<String> {
        self.map().keys().cloned().collect()
    }
}
