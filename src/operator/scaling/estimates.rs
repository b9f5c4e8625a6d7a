//! The operator's remaining-work estimates: one task per `ChangeFeedProcessor` that, every
//! `autoscaling.estimateInterval`, bootstraps the processor's leases when nobody has yet (so a new
//! processor's backlog is visible before any worker ran), runs the library estimator over the
//! lease container, exports the figures as metrics and asks the controller to reconcile the
//! resource. Tasks of different resources run independently of each other and of reconciliation;
//! Cosmos clients are shared per account.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc::UnboundedSender;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio_util::sync::CancellationToken;

use crate::cosmos::{AccountAuth, CosmosAccount, MonitoredContainer};
use crate::operator::crd::{ChangeFeedProcessor, Estimation};
use crate::operator::metrics::{EstimateFigures, OperatorMetrics};
use crate::operator::scaling::estimate_report::{EstimateFailure, EstimateReport};
use crate::operator::scaling::news::is_news;
use crate::operator::scaling::worker_reports::{self, ReportMemory};
use crate::processor::leases::bootstrap::bootstrap;
use crate::processor::report::estimator::DEFAULT_CONCURRENCY;
use crate::processor::report::estimator::with_partition_figures;
use crate::processor::{CosmosLeaseStore, LeaseStore, ProcessorEstimate, ProcessorOptions, estimate_leases};
use crate::worker::{WorkerSettings, open};

/// The instance name the operator uses when it bootstraps a processor's leases.
pub const OPERATOR_INSTANCE: &str = "changefeed-operator";

/// Estimates that run at once, over all resources (each reads up to
/// [`DEFAULT_CONCURRENCY`] leases at a time); the others wait their turn.
pub const MAX_CONCURRENT_ESTIMATES: usize = 8;

/// Estimates of one namespace that run at once: one tenant's resources never hold every slot.
pub const MAX_CONCURRENT_ESTIMATES_PER_NAMESPACE: usize = 2;

/// Locks `mutex`; one poisoned by a panic elsewhere is used as it is (each field is a value
/// written whole), so that an estimate task's panic never stops the others' bookkeeping.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A resource, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceKey {
    /// The resource's namespace.
    pub namespace: String,
    /// The resource's name.
    pub name: String,
}

impl ResourceKey {
    /// The key of resource `name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// An account endpoint, its credential (whose `Debug` output never shows a key) and the regions
/// to read it from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AccountRef {
    /// The account endpoint.
    pub endpoint: String,
    /// The account key, or the operator's own Entra ID identity.
    pub auth: AccountAuth,
    /// The regions to read from, in order (the resource's `preferredRegions`, as its workers
    /// read); empty: the account's own order.
    pub preferred_regions: Vec<String>,
}

/// What to estimate for one resource, and how often.
#[derive(Debug, Clone, PartialEq)]
pub struct EstimateTarget {
    /// The monitored account.
    pub account: AccountRef,
    /// The lease account, when it is another one.
    pub lease_account: Option<AccountRef>,
    /// Database of the monitored container.
    pub database: String,
    /// The monitored container.
    pub container: String,
    /// Database of the lease container.
    pub lease_database: String,
    /// The lease container.
    pub lease_container: String,
    /// The workers' processor options (from the spec), under the operator's instance name: the
    /// lease set is created with them (start position, leases per partition, mode, adoption).
    pub options: ProcessorOptions,
    /// Whether a missing lease container is created (`leases.createIfNotExists`).
    pub create_leases: bool,
    /// Time between estimates.
    pub interval: Duration,
    /// How to estimate.
    pub estimation: Estimation,
    /// Whether built-in autoscaling uses the estimates (then every estimate is reconciled;
    /// otherwise only those that change what the status shows).
    pub autoscaled: bool,
}

impl EstimateTarget {
    /// The most one estimate may take before it counts as failed: twice the interval, within 5–60 s.
    pub fn timeout(&self) -> Duration {
        (self.interval * 2).clamp(Duration::from_secs(5), Duration::from_secs(60))
    }

