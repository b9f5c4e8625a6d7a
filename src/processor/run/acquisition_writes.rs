//! The writes by which an acquire cycle takes leases: an acquisition or a handoff request as the
//! cycle planned it, and the take-up of a lease its owner handed over — each paced by the lease
//! container's budget ([`crate::processor::budgets::writes`]).

use time::OffsetDateTime;

use crate::processor::budgets::writes::{Late, Spend, Turn};
use crate::processor::leases::lease::{Lease, LeaseStore, LeaseStoreError};
use crate::processor::leases::owned::Acquired;
use crate::processor::policy::acquisitions::{Acquisition, retry_acquisition};
use crate::processor::run::shared::Shared;

/// How many times a write asking a live owner for a lease, or taking it from one that ignored the
/// request, is tried again after a 412 within one cycle.
const ACQUIRE_RETRIES: u32 = 5;

/// Writes one acquisition (If-Match the listed ETag), as a write that can wait (at low priority, a
/// 429 answered at once: [`LeaseStore::replace_deferrable`]). One from a live owner (a handoff
/// request, or the take after the owner ignored one for a lease expiration) re-reads the lease on a
/// 412 and tries again while the reason holds, a few times (as the reference processors do): an
/// owner that checkpoints often changes the lease between every listing and write, and would keep
/// it.
pub(crate) async fn write_acquisition(
    store: &dyn LeaseStore,
    acquisition: &Acquisition,
) -> Result<Lease, LeaseStoreError> {
    let mut write = acquisition.write.clone();
    let mut retries = 0;
    loop {
        match store.replace_deferrable(&write).await {
            Err(LeaseStoreError::Changed(id)) if acquisition.previous_owner.is_some() && retries < ACQUIRE_RETRIES => {
                let current = store.read(&id).await?;
                match current.and_then(|current| retry_acquisition(acquisition, current, OffsetDateTime::now_utc())) {
                    Some(next) => write = next,
                    None => return Err(LeaseStoreError::Changed(id)),
                }
                retries += 1;
            }
            written => return written,
        }
    }
}

/// What became of a lease this instance awaits.
pub(crate) enum Adoption {
    /// Handed over and written: taken up ([`Handed::TakeUp`]) or freed ([`Handed::Free`]).
    Taken(Box<Acquired>),
    /// Still asked for (or its read failed): looked at again.
    Waiting,
    /// Deleted, given to another, or the request is gone.
    Gone,
}

/// What this instance does with a lease handed over to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handed {
    /// Takes it up (writes an epoch of its own) to process it.
    TakeUp,
    /// Frees it (no owner): this instance is stopping, and the others take it up.
    Free,
}

/// Reads lease `id`, which `me` asked for, and, when its owner handed it over, takes it up or
/// frees it as `handed` says.
pub(crate) async fn adopt_one(shared: &Shared, me: &str, id: &str, handed: Handed) -> Adoption {
    let lease = match shared.store.read(id).await {
        Ok(Some(lease)) => lease,
        Ok(None) => return Adoption::Gone,
        Err(error) => {
            tracing::debug!(lease = %id, %error, "reading a lease asked for failed");
            return Adoption::Waiting;
        }
    };
    let handed_over = lease.owner.as_deref() == Some(me) && !shared.owned.contains(id);
    if !handed_over {
        return match lease.handoff_request() {
            Some((to, _)) if to == me => Adoption::Waiting,
            _ => Adoption::Gone,
        };
    }
    let mut next = lease.clone();
    next.clear_handoff();
    match handed {
        Handed::TakeUp => next.take_for(me, shared.next_epoch()),
        Handed::Free => {
            next.owner = None;
            next.owner_epoch = None;
        }
    }
    next.timestamp = Some(OffsetDateTime::now_utc());
    // Urgent: the lease was handed over to this instance, whose processing of it waits (or,
    // freed, the others').
    let mut sent = tokio::time::Instant::now();
    let written = shared
        .budget
        .paced((shared.options.acquire_interval, Late::Ahead), Turn::Ahead, |spend| {
            sent = tokio::time::Instant::now();
            let next = &next;
            async move {
                match spend {
                    Spend::Deferrable => shared.store.replace_deferrable(next).await,
                    Spend::Plain | Spend::Vital => shared.store.replace(next).await,
                }
            }
        })
        .await;
    match written {
        Ok(lease) => Adoption::Taken(Box::new(Acquired { lease, sent })),
        Err(error) => {
            tracing::debug!(lease = %lease.lease_token, %error, "taking up a handed-over lease failed");
            Adoption::Gone
        }
    }
}
