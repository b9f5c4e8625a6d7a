//! `cfp worker`: one processor instance until SIGINT/SIGTERM, then a graceful stop.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::args::WorkerArgs;
use crate::cosmos::CosmosAccount;
use crate::processor::policy::start_retry::retrying;
use crate::processor::{CosmosDeadLetters, OnExhausted};
use crate::worker::metrics::WorkerMetrics;
use crate::worker::{WorkerError, WorkerSettings, build_processor};

/// Why `cfp worker` stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum WorkerCommandError {
    /// Connecting or validating the configuration failed.
    #[error(transparent)]
    Setup(#[from] WorkerError),
    /// The endpoint or key are unusable.
    #[error("cannot connect to {endpoint}: {source}")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// The error.
        source: crate::cosmos::CosmosError,
    },
    /// The processor could not start.
    #[error("the processor could not start: {0}")]
    Start(#[from] crate::processor::ProcessorError),
    /// The metrics endpoint could not be served.
    #[error("cannot serve metrics: {0}")]
    Metrics(std::io::Error),
    /// The handler or retry flags cannot work.
    #[error(transparent)]
    Handler(#[from] super::handler::HandlerSetupError),
    /// The processor stopped by itself: it cannot go on with what it was started for.
    #[error("the processor stopped: {0}")]
    Halted(String),
    /// The dead-letter container cannot be used.
    #[error("dead-letter container {container}: {source}")]
    DeadLetters {
        /// `database/container`.
        container: String,
        /// The error.
        source: crate::cosmos::ProvisionError,
    },
}

/// The settings a worker runs with, from its arguments.
pub fn settings(args: &WorkerArgs) -> WorkerSettings {
    let instance = args
        .instance
        .clone()
        .unwrap_or_else(|| gethostname::gethostname().to_string_lossy().into_owned());
    let mut options = args.processor.options(args.leases.processor.clone(), instance);
    options.pod_uid = args.pod_uid.clone().filter(|uid| !uid.is_empty());
    let first = std::fs::read("/proc/1/cmdline").unwrap_or_default();
    if options.pod_uid.is_some() && beside_the_containers_worker(std::process::id(), &first) {
        tracing::warn!(
            "another cfp worker is this container's main process: this one waits out its name's heartbeat as any newcomer does (give it an --instance of its own)"
        );
        options.pod_uid = None;
    }
    args.connection.settings(&args.leases, !args.no_create_leases, options)
}

/// Whether this process (`pid`) runs beside the worker its container started — `kubectl exec`
/// of `cfp worker` into a worker container: the container's first process (its command line
/// `first`, NUL-separated) is a `cfp worker` and this is not it. Such a process inherits the
/// pod's UID but is no successor of that worker, so it must not take the name over at once.
fn beside_the_containers_worker(pid: u32, first: &[u8]) -> bool {
    let mut args = first.split(|b| *b == 0).filter(|a| !a.is_empty());
    let is_cfp = args.next().is_some_and(|program| program.ends_with(b"cfp"));
    pid != 1 && is_cfp && args.any(|arg| arg == b"worker")
}

/// The CloudEvents `source` of the monitored container.
pub fn event_source(account: &CosmosAccount, database: &str, container: &str) -> String {
    format!("cosmosdb://{}/dbs/{database}/colls/{container}", account.host())
}

/// Opens the dead-letter container the flags name, if any; a missing one is created when the
/// worker may create containers (not with --no-create-leases).
async fn dead_letters(
    args: &WorkerArgs,
    settings: &WorkerSettings,
    account: &CosmosAccount,
) -> Result<Option<Arc<CosmosDeadLetters>>, WorkerCommandError> {
    let Some(container) = &args.dead_letters.dead_letter_container else {
        if args.processor.on_exhausted == OnExhausted::DeadLetter {
            return Err(super::handler::HandlerSetupError::NoDeadLetterContainer.into());
        }
        return Ok(None);
    };
    let database = args
        .dead_letters
        .dead_letter_database
        .clone()
        .unwrap_or_else(|| settings.lease_database.clone());
    let name = format!("{database}/{container}");
    let documents = account
        .open_or_create(&database, container, "/id", settings.create_leases)
        .await
        .map_err(|source| WorkerCommandError::DeadLetters {
            container: name,
            source,
        })?;
    Ok(Some(Arc::new(CosmosDeadLetters::new(documents))))
}

impl WorkerCommandError {
    /// Whether starting again later can succeed (throttling, 503, timeouts, resets).
    pub fn is_transient(&self) -> bool {
        match self {
            WorkerCommandError::Connect { source, .. } => source.kind.is_retryable(),
            WorkerCommandError::DeadLetters {
                source: crate::cosmos::ProvisionError::Cosmos(source),
                ..
            } => source.kind.is_retryable(),
            WorkerCommandError::Setup(WorkerError::Cosmos { source, .. }) => source.kind.is_retryable(),
            WorkerCommandError::Start(error) => error.is_transient(),
            _ => false,
        }
    }
}

/// Runs the worker until a termination signal.
pub async fn run(args: &WorkerArgs) -> Result<(), WorkerCommandError> {
    let settings = settings(args);
    // Transient failures (a failover under way, throttling, an outage) are tried again for a
    // while; then Kubernetes restarts the worker with its own back-off.
    let opened = retrying("starting", WorkerCommandError::is_transient, || open(args, &settings));
    let mut processor = tokio::select! {
        opened = opened => opened?,
        _ = crate::signals::terminated() => return Ok(()),
    };
    let shutdown = CancellationToken::new();
    let mut background = Vec::new();
    if let Some(port) = args.metrics_port {
        let metrics = WorkerMetrics::new(&settings.options.processor_name)
            .map_err(|e| WorkerCommandError::Metrics(std::io::Error::other(e)))?;
        processor = processor.with_observer(metrics.clone());
        let listener = TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port)))
            .await
            .map_err(WorkerCommandError::Metrics)?;
        let address = listener.local_addr().map_err(WorkerCommandError::Metrics)?;
        tracing::info!(%address, "serving /metrics, /healthz and /readyz");
        let monitor = processor.monitor();
        background.push(tokio::spawn(crate::worker::metrics::serve(
            listener,
            shutdown.clone(),
            metrics.clone(),
            monitor.clone(),
        )));
        let interval = settings.options.acquire_interval;
        background.push(tokio::spawn(crate::worker::metrics::estimate_periodically(
            metrics,
            monitor,
            interval,
            shutdown.clone(),
        )));
    }
    tracing::info!(processor = %settings.options.processor_name, instance = %settings.options.instance, "starting worker");
    let handle = tokio::select! {
        started = processor.start() => started?,
        _ = crate::signals::terminated() => {
            shutdown.cancel();
            return Ok(());
        }
    };
    let halted = tokio::select! {
        _ = crate::signals::terminated() => None,
        reason = handle.halted() => Some(reason),
    };
    tracing::info!(instance = %settings.options.instance, "stopping: releasing leases");
    handle.stop().await;
    shutdown.cancel();
    for task in background {
        let _ = task.await;
    }
    // Exiting lets Kubernetes start the worker again, on what exists now.
    halted.map_or(Ok(()), |reason| Err(WorkerCommandError::Halted(reason)))
}

