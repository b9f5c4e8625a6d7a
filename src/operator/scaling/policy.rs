//! The autoscaling policy: how many workers a processor should run, from its remaining-work
//! estimate. Pure: time comes in as an argument, and the only state is the recent
//! recommendations kept for the scale-down stabilization window.
//!
//! - desired = clamp(ceil(totalLag / targetLagPerReplica), minReplicas, min(maxReplicas, leases)):
//!   never more workers than leases (they would sit idle); `minReplicas` wins over the lease cap.
//! - Scale up at once, at most to double or +4 (whichever is more) per estimate, like the HPA; a
//!   new Deployment starts at the full recommendation.
//! - Scale down only to the highest recommendation seen within the stabilization window.
//! - From zero workers, scale up only when the lag is above `activation_lag` (as KEDA's
//!   activation threshold).
//! - A failed estimate never scales down: the current replicas are held. After
//!   `fallback.after_failures` failed estimates in a row, at least `fallback.replicas` run (as
//!   KEDA's `fallback`), so a processor scaled to zero cannot stay stopped while its backlog is
//!   invisible.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::operator::scaling::behavior::{Behavior, Changes, down_limit, longest_period, up_limit};
use crate::operator::scaling::freshness::{Advice, Freshness, FreshnessState, FreshnessTarget, Settling};

/// Autoscaling settings in plain values.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Fewest workers (0 allows scale to zero).
    pub min_replicas: i32,
    /// Most workers.
    pub max_replicas: i32,
    /// Remaining operations one worker is expected to keep up with.
    pub target_lag_per_replica: u64,
    /// Scale down only to the highest recommendation seen in this window (while the freshness
    /// policy decides, its own window: [`FreshnessTarget::scale_down_stabilization`]).
    pub scale_down_stabilization: Duration,
    /// Workers to run while estimates keep failing.
    pub fallback: Option<Fallback>,
    /// From zero workers, scale up only when the estimated lag is above this (0: any lag).
    pub activation_lag: u64,
    /// How fast scaling may go (the HPA's `behavior`).
    pub behavior: Behavior,
    /// Scale on freshness instead of the lag count, once a rate per worker is measured
    /// ([`crate::operator::scaling::freshness`]).
    pub freshness: Option<FreshnessTarget>,
}

/// What runs while the estimate keeps failing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fallback {
    /// At least this many workers run...
    pub replicas: i32,
    /// ...once this many estimates in a row failed.
    pub after_failures: u32,
}

/// What the last estimate saw.
#[derive(Debug, Clone, PartialEq)]
pub enum Observed {
    /// A successful estimate.
    Estimate {
        /// Remaining operations over all leases.
        total_lag: u64,
        /// Number of leases (the most workers that can be busy).
        leases: usize,
        /// What it tells about freshness (the oldest pending change, what the workers handle).
        freshness: Freshness,
    },
    /// The estimate failed, with the error in words.
    Failed(String),
}

/// Why the replicas are what they are (the `Scaling` condition's reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalingReason {
    /// The recommendation is applied (or on its way, step by step).
    Active,
    /// The recommendation is above `maxReplicas` or the lease count and is held there.
    Limited,
    /// More workers would not read faster: the read budget is the limit.
    ReadBudgetLimited,
    /// The estimate failed; replicas are held.
    EstimateFailed,
}

impl ScalingReason {
    /// The CamelCase reason of the `Scaling` condition.
    pub fn as_str(self) -> &'static str {
        match self {
            ScalingReason::Active => "ScalingActive",
            ScalingReason::Limited => "ScalingLimited",
            ScalingReason::ReadBudgetLimited => "ReadBudgetLimited",
            ScalingReason::EstimateFailed => "EstimateFailed",
        }
    }
}

/// A scaling decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The replicas to run now.
    pub replicas: i32,
    /// The recommendation of this estimate before step limits and stabilization (none on failure).
    pub recommendation: Option<i32>,
    /// The `Scaling` condition's reason.
    pub reason: ScalingReason,
    /// The `Scaling` condition's message: what was decided and why.
    pub message: String,
    /// When the replicas change: the Event's reason (`ScaledUp`/`ScaledDown`) and note.
    pub event: Option<(&'static str, String)>,
}

