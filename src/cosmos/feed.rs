//! Reading a container's feed ranges and its change feed, one page at a time.

use std::num::NonZeroU32;
use std::time::Duration;

use azure_data_cosmos::FeedScope;
use azure_data_cosmos::clients::ContainerClient;
use azure_data_cosmos::feed::{ChangeFeedPageIterator, ContinuationToken, FeedRange};
use azure_data_cosmos::models::{ChangeFeedItem, EffectivePartitionKey};
use azure_data_cosmos::options::{
    ChangeFeedMode, ChangeFeedOptions, ChangeFeedStartFrom, MaxItemCountHint, OperationOptionsBuilder, PriorityLevel,
    ReadFeedRangesOptions, ThroughputControlOptionsBuilder,
};
use futures::StreamExt;
use serde_json::Value;
use time::OffsetDateTime;

use super::change::{Change, FeedMode};
use super::continuation::{RangeContinuation, decode_sdk_token, encode_sdk_token};
use super::error::{CosmosError, ErrorKind};
use super::range::EpkRange;

/// Partitions whose ids are asked for at once when listing partition key ranges.
const PARTITION_LISTING_CONCURRENCY: usize = 8;

/// Where a change feed read starts when a range has no continuation yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    /// All retained changes.
    Beginning,
    /// Changes made after the first read.
    Now,
    /// Changes made at or after this time (ignored by the in-memory emulator).
    Time(OffsetDateTime),
}

impl std::str::FromStr for StartFrom {
    type Err = String;

    /// `beginning`, `now` (any case) or an RFC 3339 time.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "beginning" => Ok(Self::Beginning),
            "now" => Ok(Self::Now),
            _ => OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
                .map(Self::Time)
                .map_err(|_| {
                    format!("expected beginning, now or an RFC 3339 time such as 2026-01-31T12:00:00Z, got {s:?}")
                }),
        }
    }
}

/// One page of the change feed of a range.
#[derive(Debug, Clone)]
pub struct ChangePage {
    /// The changed documents, oldest first.
    pub documents: Vec<Value>,
    /// In the all-versions-and-deletes mode, what happened to each document (same order);
    /// empty in the latest-version mode.
    pub changes: Vec<Change>,
    /// The position after this page, one entry per EPK sub-range the read now spans. More than
    /// one entry means the range was split by the service since the read started.
    pub continuations: Vec<RangeContinuation>,
    /// The session token header (`<pkrange>:<...>#<lsn>...`), which carries the latest LSN.
    pub session_token: Option<String>,
    /// The `lsn` response header, when the service sent one.
    pub lsn: Option<u64>,
    /// The partition key range id that served the page (when one did).
    pub range_id: Option<String>,
    /// Request units charged for the read.
    pub request_charge: f64,
    /// Attempts beyond the first that the SDK made for this page (it retries throttling, 503s
    /// and timeouts by itself).
    pub retries: u32,
}

impl ChangePage {
    /// The position after this page when the read still spans one range (no split since it
    /// started); `range`, when given, must be that range.
    pub fn single_continuation(&self, range: Option<&EpkRange>) -> Option<&str> {
        match self.continuations.as_slice() {
            [only] if range.is_none_or(|r| *r == only.range) => Some(&only.continuation),
            _ => None,
        }
    }
}

/// What the account holds under a monitored container's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presence {
    /// The container that was opened.
    Present,
    /// Nothing: the container (or its database) was deleted.
    Missing,
    /// Another container with this resource id: deleted and created again (a new change feed).
    Recreated(String),
}

/// The container whose change feed is processed.
#[derive(Clone)]
pub struct MonitoredContainer {
    client: ContainerClient,
    account_host: String,
    name: String,
    database_rid: String,
    rid: String,
    pk_paths: Vec<String>,
    /// The throughput bucket change feed reads are sent in (`None`: none).
    read_bucket: Option<u32>,
}

impl MonitoredContainer {
    pub(crate) fn new(
        client: ContainerClient,
        (account_host, name): (String, String),
        database_rid: String,
        rid: String,
        pk_paths: Vec<String>,
    ) -> Self {
        Self {
            client,
            account_host,
            name,
            database_rid,
            rid,
            pk_paths,
            read_bucket: None,
        }
    }

    /// The same container, its change feed read in throughput bucket `bucket` (1–5; sent as
    /// `x-ms-cosmos-throughput-bucket`: the service caps what requests of a bucket spend of the
    /// container's throughput, and answers 429 with sub-status 3212 past it).
    pub fn with_read_bucket(mut self, bucket: Option<u8>) -> Self {
        self.read_bucket = bucket.map(u32::from);
        self
    }

