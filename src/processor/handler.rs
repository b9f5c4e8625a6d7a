//! Handlers: the user's code that receives batches of changed documents.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

/// One batch of changes from one lease.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// The lease token (`"{min}-{max}"`) the batch was read from.
    pub lease_token: &'a str,
    /// The changed documents, in change order for the range.
    pub documents: &'a [Value],
}

/// Why a handler could not handle a batch. The batch is retried (never checkpointed).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HandlerError(pub String);

/// The user's code. A batch is checkpointed only after `handle` returned `Ok`; an `Err` makes the
/// processor retry the same batch with backoff. Delivery is at-least-once: after a crash or a
/// lost lease a batch can be delivered again.
#[async_trait]
pub trait ChangeHandler: Send + Sync + 'static {
    /// Handles one batch.
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError>;
}

#[async_trait]
impl<T: ChangeHandler + ?Sized> ChangeHandler for Arc<T> {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        (**self).handle(batch).await
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
        let mut text = String::new();
        for doc in batch.documents {
            text.push_str(&doc.to_string());
            text.push('\n');
        }
        let mut guard = self.out.lock().await;
        let out = guard.get_or_insert_with(tokio::io::stdout);
        out.write_all(text.as_bytes())
            .await
            .map_err(|e| HandlerError(format!("writing to stdout: {e}")))?;
        out.flush()
            .await
            .map_err(|e| HandlerError(format!("flushing stdout: {e}")))
    }
}
