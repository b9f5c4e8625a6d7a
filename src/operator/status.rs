//! The status a `ChangeFeedProcessor` reports: conditions with reasons a person can act on. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::config::ConfigProblem;

/// `Ready`: the workers run as specified.
pub const READY: &str = "Ready";
/// `ConfigValid`: the configuration can work.
pub const CONFIG_VALID: &str = "ConfigValid";
/// `Scaling`: what the autoscaler decided and why.
pub const SCALING: &str = "Scaling";
/// `Degraded`: some leases halt because their handler keeps failing.
pub const DEGRADED: &str = "Degraded";
/// `Progressing`: a rollout of the workers is under way (or stalled).
pub const PROGRESSING: &str = "Progressing";

/// What the worker Deployment and its pods report.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rollout {
    /// Whether the Deployment controller has seen the current Deployment spec.
    pub observed: bool,
    /// Pods of the current pod template.
    pub updated: i32,
    /// The Deployment's `ReplicaFailure` condition message (pods refused: Pod Security, quota, ...).
    pub replica_failure: Option<String>,
    /// The Deployment's `Progressing=False` message (progress deadline exceeded).
    pub stalled: Option<String>,
    /// A worker pod that cannot run: (pod, container, reason such as `CrashLoopBackOff`, message).
    pub pod_problem: Option<(String, String, String, String)>,
    /// The API server refused the rendered objects, with its message.
    pub apply_failure: Option<String>,
}

/// The `Scaling` condition as the reconciler decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalingState {
    /// `True` while the built-in autoscaler applies its recommendation.
    pub active: bool,
    /// `ScalingActive`, `ScalingLimited`, `ScalingDisabled`, `EstimateFailed`,
    /// `ExternalAutoscaler` or `WaitingForEstimate`.
    pub reason: String,
    /// What was decided and why.
    pub message: String,
}

/// What the reconciler observed.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// The configuration problem, if any.
    pub problem: Option<ConfigProblem>,
    /// Whether a worker Deployment exists.
    pub deployed: bool,
    /// Desired worker pods.
    pub desired: i32,
    /// Ready worker pods.
    pub ready: i32,
    /// The `Scaling` condition; `None` keeps the previous one (the configuration cannot work).
    pub scaling: Option<ScalingState>,
    /// Leases halted on a failing handler (lease token, since when and the error), from the
    /// last estimate; `None` keeps the previous `Degraded` condition (no estimate yet).
    pub failing_leases: Option<Vec<(String, String)>>,
    /// The rollout of the workers.
    pub rollout: Rollout,
}

/// The `Degraded` condition for the halted leases.
fn degraded(failing: &[(String, String)], generation: Option<i64>, now: &Time) -> Condition {
    match failing {
        [] => condition(
            DEGRADED,
            false,
            "HandlersHealthy",
            "no lease is halted by a failing handler".into(),
            generation,
            now,
        ),
        [(lease, note), rest @ ..] => {
            let more = if rest.is_empty() {
                String::new()
            } else {
                format!(" (and {} more lease(s))", rest.len())
            };
            // A condition's status True here means "degraded".
            let mut degraded = condition(
                DEGRADED,
                true,
                "HandlerFailing",
                format!(
                    "lease {lease} halts on a batch its handler keeps failing, {note}{more}; fix the handler, or set handler.onExhausted to DeadLetter"
                ),
                generation,
                now,
            );
            degraded.message.truncate(1000);
            degraded
        }
    }
}

fn condition(kind: &str, ok: bool, reason: &str, message: String, generation: Option<i64>, now: &Time) -> Condition {
    Condition {
        type_: kind.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: now.clone(),
    }
}

