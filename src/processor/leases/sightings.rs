//! What this instance has seen of the lease container, on its own monotonic clock: for every lease,
//! heartbeat and handoff request, the version it shows and since when this instance sees that
//! version. A lease (heartbeat, request) is expired when this instance has seen no change of it
//! for the lease expiration — never by comparing another machine's wall clock with ours, so clocks
//! that differ between nodes (by seconds or by minutes) change nothing. Pure: time comes in.
//!
//! A version's time is when this instance first listed it — or earlier, when the writer's own
//! clock says it was stamped earlier ([`crate::processor::leases::writer_clocks`]): then a
//! version first listed a listing interval after it was written is dated by its writing, so a
//! crashed owner's leases expire an expiration after its last write, not after a listing.
//!
//! The lease of an instance whose heartbeat keeps its leases alive
//! ([`crate::processor::leases::heartbeat`]) lives while either changes: it is expired only when
//! neither the lease nor its owner's heartbeat changed for the expiration.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::processor::leases::lease::{HANDOFF_REQUESTED_PROPERTY, HANDOFF_TO_PROPERTY, Lease, LeaseSnapshot};
use crate::processor::leases::writer_clocks::{ClockStamp, WriterClocks};

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

/// One thing a listing shows: what it is, its version, and the writer's stamp when it has one.
#[derive(Debug, Clone)]
pub struct Shown {
    /// What it is.
    pub key: Seen,
    /// Its version.
    pub version: String,
    /// When its writer stamped it, by the writer's own clock (`None`: other writers').
    pub stamp: Option<ClockStamp>,
}

impl Shown {
    fn new(key: Seen, version: String, stamp: Option<&ClockStamp>) -> Self {
        Self {
            key,
            version,
            stamp: stamp.cloned(),
        }
    }
}

/// The versions this instance saw, and since when.
#[derive(Debug, Clone, Default)]
pub struct Sightings {
    seen: HashMap<Seen, (String, Instant)>,
    /// What the listings told of the writers' clocks.
    clocks: WriterClocks,
    /// The instances whose heartbeat keeps their leases alive, as the last listing showed.
    keepers: HashSet<String>,
    /// When each listed instance's heartbeat was first seen (forgotten when it is not listed).
    arrived: HashMap<String, Instant>,
}

