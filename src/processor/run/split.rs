//! Splits (the reference processors' partition synchronizer): when a lease's range now spans
//! several physical partitions, the lease is replaced by one child lease per part, each with the
//! right continuation, owned by this instance, and the parent is deleted.

use time::OffsetDateTime;

use crate::cosmos::{EpkRange, RangeContinuation};
use crate::processor::error::LeaseError;
use crate::processor::leases::bootstrap::partition_id;
use crate::processor::leases::lease::Lease;
use crate::processor::leases::owned::{Acquired, OwnedLease, UpdateError};
use crate::processor::report::events::{CloseReason, LeaseEvent, LeaseExit};
use crate::processor::run::shared::Shared;

/// After a 410 or a split-window failure: if the feed ranges under the lease changed, split the
/// lease with its latest checkpoint as every child's continuation.
pub(crate) async fn split_from_checkpoint(shared: &Shared, owned: &OwnedLease, range: &EpkRange) -> Option<LeaseExit> {
    let ranges = match shared.monitored.feed_ranges(true).await {
        Ok(ranges) => ranges,
        Err(error) => {
            tracing::debug!(%error, "cannot refresh feed ranges");
            return None;
        }
    };
    let children: Vec<RangeContinuation> = ranges
        .iter()
        .filter(|r| range.contains(r))
        // An empty continuation stands for the lease's latest checkpoint (filled in by `split`).
        .map(|r| RangeContinuation {
            range: r.clone(),
            continuation: String::new(),
        })
        .collect();
    if children.len() < 2 {
        // One partition serves the range: merged, if it is larger than the lease's.
        return unname_merged(shared, owned, true).await;
    }
    split(shared, owned, range, &children).await
}

/// The pieces `range` is split into: one per part (its continuation, or `fallback` when empty),
/// and the gaps between parts, which start from `fallback` too.
pub fn pieces(
    range: &EpkRange,
    parts: &[RangeContinuation],
    fallback: Option<String>,
) -> Vec<(EpkRange, Option<String>)> {
    let mut pieces: Vec<(EpkRange, Option<String>)> = Vec::new();
    let mut cursor = range.min.clone();
    let mut sorted: Vec<&RangeContinuation> = parts.iter().filter(|p| range.contains(&p.range)).collect();
    sorted.sort_by(|a, b| a.range.cmp(&b.range));
    for part in sorted {
        if cursor < part.range.min {
            pieces.push((EpkRange::new(cursor.clone(), part.range.min.clone()), fallback.clone()));
        }
        let continuation = Some(part.continuation.clone())
            .filter(|c| !c.is_empty())
            .or_else(|| fallback.clone());
        pieces.push((part.range.clone(), continuation));
        cursor = part.range.max.clone();
    }
    if cursor < range.max {
        pieces.push((EpkRange::new(cursor, range.max.clone()), fallback));
    }
    pieces
}

/// Replaces the lease by one child lease per part (owned by this instance), then deletes it.
/// Parts of the range not covered by `parts`, or given an empty continuation, start from the
/// parent's latest checkpoint. `None` when the lease stays as it is (not split, or a child could
/// not be written: the reader is rebuilt and the split tried again).
pub(crate) async fn split(
    shared: &Shared,
    owned: &OwnedLease,
    range: &EpkRange,
    parts: &[RangeContinuation],
) -> Option<LeaseExit> {
    let parent = owned.current().await;
    let pieces = pieces(range, parts, parent.continuation.clone());
    if pieces.len() < 2 {
        return None;
    }
    // A version-0 parent gets version-0 children where a child is a whole partition, as the
    // .NET processor does.
    let partitions = if parent.names_a_partition() {
        match shared.monitored.partition_key_ranges().await {
            Ok(partitions) => partitions,
            Err(error) => {
                tracing::debug!(%error, "listing the partition key ranges after a split failed; trying again");
                return None;
            }
        }
    } else {
        Vec::new()
    };
    // Children only while the parent is still this ownership: a deposed owner (its reader saw the
    // split before a listing showed the loss) must not create leases over the new owner's range.
    let sent = tokio::time::Instant::now();
    if let Err(lost) = fence(owned).await {
        return Some(lost);
    }
    let mut children = Vec::new();
    for (child_range, continuation) in pieces {
        let id = partition_id(&partitions, &child_range);
        let lease = create_child(shared, owned, &parent, (&child_range, id), continuation).await?;
        children.push(Acquired { lease, sent });
    }
    finish(shared, owned, children, "lease split").await
}

