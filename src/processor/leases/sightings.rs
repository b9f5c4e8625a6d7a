//! What this instance has seen of the lease container, on its own monotonic clock: for every lease,
//! heartbeat and handoff request, the version it shows and since when this instance sees that
//! version. A lease (heartbeat, request) is expired when this instance has seen no change of it
//! for the lease expiration — never by comparing another machine's wall clock with ours, so clocks
//! that differ between nodes (by seconds or by minutes) change nothing. Pure: time comes in.
//!
//! The lease of an instance whose heartbeat keeps its leases alive
//! ([`crate::processor::leases::heartbeat`]) lives while either changes: it is expired only when
//! neither the lease nor its owner's heartbeat changed for the expiration.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::processor::leases::lease::{HANDOFF_REQUESTED_PROPERTY, HANDOFF_TO_PROPERTY, Lease, LeaseSnapshot};

/// What a sighting is of.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Seen {
    /// A lease, by id; its version is its ETag.
    Lease(String),
    /// An instance's heartbeat, by instance name; its version is the beat it wrote.
    Heartbeat(String),
    /// A handoff request on a lease, by lease id; its version is the requester, its time and the
    /// owner's latest acknowledgement.
    Request(String),
}

/// The versions this instance saw, and since when.
#[derive(Debug, Clone, Default)]
pub struct Sightings {
    seen: HashMap<Seen, (String, Instant)>,
    /// The instances whose heartbeat keeps their leases alive, as the last listing showed.
    keepers: HashSet<String>,
    /// When each listed instance's heartbeat was first seen (forgotten when it is not listed).
    arrived: HashMap<String, Instant>,
}

impl Sightings {
    /// Records what `snapshot`, listed at `at`, shows: a version not seen before starts its
    /// time now; whatever the listing no longer shows is forgotten.
    pub fn observe(&mut self, snapshot: &LeaseSnapshot, at: Instant) {
        let mut versions: Vec<(Seen, String)> = Vec::new();
        for lease in &snapshot.leases {
            versions.push((Seen::Lease(lease.id.clone()), lease_version(lease)));
            // An owner's acknowledgement, written anew while it drains, renews the request.
            if let Some((to, requested)) = lease.handoff_request() {
                let acknowledged = lease.handoff_acknowledged().unwrap_or_default();
                let version = format!("{to}@{requested}+{acknowledged}");
                versions.push((Seen::Request(lease.id.clone()), version));
            }
        }
        for (name, beat) in &snapshot.instances {
            versions.push((Seen::Heartbeat(name.clone()), beat.to_string()));
        }
        self.note_keepers(&snapshot.keepers);
        self.arrived = snapshot
            .instances
            .iter()
            .map(|(name, _)| (name.clone(), self.arrived.get(name).copied().unwrap_or(at)))
            .collect();
        self.record(versions, at);
    }

    /// Records a listing sent at `sent` whose answer came back at `returned`, and says as of
    /// when its silences are judged: as of `sent`. What it shows was read somewhere between the
    /// two, so a version it shows for the first time is dated `returned` (it may have been
    /// written that late), and one it shows unchanged is known unchanged only up to `sent` (the
    /// owner may have beaten right after the read): a slow listing (throttled pages, a
    /// CPU-throttled pod) never makes a live owner look silent for longer than it was.
    pub fn observe_listing(&mut self, snapshot: &LeaseSnapshot, sent: Instant, returned: Instant) -> Instant {
        self.observe(snapshot, returned);
        sent.min(returned)
    }

    /// How long `instance`'s heartbeat has been listed, as seen here (since the first listing of
    /// this instance that showed it); `None` when the last listing did not show it.
    pub fn known_for(&self, instance: &str, at: Instant) -> Option<Duration> {
        self.arrived
            .get(instance)
            .map(|since| at.saturating_duration_since(*since))
    }

    /// When `instance`'s heartbeat was first listed here (the first listing's time for those it
    /// showed); `None` when the last listing did not show it.
    pub fn arrival(&self, instance: &str) -> Option<Instant> {
        self.arrived.get(instance).copied()
    }

    /// Records which instances' heartbeats keep their leases alive (the latest listing's).
    pub fn note_keepers(&mut self, keepers: &[String]) {
        self.keepers = keepers.iter().cloned().collect();
    }

