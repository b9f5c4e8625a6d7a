//! The status a `ChangeFeedProcessor` reports: conditions with reasons a person can act on. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::operator::scaling::external::KedaVerdict;
use crate::operator::spec_values::ConfigProblem;

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
/// `Rewound`: how the last rewind or restore of the checkpoints ended (set by the rewind steps,
/// kept by every other status write).
pub const REWOUND: &str = "Rewound";
/// `KedaReadsLeases`: whether KEDA's scaler, when KEDA scales the resource, counts every lease.
pub const KEDA_READS_LEASES: &str = "KedaReadsLeases";

/// A worker pod whose container cannot run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodProblem {
    /// The pod's name.
    pub pod: String,
    /// The container's name.
    pub container: String,
    /// Why it waits, such as `CrashLoopBackOff`.
    pub reason: String,
    /// The kubelet's message, with the container's last exit.
    pub message: String,
}

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
    /// A worker pod that cannot run.
    pub pod_problem: Option<PodProblem>,
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
    /// Stalled leases (lease token, and where, since when and doing what), from the last
    /// estimate; `None` with `failing_leases`.
    pub stalled_leases: Option<Vec<(String, String)>>,
    /// Whether KEDA scales the resource (an HPA of a ScaledObject on its `/scale`); `None` when
    /// not known this time (paused, or the HPAs could not be listed).
    pub scaled_by_keda: Option<bool>,
    /// What KEDA reads of the leases, from the last estimate; `None` keeps the previous
    /// `KedaReadsLeases` condition while KEDA scales (no estimate yet), else drops it.
    pub keda: Option<KedaVerdict>,
    /// The rollout of the workers.
    pub rollout: Rollout,
    /// The newest estimate failed: why, when it is a problem waiting does not fix (a lease
    /// container missing or that may not be created), and what happened.
    pub estimate_failure: Option<EstimateProblem>,
}

/// A failed estimate, as the status reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EstimateProblem {
    /// The condition reason of a problem that waiting does not fix (`LeaseContainerMissing`,
    /// `ContainerCreationRefused`, ...); `None` for a failure that may pass (timeouts, outages).
    pub setup: Option<&'static str>,
    /// What went wrong.
    pub message: String,
}

/// Now, in whole seconds. A `Time` travels through the API server at second precision: a status
/// holding a finer one never equals what is read back, and every reconciliation would write it
/// again (and a status write is an etcd write, per resource, every requeue).
pub fn now() -> Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// The most bytes of a condition message (the API server allows 32 KiB; a person reads less).
pub const MAX_CONDITION_MESSAGE: usize = 2048;
/// The most bytes of an Event note (the API server refuses longer ones).
pub const MAX_EVENT_NOTE: usize = 1024;

/// `message` cut to at most `max_bytes` bytes on a character boundary, ending in `…` when cut.
/// Every message the operator writes goes through it: messages embed handler bodies, URLs and
/// account errors, any of which can hold multi-byte characters.
pub fn bounded(mut message: String, max_bytes: usize) -> String {
    const ELLIPSIS: char = '…';
    if message.len() <= max_bytes {
        return message;
    }
    let mut end = max_bytes.saturating_sub(ELLIPSIS.len_utf8());
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message.truncate(end);
    if ELLIPSIS.len_utf8() <= max_bytes {
        message.push(ELLIPSIS);
    }
    message
}

/// The `Degraded` condition for the halted leases, else the stalled ones.
fn degraded(
    failing: &[(String, String)],
    stalled: &[(String, String)],
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let more = |rest: &[(String, String)]| {
        if rest.is_empty() {
            String::new()
        } else {
            format!(" (and {} more lease(s))", rest.len())
        }
    };
    let (reason, message) = match (failing, stalled) {
        ([], []) => {
            let message = "no lease is halted by a failing handler or stalled".to_owned();
            return condition(DEGRADED, false, "HandlersHealthy", message, generation, now);
        }
        ([(lease, note), rest @ ..], _) => (
            "HandlerFailing",
            format!(
                "lease {lease} halts on a batch its handler keeps failing, {note}{}; fix the handler, or set handler.onExhausted to DeadLetter",
                more(rest)
            ),
        ),
        ([], [(lease, note), rest @ ..]) => (
            "LeaseStalled",
            format!(
                "lease {lease} is stalled {note}{}: it does not advance though it may have changes to deliver (a read or a handler call that never returns); its worker restarts the lease's reader, then releases the lease for another pod — see the runbook of the alert ChangeFeedLeaseStalled",
                more(rest)
            ),
        ),
    };
    // A condition's status True here means "degraded".
    let mut degraded = condition(DEGRADED, true, reason, message, generation, now);
    degraded.message = bounded(degraded.message, 1000);
    degraded
}

