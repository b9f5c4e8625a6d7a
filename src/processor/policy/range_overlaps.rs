//! Leases whose ranges overlap: split parents whose children exist (superseded), leases with
//! the same range as another (one survives), ranges that overlap another's (a lease container
//! edited by hand), and leases inside a range this instance processes. Pure.
//!
//! Every instance asks this of every listing, over thousands of leases: comparing every pair
//! would make each acquire cycle quadratic. The ranges are sorted instead, and only groups of
//! ranges that overlap one another are compared pairwise: leases that do not overlap — all of
//! them, but for a split in progress — cost a sort.

use std::collections::{HashMap, HashSet};

use crate::cosmos::{EpkRange, continuation_lsn};
use crate::processor::leases::lease::Lease as LeaseDocument;

/// A lease's id and its range of effective partition keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRange {
    /// The lease document's id.
    pub id: String,
    /// The range it covers.
    pub range: EpkRange,
}

impl LeaseRange {
    /// Lease `id` over `range`.
    pub fn new(id: impl Into<String>, range: EpkRange) -> Self {
        Self { id: id.into(), range }
    }
}

/// The ranges of the leases that have one (an EPK range or a partition's), in their order.
pub fn ranges_of(leases: &[LeaseDocument]) -> Vec<LeaseRange> {
    leases
        .iter()
        .filter_map(|l| Some(LeaseRange::new(l.id.clone(), l.range()?.clone())))
        .collect()
}

type Lease = LeaseRange;

/// The groups of leases whose ranges overlap one another (chained: each overlaps one before it
/// in the order of their lower bounds); leases that overlap nothing are in no group. A range
/// contained in another, or overlapping it, is in its group. With an empty range (lower bound
/// not below the upper, which contains without overlapping) every lease is one group.
fn overlap_groups(leases: &[Lease]) -> Vec<Vec<&Lease>> {
    if leases.iter().any(|l| l.range.min >= l.range.max) {
        return vec![leases.iter().collect()];
    }
    let mut sorted: Vec<&Lease> = leases.iter().collect();
    sorted.sort_by(|a, b| {
        a.range
            .min
            .cmp(&b.range.min)
            .then_with(|| b.range.max.cmp(&a.range.max))
    });
    let mut groups = Vec::new();
    let mut group: Vec<&Lease> = Vec::new();
    let mut reach = "";
    for lease in sorted {
        if !group.is_empty() && lease.range.min.as_str() < reach {
            reach = reach.max(lease.range.max.as_str());
            group.push(lease);
            continue;
        }
        if group.len() > 1 {
            groups.push(std::mem::take(&mut group));
        }
        reach = lease.range.max.as_str();
        group = vec![lease];
    }
    if group.len() > 1 {
        groups.push(group);
    }
    groups
}

/// `ids` in the order of `leases`.
fn in_order(leases: &[Lease], ids: &HashSet<String>) -> Vec<String> {
    leases
        .iter()
        .filter(|l| ids.contains(&l.id))
        .map(|l| l.id.clone())
        .collect()
}

/// Ids of leases whose range is fully covered by narrower leases: the parent of a split whose
/// children exist. They are never balanced or acquired; once free they are deleted.
pub fn superseded(leases: &[Lease]) -> Vec<String> {
    let found: HashSet<String> = overlap_groups(leases)
        .iter()
        .flat_map(|group| superseded_among(group))
        .collect();
    in_order(leases, &found)
}

/// Leases whose range overlaps another lease's (split parents in `superseded` aside): a lease
/// container edited by hand or by another tool. Both are processed (duplicates, never a loss).
pub fn overlapping(leases: &[Lease], superseded: &[String]) -> Vec<String> {
    let superseded: HashSet<&str> = superseded.iter().map(String::as_str).collect();
    let found: HashSet<String> = overlap_groups(leases)
        .iter()
        .flat_map(|group| overlapping_among(group, &superseded))
        .collect();
    in_order(leases, &found)
}

/// A lease whose range another lease has too, and the one of them that survives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EqualRange {
    /// The lease that gives way: never balanced or acquired, deleted once free.
    pub id: String,
    /// The lease that goes on over the range.
    pub kept: String,
}

