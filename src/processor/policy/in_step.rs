//! Periodic work of many instances that fell into step, spread out again. Pure.
//!
//! An instance that schedules its next heartbeat one interval after the last one keeps whatever
//! phase it has for ever. Instances whose timers fired together once — a process or a node that
//! stalled, a lease container that answered nothing for a while and then all their retries at
//! once — then write in the same second of the lease container's budget window at every
//! interval after, and the group only grows until that second's writes pass the budget (429).
//! Each period is drawn a little short of the interval instead, so that such a group comes
//! apart within a few periods, and a promise of "at least once per interval" still holds. (The
//! acquire cycle keeps its interval: its listings are reads, and a lease is taken over within a
//! cycle of its expiration, which the takeover's timing counts on.)

use std::time::Duration;

/// How much shorter than the interval a period may be drawn.
pub const SPREAD: f64 = 0.2;

/// The period before the next run of work due once per `interval`, `draw` a uniform random
/// number in 0..1: between (1 − [`SPREAD`]) × `interval` and `interval`.
pub fn period(interval: Duration, draw: f64) -> Duration {
    let draw = if draw.is_finite() { draw.clamp(0.0, 1.0) } else { 0.0 };
    interval.mul_f64(1.0 - SPREAD * draw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_is_never_longer_than_its_interval_nor_much_shorter() {
        let interval = Duration::from_secs(17);
        for (draw, expected) in [
            (0.0, 17_000),
            (0.5, 15_300),
            (1.0, 13_600),
            (-1.0, 17_000),
            (2.0, 13_600),
            (f64::NAN, 17_000),
        ] {
            assert_eq!(period(interval, draw), Duration::from_millis(expected), "{draw}");
        }
    }

    #[test]
    fn instances_in_step_come_apart_within_a_few_periods() {
        // 20 instances whose heartbeats fired in the same millisecond: after five periods drawn
        // at random, no second of the budget's window holds more than a few of them.
        let mut rng = fastrand::Rng::with_seed(7);
        let interval = Duration::from_secs(17);
        let mut due: Vec<f64> = vec![0.0; 20];
        for _ in 0..5 {
            for at in &mut due {
                *at += period(interval, rng.f64()).as_secs_f64();
            }
        }
        let spread = due.iter().cloned().fold(f64::MIN, f64::max) - due.iter().cloned().fold(f64::MAX, f64::min);
        assert!(spread > 2.0, "still within {spread:.2} s");
        let busiest = due
            .iter()
            .map(|start| due.iter().filter(|at| (*start..*start + 1.0).contains(*at)).count())
            .max()
            .unwrap_or_default();
        assert!(busiest <= 8, "{busiest} of 20 in one second: {due:?}");
    }
}
