//! Table and property tests of [`plan_cycle`]: no sleeps, no store.

use super::*;
use crate::cosmos::EpkRange;
use crate::processor::leases::sightings::{Seen, Sightings};
use std::collections::HashSet;

use crate::processor::policy::acquisitions::{AcquireStep, retry_acquisition};
use proptest::prelude::*;
use time::macros::datetime;
use tokio::time::Instant;

const NOW: OffsetDateTime = datetime!(2026-11-25 12:00:00 UTC);
const SECOND: Duration = Duration::from_secs(1);

fn options() -> CycleOptions {
    CycleOptions {
        expiration: Duration::from_secs(60),
        renew_interval: Duration::from_secs(17),
        acquire_interval: Duration::from_secs(13),
        balancing: Balancing::Fair,
    }
}

/// The `i`-th of `n` equal ranges of the hash space.
fn range(i: u32, n: u32) -> EpkRange {
    let bound = |k: u32| {
        if k == 0 {
            String::new()
        } else if k == n {
            "FF".to_owned()
        } else {
            format!("{:02X}", k * 256 / n)
        }
    };
    EpkRange::new(bound(i), bound(i + 1))
}

/// A lease of range `i` of `n`, owned by `owner` and renewed `age` ago.
fn lease(i: u32, n: u32, owner: Option<&str>, age: Duration) -> Lease {
    let mut lease = Lease::new("p", &range(i, n), None);
    lease.owner = owner.map(str::to_owned);
    lease.timestamp = owner.map(|_| NOW - age);
    lease.etag = format!("etag-{i}");
    lease
}

fn snapshot(leases: Vec<Lease>, instances: &[(&str, Duration)]) -> LeaseSnapshot {
    LeaseSnapshot {
        leases,
        instances: instances.iter().map(|(n, age)| ((*n).to_owned(), NOW - *age)).collect(),
        initialized: true,
        ..LeaseSnapshot::default()
    }
}

/// The monotonic time of the listings (in the future, so that any age can be subtracted).
fn at() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

/// The time since `then` (wall clock of the test's listing).
fn age(then: OffsetDateTime) -> Duration {
    Duration::try_from(NOW - then).unwrap_or_default()
}

/// What an instance that has watched the container all along knows when `listing` comes in:
/// each lease, request and heartbeat seen unchanged since it was written (`NOW - timestamp`);
/// `owned` processed here.
fn observations(listing: &LeaseSnapshot, owned: &[&Lease]) -> Observations {
    let at = at();
    let mut sightings = Sightings::default();
    for lease in &listing.leases {
        let since = at - lease.timestamp.map(age).unwrap_or_default();
        sightings.seen_since(Seen::Lease(lease.id.clone()), lease.etag.clone(), since);
        if let Some((to, when)) = lease.handoff_request() {
            sightings.seen_since(Seen::Request(lease.id.clone()), to.to_owned(), at - age(when));
        }
    }
    for (name, beat) in &listing.instances {
        sightings.seen_since(Seen::Heartbeat(name.clone()), beat.to_string(), at - age(*beat));
    }
    sightings.note_keepers(&listing.keepers);
    Observations {
        at,
        sightings,
        owned: owned.iter().map(|l| l.id.clone()).collect(),
        awaiting_handoff: false,
        listed_ids: Vec::new(),
        listing_interval: options().acquire_interval,
        left_stalled: HashSet::new(),
        moves_called: false,
    }
}

/// The plan of "me" for `listing`, having watched the container all along.
fn plan_for(listing: &LeaseSnapshot, owned: &[&Lease], options: CycleOptions) -> CyclePlan {
    plan_cycle(listing, &observations(listing, owned), "me", NOW, options)
}

fn steps(plan: &CyclePlan) -> Vec<(String, AcquireStep, Option<String>)> {
    plan.acquire
        .iter()
        .map(|a| (a.write.lease_token.clone(), a.step, a.previous_owner.clone()))
        .collect()
}

#[test]
fn free_and_expired_leases_are_taken_stamped_now_without_a_previous_owner() {
    let free = lease(0, 2, None, Duration::ZERO);
    let expired = lease(1, 2, Some("gone"), 61 * SECOND);
    let plan = plan_for(
        &snapshot(vec![free.clone(), expired.clone()], &[("me", SECOND)]),
        &[],
        options(),
    );
    assert_eq!(
        steps(&plan),
        vec![
            (free.lease_token.clone(), AcquireStep::Take, None),
            (expired.lease_token.clone(), AcquireStep::Take, None)
        ]
    );
    for acquisition in &plan.acquire {
        assert_eq!(acquisition.write.owner.as_deref(), Some("me"));
        assert_eq!(acquisition.write.timestamp, Some(NOW));
        assert!(acquisition.write.handoff_request().is_none());
        assert!(
            acquisition.write.etag.starts_with("etag-"),
            "written If-Match the listed version"
        );
    }
}

