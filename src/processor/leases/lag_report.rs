//! Each lease's lag, as its owner reports it: at every checkpoint the worker writes into the
//! lease's `properties` (the .NET layout's string map, which the .NET SDK and KEDA carry along
//! untouched) the partition's latest LSN that the read of the checkpointed page saw (its
//! session token) — or, when that read found nothing more pending (an empty page, or one that
//! reached the latest LSN), the checkpoint's own LSN. Then lag = reported LSN − the LSN of the
//! checkpoint: exact operations for a lease over a whole partition, and 0 exactly for a caught-up
//! lease of any width. A lease narrower than its partition with a positive difference is not
//! exact (the partition's LSNs count the other sub-ranges' writes too); whoever estimates reads
//! its change feed instead. A checkpoint written without a report (a handler that checkpoints
//! itself, a deferred checkpoint of an older page) removes the property, so a report always
//! belongs to the checkpoint beside it.
//!
//! Beside it the owner writes the `_ts` of the newest change the checkpointed page held
//! (`checkpointedTs`): a lease with lag has its oldest pending change written at or after it (the
//! feed serves changes in the order written), so the age of that `_ts` bounds how stale the lease
//! is from above — what the operator reports as freshness for a lease it does not read.

use crate::cosmos::{ChangePage, continuation_lsn, session_token_lsn};
use crate::processor::leases::lease::Lease;

/// Lease property: the partition's latest LSN when the lease was last read (see the module).
pub const LATEST_LSN_PROPERTY: &str = "latestLsn";

/// Lease property: the `_ts` of the newest change up to the lease's checkpoint (see the module).
pub const CHECKPOINTED_TS_PROPERTY: &str = "checkpointedTs";

/// What an owner reports with a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LagReport {
    /// The partition's latest LSN when the checkpointed page was read ([`reported_lsn`]).
    pub latest_lsn: u64,
    /// The `_ts` of the newest change the checkpointed page held, if it held any.
    pub newest_ts: Option<i64>,
}

impl LagReport {
    /// The report of a checkpoint at `continuation`, the position after `page`; `None` when the
    /// LSNs are unknown.
    pub fn of(page: &ChangePage, continuation: &str) -> Option<Self> {
        Some(Self {
            latest_lsn: reported_lsn(page, continuation)?,
            newest_ts: page.documents.iter().filter_map(|d| d.get("_ts")?.as_i64()).max(),
        })
    }
}

/// What the owner reports for a checkpoint at `continuation`, the position after `page`; `None`
/// when the LSNs are unknown.
pub fn reported_lsn(page: &ChangePage, continuation: &str) -> Option<u64> {
    let reached = continuation_lsn(continuation)?;
    if page.documents.is_empty() {
        return Some(reached);
    }
    let latest = page.session_token.as_deref().and_then(session_token_lsn).or(page.lsn)?;
    Some(latest.max(reached))
}

/// Writes `report` (or removes an older one) into `lease`. A report without a change's `_ts`
/// (an empty page) keeps the one before when it moved nothing: the checkpoint still covers that
/// change.
pub fn record_report(lease: &mut Lease, report: Option<LagReport>) {
    let Some(report) = report else {
        lease.properties.remove(LATEST_LSN_PROPERTY);
        lease.properties.remove(CHECKPOINTED_TS_PROPERTY);
        return;
    };
    lease
        .properties
        .insert(LATEST_LSN_PROPERTY.into(), report.latest_lsn.to_string());
    if let Some(ts) = report.newest_ts {
        lease.properties.insert(CHECKPOINTED_TS_PROPERTY.into(), ts.to_string());
    }
}

/// The `_ts` of the newest change up to `lease`'s checkpoint, as its owner reported it.
pub fn checkpointed_ts(lease: &Lease) -> Option<i64> {
    lease.properties.get(CHECKPOINTED_TS_PROPERTY)?.parse().ok()
}

