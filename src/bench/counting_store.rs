//! A lease store that counts the requests it passes on (for the lease-store cost figure), records
//! when each lease was written (the renewal-gap figure), and can answer slowly (each request waits
//! a fixed latency first), as a loaded lease container does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::Value;

use crate::processor::leases::lease::{Beat, HeartbeatDoc, LeaseSnapshot, LockAttempt};
use crate::processor::{Lease, LeaseStore, LeaseStoreError};

/// Requests made through a [`CountingStore`], by kind.
#[derive(Debug, Default)]
pub struct StoreRequests {
    /// Full listings (queries over the processor's documents).
    pub listings: AtomicU64,
    /// Point reads.
    pub reads: AtomicU64,
    /// Conditional replaces (renewals, checkpoints, acquisitions, releases).
    pub replaces: AtomicU64,
    /// Everything else (creates, deletes, heartbeats, markers).
    pub other: AtomicU64,
}

impl StoreRequests {
    /// All requests so far.
    pub fn total(&self) -> u64 {
        [&self.listings, &self.reads, &self.replaces, &self.other]
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .sum()
    }
}

/// When each lease document was last written, as its writer saw the answer: the longest time a
/// lease went without a write (its liveness, as other instances see it), and the slowest write.
#[derive(Debug, Default)]
pub struct LeaseWrites {
    state: Mutex<WriteState>,
}

#[derive(Debug, Default)]
struct WriteState {
    last: HashMap<String, Instant>,
    longest_gap: Duration,
    slowest: Duration,
}

impl LeaseWrites {
    fn state(&self) -> std::sync::MutexGuard<'_, WriteState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a write of lease `id` sent at `sent` that ended now (`written`: it succeeded).
    fn record(&self, id: &str, sent: Instant, written: bool) {
        let now = Instant::now();
        let mut state = self.state();
        state.slowest = state.slowest.max(now - sent);
        if written && let Some(previous) = state.last.insert(id.to_owned(), now) {
            state.longest_gap = state.longest_gap.max(now - previous);
        }
    }

    /// Forgets the gaps so far: measuring starts now, from each lease's last write.
    pub fn restart(&self) {
        let mut state = self.state();
        state.longest_gap = Duration::ZERO;
        state.slowest = Duration::ZERO;
    }

    /// The longest time any lease went without a successful write, up to now (a lease not
    /// written since counts until now).
    pub fn longest_gap(&self) -> Duration {
        let now = Instant::now();
        let state = self.state();
        let open = state.last.values().map(|at| now - *at).max().unwrap_or_default();
        state.longest_gap.max(open)
    }

    /// The slowest write (success or failure, the SDK's retries included).
    pub fn slowest(&self) -> Duration {
        self.state().slowest
    }

    /// When lease `id` (or instance `id`'s heartbeat) was last written.
    pub fn last_written(&self, id: &str) -> Option<Instant> {
        self.state().last.get(id).copied()
    }

    /// The leases written so far.
    pub fn leases(&self) -> usize {
        self.state().last.len()
    }
}

/// Passes every call on to the inner store and counts it.
pub struct CountingStore {
    inner: Arc<dyn LeaseStore>,
    /// What was counted.
    pub requests: Arc<StoreRequests>,
    /// When each lease was written.
    pub writes: Arc<LeaseWrites>,
    /// How long each request waits before it is passed on.
    latency: Duration,
    /// How long a listing's answer takes after the listing read the documents.
    listing_delay: Duration,
    /// When each instance's heartbeat was written.
    pub beats: Arc<LeaseWrites>,
    /// How long a heartbeat's answer takes after it was written.
    beat_answer_delay: Duration,
    /// While set, every request fails as an unreachable store's would (503).
    unreachable: AtomicBool,
    /// While set, every delete fails so.
    deletes_fail: AtomicBool,
    /// While set, every listing fails so.
    listings_fail: AtomicBool,
    /// A lease write that, once it landed, freezes this store (see [`CountingStore::freeze_after`]).
    freeze_trigger: std::sync::Mutex<Option<FreezeTrigger>>,
    /// Until when every request (and the answer of the write that froze it) waits.
    frozen_until: std::sync::Mutex<Option<tokio::time::Instant>>,
}

/// Which lease write freezes the store, and for how long.
struct FreezeTrigger {
    matches: Box<dyn Fn(&Lease) -> bool + Send + Sync>,
    freeze: Duration,
}

