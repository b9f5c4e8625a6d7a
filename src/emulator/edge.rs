//! The one door to the SDK's in-memory emulator: every request of `cfp emulator`'s HTTP face and
//! of in-process clients passes through [`Edge::execute`], which answers change feed reads in
//! the service's formats ([`super::formats`]): `_lsn` on every document, quoted-LSN ETags (and
//! quoted LSNs accepted as `If-None-Match`), `x-ms-max-item-count` without cutting one LSN's
//! documents apart, and the session token of the range read — and, on an account of several
//! regions, what each region has (`lag.rs`): a region reading another's writes within the
//! replication delay answers the change feed up to the first of them and a point read of a
//! document created there 404.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use azure_core::http::headers::{HeaderName, Headers};
use azure_core::http::{Method, Request, StatusCode};
use azure_data_cosmos_driver::in_memory_emulator::InMemoryEmulatorHttpClient;
use bytes::Bytes;
use serde_json::Value;

use super::formats;
use super::lag::{Lag, Write};
use super::lsn_map::{self, MergedRanges, RangeMaps};
use super::request_budget::{self, Priority, RequestBudgets};
use super::throttles::{Answered, Throttles};

type DriverResult<T> = azure_data_cosmos_driver::error::Result<T>;

pub(super) const IF_NONE_MATCH: HeaderName = HeaderName::from_static("if-none-match");
pub(super) const MAX_ITEM_COUNT: HeaderName = HeaderName::from_static("x-ms-max-item-count");
pub(super) const ETAG: HeaderName = HeaderName::from_static("etag");
pub(super) const SESSION_TOKEN: HeaderName = HeaderName::from_static("x-ms-session-token");
pub(super) const RANGE_ID: HeaderName = HeaderName::from_static("x-ms-documentdb-partitionkeyrangeid");
pub(super) const ITEM_COUNT: HeaderName = HeaderName::from_static("x-ms-item-count");
pub(super) const ITEM_LSN: HeaderName = HeaderName::from_static("x-ms-item-lsn");
const CONTENT_LENGTH: HeaderName = HeaderName::from_static("content-length");
pub(super) const LSN: HeaderName = HeaderName::from_static("lsn");
const PRIORITY: HeaderName = HeaderName::from_static("x-ms-cosmos-priority-level");
/// The throughput bucket a request is sent in.
const BUCKET: HeaderName = HeaderName::from_static("x-ms-cosmos-throughput-bucket");
const REQUEST_CHARGE: HeaderName = HeaderName::from_static("x-ms-request-charge");
const IS_QUERY: HeaderName = HeaderName::from_static("x-ms-documentdb-isquery");

/// The page size of a query that asks for none (no `x-ms-max-item-count`, or -1): the service
/// answers "in chunks of 100 items or 4 MB, whichever limit is hit first" (Microsoft Learn,
/// "Performance tips for Azure Cosmos DB Java SDK v4", Tune the page size); the SDK emulator
/// would answer every result in one page.
const DEFAULT_QUERY_PAGE: &str = "100";

/// Whether a request is a query of a container's documents.
fn is_query(request: &Request) -> bool {
    request.method() == Method::Post
        && request.headers().get_optional_str(&IS_QUERY).is_some()
        && request.url().path().trim_matches('/').ends_with("/docs")
}

/// `request` with the service's default page size when it asks for none.
fn paged(mut request: Request) -> Request {
    let asked = request
        .headers()
        .get_optional_str(&MAX_ITEM_COUNT)
        .and_then(|n| n.trim().parse::<i64>().ok());
    if asked.is_none_or(|n| n <= 0) {
        request.insert_header(MAX_ITEM_COUNT, DEFAULT_QUERY_PAGE);
    }
    request
}

/// A buffered answer of the emulator.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The HTTP status.
    pub status: StatusCode,
    /// The response headers (no `content-length`: the body may have been rewritten).
    pub headers: Headers,
    /// The response body.
    pub body: Bytes,
}

/// The SDK emulator behind the service's change feed formats.
#[derive(Debug)]
pub struct Edge {
    pub(super) client: Arc<InMemoryEmulatorHttpClient>,
    /// Partition key paths by container (path and resource id), for the look-ups of `_lsn`.
    pub(super) partition_keys: Mutex<HashMap<String, Arc<Vec<String>>>>,
    /// What each region has of the others' writes.
    lag: Arc<Lag>,
    /// The 429s and request units of every answer, by container.
    throttles: Arc<Throttles>,
    /// The service's LSNs of the partitions the emulator numbered anew at a merge.
    pub(super) merged: MergedRanges,
    /// Held by every request; a merge or split holds it alone while it reads the partitions
    /// and installs the maps of the new ones.
    pub(super) gate: tokio::sync::RwLock<()>,
    /// One merge or split at a time.
    pub(super) transitions: tokio::sync::Mutex<()>,
    /// Every request's request units against its container's provisioned throughput.
    budgets: RequestBudgets,
}