/// A fenced write of the parent before what replaces it is created (its time, as a renewal):
/// the exit when the lease is no longer this ownership. A store failure goes on: the deletion of
/// the parent undoes the children when it was lost.
async fn fence(owned: &OwnedLease) -> Result<(), LeaseExit> {
    match owned
        .update(|lease| lease.timestamp = Some(OffsetDateTime::now_utc()))
        .await
    {
        Ok(_) | Err(UpdateError::Store(_)) => Ok(()),
        Err(UpdateError::Lost(owner)) => {
            tracing::info!(
                ?owner,
                "the lease was taken before it was replaced; leaving it to its owner"
            );
            Err(LeaseExit::closed(CloseReason::LeaseLost))
        }
        Err(UpdateError::Gone) => Err(LeaseExit::closed(CloseReason::LeaseGone)),
    }
}

/// Rewrites a lease this instance just acquired in the reference format when it is not (an EPK
/// lease over exactly one physical partition, as versions before 0.2 wrote them at bootstrap
/// and their splits): a version-0 lease named by the partition key range id takes its place —
/// same owner, continuation and properties — and the old document is deleted, like a split
/// into one child. A version-0 lease whose partition merged becomes an EPK lease instead
/// ([`unname_merged`]). `None` when the lease keeps its form (already in it, a sub-range, several
/// leases per partition, or the partitions could not be listed: tried again at its next
/// acquisition).
pub(crate) async fn reshape(shared: &Shared, owned: &OwnedLease) -> Option<LeaseExit> {
    let lease = owned.current().await;
    if lease.names_a_partition() {
        return unname_merged(shared, owned, false).await;
    }
    if shared.options.leases_per_partition > 1 {
        return None;
    }
    let range = lease.range()?.clone();
    let id = shared.partition_of(&range).await?;
    rewrite(
        shared,
        owned,
        Some(&id),
        "lease rewritten as version 0 (named by its partition key range id)",
    )
    .await
}

/// Rewrites a version-0 lease whose partition merged (its range is now a strict part of one
/// partition, whose id is another) as an EPK lease over the same range — same owner,
/// continuation and properties — as the .NET processor does when a read of it finds the
/// partition gone; the reader then reads its EPK range of the merged partition. The partitions
/// are listed again to decide (without `fresh`, only when the cached listing shows a merge).
/// `None` when the lease keeps its form.
pub(crate) async fn unname_merged(shared: &Shared, owned: &OwnedLease, fresh: bool) -> Option<LeaseExit> {
    let lease = owned.current().await;
    if !lease.names_a_partition() {
        return None;
    }
    let range = lease.range()?;
    // A listing from before a split also shows a larger partition around a child's range: the
    // cached one only says whether to look, a fresh one decides.
    if !fresh {
        shared.partition_around(range, false).await?;
    }
    let (merged, _) = shared.partition_around(range, true).await?;
    tracing::info!(lease = %lease.lease_token, %merged, "the lease's partition merged");
    rewrite(
        shared,
        owned,
        None,
        "lease rewritten as an EPK lease (its partition merged)",
    )
    .await
}

