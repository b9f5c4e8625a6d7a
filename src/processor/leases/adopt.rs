//! Adopting the checkpoints of a lease container written by the .NET or Java change feed
//! processor, so that switching to this processor neither reprocesses the container nor loses
//! the changes since the old processor's last checkpoint. Pure: parsing the foreign layouts and
//! planning our leases; the reads and writes are in `bootstrap`.
//!
//! Layouts:
//! - `dotnet`: .NET v3 leases — version 1 (`FeedRange.Range{min,max}`, EPK) as we write them, or
//!   version 0 / .NET v2 (`LeaseToken` = a partition key range id, no `FeedRange`).
//! - `java-pk`: Java v4 "pkversion" leases (`LeaseToken` = a partition key range id).
//! - `java-epk`: Java v4 "epkversion" leases: `feedRange.Range{min,max}` and a
//!   `ContinuationToken` that is base64 of a JSON change feed state whose `Continuation` lists
//!   `{token, range{min,max}}` entries.
//!
//! In every layout the checkpoint itself is the raw server continuation of a range, which is what
//! our leases store.

use base64::Engine;
use serde_json::Value;
use time::OffsetDateTime;

use crate::cosmos::EpkRange;

/// The processor whose leases are adopted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForeignLayout {
    /// .NET v3 (EPK or partition key range leases) and .NET v2.
    Dotnet,
    /// Java v4 partition key range ("pkversion") leases.
    JavaPk,
    /// Java v4 EPK ("epkversion") leases.
    JavaEpk,
}

impl ForeignLayout {
    /// The command-line spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ForeignLayout::Dotnet => "dotnet",
            ForeignLayout::JavaPk => "java-pk",
            ForeignLayout::JavaEpk => "java-epk",
        }
    }
}

impl std::str::FromStr for ForeignLayout {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "dotnet" => Ok(ForeignLayout::Dotnet),
            "java-pk" | "javapk" => Ok(ForeignLayout::JavaPk),
            "java-epk" | "javaepk" => Ok(ForeignLayout::JavaEpk),
            _ => Err(format!("expected dotnet, java-pk or java-epk, got {s:?}")),
        }
    }
}

/// What to adopt, and whether a live foreign owner may be ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdoptOptions {
    /// The foreign processor's layout.
    pub layout: ForeignLayout,
    /// The id prefix of its lease documents (for .NET and Java: the lease prefix / processor
    /// name they were configured with).
    pub prefix: String,
    /// Adopt even while a foreign lease was renewed within the lease expiration.
    pub force: bool,
}

/// Where a foreign lease's checkpoint applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// An effective-partition-key range.
    Epk(EpkRange),
    /// A partition key range id (its range is looked up in the container).
    PkRange(String),
}

/// One foreign checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignCheckpoint {
    /// The foreign lease document's id.
    pub id: String,
    /// Where it applies.
    pub scope: Scope,
    /// The raw server continuation (`None`: the foreign processor had not read the range yet).
    pub continuation: Option<String>,
    /// The foreign owner, if any.
    pub owner: Option<String>,
    /// When the foreign lease was last written by its owner.
    pub timestamp: Option<OffsetDateTime>,
}

