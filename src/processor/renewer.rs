//! The renewer: keeps every owned lease alive, one write per renew interval unless a checkpoint
//! just refreshed it, independently of how long batches take.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::error::LeaseError;
use super::owned::UpdateError;
use super::shared::Shared;

/// Renews every owned lease each renew interval until `stop`. A lease whose processing is
/// stopping (shutdown, handoff) is still renewed until it is released: only a lost one is not.
pub(crate) async fn renew_loop(shared: Arc<Shared>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(shared.options.renew_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        renew_all(&shared).await;
    }
}

/// One round of renewals.
async fn renew_all(shared: &Shared) {
    for owned in shared.owned.all() {
        // A lease written within half a renew interval (a checkpoint) is fresh already.
        if owned.is_lost() || !owned.is_held().await || owned.written_within(shared.options.renew_interval / 2) {
            continue;
        }
        match owned.renew().await {
            Ok(_) => {}
            Err(UpdateError::Store(error)) => {
                shared.telemetry.error(Some(owned.token()), LeaseError::Renew(error));
            }
            Err(lost) => tracing::info!(lease = owned.token(), reason = %lost, "renew found the lease lost"),
        }
    }
}
