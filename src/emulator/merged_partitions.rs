//! Splits and merges at the edge, so that the service's LSNs survive them: a merge reads both
//! parents' feeds (their documents' service LSNs) with every other request held at the gate,
//! locks the parents, and installs the merged partition's [`LsnMap`]; a split's children keep
//! their parent's map. Reads of a merged partition from before the merge point get the versions
//! carried over from the parents, in the parents' LSN order ([`lsn_map::carried_page`]).

use std::collections::HashMap;
use std::time::Duration;

use azure_core::http::{Method, Request, StatusCode, Url};
use azure_data_cosmos_driver::in_memory_emulator::{Epk, ManualControlPlaneResult};
use bytes::Bytes;
use serde_json::Value;

use super::edge::{ETAG, Edge, IF_NONE_MATCH, ITEM_COUNT, LSN, MAX_ITEM_COUNT, RANGE_ID, Reply};
use super::formats;
use super::lsn_map::{self, LsnMap};

type DriverResult<T> = azure_data_cosmos_driver::error::Result<T>;

/// Documents the emulator is asked for per page while a partition is read whole.
const WHOLE_READ_PAGE: &str = "1000";

/// What a merge or split of the edge could not do.
#[derive(Debug, thiserror::Error)]
pub enum TransitionError {
    /// The emulator refused or failed the operation.
    #[error("{0}")]
    Emulator(#[from] azure_data_cosmos_driver::error::CosmosError),
    /// A parent's feed could not be read before the merge.
    #[error("reading partition {partition} before the merge answered {status}")]
    Unreadable {
        /// The partition read.
        partition: u32,
        /// What the emulator answered.
        status: StatusCode,
    },
    /// The emulator completed something else than was asked.
    #[error("the emulator completed another operation than the {0} asked")]
    Unexpected(&'static str),
}

/// A parent partition as a merge carries it over: its versions' service LSNs and its own.
struct Parent {
    versions: HashMap<String, u64>,
    lsn: u64,
}

impl Edge {
    /// Merges partitions `ids` of `database`/`container` after `lock` (requests to them answer
    /// 410 meanwhile, as on the service); the merged partition's id. `store` is the address
    /// requests to the store are made at.
    pub(super) async fn merge(
        &self,
        store: &Url,
        database: &str,
        container: &str,
        ids: [u32; 2],
        lock: Duration,
    ) -> Result<u32, TransitionError> {
        let _one_at_a_time = self.transitions.lock().await;
        let gate = self.gate.write().await;
        let path = format!("dbs/{database}/colls/{container}");
        let mut carried = HashMap::new();
        let mut service_base = 0;
        for id in ids {
            let parent = self.parent(store, &path, id).await?;
            carried.extend(parent.versions);
            service_base = service_base.max(parent.lsn);
        }
        let operation = self
            .client
            .store()
            .begin_manual_merge_partitions(database, container, ids[0], ids[1])?;
        drop(gate);
        tokio::time::sleep(lock).await;
        let _gate = self.gate.write().await;
        let ManualControlPlaneResult::Merge(child) = operation.complete().await? else {
            return Err(TransitionError::Unexpected("merge"));
        };
        let base = self.partition_lsn(store, &path, child).await?;
        self.merged
            .install(&path, &child.to_string(), LsnMap::merged(carried, base, service_base));
        Ok(child)
    }

    /// Splits partition `id` of `database`/`container` at `at` after `lock`; the children's ids.
    pub(super) async fn split(
        &self,
        database: &str,
        container: &str,
        id: u32,
        at: Epk,
        lock: Duration,
    ) -> Result<[u32; 2], TransitionError> {
        let _one_at_a_time = self.transitions.lock().await;
        let operation = self
            .client
            .store()
            .begin_manual_split_partition(database, container, id, at)?;
        tokio::time::sleep(lock).await;
        let _gate = self.gate.write().await;
        let ManualControlPlaneResult::Split(children) = operation.complete().await? else {
            return Err(TransitionError::Unexpected("split"));
        };
        let path = format!("dbs/{database}/colls/{container}");
        let map = self.merged.range(&path, &id.to_string());
        for child in children {
            self.merged.install(&path, &child.to_string(), map.clone());
        }
        Ok(children)
    }

    /// Every version of partition `id` with its service LSN, and the partition's, read through
    /// the edge's own change feed (so a parent that was itself merged answers in its map).
    async fn parent(&self, store: &Url, container: &str, id: u32) -> Result<Parent, TransitionError> {
        let maps = self.merged.of(container);
        let mut versions = HashMap::new();
        let mut continuation = None;
        loop {
            let mut read = feed_request(store, container, id);
            if let Some(at) = &continuation {
                read.insert_header(IF_NONE_MATCH, formats::quoted(*at));
            }
            // As the write region has them: a lagging region's view would miss versions.
            let reply = self.change_feed_page(read, maps.as_deref()).await?.reply;
            let etag = reply.headers.get_optional_str(&ETAG).and_then(formats::service_lsn);
            match reply.status {
                StatusCode::Ok => versions.extend(page_versions(&reply.body)),
                StatusCode::NotModified => break,
                status => return Err(TransitionError::Unreadable { partition: id, status }),
            }
            continuation = etag;
        }
        let map = self.merged.range(container, &id.to_string());
        let lsn = map.partition(self.partition_lsn(store, container, id).await?);
        Ok(Parent { versions, lsn })
    }

    /// The emulator's current LSN of partition `id`.
    async fn partition_lsn(&self, store: &Url, container: &str, id: u32) -> Result<u64, TransitionError> {
        let mut now = feed_request(store, container, id);
        now.insert_header(IF_NONE_MATCH, "*");
        let reply = self.send(&now).await?;
        let lsn = reply.headers.get_optional_str(&LSN).and_then(|l| l.parse().ok());
        let cursor = || reply.headers.get_optional_str(&ETAG).and_then(formats::cursor_lsn);
        lsn.or_else(cursor).ok_or(TransitionError::Unreadable {
            partition: id,
            status: reply.status,
        })
    }

    /// The page of a merged partition's carried versions after service LSN `after` (`None`:
    /// the beginning) that a change feed request gets; the emulator's answer when it refused
    /// the read; `None` when no carried version is left to read.
    pub(super) async fn carried_reply(
        &self,
        request: &Request,
        map: &LsnMap,
        after: Option<u64>,
        wanted: Option<usize>,
    ) -> DriverResult<Option<Reply>> {
        let mut items = Vec::new();
        let mut rid = String::new();
        let mut read = request.clone();
        read.insert_header(MAX_ITEM_COUNT, WHOLE_READ_PAGE);
        read.insert_header(IF_NONE_MATCH, formats::cursor_after(0));
        let mut reply = loop {
            let reply = self.send(&read).await?;
            if reply.status != StatusCode::Ok {
                break reply;
            }
            let cursor = reply.headers.get_optional_string(&ETAG).unwrap_or_default();
            let mut page: Value = serde_json::from_slice(&reply.body).unwrap_or_default();
            if let Some(named) = page.get("_rid").and_then(Value::as_str) {
                named.clone_into(&mut rid);
            }
            if let Some(documents) = page.get_mut("Documents").and_then(Value::as_array_mut) {
                items.append(documents);
            }
            // Versions carried over have LSNs up to the merged partition's first.
            if formats::cursor_lsn(&cursor).is_none_or(|lsn| lsn >= map.base()) {
                break reply;
            }
            read.insert_header(IF_NONE_MATCH, cursor);
        };
        if !matches!(reply.status, StatusCode::Ok | StatusCode::NotModified) {
            return Ok(Some(reply));
        }
        let Some(page) = lsn_map::carried_page(map, items, after, wanted) else {
            return Ok(None);
        };
        let count = page.items.len();
        let body = serde_json::json!({"_rid": rid, "Documents": page.items, "_count": count});
        reply.status = StatusCode::Ok;
        reply.body = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
        reply.headers.insert(ETAG, formats::quoted(page.last));
        reply.headers.insert(ITEM_COUNT, count.to_string());
        Ok(Some(reply))
    }
}

/// A latest-version change feed read of partition `id` of `container`, from the beginning.
fn feed_request(store: &Url, container: &str, id: u32) -> Request {
    let mut url = store.clone();
    url.set_path(&format!("{container}/docs"));
    let mut request = Request::new(url, Method::Get);
    request.insert_header("x-ms-version", "2020-07-15");
    request.insert_header("a-im", "Incremental feed");
    request.insert_header(RANGE_ID, id.to_string());
    request.insert_header(MAX_ITEM_COUNT, WHOLE_READ_PAGE);
    request
}

/// The `_etag` and service LSN of every document of a change feed page.
fn page_versions(body: &[u8]) -> Vec<(String, u64)> {
    let page: Value = serde_json::from_slice(body).unwrap_or_default();
    page.get("Documents")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|item| {
            let etag = formats::document_of(item).get("_etag")?.as_str()?;
            Some((etag.to_owned(), formats::item_lsn(item)?))
        })
        .collect()
}