/// The conditions for `observation`; a condition whose status did not change keeps its
/// `lastTransitionTime` from `previous`.
pub fn conditions(
    observation: &Observation,
    previous: &[Condition],
    generation: Option<i64>,
    now: Time,
) -> Vec<Condition> {
    let config = match &observation.problem {
        Some(problem) => condition(
            CONFIG_VALID,
            false,
            problem.reason,
            problem.message.clone(),
            generation,
            &now,
        ),
        None => condition(
            CONFIG_VALID,
            true,
            "Valid",
            "the configuration is valid".into(),
            generation,
            &now,
        ),
    };
    let ready = match (&observation.problem, observation.deployed) {
        (Some(problem), false) => condition(
            READY,
            false,
            problem.reason,
            format!("no workers are deployed: {}", problem.message),
            generation,
            &now,
        ),
        (Some(problem), true) => condition(
            READY,
            false,
            problem.reason,
            format!(
                "the existing workers keep running unchanged until this is fixed: {}",
                problem.message
            ),
            generation,
            &now,
        ),
        (None, _) if observation.rollout.apply_failure.is_some() => condition(
            READY,
            false,
            "ApplyFailed",
            format!(
                "the API server refused the workers' objects: {}",
                observation.rollout.apply_failure.clone().unwrap_or_default()
            ),
            generation,
            &now,
        ),
        (None, _) if observation.desired == 0 => condition(
            READY,
            true,
            "ScaledToZero",
            "0 worker pods are desired".into(),
            generation,
            &now,
        ),
        (None, _) if observation.rollout.replica_failure.is_some() => condition(
            READY,
            false,
            "ReplicaFailure",
            format!(
                "worker pods cannot be created: {}",
                observation.rollout.replica_failure.clone().unwrap_or_default()
            ),
            generation,
            &now,
        ),
        (None, _) if observation.rollout.pod_problem.is_some() => {
            let (pod, container, reason, message) = observation.rollout.pod_problem.clone().unwrap_or_default();
            condition(
                READY,
                false,
                &reason,
                format!(
                    "{} of {} worker pods are ready; pod {pod} container {container}: {reason}: {message}",
                    observation.ready, observation.desired
                ),
                generation,
                &now,
            )
        }
        (None, _) if observation.rollout.stalled.is_some() => condition(
            READY,
            false,
            "RolloutStalled",
            format!(
                "the workers' rollout made no progress: {}",
                observation.rollout.stalled.clone().unwrap_or_default()
            ),
            generation,
            &now,
        ),
        (None, _) if !observation.rollout.observed || observation.rollout.updated < observation.desired => condition(
            READY,
            false,
            "RolloutInProgress",
            format!(
                "{} of {} worker pods run the current template, {} ready",
                observation.rollout.updated, observation.desired, observation.ready
            ),
            generation,
            &now,
        ),
        (None, _) if observation.ready >= observation.desired => condition(
            READY,
            true,
            "WorkersReady",
            format!("{} of {} worker pods are ready", observation.ready, observation.desired),
            generation,
            &now,
        ),
        (None, _) => condition(
            READY,
            false,
            "WorkersStarting",
            format!("{} of {} worker pods are ready", observation.ready, observation.desired),
            generation,
            &now,
        ),
    };
    let scaling = match &observation.scaling {
        Some(state) => Some(condition(
            SCALING,
            state.active,
            &state.reason,
            state.message.clone(),
            generation,
            &now,
        )),
        None => previous.iter().find(|c| c.type_ == SCALING).cloned(),
    };
    let progressing = observation.deployed.then(|| {
        let rollout = &observation.rollout;
        if let Some(stalled) = &rollout.stalled {
            condition(PROGRESSING, false, "RolloutStalled", stalled.clone(), generation, &now)
        } else if !rollout.observed || rollout.updated < observation.desired || observation.ready < observation.desired
        {
            condition(
                PROGRESSING,
                true,
                "RolloutInProgress",
                format!(
                    "{} of {} worker pods updated, {} ready",
                    rollout.updated, observation.desired, observation.ready
                ),
                generation,
                &now,
            )
        } else {
            condition(
                PROGRESSING,
                false,
                "RolloutComplete",
                "every worker pod runs the current template and is ready".into(),
                generation,
                &now,
            )
        }
    });
    let degraded = match &observation.failing_leases {
        Some(failing) => Some(degraded(failing, generation, &now)),
        None => previous.iter().find(|c| c.type_ == DEGRADED).cloned(),
    };
    [Some(config), Some(ready), progressing, scaling, degraded]
        .into_iter()
        .flatten()
        .map(|mut c| {
            if let Some(old) = previous.iter().find(|p| p.type_ == c.type_ && p.status == c.status) {
                c.last_transition_time = old.last_transition_time.clone();
            }
            c
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap())
    }

    fn observe(problem: Option<&'static str>, deployed: bool, desired: i32, ready: i32) -> Observation {
        Observation {
            problem: problem.map(|reason| ConfigProblem {
                reason,
                message: "fix it".into(),
            }),
            deployed,
            desired,
            ready,
            scaling: Some(ScalingState {
                active: false,
                reason: "ScalingDisabled".into(),
                message: "built-in autoscaling is off".into(),
            }),
            failing_leases: None,
            rollout: Rollout {
                observed: true,
                updated: desired,
                ..Rollout::default()
            },
        }
    }

    #[test]
    fn table() {
        let cases = [
            (observe(None, true, 2, 2), ("True", "Valid"), ("True", "WorkersReady")),
            (
                observe(None, true, 2, 1),
                ("True", "Valid"),
                ("False", "WorkersStarting"),
            ),
            (observe(None, true, 0, 0), ("True", "Valid"), ("True", "ScaledToZero")),
            (
                observe(Some("SecretNotFound"), false, 1, 0),
                ("False", "SecretNotFound"),
                ("False", "SecretNotFound"),
            ),
            (
                observe(Some("InvalidConfiguration"), true, 1, 1),
                ("False", "InvalidConfiguration"),
                ("False", "InvalidConfiguration"),
            ),
        ];
        for (observation, config, ready) in cases {
            let got = conditions(&observation, &[], Some(3), time(100));
            assert_eq!(
                (got[0].type_.as_str(), got[0].status.as_str(), got[0].reason.as_str()),
                (CONFIG_VALID, config.0, config.1)
            );
            assert_eq!(
                (got[1].type_.as_str(), got[1].status.as_str(), got[1].reason.as_str()),
                (READY, ready.0, ready.1)
            );
            assert!(got.iter().all(|c| c.observed_generation == Some(3)));
        }
    }

    #[test]
    fn scaling_condition_follows_the_decision_and_survives_a_config_problem() {
        let mut active = observe(None, true, 3, 3);
        active.scaling = Some(ScalingState {
            active: true,
            reason: "ScalingActive".into(),
            message: "3 replica(s) recommended".into(),
        });
        let first = conditions(&active, &[], Some(1), time(100));
        let scaling = first.iter().find(|c| c.type_ == SCALING).unwrap();
        assert_eq!(
            (scaling.status.as_str(), scaling.reason.as_str()),
            ("True", "ScalingActive")
        );
        let mut broken = observe(Some("SecretNotFound"), true, 3, 3);
        broken.scaling = None;
        let second = conditions(&broken, &first, Some(2), time(200));
        assert_eq!(
            second.iter().find(|c| c.type_ == SCALING),
            Some(scaling),
            "kept as it was"
        );
    }

    #[test]
    fn ready_tells_why_workers_are_not_running() {
        let cases: Vec<(&str, Rollout, i32, &str, &str)> = vec![
            (
                "all ready",
                Rollout {
                    observed: true,
                    updated: 2,
                    ..Rollout::default()
                },
                2,
                "WorkersReady",
                "RolloutComplete",
            ),
            (
                "new template not seen yet",
                Rollout {
                    observed: false,
                    updated: 2,
                    ..Rollout::default()
                },
                2,
                "RolloutInProgress",
                "RolloutInProgress",
            ),
            (
                "old pods still ready",
                Rollout {
                    observed: true,
                    updated: 1,
                    ..Rollout::default()
                },
                2,
                "RolloutInProgress",
                "RolloutInProgress",
            ),
            (
                "crash loop",
                Rollout {
                    observed: true,
                    updated: 2,
                    pod_problem: Some((
                        "orders-1".into(),
                        "worker".into(),
                        "CrashLoopBackOff".into(),
                        "back-off 40s".into(),
                    )),
                    ..Rollout::default()
                },
                1,
                "CrashLoopBackOff",
                "RolloutInProgress",
            ),
            (
                "pods refused",
                Rollout {
                    observed: true,
                    updated: 0,
                    replica_failure: Some("violates PodSecurity".into()),
                    ..Rollout::default()
                },
                0,
                "ReplicaFailure",
                "RolloutInProgress",
            ),
            (
                "stalled",
                Rollout {
                    observed: true,
                    updated: 1,
                    stalled: Some("ProgressDeadlineExceeded".into()),
                    ..Rollout::default()
                },
                1,
                "RolloutStalled",
                "RolloutStalled",
            ),
            (
                "apply refused",
                Rollout {
                    observed: true,
                    updated: 2,
                    apply_failure: Some("spec.volumes[0].name: Invalid value".into()),
                    ..Rollout::default()
                },
                2,
                "ApplyFailed",
                "RolloutComplete",
            ),
        ];
        for (name, rollout, ready, want_ready, want_progressing) in cases {
            let mut observation = observe(None, true, 2, ready);
            observation.rollout = rollout;
            let got = conditions(&observation, &[], Some(1), time(1));
            let reason = |kind: &str| {
                got.iter()
                    .find(|c| c.type_ == kind)
                    .map(|c| c.reason.clone())
                    .unwrap_or_default()
            };
            assert_eq!(
                (reason(READY).as_str(), reason(PROGRESSING).as_str()),
                (want_ready, want_progressing),
                "{name}"
            );
        }
        let mut crash = observe(None, true, 2, 1);
        crash.rollout.pod_problem = Some((
            "orders-1".into(),
            "worker".into(),
            "CrashLoopBackOff".into(),
            "back-off 40s".into(),
        ));
        let ready = conditions(&crash, &[], None, time(1))
            .into_iter()
            .find(|c| c.type_ == READY)
            .unwrap();
        assert!(
            ready.message.contains("pod orders-1 container worker"),
            "{}",
            ready.message
        );
    }

    #[test]
    fn degraded_names_the_halted_lease() {
        let mut observation = observe(None, true, 2, 2);
        observation.failing_leases = Some(vec![
            ("-80".into(), "since 2026-01-01T00:00:00Z: POST answered 500".into()),
            ("80-FF".into(), "since 2026-01-01T00:00:01Z: timeout".into()),
        ]);
        let got = conditions(&observation, &[], None, time(1));
        let degraded = got.iter().find(|c| c.type_ == DEGRADED).unwrap();
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "HandlerFailing")
        );
        assert!(
            degraded.message.contains("lease -80") && degraded.message.contains("1 more"),
            "{}",
            degraded.message
        );
        observation.failing_leases = Some(Vec::new());
        let healthy = conditions(&observation, &got, None, time(2));
        let degraded = healthy.iter().find(|c| c.type_ == DEGRADED).unwrap();
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("False", "HandlersHealthy")
        );
    }

    #[test]
    fn transition_time_moves_only_on_a_status_change() {
        let first = conditions(&observe(None, true, 1, 0), &[], None, time(100));
        let same = conditions(&observe(None, true, 1, 0), &first, None, time(200));
        assert_eq!(same[1].last_transition_time, time(100));
        let changed = conditions(&observe(None, true, 1, 1), &same, None, time(300));
        assert_eq!(changed[1].last_transition_time, time(300));
        assert_eq!(changed[0].last_transition_time, time(100));
    }
}
