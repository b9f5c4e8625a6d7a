//! Effective-partition-key ranges as lease documents store them.

use serde::{Deserialize, Serialize};

/// An EPK range `[min, max)` of a container, in uppercase hex as the service writes it
/// (`""` is the minimum, `"FF"` the maximum).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EpkRange {
    /// Inclusive lower bound.
    pub min: String,
    /// Exclusive upper bound.
    pub max: String,
}

impl EpkRange {
    /// The whole key space `["", "FF")`.
    pub fn full() -> Self {
        Self::new("", "FF")
    }

    /// A range from its bounds (normalized to uppercase).
    pub fn new(min: impl Into<String>, max: impl Into<String>) -> Self {
        Self {
            min: min.into().to_ascii_uppercase(),
            max: max.into().to_ascii_uppercase(),
        }
    }

    /// The .NET v3 lease token of an EPK lease: `"{min}-{max}"`.
    pub fn lease_token(&self) -> String {
        format!("{}-{}", self.min, self.max)
    }

    /// Whether `other` lies entirely within this range.
    pub fn contains(&self, other: &EpkRange) -> bool {
        epk_le(&self.min, &other.min) && epk_le(&other.max, &self.max)
    }

    /// Whether the effective partition key `epk` (hex) lies in this range.
    pub fn contains_epk(&self, epk: &str) -> bool {
        let epk = epk.to_ascii_uppercase();
        epk_le(&self.min, &epk) && epk_lt(&epk, &self.max)
    }

    /// Whether the two ranges share any key.
    pub fn overlaps(&self, other: &EpkRange) -> bool {
        epk_lt(&self.min, &other.max) && epk_lt(&other.min, &self.max)
    }

    /// Whether the two ranges share any key, with bounds of different lengths compared as the
    /// service compares effective partition keys: the shorter padded with zeros (`20` is
    /// `2000…0`, so `[10…0, 20…0)` and `[20, 30)` share none). Hex bounds typed by people are
    /// often short; lease bounds are full length.
    pub fn overlaps_as_keys(&self, other: &EpkRange) -> bool {
        key_lt(&self.min, &other.max) && key_lt(&other.min, &self.max)
    }

    /// The keys both ranges hold, or `None` when they share none.
    pub fn intersection(&self, other: &EpkRange) -> Option<EpkRange> {
        if !self.overlaps(other) {
            return None;
        }
        // EPKs order as their hex strings (see `epk_lt`).
        let min = std::cmp::max(&self.min, &other.min);
        let max = std::cmp::min(&self.max, &other.max);
        Some(EpkRange::new(min.clone(), max.clone()))
    }

    /// The parts of this range that none of `covered` holds, in order (the whole range when none
    /// overlaps it; nothing when they cover it). Bounds compare as keys (see
    /// [`EpkRange::overlaps_as_keys`]): a service bound and a lease's longer one for the same key
    /// leave no gap between them.
    pub fn minus(&self, covered: &[&EpkRange]) -> Vec<EpkRange> {
        let mut overlapping: Vec<&EpkRange> = covered.iter().copied().filter(|c| c.overlaps_as_keys(self)).collect();
        overlapping.sort_by(|a, b| key_order(&a.min, &b.min));
        let mut left = Vec::new();
        let mut from = self.min.clone();
        for range in overlapping {
            if key_lt(&from, &range.min) {
                left.push(EpkRange::new(from.clone(), range.min.clone()));
            }
            if key_lt(&from, &range.max) {
                from.clone_from(&range.max);
            }
        }
        if key_lt(&from, &self.max) {
            left.push(EpkRange::new(from, self.max.clone()));
        }
        left
    }

    /// `parts` adjacent sub-ranges that cover this range exactly and share its keys equally
    /// (bounds read as 128-bit hash-v2 EPKs: 32 hex digits, shorter ones padded with zeros; keys
    /// lie below `40…0`, so the last part runs from there to the range's end). `None` when the
    /// range is too narrow to divide or a bound is not such an EPK.
    pub fn divide(&self, parts: u32) -> Option<Vec<EpkRange>> {
        if parts <= 1 {
            return Some(vec![self.clone()]);
        }
        let (min, max) = (epk_value(&self.min)?, epk_value(&self.max)?.min(HASH_V2_END));
        let step = max.checked_sub(min)? / u128::from(parts);
        if step == 0 {
            return None;
        }
        let mut bounds = vec![self.min.clone()];
        bounds.extend((1..parts).map(|i| format!("{:032X}", min + step * u128::from(i))));
        bounds.push(self.max.clone());
        Some(
            bounds
                .windows(2)
                .map(|w| EpkRange::new(w[0].clone(), w[1].clone()))
                .collect(),
        )
    }
}

/// Where hash-v2 effective partition keys end: the service clears the top two bits of the
/// 128-bit hash, so every key is below `40000000000000000000000000000000`.
const HASH_V2_END: u128 = 0x40 << 120;

/// The 128-bit value of an EPK of at most 32 hex digits (`""` is 0, `"FF"` is `0xFF` followed by
/// zeros, so that the values order as the strings do).
fn epk_value(epk: &str) -> Option<u128> {
    if epk.len() > 32 || !epk.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let padded = format!("{epk:0<32}");
    u128::from_str_radix(&padded, 16).ok()
}

