//! The `autoscaling: freshness step` group (issue 55 §5b; run only when `--only` names it, until
//! its goals are met — see `docs/concepts/freshness.md`): a step in the write rate (100 → 2,000
//! a second in the full run, then back), the workers scaled by the operator's own policy
//! ([`crate::operator::scaling::policy`]) from the operator's own estimate of the leases
//! ([`crate::processor::report::estimator`]) every [`ESTIMATE_EVERY`] — once on freshness
//! (`targetFreshness`), once on the lag count tuned for the same load — with real workers whose
//! handler can take [`WORKER_CAPACITY_SHARE`] of the peak rate each (a worker handles its
//! batches one at a time, at a fixed cost a document). Measured in one run:
//!
//! Each run starts with one worker at the base rate (what one worker handles is measured by the
//! workers themselves, [`crate::processor::leases::worker_capacity`]: no backlog is needed first).
//!
//! - the p99 of the oldest pending change's age from the step up to the end of the run, against
//!   the target;
//! - replica-minutes on freshness against the lag-count policy's;
//! - the scale events after each step.
//!
//! Both policies may scale up to any count at once ([`jump_up`]); the rest of the behavior is the
//! HorizontalPodAutoscaler's default.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::world::{World, wait_until};
use super::{BenchError, BenchSettings, Check, Figure};
use crate::cosmos::{DocumentContainer, StartFrom};
use crate::operator::scaling::behavior::Behavior;
use crate::operator::scaling::freshness::{Freshness, FreshnessTarget};
use crate::operator::scaling::policy::{Observed, Policy, ScaleHistory};
use crate::processor::report::estimator::{
    DEFAULT_CONCURRENCY, ProcessorEstimate, estimate_leases, with_partition_figures,
};
use crate::processor::{Batch, ChangeHandler, HandlerError, LeaseStore, ProcessorHandle};

/// How often the workers are estimated and scaled.
const ESTIMATE_EVERY: Duration = Duration::from_secs(2);
/// The physical partitions, and leases per partition: 32 leases, the most workers.
const PARTITIONS: u32 = 8;
const PER_PARTITION: u32 = 4;
/// What one worker can handle, as a share of the peak write rate: eight keep up with it.
const WORKER_CAPACITY_SHARE: f64 = 1.0 / 8.0;
/// The peak write rate, as a multiple of the base rate.
const STEP: f64 = 20.0;
/// How often the application sends the writes due.
const WRITE_TICK: Duration = Duration::from_millis(20);

/// The run's shape: rates, how long each part lasts, and the target.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// Writes a second before and after the step.
    base: f64,
    /// Seconds at the base rate before the step, at the peak, and back at the base rate.
    before: Duration,
    peak: Duration,
    after: Duration,
    /// The freshness target.
    target: Duration,
    /// Lease timings as a share of the defaults.
    timing_scale: f64,
}

impl Shape {
    fn of(settings: &BenchSettings) -> Self {
        // The full run: 100 → 2,000 a second for two minutes. A target of 20 s either way: a
        // worker added takes about 8 s to run at these lease timings (two acquire cycles and
        // its first reads), and the step is seen up to an estimate late. A peak of four targets
        // at least: a shorter one ends before a policy that scales in on a drained backlog
        // meets what keeps arriving.
        let full = settings.documents >= 100_000;
        Self {
            base: if full { 100.0 } else { 10.0 },
            before: Duration::from_secs(if full { 90 } else { 30 }),
            peak: Duration::from_secs(if full { 120 } else { 80 }),
            after: Duration::from_secs(if full { 120 } else { 50 }),
            target: Duration::from_secs(20),
            timing_scale: 0.15,
        }
    }

    /// Documents a second one worker handles.
    fn capacity(&self) -> f64 {
        self.base * STEP * WORKER_CAPACITY_SHARE
    }

    /// The write rate `elapsed` into the run.
    fn rate_at(&self, elapsed: Duration) -> f64 {
        if elapsed >= self.before && elapsed < self.before + self.peak {
            self.base * STEP
        } else {
            self.base
        }
    }

    fn total(&self) -> Duration {
        self.before + self.peak + self.after
    }
}

