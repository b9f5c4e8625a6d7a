//! Autoscaling on freshness (`autoscaling.targetFreshness`): as many workers as keep the oldest
//! change not handled yet younger than the target. Pure: time comes in as an argument.
//!
//! From each estimate: the backlog `L` (documents pending), the age `A` of the oldest pending
//! change, and `H`, the documents a second the workers handle (their reports,
//! [`crate::processor::leases::capacity_report`]). Measured over successive estimates: how fast
//! the backlog grows (`dL/dt`, smoothed), hence the arrival rate `λ = H + dL/dt` where the owners
//! do not report their partitions' write rates (which they measure from the LSNs they read, and
//! which are `λ` where they do), and what one
//! worker handles a second, `μ = H / replicas` — taken only while the workers have a backlog
//! (else they handle what arrives, not what they can) and the replicas have not changed for a
//! while ([`FreshnessTarget::settle`]: a new worker's rate takes that long to show in the
//! reports).
//!
//! The workers needed: `ceil((λ + L / W) / μ)`, where `W = max(T − A, T / 4)` is the time left to
//! drain the backlog before its oldest change is `T` old — so the fleet keeps up with what
//! arrives and clears what is pending within the target; fewer only once the target holds with
//! fewer and the oldest pending change is within half the target again (one step in, not one
//! per estimate while a backlog drains). Never more than the read budget can feed: `ceil(budget / cost of a document / μ)`.
//! Until `μ` was measured once, no advice: the lag count decides.

use std::time::{Duration, Instant};

use crate::processor::ProcessorEstimate;

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
}

impl FreshnessTarget {
    /// The target `target` of workers whose acquire interval is `acquire_interval`, with a read
    /// budget of `read_budget_units` when known.
    pub fn new(target: Duration, acquire_interval: Duration, read_budget_units: Option<f64>) -> Self {
        Self {
            target,
            read_budget_units,
            settle: acquire_interval * 2 + SETTLE_BEYOND,
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
        }
    }
}

/// What successive estimates measured.
#[derive(Debug, Clone, Default)]
pub struct FreshnessState {
    /// The last estimate's time and backlog.
    last: Option<(Instant, u64)>,
    /// How fast the backlog grows, documents a second (smoothed; negative: it shrinks).
    growth: Option<f64>,
    /// Documents a second one worker handles at its capacity (smoothed).
    per_replica: Option<f64>,
    /// The replicas running, and since when.
    replicas: Option<(i32, Instant)>,
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
    /// they ran `settle` unchanged.
    pub fn observe(&mut self, seen: &Freshness, current: Option<i32>, settle: Duration, now: Instant) {
        let current = current.unwrap_or(0);
        match self.replicas {
            Some((replicas, _)) if replicas == current => {}
            _ => self.replicas = Some((current, now)),
        }
        if let Some((at, lag)) = self.last
            && let Some(elapsed) = now.checked_duration_since(at).filter(|e| !e.is_zero())
        {
            let sample = (seen.lag as f64 - lag as f64) / elapsed.as_secs_f64();
            self.growth = Some(smoothed(self.growth, sample));
        }
        self.last = Some((now, seen.lag));
        let settled = self
            .replicas
            .is_some_and(|(replicas, since)| replicas > 0 && now.saturating_duration_since(since) >= settle);
        let busy = seen.handled_per_second > 0.0 && seen.lag as f64 > BUSY_SECONDS * seen.handled_per_second;
        let workers = if seen.reporting_workers > 0 {
            seen.reporting_workers
                .min(usize::try_from(current).unwrap_or(usize::MAX))
        } else {
            usize::try_from(current).unwrap_or(0)
        };
        if settled && busy && workers > 0 {
            let sample = seen.handled_per_second / workers as f64;
            self.per_replica = Some(smoothed(self.per_replica, sample));
        }
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
        let window = (target_seconds - age).max(LEAST_WINDOW * target_seconds);
        // What arrives: as the owners measured it where they report it (a handled rate that
        // is still ramping up after a scale-out would read as arrivals); else what is handled
        // and how fast the backlog grows.
        let arriving = seen
            .writes_per_second
            .unwrap_or(seen.handled_per_second + self.growth.unwrap_or(0.0))
            .max(0.0);
        let needed = arriving + seen.lag as f64 / window;
        let wanted = keep_within_tolerance(replicas_for(needed, per_replica), needed, per_replica, current);
        let wanted = scale_in_once(wanted, current, age, target_seconds);
        let feedable = target
            .read_budget_units
            .zip(seen.read_units_per_document)
            .filter(|(_, cost)| *cost > 0.0)
            .map(|(budget, cost)| budget / cost);
        let budget_limit = feedable.map(|docs| replicas_for(docs, per_replica).max(1));
        let budget_bound = budget_limit.is_some_and(|limit| wanted > limit);
        let replicas = if budget_bound {
            budget_limit.unwrap_or(wanted)
        } else {
            wanted
        };
        let age_text = seen
            .oldest_pending_seconds
            .map_or("unknown".to_owned(), |age| format!("{age}s"));
        let mut message = format!(
            "oldest pending change {age_text} old (target {}s), backlog {}, arriving ~{arriving:.0}/s, one worker handles ~{per_replica:.0}/s",
            target.target.as_secs(),
            seen.lag
        );
        if let (true, Some(docs)) = (budget_bound, feedable) {
            message.push_str(&format!(
                "; the read budget feeds ~{docs:.0} documents/s, so more than {replicas} worker(s) would not read faster"
            ));
        }
        Advice {
            replicas: Some(replicas),
            budget_bound,
            message,
        }
    }
}