/// Where a request spends request units: its container in the region it is addressed to.
#[derive(Debug)]
struct BudgetOf {
    region: String,
    container: String,
}

/// What a request does to the documents of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Reads a range's change feed.
    ChangeFeed,
    /// Reads one document.
    PointRead,
    /// Creates, replaces, upserts, patches or deletes documents.
    Write,
    /// Anything else (queries, metadata).
    Other,
}

impl Access {
    fn of(request: &Request) -> Self {
        let header = |name: &HeaderName| request.headers().get_optional_str(name).is_some();
        let path = request.url().path().trim_matches('/');
        if request.method() == Method::Get && header(&HeaderName::from_static("a-im")) && path.ends_with("/docs") {
            return Access::ChangeFeed;
        }
        let segments: Vec<&str> = path.split('/').collect();
        let document = match segments.as_slice() {
            ["dbs", _, "colls", _, "docs"] => false,
            ["dbs", _, "colls", _, "docs", _] => true,
            _ => return Access::Other,
        };
        match request.method() {
            Method::Get if document => Access::PointRead,
            Method::Post if header(&IS_QUERY) => Access::Other,
            Method::Post | Method::Put | Method::Delete | Method::Patch => Access::Write,
            _ => Access::Other,
        }
    }
}

impl Edge {
    /// The edge of `client`, whose regions have each other's writes as `lag` says.
    pub fn new(client: Arc<InMemoryEmulatorHttpClient>, lag: Arc<Lag>) -> Self {
        Self {
            client,
            partition_keys: Mutex::default(),
            lag,
            throttles: Arc::default(),
            merged: MergedRanges::default(),
            gate: tokio::sync::RwLock::new(()),
            transitions: tokio::sync::Mutex::new(()),
            budgets: RequestBudgets::default(),
        }
    }

    /// The 429s and request units of every answer so far, by container.
    pub fn throttles(&self) -> &Arc<Throttles> {
        &self.throttles
    }

    /// Serves one request as the service would — within its container's budget — and counts
    /// its answer.
    pub async fn execute(&self, request: Request) -> DriverResult<Reply> {
        let path = request.url().path().to_owned();
        let access = Access::of(&request);
        let page = access == Access::ChangeFeed;
        let priority = Priority::of(request.headers().get_optional_str(&PRIORITY));
        let bucket = request_budget::bucket_of(request.headers().get_optional_str(&BUCKET));
        let budget = self.budget_of(&request);
        let admitted = match &budget {
            Some(at) => self
                .budgets
                .admit(&at.region, &at.container, priority, bucket, Instant::now()),
            None => Ok(()),
        };
        let reply = match admitted {
            Ok(()) => {
                let gate = self.gate.read().await;
                let mut reply = self.serve(request).await?;
                drop(gate);
                if page && matches!(reply.status, StatusCode::Ok | StatusCode::NotModified) {
                    let charge = request_budget::page_charge(reply.body.len());
                    reply.headers.insert(REQUEST_CHARGE, format!("{charge:.2}"));
                }
                if let Some(at) = &budget {
                    let charge = reply.headers.get_optional_str(&REQUEST_CHARGE);
                    let charge = charge.and_then(|c| c.trim().parse().ok()).unwrap_or_default();
                    self.budgets
                        .debit(&at.region, &at.container, priority, bucket, charge, Instant::now());
                }
                reply
            }
            Err(refusal) => throttled(refusal),
        };
        let kind = Answered {
            write: access == Access::Write,
            low_priority: priority == Priority::Low,
        };
        self.throttles.record(&path, kind, reply.status, &reply.headers);
        Ok(reply)
    }

    /// The container and region whose budget a request of documents spends; `None` for a
    /// container without one, and for metadata.
    fn budget_of(&self, request: &Request) -> Option<BudgetOf> {
        let path = request.url().path().trim_matches('/');
        if path.split('/').nth(4) != Some("docs") {
            return None;
        }
        let container = container_of(request);
        self.budgets.has(&container).then(|| BudgetOf {
            region: self.region(request).unwrap_or_default(),
            container,
        })
    }

    /// The budgets of the containers given a provisioned throughput.
    pub(super) fn budgets(&self) -> &RequestBudgets {
        &self.budgets
    }

