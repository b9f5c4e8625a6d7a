//! The running processor's public face: [`Processor`] (configure and start), [`ProcessorHandle`] (a
//! started one: stop, abort, events) and [`ProcessorMonitor`] (health and estimates). The work
//! itself is in [`crate::processor::run::coordinator`], [`crate::processor::run::renewer`] and
//! [`crate::processor::run::lease_reader`].

use std::sync::Arc;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::cosmos::{CosmosError, MonitoredContainer};
use crate::processor::error::ProcessorError;
use crate::processor::handlers::change_handler::ChangeHandler;
use crate::processor::handlers::dead_letters::DeadLetterStore;
use crate::processor::handlers::manual::Handler;
use crate::processor::leases::bootstrap::bootstrap_paced;
use crate::processor::leases::lease::LeaseStore;
use crate::processor::options::{OnExhausted, ProcessorOptions};
use crate::processor::policy::start_retry::retrying;
use crate::processor::report::estimator::{DEFAULT_CONCURRENCY, LeaseEstimate, estimate_leases};
use crate::processor::report::events::LeaseEvent;
use crate::processor::report::observer::ProcessorObserver;
use crate::processor::run::coordinator::Coordinator;
use crate::processor::run::renewer::renew_loop;
use crate::processor::run::shared::Shared;

/// A change feed processor: leases in a lease container, batches to a handler.
pub struct Processor {
    shared: Arc<Shared>,
}

impl Processor {
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
    /// (each batch comes with a [`crate::processor::CheckpointHandle`], and nothing is checkpointed
    /// until the handler uses one).
    pub fn with_handler(
        monitored: MonitoredContainer,
        store: Arc<dyn LeaseStore>,
        handler: Handler,
        options: ProcessorOptions,
    ) -> Self {
        Self {
            shared: Arc::new(Shared::new(monitored, store, handler, options)),
        }
    }

    /// Reports measurements to `observer` (for example Prometheus metrics).
    pub fn with_observer(self, observer: Arc<dyn ProcessorObserver>) -> Self {
        self.shared.telemetry.set_observer(observer);
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
        self.shared.telemetry.subscribe()
    }

    /// A view for health endpoints and metrics (not ready until started).
    pub fn monitor(&self) -> ProcessorMonitor {
        ProcessorMonitor {
            shared: self.shared.clone(),
        }
    }

    /// Bootstraps the lease store (once per processor) and starts processing.
    pub async fn start(self) -> Result<ProcessorHandle, ProcessorError> {
        self.shared.options.validate()?;
        if self.shared.options.retry.on_exhausted == OnExhausted::DeadLetter && self.shared.handler.is_manual() {
            return Err(ProcessorError::Config(
                "dead-lettering needs automatic checkpoints: a manual checkpoint of part of a batch would skip the rest".into(),
            ));
        }
        if self.shared.options.max_in_flight_batches > 1 && self.shared.handler.is_manual() {
            return Err(ProcessorError::Config(
                "manual checkpoints need one batch in flight: a checkpoint of a later batch would cover an earlier one whose handler failed".into(),
            ));
        }
        if self.shared.options.retry.on_exhausted == OnExhausted::DeadLetter && self.shared.dead_letters.get().is_none()
        {
            return Err(ProcessorError::Config(
                "dead-lettering needs a dead-letter container (--dead-letter-container)".into(),
            ));
        }
        let options = &self.shared.options;
        let span = tracing::info_span!("processor", processor = %options.processor_name, instance = %options.instance);
        // Alone as far as this instance knows: only the holder of the bootstrap lock writes.
        self.shared.share_budget(1.0).await;
        bootstrap_paced(
            self.shared.store.as_ref(),
            &self.shared.budget,
            &self.shared.monitored,
            options,
        )
        .instrument(span.clone())
        .await?;
        retrying("claiming the instance name", ProcessorError::is_transient, || {
            self.claim_name()
        })
        .instrument(span.clone())
        .await?;
        let shutdown = CancellationToken::new();
        let leases = CancellationToken::new();
        let coordinator = Coordinator::new(self.shared.clone(), leases.clone());
        // The renewer outlives the shutdown request: it keeps every lease still owned alive until
        // the coordinator has released them all (a batch in flight may take longer than the
        // lease expiration), and stops when the coordinator's task ends.
        let renewing = CancellationToken::new();
        let task = tokio::spawn(
            coordinator
                .run(shutdown.clone(), renewing.clone())
                .instrument(span.clone()),
        );
        let renewer = tokio::spawn(renew_loop(self.shared.clone(), renewing).instrument(span.clone()));
        span.in_scope(|| tracing::info!("processor started"));
        Ok(ProcessorHandle {
            shared: self.shared,
            shutdown,
            leases,
            task,
            renewer,
        })
    }
}

