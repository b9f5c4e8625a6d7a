//! The plan of balancing by work: where every lease belongs, computed as a whole from one
//! listing by every instance alike. Pure.
//!
//! With `M` the mean load of the instances that take part and the band `M × (1 + HYSTERESIS)`:
//! 1. **Heavy leases** (work above `M × HYSTERESIS`), heaviest first: each stays with its owner
//!    while the owner's heavy leases fit in the band; otherwise it goes to the instance it fits
//!    on that carries the least (its heavy leases placed so far and its light leases now), and a
//!    lease that fits nowhere goes to the instance with the least heavy leases' work (its owner
//!    when tied).
//! 2. **Light leases**: each instance keeps each of its own, heaviest first, that fits in the band
//!    on top of its heavy ones; the rest, heaviest first, go to the least loaded instance they fit
//!    on. A light lease always fits somewhere that may take it (were every instance above the
//!    band less it, they would carry more than everything there is).
//!
//! 3. **Fill**: while an instance is planned below the mean by the hysteresis and below an equal
//!    count of leases (a newcomer among instances each within the band), the least loaded such
//!    takes from the most loaded instance
//!    planned above the mean its heaviest lease the plan leaves there that keeps the receiver
//!    within the mean and the donor at or above the receivers' threshold (light leases only when
//!    some heavy lease fits nowhere). Receivers stay at or below the mean and donors above it, so
//!    what an instance received is never given away by a later fill.
//!
//! A lease on its way to an instance counts as that instance's in its turn. Whether a lease
//! stays depends only on the choices for heavier leases and on where it is, and a lease at its
//! planned place (or on its way there) is kept there, so a plan made after some of its moves
//! keeps them and plans the rest alike (light leases may be dealt differently, never moved
//! again): no lease moves twice while the weights hold, provided an instance's heavy moves and
//! the free leases dealt to it are taken together (where a heavy lease that must move goes
//! prefers the instance that carries least now, lighter leases included). For the fill this is
//! argued in part and property-tested.

use std::collections::{BTreeMap, BTreeSet};

/// How far above the mean a load may be before leases move (the band), as a share of the mean;
/// leases heavier than that share are placed first, one by one.
pub const HYSTERESIS: f64 = 0.25;

/// Keeping tolerates rounding that placing does not: a sum taken in another order may differ in
/// its last bits, and a lease placed exactly at the band must be kept there.
const KEEP_TOLERANCE: f64 = 1e-9;

/// Where a lease is as the listing shows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Held<'a> {
    /// Owned by an instance that takes part: it may move.
    By(&'a str),
    /// Asked for by an instance that takes part: it counts as the requester's and stays its.
    OnItsWayTo(&'a str),
    /// Free, or `expired` (then only instances that take expired leases may take it).
    Free { expired: bool },
}

/// One lease of the plan.
#[derive(Debug, Clone, Copy)]
pub struct PlanLease<'a> {
    /// The lease id.
    pub id: &'a str,
    /// Its work ([`super::work_balancer::lease_work`]).
    pub work: f64,
    /// Where it is.
    pub held: Held<'a>,
}

/// An instance that takes part in the plan.
#[derive(Debug, Clone, Copy)]
pub struct Taker<'a> {
    /// Its name.
    pub name: &'a str,
    /// Whether it may be dealt expired leases (it watched the lease container for an expiration).
    pub takes_expired: bool,
}

/// A lease the plan puts with another instance than now (or deals, when free).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placement<'a> {
    /// The lease id.
    pub id: &'a str,
    /// Its owner now; `None` when it is free.
    pub from: Option<&'a str>,
    /// The instance the plan puts it with.
    pub to: &'a str,
    /// Whether it was placed among the heavy leases (these are never held back by a receiver's
    /// allowance: a plan made later would put them elsewhere).
    pub heavy: bool,
}

/// What the plan has put on one instance so far.
#[derive(Debug, Default, Clone, Copy)]
struct Bin {
    /// The work of its heavy leases.
    heavy: f64,
    /// The work of every lease put on it (heavy ones included).
    load: f64,
    /// How many leases are put on it.
    count: usize,
    /// The work of the leases it holds now, less the heavy leases the plan took away so far and
    /// with those it put on it (a preference among heavy leases' takers only).
    now: f64,
    /// Whether it takes expired leases.
    takes_expired: bool,
}