/// A condition of `kind` (`True` when `ok`) with its reason and message (bounded).
pub(crate) fn condition(
    kind: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    Condition {
        type_: kind.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: bounded(message, MAX_CONDITION_MESSAGE),
        observed_generation: generation,
        last_transition_time: now.clone(),
    }
}

/// The Warning Event (reason, note) for a `Ready` condition that newly fails because of the
/// estimate: a lease container missing or that may not be created, or estimates failing while
/// scaled to zero. `None` when the reason did not change or is another one.
pub fn ready_problem_event(previous: &[Condition], current: &[Condition]) -> Option<(String, String)> {
    let ready = current.iter().find(|c| c.type_ == READY && c.status == "False")?;
    let from_estimate = ready.reason == "EstimateFailed" || SETUP_REASONS.contains(&ready.reason.as_str());
    let before = previous.iter().find(|c| c.type_ == READY);
    (from_estimate && before.is_none_or(|b| b.reason != ready.reason))
        .then(|| (ready.reason.clone(), ready.message.clone()))
}

/// The `Ready` reasons of problems with the containers or credentials that waiting does not fix.
pub const SETUP_REASONS: [&str; 6] = [
    "MonitoredContainerMissing",
    "LeaseContainerMissing",
    "ContainerCreationRefused",
    "CredentialRefused",
    "AccessForbidden",
    "LeaseContainerInvalid",
];

/// An age in `seconds` as the status shows it: rounded down to 5 s below a minute, to the minute
/// below an hour, then to 10 minutes (a steady backlog's growing age rewrites the status seldom).
pub fn coarse_age(seconds: u64) -> u64 {
    let step = match seconds {
        0..60 => 5,
        60..3600 => 60,
        _ => 600,
    };
    seconds - seconds % step
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
    let (ok, reason, message) = ready(observation);
    let ready = condition(READY, ok, &reason, message, generation, &now);
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
        let (ok, reason, message) = progressing(observation);
        condition(PROGRESSING, ok, reason, message, generation, &now)
    });
    let degraded = match (&observation.failing_leases, &observation.stalled_leases) {
        (Some(failing), stalled) => Some(degraded(
            failing,
            stalled.as_deref().unwrap_or_default(),
            generation,
            &now,
        )),
        (None, _) => previous.iter().find(|c| c.type_ == DEGRADED).cloned(),
    };
    let rewound = previous.iter().find(|c| c.type_ == REWOUND).cloned();
    let keda = match (&observation.keda, observation.scaled_by_keda) {
        (Some(keda), _) => Some(condition(
            KEDA_READS_LEASES,
            keda.ok,
            keda.reason,
            keda.message.clone(),
            generation,
            &now,
        )),
        (None, Some(false)) => None,
        (None, _) => previous.iter().find(|c| c.type_ == KEDA_READS_LEASES).cloned(),
    };
    [Some(config), Some(ready), progressing, scaling, degraded, rewound, keda]
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

/// A condition's (status, reason, message).
type Verdict = (bool, String, String);

fn verdict(ok: bool, reason: &str, message: String) -> Verdict {
    (ok, reason.to_owned(), message)
}

/// `Ready`: the configuration, then what was applied and estimated, then the rollout.
fn ready(observation: &Observation) -> Verdict {
    match (&observation.problem, observation.deployed) {
        (Some(problem), false) => verdict(
            false,
            problem.reason,
            format!("no workers are deployed: {}", problem.message),
        ),
        (Some(problem), true) => verdict(
            false,
            problem.reason,
            format!(
                "the existing workers keep running unchanged until this is fixed: {}",
                problem.message
            ),
        ),
        (None, _) => setup_ready(observation).unwrap_or_else(|| rollout_ready(observation)),
    }
}