impl CountingStore {
    /// Counts the requests to `inner`.
    pub fn new(inner: Arc<dyn LeaseStore>) -> Self {
        Self {
            inner,
            requests: Arc::new(StoreRequests::default()),
            writes: Arc::new(LeaseWrites::default()),
            latency: Duration::ZERO,
            listing_delay: Duration::ZERO,
            beats: Arc::new(LeaseWrites::default()),
            beat_answer_delay: Duration::ZERO,
            unreachable: AtomicBool::new(false),
            deletes_fail: AtomicBool::new(false),
            listings_fail: AtomicBool::new(false),
            freeze_trigger: std::sync::Mutex::new(None),
            frozen_until: std::sync::Mutex::new(None),
        }
    }

    /// Cuts this store off (every request fails with 503) or connects it again.
    pub fn cut_off(&self, cut: bool) {
        self.unreachable.store(cut, Ordering::SeqCst);
    }

    /// Makes every delete fail as an unreachable store's would (503), or succeed again.
    pub fn fail_deletes(&self, fail: bool) {
        self.deletes_fail.store(fail, Ordering::SeqCst);
    }

    /// Makes every listing fail as a throttled or unreachable store's would (503), or succeed
    /// again.
    pub fn fail_listings(&self, fail: bool) {
        self.listings_fail.store(fail, Ordering::SeqCst);
    }

    /// Once a lease write matching `matches` has landed, nothing more goes out or comes back for
    /// `freeze` — that write's answer included — as when the process froze (SIGSTOP, a paused VM)
    /// right after sending it. Once.
    pub fn freeze_after(&self, matches: impl Fn(&Lease) -> bool + Send + Sync + 'static, freeze: Duration) {
        *self.freeze_trigger.lock().unwrap_or_else(PoisonError::into_inner) = Some(FreezeTrigger {
            matches: Box::new(matches),
            freeze,
        });
    }

    /// Freezes the store when `written` is the write the trigger waits for; waits out a freeze.
    async fn after_write(&self, written: &Lease) {
        let trigger = {
            let mut armed = self.freeze_trigger.lock().unwrap_or_else(PoisonError::into_inner);
            match armed.as_ref() {
                Some(trigger) if (trigger.matches)(written) => armed.take(),
                _ => None,
            }
        };
        if let Some(trigger) = trigger {
            *self.frozen_until.lock().unwrap_or_else(PoisonError::into_inner) =
                Some(tokio::time::Instant::now() + trigger.freeze);
        }
        self.wait_out_freeze().await;
    }

    async fn wait_out_freeze(&self) {
        let until = *self.frozen_until.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(until) = until {
            tokio::time::sleep_until(until).await;
        }
    }

    /// Every request waits `latency` before it reaches the inner store.
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Heartbeats are written at once and answered `delay` later, as a request that reached the
    /// service is: a caller that stops waiting for the answer does not take the write back.
    pub fn with_late_heartbeat_answers(mut self, delay: Duration) -> Self {
        self.beat_answer_delay = delay;
        self
    }

    /// Listings answer `delay` after they read the documents, as listing thousands of lease
    /// documents page by page does: what they show is that much older when it arrives.
    pub fn with_slow_listings(mut self, delay: Duration) -> Self {
        self.listing_delay = delay;
        self
    }

    /// Replaces `lease` (`deferrable`: as a write that can wait), counted and timed.
    async fn replace_counted(&self, lease: &Lease, deferrable: bool) -> Result<Lease, LeaseStoreError> {
        self.count(&self.requests.replaces).await?;
        tracing::trace!(
            lease = %lease.id,
            owner = ?lease.owner,
            continuation = ?lease.continuation,
            properties = ?lease.properties,
            deferrable,
            "lease replaced"
        );
        let sent = Instant::now();
        let replaced = if deferrable {
            self.inner.replace_deferrable(lease).await
        } else {
            self.inner.replace(lease).await
        };
        self.writes.record(&lease.id, sent, replaced.is_ok());
        if let Ok(written) = &replaced {
            self.after_write(written).await;
        }
        replaced
    }

    async fn count(&self, counter: &AtomicU64) -> Result<(), LeaseStoreError> {
        self.count_failing(counter, &self.unreachable).await
    }