    /// Worker settings that open this processor's containers (creating the lease container when
    /// missing and allowed, as a worker would).
    pub fn settings(&self) -> WorkerSettings {
        WorkerSettings {
            database: self.database.clone(),
            container: self.container.clone(),
            lease_database: self.lease_database.clone(),
            lease_container: self.lease_container.clone(),
            create_leases: self.create_leases,
            options: self.options.clone(),
        }
    }
}

/// Connected Cosmos clients, one per account, shared by every resource.
#[derive(Clone, Default)]
pub struct Accounts {
    clients: Arc<Mutex<HashMap<AccountRef, CosmosAccount>>>,
}

impl Accounts {
    /// The client of `account`, connecting on first use.
    pub async fn get(&self, account: &AccountRef) -> Result<CosmosAccount, EstimateFailure> {
        if let Some(client) = lock(&self.clients).get(account).cloned() {
            return Ok(client);
        }
        let client = CosmosAccount::connect_preferring(&account.endpoint, &account.auth, &account.preferred_regions)
            .await
            .map_err(|e| EstimateFailure::new("connect", format!("cannot connect to {}: {e}", account.endpoint)))?;
        lock(&self.clients).insert(account.clone(), client.clone());
        Ok(client)
    }

    /// Drops the client of `account`, so that the next use connects anew (after a failure: a
    /// client can keep state, such as session tokens, that an account which came back rejects).
    pub fn forget(&self, account: &AccountRef) {
        lock(&self.clients).remove(account);
    }

    /// Opens the monitored container and the lease store of `target`.
    pub async fn open(&self, target: &EstimateTarget) -> Result<Opened, EstimateFailure> {
        let account = self.get(&target.account).await?;
        let lease_account = match &target.lease_account {
            Some(lease_account) => self.get(lease_account).await?,
            None => account.clone(),
        };
        let (monitored, store) = open(&account, &lease_account, &target.settings())
            .await
            .map_err(|e| EstimateFailure::opening(&e))?;
        Ok(Opened {
            monitored,
            store: Arc::new(store),
        })
    }
}

/// A processor's opened containers.
#[derive(Clone)]
pub struct Opened {
    /// The monitored container.
    pub monitored: MonitoredContainer,
    /// The processor's lease store.
    pub store: Arc<CosmosLeaseStore>,
}

/// One estimate: bootstrap the leases when nobody has, then estimate every lease.
pub async fn estimate_once(
    opened: &Opened,
    target: &EstimateTarget,
    memory: &mut ReportMemory,
) -> Result<ProcessorEstimate, EstimateFailure> {
    let how = How {
        mode: target.estimation,
        stale_after: worker_reports::stale_after(target.interval),
    };
    estimate_in(opened.store.as_ref(), &opened.monitored, &target.options, how, memory).await
}

/// How to estimate: the mode, and when a reported lag is stale.
#[derive(Debug, Clone, Copy)]
pub struct How {
    /// `autoscaling.estimation`.
    pub mode: Estimation,
    /// A reported lag whose checkpoint has not moved for this long is read instead.
    pub stale_after: Duration,
}

/// One estimate of the processor `options` name over `store` and `monitored`, as `how` says;
/// `memory` keeps what the worker-report mode saw between estimates.
pub async fn estimate_in(
    store: &dyn LeaseStore,
    monitored: &MonitoredContainer,
    options: &ProcessorOptions,
    how: How,
    memory: &mut ReportMemory,
) -> Result<ProcessorEstimate, EstimateFailure> {
    let store_error = |e: &dyn std::fmt::Display| EstimateFailure::new("lease_store", format!("lease container: {e}"));
    let mut snapshot = store.snapshot().await.map_err(|e| store_error(&e))?;
    if !snapshot.initialized {
        bootstrap(store, monitored, options)
            .await
            .map_err(|e| store_error(&e))?;
        snapshot = store.snapshot().await.map_err(|e| store_error(&e))?;
    }
    let (start, leases) = (options.start_from, &snapshot.leases);
    let estimates = match how.mode {
        Estimation::WorkerReports => {
            let trust = worker_reports::Trust {
                stale_after: how.stale_after,
                expiration: options.expiration,
            };
            worker_reports::estimate_reported(monitored, &snapshot, start, memory, trust).await
        }
        Estimation::ChangeFeed | Estimation::Disabled => {
            estimate_leases(monitored, leases, start, DEFAULT_CONCURRENCY).await
        }
    }
    .map_err(|e| EstimateFailure::new("change_feed", format!("reading the change feed: {e}")))?;
    let estimate = ProcessorEstimate::new(options.processor_name.clone(), estimates);
    Ok(with_partition_figures(estimate, &snapshot, monitored).await)
}

