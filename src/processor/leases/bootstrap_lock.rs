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
/// The least time a renewed lock stays unchanged before it is taken for a dead holder's.
const LEAST_STALE: Duration = Duration::from_secs(3);
/// How often a bootstrapping instance rewrites its lock at least (its renew interval when that
/// is longer).
pub(super) const LEAST_LOCK_RENEWAL: Duration = Duration::from_millis(100);

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
            LockAttempt::Taken { etag } | LockAttempt::Retaken { etag } => Ok(Some(etag)),
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
/// is taken for a dead holder's: [`MISSED_RENEWALS`] of them, never under [`LEAST_STALE`] (a
/// renewal may take a round trip or two), at most a lease expiration.
fn stale_after(renewed_every: Option<Duration>, expiration: Duration) -> Duration {
    renewed_every.map_or(expiration, |every| {
        every.saturating_mul(MISSED_RENEWALS).max(LEAST_STALE).min(expiration)
    })
}

/// What [`holding_lock`] ended with.
pub(super) struct Held<T> {
    /// What the work returned; `None` when another instance took the lock over and the work
    /// was given up.
    pub(super) done: Option<T>,
    /// The lock's last version this instance wrote.
    pub(super) etag: String,
}

/// Runs `work` while the bootstrap lock `owner` took at version `etag` is rewritten every
/// `renewal` beside it, so that instances waiting on it see its holder alive; the work is given
/// up once a rewrite finds the lock taken over. A rewrite never holds the work up, and one that
/// takes longer than `renewal` (a throttled lease container) is given up for the next.
pub(super) async fn holding_lock<T>(
    store: &dyn LeaseStore,
    owner: &str,
    renewal: Duration,
    etag: String,
    work: impl Future<Output = T>,
) -> Held<T> {
    let latest = std::sync::Mutex::new(etag);
    let current = || latest.lock().map(|e| e.clone()).unwrap_or_default();
    let renewing = async {
        loop {
            tokio::time::sleep(renewal).await;
            match tokio::time::timeout(renewal, renewed(store, owner, renewal, &current())).await {
                Ok(Ok(Some(renewed))) => {
                    if let Ok(mut latest) = latest.lock() {
                        *latest = renewed;
                    }
                }
                Ok(Ok(None)) => {
                    tracing::warn!("the bootstrap lock was taken over by another instance while this one bootstrapped");
                    return;
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "could not rewrite the bootstrap lock"),
                Err(_) => tracing::warn!(?renewal, "rewriting the bootstrap lock took longer than its renewal"),
            }
        }
    };
    tokio::pin!(work, renewing);
    let done = tokio::select! {
        done = &mut work => Some(done),
        // Taken over (this instance was frozen, or its rewrites throttled, for a few renewals):
        // the other instance bootstraps now, perhaps another layout, which the rest of this work
        // would overlap.
        () = &mut renewing => None,
    };
    Held { done, etag: current() }
}

/// The lock rewritten from version `etag`: its new version, or `None` when this instance holds
/// it no longer. A version other than ours may still be ours — a rewrite applied though its
/// answer was lost — so the lock is then taken again when it is this process's; a lock gone
/// was removed by an instance that took this one for dead, and may have bootstrapped since: one
/// taken afresh here is given back.
async fn renewed(
    store: &dyn LeaseStore,
    owner: &str,
    renewal: Duration,
    etag: &str,
) -> Result<Option<String>, LeaseStoreError> {
    if let Some(renewed) = store.renew_lock(owner, renewal, etag).await? {
        return Ok(Some(renewed));
    }
    Ok(match store.try_lock(owner, renewal).await? {
        LockAttempt::Retaken { etag } => Some(etag),
        LockAttempt::Taken { etag } => {
            store.unlock(&etag).await?;
            None
        }
        LockAttempt::Held { .. } | LockAttempt::Free => None,
    })
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
    /// wait is bounded, a safety net (an attempt frees its place when it ends or is dropped):
    /// after `bound` (a lease expiration) the lock document alone decides.
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
    use crate::processor::leases::answering_store::Answering;

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
                LEAST_STALE,
                "quick renewals: the least, 3 s",
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

    #[tokio::test]
    async fn a_lock_renewal_that_never_answers_does_not_hold_the_bootstrap_up() {
        let store = Answering::hanging_renewals();
        let renewal = Duration::from_millis(20);
        let work = async {
            tokio::time::sleep(renewal * 10).await;
            "initialized"
        };
        let held = tokio::time::timeout(renewal * 100, holding_lock(&store, "me", renewal, "v1".into(), work)).await;
        let held = held.expect("the bootstrap was held up by its lock renewal");
        assert_eq!((held.done, held.etag.as_str()), (Some("initialized"), "v1"));
    }

    #[tokio::test]
    async fn the_lock_is_rewritten_while_the_bootstrap_works() {
        let store = Answering::default();
        let renewal = Duration::from_millis(20);
        let work = async {
            tokio::time::sleep(renewal * 5).await;
            "initialized"
        };
        let held = holding_lock(&store, "me", renewal, "v1".into(), work).await;
        assert_eq!(held.done, Some("initialized"));
        let renewals = store.renewals();
        assert!(renewals >= 2, "renewed {renewals} times in 100 ms at 20 ms");
        assert!(
            held.etag.ends_with(&format!("+{renewals}")),
            "the last version written is given back: {}",
            held.etag
        );
    }

    #[tokio::test]
    async fn the_work_is_given_up_once_a_rewrite_finds_the_lock_taken_over_or_gone() {
        // Gone: removed by an instance that took this one for dead, which may have bootstrapped
        // (another layout) and given the lock back since — not taken afresh.
        for (store, given_back, why) in [
            (Answering::taken_over(), 0, "another instance holds it"),
            (Answering::lock_gone(), 1, "it was removed"),
        ] {
            let renewal = Duration::from_millis(20);
            let work = std::future::pending::<&str>();
            let held = tokio::time::timeout(renewal * 50, holding_lock(&store, "me", renewal, "v1".into(), work)).await;
            let held = held.unwrap_or_else(|_| panic!("the work went on: {why}"));
            assert_eq!(held.done, None, "{why}");
            assert_eq!(store.unlocks(), given_back, "a lock taken afresh is given back: {why}");
        }
    }
}