#[test]
fn a_live_owner_is_asked_and_loses_the_lease_only_after_ignoring_the_request_for_an_expiration() {
    let options = options();
    // Two leases of "other" and none of "me": fair balancing wants one of them, whichever it
    // is; both are in the state of the case.
    let with_request = |i: u32, asked: Option<(&str, Duration)>| {
        let mut l = lease(i, 2, Some("other"), SECOND);
        if let Some((by, ago)) = asked {
            l.request_handoff(by, NOW - ago);
        }
        l
    };
    let cases = [
        (None, Some(AcquireStep::AskHandoff)),
        (Some(("me", 30 * SECOND)), None),
        (Some(("me", 61 * SECOND)), Some(AcquireStep::Take)),
        (Some(("third", 30 * SECOND)), None),
        (Some(("third", 61 * SECOND)), Some(AcquireStep::AskHandoff)),
    ];
    for (asked, expected) in cases {
        let leases = vec![with_request(0, asked), with_request(1, asked)];
        let plan = plan_for(&snapshot(leases, &[("me", SECOND), ("other", SECOND)]), &[], options);
        assert!(plan.acquire.len() <= 1, "{asked:?}: {:?}", steps(&plan));
        let got = plan.acquire.first();
        assert_eq!(got.map(|a| a.step), expected, "{asked:?}");
        if let Some(a) = got {
            assert_eq!(a.previous_owner.as_deref(), Some("other"));
            match a.step {
                AcquireStep::AskHandoff => {
                    assert_eq!(a.write.owner.as_deref(), Some("other"), "asking leaves the owner");
                    assert_eq!(a.write.handoff_request(), Some(("me", NOW)));
                }
                AcquireStep::Take => assert_eq!(a.write.owner.as_deref(), Some("me")),
            }
        }
    }
}

#[test]
fn a_lease_the_store_says_is_ours_but_no_task_processes_is_taken_up_again_first() {
    let restarted = lease(0, 2, Some("me"), SECOND);
    let processed = lease(1, 2, Some("me"), SECOND);
    let plan = plan_for(
        &snapshot(vec![restarted.clone(), processed.clone()], &[("me", SECOND)]),
        &[&processed],
        options(),
    );
    assert_eq!(steps(&plan), vec![(restarted.lease_token, AcquireStep::Take, None)]);
    assert!(plan.lost.is_empty());
}

#[test]
fn a_lease_released_as_stalled_is_left_for_the_others() {
    let listing = snapshot(
        vec![lease(0, 2, None, Duration::ZERO), lease(1, 2, None, Duration::ZERO)],
        &[],
    );
    let mut watched = observations(&listing, &[]);
    watched.left_stalled.insert(listing.leases[0].id.clone());
    let plan = plan_cycle(&listing, &watched, "me", NOW, options());
    let taken: Vec<&str> = plan.acquire.iter().map(|a| a.write.id.as_str()).collect();
    assert_eq!(taken, [listing.leases[1].id.as_str()]);
}

#[test]
fn owned_leases_shown_as_another_s_are_lost_and_requested_ones_handed_over() {
    let taken = lease(0, 3, Some("other"), SECOND);
    let mut asked = lease(1, 3, Some("me"), SECOND);
    asked.request_handoff("other", NOW);
    let deleted = lease(2, 3, Some("me"), SECOND);
    let plan = plan_for(
        &snapshot(vec![taken.clone(), asked.clone()], &[]),
        &[&taken, &asked, &deleted],
        options(),
    );
    let mut lost = vec![taken.id.clone(), deleted.id.clone()];
    lost.sort();
    assert_eq!(plan.lost, lost);
    assert_eq!(plan.hand_over, vec![(asked.id.clone(), "other".to_owned())]);
}

#[test]
fn a_split_parent_is_never_acquired_and_deleted_once_nobody_renews_it() {
    let children = [lease(0, 2, None, Duration::ZERO), lease(1, 2, None, Duration::ZERO)];
    let mut parent = Lease::new("p", &EpkRange::new("", "FF"), None);
    for (owner, age, deleted) in [
        (Some("old"), SECOND, false),
        (Some("old"), 61 * SECOND, true),
        (None, SECOND, true),
    ] {
        parent.owner = owner.map(str::to_owned);
        parent.timestamp = owner.map(|_| NOW - age);
        let mut leases = children.to_vec();
        leases.push(parent.clone());
        let plan = plan_for(&snapshot(leases, &[]), &[], options());
        assert!(plan.acquire.iter().all(|a| a.write.id != parent.id));
        assert_eq!(
            plan.delete.iter().any(|l| l.id == parent.id),
            deleted,
            "{owner:?} {age:?}"
        );
        assert!(plan.overlapping.is_empty());
    }
}

/// Leases of this instance no task of it processes, kept alive by its heartbeat.
fn kept_alive_by_me(leases: Vec<Lease>) -> LeaseSnapshot {
    let mut listing = snapshot(leases, &[("me", SECOND)]);
    listing.keepers = vec!["me".to_owned()];
    listing
}

#[test]
fn a_split_parent_left_here_by_a_failed_delete_is_deleted_while_its_owner_lives() {
    let children = [lease(0, 2, Some("me"), SECOND), lease(1, 2, Some("me"), SECOND)];
    let mut parent = Lease::new("p", &EpkRange::new("", "FF"), None);
    parent.owner = Some("me".into());
    parent.timestamp = Some(NOW - SECOND);
    let mut leases = children.to_vec();
    leases.push(parent.clone());
    let listing = kept_alive_by_me(leases);
    let left = plan_for(&listing, &[&children[0], &children[1]], options());
    assert_eq!(left.delete.iter().map(|l| &l.id).collect::<Vec<_>>(), [&parent.id]);
    // While the split's task still runs, the parent is its to delete.
    let splitting = plan_for(&listing, &[&children[0], &children[1], &parent], options());
    assert!(splitting.delete.is_empty());
}