/// Reads the checkpoints of one foreign lease document (a Java EPK lease can hold several:
/// one per range its stream has split into).
pub fn parse(layout: ForeignLayout, body: &Value) -> Result<Vec<ForeignCheckpoint>, String> {
    let id = body.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
    let text = |field: &str| body.get(field).and_then(Value::as_str).map(str::to_owned);
    let owner = text("Owner").filter(|o| !o.is_empty());
    let timestamp =
        text("timestamp").and_then(|t| OffsetDateTime::parse(&t, &time::format_description::well_known::Rfc3339).ok());
    // The .NET v2 library names it `PartitionId`.
    let token = text("LeaseToken")
        .or_else(|| text("PartitionId"))
        .ok_or_else(|| format!("{id}: no LeaseToken (or PartitionId)"))?;
    let raw = text("ContinuationToken").filter(|c| !c.is_empty());
    let one = |scope: Scope, continuation: Option<String>| ForeignCheckpoint {
        id: id.clone(),
        scope,
        continuation,
        owner: owner.clone(),
        timestamp,
    };
    match layout {
        ForeignLayout::Dotnet | ForeignLayout::JavaPk => match range_of(body.get("FeedRange")) {
            Some(range) => Ok(vec![one(Scope::Epk(range), raw)]),
            None if !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()) => {
                Ok(vec![one(Scope::PkRange(token), raw)])
            }
            None => Err(format!(
                "{id}: LeaseToken {token:?} is neither a range id nor has a FeedRange"
            )),
        },
        ForeignLayout::JavaEpk => {
            let range = range_of(body.get("feedRange")).ok_or_else(|| format!("{id}: no feedRange.Range"))?;
            let Some(raw) = raw else {
                return Ok(vec![one(Scope::Epk(range), None)]);
            };
            let parts = java_state_continuations(&raw).ok_or_else(|| format!("{id}: unreadable ContinuationToken"))?;
            if parts.is_empty() {
                return Ok(vec![one(Scope::Epk(range), None)]);
            }
            Ok(parts
                .into_iter()
                .map(|(part, token)| one(Scope::Epk(part), token))
                .collect())
        }
    }
}

/// `{"Range": {"min", "max"}}` (any case of `Range`).
fn range_of(value: Option<&Value>) -> Option<EpkRange> {
    let range = value?.get("Range").or_else(|| value?.get("range"))?;
    Some(EpkRange::new(range.get("min")?.as_str()?, range.get("max")?.as_str()?))
}

/// The `{token, range}` entries of a Java change feed state (base64 JSON).
fn java_state_continuations(raw: &str) -> Option<Vec<(EpkRange, Option<String>)>> {
    // The Java processor writes URL-safe base64; either alphabet, padded or not, is read.
    let lenient = base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent);
    let json = [&base64::alphabet::URL_SAFE, &base64::alphabet::STANDARD]
        .into_iter()
        .find_map(|alphabet| {
            base64::engine::GeneralPurpose::new(alphabet, lenient)
                .decode(raw.trim())
                .ok()
        })?;
    let state: Value = serde_json::from_slice(&json).ok()?;
    let entries = state.get("Continuation")?.get("Continuation")?.as_array()?;
    entries
        .iter()
        .map(|entry| {
            let range = entry.get("range")?;
            let token = entry.get("token").and_then(Value::as_str).map(str::to_owned);
            Some((
                EpkRange::new(range.get("min")?.as_str()?, range.get("max")?.as_str()?),
                token.filter(|t| !t.is_empty()),
            ))
        })
        .collect()
}

/// One lease of ours to write: the range, its continuation, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopted {
    /// Its range.
    pub range: EpkRange,
    /// The adopted checkpoint (`None`: start as configured).
    pub continuation: Option<String>,
    /// The foreign lease ids it came from.
    pub from: Vec<String>,
}

