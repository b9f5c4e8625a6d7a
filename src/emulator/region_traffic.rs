//! What each region answered over HTTP, as `GET /_emulator/regions` reports it: the reads it
//! served and, by container, the document writes it took and those it refused with 403 (a
//! region that takes no writes). A test sees there where a client's writes went — the lease
//! writes of the workers after a failover, say — rather than assuming it.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Serialize;

/// The document writes of one container in one region.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteCounts {
    /// Writes the region took (answered 2xx).
    pub accepted: u64,
    /// Writes the region refused with 403 (it takes no writes, or not yet).
    pub refused: u64,
}

/// What one region answered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Traffic {
    /// Reads it answered: point reads, change feed reads, listings and queries.
    pub reads: u64,
    /// Document writes (creates, replaces, upserts, patches, deletes) by container,
    /// `database/container`.
    pub writes: BTreeMap<String, WriteCounts>,
}

/// The traffic of every region, by region name.
#[derive(Debug, Default)]
pub struct RegionTraffic {
    regions: Mutex<BTreeMap<String, Traffic>>,
}

impl RegionTraffic {
    /// Counts one request region `region` answered with `status`: a read, or a write to the
    /// resource at `path` (`dbs/db/colls/c/docs/...`; writes to anything but documents are not
    /// counted, nor are answers other than 2xx and 403).
    pub fn record(&self, region: &str, read: bool, path: &str, status: u16) {
        let mut regions = self.regions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let traffic = regions.entry(region.to_owned()).or_default();
        if read {
            traffic.reads += 1;
            return;
        }
        let Some(container) = document_container(path) else {
            return;
        };
        let counts = traffic.writes.entry(container).or_default();
        match status {
            200..=299 => counts.accepted += 1,
            403 => counts.refused += 1,
            _ => {}
        }
    }

    /// What region `region` answered so far.
    pub fn of(&self, region: &str) -> Traffic {
        self.regions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(region)
            .cloned()
            .unwrap_or_default()
    }
}

/// `database/container` of a path to a container's documents (`dbs/db/colls/c/docs[/id]`).
fn document_container(path: &str) -> Option<String> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["dbs", database, "colls", container, "docs", ..] => Some(format!("{database}/{container}")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_counted_by_container_and_answer() {
        let traffic = RegionTraffic::default();
        traffic.record("East US", false, "dbs/db/colls/leases/docs/x", 200);
        traffic.record("East US", false, "/dbs/db/colls/leases/docs", 201);
        traffic.record("East US", false, "dbs/db/colls/leases/docs/x", 403);
        traffic.record("East US", false, "dbs/db/colls/leases/docs/x", 412);
        traffic.record("East US", false, "dbs/db/colls", 201);
        traffic.record("East US", true, "dbs/db/colls/items/docs", 304);
        traffic.record("West US", false, "dbs/db/colls/items/docs", 201);
        let east = traffic.of("East US");
        assert_eq!(east.reads, 1);
        assert_eq!(
            east.writes,
            BTreeMap::from([(
                "db/leases".to_owned(),
                WriteCounts {
                    accepted: 2,
                    refused: 1
                }
            )])
        );
        assert_eq!(traffic.of("West US").writes["db/items"].accepted, 1);
        assert_eq!(traffic.of("Nowhere"), Traffic::default());
    }
}
