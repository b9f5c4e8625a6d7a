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
        (None, _) if observation.desired == 0 => condition(
            READY,
            true,
            "ScaledToZero",
            "0 worker pods are desired".into(),
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
    let degraded = match &observation.failing_leases {
        Some(failing) => Some(degraded(failing, generation, &now)),
        None => previous.iter().find(|c| c.type_ == DEGRADED).cloned(),
    };
    [Some(config), Some(ready), scaling, degraded]
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
