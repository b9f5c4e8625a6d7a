//! Document CRUD with optimistic concurrency (If-Match) on one container.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::models::ResponseHeaders;
use azure_data_cosmos::options::{
    ItemWriteOptions, OperationOptionsBuilder, Precondition, PriorityLevel, ThrottlingRetryOptionsBuilder,
    ThroughputControlOptionsBuilder,
};
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

/// Request units charged so far, shared by the clones of one [`DocumentContainer`].
#[derive(Debug, Default)]
struct ChargeMeter {
    /// Thousandths of a request unit (charges are fractional).
    milli_units: AtomicU64,
}

impl ChargeMeter {
    fn add(&self, units: Option<f64>) {
        let milli = (units.unwrap_or_default() * 1000.0).round();
        if milli.is_finite() && milli > 0.0 {
            self.milli_units.fetch_add(milli as u64, Ordering::Relaxed);
        }
    }

    fn total(&self) -> f64 {
        self.milli_units.load(Ordering::Relaxed) as f64 / 1000.0
    }
}

/// A container used as a document store (the lease container, the dead-letter container, ...).
#[derive(Clone)]
pub struct DocumentContainer {
    client: ContainerClient,
    pk_paths: Vec<String>,
    charged: Arc<ChargeMeter>,
}

impl DocumentContainer {
    pub(crate) fn new(client: ContainerClient, pk_paths: Vec<String>) -> Self {
        Self {
            client,
            pk_paths,
            charged: Arc::new(ChargeMeter::default()),
        }
    }

    /// Request units charged for every request made through this container (and its clones)
    /// so far, failed ones included.
    pub fn request_charge(&self) -> f64 {
        self.charged.total()
    }

    /// Counts the charge of a request's outcome and passes the outcome on.
    fn charge<T>(
        &self,
        outcome: Result<T, azure_data_cosmos::CosmosError>,
        headers: impl Fn(&T) -> &ResponseHeaders,
    ) -> Result<T, azure_data_cosmos::CosmosError> {
        match &outcome {
            Ok(response) => self.charged.add(headers(response).request_charge().map(|c| c.value())),
            // A failed request (a 412, a 404) is charged too.
            Err(error) => self.charged.add(
                error
                    .response()
                    .and_then(|r| r.headers().request_charge)
                    .map(|c| c.value()),
            ),
        }
        outcome
    }

    /// The container's partition key paths (for example `["/id"]`).
    pub fn partition_key_paths(&self) -> &[String] {
        &self.pk_paths
    }

    /// The container's provisioned request units a second — its manual throughput, or the
    /// maximum of its autoscale throughput; `None` when it has none of its own (it shares its
    /// database's, or the account is serverless).
    pub async fn provisioned_throughput(&self) -> Result<Option<u64>, CosmosError> {
        own_throughput(&self.client).await
    }

    /// Creates a document; `Conflict` when the id exists in that partition.
    pub async fn create(&self, partition_key: &str, body: &Value) -> Result<Document, CosmosError> {
        let id = id_of(body)?;
        let response = self.charge(
            self.client.create_item(partition_key.to_owned(), &id, body, None).await,
            |r| r.headers(),
        )?;
        Ok(Document {
            body: body.clone(),
            etag: etag_of(response.headers())?,
        })
    }

    /// Creates or overwrites a document without a precondition.
    pub async fn upsert(&self, partition_key: &str, body: &Value) -> Result<Document, CosmosError> {
        let id = id_of(body)?;
        let response = self.charge(
            self.client.upsert_item(partition_key.to_owned(), &id, body, None).await,
            |r| r.headers(),
        )?;
        Ok(Document {
            body: body.clone(),
            etag: etag_of(response.headers())?,
        })
    }

    /// Replaces a document only if its ETag is still `if_match`; `PreconditionFailed` otherwise,
    /// `NotFound` when it was deleted.
    pub async fn replace(&self, partition_key: &str, body: &Value, if_match: &str) -> Result<Document, CosmosError> {
        let options = ItemWriteOptions::default().with_precondition(Precondition::if_match(if_match.to_owned()));
        self.replace_with(partition_key, body, options).await
    }

    /// Like [`Self::replace`], for a write that can wait (a checkpoint): sent at low priority
    /// (where the account has priority-based execution, the service throttles it before the
    /// others), and a 429 is returned at once (with its retry-after) instead of being retried by
    /// the SDK, so that the caller decides when to send it again.
    pub async fn replace_deferrable(
        &self,
        partition_key: &str,
        body: &Value,
        if_match: &str,
    ) -> Result<Document, CosmosError> {
        let operation = OperationOptionsBuilder::new()
            .with_throttling_retry_options(ThrottlingRetryOptionsBuilder::new().with_max_retry_count(0).build())
            .with_throughput_control(
                ThroughputControlOptionsBuilder::new()
                    .with_priority_level(PriorityLevel::Low)
                    .build(),
            )
            .build();
        let options = ItemWriteOptions::default()
            .with_precondition(Precondition::if_match(if_match.to_owned()))
            .with_operation_options(operation);
        self.replace_with(partition_key, body, options).await
    }

    async fn replace_with(
        &self,
        partition_key: &str,
        body: &Value,
        options: ItemWriteOptions,
    ) -> Result<Document, CosmosError> {
        let id = id_of(body)?;
        let response = self.charge(
            self.client
                .replace_item(partition_key.to_owned(), &id, body, Some(options))
                .await,
            |r| r.headers(),
        )?;
        Ok(Document {
            body: body.clone(),
            etag: etag_of(response.headers())?,
        })
    }

    /// Reads a document; `Ok(None)` when it does not exist.
    pub async fn read(&self, partition_key: &str, id: &str) -> Result<Option<Document>, CosmosError> {
        let outcome = self.charge(self.client.read_item(partition_key.to_owned(), id, None).await, |r| {
            r.headers()
        });
        match outcome {
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
        let outcome = self.charge(
            self.client.delete_item(partition_key.to_owned(), id, options).await,
            |r| r.headers(),
        );
        match outcome {
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

    /// Every document whose id ends with `suffix`.
    pub async fn list_by_id_suffix(&self, suffix: &str) -> Result<Vec<Document>, CosmosError> {
        let query = Query::from("SELECT * FROM c WHERE ENDSWITH(c.id, @suffix)").with_parameter("@suffix", suffix)?;
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
        // Page by page: each page's headers carry its charge.
        let mut pages = self
            .client
            .query_items::<Value>(query, FeedScope::full_container(), None)
            .await?
            .into_pages();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = self.charge(page, |p| p.headers())?;
            out.extend(page.into_items().into_iter().map(|body| {
                let etag = body.get("_etag").and_then(Value::as_str).unwrap_or_default().to_owned();
                Document { body, etag }
            }));
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

/// A container's provisioned request units a second — its manual throughput, or the maximum of
/// its autoscale throughput; `None` when it has none of its own (it shares its database's, or
/// the account is serverless).
pub(crate) async fn own_throughput(client: &ContainerClient) -> Result<Option<u64>, CosmosError> {
    let offer = client.read_throughput(None).await?;
    Ok(offer.and_then(|offer| offer.throughput().or_else(|| offer.autoscale_maximum())))
}
