//! What a processor's health endpoints and metrics read: ready, alive, why it is not fully
//! working (the lease container missing, a lease's change feed failing, the monitored container
//! gone), and the token that halts it when it cannot go on.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::cosmos::MonitoredContainer;
use crate::processor::run::monitored_watch::{MonitoredWatch, Verdict};

/// The health of one processor, written by its tasks and read by its monitor.
#[derive(Default)]
pub(crate) struct Health {
    ready: AtomicBool,
    /// Set when the coordinator stopped without being asked to (a panic).
    died: AtomicBool,
    /// Set by an abort: the coordinator's end is a simulated crash, not a death.
    aborted: AtomicBool,
    /// Leases whose change feed keeps failing, with the last error.
    read_failing: Mutex<HashMap<String, String>>,
    /// Why the lease store cannot be used (its container is missing), while that lasts.
    store_problem: Mutex<Option<String>>,
    /// Whether the monitored container still exists (looked up when its feed answers 404).
    monitored_watch: MonitoredWatch,
    /// Cancelled when the processor cannot go on (its monitored container was recreated,
    /// another process took its instance name).
    halt: CancellationToken,
    /// Why the processor halted, when not for its monitored container.
    halt_reason: Mutex<Option<String>>,
}

/// Locks `mutex` even when a panic elsewhere poisoned it (health must stay readable).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Health {
    /// Whether the lease loop runs.
    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// The lease loop started (`true`) or stopped.
    pub(crate) fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Whether the coordinator still runs (false after it died unexpectedly).
    pub(crate) fn is_alive(&self) -> bool {
        !self.died.load(Ordering::SeqCst)
    }

    /// The coordinator ended without being asked to.
    pub(crate) fn mark_died(&self) {
        self.died.store(true, Ordering::SeqCst);
    }

    /// Whether the processor was aborted (a simulated crash).
    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// The processor is being aborted.
    pub(crate) fn mark_aborted(&self) {
        self.aborted.store(true, Ordering::SeqCst);
    }

    /// Cancelled when the processor cannot go on.
    pub(crate) fn halt(&self) -> &CancellationToken {
        &self.halt
    }

    /// Halts the processor: it cannot go on, for `reason`.
    pub(crate) fn halt_for(&self, reason: String) {
        lock(&self.halt_reason).get_or_insert(reason);
        self.halt.cancel();
    }

    /// Why the processor halted (or what is wrong with its monitored container).
    pub(crate) fn halt_reason(&self) -> Option<String> {
        lock(&self.halt_reason).clone().or_else(|| self.monitored_problem())
    }

    /// Records that lease `token`'s change feed keeps failing (`Some(error)`) or works again.
    pub(crate) fn set_read_failing(&self, token: &str, error: Option<String>) {
        let mut failing = lock(&self.read_failing);
        match error {
            Some(error) => failing.insert(token.to_owned(), error),
            None => failing.remove(token),
        };
    }

    /// Records the lease container missing; `true` the first time (to be logged once).
    pub(crate) fn store_missing(&self, problem: String) -> bool {
        let mut current = lock(&self.store_problem);
        let first = current.is_none();
        if first {
            *current = Some(problem);
        }
        first
    }

    /// Clears the lease container's problem; `true` when it was missing.
    pub(crate) fn store_back(&self) -> bool {
        lock(&self.store_problem).take().is_some()
    }

    /// Looks up the monitored container after its change feed answered 404 (at most once per
    /// `interval` for all leases); a recreated container halts the processor.
    pub(crate) async fn check_monitored(&self, monitored: &MonitoredContainer, interval: Duration) -> Verdict {
        let verdict = self.monitored_watch.check(monitored, interval).await;
        if matches!(verdict, Verdict::Recreated(_)) {
            self.halt.cancel();
        }
        verdict
    }

    /// A page was read: the monitored container exists.
    pub(crate) fn monitored_works(&self) {
        self.monitored_watch.clear();
    }

    /// What is wrong with the monitored container, if anything.
    pub(crate) fn monitored_problem(&self) -> Option<String> {
        self.monitored_watch.problem()
    }

    /// Why the processor is not fully working: the monitored container, then the lease
    /// container, then a lease whose change feed keeps failing.
    pub(crate) fn read_problem(&self) -> Option<String> {
        if let Some(problem) = self.monitored_problem() {
            return Some(problem);
        }
        if let Some(problem) = lock(&self.store_problem).clone() {
            return Some(problem);
        }
        lock(&self.read_failing)
            .iter()
            .next()
            .map(|(lease, error)| format!("lease {lease} cannot read its change feed: {error}"))
    }
}
