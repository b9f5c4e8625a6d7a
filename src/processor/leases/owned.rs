//! A lease this instance owns: the latest copy of its document, shared by the renewer and the
//! partition loop so that our own writes never race each other, and the token that stops its
//! processing. Its checkpoints: [`checkpoint`].

mod checkpoint;
mod measures;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use time::OffsetDateTime;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::processor::budgets::reads::ReadAllowance;
use crate::processor::budgets::writes::{Late, Spend, Throttle, Throttled, Turn, WriteBudget};
use crate::processor::leases::heartbeat::Liveness;
use crate::processor::leases::lease::{Lease, LeaseStore, LeaseStoreError};
use crate::processor::leases::work_report::WorkTimings;
use crate::processor::leases::worker_capacity::WorkerCapacity;

/// How many times an update is re-applied after a 412 while the lease is still ours (as the
/// reference SDK does).
const MAX_CONFLICT_RETRIES: usize = 6;

/// How long a write that can wait (a checkpoint) waits for the lease container's budget, 429
/// after 429, before it is sent as any other write: a checkpoint is never put off for ever.
const DEFER_AT_MOST: std::time::Duration = std::time::Duration::from_secs(60);

/// Why an update of an owned lease did not happen.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// Another instance owns the lease now; nothing was written.
    #[error("lease is owned by {0:?} now")]
    Lost(Option<String>),
    /// The lease document no longer exists.
    #[error("lease document was deleted")]
    Gone,
    /// The store failed (retry later).
    #[error(transparent)]
    Store(#[from] LeaseStoreError),
}

impl Throttled for UpdateError {
    fn throttled(&self) -> Option<Throttle> {
        match self {
            UpdateError::Store(error) => error.throttled(),
            _ => None,
        }
    }

    fn held_back() -> Self {
        UpdateError::Store(LeaseStoreError::HeldBack)
    }
}

/// A lease owned by this instance.
pub struct OwnedLease {
    lease: Mutex<Lease>,
    id: String,
    token: String,
    me: String,
    /// The ownership epoch this instance's acquisition wrote: its writes hold only while the
    /// lease still carries it.
    epoch: Option<String>,
    store: Arc<dyn LeaseStore>,
    cancel: CancellationToken,
    lost: AtomicBool,
    /// Set with `lost` when the lease document itself was found deleted.
    gone: AtomicBool,
    /// The instance that asked for the lease; processing stops after the current batch.
    handoff_to: std::sync::Mutex<Option<String>>,
    /// Whether `handoff_to` asked for the lease (a handoff request), rather than being named by
    /// this instance (a stalled lease's release).
    handoff_asked: AtomicBool,
    /// Set when this instance stopped processing the lease (whatever the reason).
    closed: AtomicBool,
    /// Woken when a write meets another instance's handoff request: the acquire cycle judges it.
    requested: Arc<tokio::sync::Notify>,
    /// When this instance last wrote the lease (the request was sent), on its monotonic clock.
    written_at: std::sync::Mutex<Instant>,
    /// When this instance last knew the lease was its own: a write, or a read that showed it.
    confirmed_at: std::sync::Mutex<Instant>,
    /// Set once a keep-alive renews the lease.
    renewed: AtomicBool,
    /// Cancelled when the lease needs no more renewals (lost, or its processing here settled).
    ended: CancellationToken,
    /// Whether this instance's heartbeat keeps the lease alive.
    liveness: Arc<Liveness>,
    /// How this instance spends the lease container's request units.
    budget: Arc<WriteBudget>,
    /// When the handler last answered a batch of this lease with an error (a failing handler is
    /// not a stalled lease).
    handler_failed_at: std::sync::Mutex<Option<Instant>>,
    /// What this instance measures of the lease: every write of the lease carries it.
    measures: measures::Measures,
}

