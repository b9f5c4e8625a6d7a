//! Built-in autoscaling from the remaining-work estimate, with its rate policies.

use kube::KubeSchema;
use serde::Deserialize;
use serde::Serialize;

use super::{DURATION_MESSAGE, DURATION_RULE};

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
    /// window (on freshness without one, once nothing arrived over the write rate's time
    /// constant); the estimator keeps watching and wakes the workers on the first change.
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
    /// Scale on freshness (for example `30s`): as many workers as keep the oldest change not
    /// handled yet younger than this — from the rate one worker handles (measured while the
    /// workers have a backlog), what arrives and what is pending; fewer only once the target
    /// holds with fewer, and never more than `readBudget.requestUnits` can feed (the `Scaling`
    /// condition says `ReadBudgetLimited` then). Until a rate per worker was measured,
    /// `targetLagPerReplica` decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub target_freshness: Option<String>,
    /// Scale down only to the highest recommendation seen in this window (scaling up is
    /// immediate). Default `300s`; with `targetFreshness`, none while the freshness rules decide
    /// (they scale in once what arrives was read over its time constant, for the highest rate
    /// since it was last steady, and only as far as the target holds): set it to hold workers
    /// longer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub scale_down_stabilization: Option<String>,
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
    /// the status and metrics); at least `500ms` (shorter is taken as that).
    #[serde(default = "default_estimate_interval")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE).message(DURATION_MESSAGE))]
    #[schemars(length(max = 32))]
    pub estimate_interval: String,
    /// How the operator estimates the remaining work. `WorkerReports` (the default): the workers
    /// write each lease's lag into the lease at every checkpoint, so while they run an estimate is
    /// one listing of the lease container; the change feed is read only for leases nobody owns,
    /// whose owner the operator has not seen alive within the lease expiration, that are halted or
    /// stalled, whose report is missing or stale, or that are narrower than a partition and not
    /// caught up. `ChangeFeed`: read every lease's change feed each time (as `cfp estimate` and
    /// KEDA's `azure-cosmosdb` scaler do). `Disabled`: no estimate at all (no lag in the status or
    /// metrics, no lease bootstrap by the operator) — for KEDA or an HPA driving `/scale`; not
    /// allowed with `enabled: true`.
    #[serde(default, skip_serializing_if = "Estimation::is_default")]
    pub estimation: Estimation,
    /// How fast the workers scale up and down, with the HorizontalPodAutoscaler's `behavior`
    /// fields (defaults: up by 100 % or 4 pods per 15 s, whichever is more; down to the highest
    /// recommendation of `scaleDownStabilization`, any amount at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behavior: Option<ScalingBehavior>,
}

/// How the operator estimates the remaining work (`autoscaling.estimation`).
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Estimation {
    /// The workers' lag reports, the change feed only where they cannot tell.
    #[default]
    WorkerReports,
    /// Every lease's change feed, each estimate.
    ChangeFeed,
    /// No estimate.
    Disabled,
}

impl Estimation {
    /// Whether this is the default (left out when serialized).
    pub fn is_default(&self) -> bool {
        *self == Estimation::WorkerReports
    }
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
    #[schemars(length(max = 8))]
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
            target_freshness: None,
            scale_down_stabilization: None,
            activation_lag: 0,
            fallback_replicas: None,
            fallback_after_failures: default_fallback_after_failures(),
            estimate_interval: default_estimate_interval(),
            estimation: Estimation::default(),
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
