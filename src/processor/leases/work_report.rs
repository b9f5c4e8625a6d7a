//! What keeping up with a lease costs, as its owner reports it: at every checkpoint the worker
//! writes into the lease's `properties` the operations a second written into the lease's
//! partition (`writesPerSecond`): how fast the partition's latest LSN, which every page's session
//! token carries, moved while the owner read it — an exponentially decayed count ([`DecayedRate`],
//! time constant [`WorkTimings::rate_time_constant`]). Not the documents the owner handled a
//! second: those measure the owner (an overloaded one handles less than is written, one draining a
//! backlog more), not the lease. For a lease narrower than its partition it is the partition's
//! rate, the same for each of its sub-range leases.
//!
//! The property moves with the lease (a handoff, a split's children), so a new owner goes on from
//! it rather than from nothing; readers fade it by how long the lease was not written since
//! ([`rate_as_of`]). Other writes of the lease (a handoff request, a release, a renewal) refresh
//! its `_ts` without touching the report, so an idle lease's old rate can come back for a while
//! after one ([`rate_report_due`] says when an owner would write it again; not yet wired in: the
//! writes it adds starved acquisitions under a tight lease-container budget). With the lag report beside it
//! ([`crate::processor::leases::lag_report`]) it is what balancing by work weighs
//! ([`crate::processor::policy::work_balancer`]).

use std::time::{Duration, Instant};

use crate::processor::leases::lease::Lease;

/// Lease property: the operations a second written into the lease's partition, decayed.
pub const WRITE_RATE_PROPERTY: &str = "writesPerSecond";

/// How work is measured, from the processor's lease timings (the same on every instance).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkTimings {
    /// How quickly the reported rate follows a change: after this long at a new rate, it has
    /// moved 63 % of the way. Two acquire intervals (26 s by default): a burst is smoothed over,
    /// a skew that lasts shows within a few cycles.
    pub rate_time_constant: Duration,
    /// A lease's lag weighs as the rate that drains it within this long: a lease expiration.
    pub lag_drain: Duration,
}

impl WorkTimings {
    /// The timings of a processor with `acquire_interval` and `expiration`.
    pub fn new(acquire_interval: Duration, expiration: Duration) -> Self {
        Self {
            rate_time_constant: (acquire_interval * 2).max(Duration::from_millis(100)),
            lag_drain: expiration.max(Duration::from_millis(100)),
        }
    }
}

/// What a checkpoint reports besides its position.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CheckpointReport {
    /// The partition's latest LSN when the checkpointed page was read (the lag report).
    pub latest_lsn: Option<u64>,
    /// The operations a second written into the lease's partition; `None` leaves the lease's
    /// report as it is.
    pub writes_per_second: Option<f64>,
}

/// An exponentially decayed count (of operations written into a lease's partition): its rate is
/// the count divided by the time constant, so a steady rate is reported as it is.
#[derive(Debug, Clone, Copy)]
pub struct DecayedRate {
    /// The decayed count as of `at`.
    count: f64,
    /// When the count was last brought up to date.
    at: Instant,
    /// The time constant of the decay.
    tau: Duration,
}

impl DecayedRate {
    /// Starting from a reported rate (the lease's property: what its previous owner measured).
    pub fn starting_at(per_second: f64, now: Instant, timings: WorkTimings) -> Self {
        let tau = timings.rate_time_constant;
        Self {
            count: per_second.max(0.0) * tau.as_secs_f64(),
            at: now,
            tau,
        }
    }

    /// `count` more at `now`.
    pub fn add(&mut self, count: u64, now: Instant) {
        self.count = self.decayed(now) + count as f64;
        self.at = self.at.max(now);
    }

    /// The rate at `now`, in documents a second.
    pub fn per_second(&self, now: Instant) -> f64 {
        self.decayed(now) / self.tau.as_secs_f64()
    }

    fn decayed(&self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.at);
        self.count * decay(elapsed, self.tau)
    }
}

/// The share of a rate left after `elapsed` without handling anything.
fn decay(elapsed: Duration, tau: Duration) -> f64 {
    (-elapsed.as_secs_f64() / tau.as_secs_f64()).exp()
}

/// Writes `per_second` into `lease` (two decimals: the documents stay small and stable).
pub fn record_rate(lease: &mut Lease, per_second: f64) {
    let value = if per_second.is_finite() {
        per_second.max(0.0)
    } else {
        0.0
    };
    lease
        .properties
        .insert(WRITE_RATE_PROPERTY.into(), format!("{value:.2}"));
}