/// The figures exported for an estimate.
pub fn figures(estimate: &ProcessorEstimate) -> EstimateFigures {
    let owners: std::collections::BTreeSet<&str> = estimate.leases.iter().filter_map(|l| l.owner.as_deref()).collect();
    EstimateFigures {
        estimated_lag: estimate.total_lag,
        leases: estimate.lease_count,
        leases_with_lag: estimate.leases_with_lag,
        lease_owners: owners.len(),
        leases_unowned: estimate.leases.iter().filter(|l| l.owner.is_none()).count(),
        leases_stalled: estimate.leases.iter().filter(|l| l.stalled.is_some()).count(),
        oldest_pending_seconds: estimate.oldest_pending_seconds,
    }
}

#[derive(Default)]
struct TaskState {
    report: Option<EstimateReport>,
    opened: Option<Opened>,
}

struct Running {
    target: EstimateTarget,
    cancel: CancellationToken,
    state: Arc<Mutex<TaskState>>,
}

struct Inner {
    accounts: Accounts,
    metrics: Arc<OperatorMetrics>,
    trigger: UnboundedSender<ObjectRef<ChangeFeedProcessor>>,
    resources: Store<ChangeFeedProcessor>,
    running: Mutex<HashMap<ResourceKey, Running>>,
    root: CancellationToken,
    /// Bounds the estimates that run at once, over all resources.
    slots: tokio::sync::Semaphore,
    /// Bounds the estimates that run at once per namespace.
    namespace_slots: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

impl Inner {
    /// The estimate slots of `namespace`.
    fn namespace_slots(&self, namespace: &str) -> Arc<tokio::sync::Semaphore> {
        let mut slots = lock(&self.namespace_slots);
        let slot = || Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_ESTIMATES_PER_NAMESPACE));
        slots.entry(namespace.to_owned()).or_insert_with(slot).clone()
    }
}

/// The estimate tasks of one leadership term. Dropping it stops them and removes their metrics.
pub struct Estimators {
    inner: Arc<Inner>,
}

