//! The resource's spec: the kind with its printer columns and the CEL rules across fields, the
//! change feed to read, and the accessors that fill in defaults.

use kube::CustomResource;
use kube::KubeSchema;
use serde::Deserialize;
use serde::Serialize;

use crate::cosmos::AuthMethod;
use crate::processor::options::defaults;

use super::{
    Autoscaling, ChangeFeedProcessorStatus, CheckpointSpec, Connection, ContainerRef, DURATION_MESSAGE, DURATION_RULE,
    DeadLetterSpec, HandlerSpec, LeaseSettings, LeaseTimings, WorkerTemplate,
};

/// Runs Azure Cosmos DB change feed processing as a scaled set of worker pods: the workers divide
/// the monitored container's feed ranges through lease documents and hand every batch of changes
/// to the handler.
// Each `printcolumn(...)` repeats `type_ = ...`; clippy mistakes that for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "changefeed.io",
    version = "v1alpha1",
    kind = "ChangeFeedProcessor",
    plural = "changefeedprocessors",
    singular = "changefeedprocessor",
    shortname = "cfp",
    category = "all",
    category = "changefeed",
    doc = "A ChangeFeedProcessor runs Azure Cosmos DB change feed processing as a scaled set of worker pods: the workers divide the monitored container's feed ranges through lease documents, hand every batch of changes to the handler and checkpoint after it succeeded. The operator estimates the remaining work, autoscales the workers and frees the leases of worker pods that are gone.",
    namespaced,
    status = "ChangeFeedProcessorStatus",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".status.desiredReplicas",
        description = "Worker pods the operator runs (spec.replicas, or the autoscaler's decision)"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Ready worker pods"
    ),
    printcolumn(
        name = "Leases",
        type_ = "integer",
        json_path = ".status.leases",
        description = "Lease documents (feed ranges) of the processor"
    ),
    printcolumn(
        name = "Lag",
        type_ = "integer",
        json_path = ".status.estimatedLag",
        description = "Estimated remaining operations over all leases"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        description = "Why the processor is or is not ready"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.handler) || !has(self.handler.onExhausted) || self.handler.onExhausted != 'DeadLetter' || has(self.deadLetter)").message("handler.onExhausted DeadLetter needs deadLetter.container"))]
#[x_kube(validation = kube::core::Rule::new("!((has(self.connection.auth) && self.connection.auth == 'WorkloadIdentity') || (has(self.leases) && has(self.leases.connection) && has(self.leases.connection.auth) && self.leases.connection.auth == 'WorkloadIdentity')) || (has(self.worker) && has(self.worker.serviceAccountName))").message("auth WorkloadIdentity needs worker.serviceAccountName: the service account whose federated identity may use the account"))]
#[x_kube(validation = kube::core::Rule::new("has(self.processorName) == has(oldSelf.processorName) && (!has(self.processorName) || self.processorName == oldSelf.processorName)").message("processorName is immutable (it prefixes the lease ids): create a new resource to start a processor over"))]
#[x_kube(validation = kube::core::Rule::new("!has(self.mode) || self.mode != 'AllVersionsAndDeletes' || self.startFrom == 'Now'").message("mode AllVersionsAndDeletes starts only from now: set startFrom: Now"))]
#[x_kube(validation = kube::core::Rule::new("(has(self.leases) && has(self.leases.database) ? self.leases.database : self.monitored.database) == (has(oldSelf.leases) && has(oldSelf.leases.database) ? oldSelf.leases.database : oldSelf.monitored.database)").message("leases.database is immutable, also when added or removed (the checkpoints live there): create a new resource to move them"))]
#[x_kube(validation = kube::core::Rule::new("(has(self.leases) && has(self.leases.container) ? self.leases.container : 'leases') == (has(oldSelf.leases) && has(oldSelf.leases.container) ? oldSelf.leases.container : 'leases')").message("leases.container is immutable, also when added or removed (the checkpoints live there): create a new resource to move them"))]
#[x_kube(validation = kube::core::Rule::new("(has(self.leases) && has(self.leases.connection) ? self.leases.connection.endpoint : self.connection.endpoint) == (has(oldSelf.leases) && has(oldSelf.leases.connection) ? oldSelf.leases.connection.endpoint : oldSelf.connection.endpoint)").message("the lease account is immutable: adding, removing or changing leases.connection (or connection.endpoint without it) moves the checkpoints to another account; create a new resource instead"))]
pub struct ChangeFeedProcessorSpec {
    /// How to reach the Cosmos DB account of the monitored container.
    pub connection: Connection,
    /// Regions the workers and the operator's estimate read from, in order (the SDK's preferred
    /// regions, for example `["West Europe", "North Europe"]`), for the monitored and the lease
    /// account alike; writes go to each account's write region. Default: the account's own order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 64)))]
    pub preferred_regions: Vec<String>,
    /// The container whose changes are processed. Immutable: create a new resource for another
    /// container.
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("monitored is immutable: create a new resource for another container"))]
    pub monitored: ContainerRef,
    /// Where the lease documents are kept.
    #[serde(default)]
    pub leases: LeaseSettings,
    /// The processor (deployment unit) name that prefixes lease ids. Defaults to the resource
    /// name. Changing it starts over with new leases.
    /// Letters, digits, `-` and `_`, with single dots between them (lease ids are
    /// `{processorName}{account}_{database}_{container}..{range}`: no name may reach into
    /// another's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = kube::core::Rule::new("self.matches('^[A-Za-z0-9_-]+([.][A-Za-z0-9_-]+)*$')").message("processorName must be letters, digits, '-' and '_' with single dots between them (it prefixes lease ids)"))]
    pub processor_name: Option<String>,
    /// Where leases without a checkpoint start reading: `Beginning`, `Now` (anchored when the
    /// leases are first created), or an RFC 3339 time such as `2026-01-31T12:00:00Z`.
    #[serde(default = "default_start_from")]
    #[x_kube(validation = kube::core::Rule::new(
        "self == 'Beginning' || self == 'Now' || self.matches('^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\\\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$')"
    ).message("startFrom must be Beginning, Now, or an RFC 3339 time such as 2026-01-31T12:00:00Z"))]
    #[schemars(length(max = 64))]
    pub start_from: String,
    /// Which changes the workers receive: `LatestVersion` (creates and replaces, the latest image
    /// of each document) or `AllVersionsAndDeletes` (every version and deletes, each with its
    /// operation type, LSN, time and previous image; needs `startFrom: Now` and a container with
    /// a change feed retention policy). Recorded in the leases; immutable.
    #[serde(default)]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("mode is immutable: the leases record it; create a new resource (processor name) to change it"))]
    pub mode: FeedModeKind,
    /// Where batches of changes go, and what happens when the handler fails one.
    #[serde(default)]
    pub handler: HandlerSpec,
    /// Where documents go that the handler keeps failing (with `handler.onExhausted: DeadLetter`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DeadLetterSpec>,
    /// Lease timings of the workers.
    #[serde(default)]
    pub lease_timings: LeaseTimings,
    /// Wait after a read that returned no changes (for example `5s`).
    #[serde(default = "default_poll_interval")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub poll_interval: String,
    /// A lease whose position has not advanced for this long while it may have lag (a read or a
    /// handler call that never returns) is stalled: the worker restarts its reader from the
    /// checkpoint, then releases the lease if it stays stalled, and the status reports
    /// `Degraded=True`, reason `LeaseStalled` (for example `5m`; `0s` turns detection off).
    #[serde(default = "default_stall_timeout")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub stall_timeout: String,
    /// Maximum documents per batch.
    #[serde(default = "default_max_items")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_items: i32,
    /// Batches of one lease with the handler at once (default 1). With more, a slow batch does
    /// not stall its lease: the next ones are read and handled meanwhile (no order across those
    /// batches), and the checkpoint only moves past batches that all finished, so a crash
    /// redelivers the unfinished ones and skips nothing. Memory grows with it (`maxItems` each).
    #[serde(default = "default_max_in_flight_batches")]
    #[schemars(range(min = 1, max = 64))]
    pub max_in_flight_batches: u32,
    /// How often handled batches are checkpointed (default: after every batch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSpec>,
    /// What the workers' change feed reads may spend of the monitored container's throughput
    /// (default: not paced; reads always go at low priority).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_budget: Option<super::ReadBudgetSpec>,
    /// Number of worker pods when autoscaling is off (also set through the `/scale` subresource,
    /// so `kubectl scale`, HPA or KEDA can drive it).
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,
    /// Built-in autoscaling from the remaining-work estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,
    /// Overrides for the worker pods.
    #[serde(default)]
    pub worker: WorkerTemplate,
    /// What the workers report beyond their metrics (OpenTelemetry traces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observability: Option<super::Observability>,
}

