//! The service's LSNs of a partition the SDK emulator numbered anew at a merge, and the pure
//! translations between the two numberings (the requests that use them live in
//! [`super::edge`] and [`super::transitions`]).
//!
//! On the service a merged partition's LSNs go on above both parents' and every document keeps
//! the LSN it was written at, so a continuation taken on a parent resumes on the merged
//! partition where it stopped. The SDK emulator instead numbers the merged partition's
//! documents 1..=N (`execute_merge`) and goes on from N. An [`LsnMap`] remembers, for one
//! merged partition (and the children of its splits, which keep its numbering), the service
//! LSN of every document version it took from its parents (by `_etag`, which a version keeps)
//! and where its new writes start.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;

use super::formats;

/// How one partition's emulator LSNs read on the service. The default is the identity (a
/// partition no merge made).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LsnMap {
    /// The service LSN of each document version carried over from the parents, by `_etag`.
    carried: Arc<HashMap<String, u64>>,
    /// The emulator's LSN of the merged partition when it was made: later writes come after it.
    base: u64,
    /// The service LSN the merged partition went on from: the highest of its parents'.
    service_base: u64,
}

impl LsnMap {
    /// The map of a partition merged from parents whose documents had the service LSNs
    /// `carried` and whose highest LSN was `service_base`; the emulator numbered the merged
    /// partition up to `base`.
    pub fn merged(carried: HashMap<String, u64>, base: u64, service_base: u64) -> Self {
        Self {
            carried: Arc::new(carried),
            base,
            service_base,
        }
    }

    /// Whether this is the identity (no merge made the partition).
    pub fn is_identity(&self) -> bool {
        self.base == 0 && self.service_base == 0 && self.carried.is_empty()
    }

    /// The emulator's LSN of the merged partition when it was made (0 for the identity).
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The service LSN the merged partition went on from (0 for the identity).
    pub fn service_base(&self) -> u64 {
        self.service_base
    }

    /// The service LSN of the partition's emulator LSN `lsn` (its current LSN, a write's, or
    /// a continuation's): the service base up to the merge, increasing with every write after.
    pub fn partition(&self, lsn: u64) -> u64 {
        match lsn.checked_sub(self.base) {
            Some(after) if lsn > self.base => self.service_base + after,
            _ if self.is_identity() => lsn,
            _ => self.service_base,
        }
    }

    /// The service LSN of a document version the emulator stamped `lsn`, whose `_etag` is `etag`.
    pub fn document(&self, lsn: u64, etag: Option<&str>) -> u64 {
        if lsn > self.base || self.is_identity() {
            return self.partition(lsn);
        }
        etag.and_then(|e| self.carried.get(e).copied())
            .unwrap_or(self.service_base)
    }

    /// The service LSN of a version carried over from the parents; `None` for a later one.
    pub fn carried(&self, etag: &str) -> Option<u64> {
        self.carried.get(etag).copied()
    }

    /// The emulator LSN at or before which every change up to service LSN `lsn` lies (session
    /// tokens; continuations at or after the merge).
    pub fn emulator(&self, lsn: u64) -> u64 {
        match lsn.checked_sub(self.service_base) {
            _ if self.is_identity() => lsn,
            Some(after) => self.base + after,
            None => lsn.min(self.base),
        }
    }

    /// Whether a continuation at service LSN `lsn` (`None`: the beginning) still has carried
    /// versions to read: before the merge, in the parents' numbering.
    pub fn resumes_before_merge(&self, lsn: Option<u64>) -> bool {
        !self.is_identity() && lsn.is_none_or(|lsn| lsn < self.service_base)
    }
}

/// The maps of one container's merged partitions (and their splits' children), by range id.
pub type RangeMaps = HashMap<String, LsnMap>;

/// The maps of every container's merged partitions, by container path (`dbs/db/colls/c`).
#[derive(Debug, Default)]
pub struct MergedRanges {
    by_container: Mutex<HashMap<String, Arc<RangeMaps>>>,
}

impl MergedRanges {
    /// The maps of `container`'s ranges; `None` while none of its partitions was merged.
    pub fn of(&self, container: &str) -> Option<Arc<RangeMaps>> {
        self.by_container
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(container)
            .cloned()
    }

    /// The map of one range (the identity for a range no merge made).
    pub fn range(&self, container: &str, range: &str) -> LsnMap {
        self.of(container)
            .and_then(|maps| maps.get(range).cloned())
            .unwrap_or_default()
    }

    /// Installs the map of `range` of `container` (an identity map is not kept).
    pub fn install(&self, container: &str, range: &str, map: LsnMap) {
        if map.is_identity() {
            return;
        }
        let mut all = self.by_container.lock().unwrap_or_else(PoisonError::into_inner);
        let mut maps = all.get(container).map(|m| RangeMaps::clone(m)).unwrap_or_default();
        maps.insert(range.to_owned(), map);
        all.insert(container.to_owned(), Arc::new(maps));
    }
}

/// A client's session token in the emulator's numbering (the emulator refuses a read whose
/// token names an LSN its partition has not reached).
pub fn inbound_session(token: &str, maps: &RangeMaps) -> String {
    map_session_lsns(token, |range, lsn| maps.get(range).map_or(lsn, |m| m.emulator(lsn)))
}

/// The emulator's session token in the service's numbering.
pub fn outbound_session(token: &str, maps: &RangeMaps) -> String {
    map_session_lsns(token, |range, lsn| maps.get(range).map_or(lsn, |m| m.partition(lsn)))
}

/// The carried versions of a page read before the merge point, as the service answers them.
#[derive(Debug, Clone, PartialEq)]
pub struct CarriedPage {
    /// The documents, each stamped with its service LSN, in LSN order.
    pub items: Vec<Value>,
    /// The service LSN of the last one (the page's continuation).
    pub last: u64,
}