/// A lease over the whole key space as version 0 (`token`) or EPK (`None`) at checkpoint `lsn`,
/// owned by `owner` and written `age` ago.
fn whole_range(token: Option<&str>, lsn: u64, owner: &str, age: Duration) -> Lease {
    let range = EpkRange::full();
    let continuation = Some(format!("\"{lsn}\""));
    let mut lease = match token {
        Some(token) => Lease::for_partition("p", token, &range, continuation),
        None => Lease::new("p", &range, continuation),
    };
    lease.owner = Some(owner.to_owned());
    lease.timestamp = Some(NOW - age);
    lease.etag = format!("etag-{}", lease.id);
    lease
}

#[test]
fn of_two_leases_with_one_range_only_the_one_behind_is_taken_and_the_other_deleted() {
    // A rewrite whose old document could not be deleted: the new one was written after it.
    let old = whole_range(None, 10, "me", 2 * SECOND);
    let new = whole_range(Some("0"), 10, "me", SECOND);
    let plan = plan_for(&kept_alive_by_me(vec![old.clone(), new.clone()]), &[], options());
    assert_eq!(steps(&plan), [(new.lease_token.clone(), AcquireStep::Take, None)]);
    assert_eq!(plan.delete.iter().map(|l| &l.id).collect::<Vec<_>>(), [&old.id]);
    assert!(plan.overlapping.is_empty());
    // A checkpoint further on may never have been earned (a lease created from "now"): the one
    // behind is kept, whatever was written last.
    let ahead = whole_range(None, 20, "me", SECOND);
    let behind = whole_range(Some("0"), 10, "me", 2 * SECOND);
    let plan = plan_for(&kept_alive_by_me(vec![ahead.clone(), behind.clone()]), &[], options());
    assert_eq!(steps(&plan), [(behind.lease_token.clone(), AcquireStep::Take, None)]);
    assert_eq!(plan.delete.iter().map(|l| &l.id).collect::<Vec<_>>(), [&ahead.id]);
    // But one processed here is kept over one this instance left: it read on from there.
    let plan = plan_for(
        &kept_alive_by_me(vec![ahead.clone(), behind.clone()]),
        &[&ahead],
        options(),
    );
    assert!(plan.acquire.is_empty(), "{:?}", steps(&plan));
    assert_eq!(plan.delete.iter().map(|l| &l.id).collect::<Vec<_>>(), [&behind.id]);
    assert!(plan.lost.is_empty());
}

#[test]
fn a_lease_processed_here_stops_when_another_live_owner_has_the_lease_kept_over_its_range() {
    let mine = whole_range(None, 20, "me", SECOND);
    let theirs = whole_range(Some("0"), 10, "other", SECOND);
    let listing = snapshot(vec![mine.clone(), theirs.clone()], &[("me", SECOND), ("other", SECOND)]);
    let plan = plan_for(&listing, &[&mine], options());
    assert_eq!(plan.lost, std::slice::from_ref(&mine.id));
    assert!(plan.acquire.is_empty(), "{:?}", steps(&plan));
    // Kept by a lease of this instance (a rewrite under way): its task goes on.
    let own = whole_range(Some("0"), 20, "me", SECOND);
    let plan = plan_for(&kept_alive_by_me(vec![mine.clone(), own]), &[&mine], options());
    assert!(plan.lost.is_empty());
    assert!(plan.acquire.is_empty(), "{:?}", steps(&plan));
}

#[test]
fn a_split_child_is_not_taken_while_the_parent_s_task_still_reads_its_range() {
    let mut parent = Lease::new("p", &EpkRange::full(), None);
    parent.owner = Some("me".into());
    parent.timestamp = Some(NOW - SECOND);
    // The split wrote one child and failed at the other: it is tried again.
    let child = lease(0, 2, Some("me"), SECOND);
    let listing = kept_alive_by_me(vec![parent.clone(), child.clone()]);
    let plan = plan_for(&listing, &[&parent], options());
    assert!(plan.acquire.is_empty(), "{:?}", steps(&plan));
    assert!(plan.delete.is_empty() && plan.lost.is_empty());
    // Both left under this name (a restart): the parent is taken, its child waits within it.
    let plan = plan_for(&listing, &[], options());
    assert_eq!(steps(&plan), [(parent.lease_token.clone(), AcquireStep::Take, None)]);
}

#[test]
fn a_stalled_lease_goes_to_no_instance_that_is_leaving() {
    let mut listing = snapshot(Vec::new(), &[("me", SECOND), ("stays", SECOND), ("leaves", SECOND)]);
    listing.leaving = vec!["leaves".to_owned()];
    assert_eq!(plan_for(&listing, &[], options()).others, ["stays"]);
}

#[test]
fn heartbeats_older_than_five_expirations_are_removed() {
    let plan = plan_for(
        &snapshot(
            Vec::new(),
            &[("fresh", SECOND), ("old", 299 * SECOND), ("dead", 301 * SECOND)],
        ),
        &[],
        options(),
    );
    assert_eq!(plan.remove_heartbeats, vec!["dead".to_owned()]);
}