/// `Ready` when the API server refused the workload, or the estimate shows a problem that keeps
/// the workers from working or from ever starting; `None` otherwise.
fn setup_ready(observation: &Observation) -> Option<Verdict> {
    if let Some(failure) = &observation.rollout.apply_failure {
        let message = format!("the API server refused the workers' objects: {failure}");
        return Some(verdict(false, "ApplyFailed", message));
    }
    let failure = observation.estimate_failure.as_ref()?;
    if let Some(setup) = failure.setup {
        return Some(verdict(false, setup, failure.message.clone()));
    }
    // With autoscaling (built in, or an HPA or KEDA reading the estimate's metrics) a failed
    // estimate at 0 replicas means nothing would ever start a worker.
    let autoscaled = observation
        .scaling
        .as_ref()
        .is_some_and(|s| s.reason != "ScalingDisabled");
    (observation.desired == 0 && autoscaled).then(|| {
        verdict(
            false,
            "EstimateFailed",
            format!(
                "0 worker pods run and the remaining work cannot be estimated, so nothing would start them: {}",
                failure.message
            ),
        )
    })
}

/// `Ready` from the rollout of the workers and their pods.
fn rollout_ready(observation: &Observation) -> Verdict {
    let (rollout, desired, ready) = (&observation.rollout, observation.desired, observation.ready);
    if desired == 0 {
        return verdict(true, "ScaledToZero", "0 worker pods are desired".into());
    }
    if let Some(failure) = &rollout.replica_failure {
        return verdict(
            false,
            "ReplicaFailure",
            format!("worker pods cannot be created: {failure}"),
        );
    }
    if let Some(PodProblem {
        pod,
        container,
        reason,
        message,
    }) = &rollout.pod_problem
    {
        let message =
            format!("{ready} of {desired} worker pods are ready; pod {pod} container {container}: {reason}: {message}");
        return verdict(false, reason, message);
    }
    if let Some(stalled) = &rollout.stalled {
        let message = format!("the workers' rollout made no progress: {stalled}");
        return verdict(false, "RolloutStalled", message);
    }
    if !rollout.observed || rollout.updated < desired {
        let message = format!(
            "{} of {desired} worker pods run the current template, {ready} ready",
            rollout.updated
        );
        return verdict(false, "RolloutInProgress", message);
    }
    let message = format!("{ready} of {desired} worker pods are ready");
    if ready >= desired {
        verdict(true, "WorkersReady", message)
    } else {
        verdict(false, "WorkersStarting", message)
    }
}

