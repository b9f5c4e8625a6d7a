//! Autoscaling on freshness (`autoscaling.targetFreshness`): as many workers as keep the oldest
//! change not handled yet younger than the target. Pure: time comes in as an argument.
//!
//! From each estimate: the backlog `L` (documents pending), the age `A` of the oldest pending
//! change, `H`, the documents a second the workers handle, and what one worker handles a second
//! while it has work (`μ`, as the workers measure it:
//! [`crate::processor::leases::worker_capacity`]; from workers that do not report it, `H` divided
//! by the workers while they have a backlog and their number has not changed for a while,
//! [`FreshnessTarget::settle`]). What arrives, `λ`: the owners' measure of their partitions'
//! write rates, or `H + dL/dt` (the backlog's growth between two estimates) where that says more
//! — it shows a step at once, a decayed write rate within its time constant — except while
//! workers just added or taken away hand their leases over, when the backlog grows whatever
//! arrives.
//!
//! The workers needed: `ceil((λ + L / W) / μ)`, where `W = max(T − A, T / 4)` is the time left to
//! drain the backlog before its oldest change is `T` old — so the fleet keeps up with what
//! arrives and clears what is pending within the target. Scaling out counts the backlog that
//! grows until the new workers start ([`FreshnessTarget::start_up`]) and the time that leaves
//! before the target, so it takes one step (and none more, nor any scale-in, while they start);
//! counted in leases, the fewest workers whose busiest holds no more than a tenth above the
//! even share that figure assumes; a shortfall of less than a worker only once the backlog shows
//! it (`FreshnessState::falls_behind`), though a backlog is cleared in time whatever `λ` reads.
//! Scaling in leaves a tenth to spare, waits for `λ` read over its time constant, and goes to
//! the latest `λ` only once it is steady over that time, else to the highest since it last was
//! ([`crate::operator::scaling::arrivals`]), and only once the oldest pending change is within
//! half the target: one step in, not one per estimate while a backlog drains or a peak ebbs —
//! so no scale-down window is needed on top
//! ([`FreshnessTarget::scale_down_stabilization`]). Never more than the read budget can feed:
//! `ceil(budget / cost of a document / μ)`. Until `μ` is known, no advice: the lag count decides.

use std::time::{Duration, Instant};

use crate::operator::scaling::arrivals::{Arrivals, Reading, TOLERANCE};
use crate::operator::scaling::worker_count::{keep_within_tolerance, replicas_for, workers_for_an_even_share};
use crate::processor::ProcessorEstimate;
use crate::processor::options::defaults;

/// How long the replicas must not have changed before a rate per worker is taken from the
/// reports, beyond the reports' time constant (two acquire intervals): a few estimates.
pub const SETTLE_BEYOND: Duration = Duration::from_secs(4);
/// The workers count as busy (handling at their capacity) while this many seconds of their
/// work are pending.
const BUSY_SECONDS: f64 = 2.0;
/// How much a new sample weighs in the smoothed figures.
const WEIGHT: f64 = 0.3;
/// The least of the target the backlog is given to drain in, however late it is.
const LEAST_WINDOW: f64 = 0.25;

/// What the policy keeps fresh, and what may feed it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FreshnessTarget {
    /// The oldest pending change should stay younger than this.
    pub target: Duration,
    /// The fleet's read budget (request units a second), when one is set in request units.
    pub read_budget_units: Option<f64>,
    /// How long the replicas must not have changed before a rate per worker is taken: the
    /// time constant of the workers' handled rates (two acquire intervals) and
    /// [`SETTLE_BEYOND`].
    pub settle: Duration,
    /// How long a worker added now takes to handle changes at its pace: two acquire cycles
    /// (the leases it takes are handed over in one, and start in the next) and
    /// [`SETTLE_BEYOND`].
    pub start_up: Duration,
    /// How long what arrives must be steady before workers are scaled in for it: the time
    /// constant of the owners' write rates (two acquire intervals).
    pub steady_over: Duration,
    /// The scale-down stabilization window while this target decides: none unless the
    /// resource sets one (the rules here hold scale-in themselves).
    pub scale_down_stabilization: Duration,
}

/// How long the policy's measures take to settle.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settling {
    /// The replicas unchanged before a rate per worker is taken from what they handle.
    pub rate_per_worker: Duration,
    /// What arrives steady before it counts as steady.
    pub arrivals: Duration,
}

impl Settling {
    /// The default lease timings': for the measures kept without a freshness target.
    pub const DEFAULT: Settling = Settling::for_acquire_interval(defaults::ACQUIRE_INTERVAL);

    /// Workers whose acquire interval is `acquire_interval`: the rates they report are decayed
    /// over two of it; a rate per worker is taken [`SETTLE_BEYOND`] after that.
    pub const fn for_acquire_interval(acquire_interval: Duration) -> Self {
        let time_constant = acquire_interval.saturating_mul(2);
        Settling {
            rate_per_worker: time_constant.saturating_add(SETTLE_BEYOND),
            arrivals: time_constant,
        }
    }
}

impl FreshnessTarget {
    /// The target `target` of workers whose acquire interval is `acquire_interval`, with a read
    /// budget of `read_budget_units` when known.
    pub fn new(target: Duration, acquire_interval: Duration, read_budget_units: Option<f64>) -> Self {
        let settling = Settling::for_acquire_interval(acquire_interval);
        Self {
            target,
            read_budget_units,
            settle: settling.rate_per_worker,
            start_up: settling.rate_per_worker,
            steady_over: settling.arrivals,
            scale_down_stabilization: Duration::ZERO,
        }
    }