/// A worker's handler: its batches one at a time, each document at a fixed cost.
struct Capacity {
    each: Duration,
    turn: tokio::sync::Mutex<()>,
}

#[async_trait]
impl ChangeHandler for Capacity {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        let _turn = self.turn.lock().await;
        let documents = u32::try_from(batch.documents.len()).unwrap_or(u32::MAX);
        tokio::time::sleep(self.each * documents).await;
        Ok(())
    }
}

/// How many tunings of the lag-count policy are tried at most.
const COUNT_TUNINGS: usize = 3;

/// The lag-count policy's run the freshness policy is measured against.
#[derive(Debug, Clone)]
struct Counted {
    run: Run,
    /// Its lag per replica.
    lag_per_replica: u64,
    /// Whether its p99 met the target.
    met: bool,
    /// The tunings run.
    tried: usize,
}

/// What one policy's run showed.
#[derive(Debug, Clone, Default)]
struct Run {
    /// The oldest pending change's age at each estimate from the step up on (seconds).
    ages: Vec<u64>,
    /// Replica-seconds over the run.
    replica_seconds: f64,
    /// Replica changes after the step up (to its end), and after the step down.
    events_up: usize,
    events_down: usize,
    /// The most replicas run.
    most: i32,
}

/// The application: writes at the shape's rate for the whole run.
fn write_steps(items: DocumentContainer, shape: Shape, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let started = Instant::now();
        let written = Arc::new(AtomicU64::new(0));
        let mut due = 0.0;
        let mut tick = tokio::time::interval(WRITE_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = Instant::now();
        while !stop.is_cancelled() && started.elapsed() < shape.total() {
            tick.tick().await;
            let now = Instant::now();
            due += shape.rate_at(started.elapsed()) * now.duration_since(last).as_secs_f64();
            last = now;
            while due >= 1.0 {
                due -= 1.0;
                let n = written.fetch_add(1, Ordering::SeqCst) as usize;
                let items = items.clone();
                tokio::spawn(async move {
                    let pk = format!("pk-{}", n % 997);
                    let doc = serde_json::json!({"id": format!("step-{n}"), "pk": pk});
                    let _ = items.upsert(&pk, &doc).await;
                });
            }
        }
    })
}

/// The workers, started and stopped as the policy decides.
struct Workers<'a> {
    world: &'a World,
    processor: String,
    shape: Shape,
    running: Vec<ProcessorHandle>,
    started: usize,
}

impl Workers<'_> {
    async fn scale_to(&mut self, replicas: i32) -> Result<(), BenchError> {
        let replicas = usize::try_from(replicas).unwrap_or(0);
        while self.running.len() < replicas {
            let mut options = World::options(&self.processor, &format!("w{}", self.started), self.shape.timing_scale);
            options.leases_per_partition = PER_PARTITION;
            options.start_from = StartFrom::Now;
            let handler = Arc::new(Capacity {
                each: Duration::from_secs_f64(1.0 / self.shape.capacity()),
                turn: tokio::sync::Mutex::new(()),
            });
            self.running.push(self.world.start_with(options, handler).await?);
            self.started += 1;
        }
        while self.running.len() > replicas {
            if let Some(handle) = self.running.pop() {
                handle.stop().await;
            }
        }
        Ok(())
    }

    async fn stop(mut self) {
        let _ = self.scale_to(0).await;
    }
}