/// `Progressing` of a deployed workload: (status, reason, message).
fn progressing(observation: &Observation) -> (bool, &'static str, String) {
    let rollout = &observation.rollout;
    if let Some(stalled) = &rollout.stalled {
        (false, "RolloutStalled", stalled.clone())
    } else if !rollout.observed || rollout.updated < observation.desired || observation.ready < observation.desired {
        let message = format!(
            "{} of {} worker pods updated, {} ready",
            rollout.updated, observation.desired, observation.ready
        );
        (true, "RolloutInProgress", message)
    } else {
        let message = "every worker pod runs the current template and is ready".into();
        (false, "RolloutComplete", message)
    }
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
            stalled_leases: None,
            scaled_by_keda: Some(false),
            keda: None,
            rollout: Rollout {
                observed: true,
                updated: desired,
                ..Rollout::default()
            },
            estimate_failure: None,
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

    fn failed(setup: Option<&'static str>) -> Option<EstimateProblem> {
        Some(EstimateProblem {
            setup,
            message: "the lease container db/leases does not exist; create it: az ...".into(),
        })
    }

    fn autoscaled(mut observation: Observation) -> Observation {
        observation.scaling = Some(ScalingState {
            active: true,
            reason: "ScalingActive".into(),
            message: "0 replica(s) recommended".into(),
        });
        observation
    }

    #[test]
    fn ready_reports_estimate_problems_that_stop_the_processor() {
        let with = |mut observation: Observation, failure| {
            observation.estimate_failure = failure;
            observation
        };
        let cases = [
            (
                "a missing lease container at any scale",
                with(observe(None, true, 2, 2), failed(Some("LeaseContainerMissing"))),
                ("False", "LeaseContainerMissing"),
            ),
            (
                "creation refused before any worker",
                with(observe(None, false, 1, 0), failed(Some("ContainerCreationRefused"))),
                ("False", "ContainerCreationRefused"),
            ),
            (
                "a passing failure while workers run",
                with(autoscaled(observe(None, true, 2, 2)), failed(None)),
                ("True", "WorkersReady"),
            ),
            (
                "a failing estimate at zero with autoscaling",
                with(autoscaled(observe(None, true, 0, 0)), failed(None)),
                ("False", "EstimateFailed"),
            ),
            (
                "zero set by hand, autoscaling off",
                with(observe(None, true, 0, 0), failed(None)),
                ("True", "ScaledToZero"),
            ),
            (
                "a config problem comes first",
                with(
                    observe(Some("SecretNotFound"), true, 1, 1),
                    failed(Some("LeaseContainerMissing")),
                ),
                ("False", "SecretNotFound"),
            ),
        ];
        for (name, observation, want) in cases {
            let got = conditions(&observation, &[], Some(1), time(100));
            let ready = got.iter().find(|c| c.type_ == READY).unwrap();
            assert_eq!((ready.status.as_str(), ready.reason.as_str()), want, "{name}");
        }
    }

    #[test]
    fn every_setup_problem_of_a_worker_is_a_ready_reason() {
        use crate::cosmos::{CosmosError, ErrorKind};
        use crate::worker::WorkerError;
        let error = || CosmosError::local(ErrorKind::Forbidden, "403");
        let problems = [
            WorkerError::MonitoredMissing("db/items".into()),
            WorkerError::LeasesMissing {
                name: "db/leases".into(),
                how_to_create: "az ...".into(),
            },
            WorkerError::CreationRefused {
                name: "db/leases".into(),
                how_to_create: "az ...".into(),
                source: error(),
            },
            WorkerError::Unauthorized("401".into()),
            WorkerError::Forbidden {
                name: "db/leases".into(),
                source: error(),
            },
            WorkerError::LeaseContainer("partitioned on /pk".into()),
            WorkerError::Options(crate::processor::OptionsError::Zero(
                crate::processor::OptionField::RenewInterval,
            )),
        ];
        for problem in &problems {
            assert!(problem.is_setup_problem(), "{problem}");
            assert!(SETUP_REASONS.contains(&problem.reason()), "{}", problem.reason());
        }
        let passing = WorkerError::Cosmos {
            context: "opening".into(),
            source: CosmosError::local(ErrorKind::Transient, "503"),
        };
        assert!(!passing.is_setup_problem());
    }

    #[test]
    fn an_age_is_shown_coarser_as_it_grows() {
        #[rustfmt::skip]
        let cases = [(0, 0), (4, 0), (5, 5), (59, 55), (60, 60), (119, 60), (3599, 3540), (3600, 3600), (4199, 3600), (4200, 4200)];
        for (seconds, shown) in cases {
            assert_eq!(coarse_age(seconds), shown, "{seconds}");
        }
    }

    #[test]
    fn the_keda_condition_is_there_while_keda_scales_and_kept_until_an_estimate() {
        let verdict = KedaVerdict {
            ok: false,
            reason: "LeasesNotPartitions",
            message: "KEDA cannot read 4 of the leases".into(),
        };
        let keda = |c: &[Condition]| {
            c.iter()
                .find(|c| c.type_ == KEDA_READS_LEASES)
                .map(|c| c.reason.clone())
        };
        let mut observation = observe(None, true, 2, 2);
        assert_eq!(
            keda(&conditions(&observation, &[], Some(1), time(0))),
            None,
            "no KEDA: no condition"
        );
        observation.scaled_by_keda = Some(true);
        observation.keda = Some(verdict);
        let found = conditions(&observation, &[], Some(1), time(0));
        assert_eq!(keda(&found), Some("LeasesNotPartitions".into()));
        observation.keda = None;
        let kept = conditions(&observation, &found, Some(1), time(5));
        assert_eq!(keda(&kept), Some("LeasesNotPartitions".into()), "no estimate yet: kept");
        observation.scaled_by_keda = None;
        let unknown = conditions(&observation, &kept, Some(1), time(7));
        assert_eq!(
            keda(&unknown),
            Some("LeasesNotPartitions".into()),
            "HPAs not listed: kept"
        );
        observation.scaled_by_keda = Some(false);
        assert_eq!(
            keda(&conditions(&observation, &kept, Some(1), time(9))),
            None,
            "KEDA gone: dropped"
        );
    }

    #[test]
    fn a_fresh_estimate_problem_on_ready_gets_one_event() {
        let mut zero = autoscaled(observe(None, true, 0, 0));
        let healthy = conditions(&zero, &[], Some(1), time(100));
        assert_eq!(ready_problem_event(&[], &healthy), None);
        zero.estimate_failure = failed(None);
        let failing = conditions(&zero, &healthy, Some(1), time(200));
        let (reason, note) = ready_problem_event(&healthy, &failing).expect("an Event");
        assert_eq!(reason, "EstimateFailed");
        assert!(note.contains("nothing would start them"), "{note}");
        let again = conditions(&zero, &failing, Some(1), time(300));
        assert_eq!(ready_problem_event(&failing, &again), None, "once per change");
        zero.estimate_failure = failed(Some("LeaseContainerMissing"));
        let missing = conditions(&zero, &again, Some(1), time(400));
        assert_eq!(
            ready_problem_event(&again, &missing).map(|e| e.0),
            Some("LeaseContainerMissing".to_owned())
        );
    }

    #[test]
    fn bounded_cuts_on_a_character_boundary() {
        let table = [
            ("short", 10, "short"),
            ("ééééé", 10, "ééééé"),
            ("éééééé", 10, "ééé…"),
            ("abcdefghijk", 10, "abcdefg…"),
            ("日本語のテキスト", 9, "日本…"),
            ("日本語のテキスト", 8, "日…"),
            ("abc", 2, ""),
            ("", 0, ""),
        ];
        for (input, max, want) in table {
            let got = bounded(input.to_owned(), max);
            assert_eq!(got, want, "{input:?} at {max}");
            assert!(got.len() <= max);
        }
    }

    proptest::proptest! {
        /// Messages embed handler bodies, URLs and account errors: whatever they hold, every
        /// condition and Event renders without panicking and within the API server's limits.
        #[test]
        fn every_condition_and_event_renders_from_any_unicode(
            body in "\\PC{0,1500}",
            url in "\\PC{0,300}",
            reason in "\\PC{0,40}",
            lease in "\\PC{0,64}",
            leases in 0usize..5,
            desired in 0i32..4,
            ready in 0i32..4,
            deployed in proptest::bool::ANY,
            setup in proptest::bool::ANY,
            rollout_problem in 0u8..6,
        ) {
            let note = format!("HTTP 500 from {url}: {body}");
            let mut observation = observe(None, deployed, desired, ready);
            observation.failing_leases = Some(vec![(lease.clone(), note.clone()); leases]);
            observation.estimate_failure = Some(EstimateProblem {
                setup: setup.then_some("LeaseContainerMissing"),
                message: note.clone(),
            });
            observation.scaling = Some(ScalingState { active: false, reason: reason.clone(), message: note.clone() });
            match rollout_problem {
                0 => observation.problem = Some(ConfigProblem { reason: "InvalidConfiguration", message: note.clone() }),
                1 => observation.rollout.apply_failure = Some(note.clone()),
                2 => observation.rollout.replica_failure = Some(note.clone()),
                3 => observation.rollout.pod_problem = Some(PodProblem { pod: lease.clone(), container: url.clone(), reason: "CrashLoopBackOff".into(), message: body.clone() }),
                4 => observation.rollout.stalled = Some(note.clone()),
                _ => {}
            }
            let got = conditions(&observation, &[], Some(1), time(100));
            for condition in &got {
                proptest::prop_assert!(condition.message.len() <= MAX_CONDITION_MESSAGE);
            }
            if let Some((_, event)) = ready_problem_event(&[], &got) {
                proptest::prop_assert!(bounded(event, MAX_EVENT_NOTE).len() <= MAX_EVENT_NOTE);
            }
            proptest::prop_assert!(bounded(note, MAX_EVENT_NOTE).len() <= MAX_EVENT_NOTE);
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
                    pod_problem: Some(PodProblem {
                        pod: "orders-1".into(),
                        container: "worker".into(),
                        reason: "CrashLoopBackOff".into(),
                        message: "back-off 40s".into(),
                    }),
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
        crash.rollout.pod_problem = Some(PodProblem {
            pod: "orders-1".into(),
            container: "worker".into(),
            reason: "CrashLoopBackOff".into(),
            message: "back-off 40s".into(),
        });
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
    fn now_survives_the_api_servers_round_trip_unchanged() {
        let now = now();
        let json = serde_json::to_value(&now).unwrap();
        let back: Time = serde_json::from_value(json).unwrap();
        assert_eq!(back, now);
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
        observation.stalled_leases = Some(vec![(
            "80-FF".into(),
            "on orders-7f9c at 2026-01-01T00:05:00Z: no progress for 300 s, in a change feed read for 290 s".into(),
        )]);
        let stalled = conditions(&observation, &got, None, time(2));
        let degraded = stalled.iter().find(|c| c.type_ == DEGRADED).unwrap();
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "LeaseStalled")
        );
        assert!(
            degraded.message.starts_with("lease 80-FF is stalled on orders-7f9c at"),
            "{}",
            degraded.message
        );
        observation.stalled_leases = Some(Vec::new());
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