/// The whole plan: every change of place, heavy leases first, each stage heaviest first.
pub fn plan<'a>(leases: &[PlanLease<'a>], takers: &[Taker<'a>]) -> Vec<Placement<'a>> {
    let mut bins: BTreeMap<&str, Bin> = takers
        .iter()
        .map(|t| {
            (
                t.name,
                Bin {
                    takes_expired: t.takes_expired,
                    ..Bin::default()
                },
            )
        })
        .collect();
    if bins.is_empty() {
        return Vec::new();
    }
    let mut sorted: Vec<&PlanLease> = leases.iter().collect();
    sorted.sort_by(|a, b| b.work.total_cmp(&a.work).then(a.id.cmp(b.id)));
    for lease in &sorted {
        if let Held::By(holder) | Held::OnItsWayTo(holder) = lease.held
            && let Some(bin) = bins.get_mut(holder)
        {
            bin.now += lease.work;
        }
    }
    // Summed in the plan's order, so that every instance's listing gives the same figure.
    let mean = sorted.iter().map(|l| l.work).sum::<f64>() / bins.len() as f64;
    let band = Band {
        cap: mean * (1.0 + HYSTERESIS),
        heavy: mean * HYSTERESIS,
    };
    let sorted_all = sorted.clone();
    let (heavy, light): (Vec<&PlanLease>, Vec<&PlanLease>) = sorted.into_iter().partition(|l| l.work > band.heavy);
    let heavy_plan = place_heavy(&heavy, &mut bins, band);
    let mut placed = heavy_plan.placed;
    placed.extend(place_light(&light, &mut bins, band));
    let givable = Givable {
        moved: placed.iter().map(|p| p.id).collect(),
        light_only: heavy_plan.fell_back.then_some(band.heavy),
    };
    let share = Share {
        mean,
        count: equal_count(leases.len(), bins.len()),
    };
    placed.extend(fill(&sorted_all, &bins, share, &givable));
    placed
}

/// The band of one plan.
#[derive(Debug, Clone, Copy)]
struct Band {
    /// The most an instance carries (the mean and the hysteresis).
    cap: f64,
    /// The work above which a lease is heavy.
    heavy: f64,
}

impl Band {
    fn keeps(self, load: f64, work: f64) -> bool {
        load + work <= self.cap * (1.0 + KEEP_TOLERANCE)
    }

    fn fits(self, load: f64, work: f64) -> bool {
        load + work <= self.cap
    }
}

/// Stage 1 (see the module).
fn place_heavy<'a>(heavy: &[&PlanLease<'a>], bins: &mut BTreeMap<&'a str, Bin>, band: Band) -> HeavyPlan<'a> {
    let mut plan = HeavyPlan::default();
    for lease in heavy {
        // A lease on its way counts in its turn, as it will once its requester holds it (and
        // falls back as it will then when it does not fit there).
        let owner = match lease.held {
            Held::By(owner) => Some(owner),
            Held::OnItsWayTo(to) => {
                plan.fell_back |= !bins.get(to).is_some_and(|b| band.keeps(b.heavy, lease.work));
                add(bins, to, lease.work, true);
                continue;
            }
            Held::Free { .. } => None,
        };
        let kept = owner.filter(|o| bins.get(o).is_some_and(|b| band.keeps(b.heavy, lease.work)));
        let taken = match kept {
            Some(to) => Some(Taken { to, fits: true }),
            None => heavy_taker(bins, lease, owner, band),
        };
        let Some(Taken { to, fits }) = taken else {
            continue;
        };
        plan.fell_back |= !fits;
        add(bins, to, lease.work, true);
        if owner != Some(to) {
            shift(bins, owner, to, lease.work);
            plan.placed.push(placement(lease, owner, to, true));
        }
    }
    plan
}

/// What stage 1 planned.
#[derive(Debug, Default)]
struct HeavyPlan<'a> {
    /// Its moves and deals.
    placed: Vec<Placement<'a>>,
    /// Whether some heavy lease fits nowhere (the fill then gives light leases only).
    fell_back: bool,
}

/// Where a heavy lease goes, and whether it fits there.
#[derive(Debug, Clone, Copy)]
struct Taken<'a> {
    to: &'a str,
    fits: bool,
}

