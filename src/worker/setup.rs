//! Wiring one processor instance from its settings: open the monitored and lease containers,
//! check they are usable, and build the processor. Used by `cfp worker` and by tests.

use std::sync::Arc;

use crate::cosmos::{CosmosAccount, CosmosError, ErrorKind, MonitoredContainer, ProvisionError};
use crate::processor::{ChangeHandler, CosmosLeaseStore, LeaseStoreError, Processor, ProcessorOptions, lease_prefix};

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
    /// Create the lease container (partition key `/id`) when it is missing (an existing one is
    /// used as it is).
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
    /// The lease container does not exist and may not be created here.
    #[error(
        "the lease container {name} does not exist; create it: {how_to_create} (or let the worker create it: leave out --no-create-leases, or set leases.createIfNotExists: true)"
    )]
    LeasesMissing {
        /// `database/container`.
        name: String,
        /// The Azure CLI commands that create it.
        how_to_create: String,
    },
    /// The lease container does not exist, for a command that only reads a processor's leases
    /// (`cfp estimate`, `cfp checkpoints`): nothing to create, the name may be wrong.
    #[error(
        "the lease container {name} does not exist: no processor keeps its leases there; give the processor's lease container with --lease-database and --lease-container, or create it: {how_to_create}"
    )]
    NoLeaseContainer {
        /// `database/container`.
        name: String,
        /// The Azure CLI commands that create it.
        how_to_create: String,
    },
    /// The lease container does not exist and the account refused to create it.
    #[error(
        "the lease container {name} does not exist and this identity may not create containers ({source}); create it: {how_to_create}"
    )]
    CreationRefused {
        /// `database/container`.
        name: String,
        /// The Azure CLI commands that create it.
        how_to_create: String,
        /// The account's answer.
        source: CosmosError,
    },
    /// The account refused the credential.
    #[error(
        "the account refused the credential ({0}); check --key / CFP_KEY, or with --auth workload-identity the identity's data-plane role"
    )]
    Unauthorized(String),
    /// The credential may not read or write a container.
    #[error(
        "this identity may not use the container {name} ({source}); give it a Cosmos DB data-plane role that reads and writes documents (for example Cosmos DB Built-in Data Contributor)"
    )]
    Forbidden {
        /// `database/container`.
        name: String,
        /// The account's answer.
        source: CosmosError,
    },
    /// The lease container cannot hold leases.
    #[error("{0}")]
    LeaseContainer(String),
    /// The options do not work together (said with the worker's flags).
    #[error("{}", .0.describe(crate::processor::OptionField::flag))]
    Options(crate::processor::OptionsError),
    /// Cosmos failed in another way.
    #[error("{context}: {source}")]
    Cosmos {
        /// What was being done.
        context: String,
        /// The error.
        source: CosmosError,
    },
}

impl WorkerError {
    /// Whether the containers are missing or may not be used as configured: fixed by creating
    /// them or granting rights, not by waiting.
    pub fn is_setup_problem(&self) -> bool {
        !matches!(self, WorkerError::Cosmos { .. })
    }

    /// The error as a command that only reads leases says it: a missing lease container is
    /// not one to create (that advice names the worker's flags and the resource's fields).
    pub fn when_reading(self) -> Self {
        match self {
            WorkerError::LeasesMissing { name, how_to_create } => WorkerError::NoLeaseContainer { name, how_to_create },
            other => other,
        }
    }

    /// A short reason for conditions and Events (`LeaseContainerMissing`, ...).
    pub fn reason(&self) -> &'static str {
        match self {
            WorkerError::MonitoredMissing(_) => "MonitoredContainerMissing",
            WorkerError::LeasesMissing { .. } | WorkerError::NoLeaseContainer { .. } => "LeaseContainerMissing",
            WorkerError::CreationRefused { .. } => "ContainerCreationRefused",
            WorkerError::Unauthorized(_) => "CredentialRefused",
            WorkerError::Forbidden { .. } => "AccessForbidden",
            WorkerError::LeaseContainer(_) | WorkerError::Options(_) => "LeaseContainerInvalid",
            WorkerError::Cosmos { .. } => "CosmosError",
        }
    }
}

fn classify(error: CosmosError, name: &str, context: &str, missing: impl FnOnce() -> WorkerError) -> WorkerError {
    match error.kind {
        ErrorKind::NotFound => missing(),
        ErrorKind::Unauthorized => WorkerError::Unauthorized(error.message),
        ErrorKind::Forbidden => WorkerError::Forbidden {
            name: name.to_owned(),
            source: error,
        },
        _ => WorkerError::Cosmos {
            context: context.to_owned(),
            source: error,
        },
    }
}

/// Opens the monitored container and the processor's lease store; the lease container is read
/// first and created only when it is missing and the settings allow it.
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
            classify(e, &monitored_name, "opening the monitored container", || {
                WorkerError::MonitoredMissing(monitored_name.clone())
            })
        })?;
    let leases = lease_account
        .open_or_create(
            &settings.lease_database,
            &settings.lease_container,
            "/id",
            settings.create_leases,
        )
        .await
        .map_err(|e| match e {
            ProvisionError::Missing { name, how_to_create } => WorkerError::LeasesMissing { name, how_to_create },
            ProvisionError::CreationRefused {
                name,
                how_to_create,
                source,
            } => WorkerError::CreationRefused {
                name,
                how_to_create,
                source,
            },
            // A 404 here: the container went away between reading and opening it.
            ProvisionError::Cosmos(e) => classify(e, &lease_name, "opening the lease container", || {
                WorkerError::LeasesMissing {
                    name: lease_name.clone(),
                    how_to_create: crate::cosmos::create_commands(
                        lease_account.host(),
                        &settings.lease_database,
                        &settings.lease_container,
                        "/id",
                        false,
                    ),
                }
            }),
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
) -> Result<Processor, WorkerError> {
    settings.options.validate().map_err(WorkerError::Options)?;
    let (monitored, store) = open(account, lease_account, settings).await?;
    Ok(Processor::new(
        monitored,
        Arc::new(store),
        handler,
        settings.options.clone(),
    ))
}
