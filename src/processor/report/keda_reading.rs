//! Which of a processor's leases KEDA's `azure-cosmosdb` scaler (v2.21) cannot read, and what
//! that does to its metric. Its scaler reads the change feed of the partition key range a lease's
//! `LeaseToken` names: a lease that names none (narrower than a partition, with more than one
//! lease per partition, or a range merged or split since) answers 410/1002, and the scaler then counts none of
//! its lag and reports the processor active with a metric of at least 1. It reads one page of its
//! lease query, so the leases beyond the service's default page are not counted at all. Pure.

use serde::Serialize;

use crate::cosmos::EpkRange;
use crate::processor::leases::lease::{Lease, LeaseSnapshot};

/// Documents in one page of a query that names no page size, as the service answers it (and
/// `cfp emulator`): KEDA's scaler sends none and follows no continuation.
pub const KEDA_QUERY_PAGE: usize = 100;

/// What KEDA's scaler would read of a lease set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KedaReading {
    /// Leases whose `LeaseToken` names no partition key range of the container now.
    pub unreadable: Vec<String>,
    /// Documents under the processor's lease prefix (leases, heartbeats, markers). KEDA's query
    /// matches at least these (its prefix, `{processor}{account name}.`, may match other
    /// processors' too): a lower bound of what it pages through.
    pub documents: usize,
    /// Documents KEDA reads of its query (one page).
    pub page: usize,
}

impl KedaReading {
    /// Whether KEDA's scaler counts the lag of every lease.
    pub fn reads_all(&self) -> bool {
        self.unreadable.is_empty() && !self.beyond_first_page()
    }

    /// Whether some documents lie beyond the one page KEDA reads.
    pub fn beyond_first_page(&self) -> bool {
        self.documents > self.page
    }
}

/// KEDA's reading of `snapshot` over the container's physical partitions `partitions` (their
/// ranges). A lease is read when its token is a partition key range id (version 0) and its
/// range is exactly one partition's (a split or merge since gave the range a new id).
pub fn keda_reading(snapshot: &LeaseSnapshot, partitions: &[EpkRange]) -> KedaReading {
    let unreadable = snapshot
        .leases
        .iter()
        .filter(|lease| !names_a_partition(lease, partitions))
        .map(|lease| lease.lease_token.clone())
        .collect();
    let documents = snapshot.leases.len()
        + snapshot.pk_range_leases.len()
        + snapshot.invalid.len()
        + snapshot.instances.len()
        + snapshot.markers
        + usize::from(snapshot.initialized);
    KedaReading {
        unreadable,
        documents,
        page: KEDA_QUERY_PAGE,
    }
}

fn names_a_partition(lease: &Lease, partitions: &[EpkRange]) -> bool {
    lease.names_a_partition() && lease.range().is_some_and(|range| partitions.contains(range))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version-0 lease named `token`, or (`None`) an EPK lease, over `[min, max)`.
    fn lease(token: Option<&str>, min: &str, max: &str) -> Lease {
        let range = EpkRange::new(min, max);
        match token {
            Some(id) => Lease::for_partition("p", id, &range, None),
            None => Lease::new("p", &range, None),
        }
    }

    #[test]
    fn only_leases_naming_a_partition_of_the_container_now_are_read() {
        let halves = [EpkRange::new("", "80"), EpkRange::new("80", "FF")];
        #[rustfmt::skip]
        let cases: [(&str, Lease, bool); 5] = [
            ("version 0, one partition", lease(Some("0"), "", "80"), true),
            ("a quarter: an EPK lease", lease(None, "", "40"), false),
            ("an EPK lease over one whole partition", lease(None, "80", "FF"), false),
            ("a split parent's range, gone", lease(Some("0"), "", "FF"), false),
            ("the other half", lease(Some("1"), "80", "FF"), true),
        ];
        for (name, lease, read) in cases {
            let snapshot = LeaseSnapshot {
                leases: vec![lease],
                ..LeaseSnapshot::default()
            };
            let reading = keda_reading(&snapshot, &halves);
            assert_eq!(reading.unreadable.is_empty(), read, "{name}");
            assert_eq!(reading.reads_all(), read, "{name}");
        }
    }

    #[test]
    fn documents_past_one_page_are_not_read() {
        let partitions = [EpkRange::new("", "FF")];
        let mut snapshot = LeaseSnapshot {
            leases: vec![lease(Some("0"), "", "FF")],
            initialized: true,
            ..LeaseSnapshot::default()
        };
        let now = time::OffsetDateTime::UNIX_EPOCH;
        snapshot.instances = (0..98).map(|i| (format!("w{i}"), now)).collect();
        assert_eq!(keda_reading(&snapshot, &partitions).documents, 100);
        assert!(
            keda_reading(&snapshot, &partitions).reads_all(),
            "one lease, 98 heartbeats and .info: one page"
        );
        snapshot.instances.push(("w98".into(), now));
        let reading = keda_reading(&snapshot, &partitions);
        assert!(reading.beyond_first_page() && !reading.reads_all());
    }
}
