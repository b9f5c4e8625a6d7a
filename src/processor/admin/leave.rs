//! Leaving without lock-in, the mirror of adoption: this processor's checkpoints written as the
//! leases of another processor, so that it starts where ours stopped — nothing read again,
//! nothing skipped. The .NET v3 processor needs no step (our lease documents are its layout,
//! under its prefix convention: start it with the same processor name). The Java v4 processor
//! names its lease prefix by account host, database and container *names*; its
//! partition-key-range leases (`handleChanges`) are named by partition key range id and carry
//! the range's raw continuation — what our version-0 leases hold.

use serde_json::{Value, json};
use time::OffsetDateTime;

use crate::cosmos::{EpkRange, FeedMode, MonitoredContainer};
use crate::processor::leases::bootstrap::partition_id;
use crate::processor::leases::cosmos_store::CosmosLeaseStore;
use crate::processor::leases::lease::{Lease, LeaseStoreError};

/// The lease layouts this processor's checkpoints can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LeaveLayout {
    /// The Java v4 processor's partition-key-range leases (`handleChanges`).
    JavaPk,
}

/// Why the checkpoints could not be written for the other processor.
#[derive(Debug, thiserror::Error)]
pub enum LeaveError {
    /// A lease covers part of a partition, which partition-key-range leases cannot name.
    #[error(
        "lease {lease} covers part of a physical partition (leases.perPartition > 1, or a merge): the Java processor's partition-key-range leases name whole partitions only"
    )]
    SubRange {
        /// The lease's token.
        lease: String,
    },
    /// The processor reads all versions and deletes; the target layout reads latest versions.
    #[error(
        "this processor reads all versions and deletes; the Java processor's handleChanges reads the latest version only"
    )]
    Mode,
    /// The other processor's leases exist already (it ran, or this ran before).
    #[error(
        "the lease container holds leases under {prefix:?} already ({count}): that processor ran; delete them first, or choose another prefix"
    )]
    Exists {
        /// The other processor's lease prefix.
        prefix: String,
        /// How many documents are there.
        count: usize,
    },
    /// Reading or writing the lease container failed.
    #[error(transparent)]
    Store(#[from] LeaseStoreError),
    /// Listing the partition key ranges failed.
    #[error("listing the partition key ranges: {0}")]
    Ranges(#[from] crate::cosmos::CosmosError),
}

/// The Java v4 processor's lease prefix for `lease_prefix` (its `setLeasePrefix`), the account
/// host and the monitored container's database and container names:
/// `{leasePrefix}{host}_{database}_{container}`.
pub fn java_prefix(lease_prefix: &str, host: &str, monitored: &str) -> String {
    let (database, container) = monitored.split_once('/').unwrap_or((monitored, ""));
    format!("{lease_prefix}{host}_{database}_{container}")
}

/// The Java partition-key-range lease documents that carry `leases`' checkpoints, under
/// `prefix` (unowned, as the Java processor's bootstrap writes them); `partitions` are the
/// container's partition key ranges (for leases written before version-0 leases).
pub fn java_pk_documents(
    leases: &[Lease],
    partitions: &[(String, EpkRange)],
    prefix: &str,
    now: OffsetDateTime,
) -> Result<Vec<Value>, LeaveError> {
    let stamp = now
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    leases
        .iter()
        .map(|lease| {
            let id = if lease.names_a_partition() {
                Some(lease.lease_token.as_str())
            } else {
                lease.range().and_then(|range| partition_id(partitions, range))
            };
            let id = id.ok_or_else(|| LeaveError::SubRange {
                lease: lease.lease_token.clone(),
            })?;
            Ok(json!({
                "id": format!("{prefix}..{id}"),
                "LeaseToken": id,
                "Owner": "",
                "ContinuationToken": lease.continuation,
                "timestamp": stamp,
                "properties": {},
            }))
        })
        .collect()
}

/// What [`leave`] wrote.
#[derive(Debug, Clone)]
pub struct Left {
    /// The other processor's lease prefix.
    pub prefix: String,
    /// The documents written (or, with a dry run, to write).
    pub documents: Vec<Value>,
    /// Leases without a checkpoint (the other processor starts them as it is configured to).
    pub without_checkpoint: usize,
}

/// Writes the checkpoints in `leases` (this processor's, read while none of its instances
/// runs) as `layout` leases under `lease_prefix` in the same lease container.
pub async fn leave(
    store: &CosmosLeaseStore,
    monitored: &MonitoredContainer,
    leases: &[Lease],
    (layout, lease_prefix, host): (LeaveLayout, &str, &str),
    dry_run: bool,
) -> Result<Left, LeaveError> {
    let LeaveLayout::JavaPk = layout;
    if leases
        .iter()
        .any(|l| FeedMode::of_lease(l.mode.as_deref()) != FeedMode::LatestVersion)
    {
        return Err(LeaveError::Mode);
    }
    let prefix = java_prefix(lease_prefix, host, monitored.name());
    let existing = store.count_with_prefix(&format!("{prefix}..")).await?;
    if existing > 0 {
        return Err(LeaveError::Exists {
            prefix,
            count: existing,
        });
    }
    let partitions = if leases.iter().all(Lease::names_a_partition) {
        Vec::new()
    } else {
        monitored.partition_key_ranges().await?
    };
    let documents = java_pk_documents(leases, &partitions, &prefix, OffsetDateTime::now_utc())?;
    if !dry_run {
        for document in &documents {
            store.create_document(document).await?;
        }
    }
    Ok(Left {
        prefix,
        documents,
        without_checkpoint: leases.iter().filter(|l| l.continuation.is_none()).count(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_partition_key_range_leases_carry_our_checkpoints() {
        let now = time::macros::datetime!(2026-11-26 12:00:00 UTC);
        let v0 = Lease::for_partition("ours", "3", &EpkRange::new("3F", "7F"), Some("\"12\"".into()));
        let old = Lease::new("ours", &EpkRange::new("", "3F"), None);
        let partitions = vec![("0".to_owned(), EpkRange::new("", "3F"))];
        let prefix = java_prefix("p", "127.0.0.1", "db/items");
        assert_eq!(prefix, "p127.0.0.1_db_items");
        let docs = java_pk_documents(&[v0, old], &partitions, &prefix, now).unwrap();
        assert_eq!(docs[0]["id"], "p127.0.0.1_db_items..3");
        assert_eq!(docs[0]["LeaseToken"], "3");
        assert_eq!(docs[0]["ContinuationToken"], "\"12\"");
        assert_eq!(docs[0]["Owner"], "");
        assert_eq!(
            docs[1]["id"], "p127.0.0.1_db_items..0",
            "an EPK lease of a whole partition"
        );
        assert!(docs[1]["ContinuationToken"].is_null());
        let sub = Lease::new("ours", &EpkRange::new("", "1F"), None);
        assert!(matches!(
            java_pk_documents(&[sub], &partitions, &prefix, now),
            Err(LeaveError::SubRange { .. })
        ));
    }
}