/// The page the service answers a read from service LSN `after` with, out of `items` (every
/// document of the range the emulator has, in any order): the versions carried over from the
/// parents with a later LSN, in LSN order, at most `wanted` unless one LSN's versions go on
/// past them. `None` when no carried version comes after `after`.
pub fn carried_page(map: &LsnMap, items: Vec<Value>, after: Option<u64>, wanted: Option<usize>) -> Option<CarriedPage> {
    let mut carried: Vec<(u64, Value)> = items
        .into_iter()
        .filter_map(|item| {
            let etag = formats::document_of(&item).get("_etag")?.as_str()?;
            let lsn = map.carried(etag)?;
            after.is_none_or(|after| lsn > after).then_some((lsn, item))
        })
        .collect();
    carried.sort_by_key(|(lsn, _)| *lsn);
    if let Some(wanted) = wanted.filter(|w| *w > 0)
        && carried.len() > wanted
    {
        let cut = carried[wanted - 1].0;
        let keep = wanted + carried[wanted..].iter().take_while(|(lsn, _)| *lsn == cut).count();
        carried.truncate(keep);
    }
    let last = carried.last()?.0;
    let items = carried
        .into_iter()
        .map(|(lsn, mut item)| {
            formats::stamp_lsn(&mut item, lsn);
            item
        })
        .collect();
    Some(CarriedPage { items, last })
}

/// A session token (`1:0#12#0=12,2:0#8#0=8`, or the older `1:12`) with the global LSN of each
/// part translated by `lsn(range, global LSN)`.
pub fn map_session_lsns(token: &str, lsn: impl Fn(&str, u64) -> u64) -> String {
    token
        .split(',')
        .map(|part| {
            let part = part.trim();
            let Some((range, rest)) = part.split_once(':') else {
                return part.to_owned();
            };
            let mut segments: Vec<String> = rest.split('#').map(str::to_owned).collect();
            let at = usize::from(segments.len() > 1);
            if let Some(global) = segments.get(at).and_then(|s| s.parse::<u64>().ok()) {
                segments[at] = lsn(range, global).to_string();
            }
            format!("{range}:{}", segments.join("#"))
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Parents' versions a (LSN 40), b (70), c (70), d (90); the emulator renumbered them 1..=4.
    fn map() -> LsnMap {
        let carried = [("a", 40), ("b", 70), ("c", 70), ("d", 90)]
            .map(|(etag, lsn)| (etag.to_owned(), lsn))
            .into();
        LsnMap::merged(carried, 4, 95)
    }

    fn item(etag: &str) -> Value {
        json!({"id": etag, "_etag": etag})
    }

    #[test]
    fn the_identity_maps_every_lsn_to_itself() {
        let identity = LsnMap::default();
        assert!(identity.is_identity());
        assert_eq!(
            (
                identity.partition(7),
                identity.document(7, Some("x")),
                identity.emulator(7)
            ),
            (7, 7, 7)
        );
        assert!(!identity.resumes_before_merge(None));
    }

    #[test]
    fn a_merged_partition_goes_on_above_both_parents() {
        let map = map();
        assert_eq!(
            map.partition(4),
            95,
            "the merged partition starts at the parents' highest"
        );
        assert_eq!(map.partition(5), 96);
        assert_eq!(map.document(2, Some("b")), 70, "a carried version keeps its LSN");
        assert_eq!(map.document(6, Some("b")), 97, "a later write goes on from the base");
        assert_eq!((map.emulator(95), map.emulator(97)), (4, 6));
        assert_eq!(
            map.emulator(3),
            3,
            "a session before the merge needs no more than the base"
        );
        assert_eq!(map.emulator(60), 4);
        assert_eq!(
            map.emulator(95),
            4,
            "the merge point is the merged partition's first LSN"
        );
        for lsn in 0..200 {
            assert!(map.emulator(lsn) <= map.emulator(lsn + 1), "monotonic at {lsn}");
            if lsn >= 4 {
                assert_eq!(map.emulator(map.partition(lsn)), lsn);
            }
        }
        assert!(map.resumes_before_merge(Some(94)) && map.resumes_before_merge(None));
        assert!(!map.resumes_before_merge(Some(95)));
    }

    #[test]
    fn a_read_before_the_merge_point_gets_the_later_carried_versions_in_lsn_order() {
        let map = map();
        let items = vec![item("d"), item("b"), item("new"), item("a"), item("c")];
        let page = carried_page(&map, items.clone(), Some(40), None).unwrap();
        let ids: Vec<&str> = page.items.iter().map(|i| i["id"].as_str().unwrap()).collect();
        assert_eq!((ids, page.last), (vec!["b", "c", "d"], 90));
        assert_eq!(page.items[0]["_lsn"], 70);
        // A page never cuts one LSN's versions apart.
        let page = carried_page(&map, items.clone(), Some(40), Some(1)).unwrap();
        assert_eq!((page.items.len(), page.last), (2, 70));
        let page = carried_page(&map, items.clone(), None, Some(1)).unwrap();
        assert_eq!((page.items.len(), page.last), (1, 40));
        assert_eq!(carried_page(&map, items, Some(90), None), None);
    }

    #[test]
    fn session_tokens_translate_each_ranges_global_lsn() {
        let token = "3:1#4#0=9,1:0#12#0=12,2:7";
        let mapped = map_session_lsns(token, |range, lsn| if range == "3" { lsn + 91 } else { lsn });
        assert_eq!(mapped, "3:1#95#0=9,1:0#12#0=12,2:7");
        assert_eq!(map_session_lsns("2:7", |_, lsn| lsn * 2), "2:14");
    }
}
