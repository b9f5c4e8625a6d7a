//! Estimating from the workers' lag reports (`autoscaling.estimation: WorkerReports`): each
//! owner writes its lease's lag into the lease at every checkpoint
//! ([`lag_report`](crate::processor::lag_report)), so while workers run an estimate is one listing
//! of the lease container. The change feed is read (as `cfp estimate` does) only for a lease
//! that [`source`] says cannot be told from its report: nobody owns it, it has no report, it is
//! narrower than its partition and not caught up, its owner reported lag but its checkpoint has
//! not moved for [`stale_after`] (a stuck or slow owner), or this operator has not read it for
//! [`VERIFY_EVERY`] (so that a report that went wrong unseen is corrected within that). Ages are
//! judged on this operator's monotonic clock, from when it saw a lease's checkpoint change — no
//! worker's clock is trusted.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use time::OffsetDateTime;

use crate::cosmos::{CosmosError, MonitoredContainer, StartFrom};
use crate::processor::estimator::{DEFAULT_CONCURRENCY, covers_whole_partitions, estimated, lease_estimate};
use crate::processor::lag_report::reported_lag;
use crate::processor::{Lease, LeaseEstimate, estimate_leases};

/// Every lease is read at least this often, whatever its reports say.
pub const VERIFY_EVERY: Duration = Duration::from_secs(30 * 60);

/// A report of lag whose checkpoint has not moved for this long (per estimate `interval`: three
/// of them, at least a minute) is not trusted: the lease is read.
pub fn stale_after(interval: Duration) -> Duration {
    (interval * 3).max(Duration::from_secs(60))
}

/// How one lease's lag is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// From its owner's report: this lag.
    Reported(u64),
    /// By reading its change feed.
    Read,
}

/// What this operator saw of one lease, on its own clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The checkpoint last seen.
    pub continuation: Option<String>,
    /// Since when that checkpoint is seen unchanged.
    pub since: Instant,
    /// When its change feed was last read (for a lease never read: spread over
    /// [`VERIFY_EVERY`] by its id, so that verifications do not all fall on one estimate).
    pub read_at: Instant,
}

/// How `lease` is estimated (`whole`: it covers whole physical partitions), given what was
/// `seen` of it, at `now`.
pub fn source(lease: &Lease, whole: bool, seen: &Seen, now: Instant, stale_after: Duration) -> Source {
    if lease.owner.as_deref().is_none_or(str::is_empty) {
        return Source::Read;
    }
    let Some(lag) = reported_lag(lease) else {
        return Source::Read;
    };
    if now.saturating_duration_since(seen.read_at) >= VERIFY_EVERY {
        return Source::Read;
    }
    if lag == 0 {
        // Caught up: exact for any width.
        return Source::Reported(0);
    }
    if !whole || now.saturating_duration_since(seen.since) >= stale_after {
        return Source::Read;
    }
    Source::Reported(lag)
}

/// What this operator remembers of a processor's leases between estimates.
#[derive(Debug, Default)]
pub struct ReportMemory {
    seen: HashMap<String, Seen>,
}

impl ReportMemory {
    /// Records the checkpoints of `leases` at `now` and forgets leases that are gone.
    pub fn observe(&mut self, leases: &[Lease], now: Instant) {
        self.seen.retain(|id, _| leases.iter().any(|l| &l.id == id));
        for lease in leases {
            let entry = self.seen.entry(lease.id.clone()).or_insert_with(|| Seen {
                continuation: lease.continuation.clone(),
                since: now,
                read_at: now.checked_sub(spread(&lease.id)).unwrap_or(now),
            });
            if entry.continuation != lease.continuation {
                entry.continuation = lease.continuation.clone();
                entry.since = now;
            }
        }
    }

    /// What was seen of lease `id` (after [`observe`](Self::observe)).
    pub fn seen(&self, id: &str) -> Option<&Seen> {
        self.seen.get(id)
    }

    /// Records that lease `id` was read at `at`.
    pub fn read(&mut self, id: &str, at: Instant) {
        if let Some(seen) = self.seen.get_mut(id) {
            seen.read_at = at;
        }
    }
}

/// A share of [`VERIFY_EVERY`] picked by `id`.
fn spread(id: &str) -> Duration {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut hasher);
    Duration::from_secs(hasher.finish() % VERIFY_EVERY.as_secs())
}

