//! The remaining-work estimator: per lease, how many operations are left to process.
//!
//! For each lease one change-feed page of at most one item is read from the lease's continuation:
//! lag = latest LSN of the range (session token) − LSN of the next unprocessed change + 1, and 0
//! when nothing is pending. The LSN of that change is read from the continuation after it (the
//! service's quoted LSN or the emulator's cursor), so one code path serves both backends. A lease
//! that was never checkpointed is estimated the same way from the processor's start position
//! (the first change after the start), so a new processor's whole backlog is visible before any
//! worker ran. A lease whose range was split since its last checkpoint is estimated per child
//! range, each from the lease's continuation.

use std::time::Duration;

use futures::StreamExt;
use serde::Serialize;
use time::OffsetDateTime;

use super::lease::{HANDLER_FAILING_PROPERTY, Lease};
use crate::cosmos::{
    ChangePage, CosmosError, EpkRange, MonitoredContainer, StartFrom, continuation_lsn, session_token_lsn,
};

/// How many leases are estimated at once.
pub const DEFAULT_CONCURRENCY: usize = 16;

const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The estimate of one lease.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseEstimate {
    /// The lease token.
    pub lease_token: String,
    /// The lease's EPK range.
    pub feed_range: EpkRange,
    /// The owner, if any.
    pub owner: Option<String>,
    /// Remaining operations.
    pub lag: u64,
    /// Seconds since the last checkpoint, when known.
    pub checkpoint_age: Option<u64>,
    /// Whether the lease has a checkpoint; otherwise `lag` counts from the processor's start position.
    pub started: bool,
    /// Set while the lease halts on a batch its handler keeps failing: since when, and the error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handler_failing: Option<String>,
    /// Why this lease could not be estimated (its `lag` is then 0 and not counted as known).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The estimate of a whole processor.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessorEstimate {
    /// The processor name.
    pub processor: String,
    /// Number of leases.
    pub lease_count: usize,
    /// Leases with lag > 0.
    pub leases_with_lag: usize,
    /// Sum of the lags of the leases that could be estimated.
    pub total_lag: u64,
    /// Leases that could not be estimated (see their `error`).
    pub leases_failed: usize,
    /// Per lease, ordered by range.
    pub leases: Vec<LeaseEstimate>,
}

impl ProcessorEstimate {
    /// Totals over per-lease estimates.
    pub fn new(processor: impl Into<String>, mut leases: Vec<LeaseEstimate>) -> Self {
        leases.sort_by(|a, b| a.feed_range.cmp(&b.feed_range));
        Self {
            processor: processor.into(),
            lease_count: leases.len(),
            leases_with_lag: leases.iter().filter(|l| l.lag > 0).count(),
            total_lag: leases.iter().map(|l| l.lag).sum(),
            leases_failed: leases.iter().filter(|l| l.error.is_some()).count(),
            leases,
        }
    }
}