    /// The container's provisioned request units a second — its manual throughput, or the
    /// maximum of its autoscale throughput; `None` when it has none of its own.
    pub async fn provisioned_throughput(&self) -> Result<Option<u64>, CosmosError> {
        crate::cosmos::documents::own_throughput(&self.client).await
    }

    /// The container's resource id (`_rid`).
    pub fn rid(&self) -> &str {
        &self.rid
    }

    /// `database/container`, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host name of the account endpoint it was opened through (part of lease prefixes).
    pub fn account_host(&self) -> &str {
        &self.account_host
    }

    /// What the account holds under this container's name now: nothing (deleted), this
    /// container, or another one created under the same name since it was opened.
    pub async fn presence(&self) -> Result<Presence, CosmosError> {
        match self.client.read(None).await {
            Ok(response) => {
                let props = response.into_model()?;
                Ok(match props.system_properties.resource_id {
                    Some(rid) if rid != self.rid => Presence::Recreated(rid),
                    _ => Presence::Present,
                })
            }
            Err(error) => {
                let error = CosmosError::from(error);
                if error.kind == ErrorKind::NotFound {
                    Ok(Presence::Missing)
                } else {
                    Err(error)
                }
            }
        }
    }

    /// The database's resource id (`_rid`).
    pub fn database_rid(&self) -> &str {
        &self.database_rid
    }

    /// The container's partition key paths.
    pub fn partition_key_paths(&self) -> &[String] {
        &self.pk_paths
    }

    /// The container's current feed ranges (one per physical partition), sorted by EPK.
    /// `force_refresh` bypasses the SDK's routing-map cache (needed after a split).
    pub async fn feed_ranges(&self, force_refresh: bool) -> Result<Vec<EpkRange>, CosmosError> {
        let options = ReadFeedRangesOptions::default().with_force_refresh(force_refresh);
        let ranges = self.client.read_feed_ranges(Some(options)).await?;
        let mut out: Vec<EpkRange> = ranges
            .iter()
            .map(|r| EpkRange::new(r.min_inclusive().to_hex(), r.max_exclusive().to_hex()))
            .collect();
        out.sort();
        Ok(out)
    }

    /// The container's partition key ranges now, as `(id, range)`: each feed range's change feed
    /// is read once from "now" (no documents), and the response names the range that served it.
    pub async fn partition_key_ranges(&self) -> Result<Vec<(String, EpkRange)>, CosmosError> {
        let ranges = self.feed_ranges(true).await?;
        // Tasks, not futures of this one: an account in this process (the emulator) answers on
        // every core.
        let mut ids = futures::stream::iter(ranges)
            .map(|range| tokio::spawn(self.clone().partition_key_range_id(range)))
            .buffered(PARTITION_LISTING_CONCURRENCY);
        let mut out = Vec::new();
        while let Some(joined) = ids.next().await {
            let found = joined
                .map_err(|e| CosmosError::local(ErrorKind::Other, format!("listing partition key ranges: {e}")))?;
            out.push(found?);
        }
        Ok(out)
    }

    /// The id of the partition key range serving `range`: its change feed read once from "now".
    async fn partition_key_range_id(self, range: EpkRange) -> Result<(String, EpkRange), CosmosError> {
        let mut reader = self.reader(&range, None, StartFrom::Now, 1).await?;
        let page = reader.next_page(Duration::from_secs(65)).await?;
        let id = page.range_id.ok_or_else(|| {
            CosmosError::local(
                ErrorKind::Other,
                format!("the account did not say which partition key range serves {range}"),
            )
        })?;
        Ok((id, range))
    }

    /// The effective partition key (hex) of a single-value partition key.
    pub async fn epk_of(&self, partition_key: &str) -> Result<String, CosmosError> {
        let ranges = self
            .client
            .feed_range_from_partition_key(partition_key.to_owned(), None)
            .await?;
        ranges
            .first()
            .map(|r| r.min_inclusive().to_hex())
            .ok_or_else(|| CosmosError::local(ErrorKind::Other, "no feed range for the partition key"))
    }

    /// Opens a latest-version change feed reader over `range`, resuming from `continuation` (a
    /// raw server continuation of exactly that range) or else starting at `start`.
    pub async fn reader(
        &self,
        range: &EpkRange,
        continuation: Option<&str>,
        start: StartFrom,
        max_items: u32,
    ) -> Result<FeedReader, CosmosError> {
        self.reader_in(FeedMode::LatestVersion, range, continuation, start, max_items)
            .await
    }

