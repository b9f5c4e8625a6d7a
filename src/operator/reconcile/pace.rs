//! What keeps the reconciler's cost growing with change, not with the number of resources
//! (pure): which changes of a resource are worth a reconciliation ([`semantic_hash`]: not its
//! status, which the operator writes itself), whether the workload must be applied again
//! ([`needs_apply`]), when a new estimate's time is worth a status write ([`estimate_time`]),
//! and how long to wait after failures ([`retry_after`]).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::operator::crd::ChangeFeedProcessor;

/// A new estimate of the same figures refreshes `status.lastEstimateTime` only this often.
pub const ESTIMATE_TIME_REFRESH: Duration = Duration::from_secs(600);

/// The first retry after a failed reconciliation; doubled per failure in a row.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between retries.
const LONGEST_RETRY: Duration = Duration::from_secs(300);

/// What of a resource asks for a reconciliation: its generation (the spec), labels,
/// annotations (the pause), finalizers and deletion — not its status.
pub fn semantic_hash(cfp: &ChangeFeedProcessor) -> Option<u64> {
    let meta = &cfp.metadata;
    let mut hasher = DefaultHasher::new();
    meta.generation.hash(&mut hasher);
    meta.labels.hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    meta.finalizers.hash(&mut hasher);
    meta.deletion_timestamp.is_some().hash(&mut hasher);
    Some(hasher.finish())
}

/// The next reconciliation of a resource: after `requeue` (what its status asks for), or sooner
/// when Secrets are not watched and must be re-read at least every `secrets_recheck`.
pub fn requeue_within(requeue: Duration, secrets_recheck: Option<Duration>) -> Duration {
    secrets_recheck.map_or(requeue, |recheck| requeue.min(recheck))
}

/// How long to wait before retrying after `failures` failed reconciliations in a row (1 s,
/// doubling, at most 5 min).
pub fn retry_after(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST_RETRY.saturating_mul(1 << doublings).min(LONGEST_RETRY)
}

/// What this operator last applied for a resource: the digest of the rendered objects and the
/// Deployment's generation that apply left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The digest of the rendered Deployment, Service and PodDisruptionBudget.
    pub digest: String,
    /// The Deployment's `metadata.generation` after the apply.
    pub generation: Option<i64>,
}

/// Whether the workload must be applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyNeed {
    /// Apply: nothing was applied by this operator yet, the rendered objects changed, or the
    /// Deployment changed since (someone edited it, or it is gone).
    Apply,
    /// What was applied last is in place.
    UpToDate,
    /// The same was applied last, and the watch cache has not seen that apply yet: the
    /// Deployment is as applied (its replicas those rendered), whatever the cache says.
    CacheBehind,
}

/// Whether the workload rendered as `rendered` must be applied, given the Deployment's
/// generation in the cache and what this operator `remembered` applying.
pub fn needs_apply(rendered: &str, observed_generation: Option<i64>, remembered: Option<&Applied>) -> ApplyNeed {
    let (Some(applied), Some(observed)) = (remembered, observed_generation) else {
        return ApplyNeed::Apply;
    };
    match applied.generation {
        _ if applied.digest != rendered => ApplyNeed::Apply,
        Some(generation) if observed == generation => ApplyNeed::UpToDate,
        Some(generation) if observed < generation => ApplyNeed::CacheBehind,
        _ => ApplyNeed::Apply,
    }
}

/// The digest of rendered objects (their JSON).
pub fn digest(objects: &[serde_json::Value]) -> String {
    let mut hasher = DefaultHasher::new();
    for object in objects {
        object.to_string().hash(&mut hasher);
    }
    format!("{:016x}", hasher.finish())
}

