//! The observed state the operator reports.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::Deserialize;
use serde::Serialize;

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
    /// How old the oldest change not handled yet is, in seconds (from its `_ts`: read, or for a
    /// lease a live worker reports, at most the age of the newest change its checkpoint covers);
    /// 0 when nothing is pending, absent while a lagging lease's is unknown. Rounded (to 5 s below a minute, to
    /// the minute below an hour, then to 10 minutes) so that a steady backlog rewrites the
    /// status seldom.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_pending_seconds: Option<i64>,
    /// When the last successful estimate was made; while its figures stay the same, refreshed
    /// every 10 minutes (a new time alone is no reason to write the status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_estimate_time: Option<Time>,
    /// When the operator last changed the number of worker pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
    /// Leases per owning instance (worker pod), from the last estimate; only instances that own
    /// a lease, at most 100.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub instances: BTreeMap<String, i32>,
    /// `Ready` (workers running as specified), `ConfigValid` (the configuration can work),
    /// `Progressing` (the workers' rollout), `Scaling` (what the autoscaler decided and why),
    /// `Degraded` (a lease halting on a failing handler, or stalled), after a rewind or restore
    /// was asked for `Rewound`, and while KEDA scales the resource `KedaReadsLeases` (whether
    /// KEDA's scaler counts every lease) — with reasons and messages that say what to do.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// A rewind or restore of the checkpoints in progress (annotations
    /// `changefeed.io/rewind-to`, `changefeed.io/restore-from`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewind: Option<RewindProgress>,
    /// The last rewind or restore that moved the checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rewind: Option<LastRewind>,
}

/// A rewind or restore in progress: the workers are stopped, then the checkpoints moved.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RewindProgress {
    /// What was asked: `beginning`, `now`, a time, or `configmap/<name>`.
    pub request: String,
    /// `Stopping` (the workers are scaled to 0 and waited for) or `Done` (the checkpoints were
    /// moved, or moving them failed; the annotation is removed next).
    pub phase: String,
    /// When the operator began.
    pub started_at: Time,
    /// Whether the checkpoints were moved (with `Done`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub succeeded: Option<bool>,
    /// What happened (with `Done`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Why nothing was moved (with `Done` and `succeeded: false`), the reason the `Rewound`
    /// condition gets: `ForeignExport` (the export is of another container, or of this one
    /// before it was deleted and created again: the operator never restores it) or
    /// `RewindFailed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The last rewind or restore that moved the checkpoints.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LastRewind {
    /// What was asked: `beginning`, `now`, a time, or `configmap/<name>`.
    pub request: String,
    /// When the checkpoints were moved.
    pub time: Time,
    /// What was moved, in words (leases moved, created, deleted).
    pub message: String,
}