/// Replaces the lease by the same lease (range, owner, continuation, properties) under another
/// id: version 0 named by `pk_range_id`, or (with `None`) an EPK lease; the old document is
/// deleted, like a split into one child.
async fn rewrite(shared: &Shared, owned: &OwnedLease, pk_range_id: Option<&str>, what: &str) -> Option<LeaseExit> {
    let lease = owned.current().await;
    let range = lease.range()?.clone();
    let continuation = lease.continuation.clone();
    let sent = tokio::time::Instant::now();
    if let Err(lost) = fence(owned).await {
        return Some(lost);
    }
    let child = create_child(shared, owned, &lease, (&range, pk_range_id), continuation).await?;
    finish(shared, owned, vec![Acquired { lease: child, sent }], what).await
}

/// Deletes the replaced lease (if still ours) and says which leases took its place; when it was
/// taken meanwhile, its children are removed again and the lease is left to its new owner.
async fn finish(shared: &Shared, owned: &OwnedLease, children: Vec<Acquired>, what: &str) -> Option<LeaseExit> {
    match owned.delete().await {
        Ok(()) | Err(UpdateError::Gone) => {}
        Err(UpdateError::Lost(owner)) => {
            tracing::info!(
                ?owner,
                "the lease was taken while it was replaced; removing what replaced it"
            );
            for Acquired { lease: child, .. } in &children {
                if let Err(error) = shared.store.delete(child).await {
                    tracing::warn!(lease = %child.id, %error, "removing a lease written for a lease taken meanwhile failed; delete it by hand");
                }
            }
            return Some(LeaseExit::closed(CloseReason::LeaseLost));
        }
        Err(error) => {
            shared
                .telemetry
                .error(Some(owned.token()), LeaseError::DeleteSplitParent(error));
        }
    }
    announce(shared, owned, children, what)
}

/// Says which leases took the place of `owned`: its task ends, theirs start.
fn announce(shared: &Shared, owned: &OwnedLease, children: Vec<Acquired>, what: &str) -> Option<LeaseExit> {
    let tokens: Vec<String> = children.iter().map(|c| c.lease.lease_token.clone()).collect();
    tracing::info!(children = ?tokens, "{what}");
    shared.telemetry.emit(LeaseEvent::Split {
        parent: owned.token().to_owned(),
        children: tokens,
    });
    Some(LeaseExit {
        reason: CloseReason::Split,
        children,
    })
}

/// Writes one child lease of `parent` over `range` (version 0 when the range is the partition
/// key range `pk_range_id`) — or takes the one an earlier attempt of this split wrote, in this
/// process or in another that began this split before it crashed or was deposed (see
/// [`take_over_child`]); `None` when the split cannot go on now.
async fn create_child(
    shared: &Shared,
    owned: &OwnedLease,
    parent: &Lease,
    (range, pk_range_id): (&EpkRange, Option<&str>),
    continuation: Option<String>,
) -> Option<Lease> {
    let prefix = shared.store.prefix();
    let mut child = match pk_range_id {
        Some(id) => Lease::for_partition(prefix, id, range, continuation),
        None => Lease::new(prefix, range, continuation),
    };
    child.properties = parent.properties.clone();
    // The parent's copy may predate the fence; the rate goes on from what is counted now.
    owned.record_write_rate(&mut child);
    child.mode = parent.mode.clone();
    child.clear_handoff();
    child.take_for(&shared.options.instance, shared.next_epoch());
    child.timestamp = Some(OffsetDateTime::now_utc());
    match shared.store.create(&child).await {
        Ok(Some(created)) => Some(created),
        Ok(None) => match shared.store.read(&child.id).await {
            // Created by an earlier attempt of this split in this process (its epoch says so: a
            // twin's or a predecessor's under the same name is not this split's); taken as it is.
            Ok(Some(existing))
                if existing.range() == Some(range)
                    && existing.owner.as_deref() == Some(&shared.options.instance)
                    && existing
                        .owner_epoch
                        .as_deref()
                        .is_some_and(|epoch| shared.wrote_epoch(epoch)) =>
            {
                Some(existing)
            }
            // Written by another attempt of this split: under this name by an earlier process
            // (it crashed; this one holds the name), or by another instance that began it before
            // it crashed or was deposed (the pod replaced, the child unowned since). Taken over,
            // with If-Match: left to that instance, a deposed one would delete it again when it
            // finds the parent lost, and the parent's deletion here would leave its keys unread.
            Ok(Some(existing)) if existing.range() == Some(range) => take_over_child(shared, existing, child).await,
            // Another document has the id (a .NET v2 lease adopted in place keeps its own):
            // the lease stays as it is.
            Ok(Some(_)) => {
                tracing::debug!(lease = %child.id, "a document of another kind has the child lease's id");
                None
            }
            _ => None,
        },
        Err(error) => {
            shared.telemetry.error(
                Some(owned.token()),
                LeaseError::ChildLease {
                    child: child.lease_token.clone(),
                    error,
                },
            );
            None
        }
    }
}

