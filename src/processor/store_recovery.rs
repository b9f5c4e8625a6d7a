//! When lease documents disappear: a lease deleted while it was processed is put back from its
//! last checkpoint; when the whole lease container is gone, processing waits (reported on
//! `/readyz`) and the leases owned here are written back with their checkpoints once it exists
//! again, then leases are created for the ranges nobody covers.

use super::bootstrap::bootstrap;
use super::error::LeaseError;
use super::lease::{Lease, LeaseStoreError};
use super::owned::OwnedLease;
use super::shared::Shared;

/// The leases kept while the lease container is missing.
#[derive(Default)]
pub(crate) struct StoreRecovery {
    /// Leases this instance owned when the lease container disappeared, with their checkpoints.
    orphans: Vec<Lease>,
}

impl StoreRecovery {
    /// Reports the lease container missing (once in the log; on `/readyz` while it lasts).
    pub(crate) fn missing(&mut self, shared: &Shared, error: &LeaseStoreError) {
        let problem = format!("the lease container does not exist (deleted?): {error}");
        if shared.health.store_missing(problem) {
            tracing::error!(%error, "the lease container does not exist (deleted?); processing waits until it is back, then the leases owned here are written back with their checkpoints");
        }
    }

    /// After the lease container came back: writes back the leases this instance owned, then
    /// creates leases for the ranges nobody covers (from the start position). `false` when the
    /// container was never missing (nothing to do).
    pub(crate) async fn back(&mut self, shared: &Shared) -> bool {
        let was_missing = shared.health.store_back();
        let orphans = std::mem::take(&mut self.orphans);
        if !was_missing && orphans.is_empty() {
            return false;
        }
        tracing::warn!(
            leases = orphans.len(),
            "the lease container exists again; writing back the leases owned here"
        );
        for lease in &orphans {
            if let Err(error) = shared.store.create(lease).await {
                tracing::warn!(lease = %lease.lease_token, %error, "writing a lease back failed");
            }
        }
        if let Err(error) = bootstrap(shared.store.as_ref(), &shared.monitored, &shared.options).await {
            shared.telemetry.error(None, LeaseError::CreateMissing(Box::new(error)));
        }
        true
    }

    /// Puts back a lease document deleted while this instance processed it, with its last
    /// checkpoint and no owner, so that its range is not left without a lease (nothing lost).
    pub(crate) async fn recreate(&mut self, shared: &Shared, owned: &OwnedLease) {
        let mut lease = owned.current().await;
        lease.owner = None;
        lease.etag.clear();
        lease.clear_handoff();
        match shared.store.create(&lease).await {
            Ok(Some(_)) => {
                tracing::warn!(
                    lease = owned.token(),
                    "the lease document was deleted while this instance processed it; recreated it from its last checkpoint"
                );
            }
            Ok(None) => tracing::debug!(lease = owned.token(), "the deleted lease exists again"),
            Err(error) if error.is_container_missing() => {
                // The whole lease container is gone: keep the checkpoint until it is back.
                self.orphans.push(lease);
            }
            Err(error) => shared.telemetry.error(Some(owned.token()), LeaseError::Recreate(error)),
        }
    }
}
