//! Rewinding or restoring a processor's checkpoints with an annotation, as a small state machine.
//! Pure: what to do next from the annotations, the workers observed and the progress recorded in
//! `status.rewind`; the reconciler does it (`reconcile::rewind_actions`).
//!
//! - `changefeed.io/rewind-to: beginning | now | <RFC 3339 time>` — every lease to that position;
//! - `changefeed.io/restore-from: <ConfigMap>[/<key>]` — the leases of an export
//!   (`cfp checkpoints export`) held in that ConfigMap (the key may be left out when it holds one).
//!
//! Steps: record the request and scale the workers to 0 → wait until their pods are gone → move
//! the checkpoints and record how it ended → remove the annotation → record `status.lastRewind`
//! (or the failure in the `Rewound` condition), publish an Event, and let the next
//! reconciliation restore the replicas. Removing the annotation before the checkpoints moved
//! cancels the rewind; a failure leaves the checkpoints where they were.

use std::collections::BTreeMap;

use crate::cosmos::StartFrom;

use crate::operator::crd::RewindProgress;

/// The annotation that rewinds every lease to a position.
pub const REWIND_ANNOTATION: &str = "changefeed.io/rewind-to";
/// The annotation that restores the leases of an export held in a ConfigMap.
pub const RESTORE_ANNOTATION: &str = "changefeed.io/restore-from";

/// `status.rewind.phase` while the workers are stopped.
pub const STOPPING: &str = "Stopping";
/// `status.rewind.phase` once the checkpoints were moved (or moving them failed).
pub const DONE: &str = "Done";

/// What the annotations ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RewindRequest {
    /// Every lease to this position.
    To(StartFrom),
    /// The leases of the export in this ConfigMap (and key, when named).
    Restore {
        /// The ConfigMap's name.
        config_map: String,
        /// The key holding the export; `None`: its only key.
        key: Option<String>,
    },
}

impl RewindRequest {
    /// How `status.rewind.request` and `status.lastRewind.request` name it.
    pub fn describe(&self) -> String {
        match self {
            RewindRequest::To(StartFrom::Beginning) => "beginning".into(),
            RewindRequest::To(StartFrom::Now) => "now".into(),
            RewindRequest::To(StartFrom::Time(at)) => at
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
            RewindRequest::Restore { config_map, key } => match key {
                Some(key) => format!("configmap/{config_map}/{key}"),
                None => format!("configmap/{config_map}"),
            },
        }
    }
}

/// The rewind the annotations ask for (`None`: none); an error in words for values that mean
/// nothing.
pub fn request_of(annotations: &BTreeMap<String, String>) -> Option<Result<RewindRequest, String>> {
    let rewind = annotations.get(REWIND_ANNOTATION).map(|v| v.trim());
    let restore = annotations.get(RESTORE_ANNOTATION).map(|v| v.trim());
    Some(match (rewind, restore) {
        (None, None) => return None,
        (Some(_), Some(_)) => Err(format!(
            "both {REWIND_ANNOTATION} and {RESTORE_ANNOTATION} are set; set one of them"
        )),
        (Some(to), None) => to
            .parse::<StartFrom>()
            .map(RewindRequest::To)
            .map_err(|e| format!("annotation {REWIND_ANNOTATION}: {e}")),
        (None, Some(source)) => match source.split_once('/') {
            _ if source.is_empty() => Err(format!("annotation {RESTORE_ANNOTATION} must name a ConfigMap")),
            Some((name, key)) if !name.is_empty() && !key.is_empty() && !key.contains('/') => {
                Ok(RewindRequest::Restore {
                    config_map: name.into(),
                    key: Some(key.into()),
                })
            }
            Some(_) => Err(format!(
                "annotation {RESTORE_ANNOTATION} must be <ConfigMap> or <ConfigMap>/<key>, not {source:?}"
            )),
            None => Ok(RewindRequest::Restore {
                config_map: source.into(),
                key: None,
            }),
        },
    })
}

/// What is known when deciding.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// What the annotations ask for.
    pub request: Option<&'a Result<RewindRequest, String>>,
    /// The progress recorded in `status.rewind`.
    pub progress: Option<&'a RewindProgress>,
    /// The worker Deployment's replicas (`None`: no Deployment).
    pub replicas: Option<i32>,
    /// Worker pods that can still run (running, pending or terminating; not ended: an evicted
    /// pod stays `Failed` until pod garbage collection and runs no worker).
    pub pods: usize,
}

/// The next step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// No rewind: reconcile as usual.
    Idle,
    /// The annotation means nothing: say why, remove it, forget any progress.
    Reject(String),
    /// Record the request (when new) and scale the workers to 0.
    Stop(String),
    /// Worker pods still exist: look again shortly.
    Wait(usize),
    /// No worker runs: move the checkpoints and record how it ended.
    Move(RewindRequest),
    /// The checkpoints were moved (or that failed): remove the annotation.
    RemoveAnnotation,
    /// The annotation is gone after the move: record the result, restore the workers.
    Finish,
    /// The annotation was removed before anything moved: forget the rewind, restore the workers.
    Cancel,
}