/// Estimates `leases`: from their owners' reports where [`source`] allows, else by reading
/// their change feed (leases without a checkpoint count from `start`).
pub async fn estimate_reported(
    monitored: &MonitoredContainer,
    leases: &[Lease],
    start: StartFrom,
    memory: &mut ReportMemory,
    stale_after: Duration,
) -> Result<Vec<LeaseEstimate>, CosmosError> {
    let leases = estimated(leases);
    let now = Instant::now();
    memory.observe(&leases, now);
    let ranges = monitored.feed_ranges(false).await?;
    let wall = OffsetDateTime::now_utc();
    let mut reported = Vec::new();
    let mut to_read = Vec::new();
    for lease in leases {
        let whole = lease.range().is_some_and(|r| covers_whole_partitions(&ranges, r));
        let decided = memory
            .seen(&lease.id)
            .map_or(Source::Read, |seen| source(&lease, whole, seen, now, stale_after));
        match decided {
            Source::Reported(lag) => reported.push(lease_estimate(&lease, lag, wall)),
            Source::Read => to_read.push(lease),
        }
    }
    let mut read = if to_read.is_empty() {
        Vec::new()
    } else {
        estimate_leases(monitored, &to_read, start, DEFAULT_CONCURRENCY).await?
    };
    for lease in &to_read {
        memory.read(&lease.id, now);
    }
    read.extend(reported);
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cosmos::EpkRange;
    use crate::processor::lag_report::record_report;

    fn lease(owner: Option<&str>, checkpoint: Option<u64>, report: Option<u64>) -> Lease {
        let mut lease = Lease::new("p", &EpkRange::full(), checkpoint.map(|c| format!("\"{c}\"")));
        lease.owner = owner.map(str::to_owned);
        record_report(&mut lease, report);
        lease
    }

    #[test]
    fn a_lease_is_read_only_when_its_report_cannot_tell() {
        let now = Instant::now() + Duration::from_secs(3600);
        let ago = |s: u64| now - Duration::from_secs(s);
        let seen = |since: u64, read: u64| Seen {
            continuation: None,
            since: ago(since),
            read_at: ago(read),
        };
        let stale = Duration::from_secs(60);
        let owned = Some("w1");
        let cases = [
            // (lease, whole partition, seen, expected)
            (
                lease(owned, Some(400), Some(500)),
                true,
                seen(10, 10),
                Source::Reported(100),
            ),
            (
                lease(owned, Some(400), Some(400)),
                true,
                seen(10, 10),
                Source::Reported(0),
            ),
            // Caught up is exact for a sub-range too; lag of a sub-range is not.
            (
                lease(owned, Some(400), Some(400)),
                false,
                seen(10, 10),
                Source::Reported(0),
            ),
            (lease(owned, Some(400), Some(500)), false, seen(10, 10), Source::Read),
            // Nobody owns it (scaled to zero, or its owner left): read.
            (lease(None, Some(400), Some(400)), true, seen(10, 10), Source::Read),
            (lease(Some(""), Some(400), Some(400)), true, seen(10, 10), Source::Read),
            // No report (an older worker, a manual checkpoint) or no checkpoint: read.
            (lease(owned, Some(400), None), true, seen(10, 10), Source::Read),
            (lease(owned, None, Some(400)), true, seen(10, 10), Source::Read),
            // Lag reported, checkpoint unmoved for the stale bound: read; caught up stays trusted.
            (lease(owned, Some(400), Some(500)), true, seen(60, 10), Source::Read),
            (
                lease(owned, Some(400), Some(400)),
                true,
                seen(600, 10),
                Source::Reported(0),
            ),
            // Not read for VERIFY_EVERY: read, whatever the report.
            (lease(owned, Some(400), Some(400)), true, seen(10, 1800), Source::Read),
        ];
        for (n, (lease, whole, seen, expected)) in cases.into_iter().enumerate() {
            assert_eq!(source(&lease, whole, &seen, now, stale), expected, "case {n}");
        }
    }

    #[test]
    fn the_memory_notes_moved_checkpoints_and_forgets_gone_leases() {
        let t0 = Instant::now() + Duration::from_secs(3600);
        let t1 = t0 + Duration::from_secs(30);
        let mut memory = ReportMemory::default();
        let (a, b) = (lease(Some("w"), Some(1), None), lease(Some("w"), Some(2), None));
        let b = Lease {
            id: "p..other".into(),
            ..b
        };
        memory.observe(&[a.clone(), b.clone()], t0);
        let first = memory.seen(&a.id).cloned().unwrap();
        assert!(first.since == t0 && first.read_at <= t0 && t0 - first.read_at < VERIFY_EVERY);
        let moved = lease(Some("w"), Some(5), None);
        memory.observe(std::slice::from_ref(&moved), t1);
        assert_eq!(memory.seen(&a.id).map(|s| s.since), Some(t1), "the checkpoint moved");
        assert!(memory.seen(&b.id).is_none(), "a lease gone is forgotten");
        memory.observe(&[moved], t1 + Duration::from_secs(5));
        assert_eq!(
            memory.seen(&a.id).map(|s| s.since),
            Some(t1),
            "unchanged: the same since"
        );
        memory.read(&a.id, t1);
        assert_eq!(memory.seen(&a.id).map(|s| s.read_at), Some(t1));
        assert_eq!(stale_after(Duration::from_secs(15)), Duration::from_secs(60));
        assert_eq!(stale_after(Duration::from_secs(60)), Duration::from_secs(180));
    }
}