impl std::fmt::Display for EpkRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}, {})", self.min, self.max)
    }
}

/// EPK order: hex strings compare as byte strings, and `"FF"` is the maximum.
fn epk_lt(a: &str, b: &str) -> bool {
    a < b
}

fn epk_le(a: &str, b: &str) -> bool {
    a <= b
}

/// The order of [`key_lt`].
fn key_order(a: &str, b: &str) -> std::cmp::Ordering {
    if key_lt(a, b) {
        std::cmp::Ordering::Less
    } else if key_lt(b, a) {
        std::cmp::Ordering::Greater
    } else {
        std::cmp::Ordering::Equal
    }
}

/// `a < b` with the shorter bound padded with zeros (`"FF"`, the maximum, stays above every key).
fn key_lt(a: &str, b: &str) -> bool {
    let width = a.len().max(b.len());
    format!("{a:0<width$}") < format!("{b:0<width$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minus_leaves_the_keys_no_range_covers() {
        let r = |min: &str, max: &str| EpkRange::new(min, max);
        let whole = r("20", "60");
        for (covered, left, why) in [
            (vec![], vec![r("20", "60")], "nothing covered"),
            (vec![r("00", "10")], vec![r("20", "60")], "a range beside it"),
            (vec![r("20", "60")], vec![], "exactly covered"),
            (vec![r("", "FF")], vec![], "covered by a wider one"),
            (
                vec![r("30", "40")],
                vec![r("20", "30"), r("40", "60")],
                "a hole in the middle",
            ),
            (
                vec![r("40", "50"), r("20", "30")],
                vec![r("30", "40"), r("50", "60")],
                "unordered",
            ),
            (
                vec![r("10", "35"), r("30", "45")],
                vec![r("45", "60")],
                "overlapping ones",
            ),
            (vec![r("20", "30"), r("30", "60")], vec![], "adjacent ones"),
            (vec![r("20", "3000"), r("30", "60")], vec![], "one bound written longer"),
        ] {
            let covered: Vec<&EpkRange> = covered.iter().collect();
            assert_eq!(whole.minus(&covered), left, "{why}");
        }
    }

    #[test]
    fn lease_tokens_follow_the_dotnet_scheme() {
        assert_eq!(EpkRange::full().lease_token(), "-FF");
        assert_eq!(EpkRange::new("", "3f").lease_token(), "-3F");
        assert_eq!(EpkRange::new("3F", "7F").lease_token(), "3F-7F");
    }

    #[test]
    fn divide_covers_the_range_with_equal_parts() {
        let cases: Vec<(EpkRange, u32, Option<Vec<&str>>)> = vec![
            (EpkRange::full(), 1, Some(vec!["", "FF"])),
            (
                EpkRange::full(),
                2,
                Some(vec!["", "20000000000000000000000000000000", "FF"]),
            ),
            (
                EpkRange::new("30000000000000000000000000000000", "FF"),
                2,
                Some(vec![
                    "30000000000000000000000000000000",
                    "38000000000000000000000000000000",
                    "FF",
                ]),
            ),
            (
                EpkRange::new("", "3FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF"),
                4,
                Some(vec![
                    "",
                    "0FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF",
                    "1FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFE",
                    "2FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFD",
                    "3FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF",
                ]),
            ),
            (
                EpkRange::new("3F", "7F"),
                2,
                Some(vec!["3F", "3F800000000000000000000000000000", "7F"]),
            ),
            // Above every key: nothing to share.
            (EpkRange::new("40", "FF"), 2, None),
            // Too narrow, or not a 128-bit EPK.
            (
                EpkRange::new("00000000000000000000000000000001", "00000000000000000000000000000002"),
                2,
                None,
            ),
            (EpkRange::new("", "ZZ"), 2, None),
        ];
        for (range, parts, expected) in cases {
            let divided = range.divide(parts);
            let bounds = divided.as_ref().map(|d| {
                let mut b: Vec<String> = d.iter().map(|r| r.min.clone()).collect();
                b.push(d.last().unwrap().max.clone());
                b
            });
            assert_eq!(
                bounds,
                expected.map(|e| e.into_iter().map(str::to_owned).collect::<Vec<_>>()),
                "{range} / {parts}"
            );
            for part in divided.iter().flatten() {
                assert!(
                    range.contains(part) && part.min < part.max || part.min.is_empty(),
                    "{part}"
                );
            }
        }
    }

    #[test]
    fn containment_and_overlap() {
        let parent = EpkRange::new("", "7F");
        let left = EpkRange::new("", "3F");
        let right = EpkRange::new("3F", "7F");
        let other = EpkRange::new("7F", "FF");
        assert!(parent.contains(&left) && parent.contains(&right));
        assert!(!parent.contains(&other));
        assert!(parent.overlaps(&right));
        assert!(!left.overlaps(&right));
        assert!(!parent.overlaps(&other));
        assert_eq!(parent.intersection(&left), Some(left.clone()));
        assert_eq!(left.intersection(&parent), Some(left.clone()));
        assert_eq!(
            EpkRange::new("20", "5F").intersection(&right),
            Some(EpkRange::new("3F", "5F"))
        );
        assert_eq!(EpkRange::full().intersection(&other), Some(other.clone()));
        assert_eq!(left.intersection(&right), None);
        assert_eq!(parent.intersection(&other), None);
    }
}
