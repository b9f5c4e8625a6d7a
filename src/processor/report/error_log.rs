//! Which repeated errors reach the log: the first of a kind (per lease), then at most one a
//! minute with how often it repeated — an outage must not write a warning per lease per second.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a kind of error stays quiet in the log after it was logged.
pub const QUIET_FOR: Duration = Duration::from_secs(60);

/// Entries kept before the quiet ones are dropped (leases come and go over a long run).
const MAX_ENTRIES: usize = 1024;

/// Errors seen, by (lease, kind): repeats since last logged, and when that was.
#[derive(Debug, Default)]
pub struct ErrorLog {
    seen: HashMap<(Option<String>, String), (u64, Instant)>,
}

impl ErrorLog {
    /// Records an error of `kind` (for example `renew failed`) on `lease`; `Some(repeats)` when it
    /// is to be logged now, with how many of the same were not logged since the last time.
    pub fn record(&mut self, lease: Option<&str>, kind: &str, now: Instant) -> Option<u64> {
        let key = (lease.map(str::to_owned), kind.to_owned());
        match self.seen.get_mut(&key) {
            Some((repeats, last)) if now.saturating_duration_since(*last) < QUIET_FOR => {
                *repeats += 1;
                None
            }
            Some((repeats, last)) => {
                let skipped = *repeats;
                *repeats = 0;
                *last = now;
                Some(skipped)
            }
            None => {
                if self.seen.len() >= MAX_ENTRIES {
                    // What has been quiet for a whole period would be logged anew anyway.
                    self.seen
                        .retain(|_, (_, last)| now.saturating_duration_since(*last) < QUIET_FOR);
                }
                self.seen.insert(key, (0, now));
                Some(0)
            }
        }
    }

    /// How many (lease, kind) entries are kept.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether no error was recorded (or all were dropped).
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// How a refused credential is logged (once for every lease and request kind).
pub const REFUSED_CREDENTIAL: &str = "the account refused this worker's key or token (rotated? the operator rolls the workers onto a changed Secret; with Entra ID check the identity's data-plane role)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_then_once_a_minute_per_lease_and_kind() {
        let mut log = ErrorLog::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(log.record(Some("a"), "renew failed", at(0)), Some(0));
        assert_eq!(log.record(Some("a"), "renew failed", at(1)), None);
        assert_eq!(log.record(Some("b"), "renew failed", at(1)), Some(0), "another lease");
        assert_eq!(
            log.record(Some("a"), "checkpoint failed", at(2)),
            Some(0),
            "another kind"
        );
        assert_eq!(log.record(Some("a"), "renew failed", at(30)), None);
        assert_eq!(
            log.record(Some("a"), "renew failed", at(61)),
            Some(2),
            "two were not logged"
        );
    }

    #[test]
    fn a_long_run_of_failures_keeps_the_log_bounded() {
        let mut log = ErrorLog::default();
        let t0 = Instant::now();
        // A flaky handler over days: every batch and attempt fails once, on a few leases.
        for n in 0..20_000u64 {
            log.record(
                Some(["a", "b", "c"][n as usize % 3]),
                "handler failed",
                t0 + Duration::from_secs(n),
            );
        }
        assert_eq!(log.len(), 3, "one entry per lease and kind");
        // Leases come and go (splits, rebalancing): entries quiet for a period are dropped.
        for n in 0..5_000u64 {
            log.record(
                Some(&format!("lease-{n}")),
                "renew failed",
                t0 + Duration::from_secs(30_000 + n * 61),
            );
        }
        assert!(log.len() <= MAX_ENTRIES, "{} entries", log.len());
    }
}
