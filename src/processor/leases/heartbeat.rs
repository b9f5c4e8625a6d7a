//! How this instance keeps its leases alive: by its heartbeat, one write per instance every
//! renew interval, instead of one write per lease. Instances that write the liveness marker in
//! their heartbeat ([`LeaseLiveness::Instance`]) judge another keeper's lease expired only when
//! neither the lease nor its owner's heartbeat changed for the expiration, so a lease is written
//! only when it is acquired, checkpointed, asked for, handed over or released.
//!
//! An instance that does not write the marker (the previous version during a rolling upgrade, or
//! one running with [`LeaseLiveness::EachLease`]) judges leases by their own writes: while one is
//! live, every instance renews each of its leases as before (the cycle plan says so), so a mixed
//! fleet never takes a live instance's leases.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;
use tokio::time::Instant;

/// How an instance keeps its leases alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LeaseLiveness {
    /// Its heartbeat keeps all its leases alive; a lease is renewed on its own only while an
    /// instance that judges leases one by one is live (the default).
    #[default]
    Instance,
    /// Every lease renewed on its own every renew interval, a heartbeat only while it owns no
    /// lease, no liveness marker: how versions before instance liveness behaved (kept so that a
    /// fleet in the middle of an upgrade can be run and tested).
    EachLease,
}

/// When this instance's heartbeats succeeded.
#[derive(Debug, Default, Clone, Copy)]
struct Beats {
    /// When the last one was sent.
    latest: Option<Instant>,
    /// When the first one after a silence was sent: none had succeeded for so long before it
    /// that other instances may have taken this instance's leases as expired.
    silence_ended: Option<Instant>,
}

/// This instance's liveness state, shared by the renewer, the coordinator and the lease tasks.
#[derive(Debug)]
pub(crate) struct Liveness {
    mode: LeaseLiveness,
    /// Whether every owned lease must be renewed on its own now.
    each_lease: watch::Sender<bool>,
    /// The heartbeats that succeeded, on this instance's monotonic clock.
    beats: Mutex<Beats>,
    /// Set when a graceful stop released every lease: the heartbeat may then be removed (never
    /// after a crash or an abort, when the leases are still this instance's).
    released: AtomicBool,
}

impl Liveness {
    /// The state of an instance that has not listed the leases yet: every lease is renewed on
    /// its own until a listing shows that no instance judges leases one by one.
    pub(crate) fn new(mode: LeaseLiveness) -> Self {
        Self {
            mode,
            each_lease: watch::Sender::new(true),
            beats: Mutex::new(Beats::default()),
            released: AtomicBool::new(false),
        }
    }

    /// Records that a graceful stop released every lease.
    pub(crate) fn all_released(&self) {
        self.released.store(true, Ordering::SeqCst);
    }

    /// Whether a graceful stop released every lease (the heartbeat may go).
    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    /// Whether this instance's heartbeats carry the liveness marker and are written every renew
    /// interval.
    pub(crate) fn beats(&self) -> bool {
        self.mode == LeaseLiveness::Instance
    }

    /// Whether every owned lease must be renewed on its own now.
    pub(crate) fn renews_each_lease(&self) -> bool {
        *self.each_lease.borrow()
    }

    /// Records what the latest listing showed: whether an instance that judges leases one by
    /// one is live. An instance in [`LeaseLiveness::EachLease`] always renews each lease.
    pub(crate) fn set_renew_each_lease(&self, needed: bool) {
        let each = needed || self.mode == LeaseLiveness::EachLease;
        let changed = self.each_lease.send_if_modified(|current| {
            let changed = *current != each;
            *current = each;
            changed
        });
        if changed {
            tracing::debug!(each_lease = each, "leases renewed one by one: {each}");
        }
    }

    /// Waits until every owned lease must be renewed on its own again.
    pub(crate) async fn each_lease_needed(&self) {
        let mut rx = self.each_lease.subscribe();
        // The sender lives as long as `self`: an error cannot happen while we borrow it.
        let _ = rx.wait_for(|each| *each).await;
    }

    /// Records a heartbeat sent at `sent` that succeeded; one at least `silent_after` after the
    /// one before ends a silence (the process was frozen, or the lease container out of reach).
    pub(crate) fn beat(&self, sent: Instant, silent_after: std::time::Duration) {
        let mut beats = self.beats.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if beats
            .latest
            .is_some_and(|latest| sent.saturating_duration_since(latest) >= silent_after)
        {
            beats.silence_ended = Some(sent);
        }
        beats.latest = Some(beats.latest.map_or(sent, |known| known.max(sent)));
    }

    /// Whether a silence ended after `since`: a lease last confirmed before then may have been
    /// taken meanwhile, whatever the newest heartbeat says.
    pub(crate) fn silent_since(&self, since: Instant) -> bool {
        let beats = *self.beats.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        beats.silence_ended.is_some_and(|ended| ended > since)
    }

    /// Whether this instance's heartbeat alone keeps its leases alive and was written within
    /// `window`: then no instance can judge one of its leases expired for at least the
    /// expiration minus `window`.
    pub(crate) fn kept_alive_within(&self, window: std::time::Duration) -> bool {
        if self.renews_each_lease() {
            return false;
        }
        let beats = *self.beats.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        beats.latest.is_some_and(|at| at.elapsed() < window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn leases_are_renewed_one_by_one_until_a_listing_says_otherwise() {
        let liveness = Liveness::new(LeaseLiveness::Instance);
        assert!(liveness.renews_each_lease(), "before the first listing");
        liveness.beat(Instant::now(), Duration::from_secs(30));
        assert!(
            !liveness.kept_alive_within(Duration::from_secs(30)),
            "each lease renewed"
        );
        liveness.set_renew_each_lease(false);
        assert!(!liveness.renews_each_lease());
        assert!(liveness.kept_alive_within(Duration::from_secs(30)));
        liveness.set_renew_each_lease(true);
        tokio::time::timeout(Duration::from_secs(1), liveness.each_lease_needed())
            .await
            .expect("wakes at once while each lease is renewed");
    }

    #[tokio::test]
    async fn the_previous_versions_schedule_always_renews_each_lease() {
        let liveness = Liveness::new(LeaseLiveness::EachLease);
        liveness.set_renew_each_lease(false);
        assert!(liveness.renews_each_lease());
        assert!(!liveness.beats());
    }

    #[test]
    fn an_old_heartbeat_keeps_nothing_alive() {
        let liveness = Liveness::new(LeaseLiveness::Instance);
        liveness.set_renew_each_lease(false);
        assert!(!liveness.kept_alive_within(Duration::from_secs(30)), "never beat");
        liveness.beat(Instant::now() - Duration::from_secs(40), Duration::from_secs(30));
        assert!(!liveness.kept_alive_within(Duration::from_secs(30)));
        assert!(liveness.kept_alive_within(Duration::from_secs(50)));
    }

    #[test]
    fn the_first_heartbeat_after_a_silence_marks_it_ended() {
        let liveness = Liveness::new(LeaseLiveness::Instance);
        let (start, half_expiration) = (Instant::now(), Duration::from_secs(30));
        liveness.beat(start, half_expiration);
        liveness.beat(start + Duration::from_secs(17), half_expiration);
        assert!(
            !liveness.silent_since(start),
            "beats within half an expiration: no silence"
        );
        // Frozen for 40 s; the beat after it succeeds.
        let thawed = start + Duration::from_secs(57);
        liveness.beat(thawed, half_expiration);
        assert!(
            liveness.silent_since(start + Duration::from_secs(20)),
            "confirmed before the silence"
        );
        assert!(!liveness.silent_since(thawed), "confirmed after it");
    }
}