/// Where a heavy lease its owner cannot keep goes: the instance it fits on that carries least,
/// else the one with the least heavy work (the owner when tied, else the one that carries least).
fn heavy_taker<'a>(
    bins: &BTreeMap<&'a str, Bin>,
    lease: &PlanLease,
    owner: Option<&str>,
    band: Band,
) -> Option<Taken<'a>> {
    let may_take = |bin: &Bin| !matches!(lease.held, Held::Free { expired: true }) || bin.takes_expired;
    let candidates = || bins.iter().filter(|(_, b)| may_take(b));
    let fitting = candidates()
        .filter(|(_, b)| band.fits(b.heavy, lease.work))
        .min_by(|a, b| a.1.now.total_cmp(&b.1.now).then(a.0.cmp(b.0)));
    let least = || {
        candidates().min_by(|a, b| {
            let stranger = |name: &str| Some(name) != owner;
            a.1.heavy
                .total_cmp(&b.1.heavy)
                .then(stranger(a.0).cmp(&stranger(b.0)))
                .then(a.1.now.total_cmp(&b.1.now))
                .then(a.0.cmp(b.0))
        })
    };
    match fitting {
        Some((to, _)) => Some(Taken { to, fits: true }),
        None => least().map(|(to, _)| Taken { to, fits: false }),
    }
}

/// Stage 2 (see the module).
fn place_light<'a>(light: &[&PlanLease<'a>], bins: &mut BTreeMap<&'a str, Bin>, band: Band) -> Vec<Placement<'a>> {
    for bin in bins.values_mut() {
        bin.load = bin.heavy;
    }
    let mut loose = Vec::new();
    for lease in light {
        match lease.held {
            Held::By(owner) if bins.get(owner).is_some_and(|b| band.keeps(b.load, lease.work)) => {
                add(bins, owner, lease.work, false);
            }
            Held::OnItsWayTo(to) => add(bins, to, lease.work, false),
            _ => loose.push(*lease),
        }
    }
    let mut placed = Vec::new();
    for lease in loose {
        let owner = match lease.held {
            Held::By(owner) => Some(owner),
            _ => None,
        };
        let Some(to) = light_taker(bins, lease, owner, band) else {
            continue;
        };
        add(bins, to, lease.work, false);
        if owner != Some(to) {
            placed.push(placement(lease, owner, to, false));
        }
    }
    placed
}

/// Where a light lease goes: the least loaded instance it fits on; when none (only when some
/// may not take it), its owner, or the least loaded that may take it.
fn light_taker<'a>(
    bins: &BTreeMap<&'a str, Bin>,
    lease: &PlanLease,
    owner: Option<&'a str>,
    band: Band,
) -> Option<&'a str> {
    let may_take = |bin: &Bin| !matches!(lease.held, Held::Free { expired: true }) || bin.takes_expired;
    let by_load = |a: &(&&str, &Bin), b: &(&&str, &Bin)| a.1.load.total_cmp(&b.1.load).then(a.0.cmp(b.0));
    let candidates = || bins.iter().filter(|(_, b)| may_take(b));
    candidates()
        .filter(|(_, b)| band.fits(b.load, lease.work))
        .min_by(by_load)
        .map(|(name, _)| *name)
        .or(owner)
        .or_else(|| candidates().min_by(by_load).map(|(name, _)| *name))
}

/// Which leases the fill may give.
struct Givable<'a> {
    /// The leases the stages before moved or dealt (never given again).
    moved: BTreeSet<&'a str>,
    /// When some heavy lease fits nowhere: the work above which a lease is heavy (only lighter
    /// ones are given, so the heavy stage falls back alike in the next plan).
    light_only: Option<f64>,
}

/// How many of `leases` an equal share by count holds among `instances` (rounded down).
pub(crate) fn equal_count(leases: usize, instances: usize) -> usize {
    leases / instances.max(1)
}

/// An equal share, by work and by count.
#[derive(Debug, Clone, Copy)]
struct Share {
    mean: f64,
    count: usize,
}

/// A lease the fill may give, with the instance that would give it.
#[derive(Debug, Clone, Copy)]
struct Gift<'a, 'l> {
    donor: &'a str,
    lease: &'l PlanLease<'a>,
}

