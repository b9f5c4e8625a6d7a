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
        Ok(LockAttempt::Taken { etag: String::new() })
    }
    async fn renew_lock(&self, _: &str, _: Duration, etag: &str) -> Result<Option<String>, LeaseStoreError> {
        if self.renewals_hang {
            std::future::pending::<()>().await;
        }
        let renewals = self.renewed.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Some(format!("{etag}+{renewals}")))
    }
    async fn break_lock(&self, _: &str) -> Result<(), LeaseStoreError> {
        Ok(())
    }
    async fn unlock(&self, _: &str) -> Result<(), LeaseStoreError> {
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
