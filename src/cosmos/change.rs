//! The change feed modes and what the all-versions-and-deletes mode says about each change.

use azure_data_cosmos::models::{ChangeFeedItem, ChangeFeedOperationType};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Which changes the change feed returns (in JSON: its command-line spelling).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FeedMode {
    /// The latest version of each created or replaced document ("Incremental Feed").
    #[default]
    LatestVersion,
    /// Every version, deletes included, with the previous image and metadata
    /// ("Full-Fidelity Feed"); starts only from now or a continuation.
    AllVersionsAndDeletes,
}

impl FeedMode {
    /// The lease's `Mode` value, as the .NET processor writes it.
    pub fn lease_mode(self) -> &'static str {
        match self {
            FeedMode::LatestVersion => "Incremental Feed",
            FeedMode::AllVersionsAndDeletes => "Full-Fidelity Feed",
        }
    }

    /// The mode a lease's `Mode` value names (none or an unknown one: the latest version, as the
    /// .NET processor reads it).
    pub fn of_lease(mode: Option<&str>) -> Self {
        match mode {
            Some(m) if m.eq_ignore_ascii_case("Full-Fidelity Feed") => FeedMode::AllVersionsAndDeletes,
            _ => FeedMode::LatestVersion,
        }
    }

    /// The command-line spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FeedMode::LatestVersion => "latest-version",
            FeedMode::AllVersionsAndDeletes => "all-versions-and-deletes",
        }
    }
}

impl std::str::FromStr for FeedMode {
    type Err = String;

    /// `latest-version` or `all-versions-and-deletes` (any case; the CRD's `LatestVersion` and
    /// `AllVersionsAndDeletes` too).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().replace('-', "").as_str() {
            "latestversion" => Ok(FeedMode::LatestVersion),
            "allversionsanddeletes" => Ok(FeedMode::AllVersionsAndDeletes),
            _ => Err(format!(
                "expected latest-version or all-versions-and-deletes, got {s:?}"
            )),
        }
    }
}

/// What kind of change a document went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Operation {
    /// Created.
    Create,
    /// Replaced (updated or upserted over an existing one).
    Replace,
    /// Deleted (explicitly or by its time to live).
    Delete,
    /// A kind this version does not know.
    #[serde(other)]
    Unknown,
}

/// What the all-versions-and-deletes mode says about one change (the document itself is the
/// batch's document at the same index: the current image, or for a delete the previous one or
/// its identity).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    /// Create, replace or delete.
    pub operation_type: Operation,
    /// The change's logical sequence number within its partition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lsn: Option<i64>,
    /// When the change was committed (conflict-resolution time, seconds since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<u64>,
    /// The document before the change, when the container keeps previous images.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<Value>,
    /// Set on a delete caused by the document's time to live.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub time_to_live_expired: bool,
}

impl Change {
    /// The change as one JSON object: its metadata and `document` (the current image, or for a
    /// delete what identifies the deleted document) — as the stdout and HTTP handlers deliver it.
    pub fn with_document(&self, document: &Value) -> Value {
        let mut value = serde_json::json!(self);
        if let Some(map) = value.as_object_mut() {
            map.insert("document".into(), document.clone());
        }
        value
    }

    /// The metadata of a change feed item.
    pub fn of(item: &ChangeFeedItem<Value>) -> Self {
        let metadata = item.metadata();
        Change {
            operation_type: match item.operation_type() {
                Some(ChangeFeedOperationType::Create) => Operation::Create,
                Some(ChangeFeedOperationType::Replace) => Operation::Replace,
                Some(ChangeFeedOperationType::Delete) => Operation::Delete,
                _ => Operation::Unknown,
            },
            lsn: metadata.and_then(|m| m.lsn()).map(|l| l.value()),
            timestamp: metadata
                .and_then(|m| m.conflict_resolution_timestamp())
                .map(|t| t.as_secs()),
            previous: item.previous().cloned(),
            time_to_live_expired: metadata.and_then(|m| m.time_to_live_expired()).unwrap_or(false),
        }
    }

    /// The lower-case name of the operation (`create`, `replace`, `delete`, `unknown`).
    pub fn operation_name(&self) -> &'static str {
        match self.operation_type {
            Operation::Create => "create",
            Operation::Replace => "replace",
            Operation::Delete => "delete",
            Operation::Unknown => "unknown",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(value: Value) -> ChangeFeedItem<Value> {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn all_versions_envelopes_become_changes() {
        let cases = [
            (
                json!({"current": {"id": "a", "v": 1}, "metadata": {"operationType": "create", "lsn": 7, "crts": 1700000000}}),
                json!({"operationType": "create", "lsn": 7, "timestamp": 1700000000}),
            ),
            (
                json!({"current": {"id": "a", "v": 2}, "previous": {"id": "a", "v": 1},
                       "metadata": {"operationType": "replace", "lsn": 8, "crts": 1700000001, "previousImageLSN": 7}}),
                json!({"operationType": "replace", "lsn": 8, "timestamp": 1700000001, "previous": {"id": "a", "v": 1}}),
            ),
            (
                json!({"previous": {"id": "a", "v": 2},
                       "metadata": {"operationType": "delete", "lsn": 9, "crts": 1700000002, "timeToLiveExpired": true,
                                    "id": "a", "partitionKey": ["p"]}}),
                json!({"operationType": "delete", "lsn": 9, "timestamp": 1700000002, "previous": {"id": "a", "v": 2},
                       "timeToLiveExpired": true}),
            ),
            (
                json!({"current": {"id": "b"}, "metadata": {"operationType": "purge", "lsn": 10}}),
                json!({"operationType": "unknown", "lsn": 10}),
            ),
        ];
        for (envelope, expected) in cases {
            let change = Change::of(&item(envelope.clone()));
            assert_eq!(serde_json::to_value(&change).unwrap(), expected, "{envelope}");
        }
    }

    #[test]
    fn modes_parse_and_name_their_leases() {
        for (text, mode) in [
            ("latest-version", FeedMode::LatestVersion),
            ("LatestVersion", FeedMode::LatestVersion),
            ("all-versions-and-deletes", FeedMode::AllVersionsAndDeletes),
            ("AllVersionsAndDeletes", FeedMode::AllVersionsAndDeletes),
        ] {
            assert_eq!(text.parse::<FeedMode>(), Ok(mode));
            assert_eq!(FeedMode::of_lease(Some(mode.lease_mode())), mode);
        }
        assert!("full".parse::<FeedMode>().is_err());
        assert_eq!(FeedMode::of_lease(None), FeedMode::LatestVersion);
    }
}