#[test]
fn an_overdue_lease_of_another_is_looked_at_again_as_it_expires() {
    // Renewed 50 s ago (overdue after 2 × 17 s): expires in 10 s, before the next cycle in 13 s.
    let overdue = lease(0, 2, Some("other"), 50 * SECOND);
    let healthy = lease(1, 2, Some("other"), SECOND);
    let listing = snapshot(vec![overdue, healthy], &[("me", SECOND), ("other", SECOND)]);
    let plan = plan_for(&listing, &[], options());
    assert_eq!(plan.takeover_in, Some(10 * SECOND));
    let steal_one = CycleOptions {
        balancing: Balancing::StealOne,
        ..options()
    };
    assert_eq!(plan_for(&listing, &[], steal_one).takeover_in, None);
}

#[test]
fn quiet_listings_wait_longer_and_any_change_brings_the_acquire_interval_back() {
    let mine = lease(0, 1, Some("me"), SECOND);
    let listing = snapshot(vec![mine.clone()], &[("me", SECOND)]);
    let mut seen = observations(&listing, &[&mine]);
    let first = plan_cycle(&listing, &seen, "me", NOW, options());
    assert_eq!(
        first.next_interval,
        options().acquire_interval,
        "a first listing is never quiet"
    );
    seen.listed_ids = first.listed_ids.clone();
    let quiet = plan_cycle(&listing, &seen, "me", NOW, options());
    assert!(quiet.next_interval > options().acquire_interval);
    seen.listing_interval = quiet.next_interval;
    seen.awaiting_handoff = true;
    assert_eq!(
        plan_cycle(&listing, &seen, "me", NOW, options()).next_interval,
        options().acquire_interval
    );
}

#[test]
fn invalid_and_overlapping_documents_are_reported() {
    let a = lease(0, 2, None, Duration::ZERO);
    let mut b = Lease::new("p", &EpkRange::new("40", "C0"), None);
    b.etag = "e".into();
    let mut listing = snapshot(vec![a.clone(), b.clone(), lease(1, 2, None, Duration::ZERO)], &[]);
    listing.invalid = vec![("p..junk".into(), "no owner field".into())];
    let plan = plan_for(&listing, &[], options());
    assert_eq!(plan.invalid, listing.invalid);
    assert!(plan.overlapping.contains(&b.id));
}

/// The default options with fair balancing or the reference strategy.
fn balanced_by(fair: bool) -> CycleOptions {
    CycleOptions {
        balancing: if fair { Balancing::Fair } else { Balancing::StealOne },
        ..options()
    }
}

/// Any listing: leases of 1–8 ranges with random owners, ages and handoff requests.
fn any_listing() -> impl Strategy<Value = (LeaseSnapshot, Vec<usize>)> {
    let owner = prop_oneof![Just(None), Just(Some("me")), Just(Some("a")), Just(Some("b"))];
    let one = (owner, 0u64..200, proptest::option::of((0usize..3, 0u64..200)));
    (1u32..9)
        .prop_flat_map(move |n| {
            (
                Just(n),
                proptest::collection::vec(one.clone(), n as usize),
                proptest::collection::vec(0usize..(n as usize), 0..4),
            )
        })
        .prop_map(|(n, specs, owned)| {
            let leases = specs
                .into_iter()
                .enumerate()
                .map(|(i, (owner, age, asked))| {
                    let mut l = lease(i as u32, n, owner, Duration::from_secs(age));
                    if let Some((who, ago)) = asked {
                        l.request_handoff(["me", "a", "b"][who], NOW - Duration::from_secs(ago));
                    }
                    l
                })
                .collect();
            let beats = [("me", SECOND), ("a", 5 * SECOND), ("b", 400 * SECOND)];
            (snapshot(leases, &beats), owned)
        })
}

proptest! {
    #[test]
    fn a_plan_never_takes_what_it_processes_never_asks_itself_and_writes_each_lease_once(
        (listing, owned) in any_listing(),
        fair in any::<bool>(),
    ) {
        let owned: Vec<&Lease> = owned.iter().map(|i| &listing.leases[*i]).collect();
        let options = balanced_by(fair);
        let seen = observations(&listing, &owned);
        let plan = plan_cycle(&listing, &seen, "me", NOW, options);
        let mut written = HashSet::new();
        for a in &plan.acquire {
            prop_assert!(!seen.owned.contains(&a.write.id));
            prop_assert!(written.insert(a.write.id.clone()), "written twice");
            prop_assert_ne!(a.previous_owner.as_deref(), Some("me"));
            let listed = listing.leases.iter().find(|l| l.id == a.write.id).unwrap();
            prop_assert_eq!(&a.write.etag, &listed.etag);
            match a.step {
                AcquireStep::Take => {
                    prop_assert_eq!(a.write.owner.as_deref(), Some("me"));
                    prop_assert!(a.write.handoff_request().is_none());
                }
                AcquireStep::AskHandoff => {
                    prop_assert!(!listed.is_expired(NOW, options.expiration));
                    prop_assert_eq!(&a.write.owner, &listed.owner);
                    prop_assert_eq!(a.write.handoff_request(), Some(("me", NOW)));
                }
            }
        }
        for id in plan.lost.iter().chain(plan.hand_over.iter().map(|(id, _)| id)) {
            prop_assert!(seen.owned.contains(id));
        }
        for (_, to) in &plan.hand_over {
            prop_assert_ne!(to.as_str(), "me");
        }
        prop_assert!(plan.delete.iter().all(|l| l.is_expired(NOW, options.expiration)));
        prop_assert_eq!(plan.remove_heartbeats.clone(), vec!["b".to_owned()]);
        prop_assert!(plan.next_interval >= options.acquire_interval);
    }
}