impl Estimators {
    /// Estimators that ask for reconciliations through `trigger` and stop estimating resources
    /// that are no longer in `resources`.
    pub fn new(
        accounts: Accounts,
        metrics: Arc<OperatorMetrics>,
        trigger: UnboundedSender<ObjectRef<ChangeFeedProcessor>>,
        resources: Store<ChangeFeedProcessor>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                accounts,
                metrics,
                trigger,
                resources,
                running: Mutex::new(HashMap::new()),
                root: CancellationToken::new(),
                slots: tokio::sync::Semaphore::new(MAX_CONCURRENT_ESTIMATES),
                namespace_slots: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The shared Cosmos clients.
    pub fn accounts(&self) -> &Accounts {
        &self.inner.accounts
    }

    /// Makes sure `key` is estimated as `target` says; restarts its task when the target changed.
    pub fn ensure(&self, key: &ResourceKey, target: EstimateTarget) {
        let mut running = lock(&self.inner.running);
        let previous = match running.get(key) {
            Some(task) if task.target == target && !task.cancel.is_cancelled() => return,
            Some(task) => {
                task.cancel.cancel();
                lock(&task.state).report.clone()
            }
            None => None,
        };
        let state = Arc::new(Mutex::new(TaskState {
            report: previous,
            opened: None,
        }));
        let cancel = self.inner.root.child_token();
        tokio::spawn(run(
            self.inner.clone(),
            key.clone(),
            target.clone(),
            state.clone(),
            cancel.clone(),
        ));
        running.insert(key.clone(), Running { target, cancel, state });
    }

    /// Stops estimating `key` and removes its metrics.
    pub fn stop(&self, key: &ResourceKey) {
        if let Some(task) = lock(&self.inner.running).remove(key) {
            task.cancel.cancel();
        }
        self.inner.metrics.forget(&key.namespace, &key.name);
    }

    /// The latest estimate of `key`, if any.
    pub fn report(&self, key: &ResourceKey) -> Option<EstimateReport> {
        let running = lock(&self.inner.running);
        lock(&running.get(key)?.state).report.clone()
    }

    /// The lease store of `key`'s processor: the estimator's, or a newly opened one.
    pub async fn lease_store(&self, key: &ResourceKey) -> Result<Arc<CosmosLeaseStore>, EstimateFailure> {
        let (target, opened) = {
            let running = lock(&self.inner.running);
            let task = running.get(key).ok_or_else(|| {
                EstimateFailure::new(
                    "lease_store",
                    format!(
                        "processor {}/{} is not being estimated (not reconciled yet, or misconfigured)",
                        key.namespace, key.name
                    ),
                )
            })?;
            let opened = lock(&task.state).opened.clone();
            (task.target.clone(), opened)
        };
        match opened {
            Some(opened) => Ok(opened.store),
            None => Ok(self.inner.accounts.open(&target).await?.store),
        }
    }
}

impl Drop for Estimators {
    fn drop(&mut self) {
        self.inner.root.cancel();
        for ResourceKey { namespace, name } in lock(&self.inner.running).keys() {
            self.inner.metrics.forget(namespace, name);
        }
    }
}

async fn run(
    inner: Arc<Inner>,
    key: ResourceKey,
    target: EstimateTarget,
    state: Arc<Mutex<TaskState>>,
    cancel: CancellationToken,
) {
    let (namespace, name) = (key.namespace.as_str(), key.name.as_str());
    let object = ObjectRef::<ChangeFeedProcessor>::new(name).within(namespace);
    let mut seq = lock(&state).report.as_ref().map_or(0, |r| r.seq);
    if target.estimation == Estimation::Disabled {
        // Nothing to estimate (KEDA or an HPA scales): the task only keeps the lease store for
        // failovers, and no series, until the resource is gone.
        inner.metrics.forget(namespace, name);
        while inner.resources.get(&object).is_some() {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(target.interval) => {}
            }
        }
        forget_task(&inner, &key, &state);
        return;
    }
    let mut memory = ReportMemory::default();
    loop {
        if inner.resources.get(&object).is_none() {
            // The resource was deleted: stop, and let its series disappear.
            forget_task(&inner, &key, &state);
            return;
        }
        let namespace_slots = inner.namespace_slots(&key.namespace);
        let slot = tokio::select! {
            _ = cancel.cancelled() => return,
            slot = async { (namespace_slots.acquire().await, inner.slots.acquire().await) } => slot,
        };
        let started = Instant::now();
        let outcome = tokio::select! {
            _ = cancel.cancelled() => return,
            outcome = tokio::time::timeout(target.timeout(), attempt(&inner, &target, &state, &mut memory)) => outcome.unwrap_or_else(|_| {
                Err(EstimateFailure::new("timeout", format!("no answer from the account within {:?}", target.timeout())))
            }),
        };
        drop(slot);
        record(&inner, &key, &target, &state, &outcome, started.elapsed());
        seq += 1;
        let news = {
            let mut s = lock(&state);
            let news = is_news(s.report.as_ref().map(|r| &r.outcome), &outcome, target.autoscaled);
            s.report = Some(EstimateReport {
                seq,
                at: Instant::now(),
                time: crate::operator::status::now(),
                outcome,
            });
            news
        };
        if news {
            let _ = inner.trigger.unbounded_send(object.clone());
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(target.interval) => {}
        }
    }
}

