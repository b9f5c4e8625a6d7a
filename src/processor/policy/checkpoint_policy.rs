//! When a lease's position is written: after every handled batch (the default), or after every
//! `batches` batches or `interval`, whichever comes first — fewer lease writes (request units) for
//! more redelivery after a crash. A released lease (shutdown, handoff) is always checkpointed.

use std::time::{Duration, Instant};

/// How often handled batches are checkpointed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointPolicy {
    /// Checkpoint after this many handled batches (at least 1).
    pub every_batches: u32,
    /// Checkpoint at the latest this long after the last checkpoint, when batches are pending.
    pub interval: Option<Duration>,
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        Self {
            every_batches: crate::processor::options::defaults::CHECKPOINT_EVERY_BATCHES,
            interval: None,
        }
    }
}

/// The position handled but not yet written, and what decides when to write it. Pure: time comes
/// in as an argument.
#[derive(Debug)]
pub struct Deferred {
    policy: CheckpointPolicy,
    pending: Option<String>,
    batches: u32,
    last_write: Instant,
}

impl Deferred {
    /// Nothing pending; the last write counts from `now`.
    pub fn new(policy: CheckpointPolicy, now: Instant) -> Self {
        Self {
            policy,
            pending: None,
            batches: 0,
            last_write: now,
        }
    }

    /// Records the position after a handled page (`batch`: it had documents).
    pub fn record(&mut self, continuation: String, batch: bool) {
        self.pending = Some(continuation);
        self.batches += u32::from(batch);
    }

    /// Whether a position is pending.
    pub fn is_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// The pending position, when the policy says to write it now.
    pub fn due(&self, now: Instant) -> Option<&str> {
        let pending = self.pending.as_deref()?;
        // A position only empty pages moved is not counted as a batch: it waits for the next
        // batch, the interval, a release, or the lease's caught-up report
        // ([`caught_up_report_due`]) — not one write per poll of a lease narrower than its
        // partition, whose position the other sub-ranges' writes move.
        let by_count = self.batches >= self.policy.every_batches.max(1);
        let by_time = self
            .policy
            .interval
            .is_some_and(|interval| now.saturating_duration_since(self.last_write) >= interval);
        (by_count || by_time).then_some(pending)
    }

    /// The pending position, whatever the policy (a release writes it).
    pub fn pending(&self) -> Option<&str> {
        self.pending.as_deref()
    }

    /// The pending position was written at `now`.
    pub fn written(&mut self, now: Instant) {
        self.pending = None;
        self.batches = 0;
        self.last_write = now;
    }
}

/// Empty pages in a row after which a quiet lease may report that it caught up.
pub const CAUGHT_UP_PAGES: u32 = 3;

/// Whether an empty page writes the lease's position with a report that it caught up: the lease
/// was quiet for [`CAUGHT_UP_PAGES`] pages and at least a `poll` interval (`quiet_for`, since its
/// last batch), and the report stored with its checkpoint (`stored_lag`) does not already say
/// so. One write per quiet spell; a lease with a batch every poll interval or more often writes
/// only its batches' checkpoints (the reference processors' cost), and the operator reads such a
/// lease's change feed when its report is not exact.
pub fn caught_up_report_due(quiet_pages: u32, quiet_for: Duration, poll: Duration, stored_lag: Option<u64>) -> bool {
    quiet_pages >= CAUGHT_UP_PAGES && quiet_for >= poll && stored_lag != Some(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let t0 = Instant::now();
        let every = |n: u32, interval: Option<u64>| CheckpointPolicy {
            every_batches: n,
            interval: interval.map(Duration::from_secs),
        };
        // (policy, batches recorded, seconds later, due)
        let cases = [
            ("default: every batch", every(1, None), 1, 0, true),
            ("every 10: after 3", every(10, None), 3, 1000, false),
            ("every 10: after 10", every(10, None), 10, 0, true),
            ("every 10 or 5 s: 3 batches, 6 s", every(10, Some(5)), 3, 6, true),
            ("every 10 or 5 s: 3 batches, 2 s", every(10, Some(5)), 3, 2, false),
            ("nothing pending", every(1, None), 0, 0, false),
        ];
        for (name, policy, batches, later, want) in cases {
            let mut deferred = Deferred::new(policy, t0);
            for i in 0..batches {
                deferred.record(format!("\"{i}\""), true);
            }
            let due = deferred.due(t0 + Duration::from_secs(later)).is_some();
            assert_eq!(due, want, "{name}");
        }
        let mut deferred = Deferred::new(every(1, None), t0);
        deferred.record("\"8\"".into(), false);
        assert_eq!(deferred.due(t0), None, "a position only an empty page moved waits");
        deferred.record("\"9\"".into(), true);
        assert_eq!(deferred.due(t0), Some("\"9\""), "until a batch follows");
        let mut timed = Deferred::new(every(1, Some(5)), t0);
        timed.record("\"8\"".into(), false);
        assert_eq!(
            timed.due(t0 + Duration::from_secs(6)),
            Some("\"8\""),
            "or the interval passed"
        );
        let mut deferred = Deferred::new(every(5, None), t0);
        deferred.record("\"7\"".into(), true);
        assert_eq!(deferred.pending(), Some("\"7\""), "a release writes what is pending");
        deferred.written(t0);
        assert!(!deferred.is_pending());
    }

    #[test]
    fn a_caught_up_report_is_due_once_per_quiet_spell() {
        let (s, ms) = (Duration::from_secs, Duration::from_millis);
        // (case, quiet pages, quiet for, poll, stored lag, due)
        let cases = [
            ("quiet long enough, lag stored", 3, s(5), s(5), Some(7), true),
            ("no report stored", 4, s(6), s(5), None, true),
            ("already reported caught up", 9, s(60), s(5), Some(0), false),
            (
                "between two batches of a trickle (pages)",
                2,
                s(9),
                s(5),
                Some(7),
                false,
            ),
            (
                "between two batches of a trickle (time)",
                5,
                ms(2100),
                s(5),
                Some(7),
                false,
            ),
            ("a short poll interval", 3, ms(700), ms(100), Some(1), true),
        ];
        for (case, pages, quiet_for, poll, stored, due) in cases {
            assert_eq!(caught_up_report_due(pages, quiet_for, poll, stored), due, "{case}");
        }
    }
}
