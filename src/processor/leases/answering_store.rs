//! A lease store for unit tests that answers every request at once.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use crate::processor::leases::lease::{
    Beat, HeartbeatDoc, Lease, LeaseSnapshot, LeaseStore, LeaseStoreError, LockAttempt,
};

/// A store that answers every request at once (so a request that hangs was held by whatever
/// wraps it), but its lock renewals when told to hang.
#[derive(Debug, Default)]
pub(crate) struct Answering {
    /// Whether lock renewals never answer.
    renewals_hang: bool,
    /// Whether another instance holds the lock (renewals are refused).
    taken: bool,
    /// Whether the lock is gone (renewals are refused, and it can be taken afresh).
    gone: bool,
    /// The locks given back.
    unlocked: AtomicU32,
    /// The lock renewals answered.
    renewed: AtomicU32,
}

impl Answering {
    /// A store whose lock renewals never answer.
    pub(crate) fn hanging_renewals() -> Self {
        Self {
            renewals_hang: true,
            ..Self::default()
        }
    }

    /// A store whose lock another instance holds.
    pub(crate) fn taken_over() -> Self {
        Self {
            taken: true,
            ..Self::default()
        }
    }

    /// A store whose lock was removed (another instance took its holder for dead).
    pub(crate) fn lock_gone() -> Self {
        Self {
            gone: true,
            ..Self::default()
        }
    }

    /// The locks given back so far.
    pub(crate) fn unlocks(&self) -> u32 {
        self.unlocked.load(Ordering::SeqCst)
    }

    /// The lock renewals answered so far.
    pub(crate) fn renewals(&self) -> u32 {
        self.renewed.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl LeaseStore for Answering {
    fn prefix(&self) -> &str {
        "p"
    }
    async fn snapshot(&self) -> Result<LeaseSnapshot, LeaseStoreError> {
        Ok(LeaseSnapshot::default())
    }
    async fn read(&self, _: &str) -> Result<Option<Lease>, LeaseStoreError> {
        Ok(None)
    }
    async fn create(&self, _: &Lease) -> Result<Option<Lease>, LeaseStoreError> {
        Ok(None)
    }
    async fn replace(&self, lease: &Lease) -> Result<Lease, LeaseStoreError> {
        Ok(lease.clone())
    }
    async fn delete(&self, _: &Lease) -> Result<(), LeaseStoreError> {
        Ok(())
    }
    async fn try_lock(&self, _: &str, _: Duration) -> Result<LockAttempt, LeaseStoreError> {
        Ok(if self.taken {
            LockAttempt::Held {
                etag: "theirs".into(),
                renewed_every: None,
            }
        } else {
            LockAttempt::Taken { etag: String::new() }
        })
    }
    async fn renew_lock(&self, _: &str, _: Duration, etag: &str) -> Result<Option<String>, LeaseStoreError> {
        if self.renewals_hang {
            std::future::pending::<()>().await;
        }
        if self.taken || self.gone {
            return Ok(None);
        }
        let renewals = self.renewed.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Some(format!("{etag}+{renewals}")))
    }
    async fn break_lock(&self, _: &str) -> Result<(), LeaseStoreError> {
        Ok(())
    }
    async fn unlock(&self, _: &str) -> Result<(), LeaseStoreError> {
        self.unlocked.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    async fn mark_initialized(&self, _: &str, _: u32) -> Result<(), LeaseStoreError> {
        Ok(())
    }
    async fn foreign_documents(&self, _: &str) -> Result<Vec<Value>, LeaseStoreError> {
        Ok(Vec::new())
    }
    async fn earlier_incarnation(&self, _: &str) -> Result<bool, LeaseStoreError> {
        Ok(false)
    }
    async fn heartbeat(&self, _: &Beat<'_>) -> Result<String, LeaseStoreError> {
        Ok(String::new())
    }
    async fn read_heartbeat(&self, _: &str) -> Result<Option<HeartbeatDoc>, LeaseStoreError> {
        Ok(None)
    }
    async fn remove_heartbeat(&self, _: &str, _: Option<&str>) -> Result<(), LeaseStoreError> {
        Ok(())
    }
}
