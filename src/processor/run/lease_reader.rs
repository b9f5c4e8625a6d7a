//! The per-lease loop as a reader with state: read a page, hand it to the handler, settle it
//! (checkpoint after success, in read order), split the lease when its range now spans several
//! partitions; reopen the feed at the last checkpoint after a failure.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesOrdered;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, Span};

use crate::cosmos::{ChangePage, CosmosError, EpkRange, ErrorKind, FeedReader};
use crate::processor::budgets::reads::Ticket;
use crate::processor::error::LeaseError;
use crate::processor::leases::owned::OwnedLease;
use crate::processor::leases::worker_capacity::Working;
use crate::processor::policy::stall::{Activity, StallAction, StallWatch};
use crate::processor::report::events::{CloseReason, LeaseExit};
use crate::processor::run::delivery::{Delivery, batch_id};
use crate::processor::run::lease_checkpointer::{Flow, LeaseCheckpointer, pause, stop_reason};
use crate::processor::run::shared::Shared;
use crate::processor::run::split::split_from_checkpoint;

/// Consecutive failed reads after which a lease counts as failing (a warning, and `/readyz` says so).
const PERSISTENT_FAILURES: u32 = 5;

/// The first wait after a lease caught up with its feed.
const FIRST_EMPTY_WAIT: Duration = Duration::from_millis(50);

/// Processes one owned lease until it is lost, split, or the processor stops; a lease given up
/// (shutdown, handoff) has its last handled position written first.
pub(crate) async fn run(shared: Arc<Shared>, owned: Arc<OwnedLease>) -> LeaseExit {
    if let Some(exit) = crate::processor::run::split::reshape(&shared, &owned).await {
        owned.close();
        return exit;
    }
    let shared_stall_timeout = shared.options.stall_timeout;
    let handler_limit = shared.handler.time_limit();
    let mut reader = LeaseReader {
        checkpointer: LeaseCheckpointer::new(shared.clone(), owned.clone()),
        shared,
        owned,
        failures: 0,
        rebuilds: 0,
        stall: StallWatch::new(shared_stall_timeout, Instant::now()).with_handler_limit(handler_limit),
    };
    let exit = reader.process().await;
    // A stalled lease keeps what was handled before the stall too (deferred checkpoints).
    if matches!(
        exit.reason,
        CloseReason::Shutdown | CloseReason::HandedOver | CloseReason::Stalled
    ) {
        reader.checkpointer.write_pending().await;
    }
    // Whatever ended it (a split found by a failed read, a loss), this lease's read failures
    // are no longer a problem of this processor.
    reader.shared.health.set_read_failing(reader.owned.token(), None);
    reader.owned.close();
    exit
}

/// How long to wait after an empty page, the feed having been quiet for `quiet_for` (since the
/// last page with changes, or since the reader opened): half that, at least
/// [`FIRST_EMPTY_WAIT`] and at most `poll`: a change waits about half the quiet time before it
/// (tens of milliseconds in a steady trickle, also across a few empty pages in a row), and an
/// idle lease reaches one read per `poll` within fifteen reads.
pub fn empty_poll_wait(poll: Duration, quiet_for: Duration) -> Duration {
    (quiet_for / 2).clamp(FIRST_EMPTY_WAIT.min(poll), poll)
}

/// A batch with the handler: resolves to the page and whether it may be checkpointed.
type InFlight = std::pin::Pin<Box<dyn std::future::Future<Output = (ChangePage, bool)> + Send>>;

/// One lease's processing state, across reader rebuilds.
struct LeaseReader {
    shared: Arc<Shared>,
    owned: Arc<OwnedLease>,
    /// Settles handled batches: checkpoints (and what they defer), splits, lag reports.
    checkpointer: LeaseCheckpointer,
    /// Consecutive failed opens and reads.
    failures: u32,
    /// Consecutive reader rebuilds without a settled batch.
    rebuilds: u32,
    /// Whether the lease advances ([`crate::processor::policy::stall`]).
    stall: StallWatch,
}

