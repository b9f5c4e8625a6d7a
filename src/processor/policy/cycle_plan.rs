//! The acquire cycle's decisions as a pure function: from one listing of the lease container and
//! what this instance knows of itself, [`plan_cycle`] says which split parents to delete, which
//! heartbeats are stale, which owned leases are lost or asked for, which leases to take or ask
//! their owners for, when to look again for an expiring lease, and when to list next. The
//! coordinator performs the plan's writes; nothing here sleeps or does I/O.
//!
//! Whether another instance's lease (heartbeat, handoff request) has expired is decided from
//! what this instance saw change, on its own monotonic clock ([`Sightings`]), never from the
//! other machine's wall-clock `timestamp`: clocks that differ between nodes change no decision.

use std::collections::HashMap;
use std::time::Duration;

use time::OffsetDateTime;

use crate::processor::leases::lease::{Lease, LeaseSnapshot};
use crate::processor::leases::sightings::Seen;
use crate::processor::policy::acquisitions::{Acquisition, acquisitions};
use crate::processor::policy::balancer::{
    Balancing, LeaseState, leases_to_acquire_among, leases_to_acquire_steal_one, overlapping, superseded,
};
use crate::processor::policy::cycle_inputs::{CycleOptions, Observations};
use crate::processor::policy::listing_schedule::{ListingSchedule, ListingView, is_quiet};
use crate::processor::policy::range_overlaps::{EqualRange, equal_ranges, ranges_of};
use crate::processor::policy::work_balancer::{carries_work, leases_to_acquire_by_work, work_of};

/// Acquire cycles without a heartbeat after which an instance is no longer counted.
const HEARTBEAT_CYCLES: u32 = 3;

/// A heartbeat older than this many lease expirations belongs to an instance that died; it is removed.
const STALE_HEARTBEAT_EXPIRATIONS: u32 = 5;

/// Everything one acquire cycle decided.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CyclePlan {
    /// Documents under the prefix that are not valid leases (id, what is wrong).
    pub invalid: Vec<(String, String)>,
    /// Leases whose range overlaps another lease's (edited by hand?).
    pub overlapping: Vec<String>,
    /// Owned leases the listing shows with another owner or not at all: processing stops.
    pub lost: Vec<String>,
    /// Owned leases another instance asked for: (lease id, the instance to hand it to).
    pub hand_over: Vec<(String, String)>,
    /// Owned leases asked for by an instance that is gone: the request is cleared, the lease kept.
    pub clear_requests: Vec<String>,
    /// Split parents whose children exist and that nobody renews: deleted.
    pub delete: Vec<Lease>,
    /// Instances whose heartbeat is long stale (died without stopping): heartbeats removed.
    pub remove_heartbeats: Vec<String>,
    /// Leases to take or ask for, written together.
    pub acquire: Vec<Acquisition>,
    /// When another instance's overdue lease expires before the next cycle: an extra cycle then.
    pub takeover_in: Option<Duration>,
    /// The wait until the next regular listing.
    pub next_interval: Duration,
    /// Whether balancing by work would move leases here from live owners, made or not (for the
    /// next plan's [`Observations::moves_called`]).
    pub moves_planned: bool,
    /// The lease ids of this listing, sorted (for the next plan's [`Observations::listed_ids`]).
    pub listed_ids: Vec<String>,
    /// Whether this instance must renew each of its leases on its own: another live instance
    /// judges leases by their own writes (its heartbeat carries no liveness marker, or it owns
    /// leases and has no such heartbeat), see [`crate::processor::leases::heartbeat`].
    pub renew_each_lease: bool,
    /// The other instances here (a live heartbeat, or a lease they keep alive) that are not
    /// leaving, sorted: where a lease this instance gives up as stalled goes.
    pub others: Vec<String>,
}