/// Stage 3 (see the module): while an instance is planned below the mean by the hysteresis and
/// below an equal count, the least loaded such takes, from the most loaded instance planned
/// above the mean, its heaviest lease (one the plan leaves with it) that keeps the receiver
/// within the mean and the donor at or above the receivers' threshold.
fn fill<'a>(
    sorted: &[&PlanLease<'a>],
    bins: &BTreeMap<&'a str, Bin>,
    share: Share,
    givable: &Givable,
) -> Vec<Placement<'a>> {
    let mut bins = bins.clone();
    let mut left: Vec<Gift> = sorted
        .iter()
        .filter(|l| !givable.moved.contains(l.id) && givable.light_only.is_none_or(|heavy| l.work <= heavy))
        .filter_map(|lease| match lease.held {
            Held::By(donor) if bins.contains_key(donor) => Some(Gift { donor, lease }),
            _ => None,
        })
        .collect();
    let mut done: BTreeSet<&str> = BTreeSet::new();
    let mut placed = Vec::new();
    while let Some((short, short_load)) = neediest(&bins, &done, share) {
        let Some(i) = best_gift(&left, &bins, short_load, share.mean) else {
            done.insert(short);
            continue;
        };
        let Gift { donor, lease } = left.remove(i);
        for (name, work, count) in [(donor, -lease.work, -1), (short, lease.work, 1)] {
            if let Some(bin) = bins.get_mut(name) {
                bin.load += work;
                bin.count = bin.count.saturating_add_signed(count);
            }
        }
        placed.push(placement(lease, Some(donor), short, false));
    }
    placed
}

/// The least loaded instance below the mean by the hysteresis and below an equal count, not
/// `done` with, and its load.
fn neediest<'a>(bins: &BTreeMap<&'a str, Bin>, done: &BTreeSet<&str>, share: Share) -> Option<(&'a str, f64)> {
    let low = share.mean * (1.0 - HYSTERESIS);
    bins.iter()
        .filter(|(name, bin)| bin.load < low && bin.count < share.count && !done.contains(*name))
        .min_by(|a, b| a.1.load.total_cmp(&b.1.load).then(a.0.cmp(b.0)))
        .map(|(name, bin)| (*name, bin.load))
}

/// Of `left`, the gift to an instance carrying `short_load`: from the most loaded donor above the
/// `mean`, its heaviest lease that keeps the receiver within the mean and the donor at or above
/// the receivers' threshold (ties: donor, then lease id).
fn best_gift(left: &[Gift], bins: &BTreeMap<&str, Bin>, short_load: f64, mean: f64) -> Option<usize> {
    let low = mean * (1.0 - HYSTERESIS);
    let load_of = |donor: &str| bins.get(donor).map_or(0.0, |b| b.load);
    left.iter()
        .enumerate()
        .filter(|(_, g)| {
            let donor = load_of(g.donor);
            donor > mean && short_load + g.lease.work <= mean && donor - g.lease.work >= low
        })
        .min_by(|(_, a), (_, b)| {
            load_of(b.donor)
                .total_cmp(&load_of(a.donor))
                .then(b.lease.work.total_cmp(&a.lease.work))
                .then(a.donor.cmp(b.donor))
                .then(a.lease.id.cmp(b.lease.id))
        })
        .map(|(i, _)| i)
}

fn add(bins: &mut BTreeMap<&str, Bin>, to: &str, work: f64, heavy: bool) {
    if let Some(bin) = bins.get_mut(to) {
        bin.load += work;
        bin.count += 1;
        if heavy {
            bin.heavy += work;
        }
    }
}

/// A heavy lease of `work` the plan takes `from` its owner `to` another.
fn shift(bins: &mut BTreeMap<&str, Bin>, from: Option<&str>, to: &str, work: f64) {
    if let Some(bin) = from.and_then(|f| bins.get_mut(f)) {
        bin.now -= work;
    }
    if let Some(bin) = bins.get_mut(to) {
        bin.now += work;
    }
}

fn placement<'a>(lease: &PlanLease<'a>, from: Option<&'a str>, to: &'a str, heavy: bool) -> Placement<'a> {
    Placement {
        id: lease.id,
        from,
        to,
        heavy,
    }
}

#[cfg(test)]
#[path = "work_plan_tests.rs"]
mod tests;
