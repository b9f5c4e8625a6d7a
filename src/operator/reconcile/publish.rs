//! What a reconciliation reports: the status (conditions, replicas, estimate figures) and the
//! Events, decided from what was observed and what was applied. Pure: the reconciler writes the
//! answer with one status patch and one Event each.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::pace::estimate_time;
use super::plan::ReplicaPlan;
use crate::operator::crd::{ChangeFeedProcessor, ChangeFeedProcessorStatus};
use crate::operator::scaling::estimate_report::EstimateReport;
use crate::operator::scaling::external::keda_verdict;
use crate::operator::scaling::pause::Pause;
use crate::operator::scaling::policy::ScalingReason;
use crate::operator::spec_values::ConfigProblem;
use crate::operator::status::{
    DEGRADED, EstimateProblem, KEDA_READS_LEASES, Observation, PodProblem, READY, Rollout, SCALING, coarse_age,
    conditions, ready_problem_event,
};
use crate::operator::workload::selector_string;

/// What became of the workload this reconciliation.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) enum Apply {
    /// Nothing was applied (a configuration problem, a pause, or waiting for a first estimate).
    #[default]
    Skipped,
    /// The Deployment, Service and PodDisruptionBudget were applied.
    Applied,
    /// The API server refused them, with its message.
    Refused(String),
}

/// What the reconciler observed and applied: everything the report is decided from.
#[derive(Debug, Clone, Default)]
pub(super) struct Outcome {
    /// The configuration problem, if any.
    pub problem: Option<ConfigProblem>,
    /// The pause annotations.
    pub paused: Option<Pause>,
    /// The replica plan; `None` with a configuration problem.
    pub plan: Option<ReplicaPlan>,
    /// The Deployment's replicas before this reconciliation.
    pub before: Option<i32>,
    /// What was applied.
    pub apply: Apply,
    /// Replicas held by the pause annotation: (from, to).
    pub held: Option<(i32, i32)>,
    /// The worker Deployment as it is now.
    pub deployment: Option<Deployment>,
    /// The newest estimate.
    pub estimate: Option<EstimateReport>,
    /// A worker pod that cannot run.
    pub pod_problem: Option<PodProblem>,
    /// When this operator last changed the replicas, as it remembers.
    pub remembered_scale_time: Option<Time>,
    /// The HorizontalPodAutoscaler KEDA made for the resource, if one targets its `/scale`.
    pub keda_hpa: Option<String>,
    /// Whether the HorizontalPodAutoscalers were looked at (not while paused, not when listing
    /// them failed): otherwise whether KEDA scales is unknown.
    pub autoscalers_seen: bool,
}

/// An Event to publish on the resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Note {
    /// A Warning (else Normal).
    pub warning: bool,
    /// The Event's reason.
    pub reason: String,
    /// What happened.
    pub note: String,
}

/// The report of one reconciliation.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Report {
    /// The status to write (when it differs from the resource's).
    pub status: ChangeFeedProcessorStatus,
    /// The Events to publish, in order.
    pub events: Vec<Note>,
    /// The workers asked for (while paused: the ones held), for the metrics.
    pub desired_replicas: Option<i32>,
    /// Whether `Ready` is `True`.
    pub ready: bool,
    /// When to reconcile again.
    pub requeue: Duration,
}

/// An Event: a Warning when `warning`, with `reason` and `note`.
pub(super) fn note(warning: bool, reason: &str, note: String) -> Note {
    Note {
        warning,
        reason: reason.into(),
        note,
    }
}

impl Outcome {
    /// The replicas the plan names.
    pub(super) fn desired(&self) -> Option<i32> {
        self.plan.as_ref().and_then(|p| p.replicas)
    }

    fn applied_replicas(&self) -> Option<i32> {
        self.deployment
            .as_ref()
            .and_then(|d| d.spec.as_ref())
            .and_then(|s| s.replicas)
    }