/// The recommendations of the last stabilization window, oldest first.
#[derive(Debug, Clone, Default)]
pub struct ScaleHistory {
    recommendations: VecDeque<(Instant, i32)>,
    seeded: bool,
    /// The replicas running when the history started: a recommendation for scaling down only.
    seed: Option<(Instant, i32)>,
    /// Estimates failed in a row.
    failures: u32,
    /// Replica changes decided recently, for the rate policies.
    changes: Changes,
    /// What successive estimates measured of freshness.
    freshness: FreshnessState,
}

impl ScaleHistory {
    /// Decides the replicas from `observed`, with `current` the replicas the Deployment has now
    /// (`None` before it exists), and records the recommendation.
    pub fn decide(&mut self, policy: &Policy, current: Option<i32>, observed: &Observed, now: Instant) -> Decision {
        // A history that starts while workers already run (an operator restart or a new leader)
        // counts the current replicas as a recommendation, so nothing scales down before a whole
        // window of estimates was seen (on freshness without a window, its own horizon holds).
        if !self.seeded {
            self.seeded = true;
            self.seed = current.map(|current| (now, current));
        }
        self.forget_before(policy, now);
        let (total_lag, leases, freshness) = match observed {
            Observed::Failed(error) => {
                self.failures = self.failures.saturating_add(1);
                return failed(policy, current, self.failures, error);
            }
            Observed::Estimate {
                total_lag,
                leases,
                freshness,
            } => (*total_lag, *leases, freshness),
        };
        self.failures = 0;
        let settling = policy.freshness.map_or(Settling::DEFAULT, |target| target.settling());
        self.freshness.observe(freshness, current, settling, now);
        let fresh = policy
            .freshness
            .map(|target| self.freshness.advise(&target, freshness, current))
            .filter(|advice| advice.replicas.is_some());
        let window = scale_down_window(policy, fresh.as_ref());
        let recommended = recommend(policy, current, total_lag, leases, fresh);
        let recommendation = recommended.replicas;
        self.recommendations.push_back((now, recommendation));
        let (reason, mut message) = (recommended.reason, recommended.message);
        let replicas = match current {
            None => recommendation,
            Some(current) => {
                let held = Held::by(recommended.upper, window);
                let (replicas, note) = self.stabilized(policy, current, recommendation, held, now);
                if let Some(note) = note {
                    message = format!("{message}; {note}");
                }
                replicas
            }
        };
        if let Some(current) = current
            && replicas != current
        {
            self.changes.push_back((now, replicas - current));
        }
        // A new Deployment counts as scaled up from zero.
        let event = scaling_event(policy, window, current.unwrap_or(0), replicas, total_lag);
        Decision {
            replicas,
            recommendation: Some(recommendation),
            reason,
            message,
            event,
        }
    }
}

impl ScaleHistory {
    /// Forgets the recommendations and changes older than `policy` looks back at `now`.
    fn forget_before(&mut self, policy: &Policy, now: Instant) {
        let keep = policy
            .scale_down_stabilization
            .max(policy.behavior.up_window)
            .max(policy.freshness.map_or(Duration::ZERO, |t| t.scale_down_stabilization));
        self.recommendations
            .retain(|(at, _)| now.saturating_duration_since(*at) <= keep);
        let period = longest_period(&policy.behavior);
        self.changes
            .retain(|(at, _)| now.saturating_duration_since(*at) < period);
    }
}

/// The scale-down window in force: while the freshness policy decides (`fresh`), its own — its
/// rules hold scale-in; else the lag count's.
fn scale_down_window(policy: &Policy, fresh: Option<&Advice>) -> Duration {
    match (fresh, policy.freshness) {
        (Some(_), Some(target)) => target.scale_down_stabilization,
        _ => policy.scale_down_stabilization,
    }
}

/// What holds a recommendation back besides the rate policies.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// The most replicas allowed (`maxReplicas`, the lease count): applies at once.
    upper: i32,
    /// The scale-down stabilization window in force.
    window: Duration,
}

impl Held {
    /// Held by `upper` at most and a scale-down window of `window`.
    fn by(upper: i32, window: Duration) -> Self {
        Self { upper, window }
    }
}

/// What the estimate alone recommends, before the stabilization and the rate policies.
struct Recommended {
    /// The replicas recommended.
    replicas: i32,
    /// The most replicas allowed (`maxReplicas`, the lease count).
    upper: i32,
    /// `Active`, or `Limited` when more were wanted than allowed.
    reason: ScalingReason,
    /// Why, in words.
    message: String,
}