/// Decides one acquire cycle of instance `me` from `snapshot`, listed at `now`.
pub fn plan_cycle(
    snapshot: &LeaseSnapshot,
    observations: &Observations,
    me: &str,
    now: OffsetDateTime,
    options: CycleOptions,
) -> CyclePlan {
    let expiration = options.expiration;
    let ranges = ranges_of(&snapshot.leases);
    // A split parent whose children exist, or the other of two leases with one range, is
    // obsolete: never balanced, deleted once free.
    let equal = processed_here_kept(equal_ranges(&snapshot.leases), &snapshot.leases, observations, me);
    let mut obsolete = superseded(&ranges);
    obsolete.extend(equal.iter().map(|e| e.id.clone()));
    let balanced: Vec<&Lease> = snapshot.leases.iter().filter(|l| !obsolete.contains(&l.id)).collect();
    let states = lease_states(&balanced, observations, expiration);
    let live = live_instances(snapshot, observations, options);
    let work = match options.balancing {
        Balancing::Work => work_of(&balanced, snapshot.newest_server_ts, options.into()),
        _ => HashMap::new(),
    };
    let wanted = wanted(
        &balanced,
        &states,
        (&live, &snapshot.leaving),
        observations,
        me,
        (options, &work),
    );
    let mut listed_ids: Vec<String> = snapshot.leases.iter().map(|l| l.id.clone()).collect();
    listed_ids.sort_unstable();
    let view = ListingView {
        leases: &states,
        live: &live,
        handoff_asked: snapshot.leases.iter().any(|l| l.handoff_request().is_some()),
        same_leases: listed_ids == observations.listed_ids,
    };
    let quiet =
        wanted.leases.is_empty() && !observations.awaiting_handoff && is_quiet(&view, me) && !carries_work(&work);
    let schedule = ListingSchedule::new(options.acquire_interval, options.renew_interval.min(expiration));
    let next_interval = if wanted.unconfirmed || expecting_requests(&states, &live, observations, me, options) {
        schedule.brisk()
    } else {
        schedule.next(observations.listing_interval, quiet)
    };
    let present = present(&live, &states);
    let mut fates = owned_fates(snapshot, observations, me, &present);
    fates.lost.extend(displaced(&equal, &states, observations, me));
    let renew_each_lease = judged_one_by_one(&live, &states, observations, me);
    CyclePlan {
        invalid: snapshot.invalid.clone(),
        overlapping: overlapping(&ranges, &obsolete),
        lost: fates.lost,
        hand_over: fates.hand_over,
        clear_requests: fates.clear_requests,
        delete: obsolete_to_delete(snapshot, &obsolete, observations, (me, expiration)),
        remove_heartbeats: stale_heartbeats(snapshot, observations, expiration),
        acquire: acquisitions(
            &wanted.leases,
            &balanced,
            &ranges,
            observations,
            (me, now, snapshot.newest_server_ts),
            options,
        ),
        takeover_in: takeover_in(&balanced, me, observations, options),
        moves_planned: wanted.moves_planned,
        next_interval,
        listed_ids,
        renew_each_lease,
        others: present
            .into_iter()
            .filter(|name| name != me && !name.is_empty() && !snapshot.leaving.contains(name))
            .collect(),
    }
}

/// The obsolete leases deleted now: expired, or left here (this instance's lease that no task
/// of it processes: its heartbeat keeps it alive).
fn obsolete_to_delete(
    snapshot: &LeaseSnapshot,
    obsolete: &[String],
    observations: &Observations,
    (me, expiration): (&str, Duration),
) -> Vec<Lease> {
    let expired = |l: &Lease| observations.sightings.is_expired(l, observations.at, expiration);
    let left_here = |l: &Lease| l.owner.as_deref() == Some(me) && !observations.owned.contains(&l.id);
    snapshot
        .leases
        .iter()
        .filter(|l| obsolete.contains(&l.id) && (expired(l) || left_here(l)))
        .cloned()
        .collect()
}

/// Instances whose heartbeat is long stale (died without stopping).
fn stale_heartbeats(snapshot: &LeaseSnapshot, observations: &Observations, expiration: Duration) -> Vec<String> {
    snapshot
        .instances
        .iter()
        .filter(|(name, _)| heartbeat_age(observations, name) > expiration * STALE_HEARTBEAT_EXPIRATIONS)
        .map(|(name, _)| name.clone())
        .collect()
}

