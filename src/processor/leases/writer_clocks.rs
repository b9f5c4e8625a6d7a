//! How late another process's write can have been made, on this instance's clock, from the
//! writer's own monotonic clock. Every lease and heartbeat this product writes carries a
//! [`ClockStamp`]: the writing process's clock (a random id, new at every start) and the
//! microseconds since that process started. The first listing here that shows a version bounds
//! when it was stamped (it was written before the listing returned); the writer's own elapsed
//! time carries each such bound to any other stamp of the same clock. Over a few versions the
//! tightest bound dates a write within a listing's round trip instead of a listing interval, and
//! no wall clock is compared with another: skewed or stepped clocks change nothing. Monotonic
//! clocks of two machines may run apart by up to [`DRIFT`] of the time carried. Pure: time
//! comes in.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::OnceLock;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// How far two monotonic clocks may run apart, as a fraction of the time carried (NTP slews a
/// clock by at most 500 ppm; two slewed the opposite ways differ by twice that).
pub const DRIFT: f64 = 1e-3;
/// Bounds kept per clock (the newest stamps).
const SAMPLES: usize = 8;

/// When a write was stamped, by the writing process's own monotonic clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockStamp {
    /// The writing process's clock: random, new at every process start.
    pub clock: String,
    /// Microseconds since that process started its clock.
    pub us: u64,
}

/// This process's clock: its id and when it started.
struct ProcessClock {
    id: String,
    started: Instant,
}

/// The stamp of a write made now by this process.
pub fn stamp_now() -> ClockStamp {
    static CLOCK: OnceLock<ProcessClock> = OnceLock::new();
    let clock = CLOCK.get_or_init(|| ProcessClock {
        id: format!("{:016x}", fastrand::u64(..)),
        started: Instant::now(),
    });
    let us = u64::try_from(clock.started.elapsed().as_micros()).unwrap_or(u64::MAX);
    ClockStamp {
        clock: clock.id.clone(),
        us,
    }
}

/// A stamp of a clock, and when the first listing here that showed its version returned: the
/// stamp was made no later than that.
#[derive(Debug, Clone, Copy)]
struct Bound {
    us: u64,
    listed: Instant,
}

impl Bound {
    /// The latest time, on this instance's clock, a stamp `us` of the same clock can have been
    /// made at, as this bound tells.
    fn carried_to(self, us: u64) -> Option<Instant> {
        if us >= self.us {
            let elapsed = Duration::from_micros(us - self.us).mul_f64(1.0 + DRIFT);
            self.listed.checked_add(elapsed)
        } else {
            let elapsed = Duration::from_micros(self.us - us).mul_f64(1.0 - DRIFT);
            self.listed.checked_sub(elapsed)
        }
    }
}

/// What this instance learned of other processes' clocks from its listings.
#[derive(Debug, Clone, Default)]
pub struct WriterClocks {
    bounds: HashMap<String, VecDeque<Bound>>,
}

impl WriterClocks {
    /// Records that a version stamped `stamp` was first shown by a listing that returned at
    /// `listed`, and says the latest time it can have been stamped at (never after `listed`).
    pub fn first_listed(&mut self, stamp: &ClockStamp, listed: Instant) -> Instant {
        let bounds = self.bounds.entry(stamp.clock.clone()).or_default();
        let at = bounds.iter().position(|b| b.us > stamp.us).unwrap_or(bounds.len());
        bounds.insert(at, Bound { us: stamp.us, listed });
        if bounds.len() > SAMPLES {
            bounds.pop_front();
        }
        self.stamped_by(stamp).unwrap_or(listed).min(listed)
    }

    /// The latest time, on this instance's clock, `stamp` can have been made at; `None` when
    /// nothing is known of its clock.
    pub fn stamped_by(&self, stamp: &ClockStamp) -> Option<Instant> {
        self.bounds
            .get(&stamp.clock)?
            .iter()
            .filter_map(|b| b.carried_to(stamp.us))
            .min()
    }

    /// Forgets the clocks the latest listing no longer shows.
    pub fn retain(&mut self, shown: &HashSet<&str>) {
        self.bounds.retain(|clock, _| shown.contains(clock.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(us: u64) -> ClockStamp {
        ClockStamp { clock: "w".into(), us }
    }

    const S: u64 = 1_000_000;

    #[test]
    fn a_write_first_listed_late_is_dated_by_an_earlier_write_listed_early() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut clocks = WriterClocks::default();
        // The writer's clock reads 100 s when ours reads t0; a beat every 1.7 s, listings 1.3 s apart.
        assert_eq!(clocks.first_listed(&stamp(100 * S), at(10)), at(10));
        // Stamped at 101.7 s (t0 + 1.7 s), first listed at 2.6 s: dated 1.7 s + 0.2 % after 10 ms.
        let dated = clocks.first_listed(&stamp(100 * S + 1_700_000), at(2600));
        assert!(dated >= at(1700) && dated <= at(1712), "{:?}", dated - t0);
    }

    #[test]
    fn bounds_carry_backwards_too_and_never_past_the_listing() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut clocks = WriterClocks::default();
        clocks.first_listed(&stamp(50 * S), at(5000));
        // An older stamp listed late (a lease not written for 4 s): at least 4 s × (1 − DRIFT) earlier.
        let old = clocks.first_listed(&stamp(46 * S), at(9000));
        assert!(old <= at(1004) && old >= at(1000), "{:?}", old - t0);
        // A stamp of another clock: only its own listing bounds it.
        let other = ClockStamp {
            clock: "x".into(),
            us: 0,
        };
        assert_eq!(clocks.first_listed(&other, at(7000)), at(7000));
        assert_eq!(clocks.stamped_by(&stamp(47 * S)).map(|t| t <= at(2004)), Some(true));
    }

    #[test]
    fn only_the_newest_bounds_are_kept_and_forgotten_clocks_are_unknown() {
        let t0 = Instant::now();
        let mut clocks = WriterClocks::default();
        for k in 0..20 {
            clocks.first_listed(&stamp(k * S), t0 + Duration::from_secs(k));
        }
        assert_eq!(clocks.bounds["w"].len(), SAMPLES);
        assert_eq!(clocks.bounds["w"].front().map(|b| b.us), Some(12 * S));
        clocks.retain(&HashSet::new());
        assert!(clocks.stamped_by(&stamp(0)).is_none());
    }

    #[test]
    fn this_process_stamps_one_clock_that_only_moves_forward() {
        let (a, b) = (stamp_now(), stamp_now());
        assert_eq!(a.clock, b.clock);
        assert!(b.us >= a.us);
    }
}
