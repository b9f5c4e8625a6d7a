//! The per-lease loop: read a page, hand it to the handler, checkpoint after success; detect
//! splits and replace the lease by child leases that carry the right continuations.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesOrdered;

use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::checkpoint_policy::Deferred;
use super::delivery::{Delivery, batch_id};
use super::events::{CloseReason, LeaseEvent};
use super::lease::Lease;
use super::owned::{OwnedLease, UpdateError};
use super::runtime::Shared;
use crate::cosmos::{ChangePage, CosmosError, EpkRange, ErrorKind, RangeContinuation};

/// Consecutive failed reads after which a lease counts as failing (a warning, and `/readyz` says so).
const PERSISTENT_FAILURES: u32 = 5;

/// How the processing of one lease ended.
#[derive(Debug)]
pub struct LeaseExit {
    /// Why it ended.
    pub reason: CloseReason,
    /// Child leases (owned by this instance) that replace the lease after a split.
    pub children: Vec<Lease>,
}

impl LeaseExit {
    fn closed(reason: CloseReason) -> Self {
        Self {
            reason,
            children: Vec::new(),
        }
    }
}

/// Sleeps unless cancelled first; `false` when cancelled.
async fn pause(cancel: &CancellationToken, delay: Duration) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(delay) => true,
    }
}

fn stop_reason(owned: &OwnedLease) -> LeaseExit {
    LeaseExit::closed(if owned.is_gone() {
        CloseReason::LeaseGone
    } else if owned.is_lost() {
        CloseReason::LeaseLost
    } else if owned.handoff_target().is_some() {
        CloseReason::HandedOver
    } else {
        CloseReason::Shutdown
    })
}

/// Processes one owned lease until it is lost, split, or the processor stops; a lease given up
/// (shutdown, handoff) has its last handled position written first.
pub async fn run(shared: Arc<Shared>, owned: Arc<OwnedLease>) -> LeaseExit {
    let mut deferred = Deferred::new(shared.options.checkpoint, std::time::Instant::now());
    let exit = process(shared.clone(), owned.clone(), &mut deferred).await;
    if matches!(exit.reason, CloseReason::Shutdown | CloseReason::HandedOver) {
        write_pending(&shared, &owned, &mut deferred).await;
    }
    owned.close();
    exit
}

/// Writes the handled position not yet checkpointed, if any (before a release or a reader
/// rebuild, so that nothing handled is read again).
async fn write_pending(shared: &Shared, owned: &OwnedLease, deferred: &mut Deferred) {
    let Some(continuation) = deferred.pending().map(str::to_owned) else {
        return;
    };
    let started = std::time::Instant::now();
    match owned.checkpoint(&continuation).await {
        Ok(_) => {
            deferred.written(std::time::Instant::now());
            shared.observer().checkpointed(owned.token(), started.elapsed());
        }
        Err(error) => tracing::debug!(lease = owned.token(), %error, "writing the deferred checkpoint failed"),
    }
}