/// Of leases with one range, the one processed here is kept over one this instance left (a
/// rewrite's old document whose delete failed, written after the new one's creation): it reads on
/// from where the other was taken over, and the one left here is deleted.
fn processed_here_kept(
    equal: Vec<EqualRange>,
    leases: &[Lease],
    observations: &Observations,
    me: &str,
) -> Vec<EqualRange> {
    let left_here = |id: &str| {
        !observations.owned.contains(id) && leases.iter().any(|l| l.id == id && l.owner.as_deref() == Some(me))
    };
    let mut kept_instead: HashMap<String, String> = HashMap::new();
    for e in &equal {
        if observations.owned.contains(&e.id) && left_here(&e.kept) {
            kept_instead.entry(e.kept.clone()).or_insert_with(|| e.id.clone());
        }
    }
    if kept_instead.is_empty() {
        return equal;
    }
    let mut out: Vec<EqualRange> = Vec::new();
    for e in equal {
        match kept_instead.get(&e.kept) {
            Some(here) if *here == e.id => out.push(EqualRange { id: e.kept, kept: e.id }),
            Some(here) => out.push(EqualRange {
                id: e.id,
                kept: here.clone(),
            }),
            None => out.push(e),
        }
    }
    out
}

/// The leases processed here that give way to another lease over the same range which another
/// live instance owns: processing stops (and the lease, left here, is deleted).
fn displaced(equal: &[EqualRange], states: &[LeaseState], observations: &Observations, me: &str) -> Vec<String> {
    let owned_elsewhere = |id: &str| {
        states
            .iter()
            .find(|s| s.id == id)
            .and_then(|s| s.live_owner.as_deref())
            .is_some_and(|owner| owner != me && !owner.is_empty())
    };
    equal
        .iter()
        .filter(|e| observations.owned.contains(&e.id) && owned_elsewhere(&e.kept))
        .map(|e| e.id.clone())
        .collect()
}

/// What the balancer knows of each of `balanced`: its live owner (none once expired) and, while
/// it counts, the instance that asked that owner for it — for as long as its requester waits
/// before it takes the lease (the acquisition's patience: [`acquisitions`]).
fn lease_states(balanced: &[&Lease], observations: &Observations, expiration: Duration) -> Vec<LeaseState> {
    let at = observations.at;
    balanced
        .iter()
        .map(|l| {
            let live_owner = if observations.sightings.is_expired(l, at, expiration) {
                None
            } else {
                l.owner.clone()
            };
            let asked = |_: &(&str, OffsetDateTime)| {
                observations.sightings.unchanged_for(&Seen::Request(l.id.clone()), at) < expiration
            };
            let requested_by = live_owner
                .as_ref()
                .and(l.handoff_request())
                .filter(asked)
                .map(|(to, _)| to.to_owned());
            LeaseState {
                id: l.id.clone(),
                expired: live_owner.is_none() && l.owner.as_deref().is_some_and(|o| !o.is_empty()),
                live_owner,
                requested_by,
            }
        })
        .collect()
}

/// Whether `me` holds more than its share while an instance that arrived within the last two
/// acquire intervals holds less: it is about to ask `me` for leases. Idle leases are not
/// written between listings, so only a listing shows its requests: until they come, `me` lists
/// briskly (a quarter of the acquire interval), so that a newcomer gets its share within its
/// first acquire cycle, as when each lease's renewal met the request at once.
fn expecting_requests(
    states: &[LeaseState],
    live: &[String],
    observations: &Observations,
    me: &str,
    options: CycleOptions,
) -> bool {
    let instances = present(live, states);
    if states.is_empty() || instances.len() < 2 || states.iter().any(|s| s.live_owner.is_none()) {
        return false;
    }
    let held = |name: &str| states.iter().filter(|s| s.live_owner.as_deref() == Some(name)).count();
    let floor = states.len() / instances.len();
    let recent = options.acquire_interval * 2;
    held(me) > floor
        && instances.iter().any(|name| {
            name != me
                && held(name) < floor
                && observations
                    .sightings
                    .known_for(name, observations.at)
                    .is_some_and(|known| known < recent)
        })
}

