//! What keeping up with a lease costs, as its owner reports it: with every write of the lease
//! (its checkpoints, renewals, release) the owner writes into its `properties` the operations a second written into the lease's
//! partition (`writesPerSecond`): how fast the partition's latest LSN, which every page's session
//! token carries, moved while the owner read it — an exponentially decayed count ([`DecayedRate`],
//! time constant [`WorkTimings::rate_time_constant`]). Not the documents the owner handled a
//! second: those measure the owner (an overloaded one handles less than is written, one draining a
//! backlog more), not the lease. For a lease narrower than its partition it is the partition's
//! rate, the same for each of its sub-range leases.
//!
//! The property moves with the lease (a handoff, a split's children), so a new owner goes on from
//! it rather than from nothing; readers fade it by how long the lease was not written since
//! ([`rate_as_of`]). So that fading holds, every write of a lease carries the rate as its writer
//! knows it, at no extra write: the owner's renewals, checkpoints and release its measured rate
//! ([`DecayedRate`], kept by the owned lease), another instance's acquisition or handoff request
//! the report faded as it read it ([`fade_report`]). With the lag report beside it
//! ([`crate::processor::leases::lag_report`]) it is what balancing by work weighs
//! ([`crate::processor::policy::work_balancer`]).

use std::time::{Duration, Instant};

use crate::processor::leases::lag_report::LagReport;
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

/// What a checkpoint reports besides its position (its write rate goes with every write of
/// the owner: [`DecayedRate`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckpointReport {
    /// The lag report of the checkpointed page ([`crate::processor::leases::lag_report`]).
    pub lag: Option<LagReport>,
}

/// The partition whose latest LSN a lease's write count last reached, and that LSN.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CountedLsn {
    /// The partition key range id that served the page (when known).
    range_id: Option<String>,
    /// Its latest LSN then.
    lsn: u64,
    /// When it was seen.
    seen: Instant,
}

/// Writes counted from a page: how many since the last page, and over how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountedWrites {
    /// Operations written into the partition since the last page.
    pub writes: u64,
    /// The time since the last page.
    pub over: Duration,
}

/// Counts the writes into a lease's partition from the latest LSN its pages carry.
#[derive(Debug, Clone, Default)]
pub struct WriteCounter {
    last: Option<CountedLsn>,
}

impl WriteCounter {
    /// The writes since the last page, seen on a page that partition `range_id` served with
    /// its latest LSN at `latest`: none for the first page, nor for one another partition served
    /// (after a split or merge: its LSNs are its own, so the jump is no writes), at `now`.
    pub fn count(&mut self, range_id: Option<&str>, latest: u64, now: Instant) -> CountedWrites {
        let next = CountedLsn {
            range_id: range_id.map(str::to_owned),
            lsn: latest,
            seen: now,
        };
        match &mut self.last {
            Some(last) if last.range_id == next.range_id => {
                let counted = CountedWrites {
                    writes: latest.saturating_sub(last.lsn),
                    over: now.saturating_duration_since(last.seen),
                };
                last.lsn = last.lsn.max(latest);
                last.seen = last.seen.max(now);
                counted
            }
            _ => {
                self.last = Some(next);
                CountedWrites {
                    writes: 0,
                    over: Duration::ZERO,
                }
            }
        }
    }
}

/// An exponentially decayed count (of operations written into a lease's partition): its rate is
/// the count divided by the time constant, so a steady rate is reported as it is. One counted
/// from a moment ([`DecayedRate::counted_from`]) divides by the decayed time since instead, so it
/// reads the rate since then rather than ramping up from nothing.
#[derive(Debug, Clone, Copy)]
pub struct DecayedRate {
    /// The decayed count as of `at`.
    count: f64,
    /// When the count was last brought up to date.
    at: Instant,
    /// The time constant of the decay.
    tau: Duration,
    /// When counting began, for a rate counted from then (not carried on from a report).
    since: Option<Instant>,
}

/// The least time a rate counted from a moment is read over: a first batch handled just after
/// is not read as a rate of thousands.
const LEAST_WINDOW: Duration = Duration::from_secs(1);

impl DecayedRate {
    /// Starting from a reported rate (the lease's property: what its previous owner measured).
    pub fn starting_at(per_second: f64, now: Instant, timings: WorkTimings) -> Self {
        let tau = timings.rate_time_constant;
        Self {
            count: per_second.max(0.0) * tau.as_secs_f64(),
            at: now,
            tau,
            since: None,
        }
    }

    /// Nothing counted yet, counting from `now`: the rate reads what was counted over the time
    /// since (decayed alike), not a ramp from nothing.
    pub fn counted_from(now: Instant, timings: WorkTimings) -> Self {
        Self {
            since: Some(now),
            ..Self::starting_at(0.0, now, timings)
        }
    }

    /// `count` more at `now`.
    pub fn add(&mut self, count: u64, now: Instant) {
        self.add_over(count, Duration::ZERO, now);
    }

    /// `count` more that happened evenly over the last `over`, as of `now` (a lump seen at once
    /// — the writes between two pages, a batch's documents — is not counted as if all of it
    /// happened at its end, which reads high right after it).
    pub fn add_over(&mut self, count: u64, over: Duration, now: Instant) {
        self.count = self.decayed(now) + spread(count as f64, over, self.tau);
        self.at = self.at.max(now);
    }