    /// How long this target's measures take to settle.
    pub fn settling(&self) -> Settling {
        Settling {
            rate_per_worker: self.settle,
            arrivals: self.steady_over,
        }
    }
}

/// What an estimate tells about freshness.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Freshness {
    /// Documents pending over all leases.
    pub lag: u64,
    /// The age of the oldest pending change, seconds, when known.
    pub oldest_pending_seconds: Option<u64>,
    /// Documents a second the workers handle, as they report.
    pub handled_per_second: f64,
    /// Request units a document costs to read, as the workers report.
    pub read_units_per_document: Option<f64>,
    /// The workers whose handled rates those are (the owners reporting one): a worker just
    /// started owns nothing yet.
    pub reporting_workers: usize,
    /// Operations a second written into the container, as the owners measured their
    /// partitions' latest LSNs, when reported.
    pub writes_per_second: Option<f64>,
    /// Documents a second one worker handles while it has work, as the owners report it
    /// ([`crate::processor::leases::worker_capacity`]), when reported.
    pub worker_handled_per_second: Option<f64>,
    /// The leases the workers share (0: not known).
    pub leases: usize,
}

impl From<&ProcessorEstimate> for Freshness {
    fn from(estimate: &ProcessorEstimate) -> Self {
        let owners: std::collections::BTreeSet<&str> = estimate
            .leases
            .iter()
            .filter(|lease| lease.handled_per_second.is_some())
            .filter_map(|lease| lease.owner.as_deref())
            .collect();
        Self {
            lag: estimate.total_lag,
            oldest_pending_seconds: estimate.oldest_pending_seconds,
            handled_per_second: estimate.handled_per_second,
            read_units_per_document: estimate.read_units_per_document,
            reporting_workers: owners.len(),
            writes_per_second: estimate.writes_per_second,
            worker_handled_per_second: estimate.worker_handled_per_second,
            leases: estimate.lease_count,
        }
    }
}

/// What successive estimates measured.
#[derive(Debug, Clone, Default)]
pub struct FreshnessState {
    /// The last estimate's time and backlog.
    last: Option<(Instant, u64)>,
    /// How fast the backlog grew between the last two estimates, documents a second
    /// (negative: it shrank).
    growth: Option<f64>,
    /// Documents a second one worker handles at its capacity.
    per_replica: Option<f64>,
    /// The replicas running, and since when.
    replicas: Option<(i32, Instant)>,
    /// Whether the last change of the replicas added workers.
    scaled_out: bool,
    /// Whether the replicas changed since the first estimate.
    rescaled: bool,
    /// What arrived and was pending over the last steadiness horizon.
    arrivals: Arrivals,
    /// The workers the last advice that weighed scaling in settled on, until one scales out: a
    /// later figure within a tenth of it keeps it (the scale-down window's highest
    /// recommendation would otherwise step down once per wavering value).
    scaled_in_to: std::cell::Cell<Option<i32>>,
}

/// The freshness policy's advice.
#[derive(Debug, Clone, PartialEq)]
pub struct Advice {
    /// The replicas that keep the target; `None`: no rate per worker measured yet.
    pub replicas: Option<i32>,
    /// Whether the read budget, not the number of workers, is the limit.
    pub budget_bound: bool,
    /// Why, in words.
    pub message: String,
}

/// A smoothed figure taking in `sample`.
fn smoothed(average: Option<f64>, sample: f64) -> f64 {
    average.map_or(sample, |average| average + WEIGHT * (sample - average))
}

impl FreshnessState {
    /// Takes in an estimate seen at `now`, `current` replicas running; a rate per worker once
    /// they ran `settling.rate_per_worker` unchanged.
    pub fn observe(&mut self, seen: &Freshness, current: Option<i32>, settling: Settling, now: Instant) {
        let current = current.unwrap_or(0);
        match self.replicas {
            Some((replicas, _)) if replicas == current => {}
            previous => {
                self.scaled_out = previous.is_some_and(|(replicas, _)| current > replicas);
                self.rescaled = previous.is_some();
                self.replicas = Some((current, now));
            }
        }
        if let Some((at, lag)) = self.last
            && let Some(elapsed) = now.checked_duration_since(at).filter(|e| !e.is_zero())
        {
            let sample = (seen.lag as f64 - lag as f64) / elapsed.as_secs_f64();
            // Not smoothed: beside the handled rate it shows a step in what arrives at once.
            self.growth = Some(sample);
        }
        self.last = Some((now, seen.lag));
        let settled = self.replicas.is_some_and(|(replicas, since)| {
            replicas > 0 && now.saturating_duration_since(since) >= settling.rate_per_worker
        });
        let busy = seen.handled_per_second > 0.0 && seen.lag as f64 > BUSY_SECONDS * seen.handled_per_second;
        let workers = if seen.reporting_workers > 0 {
            seen.reporting_workers
                .min(usize::try_from(current).unwrap_or(usize::MAX))
        } else {
            usize::try_from(current).unwrap_or(0)
        };
        if let Some(reported) = seen.worker_handled_per_second.filter(|rate| *rate > 0.0) {
            // What the workers handle while they have work, as they measure it: no need to
            // wait for them to be busy or settled.
            self.per_replica = Some(reported);
        } else if settled && busy && workers > 0 {
            let sample = seen.handled_per_second / workers as f64;
            self.per_replica = Some(smoothed(self.per_replica, sample));
        }
        let reading = Reading {
            at: now,
            arriving: seen.writes_per_second.unwrap_or_else(|| self.arriving(seen, false)),
            lag: seen.lag as f64,
        };
        self.arrivals.seen(reading, settling.arrivals, self.per_replica);
    }

