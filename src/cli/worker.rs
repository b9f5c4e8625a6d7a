//! `cfp worker`: one processor instance until SIGINT/SIGTERM, then a graceful stop.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::args::{HandlerKind, WorkerArgs};
use crate::cosmos::CosmosAccount;
use crate::metrics::WorkerMetrics;
use crate::processor::{ChangeHandler, ProcessorOptions, StdoutHandler};
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
}

/// The settings a worker runs with, from its arguments.
pub fn settings(args: &WorkerArgs) -> WorkerSettings {
    let instance = args
        .instance
        .clone()
        .unwrap_or_else(|| gethostname::gethostname().to_string_lossy().into_owned());
    let mut options = ProcessorOptions::new(args.leases.processor.clone(), instance);
    options.start_from = args.start_from;
    options.max_items = args.max_items;
    options.poll_interval = args.poll_interval;
    options.acquire_interval = args.lease_acquire_interval;
    options.renew_interval = args.lease_renew_interval;
    options.expiration = args.lease_expiration;
    args.connection.settings(&args.leases, !args.no_create_leases, options)
}

/// Runs the worker until a termination signal.
pub async fn run(args: &WorkerArgs) -> Result<(), WorkerCommandError> {
    let settings = settings(args);
    let endpoint = &args.connection.endpoint;
    let account = CosmosAccount::connect(endpoint, &args.connection.key)
        .await
        .map_err(|source| WorkerCommandError::Connect {
            endpoint: endpoint.clone(),
            source,
        })?;
    let handler: Arc<dyn ChangeHandler> = match args.handler {
        HandlerKind::Stdout => Arc::new(StdoutHandler::new()),
    };
    let lease_account = args
        .leases
        .account(&args.connection, &account)
        .await
        .map_err(|source| WorkerCommandError::Connect {
            endpoint: args.leases.lease_endpoint.clone().unwrap_or_default(),
            source,
        })?;
    let mut processor = build_processor(&account, &lease_account, &settings, handler).await?;
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
        background.push(tokio::spawn(crate::metrics::serve(
            listener,
            shutdown.clone(),
            metrics.clone(),
            monitor.clone(),
        )));
        let interval = settings.options.acquire_interval;
        background.push(tokio::spawn(crate::metrics::estimate_periodically(
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
    crate::signals::terminated().await;
    tracing::info!(instance = %settings.options.instance, "stopping: releasing leases");
    handle.stop().await;
    shutdown.cancel();
    for task in background {
        let _ = task.await;
    }
    Ok(())
}