    /// What the conditions are decided from.
    pub(super) fn observation(&self) -> Observation {
        let mut rollout = rollout_of(self.deployment.as_ref());
        if let Apply::Refused(message) = &self.apply {
            rollout.apply_failure = Some(message.clone());
        }
        rollout.pod_problem = self.pod_problem.clone();
        let status = self.deployment.as_ref().and_then(|d| d.status.as_ref());
        let estimate = self.estimate.as_ref().map(|r| &r.outcome);
        Observation {
            problem: self.problem.clone(),
            deployed: self.deployment.is_some(),
            desired: self.desired().or(self.applied_replicas()).unwrap_or(1),
            ready: status.and_then(|s| s.ready_replicas).unwrap_or(0),
            scaling: self.plan.as_ref().map(|p| p.scaling.clone()),
            rollout,
            estimate_failure: estimate.and_then(|o| o.as_ref().err()).map(|failure| EstimateProblem {
                setup: failure.setup,
                message: failure.message.clone(),
            }),
            failing_leases: estimate.and_then(|o| o.as_ref().ok()).map(|estimate| {
                estimate
                    .leases
                    .iter()
                    .filter_map(|l| Some((l.lease_token.clone(), l.handler_failing.clone()?)))
                    .collect()
            }),
            scaled_by_keda: self.autoscalers_seen.then_some(self.keda_hpa.is_some()),
            keda: self.keda_hpa.as_deref().and_then(|hpa| {
                let reading = estimate?.as_ref().ok()?.keda.as_ref()?;
                Some(keda_verdict(hpa, reading))
            }),
            stalled_leases: estimate.and_then(|o| o.as_ref().ok()).map(|estimate| {
                estimate
                    .leases
                    .iter()
                    .filter_map(|l| Some((l.lease_token.clone(), l.stalled.clone()?)))
                    .collect()
            }),
        }
    }

    /// Whether the worker pods are worth a look (some are desired but not ready).
    pub(super) fn needs_pod_check(&self) -> bool {
        let observation = self.observation();
        observation.deployed && observation.ready < observation.desired
    }
}

/// The status and Events for `outcome`, from the resource's previous status.
pub(super) fn report(cfp: &ChangeFeedProcessor, outcome: &Outcome, now: Time) -> Report {
    let previous = cfp.status.clone().unwrap_or_default();
    let status = status(cfp, outcome, &previous, now);
    let events = events(outcome, &previous.conditions, &status.conditions);
    let desired = outcome.desired();
    Report {
        ready: status.conditions.iter().any(|c| c.type_ == READY && c.status == "True"),
        status,
        events,
        desired_replicas: desired.or_else(|| outcome.paused.and(outcome.applied_replicas())),
        // Workers deployed but not all ready (a rollout, a crash loop, a missing image): their
        // pods are looked at again soon — nothing else wakes this resource when a pod starts
        // crash-looping (its Deployment's status does not change).
        requeue: match (outcome.needs_pod_check(), &outcome.problem) {
            (true, _) => Duration::from_secs(30),
            (false, Some(_)) => Duration::from_secs(60),
            (false, None) => Duration::from_secs(300),
        },
    }
}

fn status(
    cfp: &ChangeFeedProcessor,
    outcome: &Outcome,
    previous: &ChangeFeedProcessorStatus,
    now: Time,
) -> ChangeFeedProcessorStatus {
    let observation = outcome.observation();
    let deployment_status = outcome.deployment.as_ref().and_then(|d| d.status.as_ref());
    let mut status = ChangeFeedProcessorStatus {
        observed_generation: cfp.metadata.generation,
        replicas: deployment_status.and_then(|s| s.replicas).unwrap_or(0),
        ready_replicas: observation.ready,
        selector: selector_string(cfp),
        desired_replicas: outcome.desired().or(outcome.applied_replicas()),
        last_scale_time: outcome
            .remembered_scale_time
            .clone()
            .or_else(|| previous.last_scale_time.clone()),
        conditions: conditions(&observation, &previous.conditions, cfp.metadata.generation, now),
        ..previous.clone()
    };
    if let Some(EstimateReport {
        time,
        outcome: Ok(estimate),
        ..
    }) = &outcome.estimate
    {
        status.leases = Some(i32::try_from(estimate.lease_count).unwrap_or(i32::MAX));
        status.leases_with_lag = Some(i32::try_from(estimate.leases_with_lag).unwrap_or(i32::MAX));
        status.estimated_lag = Some(i64::try_from(estimate.total_lag).unwrap_or(i64::MAX));
        status.oldest_pending_seconds = estimate
            .oldest_pending_seconds
            .map(|age| i64::try_from(coarse_age(age)).unwrap_or(i64::MAX));
        status.instances = instances(estimate);
        // A new estimate of the same figures is no reason for a status write.
        let changed = status != *previous;
        status.last_estimate_time = Some(estimate_time(previous.last_estimate_time.as_ref(), time, changed));
    }
    status
}