async fn process(shared: Arc<Shared>, owned: Arc<OwnedLease>, deferred: &mut Deferred) -> LeaseExit {
    let cancel = owned.cancelled().clone();
    let mut failures: u32 = 0;
    let mut rebuilds: u32 = 0;
    loop {
        if cancel.is_cancelled() {
            return stop_reason(&owned);
        }
        // A reader (re)opens at the last written checkpoint: write what was handled since.
        write_pending(&shared, &owned, deferred).await;
        let lease = owned.current().await;
        let Some(range) = lease.range().cloned() else {
            shared.emit_error(
                Some(owned.token()),
                "a partition-key-range lease (.NET v2 / v3 version 0) is not processed itself: its checkpoint is adopted into an EPK lease at bootstrap".into(),
            );
            return LeaseExit::closed(CloseReason::Error);
        };
        let checkpoint = lease.continuation.clone();
        // Where the next page starts: its batch id is derived from it.
        let mut position = checkpoint.clone();
        let opened = shared
            .monitored
            .reader_in(
                shared.options.mode,
                &range,
                checkpoint.as_deref(),
                lease.start_from(shared.options.start_from),
                shared.options.max_items,
            )
            .await;
        let mut reader = match opened {
            Ok(reader) => reader,
            Err(error) => {
                if may_mean_container_gone(&error) {
                    shared.check_monitored().await;
                }
                shared.emit_error(Some(owned.token()), format!("opening the change feed: {error}"));
                if !pause(&cancel, shared.options.backoff(failures)).await {
                    return stop_reason(&owned);
                }
                failures += 1;
                continue;
            }
        };
        // Read pages until the reader has to be rebuilt from the last checkpoint. Up to
        // `max_in_flight_batches` batches are with the handler at once; they are settled
        // (checkpointed) in the order they were read, so a checkpoint never passes a batch that
        // has not finished. While the window is full, the next page is read ahead and waits
        // here (never with the handler) until a batch settles, so that the handler's time and
        // the read's overlap.
        let max_in_flight = shared.options.max_in_flight_batches.max(1) as usize;
        let mut window: FuturesOrdered<InFlight<'_>> = FuturesOrdered::new();
        let mut read_ahead: Option<(ChangePage, String)> = None;
        // After a page that shows a split: read no further until it is settled.
        let mut hold_reads = false;
        let mut idle_until: Option<tokio::time::Instant> = None;
        let mut empty_streak: u32 = 0;
        let rebuild = loop {
            let idle = idle_until.is_some_and(|t| tokio::time::Instant::now() < t);
            let can_read = read_ahead.is_none() && !hold_reads && !idle;
            let read_timeout = shared.options.read_timeout;
            tokio::select! {
                biased;
                Some((page, delivered)) = window.next(), if !window.is_empty() => {
                    match settle(&shared, &owned, &range, page, delivered, deferred).await {
                        Flow::Go => {
                            rebuilds = 0;
                            if let Some((page, id)) = read_ahead.take() {
                                window.push_back(deliver(&shared, &owned, &range, page, id));
                            }
                            if window.is_empty() {
                                hold_reads = false;
                            }
                        }
                        Flow::Rebuild => break true,
                        Flow::Return(exit) => return exit,
                    }
                }
                _ = cancel.cancelled() => {
                    // Graceful stop: the batches with the handler finish and are checkpointed.
                    if let Err(exit) = drain(&shared, &owned, &range, &mut window, deferred).await {
                        return exit;
                    }
                    return stop_reason(&owned);
                }
                _ = tokio::time::sleep_until(idle_until.unwrap_or_else(tokio::time::Instant::now)), if idle => {
                    idle_until = None;
                }
                page = timed_read(&shared, &owned, &mut reader, read_timeout), if can_read => {
                    let page = match page {
                        Ok(page) => page,
                        Err(error) => {
                            // Settle what was read before, then retry from the last checkpoint.
                            if let Err(exit) = drain(&shared, &owned, &range, &mut window, deferred).await {
                                return exit;
                            }
                            if let Some(exit) = read_failed(&shared, &owned, &range, &error, failures).await {
                                return exit;
                            }
                            if !pause(&cancel, shared.options.backoff(failures)).await {
                                shared.set_read_failing(owned.token(), None);
                                return stop_reason(&owned);
                            }
                            failures += 1;
                            break false;
                        }
                    };
                    if page.retries > 0 {
                        shared.observer().feed_read_retried(owned.token(), page.retries);
                    }
                    if failures > 0 {
                        shared.set_read_failing(owned.token(), None);
                        shared.monitored_works();
                    }
                    failures = 0;
                    let empty = page.documents.is_empty();
                    // After a freeze (SIGSTOP, a stalled VM) longer than the expiration the lease
                    // may be another instance's: make sure it is still ours before delivering.
                    if !empty && owned.may_have_expired(shared.options.expiration).await {
                        match owned.renew().await {
                            Ok(_) => {}
                            Err(UpdateError::Lost(owner)) => {
                                tracing::info!(lease = owned.token(), new_owner = ?owner, "the lease expired while this instance was stalled; not delivering");
                                return LeaseExit::closed(CloseReason::LeaseLost);
                            }
                            Err(UpdateError::Gone) => return LeaseExit::closed(CloseReason::LeaseGone),
                            Err(UpdateError::Store(error)) => {
                                tracing::debug!(lease = owned.token(), %error, "cannot confirm the lease after a stall; retrying");
                                if let Err(exit) = drain(&shared, &owned, &range, &mut window, deferred).await {
                                    return exit;
                                }
                                if !pause(&cancel, shared.options.backoff(0)).await {
                                    return stop_reason(&owned);
                                }
                                break false;
                            }
                        }
                    }
                    let id = batch_id(owned.token(), position.as_deref());
                    match page.continuations.as_slice() {
                        [only] => position = Some(only.continuation.clone()),
                        _ => hold_reads = true,
                    }
                    if empty {
                        let wait = empty_poll_wait(shared.options.poll_interval, empty_streak);
                        idle_until = Some(tokio::time::Instant::now() + wait);
                        empty_streak = empty_streak.saturating_add(1);
                    } else {
                        empty_streak = 0;
                    }
                    if window.len() < max_in_flight {
                        window.push_back(deliver(&shared, &owned, &range, page, id));
                    } else {
                        read_ahead = Some((page, id));
                    }
                }
            }
        };
        if rebuild {
            // The reader must restart from the last checkpoint (a split that could not be
            // recorded yet, for example): redelivery follows, so never in a tight loop.
            rebuilds += 1;
            tracing::info!(
                lease = owned.token(),
                rebuilds,
                "rebuilding the change feed reader from the last checkpoint"
            );
            if !pause(&cancel, shared.options.backoff(rebuilds - 1)).await {
                return stop_reason(&owned);
            }
        }
    }
}

