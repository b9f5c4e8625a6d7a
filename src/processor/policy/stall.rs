//! Stall detection of one lease, as a pure state machine: a lease whose handled position has not
//! advanced for `stall_timeout` while it may have lag — its reader is in a read, a batch is with
//! the handler, reads time out — is **stalled** (the owner keeps it alive, nothing moves: the
//! reference processors' "it stopped processing, no error"). The first time its reader is
//! restarted from the checkpoint; if it stays stalled for another `stall_timeout`, the lease is
//! released so that another instance can try.
//!
//! What is not a stall: an idle lease (its reads answer with empty pages: it has no lag), a
//! slow lease that advances, a batch still within the handler's own time limit (an HTTP
//! handler's timeout: the user said a batch may take that long, and restarting it would hand it
//! over again while its request may still run), and a halted or failing one (its handler keeps
//! failing, its reads fail with errors): those are reported already, and restarting them changes
//! nothing. The stall clock of a batch with the handler starts when its time limit is over.

use std::time::Duration;

use tokio::time::Instant;

/// What a lease's reader is doing, for the report of a stall.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Activity {
    /// Between reads (waiting for the next poll, backing off).
    #[default]
    Waiting,
    /// In a change feed read since then.
    Reading(Instant),
    /// A batch (its id and size) has been with the handler since then.
    Handling {
        /// The batch id.
        batch: String,
        /// Its documents.
        documents: usize,
        /// Since when.
        since: Instant,
    },
}

impl Activity {
    /// What the reader is doing, in words, at `now`.
    pub fn describe(&self, now: Instant) -> String {
        let for_ = |since: &Instant| format!("{:.0} s", now.saturating_duration_since(*since).as_secs_f64());
        match self {
            Activity::Waiting => "waiting between reads (reads time out or answer nothing)".into(),
            Activity::Reading(since) => format!("in a change feed read for {}", for_(since)),
            Activity::Handling {
                batch,
                documents,
                since,
            } => format!(
                "in the handler for {} with batch {batch} ({documents} documents)",
                for_(since)
            ),
        }
    }
}

/// What to do about a lease's stall.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StallAction {
    /// Stalled for the first time: report it (what it was doing) and restart its reader from the
    /// last checkpoint.
    Restart(String),
    /// Still stalled after the restart: release the lease for another instance.
    Release(String),
    /// It advanced again after a stall: clear the report.
    Recovered,
}

/// Where a lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Advancing (or idle).
    Healthy,
    /// Stalled; its reader was restarted then.
    Restarted(Instant),
}

/// One lease's stall watch.
#[derive(Debug, Clone)]
pub struct StallWatch {
    timeout: Duration,
    /// How long the handler may take a batch (its own timeout), if it says.
    handler_limit: Option<Duration>,
    last_progress: Instant,
    activity: Activity,
    stage: Stage,
    /// A recovery not reported yet.
    recovered: bool,
}

impl StallWatch {
    /// A watch started at `now` (the lease was just acquired).
    pub fn new(timeout: Duration, now: Instant) -> Self {
        Self {
            timeout,
            handler_limit: None,
            last_progress: now,
            activity: Activity::Waiting,
            stage: Stage::Healthy,
            recovered: false,
        }
    }

    /// A watch whose clock does not run while a batch is with the handler for less than `limit`
    /// (the handler's own timeout; `None`: the handler has none).
    pub fn with_handler_limit(mut self, limit: Option<Duration>) -> Self {
        self.handler_limit = limit;
        self
    }

    /// The lease advanced at `now`: a batch was handled, or a read showed it caught up.
    pub fn progressed(&mut self, now: Instant) {
        self.last_progress = self.last_progress.max(now);
        // What it does next is told at the next check.
        self.activity = Activity::Waiting;
        if matches!(self.stage, Stage::Restarted(_)) {
            self.recovered = true;
        }
        self.stage = Stage::Healthy;
    }

    /// The lease is reported failing or halted (or being restarted) at `now`: the stall clock
    /// starts again when that ends.
    pub fn excused(&mut self, now: Instant) {
        self.last_progress = self.last_progress.max(now);
    }

    /// The reader now does `activity`.
    pub fn doing(&mut self, activity: Activity) {
        self.activity = activity;
    }

    /// Since when the stall clock runs: the last progress (or excuse); with a batch at the
    /// handler, the end of the handler's time limit counted from when the batch went out or from
    /// that progress (a failed attempt is an excuse: the next attempt gets its own limit).
    fn clock_start(&self) -> Instant {
        match (&self.activity, self.handler_limit) {
            (Activity::Handling { since, .. }, Some(limit)) => (*since).max(self.last_progress) + limit,
            _ => self.last_progress,
        }
    }

    /// When [`judge`](Self::judge) may next have something to say.
    pub fn next_check(&self) -> Instant {
        if self.recovered {
            return self.last_progress;
        }
        match self.stage {
            Stage::Healthy => self.clock_start() + self.timeout,
            Stage::Restarted(at) => at.max(self.clock_start()) + self.timeout,
        }
    }