impl Sightings {
    /// Records what `snapshot`, listed at `at`, shows: a version not seen before starts its
    /// time now; whatever the listing no longer shows is forgotten.
    pub fn observe(&mut self, snapshot: &LeaseSnapshot, at: Instant) {
        let mut versions: Vec<Shown> = Vec::new();
        for lease in &snapshot.leases {
            let key = Seen::Lease(lease.id.clone());
            versions.push(Shown::new(key, lease_version(lease), lease.writer_clock.as_ref()));
            // An owner's acknowledgement, written anew while it drains, renews the request.
            if let Some((to, requested)) = lease.handoff_request() {
                let acknowledged = lease.handoff_acknowledged().unwrap_or_default();
                let version = format!("{to}@{requested}+{acknowledged}");
                versions.push(Shown::new(Seen::Request(lease.id.clone()), version, None));
            }
        }
        for (name, beat) in &snapshot.instances {
            let stamp = snapshot.heartbeat_clocks.get(name);
            versions.push(Shown::new(Seen::Heartbeat(name.clone()), beat.to_string(), stamp));
        }
        self.note_keepers(&snapshot.keepers);
        self.record(versions, at);
        // Dated as its first heartbeat listed here is: by its writer's clock where it tells.
        let first_beat = |name: &String| self.seen.get(&Seen::Heartbeat(name.clone())).map(|(_, since)| *since);
        self.arrived = snapshot
            .instances
            .iter()
            .map(|(name, _)| {
                let arrived = self.arrived.get(name).copied().or_else(|| first_beat(name));
                (name.clone(), arrived.unwrap_or(at))
            })
            .collect();
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
    /// showed, or its stamp's time as its writer's clock dates it); `None` when the last listing
    /// did not show it.
    pub fn arrival(&self, instance: &str) -> Option<Instant> {
        self.arrived.get(instance).copied()
    }

    /// Records which instances' heartbeats keep their leases alive (the latest listing's).
    pub fn note_keepers(&mut self, keepers: &[String]) {
        self.keepers = keepers.iter().cloned().collect();
    }

    /// Records `versions` listed at `at` (when the listing returned), forgetting what they do
    /// not name. A version not seen before dates from `at`, or from when its writer's clock says
    /// it was stamped when that is earlier.
    pub fn record(&mut self, versions: Vec<Shown>, at: Instant) {
        let mut next = HashMap::with_capacity(versions.len());
        for shown in &versions {
            let since = match (self.seen.get(&shown.key), &shown.stamp) {
                (Some((known, since)), _) if *known == shown.version => *since,
                (_, Some(stamp)) => self.clocks.first_listed(stamp, at),
                (_, None) => at,
            };
            next.insert(shown.key.clone(), (shown.version.clone(), since));
        }
        let clocks = versions
            .iter()
            .filter_map(|v| v.stamp.as_ref())
            .map(|s| s.clock.as_str());
        self.clocks.retain(&clocks.collect());
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
    use crate::processor::leases::writer_clocks::DRIFT;

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

    /// A listing of one idle lease of `b` and `b`'s heartbeat `beat`, each stamped by `b`'s
    /// process clock (the lease at 0 µs).
    fn stamped(beat_us: u64) -> LeaseSnapshot {
        let mut idle = lease("v1", Some("b"));
        idle.writer_clock = Some(ClockStamp {
            clock: "b-process".into(),
            us: 0,
        });
        let mut snapshot = with_heartbeat(vec![idle], &"b".repeat(1 + beat_us as usize / 1000), true);
        let stamp = ClockStamp {
            clock: "b-process".into(),
            us: beat_us,
        };
        snapshot.heartbeat_clocks.insert("b".into(), stamp);
        snapshot
    }

    #[test]
    fn a_last_beat_first_listed_a_listing_late_is_dated_by_its_writers_clock() {
        let expiration = Duration::from_secs(6);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut seen = Sightings::default();
        // Beats every 1.7 s (b's clock reads 0 at t0), listings every 1.3 s from 1.19 s; b
        // crashes right after its beat at 5.1 s, which the listing at 6.39 s shows first.
        let beat_shown = |listed_ms: u64| (0..4u64).map(|k| k * 1700).filter(|b| *b <= listed_ms).max();
        for j in 0..9u64 {
            let listed = 1190 + j * 1300;
            let beat = beat_shown(listed).unwrap_or_default();
            seen.observe(&stamped(beat * 1000), at(listed));
        }
        let idle = stamped(0).leases[0].clone();
        // Its last beat was 6.49 s before the listing at 11.59 s; first listed only 5.2 s before.
        assert!(seen.is_expired(&idle, at(11_590), expiration));
        assert!(!seen.is_expired(&idle, at(10_290), expiration));
    }

    #[test]
    fn an_instance_arrives_when_its_first_listed_beat_was_stamped() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut seen = Sightings::default();
        // b's clock is known from a listing at 0 ms (its lease, stamped 0 µs)...
        seen.observe(&listing(vec![stamped(0).leases[0].clone()]), at(0));
        // ...and its heartbeat, stamped 200 ms later by that clock, is first listed at 1.3 s.
        seen.observe(&stamped(200_000), at(1300));
        let arrived = seen.arrival("b").map(|t| t - t0);
        assert!(arrived.is_some_and(|a| a >= Duration::from_millis(200) && a <= Duration::from_millis(201)));
    }

    proptest::proptest! {
        /// Whatever the writer's clock offset and rate (within the drift allowed), the delays of
        /// its writes, and when listings are sent, read and answered: a lease is never judged
        /// expired before an expiration has passed since its owner's last beat was stamped.
        #[test]
        fn no_lease_is_judged_expired_before_an_expiration_after_its_last_stamp(
            beat_ms in 200u64..3000,
            listing_ms in 200u64..3000,
            phase_ms in 0u64..3000,
            rate in (1.0 - DRIFT * 0.9)..(1.0 + DRIFT * 0.9),
            delays in proptest::collection::vec(0u64..400, 40),
            reads in proptest::collection::vec(0.0f64..1.0, 80),
            round_trips in proptest::collection::vec(1u64..300, 80),
            beats in 1usize..40,
        ) {
            let expiration = Duration::from_secs(6);
            let t0 = Instant::now();
            let at = |ms: f64| t0 + Duration::from_secs_f64(ms / 1000.0);
            // The k-th beat is stamped `k × beat_ms` by b's clock: at `(1000 + k × beat_ms) × rate`
            // by ours, and written after its delay.
            let stamped_at = |k: usize| (1000.0 + (k as u64 * beat_ms) as f64) * rate;
            let written_at = |k: usize| stamped_at(k) + delays[k] as f64;
            let mut seen = Sightings::default();
            for j in 0..80 {
                let sent = 1000.0 + (phase_ms + j as u64 * listing_ms) as f64;
                let returned = sent + round_trips[j] as f64;
                let read = sent + (returned - sent) * reads[j];
                let Some(k) = (0..beats).filter(|k| written_at(*k) <= read).max() else { continue };
                let judged = seen.observe_listing(&stamped(k as u64 * beat_ms * 1000), at(sent), at(returned));
                let idle = stamped(0).leases[0].clone();
                let silence = judged.saturating_duration_since(at(stamped_at(beats - 1)));
                if seen.is_expired(&idle, judged, expiration) {
                    proptest::prop_assert!(silence >= expiration, "expired {silence:?} after the last stamp");
                }
            }
        }
    }
}