    /// Whether workers were added less than `start_up` before the last estimate.
    fn starting(&self, start_up: Duration) -> bool {
        self.scaled_out && self.rescaled_within(start_up)
    }

    /// Whether the replicas changed less than `start_up` before the last estimate: workers added
    /// or taken away hand leases over meanwhile.
    fn rescaled_within(&self, start_up: Duration) -> bool {
        match (self.replicas, self.last) {
            (Some((_, since)), Some((seen, _))) => self.rescaled && seen.saturating_duration_since(since) < start_up,
            _ => false,
        }
    }

    /// What arrives a second: what the owners measured written into their partitions, unless
    /// what the workers handle plus how fast the backlog grows says more by over a worker's
    /// rate — that shows a step up at once, where a decayed write rate follows it within its
    /// time constant; by less it is the noisier figure (a rate read just after a batch, a
    /// backlog read mid-page), and the owners' measure is taken. While leases are `handed_over`
    /// (the replicas just changed) the backlog grows whatever arrives: the owners' measure.
    fn arriving(&self, seen: &Freshness, handed_over: bool) -> f64 {
        if let Some(written) = seen.writes_per_second.filter(|_| handed_over) {
            return written.max(0.0);
        }
        let from_backlog = seen.handled_per_second + self.growth.unwrap_or(0.0);
        let noise = self.per_replica.unwrap_or(0.0);
        seen.writes_per_second
            .map_or(from_backlog, |written| {
                if from_backlog > written + noise {
                    from_backlog
                } else {
                    written
                }
            })
            .max(0.0)
    }

    /// The replicas that keep `target` for what `seen` tells, `current` running.
    pub fn advise(&self, target: &FreshnessTarget, seen: &Freshness, current: Option<i32>) -> Advice {
        let Some(per_replica) = self.per_replica.filter(|rate| *rate > 0.0) else {
            return Advice {
                replicas: None,
                budget_bound: false,
                message: "no rate per worker measured yet (it is measured while the workers have a backlog)".into(),
            };
        };
        let target_seconds = target.target.as_secs_f64().max(1.0);
        let age = seen.oldest_pending_seconds.map_or(0.0, |age| age as f64);
        let need = Need {
            per_replica,
            arriving: self.arriving(seen, self.rescaled_within(target.start_up)),
            lag: seen.lag as f64,
            age,
            target_seconds,
            window: (target_seconds - age).max(LEAST_WINDOW * target_seconds),
        };
        let wanted = match current {
            Some(running) => self.with_running(&need, target, running),
            None => need.replicas(None),
        };
        let wanted = workers_for_an_even_share(wanted, seen.leases);
        let cap = BudgetCap::of(target, seen, per_replica, wanted);
        let age_text = seen
            .oldest_pending_seconds
            .map_or("unknown".to_owned(), |age| format!("{age}s"));
        let mut message = format!(
            "oldest pending change {age_text} old (target {}s), backlog {}, arriving ~{:.0}/s, one worker handles ~{per_replica:.0}/s",
            target.target.as_secs(),
            seen.lag,
            need.arriving
        );
        if let (true, Some(docs)) = (cap.bound, cap.feedable) {
            message.push_str(&format!(
                "; the read budget feeds ~{docs:.0} documents/s, so more than {} worker(s) would not read faster",
                cap.replicas
            ));
        }
        Advice {
            replicas: Some(cap.replicas),
            budget_bound: cap.bound,
            message,
        }
    }

    /// The workers `need` asks for with `running` running.
    fn with_running(&self, need: &Need, target: &FreshnessTarget, running: i32) -> i32 {
        let wanted = need.replicas(Some(running));
        if wanted > running && !self.falls_behind(need, running) {
            // What arrives may be misread by less than a worker; the backlog is not: cleared
            // in time as if the running workers kept up with what arrives.
            let kept_up = Need {
                arriving: need.arriving.min(f64::from(running) * need.per_replica),
                ..*need
            };
            let wanted = kept_up.replicas(Some(running));
            return if wanted > running {
                self.out_to(&kept_up, target, running, wanted)
            } else {
                running
            };
        }
        match wanted {
            wanted if wanted > running => self.out_to(need, target, running, wanted),
            // Workers just added are given their start-up before any are taken away: until
            // then the backlog grows whatever their number. Nor any before what arrives was
            // read over a whole horizon (a new history: an operator restart, a new leader).
            wanted if wanted < running && (self.starting(target.start_up) || !self.arrivals.covered()) => running,
            wanted if wanted < running => self.in_to(need, running, wanted),
            _ => wanted,
        }
    }

    /// Scaling out from `running` (`wanted` by the backlog now): to what the backlog will need
    /// once the new workers run — what the running ones fall short of until then comes on top —
    /// in one step, not two. Workers added within the start-up time are still starting: what
    /// the backlog does meanwhile was counted when they were added (unless the target is
    /// missed already).
    fn out_to(&self, need: &Need, target: &FreshnessTarget, running: i32, wanted: i32) -> i32 {
        self.scaled_in_to.set(None);
        if self.starting(target.start_up) && need.age < need.target_seconds {
            return running;
        }
        let start_up = target.start_up.as_secs_f64();
        let short = (need.arriving - f64::from(running.max(0)) * need.per_replica).max(0.0);
        let pending = need.lag + short * start_up;
        // Then the oldest pending change is about as old as what is pending takes to arrive —
        // or, at most, older by the start-up than it is now.
        let age_then = (pending / need.arriving.max(f64::MIN_POSITIVE)).min(need.age + start_up);
        let window = (need.target_seconds - age_then).max(LEAST_WINDOW * need.target_seconds);
        replicas_for(need.arriving + pending / window, need.per_replica).max(wanted)
    }

