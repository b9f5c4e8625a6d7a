//! The `ChangeFeedProcessor` custom resource (group `changefeed.io`, version `v1alpha1`).
//! Field doc comments become the schema descriptions that `kubectl explain` prints.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, EnvFromSource, EnvVar, LocalObjectReference, ResourceRequirements, Toleration,
    TopologySpreadConstraint, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::cosmos::AuthMethod;
use crate::processor::options::defaults;
use crate::processor::{HttpFormat, OnExhausted};

/// Go-style durations the worker accepts (`500ms`, `2s`, `1m`, `1h`).
const DURATION_RULE: &str = "self.matches('^([0-9]+(ms|s|m|h))+$')";
const DURATION_MESSAGE: &str = "must be a duration such as 500ms, 2s, 1m30s or 1h";

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
    /// The container whose changes are processed. Immutable: create a new resource for another
    /// container.
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("monitored is immutable: create a new resource for another container"))]
    pub monitored: ContainerRef,
    /// Where the lease documents are kept.
    #[serde(default)]
    pub leases: LeaseSettings,
    /// The processor (deployment unit) name that prefixes lease ids. Defaults to the resource
    /// name. Changing it starts over with new leases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
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
}

fn default_start_from() -> String {
    "Beginning".into()
}
fn default_poll_interval() -> String {
    defaults::text(defaults::POLL_INTERVAL)
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

/// A key of a Secret in the resource's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The key within the Secret.
    #[serde(default = "default_secret_key")]
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

/// The processor whose checkpoints are adopted.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdoptFrom {
    /// Its lease layout: `Dotnet` (.NET v3 or v2), `JavaPk` (Java v4 partition-key-range
    /// leases) or `JavaEpk` (Java v4 EPK leases).
    pub layout: ForeignLayoutKind,
    /// The id prefix of its lease documents (the lease prefix or processor name it ran with).
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
            adopt_from: None,
            delete_on_resource_deletion: false,
            cleanup_timeout: default_cleanup_timeout(),
        }
    }
}

/// Where batches go, and what happens when the handler fails one.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("self.type != 'Http' || has(self.http)").message("handler.http (with a url) is required when handler.type is Http"))]
pub struct HandlerSpec {
    /// The handler type. `Stdout`: each changed document as one JSON line on the worker's standard
    /// output. `Http`: every batch is POSTed to `handler.http.url` (for example a sidecar in
    /// `worker.sidecars`); 2xx means handled.
    #[serde(default, rename = "type")]
    pub kind: HandlerKind,
    /// The HTTP handler (with `type: Http`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpHandlerSpec>,
    /// Retries of a batch the handler fails.
    #[serde(default)]
    pub retry: RetrySpec,
    /// What happens to a batch still failing after `retry.maxAttempts`: `Halt` keeps retrying at
    /// `retry.maxBackoff` and reports the lease (condition `Degraded`, reason `HandlerFailing`),
    /// skipping nothing; `DeadLetter` moves the failing documents to `deadLetter` and goes on.
    #[serde(default)]
    pub on_exhausted: OnExhausted,
}

/// Handler types.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HandlerKind {
    /// One JSON line per changed document on standard output.
    #[default]
    Stdout,
    /// POST every batch to an HTTP endpoint.
    Http,
}

/// The HTTP handler.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpHandlerSpec {
    /// Where batches are POSTed, for example `http://localhost:8080/changes` (a sidecar) or a
    /// Service URL.
    #[x_kube(validation = kube::core::Rule::new("self.matches('^https?://[^/:]+(:[0-9]+)?(/.*)?$')").message("handler.http.url must be an http:// or https:// URL such as http://localhost:8080/changes"))]
    #[schemars(length(max = 2048))]
    pub url: String,
    /// The body: `Json` (`{"processor", "lease", "feedRange", "batch", "documents"}`) or
    /// `CloudEvents` (a CloudEvents 1.0 JSON batch, one event per document).
    #[serde(default)]
    pub format: HttpFormat,
    /// A request taking longer fails (and is retried).
    #[serde(default = "default_handler_timeout")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub timeout: String,
    /// A path on the handler's host that answers 2xx when it is ready; the worker is not Ready
    /// before (default: when the handler's port accepts connections).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self.startsWith('/')").message("handler.http.readinessPath must start with /"))]
    #[schemars(length(max = 1024))]
    pub readiness_path: Option<String>,
    /// Extra request headers, for example `Authorization` from a Secret. Values are never logged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub headers: Vec<HttpHeader>,
}