/// A feed reader opened at the lease's last checkpoint, and the batches read from it.
struct Session {
    reader: FeedReader,
    range: EpkRange,
    /// Where the next page starts: its batch id is derived from it.
    position: Option<String>,
    /// The batches with the handler, settled in the order they were read.
    window: FuturesOrdered<InFlight>,
    /// The window's batches: id, documents, since when (for the report of a stall), and span.
    handling: std::collections::VecDeque<(String, usize, Instant, Span)>,
    /// Since when a read is under way.
    reading_since: Option<Instant>,
    /// The read budget's admission of the read under way.
    ticket: Option<Ticket>,
    /// A page read while the window was full: it waits here (never with the handler).
    read_ahead: Option<(ChangePage, String, Span)>,
    /// The span of the read that just finished.
    read_span: Option<Span>,
    /// After a page that shows a split: read no further until it is settled.
    hold_reads: bool,
    /// No read before then (the feed was caught up).
    idle_until: Option<Instant>,
    /// When the last page with changes was read (or the reader opened).
    changes_seen: Instant,
    /// While the lease has changes to go through: counted in what this worker handles a
    /// second while it has work.
    working: Option<Working>,
}

/// What comes after a reader session.
enum After {
    /// Open a new reader at once (the wait after a failure is over).
    Reopen,
    /// Open a new reader after a backoff (the reader had to be rebuilt).
    Rebuild,
    /// Stop processing the lease.
    Exit(LeaseExit),
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

/// Reads the next page, recording the read in the metrics; with the read's span (a trace's
/// root: the batch of a page with documents is its child).
async fn timed_read(
    shared: &Shared,
    owned: &OwnedLease,
    reader: &mut FeedReader,
    timeout: Duration,
) -> (Result<ChangePage, CosmosError>, Span) {
    let span =
        tracing::info_span!(parent: None, "read", processor = %shared.options.processor_name, lease = %owned.token());
    // A batch just handed to the handler is a task spawned from this one, which waits in this
    // worker thread's next-task slot (no other thread may take it) until this task yields: let
    // it start before the read's own work, so that the handler's time and the read's overlap.
    tokio::task::yield_now().await;
    let started = std::time::Instant::now();
    let page = reader.next_page(timeout).instrument(span.clone()).await;
    shared.telemetry.observer().feed_read(
        owned.token(),
        started.elapsed(),
        page.as_ref().map(|p| p.request_charge).unwrap_or_default(),
    );
    (page, span)
}

impl LeaseReader {
    fn cancel(&self) -> &CancellationToken {
        self.owned.cancelled()
    }

    /// Reports a failed step of this lease.
    fn report(&self, error: LeaseError) {
        self.shared.telemetry.error(Some(self.owned.token()), error);
    }

    /// Looks the monitored container up (shared by all leases; a recreated one halts).
    async fn check_monitored(&self) {
        let shared = &self.shared;
        shared
            .health
            .check_monitored(&shared.monitored, shared.options.acquire_interval)
            .await;
    }

    /// Opens readers at the last checkpoint and reads from them until the lease stops.
    async fn process(&mut self) -> LeaseExit {
        loop {
            if self.cancel().is_cancelled() {
                return stop_reason(&self.owned);
            }
            // A reader (re)opens at the last written checkpoint: write what was handled since.
            tracing::debug!("writing pending checkpoints before opening the reader");
            self.checkpointer.write_pending().await;
            tracing::debug!("opening the change feed reader");
            let after = match self.open().await {
                Ok(mut session) => self.read(&mut session).await,
                Err(after) => after,
            };
            match after {
                After::Reopen => {}
                After::Rebuild => {
                    // The reader must restart from the last checkpoint (a split that could not
                    // be recorded yet, for example): redelivery follows, so never in a tight loop.
                    self.rebuilds += 1;
                    let rebuilds = self.rebuilds;
                    tracing::info!(rebuilds, "rebuilding the change feed reader from the last checkpoint");
                    if !pause(self.cancel(), self.shared.options.backoff(rebuilds - 1)).await {
                        return stop_reason(&self.owned);
                    }
                }
                After::Exit(exit) => return exit,
            }
        }
    }