    /// Opens a change feed reader in `mode` (see [`MonitoredContainer::reader`]).
    pub async fn reader_in(
        &self,
        mode: FeedMode,
        range: &EpkRange,
        continuation: Option<&str>,
        start: StartFrom,
        max_items: u32,
    ) -> Result<FeedReader, CosmosError> {
        let feed_range = to_sdk_range(range)?;
        let max = NonZeroU32::new(max_items.max(1)).unwrap_or(NonZeroU32::MIN);
        // Reads of the feed can wait: at low priority the service throttles them before the
        // application's requests (priority-based execution).
        let mut control = ThroughputControlOptionsBuilder::new().with_priority_level(PriorityLevel::Low);
        if let Some(bucket) = self.read_bucket {
            control = control.with_throughput_bucket(bucket);
        }
        let low = OperationOptionsBuilder::new()
            .with_throughput_control(control.build())
            .build();
        let mut options = ChangeFeedOptions::default()
            .with_operation_options(low)
            .with_max_item_count(MaxItemCountHint::Limit(max))
            .with_mode(match mode {
                FeedMode::LatestVersion => ChangeFeedMode::LatestVersion,
                FeedMode::AllVersionsAndDeletes => ChangeFeedMode::AllVersionsAndDeletes,
            });
        if let Some(raw) = continuation {
            let token = encode_sdk_token(
                &self.rid,
                &[RangeContinuation {
                    range: range.clone(),
                    continuation: raw.to_owned(),
                }],
                mode == FeedMode::AllVersionsAndDeletes,
            );
            options = options.with_continuation_token(ContinuationToken::from_string(token));
        }
        let start_from = match start {
            StartFrom::Beginning => ChangeFeedStartFrom::Beginning,
            StartFrom::Now => ChangeFeedStartFrom::Now,
            StartFrom::Time(t) => ChangeFeedStartFrom::PointInTime(t),
        };
        let pages = self
            .client
            .query_change_feed::<Value>(FeedScope::range(feed_range), start_from, Some(options))
            .await?;
        Ok(FeedReader {
            pages: Box::pin(pages),
            range: range.clone(),
            mode,
            max_items: max.get(),
            opened_at: Some(OpenedAt {
                continuation: continuation.map(str::to_owned),
                start,
            }),
        })
    }

    /// A reader asking for pages of another size from where one was ([`FeedReader::resize_from`]):
    /// opened again, as the SDK fixes a reader's page size when it is opened.
    pub async fn resized(&self, from: ResizeFrom) -> Result<FeedReader, CosmosError> {
        let at = from.at;
        self.reader_in(
            from.mode,
            &from.range,
            at.continuation.as_deref(),
            at.start,
            from.max_items,
        )
        .await
    }
}

/// A change feed reader over one EPK range; the stream behind it stays open between pages.
pub struct FeedReader {
    pages: std::pin::Pin<Box<ChangeFeedPageIterator<ChangeFeedItem<Value>>>>,
    range: EpkRange,
    mode: FeedMode,
    /// The most documents a page asks for.
    max_items: u32,
    /// Where it was opened, until it read a page (its continuation is then the server's).
    opened_at: Option<OpenedAt>,
}

/// Where a reader opened again with another page size starts ([`MonitoredContainer::resized`]).
pub struct ResizeFrom {
    mode: FeedMode,
    range: EpkRange,
    at: OpenedAt,
    max_items: u32,
}

/// Where a reader was opened: a raw continuation of its range, or else a start.
#[derive(Clone)]
struct OpenedAt {
    continuation: Option<String>,
    start: StartFrom,
}

impl FeedReader {
    /// Where this reader opened again with pages of `max_items` starts, to be opened between
    /// pages; `None`: it stays as it is (it has that size, or spans several ranges after a split
    /// and is rebuilt soon).
    pub fn resize_from(&self, max_items: u32) -> Result<Option<ResizeFrom>, CosmosError> {
        if self.max_items == max_items.max(1) {
            return Ok(None);
        }
        let resize = |at: OpenedAt| ResizeFrom {
            mode: self.mode,
            range: self.range.clone(),
            at,
            max_items: max_items.max(1),
        };
        if let Some(at) = &self.opened_at {
            return Ok(Some(resize(at.clone())));
        }
        let token = self.pages.to_continuation_token()?;
        let Some(continuations) = decode_sdk_token(token.as_str()) else {
            return Err(CosmosError::local(
                ErrorKind::Other,
                "unrecognized change feed continuation token",
            ));
        };
        let [single] = continuations.as_slice() else {
            return Ok(None);
        };
        Ok(Some(resize(OpenedAt {
            continuation: Some(single.continuation.clone()),
            start: StartFrom::Now,
        })))
    }

    /// The most documents a page asks for.
    pub fn max_items(&self) -> u32 {
        self.max_items
    }

    /// The range this reader was opened for.
    pub fn range(&self) -> &EpkRange {
        &self.range
    }

