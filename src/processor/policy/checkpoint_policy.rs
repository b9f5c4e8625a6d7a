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
        // Every batch (the default) also writes a position an empty page moved.
        let by_count = self.policy.every_batches <= 1 || self.batches >= self.policy.every_batches;
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
        let mut deferred = Deferred::new(every(5, None), t0);
        deferred.record("\"7\"".into(), true);
        assert_eq!(deferred.pending(), Some("\"7\""), "a release writes what is pending");
        deferred.written(t0);
        assert!(!deferred.is_pending());
    }
}