    /// Serves one request as the service would (the gate held).
    pub(super) async fn serve(&self, request: Request) -> DriverResult<Reply> {
        let access = Access::of(&request);
        if access == Access::PointRead && self.hides(&request) {
            return Ok(not_found());
        }
        let maps = self.merged.of(&container_of(&request));
        let request = match &maps {
            Some(maps) => inbound(request, maps),
            None => request,
        };
        if access == Access::ChangeFeed {
            return self.change_feed(request, maps.as_deref()).await;
        }
        let request = match access == Access::Other && is_query(&request) {
            true => paged(request),
            false => request,
        };
        let mut reply = self.send(&request).await?;
        if let Some(maps) = &maps {
            outbound(&mut reply, maps);
        }
        if access == Access::Write {
            self.record(&request, &reply);
        }
        Ok(reply)
    }

    /// The region a request is addressed to (by its endpoint).
    fn region(&self, request: &Request) -> Option<String> {
        let store = self.client.store();
        store.config().region_for_url(request.url()).map(|r| r.name)
    }

    /// Keeps a write the account took, for the regions that have it only after the delay.
    fn record(&self, request: &Request, reply: &Reply) {
        if !self.lag.is_active() || !reply.status.is_success() {
            return;
        }
        let token = reply.headers.get_optional_str(&SESSION_TOKEN).unwrap_or_default();
        let partition = token.split(',').next().and_then(|t| t.split_once(':')).map(|(p, _)| p);
        let lsn = reply.headers.get_optional_str(&LSN).and_then(|l| l.parse().ok());
        let (Some(partition), Some(lsn), Some(region)) = (partition, lsn, self.region(request)) else {
            return;
        };
        let created = (reply.status == StatusCode::Created)
            .then(|| created_id(request, reply))
            .flatten();
        let write = Write {
            container: &container_of(request),
            partition,
            lsn,
            region: &region,
            created: created.as_deref(),
        };
        self.lag.record(&write, Instant::now());
    }

    /// Whether the document a point read names has not reached the region read yet.
    fn hides(&self, request: &Request) -> bool {
        if !self.lag.is_active() {
            return false;
        }
        let Some(region) = self.region(request) else {
            return false;
        };
        let path = request.url().path().trim_matches('/');
        let id = path.rsplit('/').next().unwrap_or_default();
        let id = percent_encoding::percent_decode_str(id).decode_utf8_lossy();
        let token = request
            .headers()
            .get_optional_string(&SESSION_TOKEN)
            .unwrap_or_default();
        let session_lsn = |partition: &str| {
            token
                .split(',')
                .find(|part| part.trim().split_once(':').is_some_and(|(p, _)| p == partition))
                .and_then(crate::cosmos::session_token_lsn)
        };
        self.lag
            .hides(&container_of(request), &id, &region, session_lsn, Instant::now())
    }

    /// The highest LSN of the range a change feed request reads that its region has, if it
    /// lacks any.
    pub(super) fn visible_limit(&self, request: &Request) -> Option<u64> {
        if !self.lag.is_active() {
            return None;
        }
        let partition = request.headers().get_optional_string(&RANGE_ID)?;
        let region = self.region(request)?;
        self.lag
            .visible_limit(&container_of(request), &partition, &region, Instant::now())
    }

    /// Passes a request to the emulator as it is.
    pub(super) async fn send(&self, request: &Request) -> DriverResult<Reply> {
        let (status, mut headers, body) = self.client.execute_request(request).await?.deconstruct();
        let body = body.collect().await.map_err(|e| {
            azure_data_cosmos_driver::error::CosmosError::builder()
                .with_status(azure_data_cosmos_driver::error::status_codes::TRANSPORT_BODY_READ_FAILED)
                .with_message(format!("reading the emulator's response: {e}"))
                .build()
        })?;
        headers.remove(CONTENT_LENGTH);
        Ok(Reply { status, headers, body })
    }
}

