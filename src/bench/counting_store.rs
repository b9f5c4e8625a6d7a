//! A lease store that counts the requests it passes on (for the lease-store cost figure), and can
//! answer slowly (each request waits a fixed latency first), as a loaded lease container does.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use serde_json::Value;

use crate::processor::lease::LeaseSnapshot;
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

/// Passes every call on to the inner store and counts it.
pub struct CountingStore {
    inner: Arc<dyn LeaseStore>,
    /// What was counted.
    pub requests: Arc<StoreRequests>,
    /// How long each request waits before it is passed on.
    latency: std::time::Duration,
}

impl CountingStore {
    /// Counts the requests to `inner`.
    pub fn new(inner: Arc<dyn LeaseStore>) -> Self {
        Self {
            inner,
            requests: Arc::new(StoreRequests::default()),
            latency: std::time::Duration::ZERO,
        }
    }

    /// Every request waits `latency` before it reaches the inner store.
    pub fn with_latency(mut self, latency: std::time::Duration) -> Self {
        self.latency = latency;
        self
    }

    async fn count(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::SeqCst);
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
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

    async fn snapshot(&self) -> Result<LeaseSnapshot, LeaseStoreError> {
        self.count(&self.requests.listings).await;
        self.inner.snapshot().await
    }

    async fn read(&self, id: &str) -> Result<Option<Lease>, LeaseStoreError> {
        self.count(&self.requests.reads).await;
        self.inner.read(id).await
    }

    async fn create(&self, lease: &Lease) -> Result<Option<Lease>, LeaseStoreError> {
        self.count(&self.requests.other).await;
        self.inner.create(lease).await
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, LeaseStoreError> {
        self.count(&self.requests.replaces).await;
        self.inner.replace(lease).await
    }

    async fn delete(&self, lease: &Lease) -> Result<(), LeaseStoreError> {
        self.count(&self.requests.other).await;
        self.inner.delete(lease).await
    }

    async fn try_lock(&self, owner: &str, stale_after: std::time::Duration) -> Result<bool, LeaseStoreError> {
        self.count(&self.requests.other).await;
        self.inner.try_lock(owner, stale_after).await
    }

    async fn unlock(&self) -> Result<(), LeaseStoreError> {
        self.count(&self.requests.other).await;
        self.inner.unlock().await
    }

    async fn mark_initialized(&self, monitored: &str, leases_per_partition: u32) -> Result<(), LeaseStoreError> {
        self.count(&self.requests.other).await;
        self.inner.mark_initialized(monitored, leases_per_partition).await
    }

    async fn foreign_documents(&self, prefix: &str) -> Result<Vec<Value>, LeaseStoreError> {
        self.count(&self.requests.listings).await;
        self.inner.foreign_documents(prefix).await
    }

    async fn earlier_incarnation(&self, monitored: &str) -> Result<bool, LeaseStoreError> {
        self.count(&self.requests.listings).await;
        self.inner.earlier_incarnation(monitored).await
    }

    async fn heartbeat(&self, instance: &str) -> Result<(), LeaseStoreError> {
        self.count(&self.requests.other).await;
        self.inner.heartbeat(instance).await
    }

    async fn remove_heartbeat(&self, instance: &str) -> Result<(), LeaseStoreError> {
        self.count(&self.requests.other).await;
        self.inner.remove_heartbeat(instance).await
    }
}
