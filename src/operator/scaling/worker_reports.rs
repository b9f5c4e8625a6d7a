//! Estimating from the workers' lag reports (`autoscaling.estimation: WorkerReports`): each owner
//! writes its lease's lag into the lease at every checkpoint
//! ([`lag_report`](crate::processor::leases::lag_report)), so while workers run an estimate is one
//! listing of the lease container. The change feed is read (as `cfp estimate` does) only for a
//! lease that [`source`] says cannot be told from its report: nobody owns it, its owner is not
//! alive by this operator's own observation (neither its heartbeat nor the lease changed within the
//! lease expiration: a report of a dead owner is its last word, not the lease's state), it is
//! halted or stalled, it has no report, it is narrower than its partition and not caught up, its
//! owner reported lag but its checkpoint has not moved for [`stale_after`] (a stuck or slow owner),
//! or this operator has not read it for [`VERIFY_EVERY`] (so that a report that went wrong unseen
//! is corrected within that). Ages are judged on this operator's monotonic clock, from when it saw
//! a lease's checkpoint change — no worker's clock is trusted.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use time::OffsetDateTime;

use crate::cosmos::{CosmosError, MonitoredContainer, StartFrom};
use crate::processor::leases::lag_report::reported_lag;
use crate::processor::leases::lease::{HANDLER_FAILING_PROPERTY, LeaseSnapshot, STALLED_PROPERTY};
use crate::processor::report::estimator::{DEFAULT_CONCURRENCY, covers_whole_partitions, estimated, lease_estimate};
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
    /// The lease document's ETag last seen.
    pub etag: String,
    /// When the document was seen to change (any write: a renewal, a checkpoint); `None` while
    /// it has not changed since this operator first saw it.
    pub written: Option<Instant>,
    /// When its change feed was last read (for a lease never read: spread over
    /// [`VERIFY_EVERY`] by its id, so that verifications do not all fall on one estimate).
    pub read_at: Instant,
}