/// Whether another live instance judges leases by their own writes: a live heartbeat without
/// the liveness marker, or a live owner without a heartbeat that carries it (an older version,
/// or one that keeps each lease alive on its own). While one is there, every lease is renewed
/// on its own so that it never takes a live instance's lease.
fn judged_one_by_one(live: &[String], states: &[LeaseState], observations: &Observations, me: &str) -> bool {
    let keeps = |name: &str| name == me || observations.sightings.keeps_leases(name);
    live.iter().any(|name| !keeps(name))
        || states
            .iter()
            .filter_map(|s| s.live_owner.as_deref())
            .any(|owner| !owner.is_empty() && !keeps(owner))
}

/// How long instance `name`'s heartbeat has not changed, as seen here.
fn heartbeat_age(observations: &Observations, name: &str) -> Duration {
    observations
        .sightings
        .unchanged_for(&Seen::Heartbeat(name.to_owned()), observations.at)
}

/// Instances beat every renew interval (an older version: every cycle while it owns nothing): one
/// silent for three cycles or two renew intervals, whichever is longer, is gone (a crashed
/// instance must not be counted when its leases expire, or their takeover waits another cycle).
fn live_instances(snapshot: &LeaseSnapshot, observations: &Observations, options: CycleOptions) -> Vec<String> {
    let heartbeat_ttl = options
        .expiration
        .min((options.acquire_interval * HEARTBEAT_CYCLES).max(options.renew_interval * 2));
    snapshot
        .instances
        .iter()
        .filter(|(name, _)| heartbeat_age(observations, name) < heartbeat_ttl)
        .map(|(name, _)| name.clone())
        .collect()
}

/// The live instances other than `me` that arrived after the silence of an expired lease began
/// (as seen here): they have not watched that silence for an expiration, so they cannot see the
/// lease as expired yet.
fn newcomers(
    live: &[String],
    balanced: &[&Lease],
    states: &[LeaseState],
    observations: &Observations,
    me: &str,
) -> Vec<String> {
    let (at, sightings) = (observations.at, &observations.sightings);
    let silences = balanced
        .iter()
        .zip(states)
        .filter(|(_, state)| state.expired)
        .map(|(l, _)| at - sightings.silent_for(l, at));
    let Some(first_silence) = silences.min() else {
        return Vec::new();
    };
    live.iter()
        .filter(|name| name.as_str() != me && sightings.arrival(name).is_some_and(|arrived| arrived > first_silence))
        .cloned()
        .collect()
}

/// The leases `me` wants: first those the store says are its own but that no task processes (a
/// restart under the same name), then what the balancing strategy picks (by work: from the
/// weights of the listing, `work`). Moves by work are made only when the previous listing called
/// for moves to `me` too (reports land with each owner's writes, so one listing may catch a busy
/// owner's leases before theirs) — else the next listing comes briskly — unless `me` holds fewer
/// leases than an equal count (a newcomer: counting alone would give it those).
fn wanted(
    balanced: &[&Lease],
    states: &[LeaseState],
    (live, leaving): (&[String], &[String]),
    observations: &Observations,
    me: &str,
    (options, work): (CycleOptions, &HashMap<String, f64>),
) -> Wanted {
    let mut wanted = Wanted {
        leases: balanced
            .iter()
            .filter(|l| l.owner.as_deref() == Some(me) && !observations.owned.contains(&l.id))
            .map(|l| l.id.clone())
            .collect(),
        moves_planned: false,
        unconfirmed: false,
    };
    let picked = match options.balancing {
        Balancing::Fair => {
            let newcomers = newcomers(live, balanced, states, observations, me);
            leases_to_acquire_among(states, me, live, (leaving, &newcomers))
        }
        Balancing::Work => {
            let newcomers = newcomers(live, balanced, states, observations, me);
            let picks = leases_to_acquire_by_work(states, work, me, live, (leaving, &newcomers));
            wanted.moves_planned = !picks.moved.is_empty();
            wanted.unconfirmed = wanted.moves_planned && !picks.short && !observations.moves_called;
            if wanted.unconfirmed { picks.dealt } else { picks.all() }
        }
        Balancing::StealOne => leases_to_acquire_steal_one(states, me),
    };
    // Each lease is written once a cycle (a second write would only meet a 412).
    for id in picked {
        if !wanted.leases.contains(&id) {
            wanted.leases.push(id);
        }
    }
    wanted
}

