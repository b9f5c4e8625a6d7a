//! Building a Cosmos client for an account: a real endpoint with a key, or the in-process emulator.

use azure_core::credentials::Secret;
use azure_data_cosmos::models::{ContainerProperties, SystemProperties};
use azure_data_cosmos::options::Region;
use azure_data_cosmos::{AccountEndpoint, AccountReference, CosmosClient, RoutingStrategy};

use super::auth::AccountAuth;
use super::documents::DocumentContainer;
use super::error::ProvisionError;
use super::error::{CosmosError, ErrorKind};
use super::feed::MonitoredContainer;

/// The well-known key of the Cosmos DB emulators (the in-memory emulator does not check keys).
pub const EMULATOR_KEY: &str =
    "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw==";

/// A connected Cosmos DB account.
#[derive(Clone)]
pub struct CosmosAccount {
    client: CosmosClient,
    host: String,
}

impl std::fmt::Debug for CosmosAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CosmosAccount").field("host", &self.host).finish()
    }
}

/// The SDK captures a stack backtrace for every error when `RUST_BACKTRACE` is set. A processor
/// uses errors as control flow (empty polls, 412/409/404 on leases), so that costs CPU all the time;
/// capture stays off unless asked for with the SDK's own `AZURE_COSMOS_BACKTRACE_*` variables.
fn quiet_sdk_backtraces() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let configured = std::env::vars().any(|(name, _)| name.starts_with("AZURE_COSMOS_BACKTRACE_"));
        if !configured {
            use azure_data_cosmos_driver::error::{BacktraceOptions, set_backtrace_options};
            let mut options = BacktraceOptions::default();
            options.max_captures_per_second = 0;
            options.max_resolutions_per_second = 0;
            set_backtrace_options(options);
        }
    });
}

impl CosmosAccount {
    /// Connects to `endpoint` (for example `https://acct.documents.azure.com:443/` or the
    /// loopback `cfp emulator`) with `auth`, reading from the regions in the account's own order.
    /// Fails on a malformed endpoint or an Entra ID credential the environment does not configure.
    pub async fn connect(endpoint: &str, auth: &AccountAuth) -> Result<Self, CosmosError> {
        Self::connect_preferring(endpoint, auth, &[]).await
    }

