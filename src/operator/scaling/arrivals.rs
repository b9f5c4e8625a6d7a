//! What arrives and what is pending, read over the freshness policy's steadiness horizon (the
//! write rate's time constant): whether what arrives is steady, the rate workers are scaled in
//! for, and how fast the backlog grew. Pure: time comes in as an argument.
//!
//! Steady means every reading over a whole horizon lies within the tolerance of the latest, or
//! within half of what a worker handles: two equal readings in a row (a decayed rate still
//! falling, read twice alike) are not enough, and a rate that only wavers is steady.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How far a figure may be from another before it counts as different (the
/// HorizontalPodAutoscaler's tolerance): readings spread by no more than this share of the
/// latest are steady.
pub const TOLERANCE: f64 = 0.1;

/// One estimate's reading.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// When the estimate was taken.
    pub at: Instant,
    /// Documents a second arriving.
    pub arriving: f64,
    /// Documents pending.
    pub lag: f64,
}

/// The readings of the last horizon, and the rate workers are scaled in for.
#[derive(Debug, Clone, Default)]
pub struct Arrivals {
    /// Oldest first: the readings younger than the horizon and the newest one older, so that
    /// they cover it once there are enough.
    kept: VecDeque<Reading>,
    /// Whether the readings cover the horizon and lie within the tolerance.
    steady: bool,
    /// The horizon of the last reading.
    horizon: Duration,
    /// The latest rate while it is steady; the highest since it last was while it moves (after
    /// a peak, scaling in along an ebbing rate would take a step at each estimate).
    level: Option<f64>,
}

impl Arrivals {
    /// Takes in `reading`, over a horizon of `horizon`, one worker handling `per_replica` (no
    /// rate is steady before that is known).
    pub fn seen(&mut self, reading: Reading, horizon: Duration, per_replica: Option<f64>) {
        self.kept.push_back(reading);
        self.horizon = horizon;
        while self
            .kept
            .get(1)
            .is_some_and(|next| reading.at.saturating_duration_since(next.at) >= horizon)
        {
            self.kept.pop_front();
        }
        self.steady = per_replica.is_some_and(|per_replica| self.within(per_replica));
        self.level = Some(if self.steady {
            reading.arriving
        } else {
            self.level.map_or(reading.arriving, |level| level.max(reading.arriving))
        });
    }

    /// Whether the kept readings cover the horizon and spread no more than the tolerance of the
    /// latest, or half of `per_replica`.
    fn within(&self, per_replica: f64) -> bool {
        let Some(latest) = self.kept.back().filter(|_| self.covered()) else {
            return false;
        };
        let rates = self.kept.iter().map(|reading| reading.arriving);
        let spread = rates.clone().fold(f64::MIN, f64::max) - rates.fold(f64::MAX, f64::min);
        spread <= (latest.arriving * TOLERANCE).max(per_replica / 2.0)
    }

    /// Whether the readings kept span the horizon: before, neither steadiness nor the backlog's
    /// growth is told.
    pub fn covered(&self) -> bool {
        match (self.kept.front(), self.kept.back()) {
            (Some(first), Some(latest)) => latest.at.saturating_duration_since(first.at) >= self.horizon,
            _ => false,
        }
    }

    /// Whether what arrives was steady over the last horizon.
    pub fn steady(&self) -> bool {
        self.steady
    }

    /// The rate workers are scaled in for: the latest while steady, else the highest since it
    /// last was.
    pub fn level(&self) -> Option<f64> {
        self.level
    }

