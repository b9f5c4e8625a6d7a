//! Where a processor reports what it does: the observer (metrics), lease events for subscribers,
//! and typed errors, logged at most once a minute per lease and kind.

use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::broadcast;

use crate::processor::error::LeaseError;
use crate::processor::report::error_log::{ErrorLog, REFUSED_CREDENTIAL};
use crate::processor::report::events::LeaseEvent;
use crate::processor::report::observer::{NoopObserver, ProcessorObserver};

/// Lease events kept for a slow subscriber before it misses some.
const EVENT_BUFFER: usize = 4096;

/// The reporting side of one processor.
pub(crate) struct Telemetry {
    observer: RwLock<Arc<dyn ProcessorObserver>>,
    events: broadcast::Sender<LeaseEvent>,
    /// Which repeated errors were logged when.
    error_log: Mutex<ErrorLog>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self {
            observer: RwLock::new(Arc::new(NoopObserver)),
            events: broadcast::channel(EVENT_BUFFER).0,
            error_log: Mutex::new(ErrorLog::default()),
        }
    }
}

impl Telemetry {
    /// Where measurements go.
    pub(crate) fn observer(&self) -> Arc<dyn ProcessorObserver> {
        match self.observer.read() {
            Ok(observer) => observer.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Sends measurements to `observer` from now on.
    pub(crate) fn set_observer(&self, observer: Arc<dyn ProcessorObserver>) {
        match self.observer.write() {
            Ok(mut current) => *current = observer,
            Err(poisoned) => *poisoned.into_inner() = observer,
        }
    }

    /// Lease events from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<LeaseEvent> {
        self.events.subscribe()
    }

    /// Reports a lease event to the observer and the subscribers.
    pub(crate) fn emit(&self, event: LeaseEvent) {
        self.observer().lease_event(&event);
        let _ = self.events.send(event);
    }

    /// Reports a failed step of lease `lease` (or of the processor): logged when its kind was
    /// quiet for a while, and sent as a [`LeaseEvent::Error`].
    pub(crate) fn error(&self, lease: Option<&str>, error: LeaseError) {
        let message = error.to_string();
        // A refused credential (a rotated key) fails every request alike: one line for all.
        let refused = error.is_refused_credential();
        let (log_lease, kind) = if refused {
            (None, REFUSED_CREDENTIAL)
        } else {
            (lease, error.reason())
        };
        let log_now = self
            .error_log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .record(log_lease, kind, std::time::Instant::now());
        let shown = if refused {
            format!("{REFUSED_CREDENTIAL}: {message}")
        } else {
            message.clone()
        };
        match log_now {
            Some(0) => tracing::warn!(lease = log_lease, "{shown}"),
            Some(repeated) => {
                tracing::warn!(
                    lease = log_lease,
                    repeated,
                    "{shown} (and {repeated} more like it in the last minute)"
                )
            }
            None => tracing::debug!(lease, "{message}"),
        }
        self.emit(LeaseEvent::Error {
            lease: lease.map(str::to_owned),
            reason: error.reason(),
            message,
        });
    }
}