fn default_handler_timeout() -> String {
    defaults::text(defaults::HANDLER_TIMEOUT)
}

/// One request header: a literal value or a Secret key.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("has(self.value) != has(self.valueFrom)").message("a header needs exactly one of value and valueFrom"))]
pub struct HttpHeader {
    /// The header name, for example `Authorization` (letters, digits and `-`).
    #[schemars(length(min = 1, max = 256), pattern(r"^[A-Za-z0-9-]+$"))]
    pub name: String,
    /// A literal value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The value from a Secret key in the resource's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<HeaderValueSource>,
}

/// Where a header value comes from.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeaderValueSource {
    /// A key of a Secret in the resource's namespace.
    pub secret_key_ref: SecretKeyRef,
}

/// Retries of a failing batch: exponential backoff with jitter.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RetrySpec {
    /// Attempts before `onExhausted` applies.
    #[serde(default = "default_max_attempts")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_attempts: i32,
    /// Wait before the first retry; doubles up to `maxBackoff`.
    #[serde(default = "default_initial_backoff")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub initial_backoff: String,
    /// Longest wait between attempts.
    #[serde(default = "default_max_backoff")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub max_backoff: String,
}

impl Default for RetrySpec {
    fn default() -> Self {
        Self {
            max_attempts: default_max_attempts(),
            initial_backoff: default_initial_backoff(),
            max_backoff: default_max_backoff(),
        }
    }
}

fn default_max_attempts() -> i32 {
    defaults::MAX_ATTEMPTS as i32
}
fn default_initial_backoff() -> String {
    defaults::text(defaults::INITIAL_BACKOFF)
}
fn default_max_backoff() -> String {
    defaults::text(defaults::MAX_BACKOFF)
}

/// The dead-letter container (in the lease account).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetterSpec {
    /// Its database (default: the lease database).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
    /// The container, created with partition key `/id` when missing.
    #[schemars(length(min = 1))]
    pub container: String,
}

/// Checkpoint policy: after `everyBatches` handled batches or `interval`, whichever comes first.
/// Fewer lease writes (request units) for more redelivery after a crash; a released lease
/// (shutdown, scale-in, rebalancing) is always checkpointed.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointSpec {
    /// Checkpoint after this many handled batches.
    #[serde(default = "default_every_batches")]
    #[schemars(range(min = 1, max = 100000))]
    pub every_batches: i32,
    /// Checkpoint at the latest this long after the last checkpoint (for example `10s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub interval: Option<String>,
}

fn default_every_batches() -> i32 {
    defaults::CHECKPOINT_EVERY_BATCHES as i32
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

/// Built-in autoscaling from the remaining-work estimate.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("self.minReplicas <= self.maxReplicas").message("autoscaling.minReplicas must not be greater than autoscaling.maxReplicas"))]
pub struct Autoscaling {
    /// Turns built-in autoscaling on: the operator sets the worker count from the estimate and
    /// `spec.replicas` is ignored, unless a HorizontalPodAutoscaler (KEDA creates one) targets
    /// this resource: then the external autoscaler rules through `/scale` and the condition
    /// `Scaling` says `ExternalAutoscaler`.
    #[serde(default)]
    pub enabled: bool,
    /// Fewest worker pods; 0 scales to zero when there is no lag for the whole stabilization
    /// window (the estimator keeps watching and wakes the workers on the first change).
    #[serde(default = "default_min_replicas")]
    #[schemars(range(min = 0))]
    pub min_replicas: i32,
    /// Most worker pods (never more than there are leases: more would sit idle).
    #[serde(default = "default_max_replicas")]
    #[schemars(range(min = 1))]
    pub max_replicas: i32,
    /// Remaining operations one worker is expected to keep up with.
    #[serde(default = "default_target_lag")]
    #[schemars(range(min = 1))]
    pub target_lag_per_replica: i64,
    /// Scale down only to the highest recommendation seen in this window (scaling up is immediate).
    #[serde(default = "default_stabilization")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub scale_down_stabilization: String,
    /// With `minReplicas: 0`: wake the workers from zero only when the estimated lag is above
    /// this (as KEDA's activation threshold), so a trickle of changes can wait for a batch.
    /// Running workers are not affected.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub activation_lag: i64,
    /// Worker pods to run while the estimate keeps failing (as KEDA's `fallback`): after
    /// `fallbackAfterFailures` failed estimates in a row at least this many run, until an
    /// estimate works again; then the estimate decides. Without it a failing estimate holds the
    /// current replicas — with `minReplicas: 0` possibly none, while `Ready` says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub fallback_replicas: Option<i32>,
    /// Failed estimates in a row before `fallbackReplicas` run.
    #[serde(default = "default_fallback_after_failures")]
    #[schemars(range(min = 1, max = 100))]
    pub fallback_after_failures: u32,
    /// How often the operator estimates the remaining work (also while autoscaling is off, for
    /// the status and metrics).
    #[serde(default = "default_estimate_interval")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub estimate_interval: String,
    /// How fast the workers scale up and down, with the HorizontalPodAutoscaler's `behavior`
    /// fields (defaults: up by 100 % or 4 pods per 15 s, whichever is more; down to the highest
    /// recommendation of `scaleDownStabilization`, any amount at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behavior: Option<ScalingBehavior>,
}

/// How fast the workers scale, per direction (the HorizontalPodAutoscaler's `behavior`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ScalingBehavior {
    /// Scaling up (default: 100 % or 4 pods per 15 s, whichever is more; no stabilization).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_up: Option<ScalingRules>,
    /// Scaling down (default: any amount per 15 s, after `scaleDownStabilization`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down: Option<ScalingRules>,
}

