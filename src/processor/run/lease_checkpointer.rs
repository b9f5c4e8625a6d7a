//! Settling a lease's batches, with the state only that needs: checkpointing a handled batch
//! (as the checkpoint policy says, retrying a failed write rather than reading the batch again),
//! splitting the lease when a page shows its range now spans several partitions, writing the
//! deferred checkpoint before a release or a rebuild, and the lease's lag report. Also what the
//! per-lease loop and its settling share: [`Flow`], [`stop_reason`] and [`pause`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::cosmos::{ChangePage, EpkRange, RangeContinuation};
use crate::processor::error::LeaseError;
use crate::processor::leases::lag_report::{LagReport, reported_lag};
use crate::processor::leases::lease::{Lease, LeaseStoreError};
use crate::processor::leases::owned::{OwnedLease, UpdateError};
use crate::processor::leases::work_report::{CheckpointReport, WriteCounter};
use crate::processor::policy::checkpoint_policy::{Deferred, caught_up_report_due};
use crate::processor::report::events::{CloseReason, LeaseEvent, LeaseExit};
use crate::processor::run::shared::Shared;
use crate::processor::run::split::{split, unname_merged};

/// What the lease loop does after a batch is settled.
pub(crate) enum Flow {
    /// Go on reading.
    Go,
    /// Reopen the reader at the last checkpoint.
    Rebuild,
    /// Stop processing the lease.
    Return(LeaseExit),
}

/// Sleeps unless cancelled first; `false` when cancelled.
pub(crate) async fn pause(cancel: &CancellationToken, delay: Duration) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(delay) => true,
    }
}

