//! The scaling policy a resource asks for (`spec.autoscaling`): the policy with its rate behavior,
//! and how often its remaining work is estimated. Pure.

use std::time::Duration;

use crate::operator::crd::{Autoscaling, ChangeFeedProcessor};
use crate::operator::crd::{ScalingBehavior, ScalingPolicy, ScalingPolicyKind, ScalingRules, SelectPolicyKind};
use crate::operator::scaling::behavior::{Behavior, RateKind, RatePolicy, Rules, Select};
use crate::operator::scaling::freshness::FreshnessTarget;
use crate::operator::scaling::policy::{Fallback, Policy};
use crate::processor::options::defaults;

/// How often the processor's remaining work is estimated (`autoscaling.estimateInterval`).
pub fn estimate_interval(cfp: &ChangeFeedProcessor) -> Duration {
    humantime::parse_duration(&cfp.spec.autoscaling().estimate_interval)
        .ok()
        .filter(|d| !d.is_zero())
        .unwrap_or(DEFAULT_ESTIMATE_INTERVAL)
        .max(MIN_ESTIMATE_INTERVAL)
}

/// The shortest estimate interval: a resource asking for less (`1ms`) gets this, so that one
/// resource cannot keep the operator's estimate slots busy.
pub const MIN_ESTIMATE_INTERVAL: Duration = Duration::from_millis(500);

/// The autoscaling policy when built-in autoscaling is enabled.
pub fn scaling_policy(cfp: &ChangeFeedProcessor) -> Option<Policy> {
    let scaling = cfp.spec.autoscaling.as_ref().filter(|s| s.enabled)?;
    Some(Policy {
        min_replicas: scaling.min_replicas.max(0),
        max_replicas: scaling.max_replicas.max(scaling.min_replicas.max(0)),
        target_lag_per_replica: u64::try_from(scaling.target_lag_per_replica).unwrap_or(1).max(1),
        scale_down_stabilization: scale_down_window(scaling).unwrap_or(DEFAULT_STABILIZATION),
        fallback: scaling.fallback_replicas.map(|replicas| Fallback {
            replicas: replicas.max(1),
            after_failures: scaling.fallback_after_failures.max(1),
        }),
        activation_lag: u64::try_from(scaling.activation_lag).unwrap_or(0),
        behavior: behavior(scaling.behavior.as_ref()),
        freshness: freshness(cfp),
    })
}

/// The scale-down stabilization window a resource sets: `behavior.scaleDown`'s (the HPA field
/// wins) or `scaleDownStabilization`; `None` when it sets neither.
fn scale_down_window(scaling: &Autoscaling) -> Option<Duration> {
    match scaling.behavior.as_ref().and_then(|b| b.scale_down.as_ref()) {
        Some(ScalingRules {
            stabilization_window_seconds: Some(seconds),
            ..
        }) => Some(Duration::from_secs(u64::try_from(*seconds).unwrap_or(0))),
        _ => scaling
            .scale_down_stabilization
            .as_deref()
            .map(|window| humantime::parse_duration(window).unwrap_or(DEFAULT_STABILIZATION)),
    }
}

/// The freshness target of `spec.autoscaling.targetFreshness`, with what `spec.readBudget` can
/// feed when it is set in request units (a percentage of the container's throughput is not
/// known here: then only the workers' own pacing holds the reads).
fn freshness(cfp: &ChangeFeedProcessor) -> Option<FreshnessTarget> {
    let scaling = cfp.spec.autoscaling.as_ref()?;
    let target = humantime::parse_duration(scaling.target_freshness.as_deref()?)
        .ok()
        .filter(|t| !t.is_zero())?;
    let read_budget_units = cfp
        .spec
        .read_budget
        .as_ref()
        .and_then(|budget| budget.request_units)
        .filter(|units| *units > 0)
        .map(f64::from);
    let acquire =
        humantime::parse_duration(&cfp.spec.lease_timings.acquire_interval).unwrap_or(defaults::ACQUIRE_INTERVAL);
    Some(FreshnessTarget {
        scale_down_stabilization: scale_down_window(scaling).unwrap_or(Duration::ZERO),
        ..FreshnessTarget::new(target, acquire, read_budget_units)
    })
}

/// The scaling behavior of `spec.autoscaling.behavior`: each direction's defaults unless given.
fn behavior(spec: Option<&ScalingBehavior>) -> Behavior {
    let defaults = Behavior::default();
    let rules = |given: Option<&ScalingRules>, default: Rules| {
        let Some(given) = given else { return default };
        Rules {
            select: match given.select_policy {
                None | Some(SelectPolicyKind::Max) => Select::Max,
                Some(SelectPolicyKind::Min) => Select::Min,
                Some(SelectPolicyKind::Disabled) => Select::Disabled,
            },
            policies: if given.policies.is_empty() {
                default.policies
            } else {
                given.policies.iter().map(rate_policy).collect()
            },
        }
    };
    let up = spec.and_then(|b| b.scale_up.as_ref());
    let down = spec.and_then(|b| b.scale_down.as_ref());
    let seconds = |s: Option<i32>| Duration::from_secs(u64::try_from(s.unwrap_or(0)).unwrap_or(0));
    Behavior {
        up_window: seconds(up.and_then(|r| r.stabilization_window_seconds)),
        up: rules(up, defaults.up),
        down: rules(down, defaults.down),
    }
}