    /// Records `versions` seen at `at`, forgetting what they do not name.
    pub fn record(&mut self, versions: Vec<(Seen, String)>, at: Instant) {
        let mut next = HashMap::with_capacity(versions.len());
        for (key, version) in versions {
            let since = match self.seen.get(&key) {
                Some((known, since)) if *known == version => *since,
                _ => at,
            };
            next.insert(key, (version, since));
        }
        self.seen = next;
    }

    /// Records that `key` shows `version` since `since` (for tests that start from a history).
    #[cfg(test)]
    pub(crate) fn seen_since(&mut self, key: Seen, version: String, since: Instant) {
        self.seen.insert(key, (version, since));
    }

    /// Records that `instance`'s heartbeat was first listed at `since` (for tests).
    #[cfg(test)]
    pub(crate) fn arrived_at(&mut self, instance: &str, since: Instant) {
        self.arrived.insert(instance.to_owned(), since);
    }

    /// How long `key` has shown the same version, as seen here (zero when never seen).
    pub fn unchanged_for(&self, key: &Seen, at: Instant) -> Duration {
        self.seen
            .get(key)
            .map(|(_, since)| at.saturating_duration_since(*since))
            .unwrap_or_default()
    }

    /// Whether `instance`'s heartbeat keeps its leases alive (the last listing showed it with
    /// the liveness marker).
    pub fn keeps_leases(&self, instance: &str) -> bool {
        self.keepers.contains(instance)
    }

    /// How long `lease` has shown no sign of life, as seen here: no change of the lease, nor of
    /// its owner's heartbeat when that heartbeat keeps its leases alive.
    pub fn silent_for(&self, lease: &Lease, at: Instant) -> Duration {
        let own = self.unchanged_for(&Seen::Lease(lease.id.clone()), at);
        match lease.owner.as_deref() {
            Some(owner) if self.keeps_leases(owner) => {
                own.min(self.unchanged_for(&Seen::Heartbeat(owner.to_owned()), at))
            }
            _ => own,
        }
    }

    /// Whether `lease` is free to take at `at`: it has no owner, or this instance has seen no
    /// sign of life of it for `expiration` (its owner stopped renewing it, or stopped beating).
    pub fn is_expired(&self, lease: &Lease, at: Instant, expiration: Duration) -> bool {
        lease.owner.as_deref().is_none_or(str::is_empty) || self.silent_for(lease, at) >= expiration
    }
}

/// The version of a lease as its owner wrote it: what an owner writes (ownership, position,
/// times, its properties — an acknowledgement of a handoff among them), without the request
/// another instance wrote into it, nor the ETag and `_ts` that every write changes. A newcomer
/// asking a crashed owner for its leases is no sign of that owner's life.
fn lease_version(lease: &Lease) -> String {
    let owners: Vec<(&String, &String)> = lease
        .properties
        .iter()
        .filter(|(key, _)| !is_request_property(key))
        .collect();
    format!(
        "{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{owners:?}",
        lease.owner, lease.owner_epoch, lease.continuation, lease.timestamp, lease.checkpoint_time, lease.mode
    )
}