    /// Scaling in from `running` (`wanted` by the backlog now): for the rate the arrivals were
    /// last steady at (while they move), to workers that leave a tenth to spare, so that the
    /// next estimate's wavering does not scale them out again; a figure within a tenth of the
    /// last one it advised keeps that one; a step of no more than a tenth (and, while what
    /// arrives moves, one worker) is no step.
    fn in_to(&self, need: &Need, running: i32, wanted: i32) -> i32 {
        let steady = self.arrivals.steady();
        let level = if steady {
            need.arriving
        } else {
            self.arrivals
                .level()
                .map_or(need.arriving, |level| level.max(need.arriving))
        };
        let spared = (level + need.lag / need.window) * (1.0 + TOLERANCE);
        let spared = replicas_for(spared, need.per_replica).clamp(wanted, running);
        let spared = match self.scaled_in_to.get() {
            Some(before) if f64::from((spared - before).abs()) <= f64::from(before) * TOLERANCE => before,
            _ => spared,
        };
        // A step in of no more than a tenth is no step; while what arrives moves, nor is one of a
        // tenth and one worker (a fleet just scaled in to the peak's window figure).
        let slack = if steady { 0.0 } else { 1.0 };
        let advised = if f64::from(spared) >= f64::from(running) * (1.0 - TOLERANCE) - slack {
            running
        } else {
            scale_in_once(spared, Some(running), need.age, need.target_seconds)
        };
        // Kept once reached too: what arrives ebbing after a peak must not step in by a figure
        // within a tenth of it.
        self.scaled_in_to.set(Some(advised));
        advised
    }
}

impl FreshnessState {
    /// Whether `running` workers fall behind by more than what arrives can be misread by: the
    /// backlog asks for more than what arrives, what arrives exceeds them by more than a worker,
    /// the backlog grew over the steadiness horizon by at least half of what they would be
    /// short, or the oldest pending change is past half the target. At a trickle the arrival
    /// figure reads high by a few documents a second (a rate read just after a batch, the
    /// rates of leases just handed over), enough to call for a second worker that the backlog
    /// shows is not needed.
    fn falls_behind(&self, need: &Need, running: i32) -> bool {
        let short = need.arriving - f64::from(running.max(0)) * need.per_replica;
        short <= 0.0
            || short > need.per_replica
            || need.age > need.target_seconds / 2.0
            || self.arrivals.growth().is_some_and(|growth| growth >= short / 2.0)
    }
}

/// What one estimate needs, as the advice works it out.
#[derive(Debug, Clone, Copy)]
struct Need {
    /// Documents a second one worker handles.
    per_replica: f64,
    /// Documents a second arriving.
    arriving: f64,
    /// Documents pending.
    lag: f64,
    /// The oldest pending change's age, seconds.
    age: f64,
    /// The target, seconds.
    target_seconds: f64,
    /// The time left to clear the backlog in, seconds.
    window: f64,
}

impl Need {
    /// The workers that keep up with what arrives and clear the backlog within the window;
    /// `current` where they handle that within the tolerance.
    fn replicas(&self, current: Option<i32>) -> i32 {
        let needed = self.arriving + self.lag / self.window;
        keep_within_tolerance(
            replicas_for(needed, self.per_replica),
            needed,
            self.per_replica,
            current,
        )
    }
}

/// The advice capped by what the read budget can feed.
struct BudgetCap {
    /// The workers advised.
    replicas: i32,
    /// Whether the budget, not the backlog, set them.
    bound: bool,
    /// The documents a second the budget feeds, when known.
    feedable: Option<f64>,
}

impl BudgetCap {
    /// `wanted` workers of `per_replica` each, capped by the read budget of `target` at what
    /// `seen` says a document costs.
    fn of(target: &FreshnessTarget, seen: &Freshness, per_replica: f64, wanted: i32) -> Self {
        let feedable = target
            .read_budget_units
            .zip(seen.read_units_per_document)
            .filter(|(_, cost)| *cost > 0.0)
            .map(|(budget, cost)| budget / cost);
        let limit = feedable.map(|docs| replicas_for(docs, per_replica).max(1));
        match limit {
            Some(limit) if wanted > limit => Self {
                replicas: limit,
                bound: true,
                feedable,
            },
            _ => Self {
                replicas: wanted,
                bound: false,
                feedable,
            },
        }
    }
}