    /// Reads the next page; an empty page means the range has no new changes. Times out as a
    /// transient error after `timeout`.
    pub async fn next_page(&mut self, timeout: Duration) -> Result<ChangePage, CosmosError> {
        let page = match tokio::time::timeout(timeout, self.pages.next()).await {
            Err(_) => {
                return Err(CosmosError::local(
                    ErrorKind::Transient,
                    format!("change feed read timed out after {timeout:?}"),
                ));
            }
            Ok(None) => {
                return Err(CosmosError::local(ErrorKind::Transient, "change feed stream ended"));
            }
            Ok(Some(page)) => page?,
        };
        let headers = page.headers();
        let session_token = headers.session_token().map(|t| t.to_string());
        let range_id = headers
            .partition_key_range_id()
            .map(str::to_owned)
            .or_else(|| range_id_of_session_token(session_token.as_deref()?));
        let lsn = headers.lsn();
        // Every request the page took is charged (the SDK's retries, the empty pages it skips).
        let diagnostics = page.diagnostics();
        let request_charge = match diagnostics.total_request_charge().value() {
            total if total > 0.0 => total,
            _ => headers.request_charge().map(|c| c.value()).unwrap_or_default(),
        };
        let retries = u32::try_from(diagnostics.request_count().saturating_sub(1)).unwrap_or(u32::MAX);
        // The continuation moves past every item of the page, so every item is delivered: one
        // without a current image (a delete in the all-versions mode) as its previous image, or
        // as what its metadata identifies.
        let items = page.into_items();
        let changes: Vec<Change> = match self.mode {
            FeedMode::LatestVersion => Vec::new(),
            FeedMode::AllVersionsAndDeletes => items.iter().map(Change::of).collect(),
        };
        let documents: Vec<Value> = items.into_iter().map(document_of).collect();
        self.opened_at = None;
        let token = self.pages.to_continuation_token()?;
        let continuations = decode_sdk_token(token.as_str())
            .ok_or_else(|| CosmosError::local(ErrorKind::Other, "unrecognized change feed continuation token"))?;
        Ok(ChangePage {
            documents,
            changes,
            range_id,
            continuations,
            session_token,
            lsn,
            request_charge,
            retries,
        })
    }
}

/// The range id a single-range session token (`<range id>:<version>#<lsn>`) starts with.
fn range_id_of_session_token(token: &str) -> Option<String> {
    let (id, _) = token.split_once(':')?;
    (!token.contains(',') && !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())).then(|| id.to_owned())
}

/// The document a change item stands for: its current image; else its previous image; else a
/// document with what its metadata says (id, partition key, operation, LSN).
fn document_of(item: ChangeFeedItem<Value>) -> Value {
    if let Some(current) = item.current() {
        return current.clone();
    }
    if item.operation_type() != Some(azure_data_cosmos::models::ChangeFeedOperationType::Delete) {
        tracing::warn!(
            operation = ?item.operation_type(),
            "a change arrived without a current image; delivering what identifies it"
        );
    }
    if let Some(previous) = item.previous() {
        return previous.clone();
    }
    let metadata = item.metadata();
    serde_json::json!({
        "id": metadata.and_then(|m| m.id()),
        "_partitionKey": metadata.and_then(|m| m.partition_key()).cloned(),
        "_operationType": item.operation_type().map(|o| format!("{o:?}")),
        "_lsn": metadata.and_then(|m| m.lsn()).map(|l| l.value()),
    })
}

fn to_sdk_range(range: &EpkRange) -> Result<FeedRange, CosmosError> {
    let min = EffectivePartitionKey::try_from(range.min.as_str())
        .map_err(|e| CosmosError::local(ErrorKind::BadRequest, format!("bad EPK {:?}: {e}", range.min)))?;
    let max = EffectivePartitionKey::try_from(range.max.as_str())
        .map_err(|e| CosmosError::local(ErrorKind::BadRequest, format!("bad EPK {:?}: {e}", range.max)))?;
    Ok(FeedRange::new(min, max)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(value: Value) -> ChangeFeedItem<Value> {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn every_change_item_becomes_a_document() {
        let flat = item(json!({"id": "a", "pk": "p", "n": 1}));
        assert_eq!(document_of(flat)["n"], 1);
        let with_previous =
            item(json!({"previous": {"id": "b", "n": 2}, "metadata": {"operationType": "delete", "lsn": 5}}));
        assert_eq!(document_of(with_previous)["id"], "b");
        let metadata_only =
            item(json!({"metadata": {"operationType": "delete", "lsn": 7, "id": "c", "partitionKey": ["p"]}}));
        let doc = document_of(metadata_only);
        assert_eq!((doc["id"].clone(), doc["_lsn"].clone()), (json!("c"), json!(7)));
        assert!(
            doc["_operationType"].as_str().unwrap_or_default().contains("Delete"),
            "{doc}"
        );
    }
}