    /// Opens the lease's change feed at its last checkpoint.
    async fn open(&mut self) -> Result<Session, After> {
        let lease = self.owned.current().await;
        let Some(range) = lease.range().cloned() else {
            self.report(LeaseError::PartitionKeyRangeLease);
            return Err(After::Exit(LeaseExit::closed(CloseReason::Error)));
        };
        let options = &self.shared.options;
        let opened = self
            .shared
            .monitored
            .reader_in(
                options.mode,
                &range,
                lease.continuation.as_deref(),
                lease.start_from(options.start_from),
                self.shared.reads.page_items(options.max_items),
            )
            .await;
        tracing::debug!(ok = opened.is_ok(), "change feed reader opened");
        match opened {
            Ok(reader) => Ok(Session {
                reader,
                range,
                position: lease.continuation,
                window: FuturesOrdered::new(),
                handling: Default::default(),
                reading_since: None,
                ticket: None,
                read_ahead: None,
                read_span: None,
                hold_reads: false,
                idle_until: None,
                changes_seen: Instant::now(),
                working: None,
            }),
            Err(error) => {
                if may_mean_container_gone(&error) {
                    self.check_monitored().await;
                }
                self.report(LeaseError::OpenFeed(error));
                if !pause(self.cancel(), self.shared.options.backoff(self.failures)).await {
                    return Err(After::Exit(stop_reason(&self.owned)));
                }
                self.failures += 1;
                Err(After::Reopen)
            }
        }
    }

    /// Reads pages until the reader has to be rebuilt from the last checkpoint. Up to
    /// `max_in_flight_batches` batches are with the handler at once; they are settled
    /// (checkpointed) in the order they were read, so a checkpoint never passes a batch that has
    /// not finished. While the window is full, the next page is read ahead and waits here (never
    /// with the handler) until a batch settles, so that the handler's time and the read's overlap.
    async fn read(&mut self, s: &mut Session) -> After {
        let read_timeout = self.shared.options.read_timeout;
        let watch_stalls = !self.shared.options.stall_timeout.is_zero();
        let cancel = self.cancel().clone();
        loop {
            let idle = s.idle_until.is_some_and(|t| Instant::now() < t);
            let can_read = s.read_ahead.is_none() && !s.hold_reads && !idle;
            if can_read && s.reading_since.is_none() && !self.admit(s).await {
                continue;
            }
            tokio::select! {
                biased;
                Some((page, delivered)) = s.window.next(), if !s.window.is_empty() => {
                    if let Some(after) = self.on_settled(s, page, delivered).await {
                        return after;
                    }
                }
                _ = cancel.cancelled() => {
                    // Graceful stop: the batches with the handler finish and are checkpointed.
                    if let Err(exit) = self.drain(s).await {
                        return After::Exit(exit);
                    }
                    return After::Exit(stop_reason(&self.owned));
                }
                _ = tokio::time::sleep_until(s.idle_until.unwrap_or_else(Instant::now)), if idle => {
                    s.idle_until = None;
                }
                _ = tokio::time::sleep_until(self.stall.next_check()), if watch_stalls => {
                    if let Some(after) = self.check_stall(s).await {
                        return after;
                    }
                }
                (page, span) = timed_read(&self.shared, &self.owned, &mut s.reader, read_timeout), if can_read => {
                    let read_started = s.reading_since.take().unwrap_or_else(Instant::now);
                    s.read_span = Some(span);
                    let ticket = s.ticket.take();
                    let after = match page {
                        Ok(page) => {
                            if let Some(ticket) = ticket {
                                ticket.spent(Instant::now(), page.request_charge, page.documents.len());
                            }
                            self.on_page(s, page, read_started).await
                        }
                        Err(error) => Some(self.on_read_failed(s, error).await),
                    };
                    if let Some(after) = after {
                        return after;
                    }
                }
            }
        }
    }

