//! Lease lifecycle events, published as `tracing` events and to subscribers.

use serde::Serialize;

use crate::processor::leases::owned::Acquired;

/// Why this instance stopped processing a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum CloseReason {
    /// The processor is shutting down; the lease was released.
    Shutdown,
    /// Another instance owns the lease now (a renew or checkpoint found a new owner).
    LeaseLost,
    /// The lease document was deleted.
    LeaseGone,
    /// The range was split; child leases replace this one.
    Split,
    /// An error that is not retried ended the lease's processing.
    Error,
    /// Another instance asked for the lease (balancing); it was handed over after the last batch
    /// was checkpointed, so nothing is delivered twice.
    HandedOver,
    /// The lease's task panicked (for example in the handler); the lease was released so that it
    /// is processed again from its checkpoint.
    Panicked,
    /// The lease stayed stalled after its reader was restarted; it was released for another
    /// instance to try from its checkpoint.
    Stalled,
}

impl CloseReason {
    /// The reason as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::Shutdown => "shutdown",
            CloseReason::LeaseLost => "lease_lost",
            CloseReason::LeaseGone => "lease_gone",
            CloseReason::Split => "split",
            CloseReason::Error => "error",
            CloseReason::Panicked => "panic",
            CloseReason::HandedOver => "handed_over",
            CloseReason::Stalled => "stalled",
        }
    }
}

/// Something that happened to a lease of this instance.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "camelCase")]
pub enum LeaseEvent {
    /// This instance took the lease (from `previous_owner` when it was stolen).
    Acquired {
        /// Lease token.
        lease: String,
        /// The owner before, when the lease was taken from a live owner.
        previous_owner: Option<String>,
        /// The acquire cycle of this instance that took it (1 = the first): for a lease its
        /// owner handed over, the cycle that asked for it.
        cycle: u64,
    },
    /// This instance stopped processing the lease.
    Closed {
        /// Lease token.
        lease: String,
        /// Why.
        reason: CloseReason,
    },
    /// A batch was handled and checkpointed.
    Checkpointed {
        /// Lease token.
        lease: String,
        /// Documents in the batch.
        documents: usize,
    },
    /// A split replaced a lease with child leases.
    Split {
        /// The parent's lease token.
        parent: String,
        /// The children's lease tokens.
        children: Vec<String>,
    },
    /// An error while processing a lease (it is retried).
    Error {
        /// Lease token, when the error concerns one lease.
        lease: Option<String>,
        /// The kind of failure ([`crate::processor::LeaseError::reason`]).
        reason: &'static str,
        /// What failed.
        message: String,
    },
}

/// How the processing of one lease ended.
#[derive(Debug)]
pub struct LeaseExit {
    /// Why it ended.
    pub reason: CloseReason,
    /// Child leases (owned by this instance) that replace the lease after a split.
    pub children: Vec<Acquired>,
}

impl LeaseExit {
    /// An end without children.
    pub(crate) fn closed(reason: CloseReason) -> Self {
        Self {
            reason,
            children: Vec::new(),
        }
    }
}
