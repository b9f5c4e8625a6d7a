//! The renewer: keeps every owned lease alive, each on its own schedule — written again one renew
//! interval after this instance last wrote it (a checkpoint counts), by a task of its own, so that
//! a throttled, slow or hung write of one lease never delays another lease's renewal.

use std::sync::Arc;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::error::LeaseError;
use super::owned::{OwnedLease, UpdateError};
use super::shared::Shared;

/// Starts a keep-alive for every lease this instance comes to own until `stop`. A lease whose
/// processing is stopping (shutdown, handoff) is still renewed until it is released: only a lost
/// or released one is not.
pub(crate) async fn renew_loop(shared: Arc<Shared>, stop: CancellationToken) {
    // A lease was just written when it was acquired: it is found well before its first renewal.
    let look = (shared.options.renew_interval / 4).max(std::time::Duration::from_millis(10));
    let mut tick = tokio::time::interval(look);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut keep_alives = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
            Some(_) = keep_alives.join_next(), if !keep_alives.is_empty() => continue,
        }
        for owned in shared.owned.all() {
            if owned.claim_renewal() {
                let span = tracing::info_span!("lease", lease = %owned.token());
                keep_alives.spawn(keep_alive(shared.clone(), owned).instrument(span));
            }
        }
    }
}

/// Renews `owned` one renew interval after its last write until it is lost or released; a
/// failed renewal is retried with backoff.
async fn keep_alive(shared: Arc<Shared>, owned: Arc<OwnedLease>) {
    let interval = shared.options.renew_interval;
    let mut failures = 0;
    loop {
        let due = owned.written_at() + interval;
        tokio::select! {
            _ = owned.renewals_ended() => return,
            _ = tokio::time::sleep_until(due) => {}
        }
        if owned.is_lost() || !owned.is_held().await {
            return;
        }
        if owned.written_within(interval) {
            // A checkpoint wrote it meanwhile.
            continue;
        }
        match owned.renew().await {
            Ok(_) => failures = 0,
            Err(UpdateError::Store(error)) => {
                shared.telemetry.error(Some(owned.token()), LeaseError::Renew(error));
                tokio::select! {
                    _ = owned.renewals_ended() => return,
                    _ = tokio::time::sleep(shared.options.backoff(failures)) => {}
                }
                failures += 1;
            }
            Err(lost) => {
                tracing::info!(reason = %lost, "renew found the lease lost");
                return;
            }
        }
    }
}