/// One run of `policy` over the shape: the estimates, the decisions, the workers — on an
/// emulator of its own, so that no run reads a container that earlier runs filled (the SDK's
/// emulator copies every document of a lease's range for each change feed page it serves, so a
/// fuller container slows every read).
async fn run(processor: &str, policy: &Policy, shape: Shape) -> Result<Run, BenchError> {
    let world = World::new(PARTITIONS).await?;
    let world = &world;
    let mut workers = Workers {
        world,
        processor: processor.to_owned(),
        shape,
        running: Vec::new(),
        started: 0,
    };
    workers.scale_to(policy.min_replicas.max(1)).await?;
    let options = World::options(processor, "observer", shape.timing_scale);
    let (store, monitored) = world.store(&options).await?;
    let leases = (PARTITIONS * PER_PARTITION) as usize;
    wait_until(Duration::from_secs(60), || async {
        store.snapshot().await.is_ok_and(|s| s.leases.len() >= leases)
    })
    .await
    .ok_or("the leases were not created in time")?;
    let stop = CancellationToken::new();
    let writer = write_steps(world.items.clone(), shape, stop.clone());
    let mut history = ScaleHistory::default();
    let mut figures = Run::default();
    let started = Instant::now();
    let mut current = i32::try_from(workers.running.len()).unwrap_or(i32::MAX);
    while started.elapsed() < shape.total() {
        let tick = Instant::now();
        let snapshot = store.snapshot().await?;
        let estimates = estimate_leases(&monitored, &snapshot.leases, StartFrom::Now, DEFAULT_CONCURRENCY).await?;
        let estimate =
            with_partition_figures(ProcessorEstimate::new(processor, estimates), &snapshot, &monitored).await;
        let observed = Observed::Estimate {
            total_lag: estimate.total_lag,
            leases: estimate.lease_count,
            freshness: Freshness::from(&estimate),
        };
        let decision = history.decide(policy, Some(current), &observed, Instant::now());
        let elapsed = started.elapsed();
        tracing::info!(
            processor,
            elapsed = elapsed.as_secs(),
            current,
            recommendation = ?decision.recommendation,
            replicas = decision.replicas,
            lag = estimate.total_lag,
            oldest_pending = ?estimate.oldest_pending_seconds,
            writes_per_second = ?estimate.writes_per_second,
            worker_handled_per_second = ?estimate.worker_handled_per_second,
            "freshness step estimate: {}",
            decision.message
        );
        if let Some(age) = estimate.oldest_pending_seconds.filter(|_| elapsed >= shape.before) {
            figures.ages.push(age);
        }
        if decision.replicas != current {
            if elapsed >= shape.before + shape.peak {
                figures.events_down += 1;
            } else if elapsed >= shape.before {
                figures.events_up += 1;
            }
            workers.scale_to(decision.replicas).await?;
            current = decision.replicas;
        }
        figures.most = figures.most.max(current);
        tokio::time::sleep(ESTIMATE_EVERY.saturating_sub(tick.elapsed())).await;
        figures.replica_seconds += f64::from(current) * tick.elapsed().as_secs_f64();
    }
    stop.cancel();
    let _ = writer.await;
    workers.stop().await;
    Ok(figures)
}

/// The policy both runs share: 1 to 32 workers, the HPA's default rates, a scale-down
/// stabilization of the target for the lag count (the run is short); on freshness, the
/// product's default: none, its rules hold scale-in.
fn base_policy(shape: Shape) -> Policy {
    Policy {
        min_replicas: 1,
        max_replicas: (PARTITIONS * PER_PARTITION) as i32,
        // Tuned for the load: a worker's share of the backlog drains within half the target.
        target_lag_per_replica: (shape.capacity() * shape.target.as_secs_f64() / 2.0).max(1.0) as u64,
        scale_down_stabilization: shape.target,
        fallback: None,
        activation_lag: 0,
        behavior: jump_up(),
        freshness: None,
    }
}

/// The HorizontalPodAutoscaler's default behavior, except that scaling up may go to any count at
/// once (`scaleUp.policies: [{type: Percent, value: 1000, periodSeconds: 15}]`): a policy that
/// knows how many workers it needs goes there in one step.
fn jump_up() -> Behavior {
    let mut behavior = Behavior::default();
    for policy in &mut behavior.up.policies {
        policy.value = policy.value.max(1_000);
    }
    behavior
}

/// The group: see the module.
pub async fn freshness_step(settings: &BenchSettings) -> Result<Vec<Figure>, BenchError> {
    let shape = Shape::of(settings);
    let count_policy = base_policy(shape);
    let fresh_policy = Policy {
        freshness: Some(FreshnessTarget::new(
            shape.target,
            World::options("fresh", "w", shape.timing_scale).acquire_interval,
            None,
        )),
        ..count_policy.clone()
    };
    let fresh = run("fresh", &fresh_policy, shape).await?;
    let counted = tuned_count(shape, count_policy).await?;
    Ok(figures(shape, &fresh, &counted))
}