/// The first wait after a lease caught up with its feed.
const FIRST_EMPTY_WAIT: Duration = Duration::from_millis(50);

/// How long to wait after the `streak`-th empty page in a row (0 for the first): short right
/// after changes flowed — so that a steady trickle is delivered within tens of milliseconds, not
/// half a poll interval — and tripling up to `poll` while the feed stays quiet (six reads to get
/// there), which keeps an idle lease's reads at one per `poll`.
pub fn empty_poll_wait(poll: Duration, streak: u32) -> Duration {
    FIRST_EMPTY_WAIT
        .saturating_mul(3u32.saturating_pow(streak.min(20)))
        .min(poll)
}

/// A batch with the handler: resolves to the page and whether it may be checkpointed.
type InFlight<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = (ChangePage, bool)> + Send + 'a>>;

/// Hands a page's documents to the handler (an empty page is done at once).
fn deliver<'a>(
    shared: &'a Shared,
    owned: &'a Arc<OwnedLease>,
    range: &'a EpkRange,
    page: ChangePage,
    batch_id: String,
) -> InFlight<'a> {
    Box::pin(async move {
        if page.documents.is_empty() {
            return (page, true);
        }
        let checkpoint_to = match page.continuations.as_slice() {
            [only] if only.range == *range => Some(only.continuation.clone()),
            _ => None,
        };
        let delivery = Delivery {
            shared,
            owned,
            range,
            batch_id,
            checkpoint_to,
            changes: &page.changes,
        };
        let delivered = delivery.run(&page.documents).await;
        (page, delivered)
    })
}

/// Reads the next page, recording the read in the metrics.
async fn timed_read(
    shared: &Shared,
    owned: &OwnedLease,
    reader: &mut crate::cosmos::FeedReader,
    timeout: std::time::Duration,
) -> Result<ChangePage, CosmosError> {
    let started = std::time::Instant::now();
    let page = reader.next_page(timeout).await;
    shared.observer().feed_read(
        owned.token(),
        started.elapsed(),
        page.as_ref().map(|p| p.request_charge).unwrap_or_default(),
    );
    page
}

