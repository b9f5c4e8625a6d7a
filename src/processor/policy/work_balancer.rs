//! Balancing by work (`Balancing::Work`): which leases one instance takes in an acquire cycle
//! when leases are weighed by what they cost their owners rather than counted. Pure.
//!
//! A lease's work is what its owner reported with its last write: the operations a second
//! written into it ([`crate::processor::leases::work_report`], faded by how long the lease was
//! not written since) plus its lag drained within a lease expiration ([`WorkTimings`]) — both
//! in operations a second — and
//! [`LEASE_FLOOR`] for the polls every lease costs (so idle leases are still spread by count).
//! Every instance computes one plan from the same listing (the weights come from the lease
//! documents and the listing's newest server time only), takes its own part of it, and moves go
//! through the usual handoff, so nothing is delivered twice:
//! 1. free and expired leases are dealt heaviest first, each to the least loaded instance that
//!    may take it (expired ones not to newcomers, as [`super::balancer`] does);
//! 2. while the most loaded instance carries more than the mean by [`HYSTERESIS`], it gives its
//!    heaviest lease that fits to the least loaded: one that leaves the receiver below the donor
//!    by the hysteresis margin (the mean × [`HYSTERESIS`]) and within twice that margin of the
//!    mean (a new donor would pass small leases on; a lease too heavy for that stays). A lease
//!    so moved is never worth moving back while the loads stay within that
//!    margin, so leases do not travel to and fro. In one plan an instance receives by moves at
//!    most what it lacks of an equal count, and at least one (see [`moves`]); it asks for them
//!    only when the listing before called for moves to it too (see
//!    [`crate::processor::policy::cycle_plan`]).

use std::collections::{BTreeMap, HashMap};

use crate::processor::leases::lag_report::reported_lag;
use crate::processor::leases::lease::Lease;
use crate::processor::leases::work_report::{WorkTimings, rate_as_of};
use crate::processor::policy::balancer::{LeaseState, counted, leases_to_acquire_among, roster};

/// The weight of a lease that reports nothing (every lease costs its owner polls), in documents
/// a second.
pub const LEASE_FLOOR: f64 = 1.0;

/// How far above the mean a load may be before leases move, and how much lighter than the donor
/// the receiver must stay, as a share of the mean load.
pub const HYSTERESIS: f64 = 0.25;

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

/// What one instance carries.
#[derive(Debug, Default)]
struct Holding<'a> {
    /// The sum of its leases' work.
    load: f64,
    /// How many leases it holds or has on their way to it.
    count: usize,
    /// The leases it may give in this plan, with their work (not those on their way to it, nor
    /// those dealt or moved to it by this plan).
    movable: Vec<(&'a str, f64)>,
}

impl<'a> Holding<'a> {
    fn add(&mut self, work: f64) {
        self.load += work;
        self.count += 1;
    }
}

/// One lease given by the plan.
#[derive(Debug, PartialEq)]
struct Move<'a> {
    id: &'a str,
    from: &'a str,
    to: &'a str,
    work: f64,
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
    /// whose few leases were hot): its moves fill its count, as counting alone would.
    pub short: bool,
}

impl WorkPicks {
    /// Every lease picked, dealt first.
    pub fn all(&self) -> Vec<String> {
        self.dealt.iter().chain(&self.moved).cloned().collect()
    }
}

/// The leases `me` should try to acquire now (see the module): its part of the deal of free and
/// expired leases, and of the moves from the most loaded. `leaving` instances have no share and
/// give nothing (they free their leases themselves); `newcomers` are dealt no expired lease.
/// While no lease carries work (an operation a second or more), leases are balanced by count
/// exactly as [`leases_to_acquire_among`] does (an idle processor looks the same either way).
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
    let mut held: BTreeMap<&str, Holding> = roster(live_instances, me);
    let counted = counted(&held, leases);
    let mut unowned: Vec<&LeaseState> = Vec::new();
    for lease in leases {
        let w = weight(&lease.id);
        match (&lease.live_owner, lease.on_its_way_to(&counted)) {
            (Some(_), Some(to)) => held.entry(to).or_default().add(w),
            (Some(owner), None) => {
                let holding = held.entry(owner.as_str()).or_default();
                holding.add(w);
                holding.movable.push((&lease.id, w));
            }
            (None, _) => unowned.push(lease),
        }
    }
    let stays = |w: &str| !leaving.iter().any(|l| l == w);
    let watched = |w: &str| w == me || !newcomers.iter().any(|n| n == w);
    let mut mine = WorkPicks::default();
    unowned.sort_by(|a, b| weight(&b.id).total_cmp(&weight(&a.id)).then(a.id.cmp(&b.id)));
    for lease in unowned {
        let newcomers_wait = lease.expired && !newcomers.is_empty();
        let Some(taker) = least_loaded(&held, |w| stays(w) && (!newcomers_wait || watched(w))) else {
            continue;
        };
        if let Some(holding) = held.get_mut(taker) {
            holding.add(weight(&lease.id));
        }
        if taker == me {
            mine.dealt.push(lease.id.clone());
        }
    }
    mine.short = held.get(me).is_some_and(|h| h.count < count_share(&held, &stays));
    for step in moves(&mut held, &stays, leases.len()) {
        if step.to == me {
            mine.moved.push(step.id.to_owned());
        }
    }
    mine
}

