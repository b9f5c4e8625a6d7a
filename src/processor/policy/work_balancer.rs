//! Balancing by work (`Balancing::Work`): which leases one instance takes in an acquire cycle
//! when leases are weighed by what they cost their owners rather than counted. Pure.
//!
//! A lease's work is what its owner reported with its last write: the operations a second
//! written into it ([`crate::processor::leases::work_report`], faded by how long the lease was
//! not written since) plus its lag drained within a lease expiration ([`WorkTimings`]) — both
//! in operations a second — and
//! [`LEASE_FLOOR`] for the polls every lease costs (so idle leases are still spread by count).
//! Every instance computes one plan from the same listing (the weights come from the lease
//! documents and the listing's newest server time only, the plan is [`super::work_plan`]'s),
//! takes its own part of it, and moves go through the usual handoff, so nothing is delivered
//! twice; it asks for moves only when the listing before called for moves to it too (see
//! [`crate::processor::policy::cycle_plan`]).

use std::collections::{BTreeMap, HashMap};

use super::work_plan::{Held, Placement, PlanLease, Taker, equal_count, plan};
use crate::processor::leases::lag_report::reported_lag;
use crate::processor::leases::lease::Lease;
use crate::processor::leases::work_report::{WorkTimings, rate_as_of};
use crate::processor::policy::balancer::{LeaseState, counted, leases_to_acquire_among, roster};

/// The weight of a lease that reports nothing (every lease costs its owner polls), in documents
/// a second.
pub const LEASE_FLOOR: f64 = 1.0;

/// The work of `lease` in documents a second, as of the listing's newest server time.
pub fn lease_work(lease: &Lease, newest_ts: Option<i64>, timings: WorkTimings) -> f64 {
    let lag = reported_lag(lease).unwrap_or(0) as f64 / timings.lag_drain.as_secs_f64();
    LEASE_FLOOR + rate_as_of(lease, newest_ts, timings) + lag
}

/// The work of each of `leases` ([`lease_work`]), by id.
pub fn work_of(leases: &[&Lease], newest_ts: Option<i64>, timings: WorkTimings) -> HashMap<String, f64> {
    leases
        .iter()
        .map(|l| (l.id.clone(), lease_work(l, newest_ts, timings)))
        .collect()
}

/// Whether some lease of `work` ([`work_of`]) carries work (a rate or lag reported): balanced by
/// work, weights change while nothing else does, so listings do not back off as quiet ones do.
pub fn carries_work(work: &HashMap<String, f64>) -> bool {
    work.values().any(|w| carries(*w))
}

/// Whether a lease of `work` carries work: an operation a second or more beyond the floor (the
/// last traces of a faded rate do not switch the plan away from counting, and back).
fn carries(work: f64) -> bool {
    work >= 2.0 * LEASE_FLOOR
}

/// What one instance's part of a plan by work is.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkPicks {
    /// Free and expired leases dealt to it (while no lease carries work: every lease counting
    /// gives it).
    pub dealt: Vec<String>,
    /// Leases moved to it from a live owner.
    pub moved: Vec<String>,
    /// Whether it held fewer leases than an equal count before the moves (a newcomer, or one
    /// whose few leases were hot): its light moves fill its count, as counting alone would (heavy
    /// ones are all taken, so it may end above the count).
    pub short: bool,
}

impl WorkPicks {
    /// Every lease picked, dealt first.
    pub fn all(&self) -> Vec<String> {
        self.dealt.iter().chain(&self.moved).cloned().collect()
    }
}