/// The `lastEstimateTime` to report: the new estimate's `time` when the status changes anyway
/// (`figures_changed`, or anything else) or the previous time is older than
/// [`ESTIMATE_TIME_REFRESH`]; else the previous one — a new time alone is no status write.
pub fn estimate_time(previous: Option<&Time>, time: &Time, changed: bool) -> Time {
    let Some(previous) = previous else {
        return time.clone();
    };
    let age = time.0.duration_since(previous.0);
    let fresh = age.as_secs() >= 0 && (age.as_secs() as u64) < ESTIMATE_TIME_REFRESH.as_secs();
    if changed || !fresh {
        time.clone()
    } else {
        previous.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_secret_watch_a_resource_is_reconciled_at_least_every_recheck() {
        let s = Duration::from_secs;
        // (the status's requeue, the recheck interval, the next reconciliation)
        for (requeue, recheck, next) in [
            (s(300), None, s(300)),
            (s(300), Some(s(60)), s(60)),
            (s(30), Some(s(60)), s(30)),
        ] {
            assert_eq!(requeue_within(requeue, recheck), next);
        }
    }
    use crate::operator::crd::ChangeFeedProcessorSpec;
    use crate::operator::crd::ChangeFeedProcessorStatus;

    fn resource() -> ChangeFeedProcessor {
        let spec: ChangeFeedProcessorSpec = serde_json::from_value(serde_json::json!({
            "connection": {"endpoint": "https://a.documents.azure.com/", "keySecretRef": {"name": "cosmos"}},
            "monitored": {"database": "db", "container": "c"},
        }))
        .unwrap();
        let mut cfp = ChangeFeedProcessor::new("p", spec);
        cfp.metadata.generation = Some(1);
        cfp
    }

    #[test]
    fn the_status_is_no_reason_to_reconcile_and_the_rest_is() {
        let base = resource();
        let same = semantic_hash(&base);
        let mut status = base.clone();
        status.status = Some(ChangeFeedProcessorStatus {
            estimated_lag: Some(5),
            ..Default::default()
        });
        status.metadata.resource_version = Some("42".into());
        assert_eq!(semantic_hash(&status), same, "a status write (and its resourceVersion)");
        type Change = fn(&mut ChangeFeedProcessor);
        let changes: Vec<(&str, Change)> = vec![
            ("spec (generation)", |c| c.metadata.generation = Some(2)),
            ("pause annotation", |c| {
                c.metadata.annotations = Some([("changefeed.io/paused".to_owned(), "true".to_owned())].into())
            }),
            ("finalizer", |c| c.metadata.finalizers = Some(vec!["x".into()])),
            ("deletion", |c| {
                c.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(1).unwrap()))
            }),
            ("labels", |c| {
                c.metadata.labels = Some([("a".to_owned(), "b".to_owned())].into())
            }),
        ];
        for (what, change) in changes {
            let mut changed = base.clone();
            change(&mut changed);
            assert_ne!(semantic_hash(&changed), same, "{what}");
        }
    }

    #[test]
    fn retries_back_off_exponentially_up_to_five_minutes() {
        let cases = [(0, 1), (1, 1), (2, 2), (3, 4), (5, 16), (9, 256), (10, 300), (50, 300)];
        for (failures, seconds) in cases {
            assert_eq!(retry_after(failures), Duration::from_secs(seconds), "{failures}");
        }
    }

    #[test]
    fn the_workload_is_applied_only_when_something_changed() {
        let applied = Applied {
            digest: "d1".into(),
            generation: Some(3),
        };
        let cases = [
            ("unchanged", "d1", Some(3), Some(&applied), ApplyNeed::UpToDate),
            ("rendered differently", "d2", Some(3), Some(&applied), ApplyNeed::Apply),
            (
                "the Deployment edited by someone",
                "d1",
                Some(4),
                Some(&applied),
                ApplyNeed::Apply,
            ),
            (
                "the cache has not seen the apply",
                "d1",
                Some(2),
                Some(&applied),
                ApplyNeed::CacheBehind,
            ),
            ("the Deployment gone", "d1", None, Some(&applied), ApplyNeed::Apply),
            ("never applied by this operator", "d1", Some(3), None, ApplyNeed::Apply),
        ];
        for (what, rendered, generation, remembered, expected) in cases {
            assert_eq!(needs_apply(rendered, generation, remembered), expected, "{what}");
        }
        let a = serde_json::json!({"a": 1});
        assert_eq!(digest(std::slice::from_ref(&a)), digest(&[serde_json::json!({"a": 1})]));
        assert_ne!(digest(&[a]), digest(&[serde_json::json!({"a": 2})]));
    }

    #[test]
    fn a_new_estimate_time_alone_writes_no_status_but_is_refreshed_every_ten_minutes() {
        let at = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap());
        let cases = [
            (None, 100, false, 100),
            (Some(at(100)), 115, false, 100),
            (Some(at(100)), 115, true, 115),
            (Some(at(100)), 699, false, 100),
            (Some(at(100)), 700, false, 700),
            // A previous time ahead of this operator's clock is not kept forever.
            (Some(at(5000)), 115, false, 115),
        ];
        for (previous, now, changed, expected) in cases {
            assert_eq!(
                estimate_time(previous.as_ref(), &at(now), changed),
                at(expected),
                "{previous:?} {now}"
            );
        }
    }
}
