//! The bootstrap lock (`.lock`): one instance bootstraps a lease set at a time. Its holder
//! rewrites it while it works, so that the others tell a live holder from a dead one by how long
//! they see it unchanged on their own clocks; one attempt at a time in this process, whose own
//! leftover lock may be taken again.

use std::time::Duration;

use tokio::time::Instant;

use crate::processor::leases::lease::{LeaseStore, LeaseStoreError, LockAttempt};

/// How often a bootstrapping instance rewrites its lock at most (its renew interval when that is
/// shorter), so that a holder killed mid-bootstrap holds the others back for a few of these, not
/// a lease expiration.
pub(super) const LOCK_RENEWAL: Duration = Duration::from_secs(5);
/// The renewals a lock may miss before it is taken for a dead holder's.
const MISSED_RENEWALS: u32 = 3;

/// The bootstrap lock as this instance saw it: its version and since when, on this instance's
/// monotonic clock — never the holder's wall clock, which may differ from ours by any amount.
#[derive(Debug, Default)]
pub(super) struct LockWatch {
    seen: Option<(String, Instant)>,
}

impl LockWatch {
    /// Records that the lock was at version `etag` at `now`; whether it has been at that version
    /// for `stale_after` (its holder died while bootstrapping).
    fn is_stale(&mut self, etag: &str, now: Instant, stale_after: Duration) -> bool {
        match &self.seen {
            Some((seen, since)) if seen == etag => now.saturating_duration_since(*since) >= stale_after,
            _ => {
                self.seen = Some((etag.to_owned(), now));
                false
            }
        }
    }
}

impl LockWatch {
    /// Takes the lock for `owner`, saying it is rewritten every `renewal`: its version, or `None`
    /// while another instance holds it — whose lock is removed once it has stayed unchanged here
    /// for a few of the renewals its holder promises (a lease expiration, `expiration`, where it
    /// promises none, or slower ones).
    pub(super) async fn take(
        &mut self,
        store: &dyn LeaseStore,
        owner: &str,
        renewal: Duration,
        expiration: Duration,
    ) -> Result<Option<String>, LeaseStoreError> {
        match store.try_lock(owner, renewal).await? {
            LockAttempt::Taken { etag } => Ok(Some(etag)),
            LockAttempt::Held { etag, renewed_every } => {
                if self.is_stale(&etag, Instant::now(), stale_after(renewed_every, expiration)) {
                    tracing::warn!("removing the bootstrap lock of an instance that stopped while bootstrapping");
                    store.break_lock(&etag).await?;
                }
                Ok(None)
            }
            LockAttempt::Free => Ok(None),
        }
    }
}

/// How long a lock whose holder rewrites it every `renewed_every` may stay unchanged before it
/// is taken for a dead holder's: [`MISSED_RENEWALS`] of them, at most a lease expiration.
fn stale_after(renewed_every: Option<Duration>, expiration: Duration) -> Duration {
    renewed_every.map_or(expiration, |every| {
        every.saturating_mul(MISSED_RENEWALS).min(expiration)
    })
}

/// Runs `work` while the bootstrap lock `owner` took at version `etag` is rewritten every
/// `renewal`, so that instances waiting on it see its holder alive; what `work` returned and
/// the lock's last version.
pub(super) async fn holding_lock<T>(
    store: &dyn LeaseStore,
    owner: &str,
    renewal: Duration,
    mut etag: String,
    work: impl Future<Output = T>,
) -> (T, String) {
    tokio::pin!(work);
    let mut renewing = true;
    loop {
        tokio::select! {
            done = &mut work => return (done, etag),
            () = tokio::time::sleep(renewal), if renewing => match store.renew_lock(owner, renewal, &etag).await {
                Ok(Some(renewed)) => etag = renewed,
                Ok(None) => {
                    tracing::warn!("the bootstrap lock was taken over by another instance while this one bootstrapped: the bootstrap is shared");
                    renewing = false;
                }
                // Tried again at the next renewal: a lock missed a few times is broken and the
                // bootstrap shared, which its idempotent creations allow.
                Err(e) => tracing::warn!(error = %e, "could not rewrite the bootstrap lock"),
            },
        }
    }
}

/// The bootstrap attempts live in this process, by lease prefix.
static LIVE_ATTEMPTS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// A bootstrap attempt of this process for one lease prefix, until it ends or is dropped.
pub(super) struct LiveAttempt {
    prefix: String,
}

impl LiveAttempt {
    /// The attempt for `prefix`, once no other one of this process runs. The lock document lets
    /// this process's own leftovers be taken again, which must never be a live attempt's. The
    /// wait is bounded: an attempt holding on for `bound` (a lease expiration) is taken for gone,
    /// as a lock unchanged that long is.
    pub(super) async fn wait(prefix: &str, bound: Duration) -> Option<Self> {
        let waiting = Instant::now();
        loop {
            if let Some(attempt) = Self::claim(prefix) {
                return Some(attempt);
            }
            if waiting.elapsed() >= bound {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(250 + fastrand::u64(0..250))).await;
        }
    }

    /// The attempt for `prefix`; `None` while another one of this process runs.
    fn claim(prefix: &str) -> Option<Self> {
        let mut live = LIVE_ATTEMPTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if live.iter().any(|p| p == prefix) {
            return None;
        }
        live.push(prefix.to_owned());
        Some(Self {
            prefix: prefix.to_owned(),
        })
    }
}

impl Drop for LiveAttempt {
    fn drop(&mut self) {
        let mut live = LIVE_ATTEMPTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        live.retain(|p| *p != self.prefix);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_is_a_dead_holders_after_a_few_of_the_renewals_it_promises_at_most_an_expiration() {
        let expiration = Duration::from_secs(60);
        for (renewed_every, stale, why) in [
            (
                Some(Duration::from_secs(5)),
                Duration::from_secs(15),
                "three renewals missed",
            ),
            (
                Some(Duration::from_millis(500)),
                Duration::from_millis(1_500),
                "quick renewals",
            ),
            (
                Some(Duration::from_secs(30)),
                expiration,
                "renewals slower than that: an expiration",
            ),
            (None, expiration, "a holder that promises none (an earlier version)"),
        ] {
            assert_eq!(stale_after(renewed_every, expiration), stale, "{why}");
        }
    }

    #[test]
    fn a_lock_is_stale_only_after_this_instance_saw_it_unchanged_that_long() {
        let stale_after = Duration::from_secs(30);
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut watch = LockWatch::default();
        // (version seen, seconds on this instance's clock, stale?)
        let steps = [
            ("a", 0, false),
            ("a", 29, false),
            // The holder wrote it again (a new holder): counted afresh.
            ("b", 31, false),
            ("b", 60, false),
            ("b", 61, true),
            ("c", 62, false),
        ];
        for (etag, second, stale) in steps {
            assert_eq!(
                watch.is_stale(etag, at(second), stale_after),
                stale,
                "{etag} at {second} s"
            );
        }
    }
}