/// How far what is needed may be from what the running workers handle before their number
/// changes (the HorizontalPodAutoscaler's tolerance): a figure that wavers about a boundary
/// does not scale back and forth.
const TOLERANCE: f64 = 0.1;

/// `wanted`, or `current` where the running workers handle what is `needed` within
/// [`TOLERANCE`].
fn keep_within_tolerance(wanted: i32, needed: f64, per_replica: f64, current: Option<i32>) -> i32 {
    let Some(current) = current.filter(|c| *c > 0) else {
        return wanted;
    };
    let ratio = needed / (f64::from(current) * per_replica);
    if (1.0 - TOLERANCE..=1.0 + TOLERANCE).contains(&ratio) && wanted != 0 {
        current
    } else {
        wanted
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

/// Workers handling `per_replica` documents a second each that handle `needed` a second.
fn replicas_for(needed: f64, per_replica: f64) -> i32 {
    let replicas = (needed / per_replica).ceil();
    if replicas.is_finite() && replicas > 0.0 {
        replicas.min(f64::from(i32::MAX)) as i32
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(seconds: u64, budget: Option<f64>) -> FreshnessTarget {
        FreshnessTarget::new(Duration::from_secs(seconds), Duration::from_secs(13), budget)
    }

    /// The default lease timings' settling: 26 s and 4.
    const SETTLE: Duration = Duration::from_secs(30);

    fn seen(lag: u64, age: Option<u64>, handled: f64) -> Freshness {
        Freshness {
            lag,
            oldest_pending_seconds: age,
            handled_per_second: handled,
            read_units_per_document: Some(2.0),
            reporting_workers: 0,
            writes_per_second: None,
        }
    }

    /// A state that measured `per_replica` a worker and a backlog growing by `growth` a second.
    fn measured(per_replica: f64, growth: f64) -> FreshnessState {
        FreshnessState {
            per_replica: Some(per_replica),
            growth: Some(growth),
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
    fn the_write_rate_the_owners_measured_is_what_arrives() {
        // Handled 100/s and the backlog growing by 100/s, but the owners measured 150/s written.
        let mut reported = seen(0, Some(0), 100.0);
        reported.writes_per_second = Some(150.0);
        let state = measured(100.0, 100.0);
        assert_eq!(state.advise(&target(30, None), &reported, None).replicas, Some(2));
        assert_eq!(
            state.advise(&target(30, None), &seen(0, Some(0), 100.0), None).replicas,
            Some(2)
        );
        reported.writes_per_second = Some(450.0);
        assert_eq!(state.advise(&target(30, None), &reported, None).replicas, Some(5));
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
            "fresh again: what arrives and 600 within 24 s"
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
        assert_eq!(advise(560.0, 5), Some(6));
        assert_eq!(advise(460.0, 5), Some(5));
        assert_eq!(advise(440.0, 5), Some(5), "4.4 rounds up to 5");
        assert_eq!(advise(390.0, 5), Some(4));
        assert_eq!(advise(0.0, 5), Some(0), "nothing to do: nothing kept");
    }

    #[test]
    fn a_worker_without_leases_yet_is_not_counted_in_the_rate_per_worker() {
        let t0 = Instant::now();
        let mut state = FreshnessState::default();
        let mut busy = seen(10_000, Some(5), 400.0);
        busy.reporting_workers = 4;
        state.observe(&busy, Some(5), SETTLE, t0);
        state.observe(&busy, Some(5), SETTLE, t0 + SETTLE);
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
}
