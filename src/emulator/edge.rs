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
use super::throttles::Throttles;

type DriverResult<T> = azure_data_cosmos_driver::error::Result<T>;

const IF_NONE_MATCH: HeaderName = HeaderName::from_static("if-none-match");
const MAX_ITEM_COUNT: HeaderName = HeaderName::from_static("x-ms-max-item-count");
const ETAG: HeaderName = HeaderName::from_static("etag");
const SESSION_TOKEN: HeaderName = HeaderName::from_static("x-ms-session-token");
const RANGE_ID: HeaderName = HeaderName::from_static("x-ms-documentdb-partitionkeyrangeid");
const ITEM_COUNT: HeaderName = HeaderName::from_static("x-ms-item-count");
const ITEM_LSN: HeaderName = HeaderName::from_static("x-ms-item-lsn");
const CONTENT_LENGTH: HeaderName = HeaderName::from_static("content-length");
const LSN: HeaderName = HeaderName::from_static("lsn");
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
    client: Arc<InMemoryEmulatorHttpClient>,
    /// Partition key paths by container (path and resource id), for the look-ups of `_lsn`.
    partition_keys: Mutex<HashMap<String, Arc<Vec<String>>>>,
    /// What each region has of the others' writes.
    lag: Arc<Lag>,
    /// The 429s and request units of every answer, by container.
    throttles: Arc<Throttles>,
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
        }
    }

    /// The 429s and request units of every answer so far, by container.
    pub fn throttles(&self) -> &Arc<Throttles> {
        &self.throttles
    }

    /// Serves one request as the service would, and counts its answer.
    pub async fn execute(&self, request: Request) -> DriverResult<Reply> {
        let path = request.url().path().to_owned();
        let write = Access::of(&request) == Access::Write;
        let reply = self.serve(request).await?;
        self.throttles.record(&path, write, reply.status, &reply.headers);
        Ok(reply)
    }

    /// Serves one request as the service would.
    async fn serve(&self, request: Request) -> DriverResult<Reply> {
        match Access::of(&request) {
            Access::ChangeFeed => self.change_feed(request).await,
            Access::PointRead if self.hides(&request) => Ok(not_found()),
            Access::Write => {
                let reply = self.send(&request).await?;
                self.record(&request, &reply);
                Ok(reply)
            }
            Access::Other if is_query(&request) => self.send(&paged(request)).await,
            Access::PointRead | Access::Other => self.send(&request).await,
        }
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
    fn visible_limit(&self, request: &Request) -> Option<u64> {
        if !self.lag.is_active() {
            return None;
        }
        let partition = request.headers().get_optional_string(&RANGE_ID)?;
        let region = self.region(request)?;
        self.lag
            .visible_limit(&container_of(request), &partition, &region, Instant::now())
    }

    /// Passes a request to the emulator as it is.
    async fn send(&self, request: &Request) -> DriverResult<Reply> {
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

    /// A change feed read: the client's continuation and page size in the emulator's terms, the
    /// answer in the service's.
    async fn change_feed(&self, mut request: Request) -> DriverResult<Reply> {
        let requested = request
            .headers()
            .get_optional_str(&IF_NONE_MATCH)
            .and_then(formats::service_lsn);
        let wanted = request
            .headers()
            .get_optional_str(&MAX_ITEM_COUNT)
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|n| *n > 0);
        if let Some(cursor) = request
            .headers()
            .get_optional_str(&IF_NONE_MATCH)
            .and_then(formats::emulator_continuation)
        {
            request.insert_header(IF_NONE_MATCH, cursor);
        }
        if let Some(wanted) = wanted {
            // One more than asked: whether the page would cut one LSN's documents apart.
            request.insert_header(MAX_ITEM_COUNT, (wanted + 1).to_string());
        }
        let mut reply = self.send(&request).await?;
        if reply.status == StatusCode::Ok {
            reply = self.service_page(&request, reply, wanted).await?;
        }
        if let Some(etag) = reply.headers.get_optional_str(&ETAG).and_then(formats::service_etag) {
            reply.headers.insert(ETAG, etag);
        }
        let range = reply.headers.get_optional_string(&RANGE_ID);
        if let (Some(range), Some(token)) = (range, reply.headers.get_optional_string(&SESSION_TOKEN)) {
            reply
                .headers
                .insert(SESSION_TOKEN, formats::range_session_token(&token, &range));
        }
        if let Some(limit) = self.visible_limit(&request) {
            hold_back(&mut reply, limit, requested);
        }
        Ok(reply)
    }

    /// A page of changes as the service sends it: each document's `_lsn`, at most `wanted`
    /// documents unless one LSN's documents go on past them, the ETag the emulator's cursor
    /// after the last document kept.
    async fn service_page(&self, request: &Request, mut reply: Reply, wanted: Option<usize>) -> DriverResult<Reply> {
        let Ok(mut page) = serde_json::from_slice::<Value>(&reply.body) else {
            return Ok(reply);
        };
        let Some(last) = reply.headers.get_optional_str(&ETAG).and_then(formats::cursor_lsn) else {
            return Ok(reply);
        };
        let rid = page.get("_rid").and_then(Value::as_str).unwrap_or_default().to_owned();
        let Some(items) = page.get_mut("Documents").and_then(Value::as_array_mut) else {
            return Ok(reply);
        };
        let mut lsns = self.item_lsns(request, &rid, items, last).await;
        if let Some(wanted) = wanted
            && items.len() > wanted
        {
            if lsns[wanted - 1] == lsns[wanted] {
                // A transactional batch goes on past the page: the service never cuts one LSN.
                let etag = reply.headers.get_optional_string(&ETAG).unwrap_or_default();
                let cursor = self.rest_of_lsn(request, etag, lsns[wanted], items, &mut lsns).await?;
                reply.headers.insert(ETAG, cursor);
            } else {
                items.truncate(wanted);
                lsns.truncate(wanted);
                reply.headers.insert(ETAG, formats::cursor_after(lsns[wanted - 1]));
            }
        }
        for (item, lsn) in items.iter_mut().zip(&lsns) {
            formats::stamp_lsn(item, *lsn);
        }
        let count = items.len();
        page["_count"] = count.into();
        reply.headers.insert(ITEM_COUNT, count.to_string());
        reply.body = Bytes::from(serde_json::to_vec(&page).unwrap_or_default());
        Ok(reply)
    }

    /// Appends the documents of LSN `lsn` that follow the emulator cursor `etag`, one by one;
    /// returns the cursor after the last of them.
    async fn rest_of_lsn(
        &self,
        request: &Request,
        mut etag: String,
        lsn: u64,
        items: &mut Vec<Value>,
        lsns: &mut Vec<u64>,
    ) -> DriverResult<String> {
        loop {
            let mut next = request.clone();
            next.insert_header(IF_NONE_MATCH, etag.clone());
            next.insert_header(MAX_ITEM_COUNT, "1");
            let reply = self.send(&next).await?;
            let cursor = reply.headers.get_optional_string(&ETAG).unwrap_or_default();
            let item = serde_json::from_slice::<Value>(&reply.body)
                .ok()
                .and_then(|mut page| page.get_mut("Documents")?.as_array_mut()?.pop());
            match item {
                Some(item) if reply.status == StatusCode::Ok && formats::cursor_lsn(&cursor) == Some(lsn) => {
                    items.push(item);
                    lsns.push(lsn);
                    etag = cursor;
                }
                _ => return Ok(etag),
            }
        }
    }

    /// The LSN of every item of a page whose last item has LSN `last`: the others are looked up
    /// with point reads (`x-ms-item-lsn`) of the same version of each document.
    async fn item_lsns(&self, request: &Request, rid: &str, items: &[Value], last: u64) -> Vec<u64> {
        let Some((_, earlier)) = items.split_last() else {
            return Vec::new();
        };
        let mut known: Vec<Option<u64>> = Vec::with_capacity(items.len());
        let paths = match earlier.is_empty() {
            true => None,
            false => self.partition_key_paths(request, rid).await,
        };
        for item in earlier {
            let lsn = match &paths {
                Some(paths) => self.item_lsn(request, paths, formats::document_of(item)).await,
                None => None,
            };
            known.push(lsn);
        }
        known.push(Some(last));
        formats::fill_unknown(&known, last)
    }

    /// The LSN of `document` as it is in the page: `None` when it cannot be read or has changed.
    async fn item_lsn(&self, request: &Request, paths: &[String], document: &Value) -> Option<u64> {
        let id = document.get("id")?.as_str()?;
        let mut url = request.url().clone();
        url.set_query(None);
        url.path_segments_mut().ok()?.pop_if_empty().push(id);
        let mut read = Request::new(url, Method::Get);
        copy_header(request, &mut read, "x-ms-version");
        read.insert_header(
            "x-ms-documentdb-partitionkey",
            formats::partition_key_header(document, paths)?,
        );
        let reply = self.send(&read).await.ok()?;
        let body: Value = serde_json::from_slice(&reply.body).ok()?;
        (reply.status == StatusCode::Ok && body.get("_etag") == document.get("_etag"))
            .then(|| reply.headers.get_optional_str(&ITEM_LSN)?.parse().ok())
            .flatten()
    }

    /// The partition key paths of the container a change feed request reads.
    async fn partition_key_paths(&self, request: &Request, rid: &str) -> Option<Arc<Vec<String>>> {
        let container = request
            .url()
            .path()
            .trim_end_matches('/')
            .strip_suffix("/docs")?
            .to_owned();
        let key = format!("{container}|{rid}");
        if let Some(paths) = self.cached_paths(&key) {
            return Some(paths);
        }
        let mut url = request.url().clone();
        url.set_query(None);
        url.set_path(&container);
        let mut read = Request::new(url, Method::Get);
        copy_header(request, &mut read, "x-ms-version");
        let reply = self.send(&read).await.ok()?;
        let body: Value = serde_json::from_slice(&reply.body).ok()?;
        let paths: Vec<String> = body
            .pointer("/partitionKey/paths")?
            .as_array()?
            .iter()
            .filter_map(|p| p.as_str().map(str::to_owned))
            .collect();
        let paths = Arc::new(paths);
        self.partition_keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key, paths.clone());
        Some(paths)
    }

    fn cached_paths(&self, key: &str) -> Option<Arc<Vec<String>>> {
        self.partition_keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .cloned()
    }
}

/// A change feed answer as a region that has its range up to LSN `limit` gives it: the documents
/// after that held back (none left: 304), the continuation, the `lsn` header and the session
/// token no further than `limit` — unless the reader's own continuation, `requested`, is.
fn hold_back(reply: &mut Reply, limit: u64, requested: Option<u64>) {
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
fn container_of(request: &Request) -> String {
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
fn copy_header(from: &Request, to: &mut Request, name: &'static str) {
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
