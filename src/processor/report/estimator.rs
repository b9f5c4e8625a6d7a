//! The remaining-work estimator: per lease, how many changes are left to process.
//!
//! A lease's range is cut along the current physical partitions into pieces ([`pieces`]):
//! - A **whole partition** (the usual lease) is estimated from LSNs with one change-feed page of
//!   at most one item read from the lease's continuation: lag = latest LSN of the partition
//!   (session token) − LSN of the next unprocessed change + 1, and 0 when nothing is pending
//!   (operations, exact and one request whatever the backlog). The LSN of that change is read
//!   from the continuation after it (the service's quoted LSN or the emulator's cursor), so one
//!   code path serves both backends.
//! - **Part of a partition** (`leases.perPartition` > 1) cannot be estimated from LSNs: the
//!   session token and the LSNs are the whole partition's, so a difference of LSNs also counts
//!   the other sub-ranges' writes. Its pending documents are counted instead: its change feed
//!   (which holds exactly the documents hashed into it) is read from the lease's continuation in
//!   pages of [`COUNT_PAGE_ITEMS`], at most [`COUNT_PAGES`] reads, stopping at an empty page or
//!   once the read has passed the partition's latest LSN. That is exact up to a couple of
//!   thousand pending documents per lease at one to three requests; a larger backlog is
//!   extrapolated from what the reads counted ([`Tally::estimate`]).
//!
//! - **After a split** (or a merge) a child partition's LSNs go on from its parent's, and its
//!   change feed from a position before the split holds the parent's changes of its own keys at
//!   the parent's LSNs: a difference of LSNs counts its siblings' changes of that time too (every
//!   child the parent's whole backlog). When the partitions read are not the ones the container
//!   was created with (their ids are not `0..n`: [`split_since`]), a whole partition with more
//!   than one change pending is counted as a part is, so each change is counted once.
//!
//! A lease that was never checkpointed is estimated the same way from the processor's start
//! position (the first change after the start), so a new processor's whole backlog is visible
//! before any worker ran. A lease whose range was split since its last checkpoint is estimated
//! per child partition, each from the lease's continuation. A split parent whose children leases
//! cover its range (left behind by a crash between creating them and deleting it) is not
//! estimated: the children hold its changes, and the processor deletes it once it is free.

use std::time::Duration;

use futures::StreamExt;
use time::OffsetDateTime;

use crate::cosmos::{
    ChangePage, CosmosError, EpkRange, MonitoredContainer, StartFrom, continuation_lsn, session_token_lsn,
};
use crate::processor::leases::lease::{Lease, LeaseSnapshot};
use crate::processor::policy::balancer::{ranges_of, superseded};
pub use crate::processor::report::estimate::{LeaseEstimate, ProcessorEstimate, lease_estimate};
use crate::processor::report::keda_reading::keda_reading;

/// How many leases are estimated at once.
pub const DEFAULT_CONCURRENCY: usize = 16;

const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Documents per read when the pending documents of part of a partition are counted.
pub const COUNT_PAGE_ITEMS: u32 = 1000;

/// Reads at most per counted part of a partition; a backlog beyond them is extrapolated.
pub const COUNT_PAGES: usize = 3;

