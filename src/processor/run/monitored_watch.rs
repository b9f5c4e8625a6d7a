//! Whether the monitored container still exists: looked up (at most once per interval, for all
//! leases together) when its change feed answers 404, and reported on `/readyz`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::cosmos::{MonitoredContainer, Presence};

/// What a lookup found, as the lease loops act on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The container is there (the 404 was about something else, or it is back).
    Present,
    /// The container does not exist: keep the leases and wait for it.
    Missing,
    /// A different container exists under the name now: a new change feed; the processor stops.
    Recreated(String),
}

#[derive(Default)]
struct State {
    checked: Option<(Instant, Verdict)>,
    problem: Option<String>,
}

/// The last lookup's result, shared by every lease of a processor.
#[derive(Default)]
pub struct MonitoredWatch {
    state: Mutex<State>,
    lookup: tokio::sync::Mutex<()>,
}

impl MonitoredWatch {
    /// Looks the container up unless another lease did within `interval`; returns the verdict.
    pub async fn check(&self, monitored: &MonitoredContainer, interval: Duration) -> Verdict {
        // One lookup at a time: leases failing together share its answer.
        let _lookup = self.lookup.lock().await;
        if let Some((at, verdict)) = &self.lock().checked
            && at.elapsed() < interval
        {
            return verdict.clone();
        }
        let verdict = match monitored.presence().await {
            Ok(Presence::Present) => Verdict::Present,
            Ok(Presence::Missing) => Verdict::Missing,
            Ok(Presence::Recreated(rid)) => Verdict::Recreated(rid),
            Err(error) => {
                tracing::debug!(container = monitored.name(), %error, "cannot look the monitored container up");
                return Verdict::Present;
            }
        };
        let problem = problem_of(&verdict, monitored);
        let mut state = self.lock();
        if problem.is_some() && state.problem != problem {
            tracing::warn!(
                container = monitored.name(),
                "{}",
                problem.as_deref().unwrap_or_default()
            );
        } else if problem.is_none() && state.problem.is_some() {
            tracing::info!(container = monitored.name(), "the monitored container exists again");
        }
        state.problem = problem;
        state.checked = Some((Instant::now(), verdict.clone()));
        verdict
    }

    /// The container works again (a page was read): forget a missing-container problem.
    pub fn clear(&self) {
        let mut state = self.lock();
        if matches!(state.checked, Some((_, Verdict::Missing))) {
            state.problem = None;
            state.checked = None;
        }
    }

    /// What `/readyz` says while the container is missing or was recreated.
    pub fn problem(&self) -> Option<String> {
        self.lock().problem.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The readiness message for a verdict (`None` when all is well).
fn problem_of(verdict: &Verdict, monitored: &MonitoredContainer) -> Option<String> {
    match verdict {
        Verdict::Present => None,
        Verdict::Missing => Some(format!(
            "the monitored container {} does not exist (deleted?): the leases are kept and reading resumes when it exists again",
            monitored.name()
        )),
        Verdict::Recreated(rid) => Some(format!(
            "the monitored container {} was deleted and created again (resource id {} is now {rid}): its change feed is new, so this processor stopped; a restart processes the new container from its start",
            monitored.name(),
            monitored.rid()
        )),
    }
}