/// An equal count of leases among the instances that `stay` (rounded down).
fn count_share(held: &BTreeMap<&str, Holding>, stays: &impl Fn(&str) -> bool) -> usize {
    let staying: Vec<&Holding> = held.iter().filter(|(w, _)| stays(w)).map(|(_, h)| h).collect();
    staying.iter().map(|h| h.count).sum::<usize>() / staying.len().max(1)
}

/// The staying instance (`may_take`) with the least load; ties: fewer leases, then the name.
fn least_loaded<'a>(held: &BTreeMap<&'a str, Holding>, may_take: impl Fn(&str) -> bool) -> Option<&'a str> {
    held.iter()
        .filter(|(w, _)| may_take(w))
        .min_by(|a, b| {
            a.1.load
                .total_cmp(&b.1.load)
                .then(a.1.count.cmp(&b.1.count))
                .then(a.0.cmp(b.0))
        })
        .map(|(w, _)| *w)
}

/// The moves from the most loaded to the least loaded, one at a time, until no instance that
/// `stays` carries more than the mean by [`HYSTERESIS`] or none of its leases fits; at most
/// `limit`. An instance receives by moves at most what it lacks of an equal count of leases, and
/// at least one: a newcomer takes its share at once, while a plan made on weights that are still
/// changing (an owner too busy to report yet looks idle) moves little at a time.
fn moves<'a>(held: &mut BTreeMap<&'a str, Holding<'a>>, stays: &impl Fn(&str) -> bool, limit: usize) -> Vec<Move<'a>> {
    let staying: Vec<&Holding> = held.iter().filter(|(w, _)| stays(w)).map(|(_, h)| h).collect();
    if staying.is_empty() {
        return Vec::new();
    }
    let mean = staying.iter().map(|h| h.load).sum::<f64>() / staying.len() as f64;
    let count_share = count_share(held, stays);
    let mut allowance: BTreeMap<&str, usize> = held
        .iter()
        .map(|(w, h)| (*w, count_share.saturating_sub(h.count).max(1)))
        .collect();
    let mut done = Vec::new();
    while done.len() < limit {
        let may_receive = |w: &str| stays(w) && allowance.get(w).is_some_and(|n| *n > 0);
        let Some(step) = next_move(held, stays, &may_receive, mean) else {
            break;
        };
        if let Some(from) = held.get_mut(step.from) {
            from.load -= step.work;
            from.count -= 1;
            from.movable.retain(|(id, _)| *id != step.id);
        }
        if let Some(to) = held.get_mut(step.to) {
            to.add(step.work);
        }
        if let Some(left) = allowance.get_mut(step.to) {
            *left -= 1;
        }
        done.push(step);
    }
    done
}

/// The next move: of the instances above the mean by the hysteresis, the most loaded first, the
/// heaviest lease that leaves the least loaded instance lighter than the donor by the margin.
fn next_move<'a>(
    held: &BTreeMap<&'a str, Holding<'a>>,
    stays: &impl Fn(&str) -> bool,
    may_receive: &impl Fn(&str) -> bool,
    mean: f64,
) -> Option<Move<'a>> {
    let margin = mean * HYSTERESIS;
    let to = least_loaded(held, may_receive)?;
    let receiver = held.get(to)?.load;
    let mut donors: Vec<(&str, &Holding)> = held
        .iter()
        .filter(|(w, h)| stays(w) && **w != to && h.load > mean + margin)
        .map(|(w, h)| (*w, h))
        .collect();
    donors.sort_by(|a, b| b.1.load.total_cmp(&a.1.load).then(a.0.cmp(b.0)));
    donors.into_iter().find_map(|(from, holding)| {
        // The receiver ends below the donor by the margin (so the lease never moves back).
        let improves = |work: f64| holding.load - receiver >= work + margin;
        let by_weight = |a: &&(&str, f64), b: &&(&str, f64)| a.1.total_cmp(&b.1).then(b.0.cmp(a.0));
        // The heaviest that leaves the receiver within twice the margin of the mean (a new donor
        // would pass small leases on, one move after another; a lease too heavy for that stays).
        holding
            .movable
            .iter()
            .filter(|(_, work)| improves(*work) && receiver + work <= mean + 2.0 * margin)
            .max_by(by_weight)
            .map(|(id, work)| Move {
                id,
                from,
                to,
                work: *work,
            })
    })
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
