//! What of the monitored feed no lease covers, in the pieces a bootstrap creates leases for. A
//! feed range some lease overlaps is not therefore covered: a bootstrap killed partway leaves a
//! partition with some of its leases, and the keys of the others would never be read.

use crate::cosmos::EpkRange;

/// The ranges a bootstrap creates leases for: each feed range divided into `per_partition`
/// pieces (whole when it cannot be divided), less the keys `covered` (the existing leases'
/// ranges) holds.
pub(super) fn missing_pieces(ranges: &[EpkRange], covered: &[&EpkRange], per_partition: u32) -> Vec<EpkRange> {
    ranges
        .iter()
        .flat_map(|range| pieces(range, per_partition))
        .flat_map(|piece| piece.minus(covered))
        .collect()
}

/// `range` divided into `per_partition` pieces, or whole when it cannot be.
fn pieces(range: &EpkRange, per_partition: u32) -> Vec<EpkRange> {
    range.divide(per_partition).unwrap_or_else(|| {
        tracing::warn!(%range, per_partition, "this feed range cannot be divided; one lease covers it");
        vec![range.clone()]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(min: &str, max: &str) -> EpkRange {
        EpkRange::new(min, max)
    }

    #[test]
    fn only_the_keys_no_lease_covers_are_missing_in_the_pieces_of_the_layout() {
        let ranges = [
            r("", "20000000000000000000000000000000"),
            r("20000000000000000000000000000000", "FF"),
        ];
        let halves_of_first = ranges[0].divide(2).unwrap();
        let quarters_of_first = ranges[0].divide(4).unwrap();
        let second = ranges[1].divide(2).unwrap();
        for (covered, per_partition, missing, why) in [
            (vec![], 1, ranges.to_vec(), "nothing yet: every range"),
            (
                vec![],
                2,
                [halves_of_first.clone(), second.clone()].concat(),
                "nothing yet: every piece",
            ),
            (ranges.to_vec(), 2, vec![], "a partition's lease covers its pieces"),
            (
                vec![halves_of_first[0].clone()],
                2,
                [vec![halves_of_first[1].clone()], second.clone()].concat(),
                "a bootstrap killed after one piece: the first range's other piece",
            ),
            (
                vec![quarters_of_first[0].clone(), ranges[1].clone()],
                2,
                vec![
                    r(&quarters_of_first[1].min, &halves_of_first[0].max),
                    halves_of_first[1].clone(),
                ],
                "another layout's piece: the keys around it",
            ),
            (
                vec![r("", "FF")],
                4,
                vec![],
                "a lease wider than the ranges (a merge's parents, before the split)",
            ),
        ] {
            let covered: Vec<&EpkRange> = covered.iter().collect();
            assert_eq!(missing_pieces(&ranges, &covered, per_partition), missing, "{why}");
        }
    }
}
