//! Settling a lease's batches, with the state only that needs: checkpointing a handled batch
//! (as the checkpoint policy says, retrying a failed write rather than reading the batch again),
//! splitting the lease when a page shows its range now spans several partitions, writing the
//! deferred checkpoint before a release or a rebuild, and the lease's lag report. Also what the
//! per-lease loop and its settling share: [`Flow`], [`stop_reason`] and [`pause`].

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::cosmos::{ChangePage, EpkRange, RangeContinuation};
use crate::processor::error::LeaseError;
use crate::processor::leases::lag_report::{LATEST_LSN_PROPERTY, reported_lsn};
use crate::processor::leases::owned::{OwnedLease, UpdateError};
use crate::processor::policy::checkpoint_policy::Deferred;
use crate::processor::report::events::{CloseReason, LeaseEvent, LeaseExit};
use crate::processor::run::shared::Shared;
use crate::processor::run::split::{split, unname_merged};

/// Empty pages in a row after which a lease whose last report showed lag reports that it is
/// caught up (one write per quiet spell, not one per batch of a trickle).
const CAUGHT_UP_PAGES: u32 = 3;

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

/// The checkpoints of one owned lease: what was handled and not yet written (the checkpoint
/// policy's deferral), the lag report of the last settled page, and the quiet pages since.
pub(crate) struct LeaseCheckpointer {
    shared: Arc<Shared>,
    owned: Arc<OwnedLease>,
    /// The handled position not yet checkpointed (the checkpoint policy's deferral).
    deferred: Deferred,
    /// The lag report of the last settled page, with the continuation it belongs to.
    report: Option<(String, u64)>,
    /// Empty pages settled in a row.
    quiet_pages: u32,
    /// Whether the lease is version 0 (named by a partition key range id), once known: its
    /// pages are then checked for another partition serving it (a merge).
    version_0: Option<bool>,
}

impl LeaseCheckpointer {
    /// The checkpointer of `owned`, nothing handled yet.
    pub(crate) fn new(shared: Arc<Shared>, owned: Arc<OwnedLease>) -> Self {
        Self {
            deferred: Deferred::new(shared.options.checkpoint, std::time::Instant::now()),
            report: None,
            quiet_pages: 0,
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

    /// Records `continuation` as handled and writes it when the checkpoint policy says so,
    /// retrying a failed write rather than reading the batch again.
    async fn checkpoint(&mut self, page: &ChangePage, continuation: String) -> Flow {
        let report = reported_lsn(page, &continuation);
        self.report = report.map(|lsn| (continuation.clone(), lsn));
        let current = self.owned.current().await;
        let unchanged = current.continuation.as_deref() == Some(continuation.as_str());
        self.quiet_pages = if page.documents.is_empty() {
            self.quiet_pages.saturating_add(1)
        } else {
            0
        };
        if page.documents.is_empty() && unchanged && !self.deferred.is_pending() {
            let reported = current.properties.get(LATEST_LSN_PROPERTY).map(String::as_str);
            self.report_caught_up(reported, &continuation, report).await;
            return Flow::Go;
        }
        if !(page.documents.is_empty() && unchanged) {
            self.deferred.record(continuation, !page.documents.is_empty());
        }
        let started = std::time::Instant::now();
        let Some(continuation) = self.deferred.due(started).map(str::to_owned) else {
            // The policy defers this checkpoint (checkpoint.every).
            return Flow::Go;
        };
        let mut attempt = 0;
        let report = self.report_for(&continuation);
        loop {
            match self.owned.checkpoint_reporting(&continuation, report).await {
                Ok(_) => {
                    self.deferred.written(std::time::Instant::now());
                    let token = self.owned.token();
                    self.shared.telemetry.observer().checkpointed(token, started.elapsed());
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
                    if error.is_throttled() {
                        // Refused past its patience and the SDK's retries: the budget is spent
                        // for longer than a checkpoint waits. Throttling (counted), not an error.
                        tracing::debug!(%error, "the checkpoint was throttled; sending it again");
                        self.shared.budget.throttled(error.retry_after());
                    } else {
                        self.shared
                            .telemetry
                            .error(Some(self.owned.token()), LeaseError::Checkpoint(error));
                    }
                    if !pause(self.owned.cancelled(), self.shared.options.backoff(attempt)).await {
                        return Flow::Return(stop_reason(&self.owned));
                    }
                    attempt += 1;
                }
            }
        }
    }

    /// Writes the handled position not yet checkpointed, if any (before a release or a reader
    /// rebuild, so that nothing handled is read again).
    pub(crate) async fn write_pending(&mut self) {
        let Some(continuation) = self.deferred.pending().map(str::to_owned) else {
            return;
        };
        let started = std::time::Instant::now();
        let report = self.report_for(&continuation);
        match self.owned.checkpoint_reporting(&continuation, report).await {
            Ok(_) => {
                self.deferred.written(std::time::Instant::now());
                let token = self.owned.token();
                self.shared.telemetry.observer().checkpointed(token, started.elapsed());
            }
            Err(error) => tracing::debug!(%error, "writing the deferred checkpoint failed"),
        }
    }

    /// Writes that the lease caught up (`report`, at the unchanged `continuation`) once it was
    /// quiet for a few polls — not between two batches of a trickle — when the lease's last
    /// report (`reported`) says otherwise.
    async fn report_caught_up(&mut self, reported: Option<&str>, continuation: &str, report: Option<u64>) {
        let Some(lsn) = report else {
            return;
        };
        if self.quiet_pages < CAUGHT_UP_PAGES || reported == Some(lsn.to_string().as_str()) {
            return;
        }
        if let Err(error) = self.owned.checkpoint_reporting(continuation, report).await {
            tracing::debug!(%error, "writing the caught-up report failed");
        }
    }

    /// The lag report of the page `continuation` is the position after, if it was the last one.
    fn report_for(&self, continuation: &str) -> Option<u64> {
        self.report
            .as_ref()
            .filter(|(at, _)| at == continuation)
            .map(|(_, lsn)| *lsn)
    }
}