/// `estimate` of `snapshot`'s leases with what needs the container's partitions now (the SDK's
/// cached routing map: no request): KEDA's reading of the leases, and the writes a second into
/// the container as the owners measured them; unchanged when the partitions are unknown.
pub async fn with_partition_figures(
    estimate: ProcessorEstimate,
    snapshot: &LeaseSnapshot,
    monitored: &MonitoredContainer,
) -> ProcessorEstimate {
    match monitored.feed_ranges(false).await {
        Ok(partitions) => estimate
            .with_keda(keda_reading(snapshot, &partitions))
            .with_arrivals(&partitions),
        Err(_) => estimate,
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
    let first = estimate_all(
        monitored,
        &ranges,
        estimated(leases),
        start,
        now,
        Count::Parts,
        concurrency,
    )
    .await;
    let seen: std::collections::BTreeSet<String> = first.iter().flat_map(|(_, read)| read.range_ids.clone()).collect();
    if !split_since(&seen, ranges.len()) {
        return Ok(first.into_iter().map(|(estimate, _)| estimate).collect());
    }
    // After a split: the leases whose lag came from LSNs are counted instead.
    let (again, kept): (Vec<_>, Vec<_>) = first
        .into_iter()
        .partition(|(estimate, read)| read.from_lsns && estimate.error.is_none());
    let mut results: Vec<LeaseEstimate> = kept.into_iter().map(|(estimate, _)| estimate).collect();
    let earlier: std::collections::BTreeMap<String, u32> = again
        .iter()
        .map(|(estimate, _)| (estimate.lease_token.clone(), estimate.reads))
        .collect();
    let again: Vec<Lease> = leases
        .iter()
        .filter(|l| earlier.contains_key(&l.lease_token))
        .cloned()
        .collect();
    let counted = estimate_all(monitored, &ranges, again, start, now, Count::All, concurrency).await;
    results.extend(counted.into_iter().map(|(estimate, _)| LeaseEstimate {
        reads: estimate.reads + earlier.get(&estimate.lease_token).copied().unwrap_or_default(),
        ..estimate
    }));
    Ok(results)
}

/// Which pieces of a lease are counted rather than told from LSNs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Count {
    /// Parts of partitions only.
    Parts,
    /// Every piece (after a split: a child's LSNs also number its siblings' earlier changes).
    All,
}

