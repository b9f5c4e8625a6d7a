//! How often an instance lists the leases: the idle back-off of the acquire cycle. Pure.
//!
//! An instance lists every lease once per acquire interval (13 s by default, like the reference
//! processors): that is how it sees free leases, new instances, leases a stopped instance released,
//! owners that stopped beating and handoff requests. Heartbeats (one write per instance every renew
//! interval, [`crate::processor::leases::heartbeat`]) are what keep leases alive and cannot be
//! spared; the listing can, but only where nothing it could show would then be seen later:
//! - the instance is the only live one and owns every lease, so no other instance can crash or
//!   release a lease it would have to take over (failover is never slower);
//! - nobody asked it for a handoff, and the leases are the ones the previous listing showed.
//!
//! Then each such quiet listing doubles the wait before the next one, up to the longest wait
//! the plan gives (the renew interval: a newcomer's handoff request, which an idle owner that
//! writes no lease learns of only from a listing, is met within a renew interval as it was when
//! every lease was renewed). Any listing that is not quiet, and any lease the instance stops
//! processing, bring the wait back to the acquire interval.

use std::time::Duration;

use crate::processor::policy::balancer::LeaseState;

/// The bounds of the wait between two listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListingSchedule {
    /// The acquire interval: the wait after any listing that is not quiet.
    pub base: Duration,
    /// The longest wait after quiet listings.
    pub idle_max: Duration,
}

impl ListingSchedule {
    /// The schedule of an instance with this acquire interval that waits at most `longest`
    /// after quiet listings (never less than the acquire interval).
    pub fn new(acquire_interval: Duration, longest: Duration) -> Self {
        Self {
            base: acquire_interval,
            idle_max: longest.max(acquire_interval),
        }
    }

    /// The wait while handoff requests are expected, or moves by work wait for a second listing
    /// to call for them too (a quarter of the acquire interval).
    pub fn brisk(&self) -> Duration {
        self.base / 4
    }

    /// The wait before the next listing, `current` being the wait before this one.
    pub fn next(&self, current: Duration, quiet: bool) -> Duration {
        if quiet {
            current.saturating_mul(2).clamp(self.base, self.idle_max)
        } else {
            self.base
        }
    }
}

/// What one listing showed, as far as the schedule is concerned.
#[derive(Debug, Clone, Copy)]
pub struct ListingView<'a> {
    /// The leases that are balanced (split parents aside), with their live owners.
    pub leases: &'a [LeaseState],
    /// The live instances (heartbeats).
    pub live: &'a [String],
    /// Whether any lease carries a handoff request.
    pub handoff_asked: bool,
    /// Whether the lease ids are the ones the previous listing showed.
    pub same_leases: bool,
}

/// Whether a listing shows nothing that needs `me` to look again soon: `me` is the only live
/// instance and owns every lease, no handoff is asked, and no lease came or went.
pub fn is_quiet(view: &ListingView<'_>, me: &str) -> bool {
    view.same_leases
        && !view.handoff_asked
        && !view.leases.is_empty()
        && view.leases.iter().all(|l| l.live_owner.as_deref() == Some(me))
        && view.live.iter().all(|instance| instance == me)
}

/// Whether a plan judged `age` ago confirms this one's moves by work: late enough for a busy
/// owner's reports to land (an eighth of the acquire interval; the brisk listing that follows an
/// unconfirmed plan comes at a quarter), not so late that it spoke of other weights (two acquire
/// intervals; a listing that failed in between leaves a stale plan).
pub fn confirms_moves(age: Duration, acquire_interval: Duration) -> bool {
    age >= acquire_interval / 8 && age <= acquire_interval * 2
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leases(owners: &[Option<&str>]) -> Vec<LeaseState> {
        owners
            .iter()
            .enumerate()
            .map(|(i, owner)| LeaseState::owned_by(format!("l{i}"), owner.map(str::to_owned)))
            .collect()
    }

    #[test]
    fn a_listing_is_quiet_only_for_the_sole_owner_of_unchanged_leases() {
        let mine = leases(&[Some("me"), Some("me")]);
        let shared = leases(&[Some("me"), Some("b")]);
        let free = leases(&[Some("me"), None]);
        let me_only = vec!["me".to_owned()];
        let two = vec!["me".to_owned(), "b".to_owned()];
        let view = |leases, live, handoff_asked, same_leases| ListingView {
            leases,
            live,
            handoff_asked,
            same_leases,
        };
        type Case<'a> = (&'a str, ListingView<'a>, bool);
        let cases: Vec<Case> = vec![
            ("alone, owning every lease", view(&mine, &me_only, false, true), true),
            ("alone, no heartbeat of mine seen", view(&mine, &[], false, true), true),
            ("another instance beats", view(&mine, &two, false, true), false),
            (
                "another instance owns a lease",
                view(&shared, &me_only, false, true),
                false,
            ),
            ("a lease is free or expired", view(&free, &me_only, false, true), false),
            ("a handoff is asked", view(&mine, &me_only, true, true), false),
            ("leases came or went", view(&mine, &me_only, false, false), false),
            ("no leases yet", view(&[], &me_only, false, true), false),
        ];
        for (name, view, quiet) in cases {
            assert_eq!(is_quiet(&view, "me"), quiet, "{name}");
        }
    }

    #[test]
    fn quiet_listings_double_the_wait_up_to_the_longest_and_anything_else_resets_it() {
        let s = |secs| Duration::from_secs(secs);
        let schedule = ListingSchedule::new(s(13), s(60));
        type Case = (&'static str, Duration, bool, Duration);
        let cases: &[Case] = &[
            ("first quiet listing", s(13), true, s(26)),
            ("second", s(26), true, s(52)),
            ("capped at the longest wait", s(52), true, s(60)),
            ("stays at the cap", s(60), true, s(60)),
            ("a change resets", s(60), false, s(13)),
            ("not quiet from the start", s(13), false, s(13)),
        ];
        for (name, current, quiet, next) in cases {
            assert_eq!(schedule.next(*current, *quiet), *next, "{name}");
        }
        let short = ListingSchedule::new(s(13), s(5));
        assert_eq!(
            short.next(s(13), true),
            s(13),
            "a longest wait below the acquire interval never backs off"
        );
    }

    #[test]
    fn a_plan_confirms_moves_from_an_eighth_of_an_acquire_interval_to_two_intervals_later() {
        let acquire = Duration::from_secs(13);
        for (age_ms, confirms) in [
            (0, false),
            (1_000, false),
            (1_625, true),
            (3_250, true),
            (26_000, true),
            (26_001, false),
        ] {
            assert_eq!(
                confirms_moves(Duration::from_millis(age_ms), acquire),
                confirms,
                "{age_ms} ms"
            );
        }
    }
}
