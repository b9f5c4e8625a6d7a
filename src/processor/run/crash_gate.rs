//! What an abort ([`crate::processor::ProcessorHandle::abort`]) leaves behind in the lease container:
//! nothing. Every request of the processor to its lease store passes this gate; once it is
//! closed, a request is never sent and never answered — as for a process killed while it waited —
//! so no path (a lease task woken by the abort, its release or last checkpoint, a handoff, the
//! heartbeat or its removal) writes after a crash, however the tasks are scheduled.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use crate::processor::leases::lease::{
    Beat, HeartbeatDoc, Lease, LeaseSnapshot, LeaseStore, LeaseStoreError, LockAttempt,
};

/// A lease store that stops answering, for good, once closed.
pub(crate) struct CrashGate {
    inner: Arc<dyn LeaseStore>,
    closed: AtomicBool,
}

impl CrashGate {
    /// A gate, open, in front of `inner`.
    pub(crate) fn new(inner: Arc<dyn LeaseStore>) -> Self {
        Self {
            inner,
            closed: AtomicBool::new(false),
        }
    }

    /// Closes the gate: no request passes from now on.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Waits forever once the gate is closed (the caller is dropped with its task).
    pub(crate) async fn pass(&self) {
        if self.closed.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait]
impl LeaseStore for CrashGate {
    fn prefix(&self) -> &str {
        self.inner.prefix()
    }
    async fn snapshot(&self) -> Result<LeaseSnapshot, LeaseStoreError> {
        self.pass().await;
        self.inner.snapshot().await
    }
    async fn read(&self, id: &str) -> Result<Option<Lease>, LeaseStoreError> {
        self.pass().await;
        self.inner.read(id).await
    }
    async fn create(&self, lease: &Lease) -> Result<Option<Lease>, LeaseStoreError> {
        self.pass().await;
        self.inner.create(lease).await
    }
    async fn replace(&self, lease: &Lease) -> Result<Lease, LeaseStoreError> {
        self.pass().await;
        self.inner.replace(lease).await
    }
    async fn replace_deferrable(&self, lease: &Lease) -> Result<Lease, LeaseStoreError> {
        self.pass().await;
        self.inner.replace_deferrable(lease).await
    }
    async fn delete(&self, lease: &Lease) -> Result<(), LeaseStoreError> {
        self.pass().await;
        self.inner.delete(lease).await
    }
    async fn try_lock(&self, owner: &str, renewal: Duration) -> Result<LockAttempt, LeaseStoreError> {
        self.pass().await;
        self.inner.try_lock(owner, renewal).await
    }
    async fn renew_lock(&self, owner: &str, renewal: Duration, etag: &str) -> Result<Option<String>, LeaseStoreError> {
        self.pass().await;
        self.inner.renew_lock(owner, renewal, etag).await
    }
    async fn break_lock(&self, etag: &str) -> Result<(), LeaseStoreError> {
        self.pass().await;
        self.inner.break_lock(etag).await
    }
    async fn unlock(&self, etag: &str) -> Result<(), LeaseStoreError> {
        self.pass().await;
        self.inner.unlock(etag).await
    }
    async fn mark_initialized(&self, monitored: &str, leases_per_partition: u32) -> Result<(), LeaseStoreError> {
        self.pass().await;
        self.inner.mark_initialized(monitored, leases_per_partition).await
    }
    async fn foreign_documents(&self, prefix: &str) -> Result<Vec<Value>, LeaseStoreError> {
        self.pass().await;
        self.inner.foreign_documents(prefix).await
    }
    async fn earlier_incarnation(&self, monitored: &str) -> Result<bool, LeaseStoreError> {
        self.pass().await;
        self.inner.earlier_incarnation(monitored).await
    }
    async fn heartbeat(&self, beat: &Beat<'_>) -> Result<String, LeaseStoreError> {
        self.pass().await;
        self.inner.heartbeat(beat).await
    }
    async fn read_heartbeat(&self, instance: &str) -> Result<Option<HeartbeatDoc>, LeaseStoreError> {
        self.pass().await;
        self.inner.read_heartbeat(instance).await
    }
    async fn remove_heartbeat(&self, instance: &str, if_match: Option<&str>) -> Result<(), LeaseStoreError> {
        self.pass().await;
        self.inner.remove_heartbeat(instance, if_match).await
    }
    fn request_charge(&self) -> f64 {
        self.inner.request_charge()
    }
    async fn provisioned_throughput(&self) -> Result<Option<u64>, LeaseStoreError> {
        self.pass().await;
        self.inner.provisioned_throughput().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processor::leases::answering_store::Answering;

    #[tokio::test]
    async fn a_closed_gate_answers_nothing() {
        let gate = CrashGate::new(Arc::new(Answering::default()));
        assert!(gate.remove_heartbeat("a", None).await.is_ok(), "open: passes");
        gate.close();
        let lease = Lease::new("p", &crate::cosmos::EpkRange::full(), None);
        let wait = std::time::Duration::from_millis(50);
        assert!(tokio::time::timeout(wait, gate.replace(&lease)).await.is_err());
        assert!(
            tokio::time::timeout(wait, gate.remove_heartbeat("a", None))
                .await
                .is_err()
        );
        let beat = Beat {
            instance: "a",
            incarnation: "1",
            keeps_leases: true,
            leaving: false,
            if_match: None,
            pod: None,
        };
        assert!(tokio::time::timeout(wait, gate.heartbeat(&beat)).await.is_err());
    }
}