    /// Whether the next read may start now within the read budget: then it is under way (its
    /// ticket taken, its page sized to the budget); otherwise the reader idles until it may.
    async fn admit(&mut self, s: &mut Session) -> bool {
        let now = Instant::now();
        let reads = &self.shared.reads;
        match reads.admit(now) {
            Ok(ticket) => {
                s.ticket = Some(ticket);
                s.reading_since = Some(now);
                if let Some(items) = reads.resize(s.reader.max_items(), self.shared.options.max_items)
                    && let Ok(Some(from)) = s.reader.resize_from(items)
                    && let Ok(resized) = self.shared.monitored.resized(from).await
                {
                    s.reader = resized;
                }
                true
            }
            Err(wait) => {
                s.idle_until = Some(now + wait);
                false
            }
        }
    }

    /// Settles the oldest batch of the window (batches settle in read order), under its span.
    async fn settle_oldest(&mut self, s: &mut Session, page: ChangePage, delivered: bool) -> Flow {
        let span = s.handling.pop_front().map_or_else(Span::none, |(.., span)| span);
        // An empty page settled after every batch before it, none with changes read since:
        // the lease caught up.
        if page.documents.is_empty() && s.handling.iter().all(|(_, documents, ..)| *documents == 0) {
            s.working = None;
        }
        self.checkpointer
            .settle(&s.range, page, delivered)
            .instrument(span)
            .await
    }

    /// A batch finished: settle it, then hand over the page read ahead.
    async fn on_settled(&mut self, s: &mut Session, page: ChangePage, delivered: bool) -> Option<After> {
        match self.settle_oldest(s, page, delivered).await {
            Flow::Go => {
                self.rebuilds = 0;
                // A batch handled, or an empty page after all earlier ones: the lease advanced.
                self.stall.progressed(Instant::now());
                if let Some((page, id, read)) = s.read_ahead.take() {
                    self.send(s, page, id, read);
                }
                if s.window.is_empty() {
                    s.hold_reads = false;
                }
                None
            }
            Flow::Rebuild => Some(After::Rebuild),
            Flow::Return(exit) => Some(After::Exit(exit)),
        }
    }

    /// A page was read (by the read started at `read_started`): deliver it (or keep it until
    /// the window has room).
    async fn on_page(&mut self, s: &mut Session, page: ChangePage, read_started: Instant) -> Option<After> {
        let token = self.owned.token();
        if page.retries > 0 {
            self.shared.telemetry.observer().feed_read_retried(token, page.retries);
        }
        if self.failures > 0 {
            self.shared.health.set_read_failing(token, None);
            self.shared.health.monitored_works();
        }
        self.failures = 0;
        let empty = page.documents.is_empty();
        let id = batch_id(self.owned.token(), s.position.as_deref());
        match page.single_continuation(None) {
            Some(position) => s.position = Some(position.to_owned()),
            None => s.hold_reads = true,
        }
        let now = Instant::now();
        if empty {
            let wait = empty_poll_wait(
                self.shared.options.poll_interval,
                now.saturating_duration_since(s.changes_seen),
            );
            s.idle_until = Some(now + self.shared.reads.idle_wait(wait));
        } else {
            s.changes_seen = now;
            if s.working.is_none() {
                s.working = Some(self.shared.worker_capacity.start_working(read_started.into_std()));
            }
        }
        let read = s.read_span.take().unwrap_or_else(Span::none);
        if s.window.len() < self.shared.options.max_in_flight_batches.max(1) as usize {
            self.send(s, page, id, read);
        } else {
            s.read_ahead = Some((page, id, read));
        }
        None
    }

    /// A read failed: settle what was read before, then retry from the last checkpoint.
    async fn on_read_failed(&mut self, s: &mut Session, error: CosmosError) -> After {
        if let Err(exit) = self.drain(s).await {
            return After::Exit(exit);
        }
        if let Some(exit) = self.read_failed(&s.range, &error).await {
            return After::Exit(exit);
        }
        if !pause(self.cancel(), self.shared.options.backoff(self.failures)).await {
            self.shared.health.set_read_failing(self.owned.token(), None);
            return After::Exit(stop_reason(&self.owned));
        }
        self.failures += 1;
        After::Reopen
    }