/// The replicas `total_lag` over `leases` asks for under `policy`, with `current` running: the
/// freshness policy's advice where it has one (`fresh`), else the lag count's.
fn recommend(
    policy: &Policy,
    current: Option<i32>,
    total_lag: u64,
    leases: usize,
    fresh: Option<Advice>,
) -> Recommended {
    let target = policy.target_lag_per_replica.max(1);
    let by_count = || i32::try_from(total_lag.div_ceil(target)).unwrap_or(i32::MAX);
    let raw = fresh
        .as_ref()
        .and_then(|advice| advice.replicas)
        .unwrap_or_else(by_count);
    // From zero (or before any worker), a lag at or below the activation threshold wakes nobody.
    let asleep = current.is_none_or(|c| c == 0) && policy.min_replicas == 0 && total_lag <= policy.activation_lag;
    let raw = if asleep { 0 } else { raw };
    let lease_cap = i32::try_from(leases).unwrap_or(i32::MAX);
    let upper = policy.max_replicas.min(lease_cap).max(policy.min_replicas);
    let recommendation = raw.clamp(policy.min_replicas, upper);
    let why = if asleep && total_lag > 0 {
        format!(
            "estimated lag {total_lag} is not above autoscaling.activationLag ({}), so nothing wakes from 0",
            policy.activation_lag
        )
    } else if let Some(advice) = &fresh {
        advice.message.clone()
    } else {
        format!("estimated lag {total_lag}, target {target} per replica")
    };
    let budget_bound = fresh.as_ref().is_some_and(|advice| advice.budget_bound) && raw <= upper;
    if raw > upper {
        let limit = if lease_cap < policy.max_replicas {
            format!("the lease count ({leases}; more workers than leases would sit idle)")
        } else {
            format!("maxReplicas ({})", policy.max_replicas)
        };
        return Recommended {
            replicas: recommendation,
            upper,
            reason: ScalingReason::Limited,
            message: format!("{raw} replica(s) wanted but held at {limit}: {why}"),
        };
    }
    Recommended {
        replicas: recommendation,
        upper,
        reason: if budget_bound {
            ScalingReason::ReadBudgetLimited
        } else {
            ScalingReason::Active
        },
        message: format!("{recommendation} replica(s) recommended: {why}"),
    }
}

/// The Event (reason, note) of a change from `from` to `replicas`, after a scale-down window of
/// `window`; `None` without a change.
fn scaling_event(
    policy: &Policy,
    window: Duration,
    from: i32,
    replicas: i32,
    total_lag: u64,
) -> Option<(&'static str, String)> {
    let target = policy.target_lag_per_replica.max(1);
    if replicas > from {
        Some((
            "ScaledUp",
            if total_lag > target {
                format!("{from} → {replicas}: estimated lag {total_lag} > {target} per replica")
            } else {
                format!("{from} → {replicas}: estimated lag {total_lag} (target {target} per replica)")
            },
        ))
    } else if replicas < from {
        Some((
            "ScaledDown",
            if window.is_zero() {
                format!("{from} → {replicas}: estimated lag {total_lag}")
            } else {
                format!(
                    "{from} → {replicas}: estimated lag {total_lag} for the last {}",
                    humantime::format_duration(window)
                )
            },
        ))
    } else {
        None
    }
}

impl ScaleHistory {
    /// The replicas to run from `current` toward `recommendation`: scale up only to the lowest
    /// recommendation of the up window, down only to the highest of the down window (`held`: a
    /// lowered maxReplicas applies at once), each within its rate policies; with a note for the
    /// message when something held it.
    fn stabilized(
        &self,
        policy: &Policy,
        current: i32,
        recommendation: i32,
        held: Held,
        now: Instant,
    ) -> (i32, Option<String>) {
        let Held { upper, window } = held;
        let within = |window: Duration| {
            self.recommendations
                .iter()
                .filter(move |(at, _)| now.saturating_duration_since(*at) <= window)
                .map(|(_, r)| (*r).min(upper))
        };
        let up_to = within(policy.behavior.up_window).min().unwrap_or(recommendation);
        let seed = self
            .seed
            .filter(|(at, _)| !window.is_zero() && now.saturating_duration_since(*at) <= window)
            .map(|(_, r)| r.min(upper));
        let down_to = within(window).chain(seed).max().unwrap_or(recommendation);
        if up_to > current {
            let limit = up_limit(&policy.behavior.up, current, &self.changes, now);
            let note = (up_to > limit).then(|| format!("scaling up step by step (at most {limit} now)"));
            (up_to.min(limit), note)
        } else if down_to < current {
            let limit = down_limit(&policy.behavior.down, current, &self.changes, now);
            let note = (down_to < limit).then(|| format!("scaling down step by step (at least {limit} now)"));
            (down_to.max(limit), note)
        } else {
            let held = recommendation != current;
            let note = held.then(|| {
                if recommendation < current {
                    format!(
                        "held at {current} until the scale-down stabilization window ({}) has passed",
                        humantime::format_duration(window)
                    )
                } else {
                    format!(
                        "held at {current} until the scale-up stabilization window ({}) has passed",
                        humantime::format_duration(policy.behavior.up_window)
                    )
                }
            });
            (current, note)
        }
    }
}

