//! Document CRUD with optimistic concurrency (If-Match) on one container.

use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::options::{ItemWriteOptions, Precondition};
use azure_data_cosmos::{FeedScope, Query};
use futures::StreamExt;
use serde_json::Value;

use super::error::{CosmosError, ErrorKind};

/// A JSON document and the ETag it had when it was read or written.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// The document body.
    pub body: Value,
    /// The ETag of that version (`_etag`).
    pub etag: String,
}

/// A container used as a document store (the lease container, the dead-letter container, ...).
#[derive(Clone)]
pub struct DocumentContainer {
    client: ContainerClient,
    pk_paths: Vec<String>,
}

impl DocumentContainer {
    pub(crate) fn new(client: ContainerClient, pk_paths: Vec<String>) -> Self {
        Self { client, pk_paths }
    }

    /// The container's partition key paths (for example `["/id"]`).
    pub fn partition_key_paths(&self) -> &[String] {
        &self.pk_paths
    }

    /// Creates a document; `Conflict` when the id exists in that partition.
    pub async fn create(&self, partition_key: &str, body: &Value) -> Result<Document, CosmosError> {
        let id = id_of(body)?;
        let response = self
            .client
            .create_item(partition_key.to_owned(), &id, body, None)
            .await?;
        Ok(Document {
            body: body.clone(),
            etag: etag_of(response.headers())?,
        })
    }

    /// Creates or overwrites a document without a precondition.
    pub async fn upsert(&self, partition_key: &str, body: &Value) -> Result<Document, CosmosError> {
        let id = id_of(body)?;
        let response = self
            .client
            .upsert_item(partition_key.to_owned(), &id, body, None)
            .await?;
        Ok(Document {
            body: body.clone(),
            etag: etag_of(response.headers())?,
        })
    }

    /// Replaces a document only if its ETag is still `if_match`; `PreconditionFailed` otherwise,
    /// `NotFound` when it was deleted.
    pub async fn replace(&self, partition_key: &str, body: &Value, if_match: &str) -> Result<Document, CosmosError> {
        let id = id_of(body)?;
        let options = ItemWriteOptions::default().with_precondition(Precondition::if_match(if_match.to_owned()));
        let response = self
            .client
            .replace_item(partition_key.to_owned(), &id, body, Some(options))
            .await?;
        Ok(Document {
            body: body.clone(),
            etag: etag_of(response.headers())?,
        })
    }

    /// Reads a document; `Ok(None)` when it does not exist.
    pub async fn read(&self, partition_key: &str, id: &str) -> Result<Option<Document>, CosmosError> {
        match self.client.read_item(partition_key.to_owned(), id, None).await {
            Ok(response) => {
                let body: Value = response.into_model()?;
                let etag = body
                    .get("_etag")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| CosmosError::local(ErrorKind::Other, "document has no _etag"))?;
                Ok(Some(Document { body, etag }))
            }
            Err(e) => {
                let e = CosmosError::from(e);
                if e.kind == ErrorKind::NotFound {
                    Ok(None)
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Deletes a document, only if its ETag is still `if_match` when one is given. Deleting a
    /// missing document succeeds.
    pub async fn delete(&self, partition_key: &str, id: &str, if_match: Option<&str>) -> Result<(), CosmosError> {
        let options =
            if_match.map(|etag| ItemWriteOptions::default().with_precondition(Precondition::if_match(etag.to_owned())));
        match self.client.delete_item(partition_key.to_owned(), id, options).await {
            Ok(_) => Ok(()),
            Err(e) => {
                let e = CosmosError::from(e);
                if e.kind == ErrorKind::NotFound { Ok(()) } else { Err(e) }
            }
        }
    }

    /// Every document whose id starts with `prefix`.
    pub async fn list_by_id_prefix(&self, prefix: &str) -> Result<Vec<Document>, CosmosError> {
        let query = Query::from("SELECT * FROM c WHERE STARTSWITH(c.id, @prefix)").with_parameter("@prefix", prefix)?;
        self.list(query).await
    }

    /// Every document whose top-level string property `field` (a name from code, not input)
    /// equals `value`.
    pub async fn list_by_field(&self, field: &'static str, value: &str) -> Result<Vec<Document>, CosmosError> {
        let query = Query::from(format!("SELECT * FROM c WHERE c.{field} = @value").as_str())
            .with_parameter("@value", value)?;
        self.list(query).await
    }

    async fn list(&self, query: Query) -> Result<Vec<Document>, CosmosError> {
        let mut items = self
            .client
            .query_items::<Value>(query, FeedScope::full_container(), None)
            .await?;
        let mut out = Vec::new();
        while let Some(item) = items.next().await {
            let body = item?;
            let etag = body.get("_etag").and_then(Value::as_str).unwrap_or_default().to_owned();
            out.push(Document { body, etag });
        }
        Ok(out)
    }
}

fn id_of(body: &Value) -> Result<String, CosmosError> {
    body.get("id")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| CosmosError::local(ErrorKind::BadRequest, "document has no string id"))
}

fn etag_of(headers: &azure_data_cosmos::models::ResponseHeaders) -> Result<String, CosmosError> {
    headers
        .etag()
        .map(|e| e.to_string())
        .ok_or_else(|| CosmosError::local(ErrorKind::Other, "write response carried no ETag"))
}
