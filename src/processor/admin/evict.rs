//! Freeing the leases of an instance that is known to be gone (its pod was deleted or failed), so
//! that the others take them in their next acquire cycle instead of waiting for the expiration.
//!
//! Every lease is freed with a conditional replace that clears `Owner` only while it still names
//! that instance: a lease another instance took in the meantime is never touched, and an instance
//! that was frozen rather than gone finds its lease changed (412) on its next write and stops it
//! without writing. The instance's heartbeat is removed too, so the balancer stops counting it.

use time::OffsetDateTime;

use crate::processor::leases::lease::{Lease, LeaseStore, LeaseStoreError};

/// How many times a lease is re-read and freed again after a 412 while it still names the instance.
const MAX_CONFLICT_RETRIES: usize = 6;

/// Frees every lease of the processor owned by `instance` and removes its heartbeat. Returns the
/// lease tokens that were freed (none when the instance owned nothing).
pub async fn evict_instance(store: &dyn LeaseStore, instance: &str) -> Result<Vec<String>, LeaseStoreError> {
    let snapshot = store.snapshot().await?;
    let theirs = |l: &Lease| l.owner.as_deref() == Some(instance);
    let freed = free_all(store, snapshot.leases, &theirs).await?;
    if snapshot.instances.iter().any(|(name, _)| name == instance) {
        remove_heartbeat(store, instance, None).await?;
    }
    Ok(freed)
}

/// Frees the leases that the process of `instance` which ended at `ended` (its container's
/// `finishedAt`, on the clock of the node it ran on) held, and removes its heartbeat: only when
/// the name's heartbeat is still that process's (written by then), and only leases of its
/// ownership epochs — a process of the name started since (the container run again) has written
/// its own heartbeat and epochs, and nothing of it is touched. A last heartbeat within the
/// second `finishedAt` is rounded down to frees nothing: those leases expire as usual.
pub async fn evict_ended_process(
    store: &dyn LeaseStore,
    instance: &str,
    ended: OffsetDateTime,
) -> Result<Vec<String>, LeaseStoreError> {
    let Some(beat) = store.read_heartbeat(instance).await? else {
        return Ok(Vec::new());
    };
    let (Some(incarnation), Some(written)) = (beat.incarnation.as_deref(), beat.written) else {
        return Ok(Vec::new());
    };
    if written > ended {
        return Ok(Vec::new());
    }
    let epochs = format!("{incarnation}.");
    let its = |l: &Lease| {
        l.owner.as_deref() == Some(instance) && l.owner_epoch.as_deref().is_some_and(|e| e.starts_with(&epochs))
    };
    let freed = free_all(store, store.snapshot().await?.leases, &its).await?;
    remove_heartbeat(store, instance, Some(&beat.etag)).await?;
    Ok(freed)
}

/// Frees each of `leases` that `held` says is the gone process's, with a conditional replace
/// (re-read after a 412 while it still is); the tokens freed.
async fn free_all(
    store: &dyn LeaseStore,
    leases: Vec<Lease>,
    held: &(dyn Fn(&Lease) -> bool + Sync),
) -> Result<Vec<String>, LeaseStoreError> {
    let mut freed = Vec::new();
    for lease in leases.into_iter().filter(|l| held(l)) {
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
                    Some(fresh) if held(&fresh) => current = fresh,
                    // Another instance took it, or it was released or deleted: nothing to free.
                    _ => break,
                },
                Err(LeaseStoreError::Gone(_)) => break,
                Err(other) => return Err(other),
            }
        }
    }
    Ok(freed)
}

/// Removes the heartbeat of `instance` (at version `if_match` when given).
async fn remove_heartbeat(
    store: &dyn LeaseStore,
    instance: &str,
    if_match: Option<&str>,
) -> Result<(), LeaseStoreError> {
    match store.remove_heartbeat(instance, if_match).await {
        Ok(()) => Ok(()),
        // Removed by the instance itself or by another operator replica in the meantime.
        Err(LeaseStoreError::Cosmos(e)) if e.kind == crate::cosmos::ErrorKind::NotFound => Ok(()),
        Err(other) => Err(other),
    }
}