/// How `lease` is estimated (`whole`: it covers whole physical partitions; `owner_alive`: its
/// owner showed a sign of life within the lease expiration, as this operator saw it), given what
/// was `seen` of it, at `now`.
pub fn source(
    lease: &Lease,
    whole: bool,
    owner_alive: bool,
    seen: &Seen,
    now: Instant,
    stale_after: Duration,
) -> Source {
    if lease.owner.as_deref().is_none_or(str::is_empty) || !owner_alive {
        return Source::Read;
    }
    let Some(lag) = reported_lag(lease) else {
        return Source::Read;
    };
    let held = [HANDLER_FAILING_PROPERTY, STALLED_PROPERTY]
        .iter()
        .any(|p| lease.properties.contains_key(*p));
    if held {
        // A halted or stalled lease is not caught up whatever its last report said.
        return Source::Read;
    }
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

/// What this operator remembers of a processor's leases and instances between estimates.
#[derive(Debug, Default)]
pub struct ReportMemory {
    seen: HashMap<String, Seen>,
    /// Each instance's heartbeat as last seen, and when it was seen to change (`None` while it
    /// has not changed since first seen).
    beats: HashMap<String, (OffsetDateTime, Option<Instant>)>,
}

impl ReportMemory {
    /// Records the checkpoints and writes of `leases` at `now` and forgets leases that are gone.
    pub fn observe(&mut self, leases: &[Lease], now: Instant) {
        self.seen.retain(|id, _| leases.iter().any(|l| &l.id == id));
        for lease in leases {
            let entry = self.seen.entry(lease.id.clone()).or_insert_with(|| Seen {
                continuation: lease.continuation.clone(),
                since: now,
                etag: lease.etag.clone(),
                written: None,
                read_at: now.checked_sub(spread(&lease.id)).unwrap_or(now),
            });
            if entry.continuation != lease.continuation {
                entry.continuation = lease.continuation.clone();
                entry.since = now;
            }
            if entry.etag != lease.etag {
                entry.etag = lease.etag.clone();
                entry.written = Some(now);
            }
        }
    }

    /// Records the instances' heartbeats (name, beat) at `now`; forgets instances that are gone.
    pub fn observe_instances(&mut self, instances: &[(String, OffsetDateTime)], now: Instant) {
        self.beats.retain(|name, _| instances.iter().any(|(n, _)| n == name));
        for (name, beat) in instances {
            let entry = self.beats.entry(name.clone()).or_insert((*beat, None));
            if entry.0 != *beat {
                *entry = (*beat, Some(now));
            }
        }
    }

    /// Whether `lease`'s owner showed a sign of life within `expiration` before `now`, as this
    /// operator saw it: its heartbeat or the lease document changed. A first sight is no sign:
    /// a dead owner's documents look the same as a live one's until they fail to change.
    pub fn owner_alive(&self, lease: &Lease, expiration: Duration, now: Instant) -> bool {
        let recent = |at: Option<Instant>| at.is_some_and(|at| now.saturating_duration_since(at) < expiration);
        let beat = lease
            .owner
            .as_ref()
            .and_then(|owner| self.beats.get(owner))
            .and_then(|(_, changed)| *changed);
        recent(beat) || recent(self.seen.get(&lease.id).and_then(|s| s.written))
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

/// How long reports are trusted: a report of lag whose checkpoint has not moved for
/// `stale_after`, and any report of an owner with no sign of life for `expiration` (the
/// processor's lease expiration), are not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trust {
    /// See [`stale_after`].
    pub stale_after: Duration,
    /// The processor's lease expiration.
    pub expiration: Duration,
}

/// Estimates the leases of `snapshot`: from their owners' reports where [`source`] allows, else
/// by reading their change feed (leases without a checkpoint count from `start`).
pub async fn estimate_reported(
    monitored: &MonitoredContainer,
    snapshot: &LeaseSnapshot,
    start: StartFrom,
    memory: &mut ReportMemory,
    trust: Trust,
) -> Result<Vec<LeaseEstimate>, CosmosError> {
    let leases = estimated(&snapshot.leases);
    let now = Instant::now();
    memory.observe(&leases, now);
    memory.observe_instances(&snapshot.instances, now);
    let ranges = monitored.feed_ranges(false).await?;
    let wall = OffsetDateTime::now_utc();
    let mut reported = Vec::new();
    let mut to_read = Vec::new();
    for lease in leases {
        let whole = lease.range().is_some_and(|r| covers_whole_partitions(&ranges, r));
        let alive = memory.owner_alive(&lease, trust.expiration, now);
        let decided = memory.seen(&lease.id).map_or(Source::Read, |seen| {
            source(&lease, whole, alive, seen, now, trust.stale_after)
        });
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
    use crate::processor::leases::lag_report::{LagReport, record_report};

    fn lease(owner: Option<&str>, checkpoint: Option<u64>, report: Option<u64>) -> Lease {
        let mut lease = Lease::new("p", &EpkRange::full(), checkpoint.map(|c| format!("\"{c}\"")));
        lease.owner = owner.map(str::to_owned);
        record_report(
            &mut lease,
            report.map(|latest_lsn| LagReport {
                latest_lsn,
                newest_ts: None,
            }),
        );
        lease
    }

    #[test]
    fn a_lease_is_read_only_when_its_report_cannot_tell() {
        let now = Instant::now() + Duration::from_secs(3600);
        let ago = |s: u64| now - Duration::from_secs(s);
        let seen = |since: u64, read: u64| Seen {
            continuation: None,
            since: ago(since),
            etag: String::new(),
            written: None,
            read_at: ago(read),
        };
        let held = |property: &str| {
            let mut lease = lease(Some("w1"), Some(400), Some(400));
            lease.properties.insert(property.to_owned(), "{}".to_owned());
            lease
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
            // Halted or stalled: not caught up, whatever the last report said.
            (held(HANDLER_FAILING_PROPERTY), true, seen(10, 10), Source::Read),
            (held(STALLED_PROPERTY), true, seen(10, 10), Source::Read),
        ];
        for (n, (lease, whole, seen, expected)) in cases.into_iter().enumerate() {
            assert_eq!(source(&lease, whole, true, &seen, now, stale), expected, "case {n}");
            // An owner with no sign of life: its report is its last word, not the lease's state.
            assert_eq!(
                source(&lease, whole, false, &seen, now, stale),
                Source::Read,
                "case {n}, owner dead"
            );
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

    #[test]
    fn an_owner_is_alive_only_while_its_heartbeat_or_lease_is_seen_changing() {
        let t0 = Instant::now() + Duration::from_secs(3600);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let expiration = Duration::from_secs(60);
        let beat = |s: i64| OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(s);
        let mut memory = ReportMemory::default();
        let mut owned = lease(Some("w"), Some(1), Some(1));
        owned.etag = "e1".into();
        memory.observe(std::slice::from_ref(&owned), t0);
        memory.observe_instances(&[("w".to_owned(), beat(1))], t0);
        assert!(
            !memory.owner_alive(&owned, expiration, t0),
            "a first sight is no sign of life"
        );
        memory.observe_instances(&[("w".to_owned(), beat(2))], at(17));
        assert!(memory.owner_alive(&owned, expiration, at(17)), "the heartbeat beat");
        assert!(memory.owner_alive(&owned, expiration, at(76)));
        memory.observe_instances(&[("w".to_owned(), beat(2))], at(77));
        assert!(
            !memory.owner_alive(&owned, expiration, at(77)),
            "silent for the expiration"
        );
        // An owner without a heartbeat (an older worker) that renews its lease is alive too.
        owned.etag = "e2".into();
        memory.observe(std::slice::from_ref(&owned), at(80));
        memory.observe_instances(&[], at(80));
        assert!(memory.owner_alive(&owned, expiration, at(80)), "the lease was written");
        assert!(!memory.owner_alive(&owned, expiration, at(140)));
    }
}