/// How an owned lease is kept alive and measured: this instance's liveness (whether its heartbeat
/// keeps the lease alive), its budget of the lease container's request units, and how the
/// lease's work is measured.
pub(crate) struct Keeping {
    /// Whether this instance's heartbeat keeps its leases alive.
    pub liveness: Arc<Liveness>,
    /// How its writes spend the lease container's request units.
    pub budget: Arc<WriteBudget>,
    /// How the lease's write rate is measured.
    pub timings: WorkTimings,
    /// What this instance's change feed reads cost.
    pub reads: Arc<ReadAllowance>,
    /// What this worker handles a second while it has work.
    pub worker: Arc<WorkerCapacity>,
}

/// Reads a monotonic moment kept under a lock nobody holds across an await.
fn moment(at: &std::sync::Mutex<Instant>) -> Instant {
    *at.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Moves a kept moment forward to `to` (never back: answers may come out of order).
fn advance(at: &std::sync::Mutex<Instant>, to: Instant) {
    let mut at = at.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    *at = (*at).max(to);
}

/// A lease this instance wrote itself into, and when that write was sent: its answer — late,
/// after a freeze — vouches for the lease only as of then.
#[derive(Debug, Clone)]
pub struct Acquired {
    /// The lease as written.
    pub lease: Lease,
    /// When the write that made it this instance's was sent.
    pub sent: Instant,
}

impl OwnedLease {
    /// Wraps a lease this instance just acquired; `requested` is woken when a write of it meets
    /// another instance's handoff request; `liveness` says whether the heartbeat keeps it alive;
    /// `budget` how its writes spend the lease container's request units.
    pub(crate) fn new(
        Acquired { lease, sent }: Acquired,
        me: &str,
        store: Arc<dyn LeaseStore>,
        parent: &CancellationToken,
        requested: Arc<tokio::sync::Notify>,
        keeping: Keeping,
    ) -> Arc<Self> {
        let Keeping {
            liveness,
            budget,
            timings,
            reads,
            worker,
        } = keeping;
        let measures = measures::Measures::new(&lease, timings, reads, worker);
        Arc::new(Self {
            id: lease.id.clone(),
            token: lease.lease_token.clone(),
            epoch: lease.owner_epoch.clone(),
            lease: Mutex::new(lease),
            me: me.to_owned(),
            store,
            cancel: parent.child_token(),
            lost: AtomicBool::new(false),
            gone: AtomicBool::new(false),
            handoff_to: std::sync::Mutex::new(None),
            handoff_asked: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            requested,
            written_at: std::sync::Mutex::new(sent),
            confirmed_at: std::sync::Mutex::new(sent),
            renewed: AtomicBool::new(false),
            ended: CancellationToken::new(),
            liveness,
            budget,
            handler_failed_at: std::sync::Mutex::new(None),
            measures,
        })
    }

    /// Records that the handler answered a batch of this lease with an error, now.
    pub fn note_handler_failure(&self) {
        *self
            .handler_failed_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
    }

    /// When the handler last answered a batch of this lease with an error.
    pub fn handler_failed_at(&self) -> Option<Instant> {
        *self
            .handler_failed_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks the end of this instance's processing of the lease: manual checkpoint handles of
    /// its batches write nothing from now on.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Counts `writes` more into the lease's partition over the last `over` (going on from the
    /// rate the lease reported when this instance took it, if any).
    pub fn count_writes(&self, writes: u64, over: Duration) {
        self.measures.count_writes(writes, over);
    }

    /// Counts `documents` more handled of the lease here, now.
    pub fn count_handled(&self, documents: usize) {
        self.measures.count_handled(documents);
    }

    /// Writes what is measured here into `lease` (a copy about to be written, or a split's
    /// child created from it): the partition's writes, what this instance handled, what a
    /// document cost it to read and what this worker handles while it has work.
    pub(crate) fn record_write_rate(&self, lease: &mut Lease) {
        self.measures.record(lease);
    }

    /// Whether processing of the lease here ended.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// The lease document id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The lease token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Cancelled when processing of this lease must stop.
    pub fn cancelled(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Whether the lease was found owned by someone else (or deleted).
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Whether the lease document was found deleted.
    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
    }

    /// Stops processing because the lease document was deleted.
    fn mark_gone(&self) {
        self.gone.store(true, Ordering::SeqCst);
        self.mark_lost();
    }

    /// Stops processing because the lease is no longer ours.
    pub fn mark_lost(&self) {
        self.lost.store(true, Ordering::SeqCst);
        self.cancel.cancel();
        self.ended.cancel();
    }

    /// `true` the first time only: the caller starts the lease's keep-alive.
    pub(crate) fn claim_renewal(&self) -> bool {
        !self.renewed.swap(true, Ordering::SeqCst)
    }

    /// No more renewals: this instance's processing of the lease is settled (released, handed
    /// over, deleted after a split; a lease whose release failed frees itself on expiry).
    pub(crate) fn end_renewals(&self) {
        self.ended.cancel();
    }

    /// Completes when the lease needs no more renewals.
    pub(crate) fn renewals_ended(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.ended.cancelled()
    }

    /// When this instance last wrote the lease, on its monotonic clock.
    pub(crate) fn written_at(&self) -> Instant {
        moment(&self.written_at)
    }

    /// Stops processing after the current batch; the release then hands the lease to `to`
    /// (another instance that asked for it; this instance's own name is ignored).
    pub fn hand_over_to(&self, to: &str) {
        if to == self.me {
            return;
        }
        let mut target = self.handoff_target_slot();
        if target.is_none() {
            tracing::info!(lease = %self.token, to = %to, "handing the lease over after the current batch");
            *target = Some(to.to_owned());
            self.handoff_asked.store(true, Ordering::SeqCst);
            self.cancel.cancel();
        }
    }

    /// The instance the lease is being handed over to, if one asked.
    pub fn handoff_target(&self) -> Option<String> {
        self.handoff_target_slot().clone()
    }

    /// The handoff target, locked; a lock poisoned by a panic elsewhere is used as it is (the
    /// value is written whole).
    fn handoff_target_slot(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.handoff_to
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Names the instance the lease goes to when it is released (unless one asked for it
    /// already), without stopping its processing: the reader of a stalled lease gives it up
    /// itself.
    pub fn release_to(&self, to: &str) {
        let mut target = self.handoff_target_slot();
        if target.is_none() && to != self.me {
            *target = Some(to.to_owned());
        }
    }

    /// Whether `lease` (as read) is still this ownership: this instance's name and epoch. A
    /// copy of this name without an epoch is one a writer that knows no epochs wrote (an older
    /// version asking for the lease during a rolling upgrade): still ours, and our next write
    /// puts the epoch back.
    fn is_mine(&self, lease: &Lease) -> bool {
        lease.owner.as_deref() == Some(self.me.as_str())
            && (lease.owner_epoch.is_none() || lease.owner_epoch == self.epoch)
    }

    /// The latest known copy of the lease.
    pub async fn current(&self) -> Lease {
        self.lease.lock().await.clone()
    }

    /// Applies `change` and writes the lease with If-Match. On a 412 it re-reads: while the lease is
    /// still ours the change is applied to the fresh copy and retried; otherwise nothing is written.
    pub async fn update(&self, change: impl Fn(&mut Lease)) -> Result<Lease, UpdateError> {
        let written = self
            .update_if(|lease| {
                change(lease);
                true
            })
            .await?;
        Ok(self.written_or_current(written).await)
    }

    /// What a write that always writes wrote (else the latest copy).
    async fn written_or_current(&self, written: Option<Lease>) -> Lease {
        match written {
            Some(lease) => lease,
            None => self.current().await,
        }
    }

    /// Like [`OwnedLease::update`], where `change` may decide (on each copy it is applied to,
    /// under the lease's lock) that there is nothing to write: `Ok(None)` then.
    pub async fn update_if(&self, change: impl Fn(&mut Lease) -> bool) -> Result<Option<Lease>, UpdateError> {
        self.update_if_as(Spend::Plain, &change).await
    }

    /// Like [`OwnedLease::update_if`], for a write that can wait (a checkpoint): paced by the
    /// lease container's budget ([`WriteBudget::paced`]) — admitted before the lease's lock is
    /// taken, so that a renewal of the lease is not held up — until it is written or the lease
    /// is lost. Once the lease's processing is cancelled (a release or handoff follows, and a
    /// requester waits), it no longer waits its turn, only each 429's retry-after and the
    /// instance's share; after [`DEFER_AT_MOST`] it goes ahead of the queue, within the share,
    /// as any other write (with the SDK's own retries of a 429): a checkpoint is never put off
    /// for ever.
    async fn update_deferrable(&self, change: impl Fn(&mut Lease) -> bool) -> Result<Option<Lease>, UpdateError> {
        let change = &change;
        self.budget
            .paced((DEFER_AT_MOST, Late::Ahead), Turn::AheadOnce(&self.cancel), |spend| {
                self.update_if_as(spend, change)
            })
            .await
    }

    /// Writes `change` (see [`OwnedLease::update_if`]) spending the budget as `spend` says.
    async fn update_if_as(
        &self,
        spend: Spend,
        change: &impl Fn(&mut Lease) -> bool,
    ) -> Result<Option<Lease>, UpdateError> {
        let mut guard = self.lease.lock().await;
        let mut last_error = None;
        for _ in 0..MAX_CONFLICT_RETRIES {
            let mut next = guard.clone();
            if !change(&mut next) {
                return Ok(None);
            }
            self.record_write_rate(&mut next);
            next.timestamp = Some(OffsetDateTime::now_utc());
            let sent = Instant::now();
            match self.replace(spend, &next).await {
                Ok(written) => {
                    *guard = written.clone();
                    advance(&self.written_at, sent);
                    advance(&self.confirmed_at, sent);
                    return Ok(Some(written));
                }
                Err(LeaseStoreError::Changed(_)) => match self.store.read(&self.id).await? {
                    // A handoff request in it is for the acquire cycle to judge (the requester
                    // may have left), at once; the write keeps it.
                    Some(current) if self.is_mine(&current) => {
                        if current.handoff_request().is_some_and(|(to, _)| to != self.me) {
                            self.requested.notify_one();
                        }
                        *guard = current;
                        guard.owner_epoch = self.epoch.clone();
                        last_error = Some(LeaseStoreError::Changed(self.id.clone()));
                    }
                    Some(current) => {
                        self.mark_lost();
                        return Err(UpdateError::Lost(current.owner));
                    }
                    None => {
                        self.mark_gone();
                        return Err(UpdateError::Gone);
                    }
                },
                Err(LeaseStoreError::Gone(_)) => {
                    self.mark_gone();
                    return Err(UpdateError::Gone);
                }
                Err(other) => return Err(other.into()),
            }
        }
        Err(UpdateError::Store(
            last_error.unwrap_or_else(|| LeaseStoreError::Changed(self.id.clone())),
        ))
    }

    /// Sends one write of the lease as `spend` says, telling the budget how it went.
    async fn replace(&self, spend: Spend, next: &Lease) -> Result<Lease, LeaseStoreError> {
        match spend {
            Spend::Vital => {
                let _vital = self.budget.vital();
                self.store.replace(next).await
            }
            Spend::Plain => self.store.replace(next).await,
            Spend::Deferrable => self.store.replace_deferrable(next).await,
        }
    }

    /// Makes sure the lease is still this instance's before a batch is handed to the handler,
    /// once the last confirmation (a write, or a read) is older than a tenth of `expiration`:
    /// whoever deposed this owner by a write (an operator freeing the lease, another instance
    /// taking it) is then found within that tenth, in every checkpoint mode. A lease that
    /// neither this instance's write nor its heartbeat kept alive for half the expiration is
    /// confirmed by a write (renewed), so that nobody can take it as expired while the batch is
    /// delivered. A read that fails returns its error: the batch waits until ownership is
    /// confirmed (another instance or the operator may have taken the lease by a write, which
    /// no liveness of ours rules out).
    pub async fn ensure_owned(&self, expiration: Duration) -> Result<(), UpdateError> {
        if moment(&self.confirmed_at).elapsed() < expiration / 10 {
            return Ok(());
        }
        let beating = self.written_within(expiration / 2) || self.liveness.kept_alive_within(expiration / 2);
        if !beating {
            // Its heartbeat is late (a throttled lease container?): a renewal of each lease must
            // not crowd the heartbeat out — it waits its turn as checkpoints do. (Beating again
            // after a silence, a read confirms the lease.)
            return match self.update_deferrable(|lease| self.is_mine(lease)).await? {
                Some(_) => Ok(()),
                None => Err(UpdateError::Lost(None)),
            };
        }
        let sent = Instant::now();
        match self.store.read(&self.id).await {
            Ok(Some(current)) if self.is_mine(&current) => {
                if current.handoff_request().is_some_and(|(to, _)| to != self.me) {
                    self.requested.notify_one();
                }
                advance(&self.confirmed_at, sent);
                Ok(())
            }
            Ok(Some(current)) => {
                self.mark_lost();
                Err(UpdateError::Lost(current.owner))
            }
            Ok(None) => {
                self.mark_gone();
                Err(UpdateError::Gone)
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Whether this instance wrote the lease, or its heartbeat kept it alive, within `window` —
    /// with no silence since the lease was last confirmed (after a freeze the first heartbeat
    /// vouches for nothing that others may have taken meanwhile): then nobody can take it as
    /// expired for at least the expiration minus `window`.
    pub fn kept_alive_within(&self, window: Duration) -> bool {
        moment(&self.written_at).elapsed() < window
            || (self.liveness.kept_alive_within(window) && !self.liveness.silent_since(moment(&self.confirmed_at)))
    }

    /// Whether our copy of the lease still names this instance as its owner (not released).
    pub async fn is_held(&self) -> bool {
        self.is_mine(&*self.lease.lock().await)
    }

    /// Whether this instance wrote the lease (renewal or checkpoint) within `window`, on its
    /// monotonic clock.
    pub fn written_within(&self, window: Duration) -> bool {
        moment(&self.written_at).elapsed() < window
    }

    /// Writes the lease as it is (a new timestamp: still owned), ahead of checkpoints; `None`
    /// (nothing written) when this instance released it meanwhile.
    pub async fn renew(&self) -> Result<Option<Lease>, UpdateError> {
        self.update_if_as(Spend::Vital, &|lease: &mut Lease| self.is_mine(lease))
            .await
    }

    /// Gives the lease up, keeping its continuation: to the instance that asked for it while its
    /// request is still on the lease (which writes an epoch of its own when it takes the lease
    /// up; until then the lease keeps this ownership's epoch, so that no earlier task of the
    /// requester's name takes it for its own), else to nobody.
    ///
    /// Written as a checkpoint is ([`OwnedLease::update_deferrable`]; the lease's processing has
    /// ended): a release answered 429 is sent again after the retry-after, rather than failing
    /// after the SDK's few retries and leaving the lease to expire.
    pub async fn release(&self) -> Result<Lease, UpdateError> {
        let to = self.handoff_target();
        let asked = self.handoff_asked.load(Ordering::SeqCst);
        let written = self
            .update_deferrable(|lease| {
                // A requester whose request is gone (it left, and the request was cleared) would
                // hold the lease under a stopped name for an expiration: freed instead.
                let to = to
                    .clone()
                    .filter(|to| !asked || lease.handoff_request().is_some_and(|(by, _)| by == to));
                if to.is_none() {
                    lease.owner_epoch = None;
                }
                lease.owner = to;
                lease.clear_handoff();
                true
            })
            .await?;
        Ok(self.written_or_current(written).await)
    }

    /// Deletes the lease (after a split created its children), if it is still ours.
    pub async fn delete(&self) -> Result<(), UpdateError> {
        let mut guard = self.lease.lock().await;
        for _ in 0..MAX_CONFLICT_RETRIES {
            match self.store.delete(&guard).await {
                Ok(()) => return Ok(()),
                Err(LeaseStoreError::Changed(_)) => match self.store.read(&self.id).await? {
                    Some(current) if self.is_mine(&current) => *guard = current,
                    Some(current) => return Err(UpdateError::Lost(current.owner)),
                    None => return Ok(()),
                },
                Err(other) => return Err(other.into()),
            }
        }
        Err(UpdateError::Store(LeaseStoreError::Changed(self.id.clone())))
    }
}