/// Our leases for the foreign checkpoints, given the container's current partition key ranges
/// (`(id, range)`). A range id that no longer exists has split: its checkpoint goes to the part
/// of the key space no remaining range id covers (the SDK fans it out to the children); when
/// several vanished ids share such a gap nobody can tell which child came from which, so that gap
/// gets no checkpoint and starts from the beginning (redelivery, never a loss). Also returns what
/// was decided that way, for the log.
pub fn plan(checkpoints: &[ForeignCheckpoint], current: &[(String, EpkRange)]) -> (Vec<Adopted>, Vec<String>) {
    let mut adopted: Vec<Adopted> = Vec::new();
    let mut gone: Vec<&ForeignCheckpoint> = Vec::new();
    for checkpoint in checkpoints {
        match &checkpoint.scope {
            Scope::Epk(range) => adopted.push(Adopted {
                range: range.clone(),
                continuation: checkpoint.continuation.clone(),
                from: vec![checkpoint.id.clone()],
            }),
            Scope::PkRange(id) => match current.iter().find(|(current_id, _)| current_id == id) {
                Some((_, range)) => adopted.push(Adopted {
                    range: range.clone(),
                    continuation: checkpoint.continuation.clone(),
                    from: vec![checkpoint.id.clone()],
                }),
                None => gone.push(checkpoint),
            },
        }
    }
    let mut notes = Vec::new();
    if !gone.is_empty() {
        let gaps = gaps(&adopted, current);
        match (gaps.as_slice(), gone.as_slice()) {
            ([gap], [only]) => adopted.push(Adopted {
                range: gap.clone(),
                continuation: only.continuation.clone(),
                from: vec![only.id.clone()],
            }),
            _ => {
                let ids: Vec<String> = gone.iter().map(|c| c.id.clone()).collect();
                notes.push(format!(
                    "the partition key ranges of {} split since their checkpoints and cannot be told apart: {} part(s) of the key space start from the beginning (redelivered, not lost)",
                    ids.join(", "),
                    gaps.len()
                ));
                adopted.extend(gaps.into_iter().map(|range| Adopted {
                    range,
                    continuation: None,
                    from: ids.clone(),
                }));
            }
        }
    }
    adopted.sort_by(|a, b| a.range.cmp(&b.range));
    (adopted, notes)
}

/// The contiguous parts of the current key space no adopted range covers.
fn gaps(adopted: &[Adopted], current: &[(String, EpkRange)]) -> Vec<EpkRange> {
    let mut uncovered: Vec<&EpkRange> = current
        .iter()
        .map(|(_, range)| range)
        .filter(|range| !adopted.iter().any(|a| a.range.overlaps(range)))
        .collect();
    uncovered.sort();
    let mut gaps: Vec<EpkRange> = Vec::new();
    for range in uncovered {
        match gaps.last_mut() {
            Some(last) if last.max == range.min => last.max = range.max.clone(),
            _ => gaps.push(range.clone()),
        }
    }
    gaps
}

/// A foreign lease renewed within `expiration` by its owner: the old processor still runs.
pub fn live_owner(
    checkpoints: &[ForeignCheckpoint],
    now: OffsetDateTime,
    expiration: std::time::Duration,
) -> Option<&ForeignCheckpoint> {
    checkpoints.iter().find(|c| {
        c.owner.is_some()
            && c.timestamp
                .is_some_and(|t| (now - t) < time::Duration::try_from(expiration).unwrap_or(time::Duration::MAX))
    })
}

/// What names the monitored container in a lease prefix.
#[derive(Debug, Clone, Copy)]
pub struct MonitoredIds<'a> {
    /// The host name of the account endpoint.
    pub host: &'a str,
    /// The database's resource id.
    pub database_rid: &'a str,
    /// The container's resource id.
    pub container_rid: &'a str,
    /// `database/container`.
    pub names: &'a str,
}

/// The ids of the leases the `layout` processor configured with lease prefix (processor name)
/// `name` wrote for the monitored container start with this: `{name}{host}_{db}_{container}..`,
/// with resource ids (.NET v2 and v3, Java epkversion) or names (Java pkversion), as each builds
/// it. A `name` that already ends with `_{db}_{container}` is that whole prefix (a processor that
/// reached the account through another host name), taken as it is. Only exactly these ids are
/// adopted: not those of `{name}-audit`, nor another container's.
pub fn lease_id_prefix(layout: ForeignLayout, name: &str, ids: &MonitoredIds) -> String {
    let (database, container) = match layout {
        ForeignLayout::JavaPk => ids.names.split_once('/').unwrap_or((ids.names, "")),
        ForeignLayout::Dotnet | ForeignLayout::JavaEpk => (ids.database_rid, ids.container_rid),
    };
    let suffix = format!("_{database}_{container}");
    let name = name.strip_suffix("..").unwrap_or(name);
    if name.ends_with(&suffix) {
        format!("{name}..")
    } else {
        format!("{name}{}{suffix}..", ids.host)
    }
}

