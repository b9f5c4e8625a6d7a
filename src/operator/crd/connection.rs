//! How to reach an account (endpoint, credential) and which database and container.

use kube::KubeSchema;
use serde::Deserialize;
use serde::Serialize;

use crate::cosmos::AuthMethod;

/// How to reach a Cosmos DB account.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("(has(self.auth) && self.auth == 'WorkloadIdentity') != has(self.keySecretRef)").message("set keySecretRef with auth Key (the default), and leave it out with auth WorkloadIdentity"))]
pub struct Connection {
    /// The account endpoint, for example `https://myaccount.documents.azure.com:443/`.
    #[x_kube(validation = kube::core::Rule::new("self.matches('^https?://[^/]+')").message("endpoint must be an http(s) URL such as https://myaccount.documents.azure.com:443/"))]
    #[schemars(length(max = 2048))]
    pub endpoint: String,
    /// How the workers and the operator authenticate: `Key` (the account key from
    /// `keySecretRef`) or `WorkloadIdentity` (Microsoft Entra ID tokens: worker pods get the
    /// `azure.workload.identity/use` label and run as `worker.serviceAccountName`, whose
    /// federated identity needs a Cosmos DB data-plane role on the account; the operator uses
    /// its own workload identity to estimate and to manage leases).
    #[serde(default)]
    pub auth: AuthMethod,
    /// The Secret key that holds the account key (with `auth: Key`). The key itself never
    /// appears in the resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_secret_ref: Option<SecretKeyRef>,
}

/// A key of a Secret in the resource's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key within the Secret.
    #[serde(default = "default_secret_key")]
    #[schemars(length(max = 253))]
    pub key: String,
}

fn default_secret_key() -> String {
    "key".into()
}

/// A database and container.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRef {
    /// The database id.
    #[schemars(length(min = 1, max = 256))]
    pub database: String,
    /// The container id.
    #[schemars(length(min = 1, max = 256))]
    pub container: String,
}