/// The highest rate read from a lease (a billion operations a second): a value edited by hand
/// beyond it is no report.
const MAX_RATE: f64 = 1e9;

/// The rate the owner of `lease` reported when it last wrote it; `None` without a report (or an
/// unreadable one).
pub fn reported_rate(lease: &Lease) -> Option<f64> {
    let value: f64 = lease.properties.get(WRITE_RATE_PROPERTY)?.parse().ok()?;
    (value.is_finite() && (0.0..=MAX_RATE).contains(&value)).then_some(value)
}

/// Whether an owner whose lease went quiet writes its rate again: the stored report is more than
/// twice the rate now and above half an operation a second. Other writes of the lease (a handoff
/// request, a release, a renewal) refresh its `_ts` without touching the report, so readers could
/// not fade an idle lease's old rate by the lease's silence alone; halving it as it decays costs a
/// few writes a quiet spell and keeps the report within twice the truth.
pub fn rate_report_due(stored: Option<f64>, now: f64) -> bool {
    stored.is_some_and(|stored| stored > 0.5 && stored > 2.0 * now)
}

/// The reported rate of `lease` decayed by how long it was not written before `newest_ts`
/// (server times in seconds: the newest document of the same listing, so every instance that
/// reads one listing judges alike); 0 without a report.
pub fn rate_as_of(lease: &Lease, newest_ts: Option<i64>, timings: WorkTimings) -> f64 {
    let Some(rate) = reported_rate(lease) else {
        return 0.0;
    };
    let silent = match (newest_ts, lease.server_ts) {
        (Some(newest), Some(written)) => u64::try_from(newest - written).unwrap_or(0),
        _ => 0,
    };
    rate * decay(Duration::from_secs(silent), timings.rate_time_constant)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cosmos::EpkRange;

    /// Timings with a 30 s time constant (a 15 s acquire interval) and a 60 s expiration.
    fn defaults() -> WorkTimings {
        WorkTimings::new(Duration::from_secs(15), Duration::from_secs(60))
    }

    #[test]
    fn a_steady_rate_is_reported_as_it_is_and_fades_when_nothing_comes() {
        let start = Instant::now();
        let tau = defaults().rate_time_constant;
        let mut rate = DecayedRate::starting_at(0.0, start, defaults());
        // 100 documents a second, in batches of 10, for five time constants.
        for tick in 1..=1500u64 {
            rate.add(10, start + Duration::from_millis(100 * tick));
        }
        let end = start + Duration::from_secs(150);
        let steady = rate.per_second(end);
        assert!((steady - 100.0).abs() < 2.0, "{steady}");
        let later = rate.per_second(end + tau);
        assert!((later - steady / std::f64::consts::E).abs() < 0.5, "{later}");
        let seeded = DecayedRate::starting_at(steady, end, defaults());
        assert!(
            (seeded.per_second(end) - steady).abs() < 1e-9,
            "a new owner goes on from the report"
        );
    }

    #[test]
    fn a_quiet_owner_writes_its_rate_again_as_it_halves() {
        let cases = [
            (None, 0.0, false),
            (Some(100.0), 60.0, false),
            (Some(100.0), 49.0, true),
            (Some(0.4), 0.0, false),
            (Some(0.6), 0.0, true),
        ];
        for (stored, now, due) in cases {
            assert_eq!(rate_report_due(stored, now), due, "{stored:?} {now}");
        }
    }

    #[test]
    fn the_report_reads_back_and_decays_by_the_leases_silence() {
        let mut lease = Lease::new("p", &EpkRange::full(), None);
        assert_eq!(rate_as_of(&lease, Some(100), defaults()), 0.0);
        record_rate(&mut lease, 42.4242);
        assert_eq!(lease.properties[WRITE_RATE_PROPERTY], "42.42");
        assert_eq!(reported_rate(&lease), Some(42.42));
        lease.server_ts = Some(100);
        assert_eq!(rate_as_of(&lease, Some(100), defaults()), 42.42);
        assert_eq!(
            rate_as_of(&lease, Some(90), defaults()),
            42.42,
            "a listing's clock behind the lease's: no decay"
        );
        let faded = rate_as_of(&lease, Some(130), defaults());
        assert!((faded - 42.42 / std::f64::consts::E).abs() < 0.01, "{faded}");
        for bad in ["-1", "NaN", "inf", "x", "1e308"] {
            lease.properties.insert(WRITE_RATE_PROPERTY.into(), bad.into());
            assert_eq!(reported_rate(&lease), None, "{bad}");
        }
        record_rate(&mut lease, f64::NAN);
        assert_eq!(reported_rate(&lease), Some(0.0));
    }
}