/// The rules of one scaling direction.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ScalingRules {
    /// Recommendations of this many seconds count: scale up only to their lowest, down only to
    /// their highest (default: 0 for up; `autoscaling.scaleDownStabilization` for down).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub stabilization_window_seconds: Option<i32>,
    /// Which policy applies: `Max` (default, the one allowing the most change), `Min` (the
    /// least) or `Disabled` (no scaling in this direction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select_policy: Option<SelectPolicyKind>,
    /// Rate policies (default: this direction's default).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<ScalingPolicy>,
}

/// Which scaling policy applies.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelectPolicyKind {
    /// The policy allowing the most change.
    Max,
    /// The policy allowing the least change.
    Min,
    /// No scaling in this direction.
    Disabled,
}

/// At most `value` pods or percent of change per `periodSeconds`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScalingPolicy {
    /// `Pods` or `Percent` (of the replicas at the start of the period).
    #[serde(rename = "type")]
    pub kind: ScalingPolicyKind,
    /// How many pods, or what percent.
    #[schemars(range(min = 1))]
    pub value: i32,
    /// The period the change is counted over, in seconds.
    #[schemars(range(min = 1, max = 1800))]
    pub period_seconds: i32,
}

/// What a scaling policy counts.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScalingPolicyKind {
    /// Pods.
    Pods,
    /// Percent of the replicas at the start of the period.
    Percent,
}

impl Default for Autoscaling {
    fn default() -> Self {
        Self {
            enabled: false,
            min_replicas: default_min_replicas(),
            max_replicas: default_max_replicas(),
            target_lag_per_replica: default_target_lag(),
            scale_down_stabilization: default_stabilization(),
            activation_lag: 0,
            fallback_replicas: None,
            fallback_after_failures: default_fallback_after_failures(),
            estimate_interval: default_estimate_interval(),
            behavior: None,
        }
    }
}

fn default_fallback_after_failures() -> u32 {
    3
}

fn default_estimate_interval() -> String {
    "15s".into()
}

fn default_min_replicas() -> i32 {
    1
}
fn default_max_replicas() -> i32 {
    10
}
fn default_target_lag() -> i64 {
    1000
}
fn default_stabilization() -> String {
    "300s".into()
}