/// Connects to the accounts and opens the containers: the processor, not started yet.
async fn open(args: &WorkerArgs, settings: &WorkerSettings) -> Result<crate::processor::Processor, WorkerCommandError> {
    let endpoint = &args.connection.endpoint;
    let account = CosmosAccount::connect_preferring(
        endpoint,
        &args.connection.account_auth(),
        &args.connection.preferred_regions,
    )
    .await
    .map_err(|source| WorkerCommandError::Connect {
        endpoint: endpoint.clone(),
        source,
    })?;
    let source = event_source(&account, &settings.database, &settings.container);
    let handler = super::handler::build(&args.handler, source).map_err(WorkerCommandError::Handler)?;
    let lease_account = args
        .leases
        .account(&args.connection, &account)
        .await
        .map_err(|source| WorkerCommandError::Connect {
            endpoint: args.leases.lease_endpoint.clone().unwrap_or_default(),
            source,
        })?;
    let mut processor = build_processor(&account, &lease_account, settings, handler).await?;
    if let Some(store) = dead_letters(args, settings, &lease_account).await? {
        processor = processor.with_dead_letters(store);
    }
    Ok(processor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_exec_ed_beside_the_containers_worker_is_no_successor() {
        #[rustfmt::skip]
        let cases: [(&str, u32, &[u8], bool); 5] = [
            ("the container's worker itself", 1, b"/usr/local/bin/cfp\0worker\0", false),
            ("kubectl exec beside it", 42, b"/usr/local/bin/cfp\0worker\0", true),
            ("exec beside a container running something else", 42, b"/bin/sh\0-c\0sleep\0", false),
            ("outside a container: init is pid 1", 4242, b"/sbin/init\0", false),
            ("pid 1 unreadable", 4242, b"", false),
        ];
        for (name, pid, first, beside) in cases {
            assert_eq!(beside_the_containers_worker(pid, first), beside, "{name}");
        }
    }
}
