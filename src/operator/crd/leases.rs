//! Where the lease documents live, adopting another processor's checkpoints, and the lease
//! timings.

use kube::KubeSchema;
use serde::Deserialize;
use serde::Serialize;

use crate::processor::options::defaults;

use super::{Connection, DURATION_MESSAGE, DURATION_RULE};

/// Where lease documents are kept.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LeaseSettings {
    /// The lease database (default: the monitored database). Immutable, also when added or
    /// removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub database: Option<String>,
    /// The lease container (default `leases`), partition key `/id`; created when missing if
    /// `createIfNotExists` allows it. Immutable, also when added or removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub container: Option<String>,
    /// Create the lease container (and the dead-letter container) with partition key `/id`
    /// when it is missing. Default: `true` with `auth: Key`, `false` with `WorkloadIdentity`,
    /// because Microsoft Entra ID identities may not create databases or containers; set `false`
    /// for keys of accounts with `disableKeyBasedMetadataWriteAccess` too. An existing container
    /// is always used as it is; a missing one that may not be created is reported with the
    /// command that creates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_if_not_exists: Option<bool>,
    /// A separate account for the lease container (default: the monitored account). Its
    /// endpoint is immutable, also when added or removed: the checkpoints live there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<Connection>,
    /// Start from the checkpoints of the .NET or Java change feed processor whose leases are in
    /// the lease container (on first start, when this processor has no leases yet): no
    /// reprocessing, nothing lost between its last checkpoint and the switch. Its documents are
    /// left as they are, so rolling back to it still works.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopt_from: Option<AdoptFrom>,
    /// Leases per physical partition (default 1), each an equal effective-partition-key share of
    /// it: up to this many times the partitions' count of workers share the work, and the
    /// autoscaler's cap becomes the lease count (the .NET/Java processors and KEDA stop at one
    /// worker per partition). A logical partition stays within one lease, so its order is kept.
    /// Immutable: the leases are divided when first created.
    #[serde(default = "default_per_partition")]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("leases.perPartition is immutable: the leases were divided when created; create a new resource (processor name) to change it"))]
    #[schemars(range(min = 1, max = 64))]
    pub per_partition: u32,
    /// How the workers share the leases: `Count` (default) gives each worker an equal number;
    /// `Work` weighs each lease by what its owner reports at its checkpoints (how fast its
    /// partition is written to, and its lag drained within a lease expiration), so that a few hot
    /// leases do not pile onto one worker; handlers that checkpoint themselves report nothing
    /// (balanced by count). Moves go through the usual handoff (nothing delivered twice); every worker of
    /// the processor must run a version that knows `Work`.
    #[serde(default)]
    pub balancing: LeaseBalancing,
    /// Delete this processor's lease documents when the resource is deleted. Off by default, so
    /// that re-creating the resource resumes from the checkpoints.
    #[serde(default)]
    pub delete_on_resource_deletion: bool,
    /// How long deleting the lease documents is retried (the workers are first scaled to zero and
    /// their pods waited for) before the resource goes away anyway, with a Warning Event saying
    /// what was left behind: a namespace deletion never hangs on it.
    #[serde(default = "default_cleanup_timeout")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub cleanup_timeout: String,
}

/// How leases are shared among the workers.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LeaseBalancing {
    /// An equal number of leases each.
    #[default]
    Count,
    /// Leases weighed by the work their owners report.
    Work,
}

impl LeaseBalancing {
    /// The processor's balancing strategy.
    pub fn balancing(self) -> crate::processor::policy::balancer::Balancing {
        match self {
            LeaseBalancing::Count => crate::processor::policy::balancer::Balancing::Fair,
            LeaseBalancing::Work => crate::processor::policy::balancer::Balancing::Work,
        }
    }
}

/// The processor whose checkpoints are adopted.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdoptFrom {
    /// Its lease layout: `Dotnet` (.NET v3 or v2), `JavaPk` (Java v4 partition-key-range
    /// leases) or `JavaEpk` (Java v4 EPK leases).
    pub layout: ForeignLayoutKind,
    /// Its lease prefix (the processor name it ran with for .NET, its lease prefix for Java):
    /// only leases whose ids start with it, this account's host name, the database and the
    /// container (resource ids; names for `JavaPk`) are adopted. A whole id prefix, up to
    /// `_<database>_<container>`, is taken as it is (a processor that used another host name).
    #[schemars(length(min = 1, max = 256))]
    pub prefix: String,
    /// Adopt even while it still renews its leases (by default the workers refuse until its
    /// leases have expired, so that two processors never run at once).
    #[serde(default)]
    pub force: bool,
}

/// A foreign lease layout.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForeignLayoutKind {
    /// .NET v3 (EPK or partition key range leases) and .NET v2.
    Dotnet,
    /// Java v4 "pkversion" leases.
    JavaPk,
    /// Java v4 "epkversion" leases.
    JavaEpk,
}

impl ForeignLayoutKind {
    /// The processor's layout.
    pub fn layout(self) -> crate::processor::ForeignLayout {
        match self {
            ForeignLayoutKind::Dotnet => crate::processor::ForeignLayout::Dotnet,
            ForeignLayoutKind::JavaPk => crate::processor::ForeignLayout::JavaPk,
            ForeignLayoutKind::JavaEpk => crate::processor::ForeignLayout::JavaEpk,
        }
    }
}

fn default_per_partition() -> u32 {
    defaults::LEASES_PER_PARTITION
}

fn default_cleanup_timeout() -> String {
    "5m".into()
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self {
            database: None,
            container: None,
            create_if_not_exists: None,
            connection: None,
            per_partition: default_per_partition(),
            balancing: LeaseBalancing::default(),
            adopt_from: None,
            delete_on_resource_deletion: false,
            cleanup_timeout: default_cleanup_timeout(),
        }
    }
}

/// Lease timings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("duration(self.renewInterval) < duration(self.expiration)").message("leaseTimings.renewInterval must be shorter than leaseTimings.expiration"))]
pub struct LeaseTimings {
    /// How often leases are balanced among the workers (a worker that is alone and owns every
    /// lease lists them less often while nothing changes, up to the expiration).
    #[serde(default = "default_acquire")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub acquire_interval: String,
    /// How often a worker renews its leases.
    #[serde(default = "default_renew")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub renew_interval: String,
    /// A lease not renewed for this long is taken over by other workers.
    #[serde(default = "default_expiration")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub expiration: String,
}

impl Default for LeaseTimings {
    fn default() -> Self {
        Self {
            acquire_interval: default_acquire(),
            renew_interval: default_renew(),
            expiration: default_expiration(),
        }
    }
}

fn default_acquire() -> String {
    defaults::text(defaults::ACQUIRE_INTERVAL)
}
fn default_renew() -> String {
    defaults::text(defaults::RENEW_INTERVAL)
}
fn default_expiration() -> String {
    defaults::text(defaults::EXPIRATION)
}
