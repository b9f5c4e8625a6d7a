//! Whether the operator's main loop (leader election and the controllers) is alive, for
//! `/healthz`: the loop beats on its own task every few seconds, so a loop that ended, panicked
//! or is blocked stops beating and the kubelet restarts the pod. `/metrics` is served on another
//! task and keeps answering either way.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the main loop beats.
pub const BEAT_INTERVAL: Duration = Duration::from_secs(5);
/// Silence after which the loop counts as dead (several missed beats).
pub const MAX_SILENCE: Duration = Duration::from_secs(30);

/// The main loop's heartbeat.
#[derive(Debug)]
pub struct Liveness {
    started: Instant,
    /// Milliseconds after `started` of the last beat.
    last_beat: AtomicU64,
    ended: AtomicBool,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            last_beat: AtomicU64::new(0),
            ended: AtomicBool::new(false),
        }
    }
}

impl Liveness {
    /// Records a beat of the main loop now.
    pub fn beat(&self) {
        self.beat_at(Instant::now());
    }

    fn beat_at(&self, now: Instant) {
        let ms = u64::try_from(now.saturating_duration_since(self.started).as_millis()).unwrap_or(u64::MAX);
        self.last_beat.fetch_max(ms, Ordering::Relaxed);
    }

    /// Records that the main loop ended.
    pub fn end(&self) {
        self.ended.store(true, Ordering::Relaxed);
    }

    /// `Ok` while the loop runs and beat within [`MAX_SILENCE`]; else why not.
    pub fn check(&self) -> Result<(), Unhealthy> {
        self.check_at(Instant::now(), MAX_SILENCE)
    }

    fn check_at(&self, now: Instant, max_silence: Duration) -> Result<(), Unhealthy> {
        if self.ended.load(Ordering::Relaxed) {
            return Err(Unhealthy::Ended);
        }
        let last = self.started + Duration::from_millis(self.last_beat.load(Ordering::Relaxed));
        let silence = now.saturating_duration_since(last);
        if silence > max_silence {
            return Err(Unhealthy::Silent(Duration::from_secs(silence.as_secs())));
        }
        Ok(())
    }

    /// Beats every [`BEAT_INTERVAL`] forever: run it on the main loop's own task (joined with
    /// it), so that it stops when that task does.
    pub async fn beat_forever(&self) {
        let mut ticks = tokio::time::interval(BEAT_INTERVAL);
        loop {
            ticks.tick().await;
            self.beat();
        }
    }
}

/// Why the operator is not live.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unhealthy {
    /// The main loop has ended.
    #[error("the controller loop has ended")]
    Ended,
    /// The main loop has not beaten for this long.
    #[error("the controller loop has not run for {}", humantime::format_duration(*.0))]
    Silent(Duration),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_only_while_the_loop_beats_and_runs() {
        let liveness = Liveness::default();
        let t0 = liveness.started;
        let at = |s: u64| t0 + Duration::from_secs(s);
        let max = Duration::from_secs(30);
        assert!(liveness.check_at(at(10), max).is_ok(), "a fresh start counts as a beat");
        assert!(liveness.check_at(at(31), max).is_err(), "no beat since the start");
        liveness.beat_at(at(25));
        assert!(liveness.check_at(at(50), max).is_ok());
        // An older beat never moves the last one back.
        liveness.beat_at(at(5));
        assert!(liveness.check_at(at(50), max).is_ok());
        let silent = liveness.check_at(at(60), max).unwrap_err().to_string();
        assert!(silent.contains("has not run for 35s"), "{silent}");
        liveness.beat_at(at(60));
        liveness.end();
        assert_eq!(
            liveness.check_at(at(61), max).map_err(|e| e.to_string()),
            Err("the controller loop has ended".into())
        );
    }
}