/// The lag-count policy tuned to keep the target on this load: from a worker's share draining
/// in half the target, the lag per replica halved until its p99 meets the target (at most
/// [`COUNT_TUNINGS`] runs; the last one when none does).
async fn tuned_count(shape: Shape, mut policy: Policy) -> Result<Counted, BenchError> {
    let mut tried = 0;
    loop {
        tried += 1;
        let run = run(&format!("counted{tried}"), &policy, shape).await?;
        let met = p99(&run.ages) <= shape.target.as_secs_f64();
        if met || tried >= COUNT_TUNINGS {
            return Ok(Counted {
                run,
                lag_per_replica: policy.target_lag_per_replica,
                met,
                tried,
            });
        }
        policy.target_lag_per_replica = (policy.target_lag_per_replica / 2).max(1);
    }
}

/// The p99 of `ages` (0 without any).
fn p99(ages: &[u64]) -> f64 {
    let mut sorted = ages.to_vec();
    sorted.sort_unstable();
    let at = (sorted.len() as f64 * 0.99).ceil() as usize;
    sorted.get(at.saturating_sub(1)).copied().unwrap_or(0) as f64
}

/// The group's figures.
fn figures(shape: Shape, fresh: &Run, counted: &Counted) -> Vec<Figure> {
    let target = shape.target.as_secs_f64();
    let step = format!(
        "a step from {:.0} to {:.0} writes/s for {} s, a worker handling {:.0}/s",
        shape.base,
        shape.base * STEP,
        shape.peak.as_secs(),
        shape.capacity()
    );
    let tuning = if counted.met {
        format!(
            "tuned to keep the target: {} per replica, the {} tried",
            counted.lag_per_replica,
            ordinal(counted.tried)
        )
    } else {
        format!(
            "none of {} tunings kept the target; the last, {} per replica",
            counted.tried, counted.lag_per_replica
        )
    };
    vec![
        Figure::ratio(
            &format!(
                "freshness step: p99 of the oldest pending change's age (s) on freshness ({step}; at most {} workers)",
                fresh.most
            ),
            p99(&fresh.ages),
            &format!("the target, {} s", shape.target.as_secs()),
            target,
            "≤ 1 ×",
        )
        .against(Check::RatioAtMost(1.0)),
        Figure::ratio(
            "freshness step: replica-minutes on freshness",
            fresh.replica_seconds / 60.0,
            &format!(
                "the lag-count policy on the same load ({tuning}; p99 age {:.0} s, at most {} workers)",
                p99(&counted.run.ages),
                counted.run.most
            ),
            counted.run.replica_seconds / 60.0,
            "≤ 1 ×",
        )
        .against(Check::RatioAtMost(1.0)),
        Figure::plain(
            &format!(
                "freshness step: scale events after the step up (after the step down: {}; the lag count: {} and {})",
                fresh.events_down, counted.run.events_up, counted.run.events_down
            ),
            fresh.events_up.max(fresh.events_down) as f64,
            "–",
            "≤ 2 per step",
        )
        .against(Check::AtMost(2.0))
        .counted(),
    ]
}

/// "first", "second", "third", … for `n` from 1.
fn ordinal(n: usize) -> String {
    match n {
        1 => "first".into(),
        2 => "second".into(),
        3 => "third".into(),
        n => format!("{n}th"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_p99_is_the_age_below_which_ninety_nine_in_a_hundred_are() {
        assert_eq!(p99(&[]), 0.0);
        assert_eq!(p99(&[5]), 5.0);
        let ages: Vec<u64> = (1..=200).collect();
        assert_eq!(p99(&ages), 198.0);
    }

    #[test]
    fn the_shape_steps_up_and_back() {
        let shape = Shape::of(&BenchSettings::full());
        assert_eq!(shape.rate_at(Duration::from_secs(10)), 100.0);
        assert_eq!(shape.rate_at(Duration::from_secs(91)), 2_000.0);
        assert_eq!(shape.rate_at(Duration::from_secs(211)), 100.0);
        assert_eq!(shape.capacity(), 250.0);
    }
}