/// A change feed answer as a region that has its range up to LSN `limit` gives it: the documents
/// after that held back (none left: 304), the continuation, the `lsn` header and the session
/// token no further than `limit` — unless the reader's own continuation, `requested`, is.
pub(super) fn hold_back(reply: &mut Reply, limit: u64, requested: Option<u64>) {
    if reply.status == StatusCode::Ok
        && let Ok(mut page) = serde_json::from_slice::<Value>(&reply.body)
        && let Some(items) = page.get_mut("Documents").and_then(Value::as_array_mut)
    {
        let kept = items
            .iter()
            .take_while(|item| formats::item_lsn(item).is_some_and(|lsn| lsn <= limit))
            .count();
        let last = kept.checked_sub(1).and_then(|i| formats::item_lsn(&items[i]));
        if kept < items.len() {
            items.truncate(kept);
            page["_count"] = kept.into();
            reply.headers.insert(ITEM_COUNT, kept.to_string());
            reply.body = Bytes::from(serde_json::to_vec(&page).unwrap_or_default());
            let through = last.or(requested).unwrap_or(limit);
            reply.headers.insert(ETAG, formats::quoted(through));
        }
        if kept == 0 {
            reply.status = StatusCode::NotModified;
            reply.body = Bytes::new();
        }
    } else if reply.status == StatusCode::NotModified && requested.is_none() {
        // A read from now: now in this region.
        let etag = reply.headers.get_optional_str(&ETAG).and_then(formats::service_lsn);
        if etag.is_some_and(|lsn| lsn > limit) {
            reply.headers.insert(ETAG, formats::quoted(limit));
        }
    }
    if let Some(token) = reply.headers.get_optional_string(&SESSION_TOKEN) {
        reply
            .headers
            .insert(SESSION_TOKEN, formats::clamp_session_lsn(&token, limit));
    }
    if let Some(lsn) = reply.headers.get_optional_str(&LSN).and_then(|l| l.parse::<u64>().ok())
        && lsn > limit
    {
        reply.headers.insert(LSN, limit.to_string());
    }
}

/// `request` with its session token in the emulator's numbering.
fn inbound(mut request: Request, maps: &RangeMaps) -> Request {
    if let Some(token) = request.headers().get_optional_string(&SESSION_TOKEN) {
        request.insert_header(SESSION_TOKEN, lsn_map::inbound_session(&token, maps));
    }
    request
}

/// An answer's session token and LSNs in the service's numbering.
pub(super) fn outbound(reply: &mut Reply, maps: &RangeMaps) {
    let token = reply.headers.get_optional_string(&SESSION_TOKEN);
    let range = reply.headers.get_optional_string(&RANGE_ID).or_else(|| {
        let first = token.as_deref()?.split(',').next()?;
        Some(first.split_once(':')?.0.trim().to_owned())
    });
    let map = range.and_then(|r| maps.get(&r));
    if let Some(token) = token {
        reply
            .headers
            .insert(SESSION_TOKEN, lsn_map::outbound_session(&token, maps));
    }
    let Some(map) = map else {
        return;
    };
    if let Some(lsn) = reply.headers.get_optional_str(&LSN).and_then(|l| l.parse::<u64>().ok()) {
        reply.headers.insert(LSN, map.partition(lsn).to_string());
    }
    if let Some(lsn) = reply
        .headers
        .get_optional_str(&ITEM_LSN)
        .and_then(|l| l.parse::<u64>().ok())
    {
        let body: Option<Value> = serde_json::from_slice(&reply.body).ok();
        let etag = body.as_ref().and_then(|b| b.get("_etag")?.as_str());
        reply.headers.insert(ITEM_LSN, map.document(lsn, etag).to_string());
    }
}

/// The service's answer to a request past its container's budget: 429/3200, retry after `wait`.
fn throttled(refusal: request_budget::Refusal) -> Reply {
    let mut headers = Headers::new();
    headers.insert("content-type", "application/json");
    headers.insert("x-ms-substatus", refusal.sub_status().to_string());
    headers.insert("x-ms-retry-after-ms", refusal.wait().as_millis().max(1).to_string());
    headers.insert(REQUEST_CHARGE, "0");
    let body = serde_json::json!({"code": "TooManyRequests", "message": "Request rate is large. More Request Units may be needed, so no changes were made. Please retry this request later."});
    Reply {
        status: StatusCode::TooManyRequests,
        headers,
        body: Bytes::from(body.to_string()),
    }
}

/// The service's answer to a read of a document it does not have.
fn not_found() -> Reply {
    let mut headers = Headers::new();
    headers.insert("content-type", "application/json");
    headers.insert("x-ms-substatus", "0");
    let body = serde_json::json!({"code": "NotFound", "message": "Entity with the specified id does not exist in the system."});
    Reply {
        status: StatusCode::NotFound,
        headers,
        body: Bytes::from(body.to_string()),
    }
}

/// The container a request addresses, by its path (`dbs/db/colls/c`).
pub(super) fn container_of(request: &Request) -> String {
    let path = request.url().path().trim_matches('/');
    path.split('/').take(4).collect::<Vec<_>>().join("/")
}

/// The id of the document a write created: from the answer, else from the request.
fn created_id(request: &Request, reply: &Reply) -> Option<String> {
    let id_in = |bytes: &[u8]| {
        serde_json::from_slice::<Value>(bytes)
            .ok()
            .and_then(|v| v.get("id")?.as_str().map(str::to_owned))
    };
    id_in(&reply.body).or_else(|| match request.body() {
        azure_core::http::Body::Bytes(bytes) => id_in(bytes),
        _ => None,
    })
}