/// Overrides for the worker pods.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkerTemplate {
    /// The worker image (default: the operator's `--worker-image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The image pull policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// Compute resources of the worker container (default: requests of 100m CPU and 64Mi memory,
    /// so that workers are not BestEffort).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Extra containers in each worker pod, for example the user's handler service. They run as
    /// native sidecars (init containers with `restartPolicy: Always`, Kubernetes 1.29+): started
    /// and ready before the worker, stopped only after it exited, so a batch in flight during a
    /// stop still reaches its handler. Those without a securityContext get the worker's
    /// restricted one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sidecars: Vec<Container>,
    /// Node labels the worker pods must run on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the worker pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Annotations added to the worker pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Labels added to the worker pods (for example `azure.workload.identity/use: "true"`); the
    /// operator's own selector labels win.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Service account of the worker pods, for example one federated for workload identity (its
    /// API token is not mounted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Extra environment variables of the worker container (the operator's `CFP_*` win).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Environment variables of the worker container from ConfigMaps or Secrets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_from: Vec<EnvFromSource>,
    /// Volumes of the worker pods (for the worker's `volumeMounts` and the sidecars').
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// Volume mounts of the worker container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    /// Secrets to pull the worker and sidecar images.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Affinity of the worker pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// How the worker pods spread over zones and nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// Priority class of the worker pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// How long a stopping worker pod may take (default: the HTTP handler's `timeout` plus 30 s
    /// to checkpoint and release its leases; 30 s with the stdout handler): a stop never cuts
    /// off a batch the handler is still working on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub termination_grace_period_seconds: Option<i64>,
    /// Port of the worker's /metrics, /healthz and /readyz.
    #[serde(default = "default_metrics_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub metrics_port: i32,
}

fn default_metrics_port() -> i32 {
    9090
}

impl Default for WorkerTemplate {
    fn default() -> Self {
        Self {
            image: None,
            image_pull_policy: None,
            resources: None,
            sidecars: Vec::new(),
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            annotations: BTreeMap::new(),
            labels: BTreeMap::new(),
            service_account_name: None,
            env: Vec::new(),
            env_from: Vec::new(),
            volumes: Vec::new(),
            volume_mounts: Vec::new(),
            image_pull_secrets: Vec::new(),
            affinity: None,
            topology_spread_constraints: Vec::new(),
            priority_class_name: None,
            termination_grace_period_seconds: None,
            metrics_port: default_metrics_port(),
        }
    }
}

/// The observed state.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ChangeFeedProcessorStatus {
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Worker pods that exist.
    #[serde(default)]
    pub replicas: i32,
    /// Worker pods that are ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// The label selector of the worker pods (for the `/scale` subresource).
    #[serde(default)]
    pub selector: String,
    /// Worker pods the operator asks for: `spec.replicas`, or the autoscaler's decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,
    /// Lease documents (feed ranges) of the processor, from the last estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leases: Option<i32>,
    /// Leases with remaining work, from the last estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leases_with_lag: Option<i32>,
    /// Estimated remaining operations over all leases, from the last estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_lag: Option<i64>,
    /// When the last successful estimate was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_estimate_time: Option<Time>,
    /// When the operator last changed the number of worker pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
    /// Leases per owning instance (worker pod), from the last estimate; only instances that own
    /// a lease, at most 100.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub instances: BTreeMap<String, i32>,
    /// `Ready` (workers running as specified), `ConfigValid` (the configuration can work) and
    /// `Scaling` (what the autoscaler decided and why), with reasons and messages that say what
    /// to do.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
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

/// The fields of `spec.worker` that embed Kubernetes types.
const EMBEDDED_WORKER_FIELDS: [&str; 10] = [
    "resources",
    "sidecars",
    "tolerations",
    "env",
    "envFrom",
    "volumes",
    "volumeMounts",
    "imagePullSecrets",
    "affinity",
    "topologySpreadConstraints",
];

/// The CRD as YAML (what `cfp crd` prints and `crds/` holds). Descriptions inside embedded
/// Kubernetes types (containers, volumes, affinity, ...) are left out — `kubectl explain pod`
/// has them — so the CRD stays well under the 256 KiB that a client-side `kubectl apply` allows.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    let mut crd = serde_json::to_value(ChangeFeedProcessor::crd()).unwrap_or_default();
    if let Some(versions) = crd.pointer_mut("/spec/versions").and_then(|v| v.as_array_mut()) {
        for version in versions {
            let worker = version.pointer_mut("/schema/openAPIV3Schema/properties/spec/properties/worker/properties");
            if let Some(fields) = worker.and_then(|w| w.as_object_mut()) {
                for name in EMBEDDED_WORKER_FIELDS {
                    if let Some(field) = fields.get_mut(name) {
                        strip_nested_descriptions(field);
                    }
                }
            }
        }
    }
    serde_yaml::to_string(&crd).unwrap_or_default()
}

/// Removes the descriptions below `schema` (keeping its own).
fn strip_nested_descriptions(schema: &mut serde_json::Value) {
    fn strip(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                map.remove("description");
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    if let Some(map) = schema.as_object_mut() {
        for (key, value) in map.iter_mut() {
            if key != "description" {
                strip(value);
            }
        }
    }
}