fn rate_policy(policy: &ScalingPolicy) -> RatePolicy {
    RatePolicy {
        kind: match policy.kind {
            ScalingPolicyKind::Pods => RateKind::Pods,
            ScalingPolicyKind::Percent => RateKind::Percent,
        },
        value: policy.value.max(1),
        period: Duration::from_secs(u64::try_from(policy.period_seconds).unwrap_or(1).max(1)),
    }
}

const DEFAULT_ESTIMATE_INTERVAL: Duration = Duration::from_secs(15);
const DEFAULT_STABILIZATION: Duration = Duration::from_secs(300);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::workload::tests::resource;

    #[test]
    fn policy_and_interval_from_the_spec() {
        let off = resource(serde_json::json!({}));
        assert_eq!(scaling_policy(&off), None);
        assert_eq!(
            estimate_interval(&off),
            Duration::from_secs(15),
            "estimates run while autoscaling is off"
        );
        let on = resource(serde_json::json!({"autoscaling": {
            "enabled": true, "minReplicas": 0, "maxReplicas": 4, "targetLagPerReplica": 500,
            "scaleDownStabilization": "1m", "estimateInterval": "2s"
        }}));
        assert_eq!(
            scaling_policy(&on),
            Some(Policy {
                min_replicas: 0,
                max_replicas: 4,
                target_lag_per_replica: 500,
                scale_down_stabilization: Duration::from_secs(60),
                fallback: None,
                activation_lag: 0,
                freshness: None,
                behavior: Behavior::default(),
            })
        );
        assert_eq!(estimate_interval(&on), Duration::from_secs(2));
        let hostile = resource(serde_json::json!({"autoscaling": {"estimateInterval": "1ms"}}));
        assert_eq!(
            estimate_interval(&hostile),
            MIN_ESTIMATE_INTERVAL,
            "a floor, whatever a resource asks"
        );
        let paced = resource(serde_json::json!({"autoscaling": {"enabled": true, "behavior": {
            "scaleUp": {"stabilizationWindowSeconds": 60, "selectPolicy": "Min",
                        "policies": [{"type": "Pods", "value": 2, "periodSeconds": 30}]},
            "scaleDown": {"stabilizationWindowSeconds": 120, "selectPolicy": "Disabled"},
        }}}));
        let paced = scaling_policy(&paced).unwrap();
        assert_eq!(
            paced.scale_down_stabilization,
            Duration::from_secs(120),
            "the HPA field wins"
        );
        assert_eq!(paced.behavior.up_window, Duration::from_secs(60));
        assert_eq!(paced.behavior.up.select, Select::Min);
        assert_eq!(
            paced.behavior.up.policies,
            vec![RatePolicy {
                kind: RateKind::Pods,
                value: 2,
                period: Duration::from_secs(30)
            }]
        );
        assert_eq!(paced.behavior.down.select, Select::Disabled);
        assert_eq!(
            paced.behavior.down.policies,
            Behavior::default().down.policies,
            "no policies given: the default's"
        );
        let windows = |autoscaling: serde_json::Value| {
            let policy = scaling_policy(&resource(serde_json::json!({ "autoscaling": autoscaling })));
            policy.map(|p| {
                (
                    p.scale_down_stabilization,
                    p.freshness.map(|f| f.scale_down_stabilization),
                )
            })
        };
        let (minute, five) = (Duration::from_secs(60), Duration::from_secs(300));
        for (autoscaling, expected, why) in [
            (
                serde_json::json!({"enabled": true}),
                (five, None),
                "the lag count: 300 s",
            ),
            (
                serde_json::json!({"enabled": true, "targetFreshness": "30s"}),
                (five, Some(Duration::ZERO)),
                "freshness holds scale-in itself; the lag count keeps 300 s until a rate is measured",
            ),
            (
                serde_json::json!({"enabled": true, "targetFreshness": "30s", "scaleDownStabilization": "1m"}),
                (minute, Some(minute)),
                "set: both",
            ),
            (
                serde_json::json!({"enabled": true, "targetFreshness": "30s",
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60}}}),
                (minute, Some(minute)),
                "the HPA field: both",
            ),
        ] {
            assert_eq!(windows(autoscaling), Some(expected), "{why}");
        }
        let fallback = resource(serde_json::json!({"autoscaling": {"enabled": true, "fallbackReplicas": 2}}));
        assert_eq!(
            scaling_policy(&fallback).and_then(|p| p.fallback),
            Some(Fallback {
                replicas: 2,
                after_failures: 3
            })
        );
    }
}
