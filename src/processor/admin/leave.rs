//! Leaving without lock-in, the mirror of adoption: this processor's checkpoints written as the
//! leases of another processor, so that it starts where ours stopped — nothing read again,
//! nothing skipped. The .NET v3 processor needs no step (our lease documents are its layout,
//! under its prefix convention: start it with the same processor name). The Java v4 processor
//! names its lease prefix by account host, database and container *names*; its
//! partition-key-range leases (`handleChanges`) are named by partition key range id and carry
//! the range's raw continuation — what our version-0 leases hold. Its EPK leases
//! (`handleLatestVersionChanges`) are named by the range `{min}-{max}` under a prefix of resource
//! ids, and carry a change feed state: URL-safe base64 of JSON that lists the continuation of the
//! range.

use base64::Engine;
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
    /// The Java v4 processor's EPK leases (`handleLatestVersionChanges`), of any width.
    JavaEpk,
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

/// The Java EPK lease documents that carry `leases`' checkpoints, under `prefix` (unowned, as the
/// Java processor's bootstrap writes them), for the container whose resource id is `container_rid`.
pub fn java_epk_documents(leases: &[Lease], prefix: &str, container_rid: &str, now: OffsetDateTime) -> Vec<Value> {
    let stamp = now
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    leases
        .iter()
        .filter_map(|lease| Some((lease, lease.range()?)))
        .map(|(lease, range)| {
            let token = range.lease_token();
            let state = lease.continuation.as_ref().map(|continuation| {
                let bounds = json!({"min": range.min, "max": range.max});
                let state = json!({"V": 1, "Rid": container_rid, "Mode": "INCREMENTAL", "StartFrom": {"Type": "NOW"},
                    "Continuation": {"V": 1, "Rid": container_rid, "Range": bounds,
                        "Continuation": [{"token": continuation, "range": bounds}]}});
                // The Java processor reads it with a URL-safe base64 decoder.
                base64::engine::general_purpose::URL_SAFE.encode(state.to_string())
            });
            json!({
                "id": format!("{prefix}..{token}"),
                "LeaseToken": token,
                "version": 1,
                "feedRange": {"Range": {"min": range.min, "max": range.max, "isMinInclusive": true, "isMaxInclusive": false}},
                "Owner": "",
                "ContinuationToken": state,
                "timestamp": stamp,
                "properties": {},
            })
        })
        .collect()
}

/// Whether the ranges of `leases` cover the whole key space, each key once.
fn covers_the_key_space(leases: &[Lease]) -> bool {
    let mut ranges: Vec<&EpkRange> = leases.iter().filter_map(Lease::range).collect();
    ranges.sort();
    let mut reached = String::new();
    for range in ranges {
        if range.min != reached {
            return false;
        }
        reached.clone_from(&range.max);
    }
    reached == EpkRange::full().max
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
    if leases
        .iter()
        .any(|l| FeedMode::of_lease(l.mode.as_deref()) != FeedMode::LatestVersion)
    {
        return Err(LeaveError::Mode);
    }
    let prefix = match layout {
        LeaveLayout::JavaPk => java_prefix(lease_prefix, host, monitored.name()),
        LeaveLayout::JavaEpk => format!("{lease_prefix}{host}_{}_{}", monitored.database_rid(), monitored.rid()),
    };
    let existing = store.count_with_prefix(&format!("{prefix}..")).await?;
    if existing > 0 {
        return Err(LeaveError::Exists {
            prefix,
            count: existing,
        });
    }
    let now = OffsetDateTime::now_utc();
    let documents = match layout {
        LeaveLayout::JavaPk => {
            let partitions = if leases.iter().all(Lease::names_a_partition) {
                Vec::new()
            } else {
                monitored.partition_key_ranges().await?
            };
            java_pk_documents(leases, &partitions, &prefix, now)?
        }
        LeaveLayout::JavaEpk => java_epk_documents(leases, &prefix, monitored.rid(), now),
    };
    if !dry_run {
        for document in &documents {
            store.create_document(document).await?;
        }
        // The marker the Java processor's bootstrap looks for: its lease set is complete (only
        // then — without it, it creates the leases of ranges none covers).
        if covers_the_key_space(leases) {
            match store.create_document(&json!({"id": format!("{prefix}.info")})).await {
                Ok(()) | Err(LeaseStoreError::Changed(_)) => {}
                Err(error) => return Err(error.into()),
            }
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
    fn the_java_processor_is_told_its_lease_set_is_complete_only_when_it_covers_every_key() {
        let lease = |min: &str, max: &str| Lease::new("ours", &EpkRange::new(min, max), None);
        assert!(covers_the_key_space(&[lease("80", "FF"), lease("", "80")]));
        assert!(!covers_the_key_space(&[]));
        assert!(!covers_the_key_space(&[lease("", "40"), lease("80", "FF")]));
        assert!(!covers_the_key_space(&[lease("", "80"), lease("40", "FF")]));
    }

    #[test]
    fn java_epk_leases_carry_our_checkpoints_in_a_state_read_in_any_base64() {
        use crate::processor::leases::adopt::{ForeignLayout, Scope, parse};
        let now = time::macros::datetime!(2026-11-29 12:00:00 UTC);
        // A continuation whose JSON encodes to both `-`/`_` and `+`/`/` alphabets' own letters.
        let sub = Lease::new("ours", &EpkRange::new("", "1F"), Some("\"12>>?\"".into()));
        let fresh = Lease::new("ours", &EpkRange::new("1F", "FF"), None);
        let docs = java_epk_documents(&[sub, fresh], "q127.0.0.1_AAAAAQ==_AAAAAYAAAAE=", "AAAAAYAAAAE=", now);
        assert_eq!(docs[0]["id"], "q127.0.0.1_AAAAAQ==_AAAAAYAAAAE=..-1F");
        assert_eq!(
            (docs[0]["version"].as_u64(), docs[1]["ContinuationToken"].is_null()),
            (Some(1), true)
        );
        let state = docs[0]["ContinuationToken"].as_str().unwrap();
        let bytes = base64::engine::general_purpose::URL_SAFE.decode(state).unwrap();
        for encoded in [
            state.to_owned(),
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&bytes),
            base64::engine::general_purpose::STANDARD.encode(&bytes),
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(&bytes),
        ] {
            let mut doc = docs[0].clone();
            doc["ContinuationToken"] = Value::String(encoded.clone());
            let read = parse(ForeignLayout::JavaEpk, &doc).unwrap();
            assert_eq!(read[0].scope, Scope::Epk(EpkRange::new("", "1F")), "{encoded}");
            assert_eq!(read[0].continuation.as_deref(), Some("\"12>>?\""), "{encoded}");
        }
    }

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