/// What `me` wants of a listing.
struct Wanted {
    /// The leases to take or ask for in this cycle.
    leases: Vec<String>,
    /// Whether balancing by work would move leases here ([`CyclePlan::moves_planned`]).
    moves_planned: bool,
    /// Whether moves wait for the next listing to call for them too (it comes briskly).
    unconfirmed: bool,
}

/// Owned leases the listing shows as another's (or not at all), and those shown as this
/// instance's with another instance's handoff request.
/// An instance that asked for a lease and is gone (no live heartbeat, no lease it renews), or
/// says it is leaving (it would only free the lease again), is not handed it: its request is
/// cleared.
fn owned_fates(snapshot: &LeaseSnapshot, observations: &Observations, me: &str, present: &[String]) -> OwnedFates {
    let staying = |to: &str| present.iter().any(|p| p == to) && !snapshot.leaving.iter().any(|l| l == to);
    let mut fates = OwnedFates::default();
    // By id: looking each owned lease up in the whole listing would be quadratic.
    let listed: HashMap<&str, &Lease> = snapshot.leases.iter().map(|l| (l.id.as_str(), l)).collect();
    for id in &observations.owned {
        let mine = listed
            .get(id.as_str())
            .copied()
            .filter(|l| l.owner.as_deref() == Some(me));
        match mine.map(Lease::handoff_request) {
            None => fates.lost.push(id.clone()),
            Some(Some((to, _))) if to != me && staying(to) => fates.hand_over.push((id.clone(), to.to_owned())),
            Some(Some((to, _))) if to != me => fates.clear_requests.push(id.clone()),
            Some(_) => {}
        }
    }
    fates.lost.sort_unstable();
    fates.hand_over.sort_unstable();
    fates.clear_requests.sort_unstable();
    fates
}

/// What becomes of the leases processed here.
#[derive(Default)]
struct OwnedFates {
    lost: Vec<String>,
    hand_over: Vec<(String, String)>,
    clear_requests: Vec<String>,
}

/// The instances that are here: a live heartbeat, or a lease they renew.
fn present(live: &[String], states: &[LeaseState]) -> Vec<String> {
    let mut present: Vec<String> = live.to_vec();
    present.extend(states.iter().filter_map(|s| s.live_owner.clone()));
    present.sort_unstable();
    present.dedup();
    present
}

/// A lease its owner stopped renewing is taken as it expires, not up to a cycle later (fair
/// balancing only: the reference strategy keeps its cycle): the wait until the first lease of
/// another instance that showed no sign of life (a write of it, or its owner's heartbeat) for
/// longer than two renew intervals (overdue: healthy owners write sooner) reaches the
/// expiration, when that comes before the next cycle.
fn takeover_in(balanced: &[&Lease], me: &str, observations: &Observations, options: CycleOptions) -> Option<Duration> {
    if options.balancing == Balancing::StealOne {
        return None;
    }
    let overdue_after = options.renew_interval * 2;
    balanced
        .iter()
        .filter(|l| l.owner.as_deref().is_some_and(|o| !o.is_empty() && o != me))
        .map(|l| observations.sightings.silent_for(l, observations.at))
        .filter(|age| *age > overdue_after && *age < options.expiration)
        .map(|age| options.expiration - age)
        // Only a quiet listing waits longer, and a quiet one shows no other owners.
        .filter(|wait| *wait < options.acquire_interval)
        .min()
}

#[cfg(test)]
#[path = "cycle_plan_tests.rs"]
mod tests;
