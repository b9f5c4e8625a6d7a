//! The running processor: bootstrap, the acquire cycle, the renewer, one task per owned lease,
//! and graceful shutdown.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use time::OffsetDateTime;
use tokio::sync::broadcast;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::balancer::{
    Balancing, LeaseState, TakeoverTimings, leases_to_acquire, leases_to_acquire_steal_one, next_takeover, overlapping,
    superseded,
};
use super::bootstrap::bootstrap;
use super::deadletter::DeadLetterStore;
use super::estimator::{DEFAULT_CONCURRENCY, LeaseEstimate, estimate_leases};
use super::events::{CloseReason, LeaseEvent};
use super::handler::ChangeHandler;
use super::lease::{Lease, LeaseSnapshot, LeaseStore, LeaseStoreError};
use super::listing_schedule::{ListingSchedule, ListingView, is_quiet};
use super::manual::Handler;
use super::monitored_watch::{MonitoredWatch, Verdict};
use super::observer::{NoopObserver, ProcessorObserver};
use super::options::{OnExhausted, ProcessorOptions};
use super::owned::OwnedLease;
use super::partition::{self, LeaseExit};
use crate::cosmos::{CosmosError, MonitoredContainer};

/// Acquire cycles without a heartbeat after which an instance is no longer counted.
const HEARTBEAT_CYCLES: u32 = 3;

/// How long after an unrenewed lease's expiry the extra acquire cycle runs.
const TAKEOVER_MARGIN: Duration = Duration::from_millis(20);

/// Sleeps until `at` (forever without one; the caller only polls it with one).
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A heartbeat older than this many lease expirations belongs to an instance that died; it is removed.
const STALE_HEARTBEAT_EXPIRATIONS: u32 = 5;

