//! The service's change feed formats and the SDK emulator's, and the pure translations between
//! them (the requests that carry them out live in [`super::edge`]).
//!
//! - A range continuation (the response ETag a client stores and sends back as `If-None-Match`)
//!   is the service's quoted LSN `"12"`: every change up to LSN 12 has been read. The SDK
//!   emulator's is a JSON cursor `{"kind":"change_feed_cursor_v1","lsn":12,"epk":…,"id":…}`
//!   that also names the last document read, because its change feed is ordered by (LSN, EPK,
//!   id). A quoted LSN is rebuilt into the cursor that comes after every document of that LSN;
//!   the edge never cuts a page inside one LSN (a transactional batch), so nothing is skipped.
//! - Change feed documents carry `_lsn` (an envelope's `current` image, and `metadata.lsn`).
//! - The session token of a read of one partition key range names that range only.

use serde_json::Value;

/// The `kind` of the SDK emulator's change feed cursor.
const CURSOR_KIND: &str = "change_feed_cursor_v1";

/// An EPK above every document's (hashed EPKs are at most 48 bytes and start below `0x40`), so a
/// cursor at `(lsn, AFTER_EVERY_EPK, "")` comes after every document of that LSN.
const AFTER_EVERY_EPK: &str = "FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF";

/// The LSN of a service continuation: `"12"` (or an unquoted `12`); `None` for anything else.
pub fn service_lsn(continuation: &str) -> Option<u64> {
    let trimmed = continuation.trim();
    let inner = trimmed
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
        .unwrap_or(trimmed);
    if inner.is_empty() || !inner.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    inner.parse().ok()
}

/// The LSN the SDK emulator's cursor names; `None` when `continuation` is not such a cursor.
pub fn cursor_lsn(continuation: &str) -> Option<u64> {
    let cursor: Value = serde_json::from_str(continuation.trim()).ok()?;
    if cursor.get("kind").and_then(Value::as_str) != Some(CURSOR_KIND) {
        return None;
    }
    cursor.get("lsn").and_then(Value::as_u64)
}

/// The service's continuation for `lsn`: `"<lsn>"`.
pub fn quoted(lsn: u64) -> String {
    format!("\"{lsn}\"")
}

/// The SDK emulator's cursor that resumes after every change up to `lsn`.
pub fn cursor_after(lsn: u64) -> String {
    serde_json::json!({"kind": CURSOR_KIND, "lsn": lsn, "epk": AFTER_EVERY_EPK, "id": ""}).to_string()
}

/// The part of a session token (`0:0#12#0=12,1:0#8#0=8`) that names partition key range
/// `range`; the token as it is when no part does.
pub fn range_session_token(token: &str, range: &str) -> String {
    token
        .split(',')
        .map(str::trim)
        .find(|part| part.split_once(':').is_some_and(|(id, _)| id == range))
        .unwrap_or(token)
        .to_owned()
}

/// The document a change feed item carries: an envelope's `current` image, or the item itself.
pub fn document_of(item: &Value) -> &Value {
    item.get("current").filter(|c| c.is_object()).unwrap_or(item)
}

/// The LSN a change feed item was stamped with ([`stamp_lsn`]).
pub fn item_lsn(item: &Value) -> Option<u64> {
    item.pointer("/metadata/lsn")
        .or_else(|| document_of(item).get("_lsn"))
        .and_then(Value::as_u64)
}

/// A session token of one range (`1:0#12#0=12`, or the older `1:12`) that names LSN `limit`
/// where it named a later one.
pub fn clamp_session_lsn(token: &str, limit: u64) -> String {
    let Some((range, rest)) = token.split_once(':') else {
        return token.to_owned();
    };
    let mut segments: Vec<String> = rest.split('#').map(str::to_owned).collect();
    let at = usize::from(segments.len() > 1);
    if let Some(lsn) = segments.get(at).and_then(|s| s.parse::<u64>().ok())
        && lsn > limit
    {
        segments[at] = limit.to_string();
    }
    format!("{range}:{}", segments.join("#"))
}

/// Writes `lsn` into a change feed item as the service does: `_lsn` on the document (an
/// envelope's `current` image) and, in an envelope, `metadata.lsn`.
pub fn stamp_lsn(item: &mut Value, lsn: u64) {
    if let Some(metadata) = item.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.insert("lsn".into(), lsn.into());
    }
    let document = match item.get("current").is_some_and(Value::is_object) {
        true => item.get_mut("current"),
        false => Some(item),
    };
    if let Some(object) = document.and_then(Value::as_object_mut) {
        object.insert("_lsn".into(), lsn.into());
    }
}

/// The LSNs of a page's documents where some are unknown (a document changed between the page
/// and the look-up of its LSN): each unknown one gets the next known one after it, the LSN up to
/// which the page's continuation has read (an upper bound, never one that was not reached).
pub fn fill_unknown(lsns: &[Option<u64>], last: u64) -> Vec<u64> {
    let mut next = last;
    let mut filled: Vec<u64> = lsns
        .iter()
        .rev()
        .map(|lsn| {
            next = lsn.unwrap_or(next).min(next);
            next
        })
        .collect();
    filled.reverse();
    filled
}

