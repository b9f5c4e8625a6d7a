//! How fast the workers may scale, as the HorizontalPodAutoscaler's `behavior` says it: rate
//! policies per direction (at most N pods or P percent per period, measured from the replicas at
//! the start of the period) and which policy wins. Pure: time and the past changes come in.
//!
//! The defaults are the HPA's: up by 100 % or 4 pods per 15 s, whichever is more; down by up to
//! 100 % per 15 s (only the stabilization window holds scale-down).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What one rate policy counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateKind {
    /// A number of pods.
    Pods,
    /// A percentage of the replicas at the start of the period.
    Percent,
}

/// At most `value` pods (or percent) of change per `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RatePolicy {
    /// Pods or percent.
    pub kind: RateKind,
    /// How many.
    pub value: i32,
    /// Over how long.
    pub period: Duration,
}

/// Which policy applies when several do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Select {
    /// The one that allows the most change (the HPA's default).
    #[default]
    Max,
    /// The one that allows the least change.
    Min,
    /// No change in this direction at all.
    Disabled,
}

/// The rules of one direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// Which policy wins.
    pub select: Select,
    /// The rate policies; none means no rate limit.
    pub policies: Vec<RatePolicy>,
}

/// The scaling behavior: stabilization of scale-up and the rate policies of both directions
/// (the scale-down window is the policy's `scale_down_stabilization`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Behavior {
    /// Scale up only to the lowest recommendation of this window (0: the newest one).
    pub up_window: Duration,
    /// How fast scaling up may go.
    pub up: Rules,
    /// How fast scaling down may go.
    pub down: Rules,
}

/// The HPA's default period.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(15);

impl Default for Behavior {
    fn default() -> Self {
        let rate = |kind, value| RatePolicy {
            kind,
            value,
            period: DEFAULT_PERIOD,
        };
        Self {
            up_window: Duration::ZERO,
            up: Rules {
                select: Select::Max,
                policies: vec![rate(RateKind::Percent, 100), rate(RateKind::Pods, 4)],
            },
            down: Rules {
                select: Select::Max,
                policies: vec![rate(RateKind::Percent, 100)],
            },
        }
    }
}

/// Replica changes applied recently (time, signed change), oldest first.
pub type Changes = VecDeque<(Instant, i32)>;

/// The longest period any rule looks back.
pub fn longest_period(behavior: &Behavior) -> Duration {
    behavior
        .up
        .policies
        .iter()
        .chain(&behavior.down.policies)
        .map(|p| p.period)
        .max()
        .unwrap_or(Duration::ZERO)
}

/// The change (in `up` or down direction) applied within `period` before `now`.
fn changed_within(changes: &Changes, period: Duration, now: Instant, up: bool) -> i32 {
    changes
        .iter()
        .filter(|(at, _)| now.saturating_duration_since(*at) < period)
        .map(|(_, delta)| *delta)
        .filter(|delta| (*delta > 0) == up)
        .fold(0i32, |sum, delta| sum.saturating_add(delta.abs()))
}

/// The most replicas scaling up from `current` may reach now (from zero at least one, unless
/// disabled: a percentage of nothing would never wake a worker).
pub fn up_limit(rules: &Rules, current: i32, changes: &Changes, now: Instant) -> i32 {
    let limits = rules.policies.iter().map(|policy| {
        let start = current
            .saturating_sub(changed_within(changes, policy.period, now, true))
            .max(0);
        match policy.kind {
            RateKind::Pods => start.saturating_add(policy.value),
            RateKind::Percent => {
                let grown = i64::from(start) * (100 + i64::from(policy.value));
                i32::try_from((grown + 99) / 100).unwrap_or(i32::MAX)
            }
        }
    });
    let limit = match rules.select {
        Select::Disabled => return current,
        Select::Max => limits.max(),
        Select::Min => limits.min(),
    };
    let limit = limit.unwrap_or(i32::MAX).max(current);
    if current == 0 { limit.max(1) } else { limit }
}

