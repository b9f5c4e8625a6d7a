//! Hooks through which the processor reports what it does (metrics plug in here).

use std::time::Duration;

use crate::processor::report::events::LeaseEvent;

/// Receives measurements from a running processor. Every method has a no-op default.
pub trait ProcessorObserver: Send + Sync + 'static {
    /// A change feed read finished (successfully or not) after `elapsed`, costing `request_charge` RU.
    fn feed_read(&self, _lease: &str, _elapsed: Duration, _request_charge: f64) {}
    /// A change feed read failed with an error of `kind` (see `ErrorKind::as_str`).
    fn feed_read_failed(&self, _lease: &str, _kind: &str) {}
    /// A change feed read succeeded after the SDK retried it `retries` times (throttling, 503s,
    /// timeouts).
    fn feed_read_retried(&self, _lease: &str, _retries: u32) {}
    /// The handler finished a batch of `documents` after `elapsed`.
    fn handler_done(&self, _lease: &str, _elapsed: Duration, _ok: bool, _documents: usize) {}
    /// `count` checkpoints were refused by the lease container's provisioned throughput (429):
    /// each waits and is sent again (the heartbeat goes first), so this is throttling, not an error.
    fn lease_writes_throttled(&self, _count: u64) {}
    /// A checkpoint was written after `elapsed`.
    fn checkpointed(&self, _lease: &str, _elapsed: Duration) {}
    /// The number of leases this instance owns changed.
    fn leases_owned(&self, _count: usize) {}
    /// A lease event happened.
    fn lease_event(&self, _event: &LeaseEvent) {}
    /// Something in the lease container is wrong (`reason`, for example `invalid_document`).
    fn lease_error(&self, _reason: &str) {}
    /// A lease halted on a batch its handler keeps failing (`true`), or went on again (`false`).
    fn lease_stuck(&self, _lease: &str, _stuck: bool) {}
    /// A lease stalled (`true`: its reader was restarted), or advanced again (`false`).
    fn lease_stalled(&self, _lease: &str, _stalled: bool) {}
    /// A stalled lease was released for another instance to try.
    fn stalled_lease_released(&self, _lease: &str) {}
    /// `documents` of a lease were moved to the dead-letter container.
    fn dead_lettered(&self, _lease: &str, _documents: usize) {}
}

/// An observer that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopObserver;

impl ProcessorObserver for NoopObserver {}