/// Removes the task of a deleted resource (unless a newer one replaced it) and its series.
fn forget_task(inner: &Inner, key: &ResourceKey, state: &Arc<Mutex<TaskState>>) {
    let mut running = lock(&inner.running);
    if running.get(key).is_some_and(|t| Arc::ptr_eq(&t.state, state)) {
        running.remove(key);
    }
    drop(running);
    inner.metrics.forget(&key.namespace, &key.name);
}

/// One estimate, with the containers opened before (or opened now and kept).
async fn attempt(
    inner: &Inner,
    target: &EstimateTarget,
    state: &Mutex<TaskState>,
    memory: &mut ReportMemory,
) -> Result<ProcessorEstimate, EstimateFailure> {
    let cached = lock(state).opened.clone();
    let opened = match cached {
        Some(opened) => opened,
        None => {
            let opened = inner.accounts.open(target).await?;
            lock(state).opened = Some(opened.clone());
            opened
        }
    };
    estimate_once(&opened, target, memory).await
}

/// Records an estimate's outcome in the metrics and the log; after a failure, the accounts and
/// containers are opened anew next time.
fn record(
    inner: &Inner,
    key: &ResourceKey,
    target: &EstimateTarget,
    state: &Mutex<TaskState>,
    outcome: &Result<ProcessorEstimate, EstimateFailure>,
    took: Duration,
) {
    let (namespace, name) = (key.namespace.as_str(), key.name.as_str());
    match outcome {
        Ok(estimate) => {
            inner.metrics.estimated(namespace, name, figures(estimate), took);
            tracing::debug!(
                namespace,
                processor = name,
                lag = estimate.total_lag,
                leases = estimate.lease_count,
                "estimated"
            );
        }
        Err(failure) => {
            inner.metrics.estimate_failed(namespace, name, failure.reason, took);
            tracing::warn!(namespace, processor = name, reason = failure.reason, error = %failure.message, "estimate failed");
            // Connect and open the containers again next time: an account that came back may
            // have new containers and reject the old client's session tokens.
            lock(state).opened = None;
            inner.accounts.forget(&target.account);
            if let Some(lease_account) = &target.lease_account {
                inner.accounts.forget(lease_account);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disabled_target() -> EstimateTarget {
        let account = AccountRef {
            endpoint: "http://127.0.0.1:1".into(),
            auth: AccountAuth::Key("a2V5".into()),
            preferred_regions: Vec::new(),
        };
        EstimateTarget {
            account,
            lease_account: None,
            database: "db".into(),
            container: "items".into(),
            lease_database: "db".into(),
            lease_container: "leases".into(),
            options: ProcessorOptions::new("p", "operator"),
            create_leases: false,
            interval: Duration::from_secs(60),
            estimation: Estimation::Disabled,
            autoscaled: false,
        }
    }

    #[tokio::test]
    async fn a_panic_while_the_estimates_were_locked_stops_no_later_estimate() {
        let (trigger, _triggered) = futures::channel::mpsc::unbounded();
        let (resources, _writer) = kube::runtime::reflector::store();
        let metrics = OperatorMetrics::new().expect("metrics");
        let estimators = Estimators::new(Accounts::default(), metrics, trigger, resources);
        let inner = estimators.inner.clone();
        let _ = std::thread::spawn(move || {
            let _held = inner.running.lock();
            panic!("a panic while the estimates were locked");
        })
        .join();
        assert!(estimators.inner.running.is_poisoned());
        let key = ResourceKey::new("ns", "p");
        estimators.ensure(&key, disabled_target());
        let started = estimators
            .inner
            .running
            .lock()
            .map_or_else(|e| e.into_inner().contains_key(&key), |r| r.contains_key(&key));
        assert!(started, "no estimate started after the panic");
        estimators.stop(&key);
        let stopped = estimators
            .inner
            .running
            .lock()
            .map_or_else(|e| !e.into_inner().contains_key(&key), |r| !r.contains_key(&key));
        assert!(stopped, "the estimate was not stopped after the panic");
    }
}