/// `wanted`, where it is fewer than the `current` workers, only once the oldest pending change
/// (`age` seconds) is within half the target: while a backlog drains, what it needs falls
/// estimate by estimate, and scaling in along it would take a step at each; held until then,
/// the scale-down window's highest recommendation drops once, to what the fleet then needs.
fn scale_in_once(wanted: i32, current: Option<i32>, age: f64, target_seconds: f64) -> i32 {
    match current {
        Some(current) if wanted < current && age > target_seconds / 2.0 => current,
        _ => wanted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(seconds: u64, budget: Option<f64>) -> FreshnessTarget {
        FreshnessTarget::new(Duration::from_secs(seconds), Duration::from_secs(13), budget)
    }

    /// The default lease timings' settling: 26 s and 4.
    const SETTLE: Settling = Settling::DEFAULT;

    fn seen(lag: u64, age: Option<u64>, handled: f64) -> Freshness {
        Freshness {
            lag,
            oldest_pending_seconds: age,
            handled_per_second: handled,
            read_units_per_document: Some(2.0),
            reporting_workers: 0,
            writes_per_second: None,
            worker_handled_per_second: None,
            leases: 0,
        }
    }

    /// Arrivals of nothing, steady over the default horizon up to now, a backlog growing by
    /// `growth` a second over it.
    fn steady_at_zero(per_replica: f64, growth: f64) -> Arrivals {
        let now = Instant::now();
        let mut arrivals = Arrivals::default();
        let horizon = SETTLE.arrivals.as_secs_f64();
        for (at, lag) in [
            (now.checked_sub(SETTLE.arrivals).unwrap_or(now), 0.0),
            (now, growth * horizon),
        ] {
            let reading = Reading { at, arriving: 0.0, lag };
            arrivals.seen(reading, SETTLE.arrivals, Some(per_replica));
        }
        arrivals
    }

    /// A state that measured `per_replica` a worker and a backlog growing by `growth` a second.
    fn measured(per_replica: f64, growth: f64) -> FreshnessState {
        FreshnessState {
            per_replica: Some(per_replica),
            growth: Some(growth),
            arrivals: steady_at_zero(per_replica, 0.0),
            ..FreshnessState::default()
        }
    }

    #[test]
    fn the_workers_keep_up_with_what_arrives_and_clear_the_backlog_within_the_target() {
        // (lag, age, handled/s, growth/s, per replica, target s, replicas)
        let table = [
            (0, Some(0), 100.0, 0.0, 100.0, 30, 1),
            (0, Some(0), 450.0, 0.0, 100.0, 30, 5),
            (3_000, Some(0), 100.0, 0.0, 100.0, 30, 2),
            (3_000, Some(20), 100.0, 0.0, 100.0, 30, 4),
            (3_000, Some(40), 100.0, 0.0, 100.0, 30, 5),
            (0, Some(0), 100.0, 100.0, 100.0, 30, 2),
            (0, Some(0), 0.0, 0.0, 100.0, 30, 0),
            (600, None, 300.0, -300.0, 100.0, 30, 1),
        ];
        for (lag, age, handled, growth, per_replica, seconds, replicas) in table {
            let advice = measured(per_replica, growth).advise(&target(seconds, None), &seen(lag, age, handled), None);
            assert_eq!(
                advice.replicas,
                Some(replicas),
                "lag {lag}, age {age:?}, handled {handled}, growth {growth}: {}",
                advice.message
            );
            assert!(!advice.budget_bound);
        }
    }

    #[test]
    fn the_write_rate_the_owners_measured_is_what_arrives_unless_the_backlog_shows_more() {
        // Handled 100/s, the backlog steady, but the owners measured 150/s written.
        let mut reported = seen(0, Some(0), 100.0);
        reported.writes_per_second = Some(150.0);
        let state = measured(100.0, 0.0);
        assert_eq!(state.advise(&target(30, None), &reported, None).replicas, Some(2));
        assert_eq!(
            state.advise(&target(30, None), &seen(0, Some(0), 100.0), None).replicas,
            Some(1)
        );
        reported.writes_per_second = Some(450.0);
        assert_eq!(state.advise(&target(30, None), &reported, None).replicas, Some(5));
        // A step up: the decayed write rate still reads 150, the backlog grows by 300 a second.
        reported.writes_per_second = Some(150.0);
        assert_eq!(
            measured(100.0, 300.0)
                .advise(&target(30, None), &reported, None)
                .replicas,
            Some(4)
        );
    }

    #[test]
    fn scaling_out_counts_the_backlog_that_grows_until_the_new_workers_run() {
        // 2 workers of 100/s, 400/s arriving: 4 keep up, and the 200/s they fall short of for
        // the 30 s new workers take to start is 6,000 more, to clear once they run: within
        // the target's 60 s less the age the oldest of them will have then (15 s at 400/s).
        let state = measured(100.0, 0.0);
        let mut stepped = seen(0, Some(0), 400.0);
        stepped.writes_per_second = Some(400.0);
        assert_eq!(
            state.advise(&target(60, None), &stepped, None).replicas,
            Some(4),
            "running unknown"
        );
        assert_eq!(state.advise(&target(60, None), &stepped, Some(2)).replicas, Some(6));
        assert_eq!(
            state.advise(&target(30, None), &stepped, Some(2)).replicas,
            Some(8),
            "6,000 pending then, the oldest of them 15 s old: 15 s left"
        );
        assert_eq!(
            state.advise(&target(60, None), &stepped, Some(4)).replicas,
            Some(4),
            "enough already"
        );
    }

    #[test]
    fn while_what_arrives_ebbs_workers_are_scaled_in_for_its_last_steady_rate() {
        let t0 = Instant::now();
        let ebbing = |writes: f64| Freshness {
            writes_per_second: Some(writes),
            ..seen(0, Some(0), 0.0)
        };
        // Acquire interval 2 s: what arrives is steady once it held for 4 s.
        let quick = FreshnessTarget::new(Duration::from_secs(30), Duration::from_secs(2), None);
        let advise = |state: &FreshnessState, writes: f64| state.advise(&quick, &ebbing(writes), Some(12)).replicas;
        let mut state = FreshnessState {
            per_replica: Some(100.0),
            ..FreshnessState::default()
        };
        for (at, writes, replicas, why) in [
            (
                0,
                800.0,
                12,
                "one estimate: none in before what arrives was read for 4 s",
            ),
            (2, 790.0, 12, "2 s"),
            (4, 795.0, 9, "steady at 795 for 4 s: 875 with a tenth to spare"),
            (6, 400.0, 9, "halved: still for the last steady rate"),
            (8, 200.0, 9, "still ebbing"),
            (10, 190.0, 9, "two alike, but 400 was 4 s ago"),
            (12, 185.0, 3, "steady for 4 s: in, in one step"),
            (14, 500.0, 6, "building up: for what it shows now"),
        ] {
            state.observe(
                &ebbing(writes),
                Some(12),
                quick.settling(),
                t0 + Duration::from_secs(at),
            );
            assert_eq!(advise(&state, writes), Some(replicas), "{at} s, {writes}/s: {why}");
        }
    }

    #[test]
    fn a_scale_in_wavering_by_one_keeps_the_first_figure() {
        let state = measured(100.0, 0.0);
        let advise = |handled: f64| {
            state
                .advise(&target(30, None), &seen(0, Some(0), handled), Some(15))
                .replicas
        };
        assert_eq!(advise(1_000.0), Some(11), "1,100 with a tenth to spare");
        assert_eq!(advise(1_050.0), Some(11), "12 would be within one of 11: 11 kept");
        assert_eq!(advise(900.0), Some(11), "so would 10");
        assert_eq!(advise(500.0), Some(6), "far below: a new figure");
        assert_eq!(advise(1_600.0), Some(15), "within a tenth of the 15 running: kept");
        assert_eq!(advise(1_050.0), Some(12));
        let reached = |handled: f64| {
            state
                .advise(&target(30, None), &seen(0, Some(0), handled), Some(12))
                .replicas
        };
        assert_eq!(
            reached(900.0),
            Some(10),
            "12 reached and what arrives steady: 10 is a step"
        );
        let t0 = Instant::now();
        let mut moving = FreshnessState {
            per_replica: Some(100.0),
            ..FreshnessState::default()
        };
        let writes = |rate: f64| Freshness {
            writes_per_second: Some(rate),
            ..seen(0, Some(0), 0.0)
        };
        moving.observe(&writes(500.0), Some(12), SETTLE, t0);
        moving.observe(&writes(510.0), Some(12), SETTLE, t0 + Duration::from_secs(2));
        moving.observe(&writes(900.0), Some(12), SETTLE, t0 + Duration::from_secs(4));
        assert_eq!(
            moving.advise(&target(30, None), &writes(900.0), Some(12)).replicas,
            Some(12),
            "what arrives moving: 10 is within a tenth and one worker of 12"
        );
    }

    #[test]
    fn at_a_trickle_a_misread_arrival_rate_adds_no_worker_the_backlog_does_not_need() {
        let t0 = Instant::now();
        // Acquire interval 2 s: readings over 4 s count.
        let quick = FreshnessTarget::new(Duration::from_secs(20), Duration::from_secs(2), None);
        let mut state = FreshnessState::default();
        let trickle = |lag: u64, handled: f64, writes: f64| Freshness {
            writes_per_second: Some(writes),
            worker_handled_per_second: Some(22.0),
            reporting_workers: 1,
            ..seen(lag, Some(2), handled)
        };
        let mut at = |seconds: u64, seen: Freshness| {
            state.observe(&seen, Some(1), quick.settling(), t0 + Duration::from_secs(seconds));
            state.advise(&quick, &seen, Some(1))
        };
        // 12 a second written; what the worker handles reads 26-30 (a rate read just after a
        // batch), the backlog bounces between 3 and 12: the owners' write rate is taken.
        for (seconds, lag, handled) in [(0, 9, 27.0), (2, 3, 29.0), (4, 12, 26.0)] {
            let advice = at(seconds, trickle(lag, handled, 12.0));
            assert_eq!(advice.replicas, Some(1), "{seconds} s: {}", advice.message);
            assert!(advice.message.contains("arriving ~12/s"), "{}", advice.message);
        }
        // The write rate itself reads 26-30 (decayed just after a burst) while the backlog does
        // not grow: no second worker.
        for (seconds, lag, writes) in [(6, 6, 28.0), (8, 10, 30.0), (10, 5, 26.0)] {
            let advice = at(seconds, trickle(lag, 12.0, writes));
            assert_eq!(advice.replicas, Some(1), "{seconds} s: {}", advice.message);
        }
        // Then 30 a second arrive for real: the backlog grows by 8 a second.
        let mut advice = None;
        for (seconds, lag) in [(12, 21), (14, 37), (16, 53)] {
            advice = Some(at(seconds, trickle(lag, 22.0, 30.0)));
        }
        let advice = advice.expect("advised");
        assert_eq!(advice.replicas, Some(2), "{}", advice.message);
    }

    #[test]
    fn a_backlog_is_cleared_in_time_while_what_arrives_is_misread() {
        let t0 = Instant::now();
        let quick = FreshnessTarget::new(Duration::from_secs(20), Duration::from_secs(2), None);
        let mut state = FreshnessState::default();
        // One worker of 22 a second; the write rate reads 28 (a burst's decay) over a backlog of
        // 2,000 that drains (a worker restarted over it): not a shortfall the backlog shows, but
        // the backlog itself must be cleared within the target.
        let backlog = |lag: u64| Freshness {
            writes_per_second: Some(28.0),
            worker_handled_per_second: Some(22.0),
            reporting_workers: 1,
            ..seen(lag, Some(3), 22.0)
        };
        let mut advice = None;
        for (seconds, lag) in [(0, 2_024), (2, 2_012), (4, 2_000)] {
            state.observe(
                &backlog(lag),
                Some(1),
                quick.settling(),
                t0 + Duration::from_secs(seconds),
            );
            advice = Some(state.advise(&quick, &backlog(lag), Some(1)));
        }
        let advice = advice.expect("advised");
        // As if the worker kept up with what arrives (22): 2,000 to clear before the oldest,
        // 3 s old and 11 s by the time new workers run, is 20 s old — 244/s, 12 workers.
        assert_eq!(advice.replicas, Some(12), "{}", advice.message);
    }

    #[test]
    fn workers_just_added_are_given_their_start_up_before_more_are() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut state = measured(100.0, 0.0);
        let mut grown = seen(100_000, Some(5), 400.0);
        grown.writes_per_second = Some(400.0);
        grown.worker_handled_per_second = Some(100.0);
        state.observe(&grown, Some(2), SETTLE, at(0));
        state.observe(&grown, Some(8), SETTLE, at(2));
        let advise =
            |state: &FreshnessState, seen: &Freshness| state.advise(&target(120, None), seen, Some(8)).replicas;
        assert_eq!(
            advise(&state, &grown),
            Some(8),
            "8 just added: more wanted, but they are starting"
        );
        state.observe(&grown, Some(8), SETTLE, at(20));
        assert_eq!(advise(&state, &grown), Some(8), "18 s in: still starting");
        state.observe(&grown, Some(8), SETTLE, at(40));
        // Started (two cycles of 13 s and 4): 100,000 to clear within 120 s less the age and
        // the next workers' start-up, 85 s, beside the 400/s arriving.
        assert_eq!(advise(&state, &grown), Some(16));
        grown.oldest_pending_seconds = Some(120);
        state.observe(&grown, Some(8), SETTLE, at(2));
        state.replicas = Some((8, at(2)));
        assert!(advise(&state, &grown) > Some(8), "the target missed: never held");
    }

    #[test]
    fn workers_just_added_are_not_taken_away_while_they_start() {
        let t0 = Instant::now();
        let mut state = measured(100.0, 0.0);
        let mut quiet = seen(10, Some(1), 100.0);
        quiet.writes_per_second = Some(100.0);
        quiet.worker_handled_per_second = Some(100.0);
        state.observe(&quiet, Some(2), SETTLE, t0);
        state.observe(&quiet, Some(8), SETTLE, t0 + Duration::from_secs(2));
        state.observe(&quiet, Some(8), SETTLE, t0 + Duration::from_secs(4));
        let advise = |state: &FreshnessState| state.advise(&target(30, None), &quiet, Some(8)).replicas;
        assert_eq!(advise(&state), Some(8), "2 would do, but the 8 are starting");
        state.observe(&quiet, Some(8), SETTLE, t0 + Duration::from_secs(40));
        state.observe(&quiet, Some(8), SETTLE, t0 + Duration::from_secs(42));
        assert_eq!(advise(&state), Some(2), "started: scaled in");
    }

    #[test]
    fn a_step_is_counted_in_the_leases_the_busiest_of_them_holds() {
        // A step: 15 wanted by the even-share figure, 16 of 32 leases give it.
        let state = measured(24.0, 0.0);
        let mut step = seen(370, Some(2), 24.0);
        step.writes_per_second = Some(190.0);
        step.leases = 32;
        // Workers that start in two cycles of 2 s and 4 s more: 1,698 pending by then.
        let quick = FreshnessTarget::new(Duration::from_secs(20), Duration::from_secs(2), None);
        assert_eq!(state.advise(&quick, &step, Some(1)).replicas, Some(16));
        step.leases = 0;
        assert_eq!(
            state.advise(&quick, &step, Some(1)).replicas,
            Some(15),
            "leases unknown"
        );
    }

    #[test]
    fn a_rate_per_worker_the_workers_report_is_taken_at_once() {
        let t0 = Instant::now();
        let mut state = FreshnessState::default();
        let mut reported = seen(10, Some(1), 40.0);
        reported.worker_handled_per_second = Some(25.0);
        state.observe(&reported, Some(3), SETTLE, t0);
        assert_eq!(
            state.per_replica,
            Some(25.0),
            "not busy, not settled: the workers' own figure"
        );
    }

    #[test]
    fn workers_are_scaled_in_only_once_the_backlog_is_fresh_again() {
        // After a peak: 5 workers of 100/s, 100/s arriving, the backlog draining.
        let state = measured(100.0, -400.0);
        let mut after_peak = seen(2_000, Some(20), 500.0);
        after_peak.writes_per_second = Some(100.0);
        let advise = |seen: &Freshness| state.advise(&target(30, None), seen, Some(5)).replicas;
        assert_eq!(advise(&after_peak), Some(5), "20 s old: held while it drains");
        after_peak.lag = 600;
        after_peak.oldest_pending_seconds = Some(6);
        assert_eq!(
            advise(&after_peak),
            Some(2),
            "fresh again: what arrives and 600 within 24 s, a tenth to spare"
        );
        after_peak.lag = 50_000;
        after_peak.oldest_pending_seconds = Some(40);
        assert_eq!(advise(&after_peak), Some(68), "scaling out is never held");
    }

    #[test]
    fn running_workers_within_a_tenth_of_what_is_needed_stay_as_they_are() {
        let state = measured(100.0, 0.0);
        let advise = |handled: f64, current: i32| {
            state
                .advise(&target(30, None), &seen(0, Some(0), handled), Some(current))
                .replicas
        };
        assert_eq!(advise(540.0, 5), Some(5), "5.4 workers' worth: within a tenth of 5");
        assert_eq!(
            advise(560.0, 5),
            Some(5),
            "beyond a tenth, by less than a worker, and the backlog does not grow: a misread rate"
        );
        let growing = FreshnessState {
            arrivals: steady_at_zero(100.0, 30.0),
            ..measured(100.0, 0.0)
        };
        assert_eq!(
            growing
                .advise(&target(30, None), &seen(0, Some(0), 560.0), Some(5))
                .replicas,
            Some(7),
            "the backlog grows by half the shortfall: out, to clear what builds up until new workers start"
        );
        assert_eq!(advise(460.0, 5), Some(5));
        assert_eq!(advise(440.0, 5), Some(5), "4.4 rounds up to 5");
        assert_eq!(
            state
                .advise(&target(30, None), &seen(0, Some(0), 1_000.0), Some(12))
                .replicas,
            Some(12),
            "11 with a tenth to spare: one of 12 is a step within a tenth"
        );
        assert_eq!(advise(390.0, 5), Some(5), "4 would leave less than a tenth to spare");
        assert_eq!(advise(360.0, 5), Some(4));
        assert_eq!(advise(0.0, 5), Some(0), "nothing to do: nothing kept");
    }

    #[test]
    fn a_worker_without_leases_yet_is_not_counted_in_the_rate_per_worker() {
        let t0 = Instant::now();
        let mut state = FreshnessState::default();
        let mut busy = seen(10_000, Some(5), 400.0);
        busy.reporting_workers = 4;
        state.observe(&busy, Some(5), SETTLE, t0);
        state.observe(&busy, Some(5), SETTLE, t0 + SETTLE.rate_per_worker);
        assert_eq!(state.per_replica, Some(100.0), "4 of the 5 handled the 400/s");
    }

    #[test]
    fn never_more_workers_than_the_read_budget_can_feed_and_it_says_so() {
        // 400 RU/s at 2 RU a document: 200 documents a second, 2 workers of 100.
        let state = measured(100.0, 0.0);
        let advice = state.advise(&target(30, Some(400.0)), &seen(30_000, Some(10), 200.0), None);
        assert_eq!(advice.replicas, Some(2));
        assert!(advice.budget_bound);
        assert!(
            advice.message.contains("read budget feeds ~200 documents/s"),
            "{}",
            advice.message
        );
        let within = state.advise(&target(30, Some(4_000.0)), &seen(3_000, Some(10), 200.0), None);
        assert_eq!((within.replicas, within.budget_bound), (Some(4), false));
    }

    #[test]
    fn without_a_measured_rate_per_worker_there_is_no_advice() {
        let advice = FreshnessState::default().advise(&target(30, None), &seen(5_000, Some(50), 0.0), None);
        assert_eq!(advice.replicas, None);
    }

    #[test]
    fn a_rate_per_worker_is_taken_only_while_busy_and_settled() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut state = FreshnessState::default();
        state.observe(&seen(10_000, Some(5), 400.0), Some(4), SETTLE, at(0));
        state.observe(&seen(9_000, Some(5), 400.0), Some(4), SETTLE, at(10));
        assert_eq!(state.per_replica, None, "replicas not settled yet");
        state.observe(&seen(8_000, Some(5), 400.0), Some(4), SETTLE, at(30));
        assert_eq!(state.per_replica, Some(100.0));
        state.observe(&seen(100, Some(1), 400.0), Some(4), SETTLE, at(40));
        assert_eq!(state.per_replica, Some(100.0), "not busy: handling what arrives");
        state.observe(&seen(8_000, Some(5), 600.0), Some(6), SETTLE, at(50));
        assert_eq!(state.per_replica, Some(100.0), "just scaled: not settled");
        state.observe(&seen(8_000, Some(5), 600.0), Some(6), SETTLE, at(80));
        assert_eq!(state.per_replica, Some(100.0));
        let growth = state.growth.unwrap_or_default();
        assert!(growth.is_finite(), "{growth}");
    }

    #[test]
    fn the_backlogs_growth_is_measured_between_estimates() {
        let t0 = Instant::now();
        let mut state = FreshnessState::default();
        state.observe(&seen(1_000, None, 0.0), Some(1), SETTLE, t0);
        state.observe(&seen(2_000, None, 0.0), Some(1), SETTLE, t0 + Duration::from_secs(10));
        assert_eq!(state.growth, Some(100.0));
        state.observe(&seen(2_000, None, 0.0), Some(1), SETTLE, t0 + Duration::from_secs(10));
        assert_eq!(state.growth, Some(100.0), "no time passed: no sample");
    }

    #[test]
    fn workers_just_taken_away_hand_their_leases_over_without_reading_as_more_arriving() {
        let t0 = Instant::now();
        let at = |seconds: u64| t0 + Duration::from_secs(seconds);
        // Acquire interval 2 s: workers added or taken away hand over within 8 s.
        let quick = FreshnessTarget::new(Duration::from_secs(20), Duration::from_secs(2), None);
        let mut state = measured(24.0, 0.0);
        let reading = |lag: u64, age: u64, handled: f64| Freshness {
            writes_per_second: Some(205.0),
            worker_handled_per_second: Some(24.0),
            leases: 32,
            ..seen(lag, Some(age), handled)
        };
        state.observe(&reading(117, 9, 200.0), Some(16), quick.settling(), at(0));
        state.observe(&reading(117, 9, 200.0), Some(11), quick.settling(), at(2));
        // The five stopped hand their leases over: the backlog grows by 45 a second beside 250
        // handled, 295 a second by the backlog against 205 written.
        let bump = reading(207, 6, 250.0);
        state.observe(&bump, Some(11), quick.settling(), at(4));
        let advice = state.advise(&quick, &bump, Some(11));
        assert_eq!(advice.replicas, Some(11), "{}", advice.message);
        // Handed over, a backlog that still grows like that is what arrives.
        let grown = reading(297, 6, 290.0);
        state.observe(&grown, Some(11), quick.settling(), at(12));
        let advice = state.advise(&quick, &grown, Some(11));
        assert!(advice.replicas > Some(11), "{}", advice.message);
    }
}
