//! Change feed reads at the edge: the client's continuation and page size in the SDK emulator's
//! terms, the page in the service's — each document's `_lsn` (looked up with point reads of the
//! same version), pages never cut inside one LSN, and, on a merged partition, the service's
//! numbering ([`super::lsn_map`]).

use std::sync::Arc;

use azure_core::http::{Method, Request, StatusCode};
use bytes::Bytes;
use serde_json::Value;

use super::edge::{
    ETAG, Edge, IF_NONE_MATCH, ITEM_COUNT, ITEM_LSN, MAX_ITEM_COUNT, RANGE_ID, Reply, SESSION_TOKEN, copy_header,
    hold_back, outbound,
};
use super::formats;
use super::lsn_map::{LsnMap, RangeMaps};

type DriverResult<T> = azure_data_cosmos_driver::error::Result<T>;

/// A change feed page before a lagging region holds any of it back.
pub(super) struct Page {
    /// The answer.
    pub(super) reply: Reply,
    /// The service LSN the read continued from (`None`: the beginning or now).
    pub(super) requested: Option<u64>,
}

impl Edge {
    /// A change feed read: the client's continuation and page size in the emulator's terms, the
    /// answer in the service's.
    pub(super) async fn change_feed(&self, request: Request, maps: Option<&RangeMaps>) -> DriverResult<Reply> {
        let read = request.clone();
        let page = self.change_feed_page(request, maps).await?;
        Ok(self.as_served(page.reply, &read, maps, page.requested))
    }

    /// A change feed page as the region that takes writes answers it (a lagging region holds
    /// back some of it: [`Self::as_served`]), its items and ETag in the service's numbering.
    pub(super) async fn change_feed_page(&self, mut request: Request, maps: Option<&RangeMaps>) -> DriverResult<Page> {
        let if_none_match = request.headers().get_optional_string(&IF_NONE_MATCH);
        let mut requested = if_none_match.as_deref().and_then(formats::service_lsn);
        let map = request
            .headers()
            .get_optional_string(&RANGE_ID)
            .and_then(|range| maps?.get(&range).cloned())
            .unwrap_or_default();
        let wanted = request
            .headers()
            .get_optional_str(&MAX_ITEM_COUNT)
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|n| *n > 0);
        if (if_none_match.is_none() || requested.is_some()) && map.resumes_before_merge(requested) {
            if let Some(reply) = self.carried_reply(&request, &map, requested, wanted).await? {
                return Ok(Page { reply, requested });
            }
            // Nothing carried is left to read: on from the merge.
            requested = Some(map.service_base());
        }
        if let Some(lsn) = requested {
            request.insert_header(IF_NONE_MATCH, formats::cursor_after(map.emulator(lsn)));
        }
        if let Some(wanted) = wanted {
            // One more than asked: whether the page would cut one LSN's documents apart.
            request.insert_header(MAX_ITEM_COUNT, (wanted + 1).to_string());
        }
        let mut reply = self.send(&request).await?;
        if reply.status == StatusCode::Ok {
            reply = self.service_page(&request, reply, wanted, &map).await?;
        }
        if let Some(lsn) = reply.headers.get_optional_str(&ETAG).and_then(formats::cursor_lsn) {
            reply.headers.insert(ETAG, formats::quoted(map.partition(lsn)));
        }
        Ok(Page { reply, requested })
    }

    /// A change feed answer's session token and LSN in the service's terms, and what the
    /// region read has of them.
    fn as_served(
        &self,
        mut reply: Reply,
        request: &Request,
        maps: Option<&RangeMaps>,
        requested: Option<u64>,
    ) -> Reply {
        let range = reply.headers.get_optional_string(&RANGE_ID);
        if let (Some(range), Some(token)) = (range, reply.headers.get_optional_string(&SESSION_TOKEN)) {
            reply
                .headers
                .insert(SESSION_TOKEN, formats::range_session_token(&token, &range));
        }
        if let Some(maps) = maps {
            outbound(&mut reply, maps);
        }
        if let Some(limit) = self.visible_limit(request) {
            hold_back(&mut reply, limit, requested);
        }
        reply
    }

    /// A page of changes as the service sends it: each document's `_lsn`, at most `wanted`
    /// documents unless one LSN's documents go on past them, the ETag the emulator's cursor
    /// after the last document kept.
    async fn service_page(
        &self,
        request: &Request,
        mut reply: Reply,
        wanted: Option<usize>,
        map: &LsnMap,
    ) -> DriverResult<Reply> {
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
            let etag = formats::document_of(item).get("_etag").and_then(Value::as_str);
            let lsn = map.document(*lsn, etag);
            formats::stamp_lsn(item, lsn);
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
