//! What this worker handles a second while it has work: the documents it handled divided by the
//! time at least one of its leases had changes to go through (from the read that returned them
//! to the read that found the lease caught up), both exponentially decayed
//! ([`crate::processor::leases::work_report::WorkTimings::rate_time_constant`]) and both counted
//! when a batch is done (so a batch long against the time constant does not read high right
//! after it). With every write of a lease the owner writes it into the lease's properties
//! ([`WORKER_CAPACITY_PROPERTY`]); the operator's freshness policy takes it as what one worker
//! handles a second (the estimate carries it: [`crate::processor::report::estimator`]).
//!
//! Counted alike from the same moment, so a worker just started — or one whose leases just moved
//! — reports what it does, not a rate still ramping up from nothing; and a worker that is idle
//! most of the time reports how fast it goes when it has work, not how little arrives. A worker
//! whose leases are handled one at a time (or one at its limit) reports its capacity; one whose
//! leases are handled side by side and rarely all at once reports less than it could do (the
//! policy then errs toward more workers).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::processor::leases::lease::Lease;

/// Lease property: the documents a second the owner handles while it has work (all its leases).
pub const WORKER_CAPACITY_PROPERTY: &str = "workerHandledPerSecond";

/// The least time with work (in all, not decayed) a figure is reported after: a few batches'
/// worth.
const LEAST_BUSY_SECONDS: f64 = 1.0;

/// The highest figure read from a lease: a value edited by hand beyond it is no report.
const MAX_FIGURE: f64 = 1e9;

/// The meter's state, brought up to date at every change.
#[derive(Debug, Clone, Copy)]
struct Counts {
    /// Leases with changes to go through now.
    working: u32,
    /// Documents handled, decayed to `at`.
    documents: f64,
    /// Seconds with work, decayed to `at`, up to the last time documents were counted.
    busy: f64,
    /// Seconds with work since then: counted with the next documents, so that both are counted
    /// at the same moments (documents counted when their batch is done, time as it passes,
    /// would read high right after each batch).
    unfolded: f64,
    /// Seconds with work in all.
    busy_in_all: f64,
    /// When the counts were last brought up to date.
    at: Instant,
    /// When the last stretch of work ended: a stretch never starts before it.
    idle_since: Instant,
}

/// The worker's meter, shared by its lease readers.
#[derive(Debug)]
pub struct WorkerCapacity {
    tau: Duration,
    counts: Mutex<Counts>,
}

/// Weight left of a count after `elapsed`, with time constant `tau`.
fn kept(elapsed: Duration, tau: Duration) -> f64 {
    (-elapsed.as_secs_f64() / tau.as_secs_f64()).exp()
}

impl Counts {
    /// The counts as of `now` (a stretch of work under way counts up to it).
    fn at(mut self, now: Instant, tau: Duration) -> Self {
        let elapsed = now.saturating_duration_since(self.at);
        let k = kept(elapsed, tau);
        self.documents *= k;
        self.busy *= k;
        if self.working > 0 {
            self.unfolded += elapsed.as_secs_f64();
            self.busy_in_all += elapsed.as_secs_f64();
        }
        self.at = self.at.max(now);
        self
    }

    /// Counts the time with work since documents were last counted.
    fn fold(&mut self) {
        self.busy += self.unfolded;
        self.unfolded = 0.0;
    }
}

impl WorkerCapacity {
    /// A meter with the time constant `tau`, nothing counted.
    pub fn new(tau: Duration) -> Self {
        let now = Instant::now();
        Self {
            tau: tau.max(Duration::from_millis(100)),
            counts: Mutex::new(Counts {
                working: 0,
                documents: 0.0,
                busy: 0.0,
                unfolded: 0.0,
                busy_in_all: 0.0,
                at: now,
                idle_since: now,
            }),
        }
    }

    fn update(&self, now: Instant, change: impl FnOnce(&mut Counts)) {
        let mut counts = self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut current = counts.at(now, self.tau);
        change(&mut current);
        *counts = current;
    }

    /// A lease found changes at `since` (when the read that returned them started): it has work
    /// until [`WorkerCapacity::caught_up`].
    pub fn working(&self, since: Instant, now: Instant) {
        self.update(now, |counts| {
            if counts.working == 0 {
                let from = since.max(counts.idle_since).min(now);
                let earlier = now.saturating_duration_since(from).as_secs_f64();
                counts.unfolded += earlier;
                counts.busy_in_all += earlier;
            }
            counts.working += 1;
        });
    }

    /// A stretch of work of one lease that began with the read started at `since`: it ends
    /// when the returned guard is dropped (the lease caught up, or its reader ended).
    pub fn start_working(self: &Arc<Self>, since: Instant) -> Working {
        self.working(since, Instant::now());
        Working { meter: self.clone() }
    }

    /// A lease that had work is caught up (or no longer processed here) at `now`.
    pub fn caught_up(&self, now: Instant) {
        self.update(now, |counts| {
            counts.working = counts.working.saturating_sub(1);
            if counts.working == 0 {
                counts.idle_since = now;
                counts.fold();
            }
        });
    }