/// Why processing stops when the lease's token was cancelled.
pub(crate) fn stop_reason(owned: &OwnedLease) -> LeaseExit {
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

/// The lag report of a settled page, with the position after it.
struct PageReport {
    continuation: String,
    lag: LagReport,
}

/// The checkpoints of one owned lease: what was handled and not yet written (the checkpoint
/// policy's deferral), the lag report of the last settled page, and the quiet pages since.
pub(crate) struct LeaseCheckpointer {
    shared: Arc<Shared>,
    owned: Arc<OwnedLease>,
    /// The handled position not yet checkpointed (the checkpoint policy's deferral).
    deferred: Deferred,
    /// The lag report of the last settled page, with the continuation it belongs to.
    report: Option<PageReport>,
    /// Counts the writes into the lease's partition (the owned lease keeps their rate).
    writes: WriteCounter,
    /// Empty pages settled in a row.
    quiet_pages: u32,
    /// When the last batch was settled (or the lease taken up): since when the lease is quiet.
    last_batch: Instant,
    /// Whether the lease is version 0 (named by a partition key range id), once known: its
    /// pages are then checked for another partition serving it (a merge).
    version_0: Option<bool>,
}

impl LeaseCheckpointer {
    /// The checkpointer of `owned`, nothing handled yet.
    pub(crate) fn new(shared: Arc<Shared>, owned: Arc<OwnedLease>) -> Self {
        Self {
            deferred: Deferred::new(shared.options.checkpoint, Instant::now()),
            report: None,
            writes: WriteCounter::default(),
            quiet_pages: 0,
            last_batch: Instant::now(),
            version_0: None,
            shared,
            owned,
        }
    }

    /// Checkpoints a finished batch, or splits the lease when the page shows the range now spans
    /// several partitions — batches are settled in read order.
    pub(crate) async fn settle(&mut self, range: &EpkRange, page: ChangePage, delivered: bool) -> Flow {
        if !delivered {
            // Stopped while retrying a failing batch: nothing is checkpointed past it.
            return Flow::Return(stop_reason(&self.owned));
        }
        // Counted before the checkpoint, which carries the rate; counted now, when the batch is
        // done (spread over the time it was with the handler, the documents of batches still
        // with it — a lease's batches waiting on others' — would be left out of the recent past).
        let documents = page.documents.len();
        self.owned.count_handled(documents);
        if documents > 0 {
            self.shared.worker_capacity.handled(documents, Instant::now());
        }
        let Some(continuation) = page.single_continuation(Some(range)).map(str::to_owned) else {
            return match split(&self.shared, &self.owned, range, &self.split_parts(&page)).await {
                Some(exit) => Flow::Return(exit),
                None => Flow::Rebuild,
            };
        };
        if self.shared.handler.is_manual() {
            // The handler checkpoints through its handles.
            return Flow::Go;
        }
        // A child of the batch's span; an empty page (no batch) is checkpointed without one.
        let span = if page.documents.is_empty() {
            tracing::Span::none()
        } else {
            tracing::info_span!("checkpoint")
        };
        let flow = self.checkpoint(&page, continuation).instrument(span).await;
        if matches!(flow, Flow::Go) && self.served_by_another_partition(&page).await {
            if let Some(exit) = unname_merged(&self.shared, &self.owned, true).await {
                return Flow::Return(exit);
            }
            // Not rewritten (not a merge, or the partitions could not be listed): not tried on
            // every page; the lease's next acquisition tries again.
            self.version_0 = Some(false);
        }
        flow
    }

    /// Whether a version-0 lease's page came from a partition other than the one the lease
    /// names: its partition merged (the reader reads by EPK range, so it sees no 410 for it).
    async fn served_by_another_partition(&mut self, page: &ChangePage) -> bool {
        if page.range_id.as_deref().is_none_or(|id| id == self.owned.token()) {
            return false;
        }
        match self.version_0 {
            Some(known) => known,
            None => {
                let known = self.owned.current().await.names_a_partition();
                self.version_0 = Some(known);
                known
            }
        }
    }

    /// The SDK followed a split of the range inside one stream: each child's position is known —
    /// but a handler that checkpoints itself decides what is done, so its children start from the
    /// last checkpoint it wrote.
    fn split_parts(&self, page: &ChangePage) -> Vec<RangeContinuation> {
        if !self.shared.handler.is_manual() {
            return page.continuations.clone();
        }
        page.continuations
            .iter()
            .map(|part| RangeContinuation {
                range: part.range.clone(),
                continuation: String::new(),
            })
            .collect()
    }

    /// Records `continuation` as handled and writes it when the checkpoint policy says so (an
    /// empty page: see [`LeaseCheckpointer::after_empty_page`]), retrying a failed write rather
    /// than reading the batch again.
    async fn checkpoint(&mut self, page: &ChangePage, continuation: String) -> Flow {
        let report = LagReport::of(page, &continuation);
        self.report = report.map(|lag| PageReport {
            continuation: continuation.clone(),
            lag,
        });
        if let Some(report) = report {
            let counted = self
                .writes
                .count(page.range_id.as_deref(), report.latest_lsn, Instant::now());
            self.owned.count_writes(counted.writes, counted.over);
        }
        let started = Instant::now();
        let position = if page.documents.is_empty() {
            let current = self.owned.current().await;
            self.after_empty_page(&current, continuation, report.is_some(), started)
        } else {
            self.quiet_pages = 0;
            self.last_batch = started;
            self.deferred.record(continuation, true);
            // `None`: the policy defers this checkpoint (checkpoint.every).
            self.deferred.due(started).map(str::to_owned)
        };
        match position {
            Some(position) => self.write(page, &position, started).await,
            None => Flow::Go,
        }
    }

    /// The position an empty page writes, if any: what it moved, when the policy's interval
    /// says so; the lease's position with a report that it caught up, once it was quiet for a
    /// while ([`caught_up_report_due`]); else nothing — a position only empty pages moved waits
    /// for the next batch, a release or that report.
    fn after_empty_page(
        &mut self,
        current: &Lease,
        continuation: String,
        reported: bool,
        now: Instant,
    ) -> Option<String> {
        self.quiet_pages = self.quiet_pages.saturating_add(1);
        if current.continuation.as_deref() != Some(continuation.as_str()) {
            self.deferred.record(continuation.clone(), false);
        }
        if let Some(due) = self.deferred.due(now) {
            return Some(due.to_owned());
        }
        let quiet_for = now.saturating_duration_since(self.last_batch);
        let poll = self.shared.options.poll_interval;
        let report_due = reported && caught_up_report_due(self.quiet_pages, quiet_for, poll, reported_lag(current));
        report_due.then_some(continuation)
    }

    /// Writes `position` (the page's, or one handled before it), until it is written or the
    /// lease is lost.
    async fn write(&mut self, page: &ChangePage, position: &str, started: Instant) -> Flow {
        let mut attempt = 0;
        let report = self.report_for(position);
        loop {
            match self.owned.checkpoint_reporting(position, report).await {
                Ok(_) => {
                    self.written(started);
                    let token = self.owned.token();
                    if !page.documents.is_empty() {
                        self.shared.telemetry.emit(LeaseEvent::Checkpointed {
                            lease: token.to_owned(),
                            documents: page.documents.len(),
                        });
                    }
                    return Flow::Go;
                }
                Err(UpdateError::Lost(owner)) => {
                    tracing::info!(new_owner = ?owner, "checkpoint found the lease owned by another instance");
                    return Flow::Return(LeaseExit::closed(CloseReason::LeaseLost));
                }
                Err(UpdateError::Gone) => return Flow::Return(LeaseExit::closed(CloseReason::LeaseGone)),
                Err(UpdateError::Store(error)) => {
                    // The batch was handled; keep trying to record it rather than re-reading it.
                    self.failed(error);
                    if !pause(self.owned.cancelled(), self.shared.options.backoff(attempt)).await {
                        return Flow::Return(stop_reason(&self.owned));
                    }
                    attempt += 1;
                }
            }
        }
    }

    /// Writes the handled position not yet checkpointed, if any (before a release or a reader
    /// rebuild, so that nothing handled is read again), retried like any checkpoint until it is
    /// written, the lease is no longer this instance's, or an expiration has passed (the lease
    /// may then be taken anyway) — also once the lease's processing is cancelled: it is the
    /// handoff's last write before the release.
    pub(crate) async fn write_pending(&mut self) {
        let Some(continuation) = self.deferred.pending().map(str::to_owned) else {
            return;
        };
        let started = Instant::now();
        let report = self.report_for(&continuation);
        let mut attempt = 0;
        loop {
            let error = match self.owned.checkpoint_pending(&continuation, report).await {
                Ok(_) => return self.written(started),
                Err(UpdateError::Store(error)) => error,
                Err(error) => return tracing::debug!(%error, "the deferred checkpoint is not this instance's to write"),
            };
            self.failed(error);
            let wait = self.shared.options.backoff(attempt);
            if started.elapsed() + wait >= self.shared.options.expiration {
                return tracing::warn!(
                    "the deferred checkpoint could not be written within an expiration; its batches may be delivered again"
                );
            }
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    /// A checkpoint write failed: counted as throttling when the budget refused it past its
    /// patience and the SDK's retries (the budget is spent for longer than a checkpoint waits),
    /// else reported as an error.
    fn failed(&self, error: LeaseStoreError) {
        if error.is_throttled() {
            tracing::debug!(%error, "the checkpoint was throttled; sending it again");
            self.shared.budget.throttled(error.retry_after());
        } else {
            self.shared
                .telemetry
                .error(Some(self.owned.token()), LeaseError::Checkpoint(error));
        }
    }

    /// A position was written (its write started at `started`): nothing is pending, and the
    /// observer hears of it.
    fn written(&mut self, started: Instant) {
        self.deferred.written(Instant::now());
        let token = self.owned.token();
        self.shared.telemetry.observer().checkpointed(token, started.elapsed());
    }

    /// What a checkpoint at `continuation` reports: the lag report of the page it is the
    /// position after, if it was the last one.
    fn report_for(&self, continuation: &str) -> CheckpointReport {
        CheckpointReport {
            lag: self
                .report
                .as_ref()
                .filter(|page| page.continuation == continuation)
                .map(|page| page.lag),
        }
    }
}