/// What the lease loop does after a batch is settled.
enum Flow {
    /// Go on reading.
    Go,
    /// Reopen the reader at the last checkpoint.
    Rebuild,
    /// Stop processing the lease.
    Return(LeaseExit),
}

/// Checkpoints a finished batch (or splits the lease) — batches are settled in read order.
async fn settle(
    shared: &Shared,
    owned: &OwnedLease,
    range: &EpkRange,
    page: ChangePage,
    delivered: bool,
    deferred: &mut Deferred,
) -> Flow {
    if !delivered {
        // Stopped while retrying a failing batch: nothing is checkpointed past it.
        return Flow::Return(stop_reason(owned));
    }
    match advance(shared, owned, range, &page, deferred).await {
        Advance::Continue => Flow::Go,
        Advance::Rebuild => Flow::Rebuild,
        Advance::Exit(exit) => Flow::Return(exit),
    }
}

/// Lets every batch with the handler finish and settles them in order; `Err` when the lease
/// must stop (a batch stopped unfinished, the lease was lost or split).
async fn drain(
    shared: &Shared,
    owned: &OwnedLease,
    range: &EpkRange,
    window: &mut FuturesOrdered<InFlight<'_>>,
    deferred: &mut Deferred,
) -> Result<(), LeaseExit> {
    while let Some((page, delivered)) = window.next().await {
        match settle(shared, owned, range, page, delivered, deferred).await {
            Flow::Go => {}
            // The reader is rebuilt anyway after a drain; later batches are delivered again.
            Flow::Rebuild => {
                window.clear();
                return Ok(());
            }
            Flow::Return(exit) => return Err(exit),
        }
    }
    Ok(())
}

/// Reports a failed read; `Some` when it ended the lease (a split recorded from the checkpoint).
async fn read_failed(
    shared: &Shared,
    owned: &OwnedLease,
    range: &EpkRange,
    error: &CosmosError,
    failures: u32,
) -> Option<LeaseExit> {
    shared.observer().feed_read_failed(owned.token(), error.kind.as_str());
    if matches!(error.kind, ErrorKind::RangeGone | ErrorKind::SplitInProgress)
        && let Some(exit) = split_from_checkpoint(shared, owned, range).await
    {
        return Some(exit);
    }
    if may_mean_container_gone(error) {
        // Deleted (wait for it) or recreated (the processor stops): said once for all leases,
        // on /readyz.
        shared.check_monitored().await;
    }
    if is_configuration_error(error) {
        shared.emit_error(Some(owned.token()), format!("reading the change feed: {error}"));
    } else if failures + 1 >= PERSISTENT_FAILURES {
        if failures + 1 == PERSISTENT_FAILURES || (failures + 1).is_multiple_of(PERSISTENT_FAILURES * 4) {
            tracing::warn!(lease = owned.token(), attempts = failures + 1, %error, "the change feed keeps failing; retrying from the last checkpoint");
        }
    } else {
        tracing::debug!(lease = owned.token(), %error, "change feed read failed; retrying from the last checkpoint");
    }
    if error.kind == ErrorKind::Unauthorized {
        shared.set_read_failing(owned.token(), Some(refused(error)));
    } else if failures + 1 >= PERSISTENT_FAILURES || is_configuration_error(error) {
        shared.set_read_failing(owned.token(), Some(error.to_string()));
    }
    None
}

/// What to check when the account refuses the worker's credential (a rotated key, most often).
fn refused(error: &CosmosError) -> String {
    format!("{}: {error}", super::error_log::REFUSED_CREDENTIAL)
}