/// The partition key values of `document` for the header `x-ms-documentdb-partitionkey` (a JSON
/// array, one value per path; a missing value is `{}`, as the SDKs send "undefined"). `None` when
/// a path cannot be followed (a quoted path segment, or a value that is not a scalar).
pub fn partition_key_header(document: &Value, paths: &[String]) -> Option<String> {
    let values: Option<Vec<Value>> = paths
        .iter()
        .map(|path| {
            let mut current = document;
            for segment in path.split('/').filter(|s| !s.is_empty()) {
                if segment.starts_with('"') {
                    return None;
                }
                match current.get(segment) {
                    Some(value) => current = value,
                    None => return Some(serde_json::json!({})),
                }
            }
            (!current.is_object() && !current.is_array()).then(|| current.clone())
        })
        .collect();
    values.map(|v| Value::Array(v).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_service_continuations_and_emulator_cursors() {
        assert_eq!(service_lsn("\"12\""), Some(12));
        assert_eq!(service_lsn("12"), Some(12));
        for other in [
            "*",
            "",
            "\"\"",
            "\"1a\"",
            "-1",
            r#"{"kind":"change_feed_cursor_v1","lsn":3}"#,
        ] {
            assert_eq!(service_lsn(other), None, "{other}");
        }
        let cursor = r#"{"kind":"change_feed_cursor_v1","lsn":48,"epk":"05","id":"d1"}"#;
        assert_eq!(cursor_lsn(cursor), Some(48));
        assert_eq!(cursor_lsn(r#"{"kind":"document_feed_cursor_v1","lsn":4}"#), None);
        assert_eq!(cursor_lsn("\"5\""), None);
    }

    #[test]
    fn a_quoted_lsn_becomes_a_cursor_after_every_document_of_that_lsn() {
        let cursor = cursor_after(service_lsn("\"7\"").unwrap());
        assert_eq!(cursor_lsn(&cursor), Some(7));
        let parsed: Value = serde_json::from_str(&cursor).unwrap();
        assert_eq!(parsed["id"], "");
        // Above the largest hashed EPK (three 16-byte components) and every other real EPK.
        assert!(parsed["epk"].as_str().unwrap().len() > 96);
        assert!(parsed["epk"].as_str().unwrap().bytes().all(|b| b == b'F'));
    }

    #[test]
    fn the_session_token_of_one_range() {
        assert_eq!(range_session_token("0:0#12#0=12,1:0#8#0=8", "1"), "1:0#8#0=8");
        assert_eq!(range_session_token("0:0#12#0=12, 1:0#8#0=8", "0"), "0:0#12#0=12");
        assert_eq!(range_session_token("0:0#12#0=12", "3"), "0:0#12#0=12");
        assert_eq!(range_session_token("10:0#5,1:0#8", "1"), "1:0#8");
    }

    #[test]
    fn a_session_token_is_clamped_to_what_a_region_has() {
        assert_eq!(clamp_session_lsn("1:0#12#0=12", 9), "1:0#9#0=12");
        assert_eq!(clamp_session_lsn("1:0#8#0=8", 9), "1:0#8#0=8");
        assert_eq!(clamp_session_lsn("1:12", 9), "1:9");
        assert_eq!(clamp_session_lsn("nonsense", 9), "nonsense");
        assert_eq!(item_lsn(&json!({"id": "a", "_lsn": 5})), Some(5));
        assert_eq!(
            item_lsn(&json!({"current": {"_lsn": 6}, "metadata": {"lsn": 6}})),
            Some(6)
        );
        assert_eq!(
            item_lsn(&json!({"metadata": {"lsn": 7}})),
            Some(7),
            "a delete's envelope"
        );
        assert_eq!(item_lsn(&json!({"id": "a"})), None);
    }

    #[test]
    fn stamps_documents_and_envelopes() {
        let mut document = json!({"id": "a"});
        stamp_lsn(&mut document, 5);
        assert_eq!(document, json!({"id": "a", "_lsn": 5}));
        let mut envelope = json!({"current": {"id": "a"}, "metadata": {"crts": 1}});
        stamp_lsn(&mut envelope, 6);
        assert_eq!(
            envelope,
            json!({"current": {"id": "a", "_lsn": 6}, "metadata": {"crts": 1, "lsn": 6}})
        );
        assert_eq!(document_of(&envelope)["id"], "a");
    }

    #[test]
    fn unknown_lsns_take_the_next_known_one() {
        assert_eq!(fill_unknown(&[Some(1), None, Some(4), None], 9), vec![1, 4, 4, 9]);
        assert_eq!(fill_unknown(&[None, None], 3), vec![3, 3]);
        assert_eq!(fill_unknown(&[], 3), Vec::<u64>::new());
    }

    #[test]
    fn partition_key_headers() {
        let document = json!({"pk": "p1", "a": {"b": 3}, "flag": true});
        assert_eq!(partition_key_header(&document, &["/pk".into()]).unwrap(), r#"["p1"]"#);
        assert_eq!(
            partition_key_header(&document, &["/a/b".into(), "/flag".into()]).unwrap(),
            "[3,true]"
        );
        assert_eq!(partition_key_header(&document, &["/missing".into()]).unwrap(), "[{}]");
        assert_eq!(partition_key_header(&document, &["/a".into()]), None);
        assert_eq!(partition_key_header(&document, &["/\"a/b\"".into()]), None);
    }
}
