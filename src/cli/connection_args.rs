//! How a command reaches its account and its lease container (`ConnectionArgs`, `LeaseArgs`).

use clap::Args;

/// How the account is reached.
#[derive(Debug, Args, Clone)]
pub struct ConnectionArgs {
    /// Account endpoint, for example `https://myaccount.documents.azure.com:443/`.
    #[arg(long, env = "CFP_ENDPOINT", default_value = "http://127.0.0.1:8081/")]
    pub endpoint: String,
    /// Account key (defaults to the emulator's well-known key).
    #[arg(long, env = "CFP_KEY", hide_env_values = true, default_value = crate::cosmos::EMULATOR_KEY, hide_default_value = true)]
    pub key: String,
    /// How to authenticate: the account key (--key), or a Microsoft Entra ID token from the
    /// pod's workload identity (`AZURE_CLIENT_ID`, `AZURE_TENANT_ID`, `AZURE_FEDERATED_TOKEN_FILE`)
    /// or the host's managed identity (user-assigned when `AZURE_CLIENT_ID` is set).
    #[arg(long, env = "CFP_AUTH", value_enum, default_value_t)]
    pub auth: crate::cosmos::AuthMethod,
    /// Regions to read from, in order, comma-separated (`West Europe,North Europe`: the SDK's
    /// preferred regions; writes go to the write region). Default: the account's own order.
    #[arg(long, env = "CFP_PREFERRED_REGIONS", value_delimiter = ',')]
    pub preferred_regions: Vec<String>,
    /// Database of the monitored container.
    #[arg(long, env = "CFP_DATABASE")]
    pub database: String,
    /// The monitored container.
    #[arg(long, env = "CFP_CONTAINER")]
    pub container: String,
}

/// Where a processor keeps its leases.
#[derive(Debug, Args, Clone)]
pub struct LeaseArgs {
    /// Database of the lease container (default: --database).
    #[arg(long, env = "CFP_LEASE_DATABASE")]
    pub lease_database: Option<String>,
    /// The lease container.
    #[arg(long, env = "CFP_LEASE_CONTAINER", default_value = "leases")]
    pub lease_container: String,
    /// Endpoint of a separate account for the lease container (default: --endpoint).
    #[arg(long, env = "CFP_LEASE_ENDPOINT")]
    pub lease_endpoint: Option<String>,
    /// Key of the lease account (default: --key).
    #[arg(long, env = "CFP_LEASE_KEY", hide_env_values = true)]
    pub lease_key: Option<String>,
    /// How to authenticate to the lease account (default: --auth).
    #[arg(long, env = "CFP_LEASE_AUTH", value_enum)]
    pub lease_auth: Option<crate::cosmos::AuthMethod>,
    /// Processor (deployment unit) name; lease ids are prefixed with it.
    #[arg(long, env = "CFP_PROCESSOR", default_value = "changefeed")]
    pub processor: String,
}

impl LeaseArgs {
    /// The account holding the lease container: the separate lease account when given, else `monitored`.
    pub async fn account(
        &self,
        connection: &ConnectionArgs,
        monitored: &crate::cosmos::CosmosAccount,
    ) -> Result<crate::cosmos::CosmosAccount, crate::cosmos::CosmosError> {
        match &self.lease_endpoint {
            Some(endpoint) => {
                let mode = self.lease_auth.unwrap_or(connection.auth);
                let auth = mode.with_key(self.lease_key.as_deref().unwrap_or(&connection.key));
                crate::cosmos::CosmosAccount::connect_preferring(endpoint, &auth, &connection.preferred_regions).await
            }
            None => Ok(monitored.clone()),
        }
    }
}

impl ConnectionArgs {
    /// The credential of the monitored account.
    pub fn account_auth(&self) -> crate::cosmos::AccountAuth {
        self.auth.with_key(&self.key)
    }

    /// Worker settings for these containers, with `options` and whether to create the leases.
    pub fn settings(
        &self,
        leases: &LeaseArgs,
        create_leases: bool,
        options: crate::processor::ProcessorOptions,
    ) -> crate::worker::WorkerSettings {
        crate::worker::WorkerSettings {
            database: self.database.clone(),
            container: self.container.clone(),
            lease_database: leases.lease_database.clone().unwrap_or_else(|| self.database.clone()),
            lease_container: leases.lease_container.clone(),
            create_leases,
            options,
        }
    }
}