    /// How fast the backlog grew over the kept readings, documents a second (negative: it
    /// shrank); `None` before they span the horizon (a backlog read mid-page bounces).
    pub fn growth(&self) -> Option<f64> {
        if !self.covered() {
            return None;
        }
        let (first, latest) = (self.kept.front()?, self.kept.back()?);
        let elapsed = latest.at.checked_duration_since(first.at).filter(|e| !e.is_zero())?;
        Some((latest.lag - first.lag) / elapsed.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HORIZON: Duration = Duration::from_secs(4);

    fn read(arrivals: &mut Arrivals, t0: Instant, readings: &[(u64, f64)]) {
        for (at, arriving) in readings {
            let reading = Reading {
                at: t0 + Duration::from_secs(*at),
                arriving: *arriving,
                lag: 0.0,
            };
            arrivals.seen(reading, HORIZON, Some(20.0));
        }
    }

    #[test]
    fn steady_takes_a_whole_horizon_within_the_tolerance() {
        let t0 = Instant::now();
        // (readings every 2 s, steady after the last, level after it, why)
        let table: [(&[f64], bool, f64, &str); 6] = [
            (&[100.0], false, 100.0, "one reading covers nothing"),
            (&[100.0, 100.0], false, 100.0, "two, 2 s apart, do not cover 4 s"),
            (&[100.0, 100.0, 100.0], true, 100.0, "4 s alike"),
            (
                &[65.0, 65.0, 45.0],
                false,
                65.0,
                "a decayed rate read twice alike is still falling",
            ),
            (&[31.0, 28.0, 22.0], true, 22.0, "within half a worker (10) over 4 s"),
            (
                &[200.0, 90.0, 40.0, 30.0, 25.0, 24.0],
                true,
                24.0,
                "steady once the fall is a horizon behind",
            ),
        ];
        for (rates, steady, level, why) in table {
            let mut arrivals = Arrivals::default();
            let readings: Vec<(u64, f64)> = (0u64..).step_by(2).zip(rates.iter().copied()).collect();
            read(&mut arrivals, t0, &readings);
            assert_eq!(arrivals.steady(), steady, "{why}");
            assert_eq!(arrivals.level(), Some(level), "{why}");
        }
    }

    #[test]
    fn while_it_moves_the_level_holds_the_highest_since_it_was_steady() {
        let t0 = Instant::now();
        let mut arrivals = Arrivals::default();
        read(&mut arrivals, t0, &[(0, 200.0), (2, 205.0), (4, 198.0)]);
        assert_eq!(arrivals.level(), Some(198.0), "steady: the latest");
        read(&mut arrivals, t0, &[(6, 120.0), (8, 60.0), (10, 30.0)]);
        assert!(!arrivals.steady());
        assert_eq!(arrivals.level(), Some(198.0), "ebbing: held");
        read(&mut arrivals, t0, &[(12, 26.0), (14, 24.0)]);
        assert_eq!(arrivals.level(), Some(24.0), "steady again over 30, 26, 24");
        let mut unknown = Arrivals::default();
        for at in [0, 2, 4, 6] {
            let reading = Reading {
                at: t0 + Duration::from_secs(at),
                arriving: 10.0,
                lag: 0.0,
            };
            unknown.seen(reading, HORIZON, None);
        }
        assert!(!unknown.steady(), "nothing is steady before a worker's rate is known");
    }

    #[test]
    fn the_backlogs_growth_is_read_over_the_horizon() {
        let t0 = Instant::now();
        let mut arrivals = Arrivals::default();
        let mut at = |seconds: u64, lag: f64| {
            let reading = Reading {
                at: t0 + Duration::from_secs(seconds),
                arriving: 10.0,
                lag,
            };
            arrivals.seen(reading, HORIZON, Some(20.0));
            arrivals.growth()
        };
        assert_eq!(at(0, 10.0), None);
        assert_eq!(at(2, 20.0), None, "2 s do not span the horizon");
        assert_eq!(at(4, 10.0), Some(0.0), "over 4 s: a bounce is no growth");
        assert_eq!(at(6, 30.0), Some(2.5), "from the reading 4 s before: 10 more");
        assert_eq!(
            at(7, 30.0),
            Some(2.0),
            "from the newest reading at least 4 s old: 10 more over 5 s"
        );
    }
}
