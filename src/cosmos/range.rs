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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_tokens_follow_the_dotnet_scheme() {
        assert_eq!(EpkRange::full().lease_token(), "-FF");
        assert_eq!(EpkRange::new("", "3f").lease_token(), "-3F");
        assert_eq!(EpkRange::new("3F", "7F").lease_token(), "3F-7F");
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
    }
}