/// A 404, or the SDK's 400 for a range of a container that was created again.
fn may_mean_container_gone(error: &CosmosError) -> bool {
    matches!(error.kind, ErrorKind::NotFound | ErrorKind::BadRequest)
}

fn is_configuration_error(error: &CosmosError) -> bool {
    matches!(
        error.kind,
        ErrorKind::Unauthorized | ErrorKind::Forbidden | ErrorKind::BadRequest | ErrorKind::NotFound
    )
}

enum Advance {
    Continue,
    Rebuild,
    Exit(LeaseExit),
}

/// Checkpoints the position after a handled page, or splits the lease when the page shows the
/// range now spans several partitions.
async fn advance(
    shared: &Shared,
    owned: &OwnedLease,
    range: &EpkRange,
    page: &ChangePage,
    deferred: &mut Deferred,
) -> Advance {
    let single = match page.continuations.as_slice() {
        [only] if only.range == *range => Some(only.continuation.clone()),
        _ => None,
    };
    let Some(continuation) = single else {
        // The SDK followed a split of the range inside one stream: each child's position is
        // known — but a handler that checkpoints itself decides what is done, so its children
        // start from the last checkpoint it wrote.
        let parts: Vec<RangeContinuation> = if shared.handler.is_manual() {
            page.continuations
                .iter()
                .map(|part| RangeContinuation {
                    range: part.range.clone(),
                    continuation: String::new(),
                })
                .collect()
        } else {
            page.continuations.clone()
        };
        return match split(shared, owned, range, &parts).await {
            Some(exit) => Advance::Exit(exit),
            None => Advance::Rebuild,
        };
    };
    if shared.handler.is_manual() {
        // The handler checkpoints through its handles.
        return Advance::Continue;
    }
    let unchanged = owned.current().await.continuation.as_deref() == Some(continuation.as_str());
    if page.documents.is_empty() && unchanged && !deferred.is_pending() {
        return Advance::Continue;
    }
    if !(page.documents.is_empty() && unchanged) {
        deferred.record(continuation, !page.documents.is_empty());
    }
    let started = std::time::Instant::now();
    let Some(continuation) = deferred.due(started).map(str::to_owned) else {
        // The policy defers this checkpoint (checkpoint.every).
        return Advance::Continue;
    };
    let mut attempt = 0;
    loop {
        match owned.checkpoint(&continuation).await {
            Ok(_) => {
                deferred.written(std::time::Instant::now());
                shared.observer().checkpointed(owned.token(), started.elapsed());
                if !page.documents.is_empty() {
                    shared.emit(LeaseEvent::Checkpointed {
                        lease: owned.token().to_owned(),
                        documents: page.documents.len(),
                    });
                }
                return Advance::Continue;
            }
            Err(UpdateError::Lost(owner)) => {
                tracing::info!(lease = owned.token(), new_owner = ?owner, "checkpoint found the lease owned by another instance");
                return Advance::Exit(LeaseExit::closed(CloseReason::LeaseLost));
            }
            Err(UpdateError::Gone) => return Advance::Exit(LeaseExit::closed(CloseReason::LeaseGone)),
            Err(UpdateError::Store(error)) => {
                // The batch was handled; keep trying to record it rather than re-reading it.
                shared.emit_error(Some(owned.token()), format!("checkpoint failed: {error}"));
                if !pause(owned.cancelled(), shared.options.backoff(attempt)).await {
                    return Advance::Exit(stop_reason(owned));
                }
                attempt += 1;
            }
        }
    }
}

/// After a 410 or a split-window failure: if the feed ranges under the lease changed, split the
/// lease with its latest checkpoint as every child's continuation.
async fn split_from_checkpoint(shared: &Shared, owned: &OwnedLease, range: &EpkRange) -> Option<LeaseExit> {
    let ranges = match shared.monitored.feed_ranges(true).await {
        Ok(ranges) => ranges,
        Err(error) => {
            tracing::debug!(lease = owned.token(), %error, "cannot refresh feed ranges");
            return None;
        }
    };
    let children: Vec<RangeContinuation> = ranges
        .iter()
        .filter(|r| range.contains(r))
        // An empty continuation stands for the lease's latest checkpoint (filled in by `split`).
        .map(|r| RangeContinuation {
            range: r.clone(),
            continuation: String::new(),
        })
        .collect();
    if children.len() < 2 {
        return None;
    }
    split(shared, owned, range, &children).await
}

