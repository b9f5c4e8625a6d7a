//! The status a `ChangeFeedProcessor` reports: conditions with reasons a person can act on. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::config::ConfigProblem;

/// `Ready`: the workers run as specified.
pub const READY: &str = "Ready";
/// `ConfigValid`: the configuration can work.
pub const CONFIG_VALID: &str = "ConfigValid";
/// `Scaling`: what the autoscaler decided and why.
pub const SCALING: &str = "Scaling";

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
    [Some(config), Some(ready), scaling]
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
    fn transition_time_moves_only_on_a_status_change() {
        let first = conditions(&observe(None, true, 1, 0), &[], None, time(100));
        let same = conditions(&observe(None, true, 1, 0), &first, None, time(200));
        assert_eq!(same[1].last_transition_time, time(100));
        let changed = conditions(&observe(None, true, 1, 1), &same, None, time(300));
        assert_eq!(changed[1].last_transition_time, time(300));
        assert_eq!(changed[0].last_transition_time, time(100));
    }
}
