//! When lease documents disappear: a lease deleted while it was processed is put back from its
//! last checkpoint; when the whole lease container is gone, processing waits (reported on
//! `/readyz`) and the leases owned here are written back with their checkpoints once it exists
//! again, then, one lease expiration later, leases are created for the ranges nobody covers.
//!
//! Nothing lost is the rule, and two things kept it from holding with several instances:
//! - **The wait before creating the missing leases.** Every running instance writes its own
//!   leases back at its next acquire cycle after the container returns. An instance that created
//!   leases for every uncovered range at once took the ranges of the instances not back yet and
//!   started them from the start position — with `now`, after everything written since their
//!   last checkpoints. So the ranges nobody wrote back get leases only once the container has
//!   been back for [`bootstrap_delay`] (a lease expiration, at least two acquire intervals):
//!   every live instance lists at least once per acquire interval, and a lease task that had not
//!   noticed the deletion finds its lease gone within a renew interval and puts it back.
//! - **A write-back never gives way** ([`write_back`]). Others may create a lease for the range
//!   before it (the operator's estimator or an instance starting finds the lease set empty and
//!   bootstraps it). The checkpoint held here is real progress: everything before it was
//!   handled; the position found may come from "now" and skip what came between. So the
//!   checkpoint replaces it (If-Match on what was read, unowned): an owner that started from the
//!   found position finds the lease changed on its next write and stops it without writing, and
//!   the lease resumes from the checkpoint. The cost is redelivery of what was processed from the
//!   other position; never a loss.

use std::time::Duration;

use crate::processor::error::LeaseError;
use crate::processor::leases::bootstrap::bootstrap_paced;
use crate::processor::leases::lease::{Lease, LeaseStore, LeaseStoreError, START_FROM_PROPERTY};
use crate::processor::leases::owned::OwnedLease;
use crate::processor::options::ProcessorOptions;
use crate::processor::run::shared::Shared;

/// How often a write-back reads the lease again and retries when it changed meanwhile.
const WRITE_BACK_ATTEMPTS: usize = 6;

/// The leases kept while the lease container is missing.
#[derive(Default)]
pub(crate) struct StoreRecovery {
    /// Leases this instance owned when the lease container disappeared, with their checkpoints.
    orphans: Vec<Lease>,
    /// When the leases of the ranges nobody wrote back are created (the container came back).
    bootstrap_at: Option<tokio::time::Instant>,
    /// Leases deleted while processed here, not yet written back: a listing failed when they
    /// were found gone, so whether other leases cover their ranges now is decided at a cycle
    /// whose listing works.
    undecided: Vec<Lease>,
}

/// How long after the lease container came back the ranges nobody wrote back get leases: one
/// lease expiration, and at least two acquire intervals (each live instance lists once per
/// acquire interval and writes its leases back then).
pub(crate) fn bootstrap_delay(options: &ProcessorOptions) -> Duration {
    options.expiration.max(options.acquire_interval * 2)
}

impl StoreRecovery {
    /// Reports the lease container missing (once in the log; on `/readyz` while it lasts).
    pub(crate) fn missing(&mut self, shared: &Shared, error: &LeaseStoreError) {
        let problem = format!("the lease container does not exist (deleted?): {error}");
        if shared.health.store_missing(problem) {
            tracing::error!(%error, "the lease container does not exist (deleted?); processing waits until it is back, then the leases owned here are written back with their checkpoints");
        }
    }

