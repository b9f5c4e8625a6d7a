//! Where batches go (the HTTP handler with its headers), retries, the dead-letter container and
//! the checkpoint policy.

use kube::KubeSchema;
use serde::Deserialize;
use serde::Serialize;

use crate::processor::HttpFormat;
use crate::processor::OnExhausted;
use crate::processor::options::defaults;

use super::{DURATION_MESSAGE, DURATION_RULE, SecretKeyRef};

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
    #[schemars(length(max = 8192))]
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
    #[schemars(length(max = 256))]
    pub database: Option<String>,
    /// The container, created with partition key `/id` when missing.
    #[schemars(length(min = 1, max = 256))]
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