/// Of each set of leases with one range (a rewrite whose old document could not be deleted, a
/// copy made by hand), the one kept — one with a checkpoint before one without, then the checkpoint
/// furthest behind, then the latest write (a rewrite's new lease is written after the old one's
/// last write), then the greatest id — and the others, in the order of `leases`. Deleting any of
/// the others loses nothing: the kept lease reads again from no further on (a checkpoint further
/// on may never have been earned: a lease created from "now" beside one with a backlog).
pub fn equal_ranges(leases: &[LeaseDocument]) -> Vec<EqualRange> {
    let mut by_range: HashMap<&EpkRange, Vec<&LeaseDocument>> = HashMap::new();
    for lease in leases {
        if let Some(range) = lease.range() {
            by_range.entry(range).or_default().push(lease);
        }
    }
    let precedence = |l: &&&LeaseDocument| {
        let behind = l
            .continuation
            .as_deref()
            .and_then(continuation_lsn)
            .map(std::cmp::Reverse);
        (behind, l.timestamp, l.id.clone())
    };
    let mut kept_for: HashMap<&str, &str> = HashMap::new();
    for same in by_range.values().filter(|same| same.len() > 1) {
        let Some(kept) = same.iter().max_by_key(precedence) else {
            continue;
        };
        for other in same.iter().filter(|l| l.id != kept.id) {
            kept_for.insert(other.id.as_str(), kept.id.as_str());
        }
    }
    leases
        .iter()
        .filter_map(|l| {
            let kept = kept_for.get(l.id.as_str())?;
            Some(EqualRange {
                id: l.id.clone(),
                kept: (*kept).to_owned(),
            })
        })
        .collect()
}

/// Ids of `candidates` whose range lies within the range of one of `processed` (other than
/// itself): a split's child while the parent's task still reads it, the other of two leases with
/// one range. An instance starts none of them, so no two of its tasks read one change.
pub fn within(candidates: &[Lease], processed: &[Lease]) -> Vec<String> {
    candidates
        .iter()
        .filter(|c| processed.iter().any(|p| p.id != c.id && p.range.contains(&c.range)))
        .map(|c| c.id.clone())
        .collect()
}

/// [`superseded`] among the leases of one group, pair by pair.
fn superseded_among(leases: &[&Lease]) -> Vec<String> {
    let mut out = Vec::new();
    for LeaseRange { id, range } in leases.iter().copied() {
        let mut inside: Vec<&EpkRange> = leases
            .iter()
            .filter(|other| other.id != *id && other.range != *range && range.contains(&other.range))
            .map(|other| &other.range)
            .collect();
        inside.sort();
        let mut cursor = range.min.as_str();
        for r in inside {
            if r.min.as_str() <= cursor && r.max.as_str() > cursor {
                cursor = r.max.as_str();
            }
        }
        if cursor >= range.max.as_str() {
            out.push(id.clone());
        }
    }
    out
}