    /// Counts a request that fails while `failing` (or the store is cut off).
    async fn count_failing(&self, counter: &AtomicU64, failing: &AtomicBool) -> Result<(), LeaseStoreError> {
        counter.fetch_add(1, Ordering::SeqCst);
        self.wait_out_freeze().await;
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        if failing.load(Ordering::SeqCst) || self.unreachable.load(Ordering::SeqCst) {
            return Err(LeaseStoreError::Cosmos(crate::cosmos::CosmosError::local(
                crate::cosmos::ErrorKind::Transient,
                "the lease store is cut off (test)",
            )));
        }
        Ok(())
    }
}

#[async_trait]
impl LeaseStore for CountingStore {
    fn prefix(&self) -> &str {
        self.inner.prefix()
    }

    fn request_charge(&self) -> f64 {
        self.inner.request_charge()
    }

    async fn provisioned_throughput(&self) -> Result<Option<u64>, LeaseStoreError> {
        self.inner.provisioned_throughput().await
    }

    async fn snapshot(&self) -> Result<LeaseSnapshot, LeaseStoreError> {
        self.count_failing(&self.requests.listings, &self.listings_fail).await?;
        let snapshot = self.inner.snapshot().await;
        if !self.listing_delay.is_zero() {
            tokio::time::sleep(self.listing_delay).await;
        }
        snapshot
    }

    async fn read(&self, id: &str) -> Result<Option<Lease>, LeaseStoreError> {
        self.count(&self.requests.reads).await?;
        self.inner.read(id).await
    }

    async fn create(&self, lease: &Lease) -> Result<Option<Lease>, LeaseStoreError> {
        self.count(&self.requests.other).await?;
        self.inner.create(lease).await
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, LeaseStoreError> {
        self.replace_counted(lease, false).await
    }

    async fn replace_deferrable(&self, lease: &Lease) -> Result<Lease, LeaseStoreError> {
        self.replace_counted(lease, true).await
    }

    async fn delete(&self, lease: &Lease) -> Result<(), LeaseStoreError> {
        self.count_failing(&self.requests.other, &self.deletes_fail).await?;
        self.inner.delete(lease).await
    }

    async fn try_lock(&self, owner: &str, renewal: Duration) -> Result<LockAttempt, LeaseStoreError> {
        self.count(&self.requests.other).await?;
        self.inner.try_lock(owner, renewal).await
    }

    async fn renew_lock(&self, owner: &str, renewal: Duration, etag: &str) -> Result<Option<String>, LeaseStoreError> {
        self.count(&self.requests.other).await?;
        self.inner.renew_lock(owner, renewal, etag).await
    }

    async fn break_lock(&self, etag: &str) -> Result<(), LeaseStoreError> {
        self.count(&self.requests.other).await?;
        self.inner.break_lock(etag).await
    }

    async fn unlock(&self, etag: &str) -> Result<(), LeaseStoreError> {
        self.count(&self.requests.other).await?;
        self.inner.unlock(etag).await
    }

    async fn mark_initialized(&self, monitored: &str, leases_per_partition: u32) -> Result<(), LeaseStoreError> {
        self.count(&self.requests.other).await?;
        self.inner.mark_initialized(monitored, leases_per_partition).await
    }

    async fn foreign_documents(&self, prefix: &str) -> Result<Vec<Value>, LeaseStoreError> {
        self.count(&self.requests.listings).await?;
        self.inner.foreign_documents(prefix).await
    }

    async fn earlier_incarnation(&self, monitored: &str) -> Result<bool, LeaseStoreError> {
        self.count(&self.requests.listings).await?;
        self.inner.earlier_incarnation(monitored).await
    }

    async fn heartbeat(&self, beat: &Beat<'_>) -> Result<String, LeaseStoreError> {
        self.count(&self.requests.other).await?;
        let sent = Instant::now();
        let written = self.inner.heartbeat(beat).await;
        self.beats.record(beat.instance, sent, written.is_ok());
        if !self.beat_answer_delay.is_zero() {
            tokio::time::sleep(self.beat_answer_delay).await;
        }
        written
    }

    async fn read_heartbeat(&self, instance: &str) -> Result<Option<HeartbeatDoc>, LeaseStoreError> {
        self.count(&self.requests.reads).await?;
        self.inner.read_heartbeat(instance).await
    }

    async fn remove_heartbeat(&self, instance: &str, if_match: Option<&str>) -> Result<(), LeaseStoreError> {
        self.count(&self.requests.other).await?;
        self.inner.remove_heartbeat(instance, if_match).await
    }
}
