//! `cfp worker`: one processor instance until SIGINT/SIGTERM, then a graceful stop.

use std::sync::Arc;

use super::args::{HandlerKind, StartFromArg, WorkerArgs};
use crate::cosmos::{CosmosAccount, StartFrom};
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
    let mut options = ProcessorOptions::new(args.processor.clone(), instance);
    options.start_from = match args.start_from {
        StartFromArg::Beginning => StartFrom::Beginning,
        StartFromArg::Now => StartFrom::Now,
        StartFromArg::Time(t) => StartFrom::Time(t),
    };
    options.max_items = args.max_items;
    options.poll_interval = args.poll_interval;
    options.acquire_interval = args.lease_acquire_interval;
    options.renew_interval = args.lease_renew_interval;
    options.expiration = args.lease_expiration;
    WorkerSettings {
        database: args.connection.database.clone(),
        container: args.connection.container.clone(),
        lease_database: args
            .lease_database
            .clone()
            .unwrap_or_else(|| args.connection.database.clone()),
        lease_container: args.lease_container.clone(),
        create_leases: !args.no_create_leases,
        options,
    }
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
    let processor = build_processor(&account, &account, &settings, handler).await?;
    tracing::info!(processor = %settings.options.processor_name, instance = %settings.options.instance, "starting worker");
    let handle = processor.start().await?;
    crate::signals::terminated().await;
    tracing::info!(instance = %settings.options.instance, "stopping: releasing leases");
    handle.stop().await;
    Ok(())
}