/// Copies header `name` of `from` to `to` (the API version, which the emulator expects).
pub(super) fn copy_header(from: &Request, to: &mut Request, name: &'static str) {
    let value = from
        .headers()
        .get_optional_string(&HeaderName::from_static(name))
        .unwrap_or_else(|| "2020-07-15".to_owned());
    to.insert_header(name, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(lsns: &[u64], etag: u64) -> Reply {
        let documents: Vec<Value> = lsns
            .iter()
            .map(|lsn| serde_json::json!({"id": format!("d{lsn}"), "_lsn": lsn}))
            .collect();
        let mut headers = Headers::new();
        headers.insert(ETAG, formats::quoted(etag));
        headers.insert(SESSION_TOKEN, format!("0:0#{etag}#0={etag}"));
        headers.insert(LSN, etag.to_string());
        let body = serde_json::json!({"_rid": "r", "Documents": documents, "_count": lsns.len()});
        Reply {
            status: StatusCode::Ok,
            headers,
            body: Bytes::from(body.to_string()),
        }
    }

    fn lsns_of(reply: &Reply) -> Vec<u64> {
        let page: Value = serde_json::from_slice(&reply.body).unwrap_or_default();
        page["Documents"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(formats::item_lsn)
            .collect()
    }

    fn header(reply: &Reply, name: &HeaderName) -> String {
        reply.headers.get_optional_string(name).unwrap_or_default()
    }

    #[test]
    fn a_lagging_region_answers_the_change_feed_up_to_what_it_has() {
        let mut cut = page(&[4, 5, 7], 7);
        hold_back(&mut cut, 5, Some(3));
        assert_eq!(lsns_of(&cut), [4, 5]);
        assert_eq!(
            (header(&cut, &ETAG), header(&cut, &ITEM_COUNT)),
            ("\"5\"".into(), "2".into())
        );
        assert_eq!(
            (header(&cut, &SESSION_TOKEN), header(&cut, &LSN)),
            ("0:0#5#0=7".into(), "5".into())
        );

        let mut whole = page(&[4, 5], 5);
        hold_back(&mut whole, 9, Some(3));
        assert_eq!((lsns_of(&whole), header(&whole, &ETAG)), (vec![4, 5], "\"5\"".into()));

        // Nothing it has yet: 304, the reader's own continuation (or the region's LSN from the
        // start) kept.
        let mut ahead = page(&[8, 9], 9);
        hold_back(&mut ahead, 5, Some(7));
        assert_eq!(
            (ahead.status, header(&ahead, &ETAG)),
            (StatusCode::NotModified, "\"7\"".into())
        );
        let mut from_start = page(&[8, 9], 9);
        hold_back(&mut from_start, 5, None);
        assert_eq!(header(&from_start, &ETAG), "\"5\"");

        // A read from now starts at what the region has.
        let mut now = page(&[], 9);
        now.status = StatusCode::NotModified;
        hold_back(&mut now, 5, None);
        assert_eq!(header(&now, &ETAG), "\"5\"");
    }

    #[test]
    fn requests_are_told_apart_by_what_they_do_to_documents() {
        let request = |method: Method, path: &str, headers: &[(&'static str, &str)]| {
            let mut request = Request::new(format!("http://127.0.0.1:1/{path}").parse().unwrap(), method);
            for (name, value) in headers {
                request.insert_header(*name, (*value).to_owned());
            }
            Access::of(&request)
        };
        let docs = "dbs/db/colls/items/docs";
        assert_eq!(
            request(Method::Get, docs, &[("a-im", "Incremental feed")]),
            Access::ChangeFeed
        );
        assert_eq!(
            request(Method::Get, "dbs/db/colls/items/docs/a", &[]),
            Access::PointRead
        );
        assert_eq!(request(Method::Post, docs, &[]), Access::Write);
        assert_eq!(request(Method::Put, "dbs/db/colls/items/docs/a", &[]), Access::Write);
        assert_eq!(
            request(Method::Delete, "dbs/db/colls/items/docs/a/", &[]),
            Access::Write
        );
        assert_eq!(
            request(Method::Post, docs, &[("x-ms-documentdb-isquery", "true")]),
            Access::Other
        );
        assert_eq!(request(Method::Get, docs, &[]), Access::Other, "a listing");
        assert_eq!(request(Method::Post, "dbs/db/colls", &[]), Access::Other);
    }
}