/// The Events, in the order a person reads them: what was applied, then the pause, then the
/// problems newly found.
fn events(outcome: &Outcome, previous: &[Condition], current: &[Condition]) -> Vec<Note> {
    let mut events = applied_events(outcome);
    if let Some((from, to)) = outcome.held {
        let text = format!("scaled workers from {from} to {to} (paused at {to} replicas)");
        events.push(note(false, "Scaled", text));
    }
    let scaling = outcome.plan.as_ref().map(|p| &p.scaling);
    let previous_scaling = previous.iter().find(|c| c.type_ == SCALING);
    match (scaling, previous_scaling) {
        (Some(now), before) if now.reason == "Paused" && before.is_none_or(|c| c.reason != "Paused") => {
            events.push(note(false, "Paused", now.message.clone()));
        }
        (Some(now), Some(before)) if now.reason != "Paused" && before.reason == "Paused" => {
            let text = "resumed: the operator scales and applies the workload again".to_owned();
            events.push(note(false, "Resumed", text));
        }
        _ => {}
    }
    let estimate_failed = scaling.filter(|state| {
        state.reason == ScalingReason::EstimateFailed.as_str()
            && previous_scaling.is_none_or(|c| c.reason != state.reason)
    });
    if let Some(state) = estimate_failed {
        events.push(note(true, "EstimateFailed", state.message.clone()));
    }
    if let Some((reason, text)) = ready_problem_event(previous, current)
        && !(reason == "EstimateFailed" && estimate_failed.is_some())
    {
        events.push(note(true, &reason, text));
    }
    // KEDA newly unable to read some leases: a Warning saying what it does then.
    if let Some(keda) = current
        .iter()
        .find(|c| c.type_ == KEDA_READS_LEASES && c.status == "False")
        && !previous
            .iter()
            .any(|c| c.type_ == KEDA_READS_LEASES && c.status == "False" && c.reason == keda.reason)
    {
        events.push(note(true, &keda.reason, keda.message.clone()));
    }
    // A lease newly halted by its handler, or newly stalled: a Warning naming it.
    if let Some(degraded) = current.iter().find(|c| c.type_ == DEGRADED && c.status == "True")
        && !previous
            .iter()
            .any(|c| c.type_ == DEGRADED && c.reason == degraded.reason)
    {
        events.push(note(true, &degraded.reason, degraded.message.clone()));
    }
    events
}

/// The Events of what was applied: the first deployment, a scaling, a refusal or a
/// configuration problem.
fn applied_events(outcome: &Outcome) -> Vec<Note> {
    let mut events = Vec::new();
    match (&outcome.apply, outcome.desired()) {
        (Apply::Applied, Some(desired)) => {
            if outcome.before.is_none() {
                events.push(note(false, "Deployed", format!("deployed {desired} worker pod(s)")));
            }
            match (outcome.before, outcome.plan.as_ref().and_then(|p| p.event.clone())) {
                (_, Some((reason, text))) => events.push(note(false, reason, text)),
                (Some(before), None) if before != desired => {
                    events.push(note(
                        false,
                        "Scaled",
                        format!("scaled workers from {before} to {desired}"),
                    ));
                }
                _ => {}
            }
        }
        (Apply::Refused(message), _) => events.push(note(true, "ApplyFailed", message.clone())),
        _ => {
            if let Some(problem) = &outcome.problem {
                events.push(note(true, problem.reason, problem.message.clone()));
            }
        }
    }
    events
}

/// What the Deployment's status says about the rollout.
pub(super) fn rollout_of(deployment: Option<&Deployment>) -> Rollout {
    let Some(deployment) = deployment else {
        return Rollout::default();
    };
    let status = deployment.status.clone().unwrap_or_default();
    let conditions = status.conditions.unwrap_or_default();
    let find = |kind: &str, value: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == kind && c.status == value)
            .map(|c| {
                c.message
                    .clone()
                    .unwrap_or_else(|| c.reason.clone().unwrap_or_default())
            })
    };
    Rollout {
        observed: status
            .observed_generation
            .is_some_and(|o| Some(o) >= deployment.metadata.generation),
        updated: status.updated_replicas.unwrap_or(0),
        replica_failure: find("ReplicaFailure", "True"),
        stalled: find("Progressing", "False"),
        pod_problem: None,
        apply_failure: None,
    }
}