/// Whether a document id is a foreign lease (not the `.info`/`.lock` markers the processors
/// keep beside them, nor one of our own documents).
pub fn is_lease_id(id: &str, prefix: &str) -> bool {
    id.starts_with(prefix) && !id.ends_with(".info") && !id.ends_with(".lock") && !id.contains(".instance.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn java_token(parts: &[(&str, &str, &str)]) -> String {
        let state = json!({"V": 1, "Rid": "coll==", "Mode": "INCREMENTAL", "StartFrom": {"Type": "NOW"},
            "Continuation": {"V": 1, "Rid": "coll==", "Continuation": parts.iter().map(|(min, max, token)|
                json!({"token": token, "range": {"min": min, "max": max}})).collect::<Vec<_>>(),
                "Range": {"min": "", "max": "FF"}}});
        base64::engine::general_purpose::STANDARD.encode(state.to_string())
    }

    #[test]
    fn foreign_layouts_parse_into_checkpoints() {
        let at = "2026-11-23T08:00:00.1234567Z";
        type Expected<'a> = Result<Vec<(Scope, Option<&'a str>)>, &'a str>;
        let cases: Vec<(ForeignLayout, Value, Expected)> = vec![
            (
                ForeignLayout::Dotnet,
                json!({"id": "orders.h_db_c..-3F", "version": 1, "LeaseToken": "-3F",
                       "FeedRange": {"Range": {"min": "", "max": "3F"}}, "Owner": "pod-1",
                       "ContinuationToken": "\"12\"", "timestamp": at}),
                Ok(vec![(Scope::Epk(EpkRange::new("", "3F")), Some("\"12\""))]),
            ),
            (
                ForeignLayout::Dotnet,
                json!({"id": "orders.h_db_c..0", "LeaseToken": "0", "ContinuationToken": "\"7\"", "timestamp": at}),
                Ok(vec![(Scope::PkRange("0".into()), Some("\"7\""))]),
            ),
            (
                ForeignLayout::JavaPk,
                json!({"id": "java.h_shop_orders..11", "LeaseToken": "11", "ContinuationToken": null, "Owner": ""}),
                Ok(vec![(Scope::PkRange("11".into()), None)]),
            ),
            (
                ForeignLayout::JavaEpk,
                json!({"id": "epk-h_db_c..-7F", "LeaseToken": "-7F",
                       "feedRange": {"Range": {"min": "", "max": "7F", "isMinInclusive": true, "isMaxInclusive": false}},
                       "ContinuationToken": java_token(&[("", "3F", "\"5\""), ("3F", "7F", "\"9\"")])}),
                Ok(vec![
                    (Scope::Epk(EpkRange::new("", "3F")), Some("\"5\"")),
                    (Scope::Epk(EpkRange::new("3F", "7F")), Some("\"9\"")),
                ]),
            ),
            (
                ForeignLayout::JavaEpk,
                json!({"id": "epk-x", "LeaseToken": "-7F", "ContinuationToken": "???"}),
                Err("no feedRange"),
            ),
            (
                ForeignLayout::Dotnet,
                json!({"id": "junk", "LeaseToken": "abc"}),
                Err("neither a range id"),
            ),
        ];
        for (layout, body, expected) in cases {
            let parsed = parse(layout, &body);
            match (parsed, expected) {
                (Ok(parsed), Ok(expected)) => {
                    let got: Vec<(Scope, Option<&str>)> = parsed
                        .iter()
                        .map(|c| (c.scope.clone(), c.continuation.as_deref()))
                        .collect();
                    assert_eq!(got, expected, "{body}");
                }
                (Err(error), Err(expected)) => assert!(error.contains(expected), "{error}"),
                (got, expected) => panic!("{body}: got {got:?}, expected {expected:?}"),
            }
        }
    }

    fn checkpoint(id: &str, scope: Scope, continuation: &str) -> ForeignCheckpoint {
        ForeignCheckpoint {
            id: id.into(),
            scope,
            continuation: Some(continuation.into()),
            owner: None,
            timestamp: None,
        }
    }

    #[test]
    fn the_adopted_prefix_is_exactly_the_one_each_processor_builds_for_this_container() {
        let ids = MonitoredIds {
            host: "acct.documents.azure.com",
            database_rid: "KmhJAA==",
            container_rid: "KmhJAOkGgKQ=",
            names: "shop/orders",
        };
        let cases = [
            (
                ForeignLayout::Dotnet,
                "legacy",
                "legacyacct.documents.azure.com_KmhJAA==_KmhJAOkGgKQ=..",
            ),
            (
                ForeignLayout::Dotnet,
                "",
                "acct.documents.azure.com_KmhJAA==_KmhJAOkGgKQ=..",
            ),
            (
                ForeignLayout::JavaEpk,
                "java",
                "javaacct.documents.azure.com_KmhJAA==_KmhJAOkGgKQ=..",
            ),
            (
                ForeignLayout::JavaPk,
                "java",
                "javaacct.documents.azure.com_shop_orders..",
            ),
            // A whole prefix (another host name), with or without its `..`.
            (
                ForeignLayout::Dotnet,
                "legacyother.host_KmhJAA==_KmhJAOkGgKQ=",
                "legacyother.host_KmhJAA==_KmhJAOkGgKQ=..",
            ),
            (
                ForeignLayout::JavaPk,
                "javaold.host_shop_orders..",
                "javaold.host_shop_orders..",
            ),
        ];
        for (layout, name, want) in cases {
            assert_eq!(lease_id_prefix(layout, name, &ids), want, "{layout:?} {name:?}");
        }
        // A neighbour's leases do not start with it.
        let orders = lease_id_prefix(ForeignLayout::Dotnet, "orders", &ids);
        let audit = lease_id_prefix(ForeignLayout::Dotnet, "orders-audit", &ids);
        assert!(!format!("{audit}0").starts_with(&orders));
    }

    #[test]
    fn range_ids_map_to_current_ranges_and_a_split_one_to_its_children() {
        let current = vec![
            ("1".to_owned(), EpkRange::new("7F", "FF")),
            ("2".to_owned(), EpkRange::new("", "3F")),
            ("3".to_owned(), EpkRange::new("3F", "7F")),
        ];
        let foreign = [
            checkpoint("l0", Scope::PkRange("0".into()), "\"5\""),
            checkpoint("l1", Scope::PkRange("1".into()), "\"9\""),
        ];
        let (adopted, notes) = plan(&foreign, &current);
        assert!(notes.is_empty());
        let got: Vec<(String, Option<String>)> = adopted
            .iter()
            .map(|a| (a.range.lease_token(), a.continuation.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("-7F".to_owned(), Some("\"5\"".to_owned())),
                ("7F-FF".to_owned(), Some("\"9\"".to_owned()))
            ]
        );
        // Two vanished ranges in one gap cannot be told apart: that gap starts from the beginning.
        let current = vec![
            ("2".to_owned(), EpkRange::new("", "3F")),
            ("3".to_owned(), EpkRange::new("3F", "7F")),
            ("4".to_owned(), EpkRange::new("7F", "FF")),
        ];
        let (adopted, notes) = plan(&foreign, &current);
        assert_eq!(adopted.len(), 1);
        assert_eq!(adopted[0].range, EpkRange::full());
        assert_eq!(adopted[0].continuation, None);
        assert_eq!(notes.len(), 1);
    }

    #[test]
    fn a_recent_foreign_renewal_means_a_live_owner() {
        let now = OffsetDateTime::now_utc();
        let mut live = checkpoint("l0", Scope::PkRange("0".into()), "\"5\"");
        live.owner = Some("dotnet-host".into());
        live.timestamp = Some(now - time::Duration::seconds(10));
        let mut stale = live.clone();
        stale.timestamp = Some(now - time::Duration::minutes(5));
        let expiration = std::time::Duration::from_secs(60);
        assert!(live_owner(std::slice::from_ref(&live), now, expiration).is_some());
        assert!(live_owner(&[stale], now, expiration).is_none());
    }
}