    /// After the lease container came back: writes back the leases this instance owned (those
    /// that fail are tried again at the next cycle), and once it has been back for
    /// [`bootstrap_delay`], creates leases for the ranges nobody covers (from the start
    /// position). `true` when it wrote something this cycle.
    pub(crate) async fn back(&mut self, shared: &Shared) -> bool {
        let was_missing = shared.health.store_back();
        let orphans = std::mem::take(&mut self.orphans);
        if was_missing || !orphans.is_empty() {
            tracing::warn!(
                leases = orphans.len(),
                "the lease container exists again; writing back the leases owned here"
            );
            for lease in orphans {
                self.put_back(shared, lease).await;
            }
            self.bootstrap_at = Some(tokio::time::Instant::now() + bootstrap_delay(&shared.options));
            return true;
        }
        if self.bootstrap_at.is_none_or(|at| tokio::time::Instant::now() < at) {
            return false;
        }
        self.bootstrap_at = None;
        if let Err(error) = bootstrap_paced(
            shared.store.as_ref(),
            &shared.budget,
            &shared.monitored,
            &shared.options,
        )
        .await
        {
            shared.telemetry.error(None, LeaseError::CreateMissing(Box::new(error)));
        }
        true
    }

    /// Puts back a lease document deleted while this instance processed it, with its last
    /// checkpoint and no owner, so that its range is not left without a lease (nothing lost).
    /// A lease whose range other leases cover now is not written back: it was replaced on
    /// purpose (a split or a rewrite by its new owner, a restore or import of another layout),
    /// and writing it back would undo that and read the overlap again from an older checkpoint.
    pub(crate) async fn recreate(&mut self, shared: &Shared, owned: &OwnedLease) {
        let mut lease = owned.current().await;
        lease.owner = None;
        lease.etag.clear();
        lease.clear_handoff();
        self.reconsider(shared, lease).await;
    }

    /// Decides again on the deleted leases a failed listing left undecided.
    pub(crate) async fn reconsider_undecided(&mut self, shared: &Shared) {
        for lease in std::mem::take(&mut self.undecided) {
            self.reconsider(shared, lease).await;
        }
    }

    /// Writes `lease` back unless other leases cover its range now; undecided while the
    /// listing fails (unless the lease container is gone: it is written back once it is back).
    async fn reconsider(&mut self, shared: &Shared, lease: Lease) {
        if let Some(range) = lease.range() {
            match shared.store.snapshot().await {
                Ok(snapshot)
                    if snapshot
                        .leases
                        .iter()
                        .any(|other| other.id != lease.id && other.range().is_some_and(|r| r.overlaps(range))) =>
                {
                    tracing::info!(lease = %lease.lease_token, "the deleted lease's range is covered by other leases now (replaced on purpose); not written back");
                    return;
                }
                Ok(_) => {}
                Err(error) if error.is_container_missing() => {}
                Err(error) => {
                    tracing::debug!(lease = %lease.lease_token, %error, "cannot list the leases to decide whether to write a deleted lease back; deciding at the next cycle");
                    self.undecided.push(lease);
                    return;
                }
            }
        }
        self.put_back(shared, lease).await;
    }

    /// Writes `lease` back; keeps it for the next cycle when that fails.
    async fn put_back(&mut self, shared: &Shared, lease: Lease) {
        let token = lease.lease_token.clone();
        match write_back(shared.store.as_ref(), &lease).await {
            Ok(WrittenBack::Created) => {
                tracing::warn!(lease = %token, "the lease document was missing; wrote it back from the last checkpoint here");
            }
            Ok(WrittenBack::Replaced) => {
                tracing::warn!(lease = %token, "the missing lease had been created again from another position; wrote the last checkpoint here into it (what was processed from that position may be delivered again, nothing is skipped)");
            }
            Ok(WrittenBack::Found) => {
                tracing::debug!(lease = %token, "the missing lease exists again at its last checkpoint")
            }
            Err(error) => {
                if !error.is_container_missing() {
                    shared.telemetry.error(Some(&token), LeaseError::Recreate(error));
                }
                // Kept until the container is back or the write works.
                self.orphans.push(lease);
            }
        }
    }
}

/// What [`write_back`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WrittenBack {
    /// The lease did not exist: created.
    Created,
    /// A lease with another position was there: the checkpoint replaced its position.
    Replaced,
    /// The lease was there at the same position: nothing written.
    Found,
}