/// The fewest replicas scaling down from `current` may reach now.
pub fn down_limit(rules: &Rules, current: i32, changes: &Changes, now: Instant) -> i32 {
    let limits = rules.policies.iter().map(|policy| {
        let start = current.saturating_add(changed_within(changes, policy.period, now, false));
        match policy.kind {
            RateKind::Pods => start.saturating_sub(policy.value),
            RateKind::Percent => {
                let kept = i64::from(start) * (100 - i64::from(policy.value.min(100)));
                i32::try_from(kept / 100).unwrap_or(0)
            }
        }
    });
    let limit = match rules.select {
        Select::Disabled => return current,
        // The most change down is the lowest limit.
        Select::Max => limits.min(),
        Select::Min => limits.max(),
    };
    limit.unwrap_or(0).max(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(kind: RateKind, value: i32, seconds: u64) -> RatePolicy {
        RatePolicy {
            kind,
            value,
            period: Duration::from_secs(seconds),
        }
    }

    #[test]
    fn up_limits_follow_the_hpa_rules() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let defaults = Behavior::default().up;
        let none = Changes::new();
        #[rustfmt::skip]
        let cases = [
            ("defaults from 1: +4 wins", defaults.clone(), 1, none.clone(), 60, 5),
            ("defaults from 10: double wins", defaults.clone(), 10, none.clone(), 60, 20),
            ("defaults from 0: +4", defaults.clone(), 0, none.clone(), 60, 4),
            ("percent only from 0: one wakes", Rules { select: Select::Max, policies: vec![rate(RateKind::Percent, 100, 15)] }, 0, none.clone(), 60, 1),
            ("min of the two", Rules { select: Select::Min, ..defaults.clone() }, 10, none.clone(), 60, 14),
            ("disabled", Rules { select: Select::Disabled, ..defaults.clone() }, 3, none.clone(), 60, 3),
            ("no policy: unlimited", Rules { select: Select::Max, policies: vec![] }, 3, none.clone(), 60, i32::MAX),
            ("2 pods per minute, 2 added 30 s ago", Rules { select: Select::Max, policies: vec![rate(RateKind::Pods, 2, 60)] },
                5, Changes::from([(at(30), 2)]), 60, 5),
            ("2 pods per minute, the change left the period", Rules { select: Select::Max, policies: vec![rate(RateKind::Pods, 2, 60)] },
                5, Changes::from([(at(0), 2)]), 60, 7),
            ("50 % per minute from 4, rounded up", Rules { select: Select::Max, policies: vec![rate(RateKind::Percent, 50, 60)] },
                5, Changes::from([(at(30), 1)]), 60, 6),
        ];
        for (name, rules, current, changes, now, want) in cases {
            assert_eq!(up_limit(&rules, current, &changes, at(now)), want, "{name}");
        }
    }

    #[test]
    fn down_limits_follow_the_hpa_rules() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let none = Changes::new();
        let one_pod_a_minute = Rules {
            select: Select::Max,
            policies: vec![rate(RateKind::Pods, 1, 60)],
        };
        #[rustfmt::skip]
        let cases = [
            ("default: all at once", Behavior::default().down, 8, none.clone(), 60, 0),
            ("one pod a minute", one_pod_a_minute.clone(), 8, none.clone(), 60, 7),
            ("one pod a minute, one removed 10 s ago", one_pod_a_minute.clone(), 7, Changes::from([(at(50), -1)]), 60, 7),
            ("ups do not count for downs", one_pod_a_minute.clone(), 7, Changes::from([(at(50), 3)]), 60, 6),
            ("10 % of 8 keeps 7", Rules { select: Select::Max, policies: vec![rate(RateKind::Percent, 10, 60)] }, 8, none.clone(), 60, 7),
            ("max change of two", Rules { select: Select::Max, policies: vec![rate(RateKind::Pods, 1, 60), rate(RateKind::Percent, 50, 60)] }, 8, none.clone(), 60, 4),
            ("min change of two", Rules { select: Select::Min, policies: vec![rate(RateKind::Pods, 1, 60), rate(RateKind::Percent, 50, 60)] }, 8, none.clone(), 60, 7),
            ("disabled", Rules { select: Select::Disabled, policies: vec![] }, 8, none.clone(), 60, 8),
        ];
        for (name, rules, current, changes, now, want) in cases {
            assert_eq!(down_limit(&rules, current, &changes, at(now)), want, "{name}");
        }
    }
}