/// The lag the owner of `lease` reported: reported LSN − checkpoint LSN; `None` without a
/// report or a checkpoint whose LSN is known.
pub fn reported_lag(lease: &Lease) -> Option<u64> {
    let reported: u64 = lease.properties.get(LATEST_LSN_PROPERTY)?.parse().ok()?;
    let checkpoint = continuation_lsn(lease.continuation.as_deref()?)?;
    Some(reported.saturating_sub(checkpoint))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cosmos::{EpkRange, RangeContinuation};
    use serde_json::json;

    fn page(documents: usize, session: Option<&str>) -> ChangePage {
        ChangePage {
            documents: vec![json!({"id": "d"}); documents],
            changes: Vec::new(),
            continuations: vec![RangeContinuation {
                range: EpkRange::full(),
                continuation: String::new(),
            }],
            session_token: session.map(str::to_owned),
            lsn: None,
            range_id: None,
            request_charge: 0.0,
            retries: 0,
        }
    }

    #[test]
    fn the_report_is_the_latest_lsn_or_the_checkpoint_when_caught_up() {
        let cursor = |lsn: u64| format!(r#"{{"kind":"change_feed_cursor_v1","lsn":{lsn}}}"#);
        let cases = [
            // A page behind the partition's latest LSN: the latest.
            (page(100, Some("0:1#500#3=500")), "\"400\"".to_owned(), Some(500)),
            // A page that reached it (emulator cursors too): the checkpoint's LSN.
            (page(7, Some("0:1#48")), cursor(48), Some(48)),
            // An empty page: caught up, whatever the latest LSN (deletes, other sub-ranges).
            (page(0, Some("0:1#90")), "\"80\"".to_owned(), Some(80)),
            // Unknown LSNs: no report.
            (page(3, None), "\"80\"".to_owned(), None),
            (page(0, Some("0:1#90")), "not-a-position".to_owned(), None),
        ];
        for (page, continuation, expected) in cases {
            assert_eq!(reported_lsn(&page, &continuation), expected, "{continuation}");
        }
    }

    #[test]
    fn the_lag_is_the_report_minus_the_checkpoint() {
        let lease = |continuation: Option<&str>, report: Option<u64>| {
            let mut lease = Lease::new("p", &EpkRange::full(), continuation.map(str::to_owned));
            record_report(
                &mut lease,
                report.map(|latest_lsn| LagReport {
                    latest_lsn,
                    newest_ts: None,
                }),
            );
            lease
        };
        let cases = [
            (lease(Some("\"400\""), Some(500)), Some(100)),
            (lease(Some("\"400\""), Some(400)), Some(0)),
            (lease(Some("\"400\""), Some(300)), Some(0)),
            (lease(Some("\"400\""), None), None),
            (lease(None, Some(500)), None),
        ];
        for (lease, expected) in cases {
            assert_eq!(reported_lag(&lease), expected, "{:?}", lease.properties);
        }
        let mut reported = lease(Some("\"400\""), Some(500));
        record_report(&mut reported, None);
        assert!(
            reported.properties.is_empty(),
            "a checkpoint without a report removes the old one"
        );
    }

    #[test]
    fn the_newest_change_s_ts_goes_with_the_report_and_stays_over_empty_pages() {
        let mut full = page(2, Some("0:1#500#3=500"));
        full.documents = vec![json!({"id": "a", "_ts": 1_000}), json!({"id": "b", "_ts": 1_004})];
        let report = LagReport::of(&full, "\"400\"");
        assert_eq!(
            report,
            Some(LagReport {
                latest_lsn: 500,
                newest_ts: Some(1_004)
            })
        );
        let mut lease = Lease::new("p", &EpkRange::full(), Some("\"400\"".to_owned()));
        record_report(&mut lease, report);
        assert_eq!(checkpointed_ts(&lease), Some(1_004));
        let empty = LagReport::of(&page(0, Some("0:1#500")), "\"400\"");
        record_report(&mut lease, empty);
        assert_eq!(checkpointed_ts(&lease), Some(1_004), "an empty page moved nothing");
        record_report(&mut lease, None);
        assert_eq!(checkpointed_ts(&lease), None);
    }
}