/// Writes `lease` (unowned, with the checkpoint held here) back into the lease container. A lease
/// with its id found there takes its position ([`replacing`]), If-Match on the copy read, read
/// again and retried when it changed meanwhile.
pub(crate) async fn write_back(store: &dyn LeaseStore, lease: &Lease) -> Result<WrittenBack, LeaseStoreError> {
    for _ in 0..WRITE_BACK_ATTEMPTS {
        if store.create(lease).await?.is_some() {
            return Ok(WrittenBack::Created);
        }
        let Some(found) = store.read(&lease.id).await? else {
            continue;
        };
        let Some(next) = replacing(lease, &found) else {
            return Ok(WrittenBack::Found);
        };
        match store.replace(&next).await {
            Ok(_) => return Ok(WrittenBack::Replaced),
            Err(LeaseStoreError::Changed(_) | LeaseStoreError::Gone(_)) => {}
            Err(error) => return Err(error),
        }
    }
    Err(LeaseStoreError::Changed(lease.id.clone()))
}

/// The write that puts the position of `ours` (a checkpoint held here) into `found`, the lease
/// with its id in the container: unowned, conditional on `found`'s ETag. `None` when `found`
/// already reads from the same position.
pub(crate) fn replacing(ours: &Lease, found: &Lease) -> Option<Lease> {
    let start = |lease: &Lease| lease.properties.get(START_FROM_PROPERTY).cloned();
    if found.continuation == ours.continuation && start(found) == start(ours) {
        return None;
    }
    let mut next = ours.clone();
    next.owner = None;
    next.clear_handoff();
    next.etag = found.etag.clone();
    next.timestamp = Some(time::OffsetDateTime::now_utc());
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cosmos::EpkRange;

    fn lease(continuation: Option<&str>, owner: Option<&str>, etag: &str) -> Lease {
        let mut lease = Lease::new("p", &EpkRange::new("", "80"), continuation.map(str::to_owned));
        lease.owner = owner.map(str::to_owned);
        lease.etag = etag.into();
        lease
    }

    #[test]
    fn a_checkpoint_written_back_takes_the_place_of_any_other_position() {
        let ours = lease(Some("\"40\""), None, "");
        let cases: Vec<(&str, Lease, bool)> = vec![
            (
                "created from now, ahead: would skip 41..",
                lease(Some("\"90\""), None, "e1"),
                true,
            ),
            (
                "taken and read on from now",
                lease(Some("\"95\""), Some("b"), "e2"),
                true,
            ),
            ("from the beginning, behind", lease(None, None, "e3"), true),
            ("another instance's older copy", lease(Some("\"30\""), None, "e4"), true),
            ("already at our position", lease(Some("\"40\""), Some("b"), "e5"), false),
        ];
        for (case, found, replaced) in cases {
            let next = replacing(&ours, &found);
            assert_eq!(next.is_some(), replaced, "{case}");
            if let Some(next) = next {
                assert_eq!(next.continuation, ours.continuation, "{case}");
                assert_eq!(next.owner, None, "{case}: its owner stops it without writing");
                assert_eq!(next.etag, found.etag, "{case}: If-Match on what was read");
            }
        }
        // A lease of a container created again starts from the beginning, not from "now".
        let recreated = lease(None, None, "").start_from_beginning();
        assert!(replacing(&recreated, &lease(None, None, "e6")).is_some());
    }

    #[test]
    fn the_missing_leases_wait_an_expiration_and_two_acquire_intervals() {
        let mut options = ProcessorOptions::new("p", "a");
        options.expiration = Duration::from_secs(60);
        options.acquire_interval = Duration::from_secs(13);
        assert_eq!(bootstrap_delay(&options), Duration::from_secs(60));
        options.acquire_interval = Duration::from_secs(40);
        assert_eq!(bootstrap_delay(&options), Duration::from_secs(80));
    }
}
