//! The replication delay between the regions of an account, as the service shows it: a region
//! other than the one that took a write has it only `delay` later, and has the writes of each
//! partition in the order they were made (a consistent prefix), however many come.
//!
//! The SDK emulator's own delayed replication does neither: it applies each write on a task of
//! its own, at most ten per core at a time, so that under load a region falls further and
//! further behind, and out of order, so that a change feed reader of the region skips changes
//! it receives later below its continuation — what no region of the service does. So the store
//! replicates every write at once, and the edge shows each region the account as it would be
//! there: this module keeps the writes of the last `delay` (which region took them, when, their
//! LSN) and answers what a region does not have yet.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A write an account took, as the edge saw it answered.
#[derive(Debug, Clone, Copy)]
pub struct Write<'a> {
    /// The container, by its path (`dbs/db/colls/c`).
    pub container: &'a str,
    /// The physical partition (partition key range id) written.
    pub partition: &'a str,
    /// The LSN the write got.
    pub lsn: u64,
    /// The region that took it.
    pub region: &'a str,
    /// The id of the document it created, if it created one.
    pub created: Option<&'a str>,
}

/// When a write was taken, and where.
#[derive(Debug, Clone)]
struct Taken {
    at: Instant,
    region: String,
}

/// A document created within the delay.
#[derive(Debug, Clone)]
struct Created {
    taken: Taken,
    partition: String,
    lsn: u64,
}

/// The writes of the last `delay`.
#[derive(Debug, Default)]
struct Recent {
    /// By container and partition: LSN → where and when.
    writes: HashMap<(String, String), BTreeMap<u64, Taken>>,
    /// By container and document id.
    created: HashMap<(String, String), Created>,
}

/// How far each region is behind the writes of the others.
#[derive(Debug)]
pub struct Lag {
    delay: Duration,
    recent: Mutex<Recent>,
}

impl Lag {
    /// Regions that have each other's writes `delay` after they were taken (zero: at once).
    pub fn new(delay: Duration) -> Self {
        Self {
            delay,
            recent: Mutex::default(),
        }
    }

    /// Whether any region lags behind another (a delay, and writes to keep).
    pub fn is_active(&self) -> bool {
        !self.delay.is_zero()
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps `write`, taken at `at`, for the delay.
    pub fn record(&self, write: &Write<'_>, at: Instant) {
        if self.delay.is_zero() {
            return;
        }
        let taken = Taken {
            at,
            region: write.region.to_owned(),
        };
        let mut recent = self.recent();
        self.forget_before(&mut recent, at);
        if let Some(id) = write.created {
            let created = Created {
                taken: taken.clone(),
                partition: write.partition.to_owned(),
                lsn: write.lsn,
            };
            recent
                .created
                .insert((write.container.to_owned(), id.to_owned()), created);
        }
        recent
            .writes
            .entry((write.container.to_owned(), write.partition.to_owned()))
            .or_default()
            .insert(write.lsn, taken);
    }

    /// Drops what every region has by `now`.
    fn forget_before(&self, recent: &mut Recent, now: Instant) {
        let arrived = |taken: &Taken| taken.at + self.delay <= now;
        recent.writes.retain(|_, writes| {
            writes.retain(|_, taken| !arrived(taken));
            !writes.is_empty()
        });
        recent.created.retain(|_, created| !arrived(&created.taken));
    }

    /// The highest LSN of `partition` of `container` that `region` has at `now`: every one below
    /// the first write another region took within the delay; `None` when it has them all.
    pub fn visible_limit(&self, container: &str, partition: &str, region: &str, now: Instant) -> Option<u64> {
        let mut recent = self.recent();
        self.forget_before(&mut recent, now);
        let writes = recent.writes.get(&(container.to_owned(), partition.to_owned()))?;
        writes
            .iter()
            .find(|(_, taken)| taken.region != region)
            .map(|(lsn, _)| lsn.saturating_sub(1))
    }

    /// Whether document `id` of `container`, created by another region within the delay, has
    /// not reached `region` by `now` — for a reader whose session has seen up to `session_lsn`
    /// of its partition (by its session token), the service answers from a region that has it.
    pub fn hides(
        &self,
        container: &str,
        id: &str,
        region: &str,
        session_lsn: impl Fn(&str) -> Option<u64>,
        now: Instant,
    ) -> bool {
        let mut recent = self.recent();
        self.forget_before(&mut recent, now);
        recent
            .created
            .get(&(container.to_owned(), id.to_owned()))
            .is_some_and(|c| c.taken.region != region && session_lsn(&c.partition).is_none_or(|lsn| lsn < c.lsn))
    }

    /// Every region has every write from now on, as after the catch-up of a manual failover.
    pub fn settle(&self) {
        let mut recent = self.recent();
        recent.writes.clear();
        recent.created.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ITEMS: &str = "dbs/db/colls/items";

    fn write<'a>(lsn: u64, region: &'a str, created: Option<&'a str>) -> Write<'a> {
        Write {
            container: ITEMS,
            partition: "0",
            lsn,
            region,
            created,
        }
    }

    #[test]
    fn a_region_has_the_others_writes_after_the_delay_and_its_own_at_once() {
        let lag = Lag::new(Duration::from_secs(1));
        let t0 = Instant::now();
        lag.record(&write(7, "East US", Some("a")), t0);
        lag.record(&write(8, "East US", None), t0 + Duration::from_millis(500));
        let limit = |region, after_ms| lag.visible_limit(ITEMS, "0", region, t0 + Duration::from_millis(after_ms));
        assert_eq!(limit("East US", 0), None, "the region that took them");
        assert_eq!(
            limit("West US", 10),
            Some(6),
            "everything before the first write within the delay"
        );
        assert_eq!(limit("West US", 1000), Some(7), "the first arrived, the second not yet");
        assert_eq!(limit("West US", 1500), None, "both arrived");
        assert_eq!(lag.visible_limit(ITEMS, "1", "West US", t0), None, "another partition");
    }

    #[test]
    fn a_created_document_is_hidden_until_it_arrives_unless_the_session_has_seen_it() {
        let lag = Lag::new(Duration::from_secs(1));
        let t0 = Instant::now();
        lag.record(&write(7, "East US", Some("a")), t0);
        let none = |_: &str| None;
        assert!(lag.hides(ITEMS, "a", "West US", none, t0));
        assert!(!lag.hides(ITEMS, "a", "East US", none, t0));
        assert!(!lag.hides(ITEMS, "b", "West US", none, t0));
        assert!(!lag.hides(ITEMS, "a", "West US", |p: &str| (p == "0").then_some(7), t0));
        assert!(lag.hides(ITEMS, "a", "West US", |p: &str| (p == "0").then_some(6), t0));
        assert!(!lag.hides(ITEMS, "a", "West US", none, t0 + Duration::from_secs(1)));
    }

    #[test]
    fn settled_or_without_a_delay_every_region_has_everything() {
        let t0 = Instant::now();
        let lag = Lag::new(Duration::from_secs(1));
        lag.record(&write(7, "East US", Some("a")), t0);
        lag.settle();
        assert_eq!(lag.visible_limit(ITEMS, "0", "West US", t0), None);
        assert!(!lag.hides(ITEMS, "a", "West US", |_: &str| None, t0));
        let at_once = Lag::new(Duration::ZERO);
        at_once.record(&write(7, "East US", Some("a")), t0);
        assert_eq!(at_once.visible_limit(ITEMS, "0", "West US", t0), None);
    }
}
