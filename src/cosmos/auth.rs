//! How a client proves who it is to a Cosmos DB account: an account key, or a Microsoft Entra ID
//! token (accounts with key auth disabled accept only tokens).

use std::sync::Arc;

use azure_core::credentials::{Secret, TokenCredential};
use azure_data_cosmos::{AccountEndpoint, AccountReference};
use azure_identity::{
    ManagedIdentityCredential, ManagedIdentityCredentialOptions, UserAssignedId, WorkloadIdentityCredential,
};

use super::error::{CosmosError, ErrorKind};

/// How a connection authenticates (`--auth key | workload-identity | managed-identity`,
/// `connection.auth: Key | WorkloadIdentity` in a ChangeFeedProcessor).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
pub enum AuthMethod {
    /// The account key (from a Secret in a ChangeFeedProcessor).
    #[default]
    Key,
    /// Microsoft Entra ID through Kubernetes workload identity (for accounts with key auth
    /// disabled).
    WorkloadIdentity,
    /// Microsoft Entra ID through the host's managed identity (user-assigned when
    /// `AZURE_CLIENT_ID` is set); not offered by a ChangeFeedProcessor, whose pods use workload
    /// identity.
    #[schemars(skip)]
    ManagedIdentity,
}

impl AuthMethod {
    /// The credential of this method, with `key` used only by [`AuthMethod::Key`].
    pub fn with_key(self, key: &str) -> AccountAuth {
        match self {
            AuthMethod::Key => AccountAuth::Key(key.to_owned()),
            AuthMethod::WorkloadIdentity => AccountAuth::WorkloadIdentity,
            AuthMethod::ManagedIdentity => AccountAuth::ManagedIdentity,
        }
    }
}

/// The credential of an account connection. The key never appears in `Debug` output or logs.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum AccountAuth {
    /// A primary or secondary account key (request signatures).
    Key(String),
    /// Microsoft Entra ID through Kubernetes workload identity: the service account token in
    /// `AZURE_FEDERATED_TOKEN_FILE` is exchanged for a token of the app `AZURE_CLIENT_ID` in the
    /// tenant `AZURE_TENANT_ID` (the variables the AKS workload identity webhook injects).
    WorkloadIdentity,
    /// Microsoft Entra ID through the host's managed identity: the user-assigned identity whose
    /// client id `AZURE_CLIENT_ID` names, else the system-assigned one.
    ManagedIdentity,
}

impl std::fmt::Debug for AccountAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.mode())
    }
}

impl AccountAuth {
    /// The emulators' well-known key.
    pub fn emulator_key() -> Self {
        AccountAuth::Key(super::EMULATOR_KEY.to_owned())
    }

    /// The mode's name as `--auth` spells it.
    pub fn mode(&self) -> &'static str {
        match self {
            AccountAuth::Key(_) => "key",
            AccountAuth::WorkloadIdentity => "workload-identity",
            AccountAuth::ManagedIdentity => "managed-identity",
        }
    }

    /// The SDK's account reference for `endpoint` with this credential. Fails when an Entra ID
    /// credential cannot be built from the environment (for example no `AZURE_TENANT_ID`).
    pub(crate) fn reference(&self, endpoint: AccountEndpoint) -> Result<AccountReference, CosmosError> {
        let credential: Arc<dyn TokenCredential> = match self {
            AccountAuth::Key(key) => {
                return Ok(AccountReference::with_authentication_key(
                    endpoint,
                    Secret::new(key.clone()),
                ));
            }
            AccountAuth::WorkloadIdentity => WorkloadIdentityCredential::new(None).map_err(|e| self.unusable(e))?,
            AccountAuth::ManagedIdentity => {
                let user_assigned_id = std::env::var("AZURE_CLIENT_ID")
                    .ok()
                    .filter(|id| !id.is_empty())
                    .map(UserAssignedId::ClientId);
                let options = ManagedIdentityCredentialOptions {
                    user_assigned_id,
                    ..Default::default()
                };
                ManagedIdentityCredential::new(Some(options)).map_err(|e| self.unusable(e))?
            }
        };
        Ok(AccountReference::with_credential(endpoint, credential))
    }

    fn unusable(&self, error: azure_core::Error) -> CosmosError {
        CosmosError::local(
            ErrorKind::Unauthorized,
            format!("{} authentication is not usable in this process: {error}", self.mode()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_the_key() {
        let auth = AccountAuth::Key("c2VjcmV0LWtleQ==".into());
        assert_eq!(format!("{auth:?}"), "key");
        assert_eq!(format!("{:?}", AccountAuth::WorkloadIdentity), "workload-identity");
    }
}