/// Takes over `existing`, a child lease another attempt of this split wrote before it could
/// delete the parent (a crashed predecessor of this name, another instance crashed or deposed):
/// under this instance and epoch (`ours`), from the further of the two checkpoints — each marks
/// what was handled, so either loses nothing; the further one redelivers less. Conditional on the
/// version read: an owner that wrote it meanwhile keeps it (the split is tried again).
async fn take_over_child(shared: &Shared, existing: Lease, ours: Lease) -> Option<Lease> {
    let position = |lease: &Lease| lease.continuation.as_deref().and_then(crate::cosmos::continuation_lsn);
    let mut taken = existing.clone();
    if position(&ours) > position(&existing) {
        taken.continuation = ours.continuation.clone();
    }
    taken.owner.clone_from(&ours.owner);
    taken.owner_epoch = ours.owner_epoch.clone();
    taken.timestamp = ours.timestamp;
    taken.clear_handoff();
    match shared.store.replace(&taken).await {
        Ok(written) => {
            tracing::info!(lease = %taken.lease_token, from = ?existing.owner, "took over a child lease another attempt of this split wrote");
            Some(written)
        }
        Err(error) => {
            tracing::debug!(lease = %taken.lease_token, %error, "taking over a child lease another attempt wrote failed; trying again");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(min: &str, max: &str, continuation: &str) -> RangeContinuation {
        RangeContinuation {
            range: EpkRange::new(min, max),
            continuation: continuation.into(),
        }
    }

    #[test]
    fn pieces_cover_the_range_and_gaps_start_from_the_parent_checkpoint() {
        let range = EpkRange::new("", "FF");
        let parent = Some("parent".to_owned());
        type Piece<'a> = (&'a str, &'a str, &'a str);
        let cases: [(Vec<RangeContinuation>, Vec<Piece>); 3] = [
            (
                vec![part("", "80", "a"), part("80", "FF", "b")],
                vec![("", "80", "a"), ("80", "FF", "b")],
            ),
            (
                vec![part("40", "80", ""), part("80", "C0", "c")],
                vec![
                    ("", "40", "parent"),
                    ("40", "80", "parent"),
                    ("80", "C0", "c"),
                    ("C0", "FF", "parent"),
                ],
            ),
            // A part outside the range is ignored.
            (
                vec![part("", "FF", "x"), part("FF", "FFFF", "y")],
                vec![("", "FF", "x")],
            ),
        ];
        for (parts, expected) in cases {
            let got: Vec<(String, String, String)> = pieces(&range, &parts, parent.clone())
                .into_iter()
                .map(|(r, c)| (r.min, r.max, c.unwrap_or_default()))
                .collect();
            let expected: Vec<(String, String, String)> = expected
                .into_iter()
                .map(|(a, b, c)| (a.into(), b.into(), c.into()))
                .collect();
            assert_eq!(got, expected);
        }
    }
}