impl Processor {
    /// Writes this process's first heartbeat under its instance name; refuses to start while
    /// another process writes that name's heartbeat ([`crate::processor::leases::name_claim`]).
    async fn claim_name(&self) -> Result<(), ProcessorError> {
        let shared = &self.shared;
        let sent = tokio::time::Instant::now();
        let keeps = shared.liveness.beats();
        let poll = shared.options.renew_interval.min(shared.options.expiration / 4);
        shared
            .name
            .claim(shared.store.as_ref(), keeps, shared.options.expiration, poll)
            .await?;
        shared.liveness.beat(sent, shared.options.expiration / 2);
        Ok(())
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
        self.shared.telemetry.subscribe()
    }

    /// Tokens of the leases this instance processes now.
    pub fn owned_leases(&self) -> Vec<String> {
        let mut tokens: Vec<String> = self.shared.owned.all().iter().map(|o| o.token().to_owned()).collect();
        tokens.sort();
        tokens
    }

    /// Acquire cycles started so far (the first is number 1).
    pub fn acquire_cycles(&self) -> u64 {
        self.shared.cycle()
    }

    /// Whether the processor is bootstrapped and its lease loop is running.
    pub fn is_ready(&self) -> bool {
        self.shared.health.is_ready() && !self.task.is_finished()
    }

    /// A cheap handle for health checks and estimates.
    pub fn monitor(&self) -> ProcessorMonitor {
        ProcessorMonitor {
            shared: self.shared.clone(),
        }
    }

    /// Resolves when the processor stopped by itself because it cannot go on (another process took
    /// its instance name, its monitored container was deleted and created again), with the reason;
    /// pending until then.
    pub async fn halted(&self) -> String {
        self.shared.health.halt().cancelled().await;
        self.shared.health.halt_reason().unwrap_or_default()
    }

    /// Graceful stop: stops reading, lets an in-flight batch finish and checkpoint, releases every
    /// owned lease (keeping its continuation) and removes this instance's heartbeat.
    pub async fn stop(self) {
        // Said in its next heartbeat (a renew interval at most): the others count this instance
        // out of the fair shares and take each lease as it is released. Not in a beat of its
        // own: a beat whose answer is still on its way when the stop ends outlasts the wait for
        // it, and the heartbeat would be left behind.
        self.shared.name.leave();
        self.shutdown.cancel();
        self.leases.cancel();
        let _ = self.task.await;
        let _ = self.renewer.await;
    }

    /// Stops at once, as a crash would (for tests and chaos): nothing more is written to the
    /// lease container — no checkpoint, release, handoff or heartbeat removal — and no batch
    /// goes to the handler; the tasks are dropped without being told (the lease tasks with the
    /// coordinator that holds them). Its leases expire as a crashed instance's do.
    pub fn abort(self) {
        self.shared.crash();
        self.task.abort();
        self.renewer.abort();
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
        self.shared.health.is_ready()
    }

    /// Why the processor is not fully working: the lease container is missing, or a lease's
    /// change feed keeps failing.
    pub fn read_problem(&self) -> Option<String> {
        self.shared.health.read_problem()
    }

    /// Whether the processor's coordinator still runs (false after it died unexpectedly).
    pub fn is_alive(&self) -> bool {
        self.shared.health.is_alive()
    }

    /// Whether the handler can take batches now (for example, an HTTP handler answers).
    pub async fn handler_ready(&self) -> bool {
        self.shared.handler.ready().await
    }

    /// Leases owned now.
    pub fn owned_leases(&self) -> usize {
        self.shared.owned.count()
    }

    /// Estimates the leases this instance owns now (one feed read each).
    pub async fn estimate_owned(&self) -> Result<Vec<LeaseEstimate>, CosmosError> {
        let mut leases = Vec::new();
        for owned in self.shared.owned.all() {
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
