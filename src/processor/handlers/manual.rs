//! Manual checkpoints for Rust library users: the handler gets a [`CheckpointHandle`] with each
//! batch and checkpoints when its own work is durable (after its transaction commits, say),
//! instead of the processor checkpointing when `handle` returns.
//!
//! A handle writes only while its lease is still processed by the instance that read the batch
//! (the write is conditional on the lease's ETag); after the lease was lost, released or split it
//! returns [`CheckpointError::LeaseLost`] and writes nothing. A checkpoint never moves a lease
//! backwards: a handle older than the lease's checkpoint succeeds without writing.

use std::sync::Arc;

use async_trait::async_trait;

use crate::cosmos::continuation_lsn;
use crate::processor::handlers::change_handler::{Batch, HandlerError};
use crate::processor::leases::lease::LeaseStoreError;
use crate::processor::leases::owned::{OwnedLease, UpdateError};

/// Why a manual checkpoint was not written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// This instance no longer processes the lease (taken over, released, split or deleted):
    /// nothing was written; the batch is redelivered to whoever processes the range now.
    #[error("lease {0} is no longer processed here (lost, released or split); nothing was written")]
    LeaseLost(String),
    /// The lease container failed; the checkpoint may be tried again.
    #[error("checkpointing lease {lease}: {source}")]
    Store {
        /// The lease token.
        lease: String,
        /// The store's error.
        source: LeaseStoreError,
    },
}

/// Checkpoints the lease a batch came from up to and including that batch.
#[derive(Clone)]
pub struct CheckpointHandle {
    owned: Arc<OwnedLease>,
    /// `None` for a batch at which the lease split: its children deliver it again.
    continuation: Option<String>,
}

impl std::fmt::Debug for CheckpointHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointHandle")
            .field("lease", &self.owned.token())
            .finish_non_exhaustive()
    }
}

impl CheckpointHandle {
    pub(crate) fn new(owned: Arc<OwnedLease>, continuation: Option<String>) -> Self {
        Self { owned, continuation }
    }

    /// The lease token of the batch.
    pub fn lease_token(&self) -> &str {
        self.owned.token()
    }

    /// Records the batch (and every earlier batch of the lease) as processed.
    pub async fn checkpoint(&self) -> Result<(), CheckpointError> {
        let lost = || CheckpointError::LeaseLost(self.owned.token().to_owned());
        let Some(continuation) = self.continuation.as_deref() else {
            return Err(lost());
        };
        if self.owned.is_closed() || self.owned.is_lost() {
            return Err(lost());
        }
        // Judged and written under the lease's lock: a concurrent older handle never wins.
        let forward = |current: Option<&str>| is_ahead(continuation, current);
        match self.owned.checkpoint_forward(continuation, forward).await {
            Ok(_) => Ok(()),
            Err(UpdateError::Lost(_) | UpdateError::Gone) => Err(lost()),
            Err(UpdateError::Store(source)) => Err(CheckpointError::Store {
                lease: self.owned.token().to_owned(),
                source,
            }),
        }
    }
}

/// Whether checkpointing `next` moves a lease forward from `current` (positions compare by LSN;
/// one that cannot be read is written).
fn is_ahead(next: &str, current: Option<&str>) -> bool {
    match (continuation_lsn(next), current.and_then(continuation_lsn)) {
        (Some(next), Some(current)) => next > current,
        _ => current != Some(next),
    }
}

/// The user's code when it checkpoints itself. `handle` returning `Ok` means the batch was taken
/// (it is not delivered again unless the lease moves before it is checkpointed); `Err` retries it
/// as for [`crate::processor::ChangeHandler`]. Batches of a lease come in order, one at a time
/// (a processor with manual checkpoints and `max_in_flight_batches` above 1 refuses to start).
#[async_trait]
pub trait ManualCheckpointHandler: Send + Sync + 'static {
    /// Handles one batch; `checkpoint` records it (and the lease's earlier batches) when called.
    async fn handle(&self, batch: Batch<'_>, checkpoint: CheckpointHandle) -> Result<(), HandlerError>;

    /// Whether the handler can take batches now (the worker's `/readyz` includes it).
    async fn ready(&self) -> bool {
        true
    }
}

/// The handler a processor delivers to.
#[derive(Clone)]
pub enum Handler {
    /// Checkpointed by the processor after `handle` succeeded.
    Automatic(Arc<dyn crate::processor::ChangeHandler>),
    /// Checkpointed by the handler through the handle it gets with each batch.
    Manual(Arc<dyn ManualCheckpointHandler>),
}

impl Handler {
    /// Whether the handler checkpoints itself.
    pub fn is_manual(&self) -> bool {
        matches!(self, Handler::Manual(_))
    }

    /// Whether the handler can take batches now.
    pub async fn ready(&self) -> bool {
        match self {
            Handler::Automatic(handler) => handler.ready().await,
            Handler::Manual(handler) => handler.ready().await,
        }
    }

    /// How long one call may take before the handler gives up on it, if it says.
    pub fn time_limit(&self) -> Option<std::time::Duration> {
        match self {
            Handler::Automatic(handler) => handler.time_limit(),
            Handler::Manual(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_later_positions_are_written() {
        let cases = [
            ("\"12\"", None, true),
            ("\"12\"", Some("\"11\""), true),
            ("\"12\"", Some("\"12\""), false),
            ("\"12\"", Some("\"30\""), false),
            (
                r#"{"kind":"change_feed_cursor_v1","lsn":48}"#,
                Some(r#"{"kind":"change_feed_cursor_v1","lsn":40}"#),
                true,
            ),
            ("opaque", Some("other"), true),
            ("opaque", Some("opaque"), false),
        ];
        for (next, current, ahead) in cases {
            assert_eq!(is_ahead(next, current), ahead, "{next} after {current:?}");
        }
    }
}
