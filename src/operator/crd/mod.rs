//! The `ChangeFeedProcessor` custom resource (group `changefeed.io`, version `v1alpha1`).
//! Field doc comments become the schema descriptions that `kubectl explain` prints.
//!
//! By part of the resource: `spec` (the kind, its cross-field rules and the feed),
//! `connection`, `leases`, `handler` (with retries, dead letters, checkpoints),
//! `read_budget`, `autoscaling`, `observability`, `worker` (the pod template), `status`, `schema`
//! (`crd_yaml`), `size_limits` (a limit on every string, list and map) and `reference`
//! (`crd_markdown`: the field reference generated from the schema).

mod autoscaling;
mod connection;
mod handler;
mod leases;
mod observability;
mod read_budget;
mod reference;
mod schema;
mod size_limits;
mod spec;
mod status;
mod worker;

pub use autoscaling::{
    Autoscaling, Estimation, ScalingBehavior, ScalingPolicy, ScalingPolicyKind, ScalingRules, SelectPolicyKind,
};
pub use connection::{Connection, ContainerRef, SecretKeyRef};
pub use handler::{
    CheckpointSpec, DeadLetterSpec, HandlerKind, HandlerSpec, HeaderValueSource, HttpHandlerSpec, HttpHeader, RetrySpec,
};
pub use leases::{AdoptFrom, ForeignLayoutKind, LeaseBalancing, LeaseSettings, LeaseTimings};
pub use observability::{Observability, TracingSpec};
pub use read_budget::ReadBudgetSpec;
pub use reference::{crd_markdown, reference_markdown};
pub use schema::{crd_json, crd_yaml};
pub use spec::{ChangeFeedProcessor, ChangeFeedProcessorSpec, FeedModeKind};
pub use status::{ChangeFeedProcessorStatus, LastRewind, RewindProgress};
pub use worker::{WorkerNetworkPolicy, WorkerTemplate};

/// Go-style durations the worker accepts (`500ms`, `2s`, `1m`, `1h`).
const DURATION_RULE: &str = "self.matches('^([0-9]+(ms|s|m|h))+$')";
const DURATION_MESSAGE: &str = "must be a duration such as 500ms, 2s, 1m30s or 1h";
