//! The bridge between lease continuations and the SDK's change-feed continuation tokens.
//!
//! Lease documents store, like the .NET v3 SDK, the raw server continuation of their range (the
//! response ETag). The Rust SDK resumes a change feed from its own composite token (`c1.` +
//! base64url JSON of the pipeline state, an `unordered_merge` node with one entry per EPK
//! sub-range). These two functions translate between the two, so that a lease written by the .NET
//! SDK can be resumed here and a lease written here can be read by the .NET SDK or KEDA.
//!
//! The composite format belongs to the pinned SDK version (`=1.1.0-beta.1`); the round-trip tests
//! below and the processor's integration tests fail loudly if it ever changes.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

use super::range::EpkRange;

const SDK_V1_PREFIX: &str = "c1.";

/// The raw server continuation of one EPK sub-range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeContinuation {
    /// The sub-range the continuation applies to.
    pub range: EpkRange,
    /// The raw server continuation (ETag) of that sub-range.
    pub continuation: String,
}

#[derive(Serialize, Deserialize)]
struct TokenState {
    op: String,
    rid: String,
    root: RootState,
    /// The change feed mode: `true` for all versions and deletes (absent: latest version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cfm: Option<bool>,
}

#[derive(Serialize, Deserialize)]
struct RootState {
    kind: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    active_tokens: Vec<RangedToken>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    start_from: Option<serde_json::Value>,
}

#[derive(Serialize, Deserialize)]
struct RangedToken {
    min_epk: String,
    max_epk: String,
    server_continuation: String,
}

/// Builds the SDK token that resumes the change feed of container `rid` over the given sub-ranges
/// (in the all-versions-and-deletes mode when `all_versions`: the SDK refuses to switch modes).
pub fn encode_sdk_token(rid: &str, parts: &[RangeContinuation], all_versions: bool) -> String {
    let state = TokenState {
        op: "ChangeFeed".to_owned(),
        rid: rid.to_owned(),
        root: RootState {
            kind: "unordered_merge".to_owned(),
            active_tokens: parts
                .iter()
                .map(|p| RangedToken {
                    min_epk: p.range.min.clone(),
                    max_epk: p.range.max.clone(),
                    server_continuation: p.continuation.clone(),
                })
                .collect(),
            start_from: None,
        },
        cfm: all_versions.then_some(true),
    };
    // Serializing these plain structs cannot fail.
    let json = serde_json::to_vec(&state).unwrap_or_default();
    format!("{SDK_V1_PREFIX}{}", URL_SAFE_NO_PAD.encode(json))
}

/// Reads the per-sub-range continuations out of an SDK change-feed token. Returns `None` when the
/// token is not a change-feed token of the known shape.
pub fn decode_sdk_token(token: &str) -> Option<Vec<RangeContinuation>> {
    let body = token.strip_prefix(SDK_V1_PREFIX)?;
    let json = URL_SAFE_NO_PAD.decode(body).ok()?;
    let state: TokenState = serde_json::from_slice(&json).ok()?;
    if state.op != "ChangeFeed" || state.root.kind != "unordered_merge" {
        return None;
    }
    Some(
        state
            .root
            .active_tokens
            .into_iter()
            .map(|t| RangeContinuation {
                range: EpkRange::new(t.min_epk, t.max_epk),
                continuation: t.server_continuation,
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_one_and_several_ranges() {
        let one = vec![RangeContinuation {
            range: EpkRange::new("", "7F"),
            continuation: "\"42\"".into(),
        }];
        let token = encode_sdk_token("rid==", &one, false);
        assert!(token.starts_with("c1."));
        assert_eq!(decode_sdk_token(&token), Some(one));

        let two = vec![
            RangeContinuation {
                range: EpkRange::new("", "3F"),
                continuation: "a".into(),
            },
            RangeContinuation {
                range: EpkRange::new("3F", "7F"),
                continuation: "b".into(),
            },
        ];
        assert_eq!(decode_sdk_token(&encode_sdk_token("r", &two, true)), Some(two));
    }

    #[test]
    fn reads_the_sdk_wire_shape() {
        let json = r#"{"op":"ChangeFeed","rid":"coll_rid","root":{"kind":"unordered_merge","active_tokens":[{"min_epk":"00","max_epk":"55","server_continuation":"t1"}],"start_from":{"kind":"now"}}}"#;
        let token = format!("c1.{}", URL_SAFE_NO_PAD.encode(json));
        let parts = decode_sdk_token(&token).unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].range, EpkRange::new("00", "55"));
        assert_eq!(parts[0].continuation, "t1");
    }

    #[test]
    fn rejects_other_tokens() {
        assert_eq!(decode_sdk_token("\"1234\""), None);
        assert_eq!(decode_sdk_token("c1.!!"), None);
        let query = format!(
            "c1.{}",
            URL_SAFE_NO_PAD.encode(r#"{"op":"Query","rid":"r","root":{"kind":"drained"}}"#)
        );
        assert_eq!(decode_sdk_token(&query), None);
    }
}
