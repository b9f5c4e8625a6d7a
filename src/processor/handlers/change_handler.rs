//! Handlers: the user's code that receives batches of changed documents.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

use crate::cosmos::{Change, EpkRange};

/// One batch of changes from one lease.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// The processor (deployment unit) name.
    pub processor: &'a str,
    /// The lease token (`"{min}-{max}"`) the batch was read from.
    pub lease_token: &'a str,
    /// The lease's EPK range.
    pub feed_range: &'a EpkRange,
    /// Identifies the batch: the same for every delivery of the same batch (retries, and
    /// redelivery after a crash while the batch size is unchanged).
    pub batch_id: &'a str,
    /// Which delivery attempt this is (1 for the first).
    pub attempt: u32,
    /// The changed documents, in change order for the range (for a delete: the document before
    /// it, or its id and partition key).
    pub documents: &'a [Value],
    /// In the all-versions-and-deletes mode, what happened to each document (same order:
    /// operation, LSN, time, previous image); empty in the latest-version mode.
    pub changes: &'a [Change],
}

/// Why a handler could not handle a batch. The batch is retried (never checkpointed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HandlerError {
    /// What went wrong.
    pub message: String,
    /// How long the handler asked to wait before the next attempt (HTTP `Retry-After`).
    pub retry_after: Option<Duration>,
}

impl HandlerError {
    /// A failure with no wish about when to retry.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retry_after: None,
        }
    }

    /// A failure whose handler asked to retry after `delay`.
    pub fn retry_after(message: impl Into<String>, delay: Duration) -> Self {
        Self {
            message: message.into(),
            retry_after: Some(delay),
        }
    }
}

/// The user's code. A batch is checkpointed only after `handle` returned `Ok`; an `Err` makes the
/// processor retry the same batch with backoff. Delivery is at-least-once: after a crash or a
/// lost lease a batch can be delivered again.
#[async_trait]
pub trait ChangeHandler: Send + Sync + 'static {
    /// Handles one batch.
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError>;

    /// Whether the handler can take batches now (the worker's `/readyz` includes it).
    async fn ready(&self) -> bool {
        true
    }

    /// How long one call may take before the handler itself gives up on it (an HTTP handler's
    /// timeout); `None` when it has no such limit. A batch within it is not a stalled lease.
    fn time_limit(&self) -> Option<Duration> {
        None
    }
}

#[async_trait]
impl<T: ChangeHandler + ?Sized> ChangeHandler for Arc<T> {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        (**self).handle(batch).await
    }

    async fn ready(&self) -> bool {
        (**self).ready().await
    }

    fn time_limit(&self) -> Option<Duration> {
        (**self).time_limit()
    }
}

/// Writes one JSON line per changed document to standard output (logs go to standard error).
#[derive(Debug, Default)]
pub struct StdoutHandler {
    out: Mutex<Option<tokio::io::Stdout>>,
}

impl StdoutHandler {
    /// A handler writing to this process's standard output.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl ChangeHandler for StdoutHandler {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        // Serialized straight into one buffer: no string per document.
        let mut text = Vec::with_capacity(batch.documents.len() * 256);
        for (i, doc) in batch.documents.iter().enumerate() {
            // All versions and deletes: the change, with the document under `document`.
            let written = match batch.changes.get(i) {
                Some(change) => serde_json::to_writer(&mut text, &change.with_document(doc)),
                None => serde_json::to_writer(&mut text, doc),
            };
            written.map_err(|e| HandlerError::new(format!("serializing a document: {e}")))?;
            text.push(b'\n');
        }
        let mut guard = self.out.lock().await;
        let out = guard.get_or_insert_with(tokio::io::stdout);
        out.write_all(&text)
            .await
            .map_err(|e| HandlerError::new(format!("writing to stdout: {e}")))?;
        out.flush()
            .await
            .map_err(|e| HandlerError::new(format!("flushing stdout: {e}")))
    }
}
