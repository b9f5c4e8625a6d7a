//! The status a `ChangeFeedProcessor` reports: conditions with reasons a person can act on. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::config::ConfigProblem;

/// `Ready`: the workers run as specified.
pub const READY: &str = "Ready";
/// `ConfigValid`: the configuration can work.
pub const CONFIG_VALID: &str = "ConfigValid";

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
    [config, ready]
        .into_iter()
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
    fn transition_time_moves_only_on_a_status_change() {
        let first = conditions(&observe(None, true, 1, 0), &[], None, time(100));
        let same = conditions(&observe(None, true, 1, 0), &first, None, time(200));
        assert_eq!(same[1].last_transition_time, time(100));
        let changed = conditions(&observe(None, true, 1, 1), &same, None, time(300));
        assert_eq!(changed[1].last_transition_time, time(300));
        assert_eq!(changed[0].last_transition_time, time(100));
    }
}