/// `listing` as it reads when every other instance's clock is `skew` off (their lease times,
/// heartbeats and handoff requests), ours right.
fn skewed(listing: &LeaseSnapshot, skew: time::Duration) -> LeaseSnapshot {
    let mut skewed = listing.clone();
    for lease in &mut skewed.leases {
        if lease.owner.as_deref() != Some("me") {
            lease.timestamp = lease.timestamp.map(|t| t + skew);
        }
        if let Some((to, at)) = lease.handoff_request().map(|(to, at)| (to.to_owned(), at))
            && to != "me"
        {
            lease.request_handoff(&to, at + skew);
        }
    }
    for (name, beat) in &mut skewed.instances {
        if name != "me" {
            *beat += skew;
        }
    }
    skewed
}

#[test]
fn a_live_owner_whose_clock_is_minutes_behind_keeps_its_lease_and_a_dead_one_ahead_loses_it() {
    let options = options();
    // Renewed a second ago by a clock five minutes slow: its timestamp says 5 min old.
    let live = lease(0, 2, Some("other"), SECOND);
    let listing = snapshot(
        vec![live.clone(), lease(1, 2, Some("other"), SECOND)],
        &[("other", SECOND)],
    );
    let seen = observations(&listing, &[]);
    let behind = skewed(&listing, -time::Duration::minutes(5));
    let plan = plan_cycle(&behind, &seen, "me", NOW, options);
    assert!(
        plan.acquire.iter().all(|a| a.step == AcquireStep::AskHandoff),
        "a live lease is asked for, never taken: {:?}",
        steps(&plan)
    );
    // Dead for 61 s, written by a clock five minutes fast (its timestamp lies in our future).
    let dead = lease(0, 1, Some("gone"), 61 * SECOND);
    let listing = snapshot(vec![dead.clone()], &[]);
    let ahead = skewed(&listing, time::Duration::minutes(5));
    let plan = plan_cycle(&ahead, &observations(&listing, &[]), "me", NOW, options);
    assert_eq!(steps(&plan), vec![(dead.lease_token, AcquireStep::Take, None)]);
}

proptest! {
    #[test]
    fn no_decision_depends_on_other_instances_clocks(
        (listing, owned) in any_listing(),
        skew_seconds in -300i64..=300,
        fair in any::<bool>(),
    ) {
        let owned: Vec<&Lease> = owned.iter().map(|i| &listing.leases[*i]).collect();
        let options = balanced_by(fair);
        // What this instance saw, on its own clock, is the same whatever the others' clocks say.
        let seen = observations(&listing, &owned);
        let straight = plan_cycle(&listing, &seen, "me", NOW, options);
        let other = plan_cycle(&skewed(&listing, time::Duration::seconds(skew_seconds)), &seen, "me", NOW, options);
        prop_assert_eq!(steps(&straight), steps(&other));
        prop_assert_eq!(straight.takeover_in, other.takeover_in);
        prop_assert_eq!(&straight.remove_heartbeats, &other.remove_heartbeats);
        prop_assert_eq!(&straight.lost, &other.lost);
        prop_assert_eq!(&straight.hand_over, &other.hand_over);
        let deleted = |p: &CyclePlan| p.delete.iter().map(|l| l.id.clone()).collect::<Vec<_>>();
        prop_assert_eq!(deleted(&straight), deleted(&other));
        prop_assert_eq!(straight.next_interval, other.next_interval);
    }
}

#[test]
fn an_overdue_lease_is_looked_at_when_it_expires_if_that_is_before_the_next_cycle() {
    // (what, leases of others by owner and seconds since they were seen to change, wait)
    type Case<'a> = (&'a str, &'a [(&'a str, u64)], Option<u64>);
    let cases: &[Case] = &[
        ("nothing owned by others", &[], None),
        ("renewed lately", &[("a", 15), ("b", 1)], None),
        ("overdue, expiring after the next cycle", &[("a", 40)], None),
        (
            "a stopped owner's lease expires in 4 s",
            &[("a", 15), ("b", 56)],
            Some(4),
        ),
        ("the earliest of several", &[("b", 51), ("c", 58), ("d", 53)], Some(2)),
        ("my own leases are renewed, not taken", &[("me", 57)], None),
        ("already expired: the cycle takes it", &[("a", 61)], None),
        ("exactly one cycle away waits for the cycle", &[("a", 47)], None),
    ];
    for (name, owned_by, wanted) in cases {
        let n = owned_by.len().max(1) as u32;
        let leases = owned_by
            .iter()
            .enumerate()
            .map(|(i, (owner, seconds))| lease(i as u32, n, Some(owner), Duration::from_secs(*seconds)))
            .collect();
        let plan = plan_for(&snapshot(leases, &[]), &[], options());
        assert_eq!(plan.takeover_in, wanted.map(Duration::from_secs), "{name}");
    }
    let short = CycleOptions {
        expiration: Duration::from_secs(20),
        ..options()
    };
    let healthy = snapshot(vec![lease(0, 1, Some("a"), Duration::from_secs(10))], &[]);
    assert_eq!(
        plan_for(&healthy, &[], short).takeover_in,
        None,
        "an expiration shorter than the cycle does not wake healthy owners' leases"
    );
}