/// Whether `key` is a property that the instance asking for the lease writes, not its owner.
fn is_request_property(key: &str) -> bool {
    key == HANDOFF_TO_PROPERTY || key == HANDOFF_REQUESTED_PROPERTY
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cosmos::EpkRange;

    /// A lease whose owner wrote `version` (as its position) and owns it.
    fn lease(version: &str, owner: Option<&str>) -> Lease {
        let mut lease = Lease::new("p", &EpkRange::new("", "FF"), Some(version.into()));
        lease.etag = format!("etag-{version}");
        lease.owner = owner.map(str::to_owned);
        lease
    }

    fn listing(leases: Vec<Lease>) -> LeaseSnapshot {
        LeaseSnapshot {
            leases,
            ..LeaseSnapshot::default()
        }
    }

    #[test]
    fn a_lease_expires_only_after_an_expiration_without_a_change_seen_here() {
        let expiration = Duration::from_secs(60);
        let t0 = Instant::now();
        let mut seen = Sightings::default();
        seen.observe(&listing(vec![lease("v1", Some("b"))]), t0);
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(!seen.is_expired(&lease("v1", Some("b")), at(59), expiration));
        // Renewed (a new ETag) at 30 s: the time starts again.
        seen.observe(&listing(vec![lease("v2", Some("b"))]), at(30));
        assert!(!seen.is_expired(&lease("v2", Some("b")), at(89), expiration));
        seen.observe(&listing(vec![lease("v2", Some("b"))]), at(85));
        assert!(seen.is_expired(&lease("v2", Some("b")), at(90), expiration));
        // Free leases are free at once; a lease never seen is not expired.
        assert!(seen.is_expired(&lease("v9", None), at(0), expiration));
        let mut fresh = Sightings::default();
        fresh.observe(&listing(vec![lease("old", Some("gone"))]), at(1000));
        assert!(!fresh.is_expired(&lease("old", Some("gone")), at(1000), expiration));
        assert!(fresh.is_expired(&lease("old", Some("gone")), at(1060), expiration));
    }

    fn with_heartbeat(leases: Vec<Lease>, beat: &str, marked: bool) -> LeaseSnapshot {
        let stamp = time::OffsetDateTime::UNIX_EPOCH + Duration::from_secs(beat.len() as u64);
        let mut snapshot = listing(leases);
        snapshot.instances = vec![("b".into(), stamp)];
        if marked {
            snapshot.keepers = vec!["b".into()];
        }
        snapshot
    }

    #[test]
    fn a_keepers_lease_lives_while_its_heartbeat_changes() {
        let expiration = Duration::from_secs(60);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let idle = lease("v1", Some("b"));
        let mut seen = Sightings::default();
        // The lease is never written again; the heartbeat changes every 17 s until 51 s.
        for (t, beat) in [(0, "b"), (17, "bb"), (34, "bbb"), (51, "bbbb")] {
            seen.observe(&with_heartbeat(vec![idle.clone()], beat, true), at(t));
            assert!(!seen.is_expired(&idle, at(t), expiration), "{t} s");
        }
        seen.observe(&with_heartbeat(vec![idle.clone()], "bbbb", true), at(110));
        assert!(!seen.is_expired(&idle, at(110), expiration), "59 s after the last beat");
        assert!(
            seen.is_expired(&idle, at(111), expiration),
            "an expiration after the last beat"
        );
        assert_eq!(seen.silent_for(&idle, at(111)), expiration);
    }

    #[test]
    fn a_heartbeat_without_the_marker_keeps_no_lease_alive() {
        let expiration = Duration::from_secs(60);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let idle = lease("v1", Some("b"));
        let mut seen = Sightings::default();
        for (t, beat) in [(0, "b"), (30, "bb"), (59, "bbb")] {
            seen.observe(&with_heartbeat(vec![idle.clone()], beat, false), at(t));
        }
        assert!(!seen.keeps_leases("b"));
        assert!(seen.is_expired(&idle, at(60), expiration), "judged by the lease alone");
    }

    #[test]
    fn a_handoff_request_another_instance_writes_is_no_sign_of_the_owner_s_life() {
        let expiration = Duration::from_secs(60);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let crashed = lease("v1", Some("b"));
        let mut seen = Sightings::default();
        seen.observe(&listing(vec![crashed.clone()]), t0);
        // A newcomer asks the crashed owner for the lease at 40 s: a new ETag, same owner's writing.
        let mut asked = crashed.clone();
        asked.request_handoff("newcomer", time::OffsetDateTime::UNIX_EPOCH);
        asked.etag = "etag-asked".into();
        seen.observe(&listing(vec![asked.clone()]), at(40));
        assert!(
            seen.is_expired(&asked, at(60), expiration),
            "expired as the owner last wrote it"
        );
        // The owner's acknowledgement of the request is its own writing: alive.
        let mut acknowledged = asked.clone();
        acknowledged.acknowledge_handoff(time::OffsetDateTime::UNIX_EPOCH);
        seen.observe(&listing(vec![acknowledged.clone()]), at(70));
        assert!(!seen.is_expired(&acknowledged, at(70), expiration));
    }

    #[test]
    fn what_a_listing_no_longer_shows_is_forgotten() {
        let t0 = Instant::now();
        let mut seen = Sightings::default();
        seen.observe(&listing(vec![lease("v1", Some("b"))]), t0);
        seen.observe(&listing(Vec::new()), t0 + Duration::from_secs(10));
        seen.observe(&listing(vec![lease("v1", Some("b"))]), t0 + Duration::from_secs(20));
        let key = Seen::Lease(lease("v1", None).id);
        assert_eq!(
            seen.unchanged_for(&key, t0 + Duration::from_secs(30)),
            Duration::from_secs(10)
        );
    }
}