/// The decision on the `failures`-th failed estimate in a row: hold the replicas, or run the
/// fallback once enough estimates failed (never fewer than run now).
fn failed(policy: &Policy, current: Option<i32>, failures: u32, error: &str) -> Decision {
    let held = current.unwrap_or(policy.min_replicas.max(1).min(policy.max_replicas));
    let fallback = policy.fallback.filter(|f| failures >= f.after_failures.max(1));
    let Some(fallback) = fallback.filter(|f| f.replicas > held) else {
        return Decision {
            replicas: held,
            recommendation: None,
            reason: ScalingReason::EstimateFailed,
            message: format!("the estimate failed, so {held} replica(s) are held: {error}"),
            event: None,
        };
    };
    let replicas = fallback.replicas.min(policy.max_replicas);
    let from = current.unwrap_or(0);
    Decision {
        replicas,
        recommendation: None,
        reason: ScalingReason::EstimateFailed,
        message: format!(
            "{failures} estimates failed in a row, so the fallback of {replicas} replica(s) runs until one works: {error}"
        ),
        event: (replicas > from).then(|| {
            (
                "ScaledUp",
                format!("{from} → {replicas}: autoscaling.fallbackReplicas after {failures} failed estimates"),
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(300);

    fn policy(min: i32, max: i32, target: u64) -> Policy {
        Policy {
            min_replicas: min,
            max_replicas: max,
            target_lag_per_replica: target,
            scale_down_stabilization: WINDOW,
            fallback: None,
            activation_lag: 0,
            freshness: None,
            behavior: Behavior::default(),
        }
    }

    fn estimate(total_lag: u64, leases: usize) -> Observed {
        Observed::Estimate {
            total_lag,
            leases,
            freshness: Freshness::default(),
        }
    }

    #[test]
    fn a_new_deployment_is_scaled_up_from_zero() {
        let decision = ScaleHistory::default().decide(&policy(1, 10, 500), None, &estimate(3000, 8), Instant::now());
        assert_eq!(
            decision.event,
            Some(("ScaledUp", "0 → 6: estimated lag 3000 > 500 per replica".to_owned()))
        );
        let idle = ScaleHistory::default().decide(&policy(0, 10, 500), None, &estimate(0, 8), Instant::now());
        assert_eq!(idle.event, None);
    }

    #[test]
    fn on_freshness_the_measured_rate_decides_and_the_read_budget_caps_it() {
        let fresh = |budget: Option<f64>| Policy {
            freshness: Some(FreshnessTarget::new(
                Duration::from_secs(30),
                Duration::from_secs(13),
                budget,
            )),
            ..policy(1, 20, 500)
        };
        let seen = |lag: u64, handled: f64| Observed::Estimate {
            total_lag: lag,
            leases: 32,
            freshness: Freshness {
                lag,
                oldest_pending_seconds: Some(10),
                handled_per_second: handled,
                read_units_per_document: Some(2.0),
                reporting_workers: 4,
                writes_per_second: None,
                worker_handled_per_second: None,
                leases: 32,
            },
        };
        for (budget, replicas, reason) in [
            (None, 8, ScalingReason::Active),
            (Some(1_000.0), 5, ScalingReason::ReadBudgetLimited),
        ] {
            let policy = fresh(budget);
            let mut history = ScaleHistory::default();
            let t0 = Instant::now();
            // Before a rate per worker is measured, the lag count decides: 6,000 / 500 = 12.
            let first = history.decide(&policy, Some(4), &seen(6_000, 400.0), t0);
            assert_eq!(first.recommendation, Some(12), "{}", first.message);
            // Four workers handling 400/s with a backlog for 30 s: 100/s each. The backlog holds
            // at 6,000: ~400/s arrive, and 6,000 must drain within the 20 s left — 700/s, 7
            // workers; by the time more start, the oldest pending change is as old as 6,000 take
            // to arrive (15 s), so within 15 s: 800/s, 8 workers. A budget of 1,000 RU/s at 2 RU
            // a document feeds 500/s, 5 workers.
            history.decide(&policy, Some(4), &seen(6_000, 400.0), t0 + Duration::from_secs(10));
            let settled = history.decide(&policy, Some(4), &seen(6_000, 400.0), t0 + Duration::from_secs(40));
            assert_eq!(settled.recommendation, Some(replicas), "{}", settled.message);
            assert_eq!(settled.reason, reason, "{}", settled.message);
        }
    }

    #[test]
    fn on_freshness_no_scale_down_window_holds_unless_the_resource_sets_one() {
        let fresh = |window: Duration| Policy {
            freshness: Some(FreshnessTarget {
                scale_down_stabilization: window,
                ..FreshnessTarget::new(Duration::from_secs(30), Duration::from_secs(2), None)
            }),
            ..policy(1, 20, 500)
        };
        let quiet = Observed::Estimate {
            total_lag: 0,
            leases: 32,
            freshness: Freshness {
                oldest_pending_seconds: Some(0),
                writes_per_second: Some(200.0),
                worker_handled_per_second: Some(100.0),
                reporting_workers: 8,
                leases: 32,
                ..Freshness::default()
            },
        };
        let t0 = Instant::now();
        // What arrives is read for its horizon (two acquire intervals, 4 s) before any scale-in.
        let decisions = |policy: &Policy| {
            let mut history = ScaleHistory::default();
            [0, 2, 4].map(|s| history.decide(policy, Some(8), &quiet, t0 + Duration::from_secs(s)))
        };
        let [first, _, unset] = decisions(&fresh(Duration::ZERO));
        assert_eq!(first.replicas, 8, "a new history: {}", first.message);
        assert_eq!(
            unset.replicas, 3,
            "220/s with a tenth to spare, in at once: {}",
            unset.message
        );
        assert_eq!(unset.event, Some(("ScaledDown", "8 → 3: estimated lag 0".to_owned())));
        let [_, _, set] = decisions(&fresh(Duration::from_secs(60)));
        assert_eq!(set.recommendation, Some(3));
        assert_eq!(set.replicas, 8, "the resource's window: {}", set.message);
        assert!(set.message.contains("window (1m)"), "{}", set.message);
        let counted = ScaleHistory::default().decide(&fresh(Duration::ZERO), Some(8), &estimate(0, 32), t0);
        assert_eq!(
            counted.replicas, 8,
            "no rate per worker yet: the lag count decides, with its own window: {}",
            counted.message
        );
    }

    #[test]
    fn single_decisions() {
        // (name, policy, current, observed, replicas, reason)
        #[rustfmt::skip]
        let cases = [
            ("new over a backlog starts in full", policy(1, 10, 500), None, estimate(3000, 8), 6, ScalingReason::Active),
            ("rounds up", policy(1, 10, 500), None, estimate(3001, 8), 7, ScalingReason::Active),
            ("no lag keeps the minimum", policy(2, 10, 500), None, estimate(0, 8), 2, ScalingReason::Active),
            ("capped at the lease count", policy(1, 50, 1), None, estimate(10_000, 8), 8, ScalingReason::Limited),
            ("capped at max", policy(1, 3, 1), None, estimate(10_000, 8), 3, ScalingReason::Limited),
            ("min wins over the lease cap", policy(5, 10, 1000), None, estimate(0, 3), 5, ScalingReason::Active),
            ("zero allowed", policy(0, 10, 1000), None, estimate(0, 4), 0, ScalingReason::Active),
            ("wakes from zero", policy(0, 10, 1000), Some(0), estimate(100, 4), 1, ScalingReason::Active),
            ("step limit: +4 from 1", policy(1, 100, 1), Some(1), estimate(50, 64), 5, ScalingReason::Active),
            ("step limit: double from 10", policy(1, 100, 1), Some(10), estimate(50, 64), 20, ScalingReason::Active),
            ("error holds", policy(1, 10, 1), Some(7), Observed::Failed("unreachable".into()), 7, ScalingReason::EstimateFailed),
            ("error before any workload", policy(0, 10, 1), None, Observed::Failed("x".into()), 1, ScalingReason::EstimateFailed),
            ("huge lag does not overflow", policy(1, 10, 1), Some(2), estimate(u64::MAX, 8), 6, ScalingReason::Limited),
        ];
        for (name, policy, current, observed, replicas, reason) in cases {
            let decision = ScaleHistory::default().decide(&policy, current, &observed, Instant::now());
            assert_eq!(
                (decision.replicas, decision.reason),
                (replicas, reason),
                "{name}: {}",
                decision.message
            );
        }
    }

    #[test]
    fn errors_never_scale_down() {
        let p = policy(0, 10, 100);
        let mut history = ScaleHistory::default();
        let start = Instant::now();
        for minute in 0..30 {
            let at = start + Duration::from_secs(60 * minute);
            let decision = history.decide(&p, Some(6), &Observed::Failed("timeout".into()), at);
            assert_eq!(decision.replicas, 6);
            assert_eq!(decision.event, None);
            assert!(decision.message.contains("timeout"));
        }
    }

    #[test]
    fn failing_estimates_run_the_fallback_until_one_works() {
        let p = Policy {
            fallback: Some(Fallback {
                replicas: 2,
                after_failures: 3,
            }),
            scale_down_stabilization: Duration::from_secs(10),
            ..policy(0, 4, 100)
        };
        let mut history = ScaleHistory::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let failed = Observed::Failed("timeout".into());
        let mut current = history.decide(&p, Some(0), &estimate(0, 4), at(0)).replicas;
        let mut timeline = Vec::new();
        for s in 1..=5 {
            let decision = history.decide(&p, Some(current), &failed, at(s));
            timeline.push((decision.replicas, decision.event.map(|e| e.0)));
            current = decision.replicas;
        }
        assert_eq!(
            timeline,
            vec![(0, None), (0, None), (2, Some("ScaledUp")), (2, None), (2, None)],
            "held at 0 twice, then the fallback"
        );
        // An estimate that works decides again: no lag, so back to zero.
        let works = history.decide(&p, Some(current), &estimate(0, 4), at(6));
        assert_eq!((works.replicas, works.reason), (0, ScalingReason::Active));
        // The count starts over: one failure holds again.
        assert_eq!(history.decide(&p, Some(0), &failed, at(7)).replicas, 0);
        // More workers than the fallback keep running.
        let mut busy = ScaleHistory::default();
        for s in 0..5 {
            assert_eq!(busy.decide(&p, Some(4), &failed, at(s)).replicas, 4);
        }
    }

    #[test]
    fn only_a_lag_above_the_activation_threshold_wakes_workers_from_zero() {
        let p = Policy {
            activation_lag: 50,
            freshness: None,
            ..policy(0, 10, 100)
        };
        let t0 = Instant::now();
        #[rustfmt::skip]
        let cases = [
            ("asleep, lag at the threshold", Some(0), 50, 0),
            ("asleep, lag above it", Some(0), 51, 1),
            ("a new Deployment below it", None, 10, 0),
            ("running workers are not affected", Some(2), 10, 2),
        ];
        for (name, current, lag, want) in cases {
            let decision = ScaleHistory::default().decide(&p, current, &estimate(lag, 8), t0);
            assert_eq!(decision.replicas, want, "{name}: {}", decision.message);
        }
        let held = ScaleHistory::default().decide(&p, Some(0), &estimate(50, 8), t0);
        assert!(held.message.contains("activationLag (50)"), "{}", held.message);
        // With minReplicas above 0 the threshold means nothing.
        let floor = Policy { min_replicas: 1, ..p };
        assert_eq!(
            ScaleHistory::default()
                .decide(&floor, None, &estimate(10, 8), t0)
                .replicas,
            1
        );
    }

    #[test]
    fn behavior_policies_pace_scaling_as_the_hpa_does() {
        use crate::operator::scaling::behavior::{RateKind, RatePolicy, Rules, Select};
        let minute = Duration::from_secs(60);
        let p = Policy {
            scale_down_stabilization: Duration::ZERO,
            behavior: Behavior {
                up_window: Duration::from_secs(30),
                up: Rules {
                    select: Select::Max,
                    policies: vec![RatePolicy {
                        kind: RateKind::Pods,
                        value: 2,
                        period: minute,
                    }],
                },
                down: Rules {
                    select: Select::Max,
                    policies: vec![RatePolicy {
                        kind: RateKind::Pods,
                        value: 1,
                        period: minute,
                    }],
                },
            },
            ..policy(1, 20, 100)
        };
        let mut history = ScaleHistory::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut current = history.decide(&p, None, &estimate(300, 32), at(0)).replicas;
        assert_eq!(current, 3, "a new Deployment starts at the recommendation");
        // Lag jumps: the up window holds 3 for 30 s, then 2 pods per minute.
        let mut timeline = Vec::new();
        for s in (15..=180).step_by(15) {
            current = history.decide(&p, Some(current), &estimate(1000, 32), at(s)).replicas;
            timeline.push(current);
        }
        assert_eq!(timeline, vec![3, 3, 5, 5, 5, 5, 7, 7, 7, 7, 9, 9]);
        // Lag gone: one pod a minute down.
        let mut down = Vec::new();
        for s in (195..=390).step_by(15) {
            current = history.decide(&p, Some(current), &estimate(0, 32), at(s)).replicas;
            down.push(current);
        }
        assert_eq!(down, vec![8, 8, 8, 8, 7, 7, 7, 7, 6, 6, 6, 6, 5, 5]);
    }

    #[test]
    fn a_lowered_max_replicas_applies_at_once() {
        let mut history = ScaleHistory::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(
            history
                .decide(&policy(1, 10, 100), None, &estimate(1000, 16), at(0))
                .replicas,
            10
        );
        let lowered = history.decide(&policy(1, 4, 100), Some(10), &estimate(1000, 16), at(15));
        assert_eq!(
            (lowered.replicas, lowered.reason),
            (4, ScalingReason::Limited),
            "{}",
            lowered.message
        );
        assert_eq!(lowered.event.map(|e| e.0), Some("ScaledDown"));
        // Also when the lag drained: the window holds nothing above the new maximum.
        let idle = history.decide(&policy(1, 2, 100), Some(4), &estimate(0, 16), at(30));
        assert_eq!(idle.replicas, 2);
    }

    #[test]
    fn scale_down_waits_for_the_window() {
        let p = policy(1, 10, 100);
        let mut history = ScaleHistory::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut current = history.decide(&p, None, &estimate(800, 8), at(0)).replicas;
        assert_eq!(current, 8);
        // The lag drains; every 15 s a new estimate recommends fewer.
        let mut timeline = Vec::new();
        for s in (15..=600).step_by(15) {
            let decision = history.decide(&p, Some(current), &estimate(0, 8), at(s));
            if decision.replicas != current {
                timeline.push((s, decision.replicas, decision.event.clone().map(|e| e.0)));
            }
            current = decision.replicas;
        }
        // The 8-recommendation at 0 s leaves the 300 s window at 315 s: one step down to the minimum.
        assert_eq!(timeline, vec![(315, 1, Some("ScaledDown"))]);
    }

    #[test]
    fn scale_down_goes_to_the_highest_recommendation_in_the_window() {
        let p = policy(1, 10, 100);
        let mut history = ScaleHistory::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(history.decide(&p, None, &estimate(1000, 10), at(0)).replicas, 10);
        assert_eq!(history.decide(&p, Some(10), &estimate(500, 10), at(100)).replicas, 10);
        assert_eq!(history.decide(&p, Some(10), &estimate(100, 10), at(200)).replicas, 10);
        // 10 has left the window; 5 (at 100 s) is the highest left.
        assert_eq!(history.decide(&p, Some(10), &estimate(100, 10), at(301)).replicas, 5);
        assert_eq!(history.decide(&p, Some(5), &estimate(100, 10), at(401)).replicas, 1);
    }

    #[test]
    fn scale_to_zero_and_back() {
        let p = Policy {
            scale_down_stabilization: Duration::from_secs(10),
            ..policy(0, 4, 1000)
        };
        let mut history = ScaleHistory::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(
            history.decide(&p, Some(2), &estimate(0, 4), at(0)).replicas,
            2,
            "seeded by the running replicas"
        );
        assert_eq!(history.decide(&p, Some(2), &estimate(0, 4), at(5)).replicas, 2);
        let down = history.decide(&p, Some(2), &estimate(0, 4), at(11));
        assert_eq!(down.replicas, 0);
        assert_eq!(down.event.map(|e| e.0), Some("ScaledDown"));
        let up = history.decide(&p, Some(0), &estimate(100, 4), at(12));
        assert_eq!(up.replicas, 1);
        assert_eq!(
            up.event,
            Some((
                "ScaledUp",
                "0 → 1: estimated lag 100 (target 1000 per replica)".to_owned()
            ))
        );
    }

    #[test]
    fn scaling_up_is_immediate_but_stepped() {
        let p = policy(1, 50, 10);
        let mut history = ScaleHistory::default();
        let t0 = Instant::now();
        let mut current = 1;
        let mut steps = Vec::new();
        for i in 0..5 {
            current = history
                .decide(&p, Some(current), &estimate(400, 64), t0 + Duration::from_secs(15 * i))
                .replicas;
            steps.push(current);
        }
        assert_eq!(steps, vec![5, 10, 20, 40, 40]);
    }

    #[test]
    fn limited_names_the_limit() {
        let by_leases = ScaleHistory::default().decide(&policy(1, 50, 1), None, &estimate(10, 8), Instant::now());
        assert!(by_leases.message.contains("lease count (8"), "{}", by_leases.message);
        let by_max = ScaleHistory::default().decide(&policy(1, 3, 1), None, &estimate(10, 8), Instant::now());
        assert!(by_max.message.contains("maxReplicas (3)"), "{}", by_max.message);
    }

    proptest::proptest! {
        /// Over any sequence of estimates (successes and failures, any lag, any lease count) the
        /// replicas stay within the bounds: at least `minReplicas`, at most `maxReplicas`, never
        /// more than the leases unless `minReplicas` says so, never changed by a failed estimate,
        /// and up-steps of at most double or +4.
        #[test]
        fn replicas_stay_within_the_policy_whatever_the_estimates(
            min in 0i32..5,
            extra in 0i32..20,
            target in 1u64..2000,
            steps in proptest::collection::vec((proptest::option::of((0u64..1_000_000, 1usize..64)), 0u64..120), 1..30),
            fallback in proptest::option::of((1i32..6, 1u32..4)),
        ) {
            let policy = Policy {
                min_replicas: min,
                // The CRD admits maxReplicas >= 1 and minReplicas <= maxReplicas.
                max_replicas: min.max(1) + extra,
                target_lag_per_replica: target,
                scale_down_stabilization: Duration::from_secs(60),
                fallback: fallback.map(|(replicas, after_failures)| Fallback { replicas, after_failures }),
                activation_lag: 0,
                freshness: None,
                behavior: Behavior::default(),
            };
            let mut history = ScaleHistory::default();
            let start = Instant::now();
            let mut now = start;
            let mut current: Option<i32> = None;
            for (estimate, seconds) in steps {
                now += Duration::from_secs(seconds);
                let observed = match estimate {
                    Some((total_lag, leases)) => Observed::Estimate {
                        total_lag,
                        leases,
                        freshness: Freshness::default(),
                    },
                    None => Observed::Failed("unreachable".into()),
                };
                let decision = history.decide(&policy, current, &observed, now);
                let replicas = decision.replicas;
                proptest::prop_assert!(
                    replicas >= policy.min_replicas && replicas <= policy.max_replicas,
                    "{replicas} outside {min}..={}",
                    policy.max_replicas
                );
                match &observed {
                    Observed::Failed(_) => {
                        if let Some(held) = current {
                            proptest::prop_assert!(replicas >= held, "a failed estimate scaled down");
                            if policy.fallback.is_none() {
                                proptest::prop_assert_eq!(replicas, held, "a failed estimate changed the replicas");
                            }
                        }
                    }
                    Observed::Estimate { leases, .. } => {
                        let cap = (*leases as i32).max(policy.min_replicas);
                        // Scale-down stabilization may hold replicas above a lease count that shrank.
                        proptest::prop_assert!(replicas <= cap.max(current.unwrap_or(0)), "{replicas} workers for {leases} leases");
                        if let Some(before) = current
                            && replicas > before
                        {
                            proptest::prop_assert!(
                                replicas <= (before * 2).max(before + 4).max(policy.min_replicas),
                                "step {before} → {replicas}"
                            );
                        }
                    }
                }
                current = Some(replicas);
            }
        }
    }
}