/// Replaces the lease by one child lease per part (owned by this instance), then deletes it.
/// Parts of the range not covered by `parts`, or given an empty continuation, start from the
/// parent's latest checkpoint.
async fn split(
    shared: &Shared,
    owned: &OwnedLease,
    range: &EpkRange,
    parts: &[RangeContinuation],
) -> Option<LeaseExit> {
    let parent = owned.current().await;
    let fallback = parent.continuation.clone();
    let mut pieces: Vec<(EpkRange, Option<String>)> = Vec::new();
    let mut cursor = range.min.clone();
    let mut sorted: Vec<&RangeContinuation> = parts.iter().filter(|p| range.contains(&p.range)).collect();
    sorted.sort_by(|a, b| a.range.cmp(&b.range));
    for part in sorted {
        if cursor < part.range.min {
            pieces.push((EpkRange::new(cursor.clone(), part.range.min.clone()), fallback.clone()));
        }
        let continuation = Some(part.continuation.clone())
            .filter(|c| !c.is_empty())
            .or_else(|| fallback.clone());
        pieces.push((part.range.clone(), continuation));
        cursor = part.range.max.clone();
    }
    if cursor < range.max {
        pieces.push((EpkRange::new(cursor, range.max.clone()), fallback.clone()));
    }
    if pieces.len() < 2 {
        return None;
    }
    let prefix = shared.store.prefix().to_owned();
    let mut children = Vec::new();
    for (child_range, continuation) in pieces {
        let mut child = Lease::new(&prefix, &child_range, continuation);
        child.properties = parent.properties.clone();
        child.mode = parent.mode.clone();
        child.clear_handoff();
        child.owner = Some(shared.options.instance.clone());
        child.timestamp = Some(OffsetDateTime::now_utc());
        match shared.store.create(&child).await {
            Ok(Some(created)) => children.push(created),
            Ok(None) => match shared.store.read(&child.id).await {
                // Created by an earlier attempt of this split; take it over as it is.
                Ok(Some(existing)) => children.push(existing),
                _ => return None,
            },
            Err(error) => {
                shared.emit_error(
                    Some(owned.token()),
                    format!("creating a child lease failed: {}: {error}", child.lease_token),
                );
                return None;
            }
        }
    }
    match owned.delete().await {
        Ok(()) | Err(UpdateError::Gone) => {}
        Err(error) => {
            shared.emit_error(Some(owned.token()), format!("deleting the split parent lease: {error}"));
        }
    }
    let tokens: Vec<String> = children.iter().map(|c| c.lease_token.clone()).collect();
    tracing::info!(lease = owned.token(), children = ?tokens, "lease split");
    shared.emit(LeaseEvent::Split {
        parent: owned.token().to_owned(),
        children: tokens,
    });
    Some(LeaseExit {
        reason: CloseReason::Split,
        children,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_polls_wait_short_after_changes_and_reach_the_poll_interval_when_quiet() {
        let poll = Duration::from_secs(5);
        let cases = [(0, 50), (1, 150), (2, 450), (3, 1350), (4, 4050), (5, 5000), (40, 5000)];
        for (streak, ms) in cases {
            assert_eq!(
                empty_poll_wait(poll, streak),
                Duration::from_millis(ms),
                "streak {streak}"
            );
        }
        // A poll interval shorter than the first wait is kept.
        assert_eq!(empty_poll_wait(Duration::from_millis(20), 0), Duration::from_millis(20));
    }
}