/// The most instances `status.instances` lists.
const MAX_STATUS_INSTANCES: usize = 100;

/// Leases per owning instance, the owners with the most leases first when there are too many.
fn instances(estimate: &crate::processor::ProcessorEstimate) -> BTreeMap<String, i32> {
    let mut counts: BTreeMap<String, i32> = BTreeMap::new();
    for owner in estimate.leases.iter().filter_map(|l| l.owner.clone()) {
        *counts.entry(owner).or_default() += 1;
    }
    if counts.len() > MAX_STATUS_INSTANCES {
        let mut ranked: Vec<(String, i32)> = counts.into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked.truncate(MAX_STATUS_INSTANCES);
        counts = ranked.into_iter().collect();
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::crd::ChangeFeedProcessorSpec;
    use crate::operator::scaling::estimate_report::EstimateFailure;
    use crate::operator::status::ScalingState;
    use crate::processor::report::keda_reading::KedaReading;
    use crate::processor::{LeaseEstimate, ProcessorEstimate};
    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStatus};

    fn time(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap())
    }

    fn resource(previous: Vec<Condition>) -> ChangeFeedProcessor {
        let spec = serde_json::json!({
            "connection": {"endpoint": "https://a.documents.azure.com/", "keySecretRef": {"name": "cosmos"}},
            "monitored": {"database": "db", "container": "c"},
        });
        let spec: ChangeFeedProcessorSpec = serde_json::from_value(spec).unwrap();
        let mut cfp = ChangeFeedProcessor::new("p", spec);
        cfp.metadata.namespace = Some("ns".into());
        cfp.metadata.generation = Some(1);
        cfp.status = Some(ChangeFeedProcessorStatus {
            conditions: previous,
            ..Default::default()
        });
        cfp
    }

    fn condition(kind: &str, reason: &str) -> Condition {
        Condition {
            type_: kind.into(),
            status: "False".into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: time(0),
        }
    }

    /// A Deployment of `replicas`, all updated and ready.
    fn deployment(replicas: i32) -> Deployment {
        Deployment {
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                ..Default::default()
            }),
            status: Some(DeploymentStatus {
                replicas: Some(replicas),
                ready_replicas: Some(replicas),
                updated_replicas: Some(replicas),
                observed_generation: Some(1),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn plan(replicas: Option<i32>, reason: &str, event: Option<&'static str>) -> Option<ReplicaPlan> {
        Some(ReplicaPlan {
            replicas,
            scaling: ScalingState {
                active: false,
                reason: reason.into(),
                message: format!("{reason} message"),
            },
            event: event.map(|reason| (reason, format!("{reason} note"))),
        })
    }

    fn applied(before: Option<i32>, replicas: i32) -> Outcome {
        Outcome {
            plan: plan(Some(replicas), "ScalingDisabled", None),
            before,
            apply: Apply::Applied,
            deployment: Some(deployment(replicas)),
            ..Outcome::default()
        }
    }

    fn estimate(outcome: Result<ProcessorEstimate, EstimateFailure>) -> Option<EstimateReport> {
        Some(EstimateReport {
            seq: 1,
            at: std::time::Instant::now(),
            time: time(5),
            outcome,
        })
    }

    fn failing_lease() -> ProcessorEstimate {
        let lease = LeaseEstimate {
            lease_token: "0".into(),
            feed_range: crate::cosmos::EpkRange::full(),
            owner: Some("pod-a".into()),
            lag: 7,
            checkpoint_age: None,
            started: true,
            handler_failing: Some("since 10:00: 500".into()),
            stalled: None,
            error: None,
            reads: 1,
            oldest_pending_seconds: None,
            handled_per_second: None,
            read_units_per_document: None,
            partition_writes_per_second: None,
            worker_handled_per_second: None,
        };
        ProcessorEstimate::new("p", vec![lease])
    }

    fn stalled_lease() -> ProcessorEstimate {
        let mut estimate = failing_lease();
        estimate.leases[0].handler_failing = None;
        estimate.leases[0].stalled =
            Some("on pod-a at 10:00: no progress for 300 s, in a change feed read for 290 s".into());
        estimate
    }

    /// A lease over half a partition, which KEDA's scaler cannot read.
    fn keda_blind() -> ProcessorEstimate {
        let reading = KedaReading {
            unreadable: vec!["-80".into()],
            documents: 3,
            page: 100,
        };
        let mut estimate = failing_lease();
        estimate.leases[0].handler_failing = None;
        estimate.with_keda(reading)
    }

    type Expected = &'static [(bool, &'static str, &'static str)];

    #[test]
    fn the_events_follow_what_was_applied_and_what_changed() {
        let problem = ConfigProblem {
            reason: "SecretNotFound",
            message: "create the Secret".into(),
        };
        let paused = |held: Option<(i32, i32)>| Outcome {
            paused: Some(Pause {
                replicas: held.map(|h| h.1),
            }),
            plan: plan(None, "Paused", None),
            before: held.map(|h| h.0),
            held,
            deployment: held.map(|h| deployment(h.1)),
            ..Outcome::default()
        };
        let failed = EstimateFailure {
            reason: "timeout",
            message: "timed out".into(),
            setup: None,
        };
        let cases: Vec<(&str, Vec<Condition>, Outcome, Expected)> = vec![
            (
                "first deployment",
                vec![],
                applied(None, 2),
                &[(false, "Deployed", "deployed 2 worker pod(s)")],
            ),
            ("steady", vec![], applied(Some(2), 2), &[]),
            (
                "spec scaled",
                vec![],
                applied(Some(1), 3),
                &[(false, "Scaled", "scaled workers from 1 to 3")],
            ),
            (
                "autoscaler decided",
                vec![],
                Outcome {
                    plan: plan(Some(3), "ScalingActive", Some("ScaledUp")),
                    ..applied(Some(1), 3)
                },
                &[(false, "ScaledUp", "ScaledUp note")],
            ),
            (
                "refused",
                vec![],
                Outcome {
                    apply: Apply::Refused("denied (Forbidden)".into()),
                    deployment: None,
                    ..applied(None, 2)
                },
                &[(true, "ApplyFailed", "denied (Forbidden)")],
            ),
            (
                "configuration problem",
                vec![],
                Outcome {
                    problem: Some(problem.clone()),
                    ..Outcome::default()
                },
                &[(true, "SecretNotFound", "create the Secret")],
            ),
            (
                "paused and held",
                vec![],
                paused(Some((3, 0))),
                &[
                    (false, "Scaled", "scaled workers from 3 to 0 (paused at 0 replicas)"),
                    (false, "Paused", "Paused message"),
                ],
            ),
            ("still paused", vec![condition(SCALING, "Paused")], paused(None), &[]),
            (
                "resumed",
                vec![condition(SCALING, "Paused")],
                applied(Some(2), 2),
                &[(
                    false,
                    "Resumed",
                    "resumed: the operator scales and applies the workload again",
                )],
            ),
            (
                "estimates fail at zero: one EstimateFailed Event",
                vec![],
                Outcome {
                    plan: plan(Some(0), "EstimateFailed", None),
                    estimate: estimate(Err(failed.clone())),
                    ..applied(Some(0), 0)
                },
                &[(true, "EstimateFailed", "EstimateFailed message")],
            ),
            (
                "a handler starts failing",
                vec![],
                Outcome {
                    estimate: estimate(Ok(failing_lease())),
                    ..applied(Some(1), 1)
                },
                &[(
                    true,
                    "HandlerFailing",
                    "lease 0 halts on a batch its handler keeps failing",
                )],
            ),
            (
                "a handler keeps failing",
                vec![condition(DEGRADED, "HandlerFailing")],
                Outcome {
                    estimate: estimate(Ok(failing_lease())),
                    ..applied(Some(1), 1)
                },
                &[],
            ),
            (
                "a lease stalls",
                vec![condition(DEGRADED, "HandlersHealthy")],
                Outcome {
                    estimate: estimate(Ok(stalled_lease())),
                    ..applied(Some(1), 1)
                },
                &[(true, "LeaseStalled", "lease 0 is stalled on pod-a at 10:00")],
            ),
            (
                "a lease stays stalled",
                vec![condition(DEGRADED, "LeaseStalled")],
                Outcome {
                    estimate: estimate(Ok(stalled_lease())),
                    ..applied(Some(1), 1)
                },
                &[],
            ),
            (
                "KEDA scales and cannot read a lease",
                vec![],
                Outcome {
                    estimate: estimate(Ok(keda_blind())),
                    keda_hpa: Some("keda-hpa-orders".into()),
                    autoscalers_seen: true,
                    ..applied(Some(1), 1)
                },
                &[(
                    true,
                    "LeasesNotPartitions",
                    "KEDA (HorizontalPodAutoscaler \"keda-hpa-orders\") cannot read 1 of the leases (-80)",
                )],
            ),
            (
                "KEDA still cannot read it",
                vec![condition(KEDA_READS_LEASES, "LeasesNotPartitions")],
                Outcome {
                    estimate: estimate(Ok(keda_blind())),
                    keda_hpa: Some("keda-hpa-orders".into()),
                    autoscalers_seen: true,
                    ..applied(Some(1), 1)
                },
                &[],
            ),
            (
                "the same leases, no KEDA",
                vec![],
                Outcome {
                    estimate: estimate(Ok(keda_blind())),
                    ..applied(Some(1), 1)
                },
                &[],
            ),
        ];
        for (name, previous, outcome, expected) in cases {
            let reported = report(&resource(previous), &outcome, time(10));
            let got: Vec<(bool, &str)> = reported.events.iter().map(|e| (e.warning, e.reason.as_str())).collect();
            let want: Vec<(bool, &str)> = expected.iter().map(|(w, r, _)| (*w, *r)).collect();
            assert_eq!(got, want, "{name}");
            for (event, (_, _, note)) in reported.events.iter().zip(expected) {
                assert!(event.note.starts_with(note), "{name}: {}", event.note);
            }
        }
    }

    #[test]
    fn the_status_carries_the_replicas_the_estimate_and_the_requeue() {
        let outcome = Outcome {
            estimate: estimate(Ok(failing_lease())),
            remembered_scale_time: Some(time(3)),
            ..applied(Some(1), 2)
        };
        let reported = report(&resource(vec![]), &outcome, time(10));
        let status = &reported.status;
        assert_eq!(
            (status.replicas, status.ready_replicas, status.desired_replicas),
            (2, 2, Some(2))
        );
        assert_eq!((status.leases, status.estimated_lag), (Some(1), Some(7)));
        assert_eq!(status.instances, BTreeMap::from([("pod-a".to_owned(), 1)]));
        assert_eq!(status.last_scale_time, Some(time(3)));
        assert_eq!(status.observed_generation, Some(1));
        assert!(reported.ready);
        assert_eq!(reported.desired_replicas, Some(2));
        assert_eq!(reported.requeue, Duration::from_secs(300));
        let kinds: Vec<&str> = status.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(kinds, ["ConfigValid", "Ready", "Progressing", "Scaling", "Degraded"]);

        let broken = Outcome {
            problem: Some(ConfigProblem {
                reason: "InvalidSpec",
                message: "fix it".into(),
            }),
            ..Outcome::default()
        };
        let broken = report(&resource(vec![]), &broken, time(10));
        assert_eq!(broken.requeue, Duration::from_secs(60));
        assert!(!broken.ready);
        assert_eq!(broken.desired_replicas, None);

        // Deployed, 2 of 3 ready (a pod crash-looping, say): its pods are looked at again soon.
        let mut starting = applied(Some(3), 3);
        if let Some(status) = starting.deployment.as_mut().and_then(|d| d.status.as_mut()) {
            status.ready_replicas = Some(2);
        }
        assert!(starting.needs_pod_check());
        let starting = report(&resource(vec![]), &starting, time(10));
        assert_eq!(starting.requeue, Duration::from_secs(30));
    }

    #[test]
    fn a_held_pause_reports_the_held_replicas_and_the_pods_are_checked_when_short() {
        let held = Outcome {
            paused: Some(Pause { replicas: Some(0) }),
            plan: plan(None, "Paused", None),
            deployment: Some(deployment(0)),
            ..Outcome::default()
        };
        assert_eq!(report(&resource(vec![]), &held, time(1)).desired_replicas, Some(0));
        let mut short = applied(Some(2), 2);
        assert!(!short.needs_pod_check());
        if let Some(status) = short.deployment.as_mut().and_then(|d| d.status.as_mut()) {
            status.ready_replicas = Some(1);
        }
        assert!(short.needs_pod_check());
    }
}
