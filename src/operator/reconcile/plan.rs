//! What to do with the workers' replicas: `spec.replicas`, what an external autoscaler left,
//! the pause annotations, or the autoscaling policy applied to the newest estimate. Pure: the
//! reconciler observes first and passes what it saw in.

use crate::operator::crd::ChangeFeedProcessor;
use crate::operator::scaling::estimate_report::EstimateReport;
use crate::operator::scaling::external::{ExternalAutoscaler, external_plan};
use crate::operator::scaling::freshness::Freshness;
use crate::operator::scaling::pause::{PAUSED_ANNOTATION, PAUSED_REPLICAS_ANNOTATION, Pause};
use crate::operator::scaling::policy::{Decision, Observed, Policy, ScaleHistory, ScalingReason};
use crate::operator::status::ScalingState;

/// The autoscaler's memory of one resource.
#[derive(Default)]
pub struct ScaleState {
    history: ScaleHistory,
    decided_seq: u64,
    decision: Option<Decision>,
    /// When this operator last changed the replicas (the cached status may not show it yet).
    pub(super) last_scale_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// What the reconciler does with the replicas.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ReplicaPlan {
    /// The replicas to apply; `None` while autoscaling waits for its first estimate.
    pub replicas: Option<i32>,
    /// The `Scaling` condition.
    pub scaling: ScalingState,
    /// The Event of a fresh scaling decision.
    pub event: Option<(&'static str, String)>,
}

/// Caps `plan` at the `running` replicas (none when there is no Deployment): while a
/// resource's claim cannot be read, no worker starts that might run another's lease set.
/// `true` when it held replicas back.
pub(super) fn no_new_workers(plan: &mut ReplicaPlan, running: Option<i32>) -> bool {
    let running = running.unwrap_or(0);
    let Some(replicas) = plan.replicas.filter(|r| *r > running) else {
        return false;
    };
    plan.replicas = Some(running);
    plan.scaling.message = format!(
        "{}; held at {running} of {replicas} replicas until the lease-set claim can be read",
        plan.scaling.message
    );
    true
}

/// What the built-in autoscaler needs to have observed to plan.
pub(super) struct Autoscaling<'a> {
    /// The policy from the spec.
    pub policy: Policy,
    /// The HorizontalPodAutoscaler on `/scale`, or why they could not be listed.
    pub external: Result<Option<ExternalAutoscaler>, kube::Error>,
    /// The newest estimate.
    pub report: Option<&'a EstimateReport>,
}

fn scaling_state(active: bool, reason: &str, message: String) -> ScalingState {
    ScalingState {
        active,
        reason: reason.into(),
        message,
    }
}

/// The plan of a paused workload: no replicas to apply; the `Scaling` condition says why.
pub(super) fn paused_plan(pause: Pause, current: Option<i32>) -> ReplicaPlan {
    let message = match (pause.replicas, current) {
        (Some(held), _) => format!(
            "paused by the {PAUSED_REPLICAS_ANNOTATION} annotation: held at {held} replica(s), no scaling and no changes applied to the workload until it is removed"
        ),
        (None, Some(current)) => format!(
            "paused by the {PAUSED_ANNOTATION} annotation: the workload stays as it is ({current} replica(s)), no scaling and no changes applied until it is removed"
        ),
        (None, None) => {
            format!("paused by the {PAUSED_ANNOTATION} annotation: no workload is created until it is removed")
        }
    };
    ReplicaPlan {
        replicas: None,
        scaling: scaling_state(false, "Paused", message),
        event: None,
    }
}

/// The plan with built-in autoscaling off: `spec.replicas` sets the workers.
pub(super) fn fixed_plan(cfp: &ChangeFeedProcessor) -> ReplicaPlan {
    let spec_replicas = cfp.spec.replicas;
    ReplicaPlan {
        replicas: Some(spec_replicas),
        scaling: scaling_state(
            false,
            "ScalingDisabled",
            format!(
                "built-in autoscaling is off: spec.replicas ({spec_replicas}) sets the workers (kubectl scale, or an HPA or KEDA through /scale)"
            ),
        ),
        event: None,
    }
}

/// The plan with built-in autoscaling on: what an external autoscaler left in place, else the
/// policy applied to the newest estimate not yet decided on (remembered in `state`).
pub(super) fn autoscaled_plan(
    cfp: &ChangeFeedProcessor,
    seen: Autoscaling<'_>,
    current: Option<i32>,
    state: Option<&mut ScaleState>,
) -> ReplicaPlan {
    if let Some((replicas, reason, message)) = external_plan(seen.external, current, cfp.spec.replicas) {
        return ReplicaPlan {
            replicas,
            scaling: scaling_state(false, reason, message),
            event: None,
        };
    }
    let Some(state) = state else {
        return waiting(current, "the autoscaler state is unavailable");
    };
    let mut event = None;
    if let Some(report) = seen.report.filter(|r| r.seq > state.decided_seq) {
        let decision = state
            .history
            .decide(&seen.policy, current, &observed(report), report.at);
        event = decision.event.clone();
        state.decided_seq = report.seq;
        state.decision = Some(decision);
    }
    match &state.decision {
        Some(decision) => ReplicaPlan {
            replicas: Some(decision.replicas),
            scaling: scaling_state(
                decision.reason == ScalingReason::Active,
                decision.reason.as_str(),
                decision.message.clone(),
            ),
            event,
        },
        None => waiting(current, "waiting for the first estimate of the remaining work"),
    }
}

