//! Dead letters: documents the handler kept failing, moved aside so their lease can go on.
//!
//! A dead letter is written before the batch it came from is checkpointed; when the write fails,
//! nothing is checkpointed and the batch is tried again, so a document is never lost.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;

use crate::cosmos::{Change, CosmosError, DocumentContainer, ErrorKind};

/// A document the handler failed `attempts` times, as stored in the dead-letter container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetter {
    /// Unique id of the dead letter (not the document's id).
    pub id: String,
    /// The document as it was delivered.
    pub document: Value,
    /// The handler's last error.
    pub error: String,
    /// The processor whose handler failed it.
    pub processor: String,
    /// The lease token it was read from.
    pub lease: String,
    /// How many times the handler was given it.
    pub attempts: u32,
    /// When the handler first failed it.
    #[serde(with = "time::serde::rfc3339")]
    pub first_failure: OffsetDateTime,
    /// When the handler last failed it.
    #[serde(with = "time::serde::rfc3339")]
    pub last_failure: OffsetDateTime,
    /// What happened to the document, in the all-versions-and-deletes mode (the operation, its
    /// LSN and time, the previous image): a replay delivers a delete as a delete, not the deleted
    /// document's last image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<Change>,
}

impl DeadLetter {
    /// A dead letter with a new unique id: the document's id (or `document`) and 16 random hex digits.
    pub fn new(
        document: Value,
        processor: &str,
        lease: &str,
        error: String,
        attempts: u32,
        first_failure: OffsetDateTime,
    ) -> Self {
        let document_id = document
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or("document")
            .to_owned();
        Self {
            id: format!("{document_id}.{:016x}", fastrand::u64(..)),
            document,
            error,
            processor: processor.to_owned(),
            lease: lease.to_owned(),
            attempts,
            first_failure,
            last_failure: OffsetDateTime::now_utc(),
            change: None,
        }
    }

    /// The dead letter with what happened to its document (`None` in the latest-version mode).
    pub fn with_change(self, change: Option<Change>) -> Self {
        Self { change, ..self }
    }
}

/// Where dead letters go.
#[async_trait]
pub trait DeadLetterStore: Send + Sync + 'static {
    /// Stores one dead letter; an error means it was not stored.
    async fn put(&self, letter: &DeadLetter) -> Result<(), CosmosError>;
}

/// Dead letters in a Cosmos container partitioned on `/id`.
pub struct CosmosDeadLetters {
    container: DocumentContainer,
}

impl CosmosDeadLetters {
    /// The dead letters in `container`.
    pub fn new(container: DocumentContainer) -> Self {
        Self { container }
    }

    /// The dead letters of `processor`, oldest first.
    pub async fn list(&self, processor: &str) -> Result<Vec<DeadLetter>, CosmosError> {
        let mut letters = Vec::new();
        for doc in self.container.list_by_field("processor", processor).await? {
            let letter: DeadLetter = serde_json::from_value(doc.body)
                .map_err(|e| CosmosError::local(ErrorKind::Other, format!("not a dead letter: {e}")))?;
            letters.push(letter);
        }
        letters.sort_by(|a, b| a.first_failure.cmp(&b.first_failure).then(a.id.cmp(&b.id)));
        Ok(letters)
    }

    /// Removes a dead letter (after it was replayed).
    pub async fn remove(&self, id: &str) -> Result<(), CosmosError> {
        self.container.delete(id, id, None).await
    }
}

#[async_trait]
impl DeadLetterStore for CosmosDeadLetters {
    async fn put(&self, letter: &DeadLetter) -> Result<(), CosmosError> {
        let body = serde_json::to_value(letter)
            .map_err(|e| CosmosError::local(ErrorKind::Other, format!("serializing a dead letter: {e}")))?;
        self.container.create(&letter.id, &body).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cosmos::Operation;

    #[test]
    fn a_dead_letter_keeps_its_change_and_one_written_before_reads_without() {
        let deleted = DeadLetter::new(
            serde_json::json!({"id": "doc-1", "pk": "a"}),
            "orders",
            "0",
            "refused".into(),
            3,
            OffsetDateTime::now_utc(),
        )
        .with_change(Some(Change {
            operation_type: Operation::Delete,
            lsn: Some(12),
            timestamp: Some(1_700_000_000),
            previous: Some(serde_json::json!({"id": "doc-1", "pk": "a", "n": 1})),
            time_to_live_expired: true,
        }));
        let stored = serde_json::to_value(&deleted).unwrap();
        assert_eq!(stored["change"]["operationType"], "delete");
        assert_eq!(serde_json::from_value::<DeadLetter>(stored.clone()).unwrap(), deleted);
        let mut earlier = stored;
        earlier.as_object_mut().unwrap().remove("change");
        assert_eq!(serde_json::from_value::<DeadLetter>(earlier).unwrap().change, None);
    }
}