/// The next step of a rewind.
pub fn next_step(observed: Observed<'_>) -> Step {
    let phase = observed.progress.map(|p| p.phase.as_str());
    match (observed.request, phase) {
        (None, None) => Step::Idle,
        (None, Some(DONE)) => Step::Finish,
        (None, Some(_)) => Step::Cancel,
        (Some(_), Some(DONE)) => Step::RemoveAnnotation,
        (Some(Err(reason)), _) => Step::Reject(reason.clone()),
        (Some(Ok(request)), None) => Step::Stop(request.describe()),
        (Some(Ok(request)), Some(_)) => match (observed.replicas, observed.pods) {
            (Some(replicas), _) if replicas != 0 => Step::Stop(request.describe()),
            (_, 0) => Step::Move(request.clone()),
            (_, pods) => Step::Wait(pods),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn progress(phase: &str) -> RewindProgress {
        RewindProgress {
            request: "beginning".into(),
            phase: phase.into(),
            started_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            succeeded: None,
            message: None,
            reason: None,
        }
    }

    #[test]
    fn annotations_table() {
        let at = time::macros::datetime!(2026-11-24 08:00:00 UTC);
        let restore = |name: &str, key: Option<&str>| {
            Ok(RewindRequest::Restore {
                config_map: name.into(),
                key: key.map(Into::into),
            })
        };
        type Case = (
            &'static [(&'static str, &'static str)],
            Option<Result<RewindRequest, &'static str>>,
        );
        let cases: Vec<Case> = vec![
            (&[], None),
            (&[("other", "x")], None),
            (
                &[(REWIND_ANNOTATION, "beginning")],
                Some(Ok(RewindRequest::To(StartFrom::Beginning))),
            ),
            (
                &[(REWIND_ANNOTATION, " Now ")],
                Some(Ok(RewindRequest::To(StartFrom::Now))),
            ),
            (
                &[(REWIND_ANNOTATION, "2026-11-24T08:00:00Z")],
                Some(Ok(RewindRequest::To(StartFrom::Time(at)))),
            ),
            (
                &[(REWIND_ANNOTATION, "yesterday")],
                Some(Err("expected beginning, now or an RFC 3339 time")),
            ),
            (&[(RESTORE_ANNOTATION, "backup")], Some(restore("backup", None))),
            (
                &[(RESTORE_ANNOTATION, "backup/monday.json")],
                Some(restore("backup", Some("monday.json"))),
            ),
            (
                &[(RESTORE_ANNOTATION, "a/b/c")],
                Some(Err("<ConfigMap> or <ConfigMap>/<key>")),
            ),
            (&[(RESTORE_ANNOTATION, "")], Some(Err("must name a ConfigMap"))),
            (
                &[(REWIND_ANNOTATION, "now"), (RESTORE_ANNOTATION, "b")],
                Some(Err("set one of them")),
            ),
        ];
        for (annotations, want) in cases {
            let map = annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            match (request_of(&map), want) {
                (None, None) => {}
                (Some(Ok(got)), Some(Ok(want))) => assert_eq!(got, want, "{annotations:?}"),
                (Some(Err(got)), Some(Err(part))) => assert!(got.contains(part), "{annotations:?}: {got}"),
                (got, want) => panic!("{annotations:?}: got {got:?}, want {want:?}"),
            }
        }
        assert_eq!(
            RewindRequest::To(StartFrom::Time(at)).describe(),
            "2026-11-24T08:00:00Z"
        );
        assert_eq!(restore("b", Some("k")).unwrap().describe(), "configmap/b/k");
    }

    #[test]
    fn steps_table() {
        let beginning = Ok(RewindRequest::To(StartFrom::Beginning));
        let bad = Err("annotation changefeed.io/rewind-to: bad".to_owned());
        let (stopping, done) = (progress(STOPPING), progress(DONE));
        // (request, progress, Deployment replicas, pods) → step
        let cases = [
            (None, None, Some(3), 3, Step::Idle),
            (Some(&beginning), None, Some(3), 3, Step::Stop("beginning".into())),
            (Some(&beginning), None, None, 0, Step::Stop("beginning".into())),
            // Someone scaled the workers up again meanwhile: down again.
            (
                Some(&beginning),
                Some(&stopping),
                Some(2),
                2,
                Step::Stop("beginning".into()),
            ),
            (Some(&beginning), Some(&stopping), Some(0), 2, Step::Wait(2)),
            (
                Some(&beginning),
                Some(&stopping),
                Some(0),
                0,
                Step::Move(RewindRequest::To(StartFrom::Beginning)),
            ),
            (
                Some(&beginning),
                Some(&stopping),
                None,
                0,
                Step::Move(RewindRequest::To(StartFrom::Beginning)),
            ),
            // Moved (or failed): the annotation goes, then the result is recorded.
            (Some(&beginning), Some(&done), Some(0), 0, Step::RemoveAnnotation),
            (Some(&bad), Some(&done), Some(0), 0, Step::RemoveAnnotation),
            (None, Some(&done), Some(0), 0, Step::Finish),
            // The annotation removed before anything moved: cancelled.
            (None, Some(&stopping), Some(0), 1, Step::Cancel),
            (
                Some(&bad),
                None,
                Some(3),
                3,
                Step::Reject("annotation changefeed.io/rewind-to: bad".into()),
            ),
            (
                Some(&bad),
                Some(&stopping),
                Some(0),
                0,
                Step::Reject("annotation changefeed.io/rewind-to: bad".into()),
            ),
        ];
        for (request, progress, replicas, pods, want) in cases {
            let observed = Observed {
                request,
                progress,
                replicas,
                pods,
            };
            assert_eq!(next_step(observed), want, "{observed:?}");
        }
    }
}