#[test]
fn a_request_is_honoured_only_for_an_instance_that_is_here() {
    let asked_by = |who: &str| {
        let mut lease = lease(0, 1, Some("me"), SECOND);
        lease.request_handoff(who, NOW - SECOND);
        lease
    };
    // (requester, its heartbeat's age, whether it says it is leaving, handed over)
    let cases = [
        ("joining", Some(SECOND), false, true),
        ("left", Some(400 * SECOND), false, false),
        ("never-seen", None, false, false),
        // Stopping: it would only free the lease again.
        ("stopping", Some(SECOND), true, false),
    ];
    for (who, beat, leaving, handed) in cases {
        let mine = asked_by(who);
        let beats: Vec<(&str, Duration)> = beat.map(|age| (who, age)).into_iter().collect();
        let mut listed = snapshot(vec![mine.clone()], &beats);
        if leaving {
            listed.leaving.push(who.to_owned());
        }
        let plan = plan_for(&listed, &[&mine], options());
        assert_eq!(!plan.hand_over.is_empty(), handed, "{who}");
        assert_eq!(plan.clear_requests == vec![mine.id.clone()], !handed, "{who}");
    }
    // An instance that renews a lease of its own is here without a heartbeat.
    let mine = asked_by("busy");
    let theirs = lease(1, 2, Some("busy"), SECOND);
    let plan = plan_for(&snapshot(vec![mine.clone(), theirs], &[]), &[&mine], options());
    assert_eq!(plan.hand_over, vec![(mine.id, "busy".to_owned())]);
}

#[test]
fn an_acquisition_from_a_live_owner_is_retried_after_a_412_only_while_its_reason_holds() {
    let later = NOW + 5 * SECOND;
    let asked_at = NOW - 61 * SECOND;
    let planned = |step: AcquireStep, previous: Option<&str>| {
        let mut write = lease(0, 1, previous, SECOND);
        match step {
            AcquireStep::AskHandoff => write.request_handoff("me", NOW),
            AcquireStep::Take => {
                write.owner = Some("me".into());
                write.clear_handoff();
            }
        }
        Acquisition {
            write,
            previous_owner: previous.map(str::to_owned),
            step,
        }
    };
    // The lease as re-read: its owner, a request on it, and a checkpoint the owner wrote since.
    let current = |owner: Option<&str>, request: Option<&str>| {
        let mut l = lease(0, 1, owner, SECOND);
        l.continuation = Some("\"42\"".into());
        l.etag = "etag-new".into();
        if let Some(by) = request {
            l.request_handoff(by, asked_at);
        }
        l
    };
    use AcquireStep::{AskHandoff, Take};
    let cases = [
        // The owner only checkpointed: the take goes on from its fresh copy.
        (
            Take,
            Some("other"),
            current(Some("other"), Some("me")),
            Some(Some("me")),
        ),
        // The owner dropped the request while checkpointing: still taken (patience was spent).
        (Take, Some("other"), current(Some("other"), None), Some(Some("me"))),
        (Take, Some("other"), current(Some("third"), None), None),
        (Take, Some("other"), current(Some("other"), Some("third")), None),
        // A free or expired lease that changed was renewed or taken: no retry.
        (Take, None, current(None, None), None),
        (
            AskHandoff,
            Some("other"),
            current(Some("other"), None),
            Some(Some("other")),
        ),
        (AskHandoff, Some("other"), current(Some("other"), Some("third")), None),
        (AskHandoff, Some("other"), current(None, None), None),
    ];
    for (step, previous, now_is, expected) in cases {
        let case = format!("{step:?} from {previous:?} on {:?}", now_is.owner);
        let retried = retry_acquisition(&planned(step, previous), now_is, later);
        assert_eq!(retried.as_ref().map(|l| l.owner.as_deref()), expected, "{case}");
        if let Some(write) = retried {
            assert_eq!(write.etag, "etag-new", "{case}: If-Match the version read");
            assert_eq!(
                write.continuation.as_deref(),
                Some("\"42\""),
                "{case}: the owner's checkpoint kept"
            );
            match step {
                Take => {
                    assert_eq!(write.handoff_request(), None, "{case}");
                    assert_eq!(write.timestamp, Some(later), "{case}");
                }
                AskHandoff => assert_eq!(write.handoff_request(), Some(("me", NOW)), "{case}"),
            }
        }
    }
}

/// `listing` with the heartbeats of `keepers` carrying the liveness marker.
fn kept_by(mut listing: LeaseSnapshot, keepers: &[&str]) -> LeaseSnapshot {
    listing.keepers = keepers.iter().map(|k| (*k).to_owned()).collect();
    listing
}

