//! Whether a new estimate is news to the reconciler (pure): with built-in autoscaling every
//! estimate is (the policy's stabilization window moves with time); otherwise only one whose
//! reported figures differ from the previous one's, or whose failure differs — a steady
//! processor's estimates then cost the API server nothing.

use std::collections::BTreeMap;

use crate::operator::scaling::estimate_report::EstimateFailure;
use crate::operator::status::coarse_age;
use crate::processor::ProcessorEstimate;

/// What of an estimate the status and conditions show.
#[derive(Debug, PartialEq, Eq)]
struct Shown {
    total_lag: u64,
    leases: usize,
    leases_with_lag: usize,
    leases_failed: usize,
    owners: BTreeMap<String, usize>,
    handler_failing: Vec<(String, String)>,
    stalled: Vec<(String, String)>,
    /// As the status rounds it.
    oldest_pending: Option<u64>,
}

fn shown(estimate: &ProcessorEstimate) -> Shown {
    let mut owners = BTreeMap::new();
    for owner in estimate.leases.iter().filter_map(|l| l.owner.clone()) {
        *owners.entry(owner).or_default() += 1;
    }
    Shown {
        total_lag: estimate.total_lag,
        leases: estimate.lease_count,
        leases_with_lag: estimate.leases_with_lag,
        leases_failed: estimate.leases_failed,
        owners,
        handler_failing: estimate
            .leases
            .iter()
            .filter_map(|l| Some((l.lease_token.clone(), l.handler_failing.clone()?)))
            .collect(),
        stalled: estimate
            .leases
            .iter()
            .filter_map(|l| Some((l.lease_token.clone(), l.stalled.clone()?)))
            .collect(),
        oldest_pending: estimate.oldest_pending_seconds.map(coarse_age),
    }
}

/// Whether the estimate `now` asks for a reconciliation, after `previous` (none yet: it does).
pub fn is_news(
    previous: Option<&Result<ProcessorEstimate, EstimateFailure>>,
    now: &Result<ProcessorEstimate, EstimateFailure>,
    autoscaled: bool,
) -> bool {
    match (previous, now) {
        _ if autoscaled => true,
        (Some(Ok(before)), Ok(now)) => shown(before) != shown(now),
        (Some(Err(before)), Err(now)) => before != now,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cosmos::EpkRange;
    use crate::processor::LeaseEstimate;

    fn estimate(lag: u64, owner: Option<&str>, age: u64) -> ProcessorEstimate {
        let lease = LeaseEstimate {
            lease_token: "-FF".into(),
            feed_range: EpkRange::full(),
            owner: owner.map(str::to_owned),
            lag,
            checkpoint_age: Some(age),
            started: true,
            handler_failing: None,
            stalled: None,
            error: None,
            reads: 0,
            oldest_pending_seconds: None,
            handled_per_second: None,
            read_units_per_document: None,
            partition_writes_per_second: None,
            worker_handled_per_second: None,
        };
        ProcessorEstimate::new("p", vec![lease])
    }

    fn failure(message: &str) -> EstimateFailure {
        EstimateFailure {
            reason: "timeout",
            message: message.into(),
            setup: None,
        }
    }

    #[test]
    fn only_what_the_status_shows_makes_an_estimate_news() {
        let ok = |lag, owner, age| Ok(estimate(lag, owner, age));
        let cases = [
            ("first estimate", None, ok(0, Some("w"), 1), false, true),
            (
                "same figures, older checkpoint",
                Some(ok(0, Some("w"), 1)),
                ok(0, Some("w"), 9),
                false,
                false,
            ),
            (
                "lag changed",
                Some(ok(0, Some("w"), 1)),
                ok(5, Some("w"), 1),
                false,
                true,
            ),
            (
                "owner changed",
                Some(ok(0, Some("w"), 1)),
                ok(0, Some("v"), 1),
                false,
                true,
            ),
            (
                "autoscaled: always",
                Some(ok(0, Some("w"), 1)),
                ok(0, Some("w"), 1),
                true,
                true,
            ),
            ("failed now", Some(ok(0, Some("w"), 1)), Err(failure("a")), false, true),
            (
                "the same failure",
                Some(Err(failure("a"))),
                Err(failure("a")),
                false,
                false,
            ),
            (
                "another failure",
                Some(Err(failure("a"))),
                Err(failure("b")),
                false,
                true,
            ),
            ("works again", Some(Err(failure("a"))), ok(0, None, 1), false, true),
        ];
        for (what, previous, now, autoscaled, expected) in cases {
            assert_eq!(is_news(previous.as_ref(), &now, autoscaled), expected, "{what}");
        }
    }
}