/// [`overlapping`] among the leases of one group, pair by pair.
fn overlapping_among(leases: &[&Lease], superseded: &HashSet<&str>) -> Vec<String> {
    let live: Vec<&Lease> = leases
        .iter()
        .copied()
        .filter(|l| !superseded.contains(l.id.as_str()))
        .collect();
    live.iter()
        .filter(|l| {
            live.iter()
                .any(|other| other.id != l.id && other.range.overlaps(&l.range))
        })
        .map(|l| l.id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(id: &str, min: &str, max: &str) -> Lease {
        LeaseRange::new(id, EpkRange::new(min, max))
    }

    /// The pairwise answers over all leases, as before the grouping.
    fn pairwise(leases: &[Lease]) -> (Vec<String>, Vec<String>) {
        let all: Vec<&Lease> = leases.iter().collect();
        let parents = superseded_among(&all);
        let set: HashSet<&str> = parents.iter().map(String::as_str).collect();
        (parents.clone(), overlapping_among(&all, &set))
    }

    #[test]
    fn grouping_answers_as_comparing_every_pair() {
        let cases: Vec<Vec<Lease>> = vec![
            // Adjacent leases: nothing.
            vec![lease("a", "", "40"), lease("b", "40", "80"), lease("c", "80", "FF")],
            // A split parent with both children, beside an untouched lease.
            vec![
                lease("p", "", "80"),
                lease("c1", "", "40"),
                lease("c2", "40", "80"),
                lease("z", "80", "FF"),
            ],
            // A parent with one child only: not superseded, and both overlap.
            vec![lease("p", "", "80"), lease("c1", "", "40"), lease("z", "80", "FF")],
            // Overlaps by hand, a duplicate range, in any order.
            vec![
                lease("x", "30", "90"),
                lease("a", "", "40"),
                lease("d", "80", "FF"),
                lease("e", "80", "FF"),
            ],
            // An empty range.
            vec![lease("a", "", "80"), lease("empty", "40", "40"), lease("b", "80", "FF")],
        ];
        for leases in cases {
            let parents = superseded(&leases);
            let (want_parents, want_overlapping) = pairwise(&leases);
            assert_eq!(parents, want_parents, "{leases:?}");
            assert_eq!(overlapping(&leases, &parents), want_overlapping, "{leases:?}");
        }
    }

    /// A bound of a random lease: two hex digits, or the ends of the key space.
    fn bound() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            Just(String::new()),
            Just("FF".to_owned()),
            (0u8..16).prop_map(|n| format!("{:02X}", n * 16))
        ]
    }

    proptest::proptest! {
        /// Whatever the ranges — splits with one child or both, duplicates, overlaps by hand,
        /// empty ranges — grouping answers what comparing every pair answers.
        #[test]
        fn grouping_answers_as_comparing_every_pair_for_any_ranges(
            bounds in proptest::collection::vec((bound(), bound()), 0..12)
        ) {
            let leases: Vec<Lease> = bounds
                .iter()
                .enumerate()
                .map(|(i, (min, max))| lease(&format!("l{i}"), min, max))
                .collect();
            let parents = superseded(&leases);
            let (want_parents, want_overlapping) = pairwise(&leases);
            proptest::prop_assert_eq!(&parents, &want_parents);
            proptest::prop_assert_eq!(overlapping(&leases, &parents), want_overlapping);
        }
    }

    fn document(id: &str, checkpoint: Option<u64>, written_s: i64) -> LeaseDocument {
        let mut lease = LeaseDocument::new("p", &EpkRange::full(), checkpoint.map(|n| format!("\"{n}\"")));
        lease.id = id.to_owned();
        lease.timestamp = Some(time::OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(written_s));
        lease
    }

    #[test]
    fn of_leases_with_one_range_the_checkpoint_furthest_behind_then_the_latest_then_the_greatest_id_is_kept() {
        type Case = (Vec<LeaseDocument>, &'static str);
        let cases: Vec<Case> = vec![
            (vec![document("a", Some(5), 1), document("b", Some(7), 9)], "a"),
            (vec![document("a", None, 9), document("b", Some(1), 1)], "b"),
            (vec![document("a", Some(5), 2), document("b", Some(5), 1)], "a"),
            (vec![document("a", Some(5), 1), document("b", Some(5), 1)], "b"),
            (
                vec![
                    document("c", Some(6), 1),
                    document("a", Some(5), 1),
                    document("b", Some(6), 1),
                ],
                "a",
            ),
        ];
        for (leases, kept) in cases {
            let found = equal_ranges(&leases);
            assert_eq!(found.len(), leases.len() - 1, "{leases:?}");
            assert!(found.iter().all(|e| e.kept == kept && e.id != kept), "{found:?}");
        }
        let apart = [
            LeaseDocument::new("p", &EpkRange::new("", "80"), None),
            LeaseDocument::new("p", &EpkRange::new("80", "FF"), None),
        ];
        assert!(equal_ranges(&apart).is_empty());
    }

    #[test]
    fn leases_within_a_processed_range_are_found_and_the_processed_one_itself_is_not() {
        let parent = lease("parent", "", "FF");
        let candidates = [
            lease("child", "", "80"),
            lease("copy", "", "FF"),
            parent.clone(),
            lease("beyond", "FF", "FFFF"),
        ];
        assert_eq!(within(&candidates, &[parent]), ["child", "copy"]);
        assert!(within(&candidates, &[]).is_empty());
    }

    #[test]
    fn two_thousand_adjacent_leases_form_no_group() {
        let leases: Vec<Lease> = (0..2000u32)
            .map(|i| {
                lease(
                    &format!("l{i}"),
                    &format!("{:08X}", i * 1000),
                    &format!("{:08X}", (i + 1) * 1000),
                )
            })
            .collect();
        assert!(overlap_groups(&leases).is_empty());
        assert!(superseded(&leases).is_empty());
    }
}