    /// The rate at `now`, in documents a second.
    pub fn per_second(&self, now: Instant) -> f64 {
        let window = match self.since {
            Some(since) => {
                let elapsed = now.saturating_duration_since(since).max(LEAST_WINDOW);
                self.tau.as_secs_f64() * (1.0 - decay(elapsed, self.tau))
            }
            None => self.tau.as_secs_f64(),
        };
        self.decayed(now) / window
    }

    fn decayed(&self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.at);
        self.count * decay(elapsed, self.tau)
    }
}

/// What `count` events spread evenly over the last `over` weigh now in a count decayed with
/// time constant `tau`.
pub(crate) fn spread(count: f64, over: Duration, tau: Duration) -> f64 {
    let ratio = over.as_secs_f64() / tau.as_secs_f64();
    if ratio < 1e-6 {
        return count;
    }
    count * (1.0 - (-ratio).exp()) / ratio
}

/// The share of a rate left after `elapsed` without handling anything.
pub(crate) fn decay(elapsed: Duration, tau: Duration) -> f64 {
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

/// Writes into `lease` (about to be written by an instance that does not own it: an acquisition,
/// a handoff request) its reported rate faded as of `newest_ts` ([`rate_as_of`]): the write
/// refreshes the lease's `_ts`, from which readers fade the report anew.
pub fn fade_report(lease: &mut Lease, newest_ts: Option<i64>, timings: WorkTimings) {
    if reported_rate(lease).is_some() {
        let faded = rate_as_of(lease, newest_ts, timings);
        record_rate(lease, faded);
    }
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
    fn writes_are_counted_from_one_partitions_lsns_only() {
        let mut counter = WriteCounter::default();
        // (serving partition, latest LSN, writes counted)
        let pages = [
            (Some("0"), 100, 0),
            (Some("0"), 130, 30),
            (Some("0"), 120, 0),
            (Some("0"), 131, 1),
            (Some("2"), 5_000, 0),
            (Some("2"), 5_010, 10),
            (None, 7, 0),
            (None, 9, 2),
        ];
        let start = Instant::now();
        for (at, (range, latest, written)) in (0u64..).zip(pages) {
            let counted = counter.count(range, latest, start + Duration::from_secs(at));
            assert_eq!(counted.writes, written, "{range:?} {latest}");
            let over = if written > 0 {
                Duration::from_secs(1)
            } else {
                counted.over
            };
            assert_eq!(counted.over, over, "{range:?} {latest}");
        }
    }

    #[test]
    fn writes_seen_in_lumps_read_as_the_steady_rate_right_after_each_lump() {
        let start = Instant::now();
        let tau = defaults().rate_time_constant;
        let mut rate = DecayedRate::starting_at(0.0, start, defaults());
        // 10 a second, seen as a lump every time constant: counted whole at its end, the
        // rate right after a lump would read 58 % high.
        for lump in 1..=20u32 {
            rate.add_over(300, tau, start + tau * lump);
        }
        let read = rate.per_second(start + tau * 20);
        assert!((read - 10.0).abs() < 0.05, "{read}");
    }

    #[test]
    fn a_rate_counted_from_a_moment_reads_the_rate_since_not_a_ramp() {
        let start = Instant::now();
        let mut rate = DecayedRate::counted_from(start, defaults());
        for tick in 1..=20u64 {
            rate.add_over(25, Duration::from_secs(1), start + Duration::from_secs(tick));
        }
        let read = rate.per_second(start + Duration::from_secs(20));
        assert!((read - 25.0).abs() < 0.1, "25 a second from the start, 20 s in: {read}");
        let ramp = DecayedRate::starting_at(0.0, start, defaults());
        let mut ramp = ramp;
        for tick in 1..=20u64 {
            ramp.add(25, start + Duration::from_secs(tick));
        }
        assert!(
            ramp.per_second(start + Duration::from_secs(20)) < 15.0,
            "counted from nothing it ramps"
        );
        let first = DecayedRate::counted_from(start, defaults());
        let mut first = first;
        first.add(100, start + Duration::from_millis(100));
        assert!(
            first.per_second(start + Duration::from_millis(100)) <= 100.0 / 0.97,
            "read over at least a second"
        );
    }

    #[test]
    fn another_instances_write_carries_the_report_faded_as_it_read_it() {
        let mut lease = Lease::new("p", &EpkRange::full(), None);
        fade_report(&mut lease, Some(130), defaults());
        assert_eq!(reported_rate(&lease), None, "no report: none written");
        record_rate(&mut lease, 40.0);
        lease.server_ts = Some(100);
        fade_report(&mut lease, Some(130), defaults());
        let faded = reported_rate(&lease).unwrap_or_default();
        assert!((faded - 40.0 / std::f64::consts::E).abs() < 0.01, "{faded}");
        // Written, the lease's `_ts` is the write's: the report fades from there, not from 40.
        lease.server_ts = Some(130);
        assert!((rate_as_of(&lease, Some(130), defaults()) - faded).abs() < 1e-9);
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
