//! Reading logical sequence numbers (LSNs) out of change feed continuations and session tokens,
//! whatever the backend: the service's quoted LSN (`"\"1526353662\""`) or the in-memory
//! emulator's JSON cursor (`{"kind":"change_feed_cursor_v1","lsn":48,...}`).

/// The LSN a raw range continuation points at (the last change it has passed).
pub fn continuation_lsn(raw: &str) -> Option<u64> {
    let trimmed = raw.trim();
    if trimmed.starts_with('{') {
        let cursor: serde_json::Value = serde_json::from_str(trimmed).ok()?;
        return cursor.get("lsn").and_then(serde_json::Value::as_u64);
    }
    trimmed.trim_matches('"').parse().ok()
}

/// The latest LSN of a range from a session token `<range>:<version>#<lsn>[#...]` (or the
/// older `<range>:<lsn>`): the segment after the version when there is one, else the first.
pub fn session_token_lsn(token: &str) -> Option<u64> {
    let first = token.split(',').next()?;
    let after = first.split_once(':').map_or(first, |(_, rest)| rest);
    let segments: Vec<&str> = after.split('#').collect();
    let lsn = if segments.len() > 1 { segments[1] } else { segments[0] };
    lsn.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continuation_lsn_reads_both_formats() {
        assert_eq!(continuation_lsn("\"1526353662\""), Some(1_526_353_662));
        assert_eq!(continuation_lsn("42"), Some(42));
        assert_eq!(
            continuation_lsn(r#"{"kind":"change_feed_cursor_v1","lsn":48,"epk":"05","id":"d1"}"#),
            Some(48)
        );
        assert_eq!(
            continuation_lsn(r#"{"kind":"change_feed_cursor_v1","lsn":0,"epk":"","id":""}"#),
            Some(0)
        );
        assert_eq!(continuation_lsn("not-an-lsn"), None);
        assert_eq!(continuation_lsn(r#"{"kind":"x"}"#), None);
    }

    #[test]
    fn session_token_lsn_reads_v1_and_v2_tokens() {
        assert_eq!(session_token_lsn("0:1#5#0=5"), Some(5));
        assert_eq!(session_token_lsn("3:-1#1234"), Some(1234));
        assert_eq!(session_token_lsn("0:77"), Some(77));
        assert_eq!(session_token_lsn("0:1#5#0=5,1:1#3#0=3"), Some(5));
        assert_eq!(session_token_lsn("garbage"), None);
    }
}