/// The leases `me` should try to acquire now: its part of the plan by work
/// ([`super::work_plan`]). `leaving` instances take no part (they free their leases themselves);
/// `newcomers` are dealt no expired lease. Of the light leases the plan moves to it, an instance
/// takes at most what it lacks of an equal count, and at least one, in one cycle: a newcomer
/// takes its share at once, while a plan made on weights that are still changing (an owner too
/// busy to report yet looks idle) moves little at a time. While no lease carries work (an
/// operation a second or more), leases are balanced by count exactly as
/// [`leases_to_acquire_among`] does (an idle processor looks the same either way).
pub fn leases_to_acquire_by_work(
    leases: &[LeaseState],
    work: &HashMap<String, f64>,
    me: &str,
    live_instances: &[String],
    (leaving, newcomers): (&[String], &[String]),
) -> WorkPicks {
    if !work.values().any(|w| carries(*w)) {
        return WorkPicks {
            dealt: leases_to_acquire_among(leases, me, live_instances, (leaving, newcomers)),
            ..WorkPicks::default()
        };
    }
    let weight = |id: &str| work.get(id).copied().unwrap_or(LEASE_FLOOR);
    let names: BTreeMap<&str, ()> = roster(live_instances, me);
    let counted = counted(&names, leases);
    let stays = |w: &str| !leaving.iter().any(|l| l == w);
    let plan_leases: Vec<PlanLease> = leases
        .iter()
        .filter_map(|lease| {
            let held = match (lease.live_owner.as_deref(), lease.on_its_way_to(&counted)) {
                (Some(_), Some(to)) if stays(to) => Held::OnItsWayTo(to),
                (Some(owner), _) if stays(owner) => Held::By(owner),
                (Some(_), _) => return None,
                (None, _) => Held::Free { expired: lease.expired },
            };
            Some(PlanLease {
                id: &lease.id,
                work: weight(&lease.id),
                held,
            })
        })
        .collect();
    let takers: Vec<Taker> = counted
        .iter()
        .filter(|w| stays(w))
        .map(|w| Taker {
            name: w,
            takes_expired: *w == me || !newcomers.iter().any(|n| n == w),
        })
        .collect();
    my_part(&plan(&plan_leases, &takers), &plan_leases, takers.len(), me)
}

/// `me`'s part of `placements`: what it is dealt, and its moves within its allowance.
fn my_part(placements: &[Placement], leases: &[PlanLease], takers: usize, me: &str) -> WorkPicks {
    let count_share = equal_count(leases.len(), takers);
    let mut mine = WorkPicks::default();
    for placement in placements.iter().filter(|p| p.to == me && p.from.is_none()) {
        mine.dealt.push(placement.id.to_owned());
    }
    let holds = |l: &&PlanLease| matches!(l.held, Held::By(o) | Held::OnItsWayTo(o) if o == me);
    let count = leases.iter().filter(holds).count() + mine.dealt.len();
    mine.short = count < count_share;
    let mut allowance = count_share.saturating_sub(count).max(1);
    for placement in placements.iter().filter(|p| p.to == me && p.from.is_some()) {
        if !placement.heavy {
            if allowance == 0 {
                continue;
            }
            allowance -= 1;
        }
        mine.moved.push(placement.id.to_owned());
    }
    mine
}

/// A lower bound of the lease moves that bring every one of `holdings` (each instance's lease
/// weights) within `ratio` × the mean load: from each instance above it, its heaviest leases
/// off until it is within — only leases that fit within the limit on the least loaded other
/// instance (a move takes one lease off one instance; a lease that fits nowhere stays).
pub fn fewest_moves(holdings: &[Vec<f64>], ratio: f64) -> usize {
    if holdings.is_empty() {
        return 0;
    }
    let loads: Vec<f64> = holdings.iter().map(|h| h.iter().sum()).collect();
    let limit = loads.iter().sum::<f64>() / holdings.len() as f64 * ratio;
    holdings
        .iter()
        .enumerate()
        .map(|(i, weights)| {
            let room = loads
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, load)| limit - load)
                .fold(f64::NEG_INFINITY, f64::max);
            let mut sorted: Vec<f64> = weights.iter().copied().filter(|w| *w <= room).collect();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let mut load = loads[i];
            sorted
                .iter()
                .take_while(|w| {
                    let over = load > limit;
                    load -= **w;
                    over
                })
                .count()
        })
        .sum()
}

#[cfg(test)]
#[path = "work_balancer_tests.rs"]
mod tests;
