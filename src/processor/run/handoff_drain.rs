//! The owner's side of a handoff it accepted: while its batches in flight finish and are
//! checkpointed, it acknowledges the request with a fenced write, anew every renew interval, so
//! that the requester waits for it rather than taking the lease when its patience (a lease
//! expiration) runs out. An owner that stops acknowledging — stuck past its handler's time limit,
//! or gone — loses the lease to the requester an expiration later, as before.

use std::convert::Infallible;
use std::time::Duration;

use time::OffsetDateTime;
use tokio::time::Instant;

use crate::processor::leases::owned::{OwnedLease, UpdateError};
use crate::processor::run::shared::Shared;

/// How long an owner acknowledges a handoff at most, having accepted it: its handler's time limit
/// (the batch in flight ends within it, and is not retried once the lease is handed over) and an
/// expiration for the final checkpoint and the release; without a time limit, as long as it
/// drains.
pub(crate) fn acknowledging_for(handler_limit: Option<Duration>, expiration: Duration) -> Option<Duration> {
    handler_limit.map(|limit| limit + expiration)
}

/// Once `owned`'s processing is cancelled for a handoff, acknowledges the request every renew
/// interval (the first after half of one: a handoff with nothing in flight is done before it)
/// while the lease's reader still drains its batches, until [`acknowledging_for`] has passed or
/// the lease is no longer this ownership. Nothing is acknowledged once the reader has ended: the
/// release is the next write, and a lease container whose budget holds it back would hold an
/// acknowledgement back as well. Never returns: it ends when the lease's task drops it.
pub(crate) async fn acknowledge_while_draining(shared: &Shared, owned: &OwnedLease) -> Infallible {
    owned.cancelled().cancelled().await;
    if let Some(to) = owned.handoff_target() {
        let every = shared.options.renew_interval;
        let bound = acknowledging_for(shared.handler.time_limit(), shared.options.expiration);
        let until = bound.map(|bound| Instant::now() + bound);
        tokio::time::sleep(every / 2).await;
        while !owned.is_closed() && until.is_none_or(|until| Instant::now() < until) {
            let acknowledged = owned
                .update(|lease| lease.acknowledge_handoff(OffsetDateTime::now_utc()))
                .await;
            match acknowledged {
                Ok(_) => tracing::debug!(to = %to, "acknowledged the handoff while draining"),
                Err(UpdateError::Lost(_) | UpdateError::Gone) => break,
                Err(UpdateError::Store(error)) => {
                    tracing::debug!(%error, "acknowledging the handoff failed; trying again")
                }
            }
            tokio::time::sleep(every).await;
        }
    }
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_acknowledges_for_its_handler_s_limit_and_an_expiration_or_while_it_drains() {
        let second = Duration::from_secs(1);
        assert_eq!(acknowledging_for(Some(second * 60), second * 60), Some(second * 120));
        assert_eq!(acknowledging_for(None, second * 60), None);
    }
}