/// Errors that stop a processor from starting or running.
#[derive(Debug, thiserror::Error)]
pub enum ProcessorError {
    /// The configuration cannot work.
    #[error("{0}")]
    Config(String),
    /// The lease store failed.
    #[error("lease store: {0}")]
    Store(#[from] LeaseStoreError),
    /// A Cosmos request failed.
    #[error(transparent)]
    Cosmos(#[from] CosmosError),
}

impl ProcessorError {
    /// Whether trying again later can succeed (throttling, 503, timeouts).
    pub fn is_transient(&self) -> bool {
        match self {
            ProcessorError::Config(_) => false,
            ProcessorError::Store(error) => error.is_transient(),
            ProcessorError::Cosmos(error) => error.kind.is_retryable(),
        }
    }
}

/// What the lease tasks share.
pub struct Shared {
    pub(crate) monitored: MonitoredContainer,
    pub(crate) store: Arc<dyn LeaseStore>,
    pub(crate) handler: Handler,
    pub(crate) options: ProcessorOptions,
    observer: std::sync::RwLock<Arc<dyn ProcessorObserver>>,
    events: broadcast::Sender<LeaseEvent>,
    owned: Mutex<HashMap<String, Arc<OwnedLease>>>,
    cycles: AtomicU64,
    ready: AtomicBool,
    pub(crate) dead_letters: std::sync::OnceLock<Arc<dyn DeadLetterStore>>,
    /// Leases whose change feed keeps failing, with the last error.
    read_failing: Mutex<HashMap<String, String>>,
    /// Why the lease store cannot be used (its container is missing), while that lasts.
    store_problem: Mutex<Option<String>>,
    /// Which repeated errors were logged when.
    error_log: Mutex<super::error_log::ErrorLog>,
    /// Set when the coordinator stopped without being asked to (a panic).
    died: AtomicBool,
    /// Whether the monitored container still exists (looked up when its feed answers 404).
    monitored_watch: MonitoredWatch,
    /// Cancelled when the processor cannot go on (its monitored container was recreated).
    halt: CancellationToken,
    /// Set by [`ProcessorHandle::abort`]: the coordinator's end is a simulated crash, not a death.
    aborted: AtomicBool,
}

impl Shared {
    /// Where measurements go.
    pub(crate) fn observer(&self) -> Arc<dyn ProcessorObserver> {
        match self.observer.read() {
            Ok(observer) => observer.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub(crate) fn emit(&self, event: LeaseEvent) {
        self.observer().lease_event(&event);
        let _ = self.events.send(event);
    }

    pub(crate) fn emit_error(&self, lease: Option<&str>, message: String) {
        // A refused credential (a rotated key) fails every request alike: one line for all.
        let refused = super::error_log::is_refused_credential(&message);
        let (log_lease, kind) = if refused {
            (None, super::error_log::REFUSED_CREDENTIAL)
        } else {
            (lease, super::error_log::kind_of(&message))
        };
        let log_now = self
            .error_log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .record(log_lease, kind, std::time::Instant::now());
        let shown = if refused {
            format!("{}: {message}", super::error_log::REFUSED_CREDENTIAL)
        } else {
            message.clone()
        };
        match log_now {
            Some(0) => {
                tracing::warn!(processor = %self.options.processor_name, instance = %self.options.instance, lease = log_lease, "{shown}")
            }
            Some(repeated) => {
                tracing::warn!(processor = %self.options.processor_name, instance = %self.options.instance, lease = log_lease, repeated, "{shown} (and {repeated} more like it in the last minute)")
            }
            None => {
                tracing::debug!(processor = %self.options.processor_name, instance = %self.options.instance, lease, "{message}")
            }
        }
        self.emit(LeaseEvent::Error {
            lease: lease.map(str::to_owned),
            message,
        });
    }

    /// The owned-lease map; a panic elsewhere while it was held does not make it unusable (a
    /// poisoned lock must never read as "owns nothing").
    fn owned_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<OwnedLease>>> {
        self.owned.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records that lease `token`'s change feed keeps failing (`Some(error)`) or works again.
    pub(crate) fn set_read_failing(&self, token: &str, error: Option<String>) {
        let mut failing = self
            .read_failing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match error {
            Some(error) => {
                failing.insert(token.to_owned(), error);
            }
            None => {
                failing.remove(token);
            }
        }
    }

    /// Looks up the monitored container after its change feed answered 404 (at most once per
    /// acquire interval for all leases); a recreated container stops the processor.
    pub(crate) async fn check_monitored(&self) -> Verdict {
        let verdict = self
            .monitored_watch
            .check(&self.monitored, self.options.acquire_interval)
            .await;
        if matches!(verdict, Verdict::Recreated(_)) {
            self.halt.cancel();
        }
        verdict
    }

    /// A page was read: the monitored container exists.
    pub(crate) fn monitored_works(&self) {
        self.monitored_watch.clear();
    }

    fn owned_snapshot(&self) -> Vec<Arc<OwnedLease>> {
        self.owned_map().values().cloned().collect()
    }

    fn owned_count(&self) -> usize {
        self.owned_map().len()
    }

    fn is_owned(&self, id: &str) -> bool {
        self.owned_map().contains_key(id)
    }
}

/// A change feed processor: leases in a lease container, batches to a handler.
pub struct ChangeFeedProcessor {
    shared: Arc<Shared>,
}

impl ChangeFeedProcessor {
    /// A processor reading `monitored`, coordinating through `store`, delivering to `handler`.
    pub fn new(
        monitored: MonitoredContainer,
        store: Arc<dyn LeaseStore>,
        handler: Arc<dyn ChangeHandler>,
        options: ProcessorOptions,
    ) -> Self {
        Self::with_handler(monitored, store, Handler::Automatic(handler), options)
    }

    /// A processor delivering to `handler`: [`Handler::Manual`] for one that checkpoints itself
    /// (each batch comes with a [`super::CheckpointHandle`], and nothing is checkpointed until
    /// the handler uses one).
    pub fn with_handler(
        monitored: MonitoredContainer,
        store: Arc<dyn LeaseStore>,
        handler: Handler,
        options: ProcessorOptions,
    ) -> Self {
        let (events, _) = broadcast::channel(4096);
        Self {
            shared: Arc::new(Shared {
                monitored,
                store,
                handler,
                options,
                observer: std::sync::RwLock::new(Arc::new(NoopObserver)),
                events,
                owned: Mutex::new(HashMap::new()),
                cycles: AtomicU64::new(0),
                ready: AtomicBool::new(false),
                dead_letters: std::sync::OnceLock::new(),
                read_failing: Mutex::new(HashMap::new()),
                store_problem: Mutex::new(None),
                error_log: Mutex::new(super::error_log::ErrorLog::default()),
                died: AtomicBool::new(false),
                monitored_watch: MonitoredWatch::default(),
                halt: CancellationToken::new(),
                aborted: AtomicBool::new(false),
            }),
        }
    }

    /// Reports measurements to `observer` (for example Prometheus metrics).
    pub fn with_observer(self, observer: Arc<dyn ProcessorObserver>) -> Self {
        if let Ok(mut current) = self.shared.observer.write() {
            *current = observer;
        }
        self
    }

    /// Stores the documents the handler keeps failing in `store` (needed when the retry policy
    /// says `DeadLetter`).
    pub fn with_dead_letters(self, store: Arc<dyn DeadLetterStore>) -> Self {
        let _ = self.shared.dead_letters.set(store);
        self
    }

    /// Lease lifecycle events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<LeaseEvent> {
        self.shared.events.subscribe()
    }

    /// A view for health endpoints and metrics (not ready until started).
    pub fn monitor(&self) -> ProcessorMonitor {
        ProcessorMonitor {
            shared: self.shared.clone(),
        }
    }

    /// Bootstraps the lease store (once per processor) and starts processing.
    pub async fn start(self) -> Result<ProcessorHandle, ProcessorError> {
        self.shared.options.validate().map_err(ProcessorError::Config)?;
        if self.shared.options.retry.on_exhausted == OnExhausted::DeadLetter && self.shared.handler.is_manual() {
            return Err(ProcessorError::Config(
                "dead-lettering needs automatic checkpoints: a manual checkpoint of part of a batch would skip the rest".into(),
            ));
        }
        if self.shared.options.retry.on_exhausted == OnExhausted::DeadLetter && self.shared.dead_letters.get().is_none()
        {
            return Err(ProcessorError::Config(
                "dead-lettering needs a dead-letter container (--dead-letter-container)".into(),
            ));
        }
        let options = &self.shared.options;
        bootstrap(self.shared.store.as_ref(), &self.shared.monitored, options).await?;
        let shutdown = CancellationToken::new();
        let leases = CancellationToken::new();
        let coordinator = Coordinator {
            shared: self.shared.clone(),
            leases: leases.clone(),
            tasks: JoinSet::new(),
            reported_invalid: std::collections::HashSet::new(),
            awaiting: Vec::new(),
            orphans: Vec::new(),
            takeover_at: None,
            listing_interval: options.acquire_interval,
            next_listing: tokio::time::Instant::now(),
            listed_ids: Vec::new(),
        };
        // The renewer outlives the shutdown request: it keeps every lease still owned alive until
        // the coordinator has released them all (a batch in flight may take longer than the
        // lease expiration), and stops when the coordinator's task ends.
        let renewing = CancellationToken::new();
        let task = tokio::spawn(coordinator.run(shutdown.clone(), renewing.clone()));
        let renewer = tokio::spawn(renew_loop(self.shared.clone(), renewing));
        tracing::info!(processor = %options.processor_name, instance = %options.instance, "processor started");
        Ok(ProcessorHandle {
            shared: self.shared,
            shutdown,
            leases,
            task,
            renewer,
        })
    }
}

/// A started processor.
pub struct ProcessorHandle {
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    leases: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    renewer: tokio::task::JoinHandle<()>,
}

impl ProcessorHandle {
    /// Lease lifecycle events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<LeaseEvent> {
        self.shared.events.subscribe()
    }

    /// Tokens of the leases this instance processes now.
    pub fn owned_leases(&self) -> Vec<String> {
        let mut tokens: Vec<String> = self
            .shared
            .owned_snapshot()
            .iter()
            .map(|o| o.token().to_owned())
            .collect();
        tokens.sort();
        tokens
    }

    /// Acquire cycles started so far (the first is number 1).
    pub fn acquire_cycles(&self) -> u64 {
        self.shared.cycles.load(Ordering::SeqCst)
    }

    /// Whether the processor is bootstrapped and its lease loop is running.
    pub fn is_ready(&self) -> bool {
        self.shared.ready.load(Ordering::SeqCst) && !self.task.is_finished()
    }

    /// A cheap handle for health checks and estimates.
    pub fn monitor(&self) -> ProcessorMonitor {
        ProcessorMonitor {
            shared: self.shared.clone(),
        }
    }

    /// Resolves when the processor stopped by itself because it cannot go on (its monitored
    /// container was deleted and created again), with the reason; pending until then.
    pub async fn halted(&self) -> String {
        self.shared.halt.cancelled().await;
        self.shared.monitored_watch.problem().unwrap_or_default()
    }

    /// Graceful stop: stops reading, lets an in-flight batch finish and checkpoint, releases every
    /// owned lease (keeping its continuation) and removes this instance's heartbeat.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.leases.cancel();
        let _ = self.task.await;
        let _ = self.renewer.await;
    }

    /// Stops at once without releasing anything, as a crash would (for tests and chaos).
    pub fn abort(self) {
        self.shared.aborted.store(true, Ordering::SeqCst);
        self.task.abort();
        self.renewer.abort();
        self.leases.cancel();
    }
}

/// A view of a processor for health endpoints and metrics; usable before it starts and after
/// it stops.
#[derive(Clone)]
pub struct ProcessorMonitor {
    shared: Arc<Shared>,
}

impl ProcessorMonitor {
    /// Request units charged for the lease container's requests so far.
    pub fn lease_request_charge(&self) -> f64 {
        self.shared.store.request_charge()
    }

    /// Whether the processor is bootstrapped and its lease loop is running.
    pub fn is_ready(&self) -> bool {
        self.shared.ready.load(Ordering::SeqCst)
    }

    /// Why the processor is not fully working: the lease container is missing, or a lease's
    /// change feed keeps failing.
    pub fn read_problem(&self) -> Option<String> {
        if let Some(problem) = self.shared.monitored_watch.problem() {
            return Some(problem);
        }
        let store = self
            .shared
            .store_problem
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if store.is_some() {
            return store;
        }
        let failing = self
            .shared
            .read_failing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        failing
            .iter()
            .next()
            .map(|(lease, error)| format!("lease {lease} cannot read its change feed: {error}"))
    }

    /// Whether the processor's coordinator still runs (false after it died unexpectedly).
    pub fn is_alive(&self) -> bool {
        !self.shared.died.load(Ordering::SeqCst)
    }

    /// Whether the handler can take batches now (for example, an HTTP handler answers).
    pub async fn handler_ready(&self) -> bool {
        self.shared.handler.ready().await
    }

    /// Leases owned now.
    pub fn owned_leases(&self) -> usize {
        self.shared.owned_count()
    }

    /// Estimates the leases this instance owns now (one feed read each).
    pub async fn estimate_owned(&self) -> Result<Vec<LeaseEstimate>, CosmosError> {
        let mut leases = Vec::new();
        for owned in self.shared.owned_snapshot() {
            leases.push(owned.current().await);
        }
        estimate_leases(
            &self.shared.monitored,
            &leases,
            self.shared.options.start_from,
            DEFAULT_CONCURRENCY,
        )
        .await
    }
}

struct Coordinator {
    shared: Arc<Shared>,
    leases: CancellationToken,
    tasks: JoinSet<(Arc<OwnedLease>, LeaseExit)>,
    /// Invalid lease documents already reported (each is logged and counted once).
    reported_invalid: std::collections::HashSet<String>,
    /// Leases this cycle asked their owners for: (lease id, owner asked), adopted as soon as
    /// the owner hands them over.
    awaiting: Vec<(String, Option<String>)>,
    /// Leases this instance owned when the lease container disappeared, with their checkpoints:
    /// written back when it exists again.
    orphans: Vec<Lease>,
    /// When another instance's unrenewed lease expires before the next cycle: an extra acquire
    /// cycle then.
    takeover_at: Option<tokio::time::Instant>,
    /// The wait from one regular acquire cycle to the next: the acquire interval, longer while
    /// listings are quiet ([`ListingSchedule`]).
    listing_interval: Duration,
    /// When the next regular acquire cycle runs.
    next_listing: tokio::time::Instant,
    /// The lease ids the previous listing showed, sorted.
    listed_ids: Vec<String>,
}

impl Coordinator {
    async fn run(mut self, shutdown: CancellationToken, renewing: CancellationToken) {
        // However this task ends (released everything, or unwinding), renewing stops with it.
        let _renewing = renewing.drop_guard();
        // Marks the processor dead if this task ends (or unwinds) without a shutdown request.
        struct Watch(Arc<Shared>, CancellationToken);
        impl Drop for Watch {
            fn drop(&mut self) {
                if !self.1.is_cancelled() && !self.0.halt.is_cancelled() && !self.0.aborted.load(Ordering::SeqCst) {
                    self.0.died.store(true, Ordering::SeqCst);
                    tracing::error!("the lease coordinator stopped unexpectedly");
                }
            }
        }
        let _watch = Watch(self.shared.clone(), shutdown.clone());
        let delay = self.join_delay().await;
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::time::sleep(delay) => {}
        }
        self.next_listing = tokio::time::Instant::now();
        // Handed-over leases are looked for several times per cycle (point reads of the few
        // leases asked for), so that a handoff completes within the cycle that asked for it.
        let poll = (self.shared.options.acquire_interval / 8).clamp(Duration::from_millis(50), Duration::from_secs(2));
        let mut handoff_poll = tokio::time::interval(poll);
        handoff_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.shared.ready.store(true, Ordering::SeqCst);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = self.shared.halt.cancelled() => break,
                _ = tokio::time::sleep_until(self.next_listing) => {
                    let started = tokio::time::Instant::now();
                    self.shared.cycles.fetch_add(1, Ordering::SeqCst);
                    self.acquire_cycle().await;
                    self.next_listing = started + self.listing_interval;
                }
                _ = sleep_until(self.takeover_at), if self.takeover_at.is_some() => {
                    self.takeover_at = None;
                    self.acquire_cycle().await;
                }
                _ = handoff_poll.tick(), if !self.awaiting.is_empty() => self.adopt_handed_over().await,
                Some(joined) = self.tasks.join_next() => self.on_exit(joined).await,
            }
        }
        self.shared.ready.store(false, Ordering::SeqCst);
        self.leases.cancel();
        while let Some(joined) = self.tasks.join_next().await {
            self.on_exit(joined).await;
        }
        let me = &self.shared.options.instance;
        if let Err(error) = self.shared.store.remove_heartbeat(me).await {
            tracing::warn!(instance = %me, %error, "removing the heartbeat failed");
        }
        tracing::info!(processor = %self.shared.options.processor_name, instance = %me, "processor stopped");
    }

    /// Announces this instance. When it joins a processor that others are running, it waits
    /// half to one cycle before its first acquire so that instances starting together
    /// all count each other; a processor nobody runs yet is started at once.
    async fn join_delay(&self) -> Duration {
        let me = &self.shared.options.instance;
        if let Err(error) = self.shared.store.heartbeat(me).await {
            self.shared.emit_error(None, format!("heartbeat failed: {error}"));
        }
        let now = OffsetDateTime::now_utc();
        let expiration = self.shared.options.expiration;
        let others_running = match self.shared.store.snapshot().await {
            Ok(snapshot) => snapshot
                .leases
                .iter()
                .any(|l| !l.is_expired(now, expiration) && l.owner.as_deref().is_some_and(|o| o != me)),
            // Unknown: wait as if others ran, rather than race them for leases.
            Err(_) => true,
        };
        if others_running {
            self.shared
                .options
                .acquire_interval
                .mul_f64(0.5 + fastrand::f64() * 0.5)
        } else {
            Duration::ZERO
        }
    }

    fn start_lease(&mut self, lease: Lease) {
        let owned = OwnedLease::new(
            lease,
            &self.shared.options.instance,
            self.shared.store.clone(),
            &self.leases,
        );
        {
            // One task per lease: a split's children can be seen as ours by an acquire cycle and
            // be started by the split's own exit path too.
            let mut map = self.shared.owned_map();
            if map.contains_key(owned.id()) {
                tracing::debug!(lease = owned.token(), "lease already processed here");
                return;
            }
            map.insert(owned.id().to_owned(), owned.clone());
        }
        self.shared.observer().leases_owned(self.shared.owned_count());
        let shared = self.shared.clone();
        self.tasks.spawn(async move {
            use futures::FutureExt;
            // A panic (for example in the handler) must not leak the lease: it is released below.
            let exit = std::panic::AssertUnwindSafe(partition::run(shared, owned.clone()))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(|m| (*m).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".to_owned());
                    tracing::error!(lease = owned.token(), panic = %message, "the lease's task panicked; releasing the lease");
                    LeaseExit {
                        reason: CloseReason::Panicked,
                        children: Vec::new(),
                    }
                });
            (owned, exit)
        });
    }

    async fn on_exit(&mut self, joined: Result<(Arc<OwnedLease>, LeaseExit), tokio::task::JoinError>) {
        let Ok((owned, exit)) = joined else {
            // Only an aborted task gets here (panics are caught inside the task).
            tracing::error!("a lease task ended without a result");
            return;
        };
        self.shared.owned_map().remove(owned.id());
        if matches!(
            exit.reason,
            CloseReason::Shutdown | CloseReason::Panicked | CloseReason::HandedOver
        ) && let Err(error) = owned.release().await
        {
            tracing::warn!(lease = owned.token(), %error, "releasing the lease failed; it frees itself on expiry");
        }
        if exit.reason == CloseReason::LeaseGone && !self.leases.is_cancelled() {
            self.recreate(&owned).await;
        }
        tracing::info!(processor = %self.shared.options.processor_name, instance = %self.shared.options.instance, lease = owned.token(), reason = exit.reason.as_str(), "lease closed");
        self.shared.emit(LeaseEvent::Closed {
            lease: owned.token().to_owned(),
            reason: exit.reason,
        });
        self.listing_changed();
        let me = self.shared.options.instance.clone();
        for child in exit.children {
            if child.owner.as_deref() == Some(me.as_str()) && !self.leases.is_cancelled() {
                self.shared.emit(LeaseEvent::Acquired {
                    lease: child.lease_token.clone(),
                    previous_owner: None,
                    cycle: self.shared.cycles.load(Ordering::SeqCst),
                });
                self.start_lease(child);
            }
        }
        self.shared.observer().leases_owned(self.shared.owned_count());
    }

    /// Something changed that a listing may show more of: the next one comes within the acquire
    /// interval again.
    fn listing_changed(&mut self) {
        let base = self.shared.options.acquire_interval;
        self.listing_interval = base;
        self.next_listing = self.next_listing.min(tokio::time::Instant::now() + base);
    }

    /// Puts back a lease document deleted while this instance processed it, with its last
    /// checkpoint and no owner, so that its range is not left without a lease (nothing lost).
    async fn recreate(&mut self, owned: &OwnedLease) {
        let mut lease = owned.current().await;
        lease.owner = None;
        lease.etag.clear();
        lease.clear_handoff();
        match self.shared.store.create(&lease).await {
            Ok(Some(_)) => {
                tracing::warn!(
                    lease = owned.token(),
                    "the lease document was deleted while this instance processed it; recreated it from its last checkpoint"
                );
            }
            Ok(None) => tracing::debug!(lease = owned.token(), "the deleted lease exists again"),
            Err(error) if error.is_container_missing() => {
                // The whole lease container is gone: keep the checkpoint until it is back.
                self.orphans.push(lease);
            }
            Err(error) => self.shared.emit_error(
                Some(owned.token()),
                format!("recreating the deleted lease failed: {error}"),
            ),
        }
    }

    /// Reports the lease container missing (once in the log; on `/readyz` while it lasts).
    fn store_missing(&mut self, error: &LeaseStoreError) {
        let mut problem = self
            .shared
            .store_problem
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if problem.is_none() {
            tracing::error!(processor = %self.shared.options.processor_name, %error, "the lease container does not exist (deleted?); processing waits until it is back, then the leases owned here are written back with their checkpoints");
            *problem = Some(format!("the lease container does not exist (deleted?): {error}"));
        }
    }

    /// After the lease container came back: writes back the leases this instance owned, then
    /// creates leases for the ranges nobody covers (from the start position). `false` when the
    /// container was never missing (nothing to do).
    async fn store_back(&mut self) -> bool {
        let was_missing = self
            .shared
            .store_problem
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .is_some();
        let orphans = std::mem::take(&mut self.orphans);
        if !was_missing && orphans.is_empty() {
            return false;
        }
        tracing::warn!(processor = %self.shared.options.processor_name, leases = orphans.len(), "the lease container exists again; writing back the leases owned here");
        for lease in &orphans {
            if let Err(error) = self.shared.store.create(lease).await {
                tracing::warn!(lease = %lease.lease_token, %error, "writing a lease back failed");
            }
        }
        if let Err(error) =
            super::bootstrap::bootstrap(self.shared.store.as_ref(), &self.shared.monitored, &self.shared.options).await
        {
            self.shared
                .emit_error(None, format!("creating the missing leases failed: {error}"));
        }
        true
    }

    /// Takes up the leases asked for that their owners have handed to this instance.
    async fn adopt_handed_over(&mut self) {
        let me = self.shared.options.instance.clone();
        let awaiting = std::mem::take(&mut self.awaiting);
        for (id, previous_owner) in awaiting {
            let lease = match self.shared.store.read(&id).await {
                Ok(Some(lease)) => lease,
                Ok(None) => continue,
                Err(error) => {
                    tracing::debug!(lease = %id, %error, "reading a lease asked for failed");
                    self.awaiting.push((id, previous_owner));
                    continue;
                }
            };
            let handed_over = lease.owner.as_deref() == Some(me.as_str()) && !self.shared.is_owned(&id);
            if !handed_over {
                if lease.handoff_request().is_some_and(|(to, _)| to == me) {
                    self.awaiting.push((id, previous_owner));
                }
                continue;
            }
            let mut next = lease.clone();
            next.clear_handoff();
            next.timestamp = Some(OffsetDateTime::now_utc());
            match self.shared.store.replace(&next).await {
                Ok(acquired) => self.acquired(acquired, previous_owner),
                Err(error) => {
                    tracing::debug!(lease = %lease.lease_token, %error, "taking up a handed-over lease failed")
                }
            }
        }
    }

    /// Starts processing a lease this instance just wrote itself into.
    fn acquired(&mut self, acquired: Lease, previous_owner: Option<String>) {
        tracing::info!(processor = %self.shared.options.processor_name, instance = %self.shared.options.instance, lease = %acquired.lease_token, previous_owner = ?previous_owner, "lease acquired");
        self.shared.emit(LeaseEvent::Acquired {
            lease: acquired.lease_token.clone(),
            previous_owner,
            cycle: self.shared.cycles.load(Ordering::SeqCst),
        });
        self.start_lease(acquired);
    }

    async fn acquire_cycle(&mut self) {
        let me = self.shared.options.instance.clone();
        // Back to the acquire interval unless this listing turns out quiet.
        let previous_interval = std::mem::replace(&mut self.listing_interval, self.shared.options.acquire_interval);
        // An instance that owns leases is counted through them; only one that owns none needs a
        // heartbeat for the others to count it (a write per cycle saved on a busy instance).
        if self.shared.owned_count() == 0
            && let Err(error) = self.shared.store.heartbeat(&me).await
        {
            self.shared.emit_error(None, format!("heartbeat failed: {error}"));
        }
        let snapshot = match self.shared.store.snapshot().await {
            Ok(snapshot) => snapshot,
            Err(error) if error.is_container_missing() => {
                self.store_missing(&error);
                return;
            }
            Err(error) => {
                self.shared.emit_error(None, format!("listing leases failed: {error}"));
                return;
            }
        };
        if self.store_back().await {
            return;
        }
        for (id, reason) in &snapshot.invalid {
            if self.reported_invalid.insert(id.clone()) {
                tracing::warn!(processor = %self.shared.options.processor_name, document = %id, %reason, "skipping a document under the lease prefix that is not a valid lease; fix or delete it");
                self.shared.observer().lease_error("invalid_document");
            }
        }
        let now = OffsetDateTime::now_utc();
        let expiration = self.shared.options.expiration;
        self.drop_lost(&snapshot, &me);
        // A split parent whose children exist is obsolete: never balanced, deleted once free.
        let ranges: Vec<(String, crate::cosmos::EpkRange)> = snapshot
            .leases
            .iter()
            .filter_map(|l| Some((l.id.clone(), l.range()?.clone())))
            .collect();
        let obsolete = superseded(&ranges);
        for id in overlapping(&ranges, &obsolete) {
            if self.reported_invalid.insert(id.clone()) {
                tracing::warn!(processor = %self.shared.options.processor_name, lease = %id, "a lease's range overlaps another lease's (edited by hand or another tool?); both are processed, so changes in the overlap arrive twice: delete the lease that should not exist");
                self.shared.observer().lease_error("overlapping_range");
            }
        }
        for lease in snapshot.leases.iter().filter(|l| obsolete.contains(&l.id)) {
            if lease.is_expired(now, expiration)
                && let Err(error) = self.shared.store.delete(lease).await
            {
                tracing::debug!(lease = %lease.lease_token, %error, "deleting a superseded split parent failed");
            }
        }
        let states: Vec<LeaseState> = snapshot
            .leases
            .iter()
            .filter(|l| !obsolete.contains(&l.id))
            .map(|l| LeaseState {
                id: l.id.clone(),
                live_owner: if l.is_expired(now, expiration) {
                    None
                } else {
                    l.owner.clone()
                },
            })
            .collect();
        // A lease its owner stopped renewing is taken as it expires, not up to a cycle later (the
        // margin covers the clocks' rounding; the reference strategy keeps its cycle).
        self.takeover_at = match self.shared.options.balancing {
            Balancing::Fair => next_takeover(
                snapshot
                    .leases
                    .iter()
                    .filter(|l| !obsolete.contains(&l.id))
                    .filter_map(|l| Some((l.owner.as_deref()?, l.renewed_at()?))),
                &me,
                now,
                TakeoverTimings {
                    expiration,
                    overdue_after: self.shared.options.renew_interval * 2,
                    // Only a quiet listing waits longer, and a quiet one shows no other owners.
                    next_cycle: self.shared.options.acquire_interval,
                },
            )
            .map(|wait| tokio::time::Instant::now() + wait + TAKEOVER_MARGIN),
            Balancing::StealOne => None,
        };
        // Instances beat every cycle: one silent for three cycles is gone (a crashed instance must
        // not be counted when its leases expire, or their takeover waits another cycle).
        let heartbeat_ttl = expiration.min(self.shared.options.acquire_interval * HEARTBEAT_CYCLES);
        let live: Vec<String> = snapshot
            .instances
            .iter()
            .filter(|(_, beat)| *beat + heartbeat_ttl > now)
            .map(|(name, _)| name.clone())
            .collect();
        // Heartbeats of instances that died without stopping (pods replaced under new names).
        for (name, beat) in &snapshot.instances {
            if *beat + expiration * STALE_HEARTBEAT_EXPIRATIONS < now
                && let Err(error) = self.shared.store.remove_heartbeat(name).await
            {
                tracing::debug!(instance = %name, %error, "removing a stale heartbeat failed");
            }
        }
        // Leases the store says are ours but that no task processes (a restart under the same
        // name) are taken up again first.
        let mut wanted: Vec<String> = snapshot
            .leases
            .iter()
            .filter(|l| {
                l.owner.as_deref() == Some(me.as_str()) && !self.shared.is_owned(&l.id) && !obsolete.contains(&l.id)
            })
            .map(|l| l.id.clone())
            .collect();
        wanted.extend(match self.shared.options.balancing {
            Balancing::Fair => leases_to_acquire(&states, &me, &live),
            Balancing::StealOne => leases_to_acquire_steal_one(&states, &me),
        });
        let mut ids: Vec<String> = snapshot.leases.iter().map(|l| l.id.clone()).collect();
        ids.sort_unstable();
        let view = ListingView {
            leases: &states,
            live: &live,
            handoff_asked: snapshot.leases.iter().any(|l| l.handoff_request().is_some()),
            same_leases: ids == self.listed_ids,
        };
        let quiet = wanted.is_empty() && self.awaiting.is_empty() && is_quiet(&view, &me);
        self.listed_ids = ids;
        self.listing_interval =
            ListingSchedule::new(self.shared.options.acquire_interval, expiration).next(previous_interval, quiet);
        if self.listing_interval != previous_interval {
            tracing::debug!(processor = %self.shared.options.processor_name, instance = %me, interval = ?self.listing_interval, "next lease listing");
        }
        // All acquisitions of a cycle go out together: others see this cycle's result at once.
        // A live owner hands a lease over after the batch it is in; only one that has not done so
        // within a lease expiration (an older version that ignores requests, or a handler stuck
        // longer than that) loses it outright — a slow batch is not taken from under it.
        let patience = self.shared.options.expiration;
        let attempts = wanted.iter().filter_map(|id| {
            let lease = snapshot.leases.iter().find(|l| &l.id == id)?;
            if self.shared.is_owned(id) {
                return None;
            }
            let previous_owner = if lease.is_expired(now, expiration) {
                None
            } else {
                lease.owner.clone()
            }
            .filter(|o| *o != me);
            let mut next = lease.clone();
            let step = match (&previous_owner, lease.handoff_request()) {
                // A live owner is asked to hand the lease over after its current batch (nothing
                // delivered twice); only one that has not done so within `patience` loses it.
                (Some(_), Some((to, at))) if to == me.as_str() && now - at < patience => return None,
                (Some(_), Some((to, at))) if to != me.as_str() && now - at < expiration => return None,
                (Some(_), Some((to, _))) if to == me.as_str() => AcquireStep::Take,
                (Some(_), _) => {
                    next.request_handoff(&me, now);
                    AcquireStep::AskHandoff
                }
                (None, _) => AcquireStep::Take,
            };
            if step == AcquireStep::Take {
                next.owner = Some(me.clone());
                next.clear_handoff();
                next.timestamp = Some(OffsetDateTime::now_utc());
            }
            let store = self.shared.store.clone();
            Some(async move { (store.replace(&next).await, lease, previous_owner, step) })
        });
        let results = futures::future::join_all(attempts).await;
        for (result, lease, previous_owner, step) in results {
            if step == AcquireStep::AskHandoff {
                match result {
                    Ok(asked) => {
                        tracing::debug!(lease = %asked.lease_token, owner = ?previous_owner, "asked the owner to hand the lease over");
                        if !self.awaiting.iter().any(|(id, _)| *id == asked.id) {
                            self.awaiting.push((asked.id, previous_owner));
                        }
                    }
                    Err(error) => tracing::debug!(lease = %lease.lease_token, %error, "asking for a handoff failed"),
                }
                continue;
            }
            match result {
                Ok(acquired) => self.acquired(acquired, previous_owner),
                Err(LeaseStoreError::Changed(_) | LeaseStoreError::Gone(_)) => {
                    tracing::debug!(lease = %lease.lease_token, "another instance moved first");
                }
                Err(error) => self
                    .shared
                    .emit_error(Some(&lease.lease_token), format!("acquiring failed: {error}")),
            }
        }
    }

    /// Stops processing leases the store shows with another owner (or no longer has), and hands
    /// over those another instance asked for.
    fn drop_lost(&self, snapshot: &LeaseSnapshot, me: &str) {
        for owned in self.shared.owned_snapshot() {
            let mine = snapshot
                .leases
                .iter()
                .find(|l| l.id == owned.id() && l.owner.as_deref() == Some(me));
            match mine {
                Some(lease) => owned.notice_handoff(lease),
                None if !owned.cancelled().is_cancelled() => {
                    tracing::info!(lease = owned.token(), "lease taken by another instance");
                    owned.mark_lost();
                }
                None => {}
            }
        }
    }
}

/// What an acquire cycle does with a lease it wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AcquireStep {
    /// Write this instance as the owner (a free or expired lease, or an owner that ignored a
    /// handoff request).
    Take,
    /// Ask the live owner to hand it over.
    AskHandoff,
}

/// Renews every owned lease each renew interval until `stop`. A lease whose processing is
/// stopping (shutdown, handoff) is still renewed until it is released: only a lost one is not.
async fn renew_loop(shared: Arc<Shared>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(shared.options.renew_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        for owned in shared.owned_snapshot() {
            // A lease written within half a renew interval (a checkpoint) is fresh already.
            if owned.is_lost()
                || !owned.is_held().await
                || owned.written_within(shared.options.renew_interval / 2).await
            {
                continue;
            }
            match owned.renew().await {
                Ok(_) => {}
                Err(super::owned::UpdateError::Store(error)) => {
                    shared.emit_error(Some(owned.token()), format!("renew failed: {error}"));
                }
                Err(lost) => tracing::info!(lease = owned.token(), reason = %lost, "renew found the lease lost"),
            }
        }
    }
}