#[test]
fn a_keepers_lease_lives_while_its_heartbeat_beats_and_expires_with_it() {
    // b last wrote its lease 5 minutes ago; only its heartbeat tells that it is alive.
    let idle = lease(0, 2, Some("b"), 300 * SECOND);
    let other = lease(1, 2, Some("me"), SECOND);
    let table = [
        ("beating 10 s ago", 10, true, false),
        ("beat 59 s ago", 59, true, false),
        ("silent for an expiration", 61, true, true),
    ];
    for (case, beat_age, marked, taken) in table {
        let keepers: &[&str] = if marked { &["b", "me"] } else { &["me"] };
        let listing = kept_by(
            snapshot(
                vec![idle.clone(), other.clone()],
                &[("b", beat_age * SECOND), ("me", SECOND)],
            ),
            keepers,
        );
        let plan = plan_for(&listing, &[&other], options());
        let took = plan
            .acquire
            .iter()
            .any(|a| a.write.lease_token == idle.lease_token && a.step == AcquireStep::Take);
        assert_eq!(took, taken, "{case}: {:?}", steps(&plan));
    }
}

#[test]
fn each_lease_is_renewed_while_an_instance_that_judges_leases_one_by_one_is_live() {
    let mine = lease(0, 3, Some("me"), SECOND);
    let bs = lease(1, 3, Some("b"), SECOND);
    let cs = lease(2, 3, Some("c"), 300 * SECOND);
    /// (case, heartbeats and their ages, whose carry the marker, renewed one by one)
    type Case<'a> = (&'a str, Vec<(&'a str, Duration)>, &'a [&'a str], bool);
    let table: [Case; 5] = [
        (
            "every live instance keeps its leases by heartbeat",
            vec![("me", SECOND), ("b", SECOND), ("c", SECOND)],
            &["me", "b", "c"],
            false,
        ),
        (
            "b owns a lease and writes no marked heartbeat (an older version)",
            vec![("me", SECOND), ("c", SECOND)],
            &["me", "c"],
            true,
        ),
        (
            "an older version that owns nothing beats without the marker",
            vec![("me", SECOND), ("b", SECOND), ("c", SECOND), ("d", SECOND)],
            &["me", "b", "c"],
            true,
        ),
        (
            "an older version's heartbeat long stale counts no more",
            vec![("me", SECOND), ("b", SECOND), ("c", SECOND), ("d", 600 * SECOND)],
            &["me", "b", "c"],
            false,
        ),
        (
            "c died: its lease expired, nobody judges one by one",
            vec![("me", SECOND), ("b", SECOND), ("c", 120 * SECOND)],
            &["me", "b", "c"],
            false,
        ),
    ];
    for (case, beats, keepers, each) in table {
        let listing = kept_by(snapshot(vec![mine.clone(), bs.clone(), cs.clone()], &beats), keepers);
        let plan = plan_for(&listing, &[&mine], options());
        assert_eq!(plan.renew_each_lease, each, "{case}");
    }
}

#[test]
fn an_owner_above_its_share_lists_briskly_while_a_newcomer_is_about_to_ask() {
    let mine: Vec<Lease> = (0..4).map(|i| lease(i, 4, Some("me"), SECOND)).collect();
    let owned: Vec<&Lease> = mine.iter().collect();
    let brisk = options().acquire_interval / 4;
    let regular = options().acquire_interval;
    let table = [
        ("a newcomer arrived 1 s ago and holds nothing", 1, &mine[..], brisk),
        ("the newcomer arrived two acquire intervals ago", 27, &mine[..], regular),
    ];
    for (case, arrived, leases, next) in table {
        let listing = snapshot(leases.to_vec(), &[("me", SECOND), ("new", SECOND)]);
        let mut observed = observations(&listing, &owned);
        observed.sightings.arrived_at("new", observed.at - arrived * SECOND);
        let plan = plan_cycle(&listing, &observed, "me", NOW, options());
        assert_eq!(plan.next_interval, next, "{case}");
    }
    // At its share already (two each): nothing to expect.
    let shared = vec![
        lease(0, 4, Some("me"), SECOND),
        lease(1, 4, Some("me"), SECOND),
        lease(2, 4, Some("new"), SECOND),
        lease(3, 4, Some("new"), SECOND),
    ];
    let listing = snapshot(shared.clone(), &[("me", SECOND), ("new", SECOND)]);
    let mut observed = observations(&listing, &[&shared[0], &shared[1]]);
    observed.sightings.arrived_at("new", observed.at - SECOND);
    let plan = plan_cycle(&listing, &observed, "me", NOW, options());
    assert_eq!(plan.next_interval, regular, "at its share");
}

/// A listing sent at t0 + 0.2 s that came back at t0 + 2.05 s (throttled pages, a CPU-throttled
/// pod) read the owner's heartbeat before its beat at t0 + 0.3 s: the owner beat within the
/// expiration (2 s) of when the listing was sent, so its lease is not taken.
#[test]
fn a_late_listing_does_not_depose_an_owner_that_beat_while_it_was_under_way() {
    let options = CycleOptions {
        expiration: 2 * SECOND,
        renew_interval: Duration::from_millis(300),
        acquire_interval: Duration::from_millis(500),
        balancing: Balancing::Fair,
    };
    let owned = lease(0, 2, Some("b"), Duration::ZERO);
    let other = lease(1, 2, Some("b"), Duration::ZERO);
    let mut listing = snapshot(vec![owned, other], &[("b", Duration::ZERO), ("me", Duration::ZERO)]);
    listing.keepers = vec!["b".into(), "me".into()];
    let t0 = at();
    let ms = |n: u64| Duration::from_millis(n);
    let mut sightings = Sightings::default();
    sightings.observe_listing(&listing, t0, t0 + ms(10));
    let judged_at = sightings.observe_listing(&listing, t0 + ms(200), t0 + ms(2050));
    let observations = Observations {
        at: judged_at,
        sightings,
        owned: HashSet::new(),
        awaiting_handoff: false,
        listed_ids: Vec::new(),
        listing_interval: options.acquire_interval,
        left_stalled: HashSet::new(),
        moves_called: false,
    };
    let plan = plan_cycle(&listing, &observations, "me", NOW, options);
    let taken: Vec<_> = steps(&plan)
        .into_iter()
        .filter(|(_, step, _)| *step == AcquireStep::Take)
        .collect();
    assert!(taken.is_empty(), "took a live owner's lease: {taken:?}");
    // A handoff request is what a newcomer below its share writes: b is live.
    assert!(
        steps(&plan).iter().all(|(_, _, owner)| owner.as_deref() == Some("b")),
        "{:?}",
        steps(&plan)
    );
}

#[test]
fn an_acquisition_or_request_carries_the_leases_write_rate_faded_as_listed() {
    use crate::processor::leases::work_report::{WRITE_RATE_PROPERTY, record_rate, reported_rate};
    // Expired (taken) and live (asked for), each reporting 40 operations a second 26 s (the
    // rate's time constant: two acquire intervals) before the listing's newest write.
    let mut expired = lease(0, 2, Some("gone"), 61 * SECOND);
    let mut live = lease(1, 2, Some("other"), SECOND);
    for l in [&mut expired, &mut live] {
        record_rate(l, 40.0);
        l.server_ts = Some(1_000);
    }
    let mut listing = snapshot(vec![expired, live], &[("me", SECOND), ("other", SECOND)]);
    listing.newest_server_ts = Some(1_026);
    for balancing in [Balancing::Fair, Balancing::Work] {
        let plan = plan_for(&listing, &[], CycleOptions { balancing, ..options() });
        assert!(!plan.acquire.is_empty(), "{balancing:?}");
        for acquisition in &plan.acquire {
            let rate = reported_rate(&acquisition.write).unwrap_or_default();
            assert!(
                (rate - 40.0 / std::f64::consts::E).abs() < 0.01,
                "{balancing:?} {:?}: {:?}",
                acquisition.step,
                acquisition.write.properties.get(WRITE_RATE_PROPERTY)
            );
        }
    }
}

#[test]
fn moves_by_work_are_made_when_two_listings_in_a_row_call_for_them_and_a_newcomers_at_once() {
    use crate::processor::leases::work_report::record_rate;
    // "other" owns the four hot leases, "me" four idle ones: an equal count, unequal work.
    let leases: Vec<Lease> = (0..8)
        .map(|i| {
            let mut l = lease(i, 8, Some(if i < 4 { "other" } else { "me" }), SECOND);
            record_rate(&mut l, if i < 4 { 100.0 } else { 0.0 });
            l.server_ts = Some(1_000);
            l
        })
        .collect();
    let mut listing = snapshot(leases, &[("me", SECOND), ("other", SECOND)]);
    listing.newest_server_ts = Some(1_000);
    let by_work = CycleOptions {
        balancing: Balancing::Work,
        ..options()
    };
    let mine: Vec<&Lease> = listing.leases[4..].iter().collect();
    let first = plan_cycle(&listing, &observations(&listing, &mine), "me", NOW, by_work);
    assert!(
        first.acquire.is_empty(),
        "one listing moves nothing: {:?}",
        steps(&first)
    );
    assert!(first.moves_planned, "the first listing plans a move");
    assert_eq!(
        first.next_interval,
        options().acquire_interval / 4,
        "the next listing comes briskly"
    );
    let mut seen = observations(&listing, &mine);
    seen.moves_called = true;
    let second = plan_cycle(&listing, &seen, "me", NOW, by_work);
    let asked: Vec<(String, AcquireStep)> = second.acquire.iter().map(|a| (a.write.id.clone(), a.step)).collect();
    // Both hot leases the plan moves here are heavy (a quarter of the mean or more): they are
    // not held back by the count, or a later plan could put them elsewhere.
    assert_eq!(asked.len(), 2, "the second listing in a row asks for two: {asked:?}");
    for (id, step) in &asked {
        assert_eq!(*step, AcquireStep::AskHandoff);
        assert!(
            listing.leases[..4].iter().any(|l| l.id == *id),
            "a hot lease: {asked:?}"
        );
    }
    // A newcomer (no lease yet) asks for its share at once: two hot leases even the loads.
    for l in &mut listing.leases {
        l.owner = Some("other".to_owned());
    }
    let newcomer = plan_cycle(&listing, &observations(&listing, &[]), "me", NOW, by_work);
    assert_eq!(newcomer.acquire.len(), 2, "{:?}", steps(&newcomer));
}