    /// What to do at `now`, if anything.
    pub fn judge(&mut self, now: Instant) -> Option<StallAction> {
        if std::mem::take(&mut self.recovered) {
            return Some(StallAction::Recovered);
        }
        let quiet = now.saturating_duration_since(self.last_progress);
        let running = now.saturating_duration_since(self.clock_start());
        match self.stage {
            Stage::Healthy if running >= self.timeout => {
                self.stage = Stage::Restarted(now);
                Some(StallAction::Restart(self.note(now, quiet)))
            }
            Stage::Restarted(at) if now.saturating_duration_since(at.max(self.clock_start())) >= self.timeout => {
                Some(StallAction::Release(self.note(now, quiet)))
            }
            _ => None,
        }
    }

    fn note(&self, now: Instant, quiet: Duration) -> String {
        format!(
            "no progress for {:.0} s, {}",
            quiet.as_secs_f64(),
            self.activity.describe(now)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(300);

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn an_advancing_or_idle_lease_is_never_stalled() {
        let start = Instant::now();
        let mut watch = StallWatch::new(T, start);
        // Progress every 299 s — a slow lease that advances, or empty pages of an idle one.
        for minute in 1..=20u64 {
            let now = start + s(299 * minute);
            assert_eq!(watch.judge(now), None, "at {minute}");
            watch.progressed(now);
        }
    }

    #[test]
    fn a_stalled_lease_is_restarted_once_then_released() {
        let start = Instant::now();
        let mut watch = StallWatch::new(T, start);
        watch.doing(Activity::Handling {
            batch: "b1".into(),
            documents: 3,
            since: start + s(10),
        });
        assert_eq!(watch.judge(start + s(299)), None);
        assert_eq!(watch.next_check(), start + T);
        let Some(StallAction::Restart(note)) = watch.judge(start + s(300)) else {
            panic!("not restarted")
        };
        assert_eq!(
            note,
            "no progress for 300 s, in the handler for 290 s with batch b1 (3 documents)"
        );
        // Reported once: nothing more until another timeout has passed since the restart.
        assert_eq!(watch.judge(start + s(400)), None);
        assert_eq!(watch.next_check(), start + s(600));
        watch.doing(Activity::Reading(start + s(550)));
        let Some(StallAction::Release(note)) = watch.judge(start + s(600)) else {
            panic!("not released")
        };
        assert_eq!(note, "no progress for 600 s, in a change feed read for 50 s");
    }

    #[test]
    fn progress_after_a_restart_is_reported_as_recovery_once() {
        let start = Instant::now();
        let mut watch = StallWatch::new(T, start);
        assert!(matches!(watch.judge(start + T), Some(StallAction::Restart(_))));
        watch.progressed(start + s(320));
        assert_eq!(watch.next_check(), start + s(320));
        assert_eq!(watch.judge(start + s(320)), Some(StallAction::Recovered));
        assert_eq!(watch.judge(start + s(321)), None);
        // Healthy again: a later stall restarts first.
        assert!(matches!(watch.judge(start + s(620)), Some(StallAction::Restart(_))));
    }

    #[test]
    fn a_batch_within_the_handlers_time_limit_is_not_stalled() {
        let start = Instant::now();
        let mut watch = StallWatch::new(s(2), start).with_handler_limit(Some(s(30)));
        watch.doing(Activity::Handling {
            batch: "b1".into(),
            documents: 3,
            since: start,
        });
        // A 4 s batch: no stall at 2 s, nor at 29 s.
        assert_eq!(watch.judge(start + s(2)), None);
        assert_eq!(watch.judge(start + s(29)), None);
        assert_eq!(watch.next_check(), start + s(32));
        // Over its limit, the clock runs: restarted a stall timeout after the limit.
        assert!(matches!(watch.judge(start + s(32)), Some(StallAction::Restart(_))));
        // Done: the next batch starts its own limit.
        watch.progressed(start + s(33));
        assert_eq!(watch.judge(start + s(33)), Some(StallAction::Recovered));
        watch.doing(Activity::Handling {
            batch: "b2".into(),
            documents: 3,
            since: start + s(33),
        });
        assert_eq!(watch.judge(start + s(40)), None);
        // A read that hangs is judged by the stall timeout alone.
        watch.progressed(start + s(41));
        watch.doing(Activity::Reading(start + s(41)));
        assert!(matches!(watch.judge(start + s(43)), Some(StallAction::Restart(_))));
    }

    #[test]
    fn failing_time_does_not_count_towards_a_stall() {
        let start = Instant::now();
        let mut watch = StallWatch::new(T, start);
        watch.excused(start + s(250));
        assert_eq!(watch.judge(start + s(500)), None);
        assert!(matches!(watch.judge(start + s(550)), Some(StallAction::Restart(_))));
        // After the restart, the reader's reopening is excused too: the release waits a whole
        // timeout after the last excuse.
        watch.excused(start + s(560));
        assert_eq!(watch.judge(start + s(850)), None);
        assert!(matches!(watch.judge(start + s(860)), Some(StallAction::Release(_))));
    }
}