fn waiting(current: Option<i32>, message: &str) -> ReplicaPlan {
    ReplicaPlan {
        replicas: current,
        scaling: scaling_state(false, "WaitingForEstimate", message.into()),
        event: None,
    }
}

/// What the autoscaling policy sees of an estimate report.
fn observed(report: &EstimateReport) -> Observed {
    match &report.outcome {
        // A partial estimate could hide work: it never scales down, like a failed one.
        Ok(estimate) if estimate.leases_failed > 0 => Observed::Failed(format!(
            "{} of {} leases could not be estimated; first: {}",
            estimate.leases_failed,
            estimate.lease_count,
            estimate.leases.iter().find_map(|l| l.error.clone()).unwrap_or_default()
        )),
        Ok(estimate) => Observed::Estimate {
            total_lag: estimate.total_lag,
            leases: estimate.lease_count,
            freshness: Freshness::from(estimate),
        },
        Err(failure) => Observed::Failed(failure.message.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::crd::ChangeFeedProcessorSpec;
    use crate::operator::scaling::spec_policy::scaling_policy;
    use crate::processor::ProcessorEstimate;

    fn resource(autoscaling: bool) -> ChangeFeedProcessor {
        let spec = serde_json::json!({
            "connection": {"endpoint": "https://a.documents.azure.com/", "keySecretRef": {"name": "cosmos"}},
            "monitored": {"database": "db", "container": "c"},
            "replicas": 2,
            "autoscaling": {"enabled": autoscaling},
        });
        let spec: ChangeFeedProcessorSpec = serde_json::from_value(spec).unwrap();
        ChangeFeedProcessor::new("p", spec)
    }

    fn report(seq: u64) -> EstimateReport {
        EstimateReport {
            seq,
            at: std::time::Instant::now(),
            time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            outcome: Ok(ProcessorEstimate::new("p", vec![])),
        }
    }

    #[test]
    fn an_unreadable_claim_starts_no_worker_and_stops_none() {
        let cases = [
            (None, Some(0)),
            (Some(0), Some(0)),
            (Some(1), Some(1)),
            (Some(2), Some(2)),
            (Some(5), Some(2)),
        ];
        for (running, want) in cases {
            let mut plan = fixed_plan(&resource(false));
            let held = no_new_workers(&mut plan, running);
            assert_eq!(plan.replicas, want, "running {running:?}");
            assert_eq!(held, want < Some(2), "{running:?}");
            assert_eq!(
                plan.scaling.message.contains("until the lease-set claim"),
                want < Some(2),
                "{running:?}"
            );
        }
    }

    #[test]
    fn the_plan_follows_the_spec_the_pause_an_external_autoscaler_or_the_estimate() {
        assert_eq!(fixed_plan(&resource(false)).replicas, Some(2));
        assert_eq!(fixed_plan(&resource(false)).scaling.reason, "ScalingDisabled");
        let paused = paused_plan(Pause { replicas: Some(0) }, Some(3));
        assert_eq!((paused.replicas, paused.scaling.reason.as_str()), (None, "Paused"));
        assert!(paused.scaling.message.contains("held at 0 replica(s)"));

        let cfp = resource(true);
        let first = report(1);
        let hpa = ExternalAutoscaler {
            name: "h".into(),
            acted: true,
            keda: false,
        };
        let plan = |external, report, state: Option<&mut ScaleState>| {
            let policy = scaling_policy(&cfp).expect("autoscaling is on");
            autoscaled_plan(
                &cfp,
                Autoscaling {
                    policy,
                    external,
                    report,
                },
                Some(3),
                state,
            )
        };
        let cases: Vec<(&str, ReplicaPlan, Option<i32>, &str)> = vec![
            (
                "an HPA rules",
                plan(Ok(Some(hpa)), None, None),
                Some(2),
                "ExternalAutoscaler",
            ),
            (
                "HPAs unknown",
                plan(Err(kube::Error::LinesCodecMaxLineLengthExceeded), None, None),
                Some(3),
                "ExternalAutoscalerUnknown",
            ),
            (
                "no memory",
                plan(Ok(None), Some(&first), None),
                Some(3),
                "WaitingForEstimate",
            ),
            (
                "no estimate yet",
                plan(Ok(None), None, Some(&mut ScaleState::default())),
                Some(3),
                "WaitingForEstimate",
            ),
        ];
        for (name, plan, replicas, reason) in cases {
            assert_eq!(
                (plan.replicas, plan.scaling.reason.as_str()),
                (replicas, reason),
                "{name}"
            );
        }
        // A new estimate is decided once; the decision stays until a newer one comes.
        let mut state = ScaleState::default();
        let decided = plan(Ok(None), Some(&first), Some(&mut state));
        assert_ne!(decided.scaling.reason, "WaitingForEstimate");
        assert_eq!(state.decided_seq, 1);
        let again = plan(Ok(None), Some(&first), Some(&mut state));
        assert_eq!((again.replicas, again.event), (decided.replicas, None));
    }
}
