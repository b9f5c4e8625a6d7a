//! The renewer: keeps this instance and its leases alive. With instance liveness (the default,
//! [`crate::processor::leases::heartbeat`]) it writes the instance's heartbeat every renew
//! interval, which keeps every owned lease alive, and renews a lease on its own only while the
//! cycle plan says that another live instance judges leases one by one. Each such renewal runs in a
//! keep-alive task of the lease's own, one renew interval after this instance last wrote it (a
//! checkpoint counts), so that a throttled, slow or hung write of one lease never delays another's.
//! When the renewer ends gracefully it removes the heartbeat.

use std::sync::Arc;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::processor::error::LeaseError;
use crate::processor::leases::name_claim::NameError;
use crate::processor::leases::owned::{OwnedLease, UpdateError};
use crate::processor::policy::in_step;
use crate::processor::run::shared::Shared;

/// Starts a keep-alive for every lease this instance comes to own, and beats, until `stop`; then
/// removes the heartbeat if a graceful stop released the leases. A lease whose processing is
/// stopping (shutdown, handoff) is still kept alive until it is released: only a lost or released
/// one is not.
pub(crate) async fn renew_loop(shared: Arc<Shared>, stop: CancellationToken) {
    // A lease was just written when it was acquired: it is found well before its first renewal.
    let look = (shared.options.renew_interval / 4).max(std::time::Duration::from_millis(10));
    let mut tick = tokio::time::interval(look);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut keep_alives = JoinSet::new();
    let beating = shared
        .liveness
        .beats()
        .then(|| tokio::spawn(beat(shared.clone(), stop.clone()).in_current_span()));
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
            Some(_) = keep_alives.join_next(), if !keep_alives.is_empty() => continue,
        }
        let throttles = shared.budget.take_throttles();
        if throttles > 0 {
            shared.telemetry.observer().lease_writes_throttled(throttles);
        }
        for owned in shared.owned.all() {
            if owned.claim_renewal() {
                let span = tracing::info_span!("lease", lease = %owned.token());
                keep_alives.spawn(keep_alive(shared.clone(), owned).instrument(span));
            }
        }
    }
    keep_alives.shutdown().await;
    if let Some(beating) = beating {
        // A heartbeat already sent lands whether or not its answer is awaited: removing the
        // heartbeat before that answer could see it written again after the removal (a graceful
        // stop that leaves a fresh heartbeat: its leases wait out an expiration, and `cfp
        // checkpoints` refuses). The heartbeat task ends after its write; a hung one is left.
        let abort = beating.abort_handle();
        if tokio::time::timeout(shared.options.renew_interval, beating)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
    // Only after a graceful stop released the leases: a coordinator that ended otherwise (an
    // abort, as a crash) leaves them, and the heartbeat that keeps them, to expire.
    if shared.liveness.is_released()
        && let Err(error) = shared.name.remove(shared.store.as_ref()).await
    {
        tracing::warn!(%error, "removing the heartbeat failed");
    }
}

/// Writes this instance's heartbeat (with the liveness marker) within a renew interval after the
/// last one succeeded ([`in_step::period`]; the first one sooner, at a random point) (three
/// quarters of it while the lease container throttles); a failed one is retried with backoff (a
/// throttled one after its retry-after, counted as throttling, not reported as an error), never
/// waiting longer than a quarter of the renew interval. Ends at `stop` between writes (a write
/// under way is finished).
async fn beat(shared: Arc<Shared>, stop: CancellationToken) {
    let interval = shared.options.renew_interval;
    let mut failures = 0;
    // The first beat after the start's at a random point of the interval's second half: the
    // instances of a Deployment scaled out start together, and beating in the same second of
    // the lease container's budget window for ever, 50 of them would ask 500 RU at once.
    let mut due = Instant::now() + interval.mul_f64(0.5 + 0.5 * fastrand::f64());
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(due) => {}
        }
        let sent = Instant::now();
        // Checkpoints of this instance wait while it is under way: the budget goes to it first.
        let vital = shared.budget.vital();
        let beaten = shared.name.beat(shared.store.as_ref(), true).await;
        drop(vital);
        match beaten {
            Ok(()) => {
                shared.liveness.beat(sent, shared.options.expiration / 2);
                failures = 0;
                // While the lease container throttles, a quarter of the interval early: a beat
                // that waits on its retry-after still lands within the interval. Drawn a little
                // short of it, so that instances whose beats fell into step come apart.
                let period = if shared.budget.throttled_lately() {
                    interval * 3 / 4
                } else {
                    interval
                };
                due = sent + in_step::period(period, fastrand::f64());
            }
            Err(taken @ NameError::Taken { .. }) => {
                tracing::error!(error = %taken, "stopping: another process took this instance name");
                shared.health.halt_for(taken.to_string());
                return;
            }
            Err(NameError::Store(error)) if error.is_throttled() => {
                // The budget is spent (after the SDK's own retries): throttling, not an error —
                // sent again after the retry-after, and this instance's other writes slow down.
                tracing::debug!(%error, "the heartbeat was throttled; sending it again");
                shared.budget.throttled(error.retry_after());
                let wait = error.retry_after().unwrap_or(shared.options.backoff(failures));
                due = Instant::now() + wait.min(interval / 4);
                failures += 1;
            }
            Err(NameError::Store(error)) => {
                shared.telemetry.error(None, LeaseError::Heartbeat(error));
                due = Instant::now() + shared.options.backoff(failures).min(interval / 4);
                failures += 1;
            }
        }
    }
}

/// Renews `owned` one renew interval after its last write, while each lease must be renewed on
/// its own, until it is lost or released; a failed renewal is retried with backoff (at most a
/// quarter of the renew interval).
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
        if !shared.liveness.renews_each_lease() {
            // The heartbeat keeps it alive until a listing shows an instance that judges leases
            // one by one.
            tokio::select! {
                _ = owned.renewals_ended() => return,
                _ = shared.liveness.each_lease_needed() => continue,
            }
        }
        match owned.renew().await {
            Ok(Some(_)) => failures = 0,
            Ok(None) => return,
            Err(UpdateError::Store(error)) => {
                shared.telemetry.error(Some(owned.token()), LeaseError::Renew(error));
                // Never so long that the lease could expire while it waits.
                let wait = shared.options.backoff(failures).min(interval / 4);
                tokio::select! {
                    _ = owned.renewals_ended() => return,
                    _ = tokio::time::sleep(wait) => {}
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