/// Estimates `leases`, at most `concurrency` at a time: each estimate with what its reads found.
async fn estimate_all(
    monitored: &MonitoredContainer,
    ranges: &std::sync::Arc<Vec<EpkRange>>,
    leases: Vec<Lease>,
    start: StartFrom,
    now: OffsetDateTime,
    count: Count,
    concurrency: usize,
) -> Vec<(LeaseEstimate, PiecesLag)> {
    futures::stream::iter(leases)
        .map(|lease| {
            let monitored = monitored.clone();
            let ranges = ranges.clone();
            async move {
                // One lease that cannot be read does not hide the others' work.
                estimate_lease(&monitored, &ranges, &lease, start, now, count)
                    .await
                    // What the lease itself says (a failing handler, a stall) is kept: a lease
                    // whose feed cannot be read is the one most likely to be stalled.
                    .unwrap_or_else(|error| {
                        let failed = LeaseEstimate {
                            error: Some(error.to_string()),
                            reads: 1,
                            oldest_pending_seconds: None,
                            ..lease_estimate(&lease, 0, now)
                        };
                        (failed, PiecesLag::default())
                    })
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await
}

/// Whether the partitions read (`seen`, their partition key range ids) are not all ones the
/// container was created with: a new container's `n` partitions are `0` to `n - 1`, and a split
/// or a merge gives its results new, higher ids. `partitions`: how many there are now.
pub fn split_since(seen: &std::collections::BTreeSet<String>, partitions: usize) -> bool {
    seen.iter().any(|id| !id.parse::<usize>().is_ok_and(|n| n < partitions))
}

/// The leases to estimate: those with an EPK range, except split parents whose children leases
/// cover their range ([`superseded`]: the children hold their changes).
pub fn estimated(leases: &[Lease]) -> Vec<Lease> {
    let ranges = ranges_of(leases);
    let obsolete = superseded(&ranges);
    leases
        .iter()
        .filter(|l| l.range().is_some() && !obsolete.contains(&l.id))
        .cloned()
        .collect()
}

async fn estimate_lease(
    monitored: &MonitoredContainer,
    ranges: &[EpkRange],
    lease: &Lease,
    start: StartFrom,
    now: OffsetDateTime,
    count: Count,
) -> Result<(LeaseEstimate, PiecesLag), CosmosError> {
    let range = lease.range().cloned().unwrap_or_else(EpkRange::full);
    let continuation = lease.continuation.as_deref().filter(|c| !c.is_empty());
    let position = Position {
        continuation,
        start: lease.start_from(start),
    };
    let read = range_lag(monitored, ranges, &range, position, count).await?;
    // A `_ts` ahead of this machine's clock counts as new (0 s) — lag > 0 still says it is pending.
    let oldest = read
        .oldest_ts
        .filter(|_| !read.age_unknown)
        .map(|ts| u64::try_from(now.unix_timestamp() - ts).unwrap_or(0));
    let estimate = LeaseEstimate {
        reads: read.reads,
        oldest_pending_seconds: if read.lag == 0 { Some(0) } else { oldest },
        ..lease_estimate(lease, read.lag, now)
    };
    Ok((estimate, read))
}

/// Where a lease reads from: its continuation, or its start position without one.
#[derive(Debug, Clone, Copy)]
struct Position<'a> {
    continuation: Option<&'a str>,
    start: StartFrom,
}

/// The lag of `range` from `continuation` (or from `start` without one), summed over its
/// pieces, and the requests that took. When a read finds a piece split since the routing map
/// was read, the map is read again and the pieces are estimated anew.
async fn range_lag(
    monitored: &MonitoredContainer,
    ranges: &[EpkRange],
    range: &EpkRange,
    position: Position<'_>,
    count: Count,
) -> Result<PiecesLag, CosmosError> {
    let first = pieces_lag(monitored, ranges, range, position, count).await?;
    if !first.split {
        return Ok(first);
    }
    let fresh = monitored.feed_ranges(true).await?;
    let again = pieces_lag(monitored, &fresh, range, position, count).await?;
    Ok(PiecesLag {
        reads: first.reads + 1 + again.reads,
        ..again
    })
}

/// What estimating some pieces found: their lag, whether a read found one split, the reads,
/// the partitions that served them, and whether some lag was told from LSNs (more than one
/// change of a whole partition).
#[derive(Debug, Clone, Default)]
struct PiecesLag {
    lag: u64,
    split: bool,
    reads: u32,
    range_ids: Vec<String>,
    from_lsns: bool,
    /// The `_ts` of the oldest first pending change the reads saw.
    oldest_ts: Option<i64>,
    /// Whether a piece had lag but its first pending change no `_ts` (its age is unknown).
    age_unknown: bool,
}

/// The sum of the lags of `range`'s pieces over `ranges`.
async fn pieces_lag(
    monitored: &MonitoredContainer,
    ranges: &[EpkRange],
    range: &EpkRange,
    position: Position<'_>,
    count: Count,
) -> Result<PiecesLag, CosmosError> {
    let mut total = PiecesLag::default();
    for piece in pieces(ranges, range) {
        let found = piece_lag(monitored, &piece, position, count).await?;
        total.lag += found.lag;
        total.split |= found.split;
        total.reads += found.reads;
        total.range_ids.extend(found.range_ids);
        total.from_lsns |= found.from_lsns;
        total.oldest_ts = total.oldest_ts.into_iter().chain(found.oldest_ts).min();
        total.age_unknown |= found.age_unknown || (found.lag > 0 && found.oldest_ts.is_none());
    }
    Ok(total)
}

/// How a piece of a lease's range is estimated.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    /// A whole physical partition: from its LSNs.
    Partition(EpkRange),
    /// Part of a physical partition: its pending documents are counted.
    Part(EpkRange),
}

/// Whether `range` covers whole physical partitions of `ranges` (one or more), so that its lag
/// can be told from LSNs.
pub fn covers_whole_partitions(ranges: &[EpkRange], range: &EpkRange) -> bool {
    pieces(ranges, range)
        .iter()
        .all(|piece| matches!(piece, Piece::Partition(_)))
}

/// `range` cut along the physical partitions `ranges`: one piece per partition it overlaps
/// (`range` itself, as a partition, when the map has none).
fn pieces(ranges: &[EpkRange], range: &EpkRange) -> Vec<Piece> {
    let pieces: Vec<Piece> = ranges
        .iter()
        .filter_map(|partition| {
            let part = partition.intersection(range)?;
            Some(if part == *partition {
                Piece::Partition(part)
            } else {
                Piece::Part(part)
            })
        })
        .collect();
    if pieces.is_empty() {
        vec![Piece::Partition(range.clone())]
    } else {
        pieces
    }
}

/// The lag of one piece, whether the read found it split (it spans several ranges now), and
/// the reads it took.
async fn piece_lag(
    monitored: &MonitoredContainer,
    piece: &Piece,
    position: Position<'_>,
    count: Count,
) -> Result<PiecesLag, CosmosError> {
    let Position { continuation, start } = position;
    match (piece, count) {
        (Piece::Partition(range), Count::Parts) => {
            let page = one_item(monitored, range, continuation, start).await?;
            let lag = page_lag(&page);
            Ok(PiecesLag {
                lag,
                split: page.continuations.len() > 1,
                reads: 1,
                oldest_ts: first_ts(&page),
                age_unknown: false,
                range_ids: page.range_id.into_iter().collect(),
                from_lsns: lag > 1,
            })
        }
        (Piece::Partition(range) | Piece::Part(range), _) => count_pending(monitored, range, continuation, start).await,
    }
}

/// Counts the documents pending in `range` (part of a partition) from `continuation`, at most
/// [`COUNT_PAGES`] reads of [`COUNT_PAGE_ITEMS`]; beyond them the rest is extrapolated.
async fn count_pending(
    monitored: &MonitoredContainer,
    range: &EpkRange,
    continuation: Option<&str>,
    start: StartFrom,
) -> Result<PiecesLag, CosmosError> {
    let mut reader = monitored.reader(range, continuation, start, COUNT_PAGE_ITEMS).await?;
    let mut tally = Tally::after(continuation.and_then(continuation_lsn));
    let mut oldest_ts = None;
    for reads in 1..=COUNT_PAGES as u32 {
        let page = reader.next_page(READ_TIMEOUT).await?;
        if page.continuations.len() > 1 {
            return Ok(PiecesLag {
                lag: tally.counted,
                split: true,
                reads,
                ..PiecesLag::default()
            });
        }
        oldest_ts = oldest_ts.or(first_ts(&page));
        if tally.add(&page) {
            return Ok(PiecesLag {
                lag: tally.counted,
                split: false,
                reads,
                oldest_ts,
                ..PiecesLag::default()
            });
        }
    }
    Ok(PiecesLag {
        lag: tally.estimate(),
        split: false,
        reads: COUNT_PAGES as u32,
        oldest_ts,
        ..PiecesLag::default()
    })
}

/// What the counting reads of part of a partition found so far.
#[derive(Debug, Clone, Default, PartialEq)]
struct Tally {
    /// Documents counted.
    counted: u64,
    /// The LSN the count started after (the lease's continuation), when known.
    from: Option<u64>,
    /// The LSN the reads reached (the continuation after the last page).
    reached: Option<u64>,
    /// The partition's latest LSN.
    latest: Option<u64>,
}

impl Tally {
    /// Nothing counted yet, from the position after LSN `from`.
    fn after(from: Option<u64>) -> Self {
        Self {
            from,
            ..Self::default()
        }
    }

    /// Counts a page; `true` when nothing more is pending: the page was empty, or the read has
    /// passed the partition's latest LSN.
    fn add(&mut self, page: &ChangePage) -> bool {
        let Some(first) = page.documents.first() else {
            return true;
        };
        if self.from.is_none() {
            self.from = first
                .get("_lsn")
                .and_then(serde_json::Value::as_u64)
                .map(|lsn| lsn.saturating_sub(1));
        }
        self.counted += page.documents.len() as u64;
        self.reached = page
            .continuations
            .first()
            .and_then(|c| continuation_lsn(&c.continuation));
        self.latest = latest_lsn(page);
        matches!((self.reached, self.latest), (Some(reached), Some(latest)) if reached >= latest)
    }

    /// The documents counted, plus what the LSNs after the last read hold if the range keeps the
    /// share of the partition's changes it had over the counted ones (documents per LSN since
    /// `from`, 0 when unknown).
    fn estimate(&self) -> u64 {
        let (Some(reached), Some(latest)) = (self.reached, self.latest) else {
            return self.counted;
        };
        let span = reached.saturating_sub(self.from.unwrap_or(0)).max(self.counted).max(1);
        let rest = u128::from(latest.saturating_sub(reached)) * u128::from(self.counted) / u128::from(span);
        self.counted.saturating_add(u64::try_from(rest).unwrap_or(u64::MAX))
    }
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

/// The `_ts` (server seconds) of the page's first change.
fn first_ts(page: &ChangePage) -> Option<i64> {
    page.documents.first()?.get("_ts")?.as_i64()
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
    match (latest_lsn(page), next) {
        (Some(latest), Some(next)) => (latest + 1).saturating_sub(next).max(1),
        _ => 1,
    }
}

/// The latest LSN of the partition that served `page`.
fn latest_lsn(page: &ChangePage) -> Option<u64> {
    page.session_token.as_deref().and_then(session_token_lsn).or(page.lsn)
}

#[cfg(test)]
#[path = "estimator_tests.rs"]
mod tests;
