//! Wiring one processor instance from its settings: open the monitored and lease containers,
//! check they are usable, and build the processor. Used by `cfp worker` and by tests.

use std::sync::Arc;

use crate::cosmos::{CosmosAccount, CosmosError, ErrorKind, MonitoredContainer};
use crate::processor::{
    ChangeFeedProcessor, ChangeHandler, CosmosLeaseStore, LeaseStoreError, ProcessorOptions, lease_prefix,
};

/// Where a worker reads from and keeps its leases.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Database of the monitored container.
    pub database: String,
    /// The monitored container.
    pub container: String,
    /// Database of the lease container.
    pub lease_database: String,
    /// The lease container.
    pub lease_container: String,
    /// Create the lease container (partition key `/id`) when it is missing.
    pub create_leases: bool,
    /// Processor options (name, instance, timings).
    pub options: ProcessorOptions,
}

/// Why a worker cannot start. Each message says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The monitored container does not exist.
    #[error("the monitored container {0} does not exist")]
    MonitoredMissing(String),
    /// The lease container does not exist and may not be created.
    #[error("the lease container {0} does not exist (create it, or drop --no-create-leases)")]
    LeasesMissing(String),
    /// The account rejected the key.
    #[error("the account rejected the key ({0}); check --key / CFP_KEY")]
    Unauthorized(String),
    /// The lease container cannot hold leases.
    #[error("{0}")]
    LeaseContainer(String),
    /// The options do not make sense.
    #[error("{0}")]
    Options(String),
    /// Cosmos failed in another way.
    #[error("{context}: {source}")]
    Cosmos {
        /// What was being done.
        context: String,
        /// The error.
        source: CosmosError,
    },
}

fn classify(error: CosmosError, context: &str, missing: impl FnOnce() -> WorkerError) -> WorkerError {
    match error.kind {
        ErrorKind::NotFound => missing(),
        ErrorKind::Unauthorized => WorkerError::Unauthorized(error.message),
        _ => WorkerError::Cosmos {
            context: context.to_owned(),
            source: error,
        },
    }
}

/// Opens the monitored container and the processor's lease store, creating the lease container
/// when the settings allow it.
pub async fn open(
    account: &CosmosAccount,
    lease_account: &CosmosAccount,
    settings: &WorkerSettings,
) -> Result<(MonitoredContainer, CosmosLeaseStore), WorkerError> {
    let monitored_name = format!("{}/{}", settings.database, settings.container);
    let lease_name = format!("{}/{}", settings.lease_database, settings.lease_container);
    let monitored = account
        .monitored(&settings.database, &settings.container)
        .await
        .map_err(|e| {
            classify(e, "opening the monitored container", || {
                WorkerError::MonitoredMissing(monitored_name.clone())
            })
        })?;
    if settings.create_leases {
        lease_account
            .ensure_container(&settings.lease_database, &settings.lease_container, "/id")
            .await
            .map_err(|e| {
                classify(e, "creating the lease container", || {
                    WorkerError::LeasesMissing(lease_name.clone())
                })
            })?;
    }
    let leases = lease_account
        .documents(&settings.lease_database, &settings.lease_container)
        .await
        .map_err(|e| {
            classify(e, "opening the lease container", || {
                WorkerError::LeasesMissing(lease_name.clone())
            })
        })?;
    let prefix = lease_prefix(
        &settings.options.processor_name,
        account.host(),
        monitored.database_rid(),
        monitored.rid(),
    );
    let store = CosmosLeaseStore::new(leases, prefix).map_err(|e| match e {
        LeaseStoreError::Misconfigured(message) => {
            WorkerError::LeaseContainer(format!("lease container {lease_name}: {message}"))
        }
        other => WorkerError::LeaseContainer(other.to_string()),
    })?;
    Ok((monitored, store))
}

/// Opens the containers and builds a processor delivering to `handler`.
pub async fn build_processor(
    account: &CosmosAccount,
    lease_account: &CosmosAccount,
    settings: &WorkerSettings,
    handler: Arc<dyn ChangeHandler>,
) -> Result<ChangeFeedProcessor, WorkerError> {
    settings.options.validate().map_err(WorkerError::Options)?;
    let (monitored, store) = open(account, lease_account, settings).await?;
    Ok(ChangeFeedProcessor::new(
        monitored,
        Arc::new(store),
        handler,
        settings.options.clone(),
    ))
}