    /// [`connect`](Self::connect), reading from `preferred_regions` in that order (the SDK's
    /// preferred regions, for example `["West Europe", "North Europe"]`; writes always go to the
    /// account's write region); empty: the account's own order.
    pub async fn connect_preferring(
        endpoint: &str,
        auth: &AccountAuth,
        preferred_regions: &[String],
    ) -> Result<Self, CosmosError> {
        quiet_sdk_backtraces();
        let parsed: AccountEndpoint = endpoint.parse().map_err(|e| {
            CosmosError::local(ErrorKind::BadRequest, format!("invalid endpoint URL {endpoint:?}: {e}"))
        })?;
        let host = url::Url::parse(endpoint)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .ok_or_else(|| CosmosError::local(ErrorKind::BadRequest, format!("endpoint {endpoint:?} has no host")))?;
        // The SDK does not retry the account metadata read it starts with: a throttled, unavailable
        // or reset first request is tried again a few times here.
        let mut attempt = 0;
        loop {
            let account = auth.reference(parsed.clone())?;
            let regions = preferred_regions.iter().cloned().map(Region::from).collect();
            let built = CosmosClient::builder()
                .build(account, RoutingStrategy::PreferredRegions(regions))
                .await;
            match built {
                Ok(client) => return Ok(Self { client, host }),
                Err(error) => {
                    let error = refused_credential(CosmosError::from(error), auth);
                    if !error.kind.is_retryable() || attempt >= CONNECT_RETRIES {
                        return Err(error);
                    }
                    attempt += 1;
                    tracing::debug!(%error, attempt, "connecting failed; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(200 << attempt)).await;
                }
            }
        }
    }

    /// Connects to an in-process SDK emulator whose single region is served at `gateway`, through
    /// the driver runtime `runtime` (whose transport hands requests to the emulator).
    #[cfg(feature = "emulator")]
    pub async fn in_memory(
        runtime: azure_data_cosmos_driver::CosmosDriverRuntimeBuilder,
        gateway: &str,
    ) -> Result<Self, CosmosError> {
        quiet_sdk_backtraces();
        let endpoint: AccountEndpoint = gateway
            .parse()
            .map_err(|e| CosmosError::local(ErrorKind::BadRequest, format!("invalid gateway URL {gateway:?}: {e}")))?;
        let host = url::Url::parse(gateway)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_default();
        let runtime = azure_data_cosmos::CosmosRuntimeBuilder::from(runtime).build().await?;
        let account = AccountReference::with_authentication_key(endpoint, Secret::new(EMULATOR_KEY.to_owned()));
        let client = CosmosClient::builder()
            .with_runtime(runtime)
            .build(account, RoutingStrategy::ProximityTo(Region::EAST_US))
            .await?;
        Ok(Self { client, host })
    }

    /// The account host name, as the .NET lease-id prefix includes it.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Opens a container whose change feed is read. Fails with `NotFound` when it does not exist.
    pub async fn monitored(&self, database: &str, container: &str) -> Result<MonitoredContainer, CosmosError> {
        let db = self.client.database_client(database);
        let client = db.container_client(container, None).await?;
        let props = client.read(None).await?.into_model()?;
        let db_props = db.read(None).await?.into_model()?;
        let pk_paths = partition_key_paths(&props);
        Ok(MonitoredContainer::new(
            client,
            (self.host().to_owned(), format!("{database}/{container}")),
            rid_of(&db_props.system_properties)?,
            rid_of(&props.system_properties)?,
            pk_paths,
        ))
    }

    /// Opens a container for document reads and writes. Fails with `NotFound` when it does not exist.
    pub async fn documents(&self, database: &str, container: &str) -> Result<DocumentContainer, CosmosError> {
        let client = self
            .client
            .database_client(database)
            .container_client(container, None)
            .await?;
        let props = client.read(None).await?.into_model()?;
        Ok(DocumentContainer::new(client, partition_key_paths(&props)))
    }

    /// Deletes a container and everything in it. Fails with `NotFound` when it does not exist.
    pub async fn delete_container(&self, database: &str, container: &str) -> Result<(), CosmosError> {
        self.client
            .database_client(database)
            .container_client(container, None)
            .await?
            .delete(None)
            .await?;
        Ok(())
    }

    /// Creates the database and container (with the given partition key path) when missing;
    /// reads first, so an existing container is used as it is.
    pub async fn ensure_container(&self, database: &str, container: &str, pk_path: &str) -> Result<(), CosmosError> {
        match self.open_or_create(database, container, pk_path, true).await {
            Ok(_) => Ok(()),
            Err(ProvisionError::Cosmos(error) | ProvisionError::CreationRefused { source: error, .. }) => Err(error),
            Err(missing @ ProvisionError::Missing { .. }) => {
                Err(CosmosError::local(ErrorKind::NotFound, missing.to_string()))
            }
        }
    }

    /// Whether `database` exists.
    pub(super) async fn database_exists(&self, database: &str) -> Result<bool, CosmosError> {
        match self.client.database_client(database).read(None).await {
            Ok(_) => Ok(true),
            Err(error) => match CosmosError::from(error) {
                error if error.kind == ErrorKind::NotFound => Ok(false),
                error => Err(error),
            },
        }
    }

    /// Whether `database/container` exists, from the database's list of containers (not through
    /// the SDK's container cache); `false` also when the database does not exist.
    pub(super) async fn container_exists(&self, database: &str, container: &str) -> Result<bool, CosmosError> {
        use futures::StreamExt as _;
        let listed = self
            .client
            .database_client(database)
            .query_containers("SELECT * FROM root r", None)
            .await;
        let mut containers = match listed {
            Ok(containers) => containers,
            Err(error) => return not_found_is_false(error.into()),
        };
        while let Some(next) = containers.next().await {
            match next {
                Ok(properties) if properties.id == container => return Ok(true),
                Ok(_) => {}
                Err(error) => return not_found_is_false(error.into()),
            }
        }
        Ok(false)
    }

    /// Creates `container` (and `database` when `database_missing`); one created meanwhile by
    /// someone else counts as created.
    pub(super) async fn create_missing(
        &self,
        database: &str,
        database_missing: bool,
        container: &str,
        pk_path: &str,
    ) -> Result<(), CosmosError> {
        if database_missing && let Err(e) = self.client.create_database(database, None).await {
            ignore_conflict(e.into())?;
        }
        let props = ContainerProperties::new(container.to_owned(), pk_path.to_owned().into());
        if let Err(e) = self
            .client
            .database_client(database)
            .create_container(props, None)
            .await
        {
            ignore_conflict(e.into())?;
        }
        Ok(())
    }
}

/// Transient failures of the first account read retried by [`CosmosAccount::connect`].
const CONNECT_RETRIES: u32 = 3;

/// The SDK's sub-status when the credential could not produce a token.
const TOKEN_ACQUISITION_FAILED: u32 = 20402;

/// Says which credential an account refused and what to check (the SDK's 401 names neither).
fn refused_credential(mut error: CosmosError, auth: &AccountAuth) -> CosmosError {
    if error.kind == ErrorKind::Unauthorized {
        let hint = match auth {
            _ if error.sub_status == Some(TOKEN_ACQUISITION_FAILED) => {
                "no Microsoft Entra ID token: check the identity's federation (or managed identity) and AZURE_* settings"
            }
            AccountAuth::Key(_) => {
                "the account refused the key: check it, or use --auth workload-identity if the account accepts only Microsoft Entra ID"
            }
            _ => {
                "the account refused the Microsoft Entra ID token: give the identity a Cosmos DB data-plane role on the account"
            }
        };
        error.message = format!("{hint} ({})", error.message);
    }
    error
}

fn not_found_is_false(error: CosmosError) -> Result<bool, CosmosError> {
    if error.kind == ErrorKind::NotFound {
        Ok(false)
    } else {
        Err(error)
    }
}

fn ignore_conflict(err: CosmosError) -> Result<(), CosmosError> {
    if err.kind == ErrorKind::Conflict {
        Ok(())
    } else {
        Err(err)
    }
}

fn rid_of(props: &SystemProperties) -> Result<String, CosmosError> {
    props
        .resource_id
        .clone()
        .ok_or_else(|| CosmosError::local(ErrorKind::Other, "resource has no _rid"))
}

fn partition_key_paths(props: &ContainerProperties) -> Vec<String> {
    props.partition_key.paths().iter().map(|p| p.to_string()).collect()
}