fn default_start_from() -> String {
    "Beginning".into()
}
fn default_poll_interval() -> String {
    defaults::text(defaults::POLL_INTERVAL)
}
fn default_stall_timeout() -> String {
    defaults::text(defaults::STALL_TIMEOUT)
}
fn default_max_items() -> i32 {
    defaults::MAX_ITEMS as i32
}
fn default_max_in_flight_batches() -> u32 {
    defaults::MAX_IN_FLIGHT_BATCHES
}
fn default_replicas() -> i32 {
    1
}

/// Which changes the change feed returns.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FeedModeKind {
    /// Creates and replaces, the latest image of each document.
    #[default]
    LatestVersion,
    /// Every version and deletes, with the previous image and metadata.
    AllVersionsAndDeletes,
}

impl FeedModeKind {
    /// The processor's mode.
    pub fn mode(self) -> crate::cosmos::FeedMode {
        match self {
            FeedModeKind::LatestVersion => crate::cosmos::FeedMode::LatestVersion,
            FeedModeKind::AllVersionsAndDeletes => crate::cosmos::FeedMode::AllVersionsAndDeletes,
        }
    }
}

impl ChangeFeedProcessorSpec {
    /// The lease database: `leases.database` or the monitored database.
    pub fn lease_database(&self) -> String {
        self.leases
            .database
            .clone()
            .unwrap_or_else(|| self.monitored.database.clone())
    }

    /// The autoscaling settings (defaults when the resource has none).
    pub fn autoscaling(&self) -> Autoscaling {
        self.autoscaling.clone().unwrap_or_default()
    }

    /// The lease container: `leases.container` or `leases`.
    pub fn lease_container(&self) -> String {
        self.leases.container.clone().unwrap_or_else(|| "leases".into())
    }

    /// The connection of the lease container: `leases.connection` or the monitored account's.
    pub fn lease_connection(&self) -> &Connection {
        self.leases.connection.as_ref().unwrap_or(&self.connection)
    }

    /// Whether a missing lease (or dead-letter) container is created: `leases.createIfNotExists`,
    /// by default only with key auth (Microsoft Entra ID identities may not create containers).
    pub fn create_leases(&self) -> bool {
        self.leases
            .create_if_not_exists
            .unwrap_or(self.lease_connection().auth == AuthMethod::Key)
    }
}

impl ChangeFeedProcessor {
    /// The processor name prefixing lease ids: `spec.processorName` or the resource name.
    pub fn processor_name(&self) -> String {
        self.spec
            .processor_name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| self.metadata.name.clone().unwrap_or_default())
    }
}
