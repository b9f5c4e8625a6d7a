//! The one door to the SDK's in-memory emulator: every request of `cfp emulator`'s HTTP face and
//! of in-process clients passes through [`Edge::execute`], which answers change feed reads in
//! the service's formats ([`super::formats`]): `_lsn` on every document, quoted-LSN ETags (and
//! quoted LSNs accepted as `If-None-Match`), `x-ms-max-item-count` without cutting one LSN's
//! documents apart, and the session token of the range read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use azure_core::http::headers::{HeaderName, Headers};
use azure_core::http::{Method, Request, StatusCode};
use azure_data_cosmos_driver::in_memory_emulator::InMemoryEmulatorHttpClient;
use bytes::Bytes;
use serde_json::Value;

use super::formats;

type DriverResult<T> = azure_data_cosmos_driver::error::Result<T>;

const IF_NONE_MATCH: HeaderName = HeaderName::from_static("if-none-match");
const MAX_ITEM_COUNT: HeaderName = HeaderName::from_static("x-ms-max-item-count");
const ETAG: HeaderName = HeaderName::from_static("etag");
const SESSION_TOKEN: HeaderName = HeaderName::from_static("x-ms-session-token");
const RANGE_ID: HeaderName = HeaderName::from_static("x-ms-documentdb-partitionkeyrangeid");
const ITEM_COUNT: HeaderName = HeaderName::from_static("x-ms-item-count");
const ITEM_LSN: HeaderName = HeaderName::from_static("x-ms-item-lsn");
const CONTENT_LENGTH: HeaderName = HeaderName::from_static("content-length");

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
}

impl Edge {
    /// The edge of `client`.
    pub fn new(client: Arc<InMemoryEmulatorHttpClient>) -> Self {
        Self {
            client,
            partition_keys: Mutex::default(),
        }
    }

    /// Serves one request as the service would.
    pub async fn execute(&self, request: Request) -> DriverResult<Reply> {
        let change_feed = request.method() == Method::Get
            && request
                .headers()
                .get_optional_str(&HeaderName::from_static("a-im"))
                .is_some()
            && request.url().path().trim_end_matches('/').ends_with("/docs");
        if change_feed {
            self.change_feed(request).await
        } else {
            self.send(&request).await
        }
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

/// Copies header `name` of `from` to `to` (the API version, which the emulator expects).
fn copy_header(from: &Request, to: &mut Request, name: &'static str) {
    let value = from
        .headers()
        .get_optional_string(&HeaderName::from_static(name))
        .unwrap_or_else(|| "2020-07-15".to_owned());
    to.insert_header(name, value);
}