    /// Puts a page in the window (its documents go to the handler, in a `batch` span that is a
    /// child of the page's `read`).
    fn send(&self, s: &mut Session, page: ChangePage, id: String, read: Span) {
        let documents = page.documents.len();
        let span = if documents == 0 {
            Span::none()
        } else {
            let processor = &self.shared.options.processor_name;
            let lease = self.owned.token();
            let count = documents as i64;
            tracing::info_span!(parent: &read, "batch", processor = %processor, lease = %lease, batch = %id, documents = count)
        };
        s.handling
            .push_back((id.clone(), documents, Instant::now(), span.clone()));
        s.window.push_back(self.deliver(&s.range, page, id, span));
    }

    /// Judges whether the lease stalled, and acts on it: `Some` when the reader restarts or the
    /// lease is released. A handler answering with errors is failing, not stalled.
    async fn check_stall(&mut self, s: &mut Session) -> Option<After> {
        let now = Instant::now();
        if let Some(failed) = self.owned.handler_failed_at() {
            self.stall.excused(failed);
        }
        let activity = match (
            s.handling.iter().find(|(_, documents, ..)| *documents > 0),
            s.reading_since,
        ) {
            (Some((batch, documents, since, _)), _) => Activity::Handling {
                batch: batch.clone(),
                documents: *documents,
                since: *since,
            },
            (None, Some(since)) => Activity::Reading(since),
            (None, None) => Activity::Waiting,
        };
        self.stall.doing(activity);
        let action = self.stall.judge(now)?;
        crate::processor::run::stall_report::report(&self.shared, &self.owned, &action).await;
        match action {
            StallAction::Restart(_) => Some(After::Reopen),
            StallAction::Release(_) => {
                // To another instance here (it takes the lease up at its next listing), else
                // to nobody: this one leaves it for a lease expiration.
                if let Some(to) = self.shared.another_instance() {
                    tracing::info!(to = %to, "giving the stalled lease to another instance");
                    self.owned.release_to(&to);
                }
                Some(After::Exit(LeaseExit::closed(CloseReason::Stalled)))
            }
            StallAction::Recovered => None,
        }
    }

    /// Hands a page's documents to the handler (an empty page is done at once) in a task of
    /// its own, so that the delivery goes on while the reader settles the batch before it: a
    /// delivery confirming ownership may hold the lease's lock, which that batch's checkpoint
    /// waits for — polled by the reader alone, the two would wait on each other for good. The
    /// task ends with the window (dropped: aborted).
    fn deliver(&self, range: &EpkRange, page: ChangePage, batch_id: String, span: Span) -> InFlight {
        if page.documents.is_empty() {
            return Box::pin(std::future::ready((page, true)));
        }
        let shared = self.shared.clone();
        let owned = self.owned.clone();
        let range = range.clone();
        let page = Arc::new(page);
        let handed = page.clone();
        let task = async move {
            let checkpoint_to = handed.single_continuation(Some(&range)).map(str::to_owned);
            let delivery = Delivery {
                shared: &shared,
                owned: &owned,
                range: &range,
                batch_id,
                checkpoint_to,
                changes: &handed.changes,
            };
            delivery.run(&handed.documents).await
        };
        let task = AbortOnDropHandle::new(tokio::spawn(task.instrument(span)));
        Box::pin(async move {
            let delivered = match task.await {
                Ok(delivered) => delivered,
                Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
                Err(_) => false,
            };
            (Arc::try_unwrap(page).unwrap_or_else(|page| (*page).clone()), delivered)
        })
    }

