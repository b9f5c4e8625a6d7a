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
//! A lease on its way to an instance counts as that instance's in its turn. Whether a lease
//! stays depends only on the choices for heavier leases and on where it is, and a lease at its
//! planned place (or on its way there) is kept there, so a plan made after some of its moves
//! keeps them and plans the rest alike (light leases may be dealt differently, never moved
//! again): no lease moves twice while the weights hold, provided an instance's heavy moves and
//! the free leases dealt to it are taken together (where a heavy lease that must move goes
//! prefers the instance that carries least now, lighter leases included).

use std::collections::BTreeMap;

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
    let (heavy, light): (Vec<&PlanLease>, Vec<&PlanLease>) = sorted.into_iter().partition(|l| l.work > band.heavy);
    let mut placed = place_heavy(&heavy, &mut bins, band);
    placed.extend(place_light(&light, &mut bins, band));
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
fn place_heavy<'a>(heavy: &[&PlanLease<'a>], bins: &mut BTreeMap<&'a str, Bin>, band: Band) -> Vec<Placement<'a>> {
    let mut placed = Vec::new();
    for lease in heavy {
        // A lease on its way counts in its turn, as it will once its requester holds it.
        let owner = match lease.held {
            Held::By(owner) => Some(owner),
            Held::OnItsWayTo(to) => {
                add(bins, to, lease.work, true);
                continue;
            }
            Held::Free { .. } => None,
        };
        let kept = owner.filter(|o| bins.get(o).is_some_and(|b| band.keeps(b.heavy, lease.work)));
        let to = kept.or_else(|| heavy_taker(bins, lease, owner, band));
        if let Some(to) = to {
            add(bins, to, lease.work, true);
            if owner != Some(to) {
                shift(bins, owner, to, lease.work);
                placed.push(placement(lease, owner, to, true));
            }
        }
    }
    placed
}

/// Where a heavy lease its owner cannot keep goes: the instance it fits on that carries least,
/// else the one with the least heavy work (the owner when tied, else the one that carries least).
fn heavy_taker<'a>(
    bins: &BTreeMap<&'a str, Bin>,
    lease: &PlanLease,
    owner: Option<&str>,
    band: Band,
) -> Option<&'a str> {
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
    fitting.or_else(least).map(|(name, _)| *name)
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

fn add(bins: &mut BTreeMap<&str, Bin>, to: &str, work: f64, heavy: bool) {
    if let Some(bin) = bins.get_mut(to) {
        bin.load += work;
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
