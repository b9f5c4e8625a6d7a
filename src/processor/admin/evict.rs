//! Freeing the leases of an instance that is known to be gone (its pod was deleted or failed), so
//! that the others take them in their next acquire cycle instead of waiting for the expiration.
//!
//! Every lease is freed with a conditional replace that clears `Owner` only while it still names
//! that instance: a lease another instance took in the meantime is never touched, and an instance
//! that was frozen rather than gone finds its lease changed (412) on its next write and stops it
//! without writing. The instance's heartbeat is removed too, so the balancer stops counting it.

use time::OffsetDateTime;

use crate::processor::leases::lease::{LeaseStore, LeaseStoreError};

/// How many times a lease is re-read and freed again after a 412 while it still names the instance.
const MAX_CONFLICT_RETRIES: usize = 6;

/// Frees every lease of the processor owned by `instance` and removes its heartbeat. Returns the
/// lease tokens that were freed (none when the instance owned nothing).
pub async fn evict_instance(store: &dyn LeaseStore, instance: &str) -> Result<Vec<String>, LeaseStoreError> {
    let snapshot = store.snapshot().await?;
    let mut freed = Vec::new();
    for lease in snapshot
        .leases
        .into_iter()
        .filter(|l| l.owner.as_deref() == Some(instance))
    {
        let mut current = lease;
        for _ in 0..MAX_CONFLICT_RETRIES {
            let mut next = current.clone();
            next.owner = None;
            next.timestamp = Some(OffsetDateTime::now_utc());
            match store.replace(&next).await {
                Ok(_) => {
                    freed.push(current.lease_token.clone());
                    break;
                }
                Err(LeaseStoreError::Changed(_)) => match store.read(&current.id).await? {
                    Some(fresh) if fresh.owner.as_deref() == Some(instance) => current = fresh,
                    // Another instance took it, or it was released or deleted: nothing to free.
                    _ => break,
                },
                Err(LeaseStoreError::Gone(_)) => break,
                Err(other) => return Err(other),
            }
        }
    }
    let has_heartbeat = snapshot.instances.iter().any(|(name, _)| name == instance);
    if has_heartbeat {
        match store.remove_heartbeat(instance, None).await {
            Ok(()) => {}
            // Removed by the instance itself or by another operator replica in the meantime.
            Err(LeaseStoreError::Cosmos(e)) if e.kind == crate::cosmos::ErrorKind::NotFound => {}
            Err(other) => return Err(other),
        }
    }
    Ok(freed)
}