    /// `documents` handled, as of `now` (when their batch was done).
    pub fn handled(&self, documents: usize, now: Instant) {
        self.update(now, |counts| {
            counts.documents += documents as f64;
            counts.fold();
        });
    }

    /// Documents a second handled while there was work, as of `now`; `None` before a second of
    /// work was seen.
    pub fn per_second(&self, now: Instant) -> Option<f64> {
        let counts = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .at(now, self.tau);
        (counts.busy_in_all >= LEAST_BUSY_SECONDS && counts.busy > 0.0).then(|| counts.documents / counts.busy)
    }

    /// Writes the figure as of `now` into `lease` (two decimals), once there is one.
    pub fn record(&self, lease: &mut Lease, now: Instant) {
        if let Some(rate) = self.per_second(now).filter(|rate| rate.is_finite()) {
            lease.properties.insert(
                WORKER_CAPACITY_PROPERTY.into(),
                format!("{:.2}", rate.clamp(0.0, MAX_FIGURE)),
            );
        }
    }
}

/// One lease's stretch of work: counted until dropped.
#[derive(Debug)]
pub struct Working {
    meter: Arc<WorkerCapacity>,
}

impl Drop for Working {
    fn drop(&mut self) {
        self.meter.caught_up(Instant::now());
    }
}

/// What the owner of `lease` reported it handles a second while it has work; `None` without a
/// report (or an unreadable one).
pub fn reported_worker_capacity(lease: &Lease) -> Option<f64> {
    let value: f64 = lease.properties.get(WORKER_CAPACITY_PROPERTY)?.parse().ok()?;
    (value.is_finite() && value > 0.0 && value <= MAX_FIGURE).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cosmos::EpkRange;

    const TAU: Duration = Duration::from_secs(4);

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn a_worker_busy_a_quarter_of_the_time_reports_its_rate_while_busy() {
        let meter = WorkerCapacity::new(TAU);
        let start = Instant::now();
        // One second in four with work, 25 documents handled in it: 25 a second.
        for cycle in 0..20 {
            let from = start + secs(4.0 * f64::from(cycle));
            meter.working(from, from + secs(0.1));
            for batch in 1..=5 {
                meter.handled(5, from + secs(0.2 * f64::from(batch)));
            }
            meter.caught_up(from + secs(1.0));
        }
        let rate = meter.per_second(start + secs(80.5)).unwrap_or_default();
        assert!((rate - 25.0).abs() < 1.0, "{rate}");
    }

    #[test]
    fn a_worker_just_started_reports_what_it_does_not_a_ramp() {
        let meter = WorkerCapacity::new(TAU);
        let start = Instant::now();
        meter.working(start, start);
        assert_eq!(meter.per_second(start + secs(0.5)), None, "too little work seen yet");
        for step in 1..=80 {
            meter.handled(1, start + secs(0.05 * f64::from(step)));
        }
        let rate = meter.per_second(start + secs(4.0)).unwrap_or_default();
        assert!((rate - 20.0).abs() < 0.5, "20 a second from the start: {rate}");
    }

    #[test]
    fn overlapping_work_counts_once_and_a_stretch_never_starts_before_the_last_ended() {
        let meter = WorkerCapacity::new(Duration::from_secs(1_000));
        let start = Instant::now();
        meter.working(start, start);
        meter.working(start, start + secs(1.0));
        meter.caught_up(start + secs(2.0));
        meter.caught_up(start + secs(3.0));
        // Began (by its read) before the last stretch ended: counted from its end.
        meter.working(start + secs(2.5), start + secs(5.0));
        meter.handled(50, start + secs(5.0));
        meter.caught_up(start + secs(5.0));
        let rate = meter.per_second(start + secs(9.0)).unwrap_or_default();
        assert!((rate - 10.0).abs() < 0.1, "50 documents over 5 busy seconds: {rate}");
    }

    #[test]
    fn the_figure_reads_back_from_the_lease_and_nonsense_is_no_report() {
        let meter = WorkerCapacity::new(TAU);
        let start = Instant::now();
        let mut lease = Lease::new("p", &EpkRange::full(), None);
        meter.record(&mut lease, start);
        assert_eq!(reported_worker_capacity(&lease), None);
        meter.working(start, start);
        for step in 1..=20 {
            meter.handled(3, start + secs(0.1 * f64::from(step)));
        }
        meter.record(&mut lease, start + secs(2.0));
        let recorded: f64 = lease.properties[WORKER_CAPACITY_PROPERTY].parse().unwrap_or_default();
        assert!((recorded - 30.0).abs() < 1.0, "{recorded}");
        assert_eq!(reported_worker_capacity(&lease), Some(recorded));
        for bad in ["-1", "0", "NaN", "inf", "x", "1e308"] {
            lease.properties.insert(WORKER_CAPACITY_PROPERTY.into(), bad.into());
            assert_eq!(reported_worker_capacity(&lease), None, "{bad}");
        }
    }
}