    /// Lets every batch with the handler finish and settles them in order; `Err` when the lease
    /// must stop (a batch stopped unfinished, the lease was lost or split).
    async fn drain(&mut self, s: &mut Session) -> Result<(), LeaseExit> {
        while let Some((page, delivered)) = s.window.next().await {
            match self.settle_oldest(s, page, delivered).await {
                Flow::Go => {}
                // The reader is rebuilt anyway after a drain; later batches are delivered again.
                Flow::Rebuild => {
                    s.window.clear();
                    s.handling.clear();
                    return Ok(());
                }
                Flow::Return(exit) => return Err(exit),
            }
        }
        Ok(())
    }

    /// Reports a failed read; `Some` when it ended the lease (a split recorded from the checkpoint).
    async fn read_failed(&mut self, range: &EpkRange, error: &CosmosError) -> Option<LeaseExit> {
        let token = self.owned.token();
        self.shared
            .telemetry
            .observer()
            .feed_read_failed(token, error.kind.as_str());
        if matches!(error.kind, ErrorKind::RangeGone | ErrorKind::SplitInProgress)
            && let Some(exit) = split_from_checkpoint(&self.shared, &self.owned, range).await
        {
            return Some(exit);
        }
        if may_mean_container_gone(error) {
            // Deleted (wait for it) or recreated (the processor stops): said once for all leases,
            // on /readyz.
            self.check_monitored().await;
        }
        let attempts = self.failures + 1;
        if error.kind != ErrorKind::Transient {
            // Failing with an error (reported below): not a stall, which a restart could heal.
            self.stall.excused(Instant::now());
        }
        if is_configuration_error(error) {
            self.report(LeaseError::ReadFeed(error.clone()));
        } else if attempts >= PERSISTENT_FAILURES {
            if attempts == PERSISTENT_FAILURES || attempts.is_multiple_of(PERSISTENT_FAILURES * 4) {
                tracing::warn!(attempts, %error, "the change feed keeps failing; retrying from the last checkpoint");
            }
        } else {
            tracing::debug!(%error, "change feed read failed; retrying from the last checkpoint");
        }
        if error.kind == ErrorKind::Unauthorized {
            let refused = format!("{}: {error}", crate::processor::report::error_log::REFUSED_CREDENTIAL);
            self.shared.health.set_read_failing(token, Some(refused));
        } else if attempts >= PERSISTENT_FAILURES || is_configuration_error(error) {
            self.shared.health.set_read_failing(token, Some(error.to_string()));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_polls_wait_half_the_quiet_time_between_the_first_wait_and_the_poll_interval() {
        let poll = Duration::from_secs(5);
        let ms = Duration::from_millis;
        let cases = [
            (0, 50),
            (60, 50),
            (100, 50),
            (150, 75),
            (1_000, 500),
            (9_000, 4_500),
            (60_000, 5_000),
        ];
        for (quiet, wait) in cases {
            assert_eq!(empty_poll_wait(poll, ms(quiet)), ms(wait), "quiet for {quiet} ms");
        }
        // A poll interval shorter than the first wait is kept.
        assert_eq!(empty_poll_wait(ms(20), ms(0)), ms(20));
    }

    #[test]
    fn a_trickle_never_waits_long_and_an_idle_lease_reaches_the_poll_interval_within_fifteen_reads() {
        let poll = Duration::from_secs(5);
        // A change every 60 ms (a partition's share of 500 writes/s over 8): the wait after an
        // empty page between two changes stays at the first wait.
        let (mut quiet, mut longest) = (Duration::ZERO, Duration::ZERO);
        while quiet < Duration::from_millis(60) {
            let wait = empty_poll_wait(poll, quiet);
            longest = longest.max(wait);
            quiet += wait;
        }
        assert_eq!(longest, FIRST_EMPTY_WAIT);
        // From the last change on, empty reads until a wait is the poll interval.
        let (mut quiet, mut reads) = (Duration::ZERO, 0);
        while empty_poll_wait(poll, quiet) < poll {
            quiet += empty_poll_wait(poll, quiet);
            reads += 1;
        }
        assert!(reads <= 15, "{reads} reads before waiting the poll interval");
    }
}