/// Estimates every lease, at most `concurrency` at a time. Leases without a checkpoint count from
/// `start` (the processor's start position for such leases). A lease that cannot be estimated is
/// returned with its `error`; only a failure that concerns every lease (the routing map) is an `Err`.
pub async fn estimate_leases(
    monitored: &MonitoredContainer,
    leases: &[Lease],
    start: StartFrom,
    concurrency: usize,
) -> Result<Vec<LeaseEstimate>, CosmosError> {
    let now = OffsetDateTime::now_utc();
    // One routing-map lookup for all leases (the SDK's cached map; refreshed per lease after a split).
    let ranges = std::sync::Arc::new(monitored.feed_ranges(false).await?);
    let owned: Vec<Lease> = leases.iter().filter(|l| l.range().is_some()).cloned().collect();
    let results: Vec<LeaseEstimate> = futures::stream::iter(owned)
        .map(|lease| {
            let monitored = monitored.clone();
            let ranges = ranges.clone();
            async move {
                // One lease that cannot be read does not hide the others' work.
                estimate_lease(&monitored, &ranges, &lease, start, now)
                    .await
                    .unwrap_or_else(|error| LeaseEstimate {
                        lease_token: lease.lease_token.clone(),
                        feed_range: lease.range().cloned().unwrap_or_else(EpkRange::full),
                        owner: lease.owner.clone().filter(|o| !o.is_empty()),
                        lag: 0,
                        checkpoint_age: None,
                        started: lease.continuation.is_some(),
                        handler_failing: None,
                        error: Some(error.to_string()),
                    })
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    Ok(results)
}

async fn estimate_lease(
    monitored: &MonitoredContainer,
    ranges: &[EpkRange],
    lease: &Lease,
    start: StartFrom,
    now: OffsetDateTime,
) -> Result<LeaseEstimate, CosmosError> {
    let range = lease.range().cloned().unwrap_or_else(EpkRange::full);
    let checkpoint_age = lease
        .checkpoint_time
        .map(|t| u64::try_from((now - t).whole_seconds().max(0)).unwrap_or_default());
    let continuation = lease.continuation.as_deref().filter(|c| !c.is_empty());
    Ok(LeaseEstimate {
        lease_token: lease.lease_token.clone(),
        feed_range: range.clone(),
        owner: lease.owner.clone().filter(|o| !o.is_empty()),
        lag: range_lag(monitored, ranges, &range, continuation, lease.start_from(start)).await?,
        checkpoint_age,
        started: continuation.is_some(),
        handler_failing: lease.properties.get(HANDLER_FAILING_PROPERTY).cloned(),
        error: None,
    })
}

/// The lag of `range` from `continuation` (or from `start` without one), split per current
/// physical range when the lease spans several (after a split).
async fn range_lag(
    monitored: &MonitoredContainer,
    ranges: &[EpkRange],
    range: &EpkRange,
    continuation: Option<&str>,
    start: StartFrom,
) -> Result<u64, CosmosError> {
    let mut parts = children(ranges, range);
    if parts.len() == 1 {
        let page = one_item(monitored, range, continuation, start).await?;
        if page.continuations.len() == 1 {
            return Ok(page_lag(&page));
        }
        // The range was split since the routing map was cached.
        parts = children(&monitored.feed_ranges(true).await?, range);
    }
    let mut total = 0;
    for part in parts {
        total += page_lag(&one_item(monitored, &part, continuation, start).await?);
    }
    Ok(total)
}

/// The physical ranges inside `range` when it spans several, else `range` itself.
fn children(ranges: &[EpkRange], range: &EpkRange) -> Vec<EpkRange> {
    let inside: Vec<EpkRange> = ranges.iter().filter(|r| range.contains(r)).cloned().collect();
    if inside.len() > 1 { inside } else { vec![range.clone()] }
}

async fn one_item(
    monitored: &MonitoredContainer,
    range: &EpkRange,
    continuation: Option<&str>,
    start: StartFrom,
) -> Result<ChangePage, CosmosError> {
    let mut reader = monitored.reader(range, continuation, start, 1).await?;
    reader.next_page(READ_TIMEOUT).await
}

/// latest LSN − LSN of the first pending change + 1, or 0 when the page is empty.
fn page_lag(page: &ChangePage) -> u64 {
    let Some(first) = page.documents.first() else {
        return 0;
    };
    let next = first.get("_lsn").and_then(serde_json::Value::as_u64).or_else(|| {
        page.continuations
            .first()
            .and_then(|c| continuation_lsn(&c.continuation))
    });
    let latest = page.session_token.as_deref().and_then(session_token_lsn).or(page.lsn);
    match (latest, next) {
        (Some(latest), Some(next)) => (latest + 1).saturating_sub(next).max(1),
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cosmos::RangeContinuation;
    use serde_json::json;

    fn page(docs: Vec<serde_json::Value>, continuation: &str, session: Option<&str>) -> ChangePage {
        ChangePage {
            documents: docs,
            changes: Vec::new(),
            range_id: None,
            continuations: vec![RangeContinuation {
                range: EpkRange::full(),
                continuation: continuation.into(),
            }],
            session_token: session.map(str::to_owned),
            lsn: None,
            request_charge: 0.0,
            retries: 0,
        }
    }

    #[test]
    fn lag_from_service_and_emulator_pages() {
        // Service: the item carries _lsn, the continuation is a quoted LSN.
        assert_eq!(
            page_lag(&page(
                vec![json!({"id": "a", "_lsn": 91})],
                "\"91\"",
                Some("0:1#100#3=100")
            )),
            10
        );
        // Emulator: no _lsn, the cursor after the item carries its LSN.
        let cursor = r#"{"kind":"change_feed_cursor_v1","lsn":41,"epk":"05","id":"a"}"#;
        assert_eq!(
            page_lag(&page(vec![json!({"id": "a"})], cursor, Some("0:1#48#0=48"))),
            8
        );
        assert_eq!(page_lag(&page(vec![], "\"100\"", Some("0:1#100"))), 0);
        assert_eq!(
            page_lag(&page(vec![json!({"id": "a"})], "bad", None)),
            1,
            "unknown LSNs never look like a huge backlog"
        );
    }

    #[test]
    fn totals() {
        let lease = |token: &str, lag: u64| LeaseEstimate {
            lease_token: token.into(),
            feed_range: EpkRange::new(token, "FF"),
            owner: None,
            lag,
            checkpoint_age: None,
            started: true,
            handler_failing: None,
            error: None,
        };
        let estimate = ProcessorEstimate::new("p", vec![lease("80", 0), lease("", 5), lease("40", 7)]);
        assert_eq!(
            (estimate.lease_count, estimate.leases_with_lag, estimate.total_lag),
            (3, 2, 12)
        );
        assert_eq!(estimate.leases[0].lease_token, "");
    }
}
