//! A container's physical partitions as the control API sees and changes them: listing, splits
//! and merges (`/_emulator/ranges`, `/_emulator/split`, `/_emulator/merge`).

use std::time::Duration;

use serde::Deserialize;

use super::{Emulator, EmulatorError, PhysicalPartition};
use crate::cosmos::{CosmosError, EpkRange};

impl Emulator {
    /// The physical partitions of a container, sorted by EPK.
    pub async fn partitions(&self, database: &str, container: &str) -> Result<Vec<PhysicalPartition>, EmulatorError> {
        let (status, body) = self.get(&format!("dbs/{database}/colls/{container}/pkranges")).await?;
        if status == 404 {
            return Err(EmulatorError::NoSuchContainer(format!("{database}/{container}")));
        }
        #[derive(Deserialize)]
        struct Ranges {
            #[serde(rename = "PartitionKeyRanges")]
            ranges: Vec<RawRange>,
        }
        #[derive(Deserialize)]
        struct RawRange {
            id: String,
            #[serde(rename = "minInclusive")]
            min: String,
            #[serde(rename = "maxExclusive")]
            max: String,
        }
        let parsed: Ranges = serde_json::from_slice(&body).map_err(CosmosError::from)?;
        let mut out: Vec<PhysicalPartition> = parsed
            .ranges
            .into_iter()
            .map(|r| PhysicalPartition {
                id: r.id,
                range: EpkRange::new(r.min, r.max),
            })
            .collect();
        out.sort_by(|a, b| a.range.cmp(&b.range));
        Ok(out)
    }

    /// Splits a physical partition at its midpoint and waits for the split to complete; during
    /// `lock` reads of the partition fail as they do on the service. Returns the partitions after.
    pub async fn split(
        &self,
        database: &str,
        container: &str,
        partition: Option<&str>,
        lock: Duration,
    ) -> Result<Vec<PhysicalPartition>, EmulatorError> {
        let before = self.partitions(database, container).await?;
        let target = match partition {
            Some(id) => before.iter().find(|p| p.id == id),
            None => before.first(),
        }
        .ok_or_else(|| EmulatorError::Split(format!("no partition {partition:?} in {database}/{container}")))?;
        let id: u32 = target
            .id
            .parse()
            .map_err(|_| EmulatorError::Split(format!("partition id {:?} is not numeric", target.id)))?;
        let store = self.client.store();
        let epk = store
            .midpoint_split_epk(database, container, id)
            .map_err(|e| EmulatorError::Split(e.to_string()))?;
        self.edge
            .split(database, container, id, epk, lock)
            .await
            .map_err(|e| EmulatorError::Split(e.to_string()))?;
        self.partitions(database, container).await
    }

    /// Merges two adjacent physical partitions into one, as the service does on an account with
    /// partition merge on, and waits for the merge to complete; during `lock` operations on both
    /// fail as they do on the service (410). Returns the partitions after.
    ///
    /// As on the service, the merged partition's documents keep their LSNs and its new writes
    /// go on above both parents', so a continuation taken on a parent resumes on the merged
    /// partition where it stopped (the edge translates the SDK emulator's numbering, which
    /// starts again at 1: `lsn_map`).
    pub async fn merge(
        &self,
        database: &str,
        container: &str,
        ids: [&str; 2],
        lock: Duration,
    ) -> Result<Vec<PhysicalPartition>, EmulatorError> {
        let before = self.partitions(database, container).await?;
        let [first, second] = ids.map(|id| before.iter().find(|p| p.id == id));
        let (Some(first), Some(second)) = (first, second) else {
            return Err(EmulatorError::BadRequest(format!(
                "partitions {} and {} are not both partitions of {database}/{container} (see /_emulator/ranges: {})",
                ids[0],
                ids[1],
                before.iter().map(|p| p.id.as_str()).collect::<Vec<_>>().join(", ")
            )));
        };
        if first.id == second.id || (first.range.max != second.range.min && second.range.max != first.range.min) {
            return Err(EmulatorError::BadRequest(format!(
                "partitions {} [{}, {}) and {} [{}, {}) are not adjacent: only neighbours merge",
                first.id, first.range.min, first.range.max, second.id, second.range.min, second.range.max
            )));
        }
        let numeric = |p: &PhysicalPartition| {
            p.id.parse::<u32>()
                .map_err(|_| EmulatorError::Merge(format!("partition id {:?} is not numeric", p.id)))
        };
        let (a, b) = (numeric(first)?, numeric(second)?);
        self.edge
            .merge(&self.store_url(), database, container, [a, b], lock)
            .await
            .map_err(|e| EmulatorError::Merge(e.to_string()))?;
        self.partitions(database, container).await
    }
}
