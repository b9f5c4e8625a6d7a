//! Crashes and handoffs: a crash (an abort writes nothing) is taken over after the expiration,
//! graceful stops and handoffs redeliver nothing, a stale owner writes nothing.

use std::time::{Duration, Instant};

use changefeed_operator::processor::{CloseReason, LeaseEvent};

use super::*;
use crate::common::gate::{GateHandler, Hold, hold_a_batch_of_every_lease};
use crate::common::{Env, eventually, fair, ids, upsert_doc};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_instance_leases_are_taken_over_after_expiry() {
    let env = Env::new(4).await;
    let a = env.start(env.options("a")).await;
    let b = env.start(env.options("b")).await;
    assert!(
        eventually(Duration::from_secs(10), || async { fair(&env.owners().await, 2, 4) }).await,
        "{:?}",
        env.owners().await
    );
    env.write(0..2000).await;
    let of_a: Vec<String> = env
        .leases()
        .await
        .into_iter()
        .filter(|l| l.owner.as_deref() == Some("a"))
        .map(|l| l.id)
        .collect();
    let crashed_at = Instant::now();
    a.abort();
    // An abort leaves a's heartbeat as it was; read now, before b removes it as stale (five
    // expirations, 10 s: a loaded machine can take that long to write the next 2,000 documents).
    let last_beat = env
        .store()
        .await
        .snapshot()
        .await
        .unwrap()
        .instances
        .iter()
        .find(|(name, _)| name == "a")
        .map(|(_, beat)| *beat)
        .expect("a's heartbeat is kept after a crash");
    env.write(2000..4000).await;
    let taken = eventually(Duration::from_secs(15), || async {
        env.owners().await.get("b") == Some(&4)
    })
    .await;
    let after_crash = crashed_at.elapsed();
    assert!(taken, "b did not take a's leases: {:?}", env.owners().await);
    // Timed from a's last beat to b's takes (the timestamps b wrote into the leases): b counts
    // the expiration from when it saw that beat, which is after it was written, so no take comes
    // sooner than an expiration after it.
    let snapshot = env.store().await.snapshot().await.unwrap();
    let takes: Vec<time::Duration> = snapshot
        .leases
        .iter()
        .filter(|l| of_a.contains(&l.id))
        .filter_map(|l| Some(l.timestamp? - last_beat))
        .collect();
    let first_take = takes.iter().min().copied().unwrap_or_default();
    assert!(env.delivered_within(4000, Duration::from_secs(30)).await);
    let missing = env.deliveries.missing(ids(0..4000));
    println!(
        "crash failover: leases taken {first_take} after a's last beat ({after_crash:.1?} after the crash; expiration 2 s, acquire 0.5 s), written 4000, delivered {} distinct, {} duplicates, lost {}",
        env.deliveries.distinct(),
        env.deliveries.duplicates().len(),
        missing.len()
    );
    assert!(missing.is_empty(), "lost {missing:?}");
    assert_eq!(takes.len(), of_a.len(), "{:?}", snapshot.leases);
    // 10 ms for the wall clock against the monotonic one.
    assert!(
        first_take >= time::Duration::milliseconds(1990),
        "taken before expiry: {first_take}"
    );
    // The dead instance's heartbeat is removed after five expirations (10 s here).
    let forgotten = eventually(Duration::from_secs(20), || async {
        let snapshot = env.store().await.snapshot().await.unwrap();
        snapshot.instances.iter().all(|(name, _)| name != "a")
    })
    .await;
    assert!(forgotten, "the crashed instance's heartbeat is still there");
    b.stop().await;
}

/// The lease documents (id, ETag) and whether `instance`'s heartbeat is there.
async fn lease_versions(env: &Env, instance: &str) -> (Vec<(String, String)>, bool) {
    let snapshot = env.store().await.snapshot().await.unwrap();
    let mut versions: Vec<(String, String)> = snapshot.leases.into_iter().map(|l| (l.id, l.etag)).collect();
    versions.sort();
    (versions, snapshot.instances.iter().any(|(name, _)| name == instance))
}

/// An abort is a crash: whatever its tasks were doing (a batch with the handler, idle leases
/// whose tasks are woken), nothing more is written — no checkpoint, no release, no heartbeat
/// removal — so the survivor takes no lease before its expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_writes_nothing_to_the_lease_container() {
    let env = Env::new(8).await;
    let handler = GateHandler::recording(Hold::Nothing, env.recorder("a"));
    let a = env
        .processor(env.options("a"), handler.clone())
        .await
        .start()
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            env.owners().await.get("a") == Some(&8)
        })
        .await,
        "{:?}",
        env.owners().await
    );
    env.write(0..200).await;
    assert!(env.delivered_within(200, Duration::from_secs(20)).await);
    // Settled: every lease checkpointed and reported caught up (no write pending).
    let last = std::cell::RefCell::new(lease_versions(&env, "a").await);
    let settled = eventually(Duration::from_secs(10), || async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = lease_versions(&env, "a").await;
        last.replace(now.clone()) == now
    })
    .await;
    assert!(settled, "the leases kept changing");
    // A batch with the handler when the crash comes.
    handler.hold(Hold::Every);
    env.write(200..201).await;
    assert!(handler.wait_held_count(1).await, "no batch reached the handler");
    let before = lease_versions(&env, "a").await;
    a.abort();
    handler.open();
    let changed = eventually(Duration::from_secs(3), || async {
        lease_versions(&env, "a").await != before
    })
    .await;
    let after = lease_versions(&env, "a").await;
    println!(
        "abort with a batch in flight and 7 idle leases: lease container changed after the abort: {changed}; heartbeat kept: {}",
        after.1
    );
    assert!(!changed, "an abort wrote: before {before:?}, after {after:?}");
}

/// An abort in the middle of work (16 leases, documents written all along) releases nothing:
/// every lease keeps its owner and the heartbeat stays, as after a `kill -9` — also from lease
/// tasks already queued on the runtime's workers when the coordinator is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_under_load_releases_no_lease() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let env = Env::new(16).await;
    let a = env.start_owning_all("a", 16).await;
    let writing = AtomicBool::new(true);
    let writer = async {
        let mut n = 0;
        while writing.load(Ordering::SeqCst) {
            env.write(n..n + 64).await;
            n += 64;
            // The in-process emulator may answer without a pause: let the crash be polled.
            tokio::task::yield_now().await;
        }
    };
    let crash = async {
        assert!(env.delivered_within(1000, Duration::from_secs(30)).await);
        a.abort();
        writing.store(false, Ordering::SeqCst);
    };
    tokio::join!(writer, crash);
    let released = eventually(Duration::from_secs(3), || async {
        let (leases, beating) = (env.leases().await, lease_versions(&env, "a").await.1);
        !beating || leases.iter().any(|l| l.owner.as_deref() != Some("a"))
    })
    .await;
    println!(
        "abort of an instance with 16 leases while documents are written: owners 3 s later {:?}, heartbeat kept {}",
        env.owners().await,
        lease_versions(&env, "a").await.1
    );
    assert!(!released, "an abort released: {:?}", env.owners().await);
}

/// Leases whose owner stops renewing them (a crashed or frozen instance) are taken as they
/// expire: the acquire cycle before their expiry sees them overdue and schedules one more look
/// at that moment, instead of leaving them to the next cycle (the reference: up to one more
/// acquire interval). Expiry is counted from the write as its writer's clock stamp dates it
/// (here this process's), whatever their wall-clock timestamps say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_its_owner_stopped_renewing_is_taken_as_it_expires_not_a_cycle_later() {
    let env = Env::new(4).await;
    let mut options = env.options("b");
    options.acquire_interval = Duration::from_secs(4);
    options.expiration = Duration::from_secs(6);
    let b = env.start(options).await;
    let started = Instant::now();
    assert!(
        eventually(Duration::from_secs(3), || async {
            env.owners().await.get("b") == Some(&4)
        })
        .await,
        "b did not take all leases at once: {:?}",
        env.owners().await
    );
    // An instance takes two leases and dies at once (its timestamp says a second ago; b goes by
    // what it sees change, not by that).
    let store = env.store().await;
    let renewed = time::OffsetDateTime::now_utc() - time::Duration::seconds(1);
    let writing = Instant::now();
    let crashed = |l: &&changefeed_operator::processor::Lease| l.owner.as_deref() == Some("crashed");
    loop {
        let leases = store.snapshot().await.unwrap().leases;
        if leases.iter().filter(crashed).count() == 2 {
            break;
        }
        if let Some(mut lease) = leases.iter().find(|l| !crashed(l)).cloned() {
            lease.owner = Some("crashed".into());
            lease.timestamp = Some(renewed);
            // A conflict with b's renewal: read again and retry.
            let _ = store.replace(&lease).await;
        }
    }
    let written = Instant::now();
    assert!(
        written - started < Duration::from_secs(4),
        "written before b's second cycle"
    );
    // b's cycles: at start; 4 s later it first sees the crashed leases, overdue 6 s after they
    // were written (before 10 s): one more look then; the next regular cycle, which would have
    // taken them without it, is a cycle (4 s) later.
    let expires = writing + Duration::from_secs(6);
    let next_regular_cycle = written + Duration::from_secs(6) + Duration::from_secs(1);
    let owned_all = eventually(Duration::from_secs(15), || async {
        env.owners().await.get("b") == Some(&4)
    })
    .await;
    let taken = Instant::now();
    println!(
        "a stopped owner's leases: taken {:.2} s after b started (written at {:.2} s, expired 6 s later; its regular cycles at 0, 4, 8 and 12 s)",
        started.elapsed().as_secs_f64(),
        (written - started).as_secs_f64()
    );
    assert!(
        owned_all,
        "b did not take the crashed owner's leases: {:?}",
        env.owners().await
    );
    assert!(
        taken + Duration::from_millis(100) >= expires,
        "taken before an expiration after they were written"
    );
    assert!(taken < next_regular_cycle, "taken only by the next regular cycle");
    b.stop().await;
}

/// A handoff request from an instance that is gone (no heartbeat, no lease it renews) is not
/// honoured: the owner keeps the lease and clears the request, rather than handing it to nobody
/// until it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_request_from_an_instance_that_left_is_cleared_and_the_lease_kept() {
    let env = Env::new(2).await;
    let a = env.start_owning_all("a", 2).await;
    let store = env.store().await;
    let target = env.leases().await.remove(0);
    let asked = eventually(Duration::from_secs(5), || async {
        let Ok(Some(mut lease)) = store.read(&target.id).await else {
            return false;
        };
        lease.request_handoff("departed", time::OffsetDateTime::now_utc());
        store.replace(&lease).await.is_ok()
    })
    .await;
    assert!(asked);
    // Several acquire cycles (500 ms) and renewals later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lease = store.read(&target.id).await.unwrap().unwrap();
    let still_a = a.owned_leases().contains(&target.lease_token);
    println!(
        "a handoff request from a departed instance: the lease's owner {:?}, its request {:?}, processed by a: {still_a}",
        lease.owner,
        lease.handoff_request()
    );
    assert_eq!(lease.owner.as_deref(), Some("a"), "not handed to an instance that left");
    assert!(still_a);
    assert!(lease.handoff_request().is_none(), "the stale request is cleared");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_hands_leases_over_within_one_cycle_without_duplicates() {
    let env = Env::new(6).await;
    let a = env.start(env.options("a")).await;
    let b = env.start(env.options("b")).await;
    let c = env.start(env.options("c")).await;
    assert!(
        eventually(Duration::from_secs(10), || async { fair(&env.owners().await, 3, 6) }).await,
        "{:?}",
        env.owners().await
    );
    // Settle: no lease moves while documents flow.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    env.write(0..3000).await;
    assert!(env.delivered_within(3000, Duration::from_secs(30)).await);

    let stopped_at = Instant::now();
    let writes = tokio::spawn({
        let items = env.items.clone();
        async move {
            for n in 3000..6000usize {
                upsert_doc(&items, n).await;
            }
        }
    });
    let mut acquired = [a.subscribe(), b.subscribe()];
    c.stop().await;
    let cycles_at_release = [a.acquire_cycles(), b.acquire_cycles()];
    let handed_over = eventually(Duration::from_secs(5), || async {
        let owners = env.owners().await;
        owners.get("a") == Some(&3) && owners.get("b") == Some(&3)
    })
    .await;
    let handoff = stopped_at.elapsed();
    // The cycle that took each lease, counted from the last cycle started before the release.
    let mut cycles_taken = Vec::new();
    for (rx, at_release) in acquired.iter_mut().zip(cycles_at_release) {
        while let Ok(event) = rx.try_recv() {
            if let LeaseEvent::Acquired { cycle, .. } = event {
                cycles_taken.push(cycle.saturating_sub(at_release));
            }
        }
    }
    writes.await.unwrap();
    assert!(handed_over, "leases not picked up: {:?}", env.owners().await);
    assert!(env.delivered_within(6000, Duration::from_secs(30)).await);
    let missing = env.deliveries.missing(ids(0..6000));
    let duplicates = env.deliveries.duplicates();
    println!(
        "graceful stop: leases picked up {handoff:.2?} after stop, acquire cycles of the survivors since the release {cycles_taken:?}, written 6000, delivered {} distinct, duplicates {}, lost {}",
        env.deliveries.distinct(),
        duplicates.len(),
        missing.len()
    );
    assert_eq!(cycles_taken.len(), 2, "two leases handed over");
    assert!(
        cycles_taken.iter().all(|c| *c <= 1),
        "handoff took {cycles_taken:?} acquire cycles"
    );
    assert!(
        missing.is_empty() && duplicates.is_empty(),
        "missing {missing:?} duplicates {duplicates:?}"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_with_a_stale_etag_writes_nothing_and_reports_the_lease_lost() {
    let env = Env::new(1).await;
    let mut options = env.options("a");
    // Only the checkpoint may notice the new owner: no renewals or acquire cycles meanwhile.
    options.acquire_interval = Duration::from_secs(600);
    options.renew_interval = Duration::from_secs(300);
    options.expiration = Duration::from_secs(600);
    let a = env.start(options).await;
    let mut events = a.subscribe();
    env.write(0..50).await;
    assert!(env.delivered_within(50, Duration::from_secs(10)).await);
    assert!(
        eventually(Duration::from_secs(5), || async {
            env.leases().await[0].continuation.is_some()
        })
        .await
    );

    // Another owner takes the lease behind a's back (as a steal would).
    let store = env.store().await;
    let mut lease = env.leases().await.remove(0);
    lease.owner = Some("intruder".into());
    let taken = store.replace(&lease).await.unwrap();
    env.write(50..60).await;

    let lost = eventually(Duration::from_secs(10), || {
        let mut found = false;
        while let Ok(event) = events.try_recv() {
            found |= matches!(
                event,
                LeaseEvent::Closed {
                    reason: CloseReason::LeaseLost,
                    ..
                }
            );
        }
        async move { found }
    })
    .await;
    assert!(lost, "no lease-lost event");
    let after = env.leases().await.remove(0);
    println!(
        "stale ETag: lease lost reported, owner after {:?}, continuation unchanged {}",
        after.owner,
        after.continuation == taken.continuation
    );
    assert_eq!(after.owner.as_deref(), Some("intruder"));
    assert_eq!(after.etag, taken.etag, "a wrote to a lease it no longer owns");
    assert_eq!(
        after.continuation, taken.continuation,
        "the continuation regressed or moved"
    );
    assert!(a.owned_leases().is_empty());
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_that_ignores_a_handoff_request_loses_the_lease_after_an_expiration() {
    let env = Env::new(2).await;
    let a = env.start_owning_all("a", 2).await;
    a.abort();
    env.store().await.remove_heartbeat("a", None).await.unwrap();
    // An owner of another version: it keeps renewing both leases and never looks at requests.
    let store = env.store().await;
    let renewing = tokio::spawn({
        let store = store.clone();
        async move {
            let mut beat_etag: Option<String> = None;
            loop {
                if let Ok(snapshot) = store.snapshot().await {
                    let own = snapshot
                        .leases
                        .into_iter()
                        .filter(|l| matches!(l.owner.as_deref(), Some("a" | "old-version")));
                    for mut lease in own {
                        lease.owner = Some("old-version".into());
                        lease.timestamp = Some(time::OffsetDateTime::now_utc());
                        let _ = store.replace(&lease).await;
                    }
                }
                let beat = changefeed_operator::processor::Beat {
                    instance: "old-version",
                    incarnation: "old",
                    keeps_leases: false,
                    leaving: false,
                    if_match: beat_etag.as_deref(),
                    pod: None,
                };
                beat_etag = store.heartbeat(&beat).await.ok().or(beat_etag);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let b = env.start(env.options("b")).await;
    let took = eventually(Duration::from_secs(10), || async {
        env.owners().await.get("b") == Some(&1)
    })
    .await;
    let after = started.elapsed();
    renewing.abort();
    println!("an owner ignoring handoff requests: b took its share after {after:.2?} (expiration 2 s, acquire 500 ms)");
    assert!(took, "{:?}", env.owners().await);
    b.stop().await;
}

/// A graceful stop while a batch takes longer than the lease expiration: the stopping instance
/// keeps renewing until its release is written, so the other instance never takes the lease
/// early and nothing is delivered twice — one batch in flight and two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_renews_its_leases_until_a_batch_slower_than_the_expiration_is_done() {
    let mut report = Vec::new();
    for in_flight in [1, 2] {
        let env = Env::new(1).await;
        for n in 0..20 {
            upsert_doc(&env.items, n).await;
        }
        let mut options = env.options(&format!("a{in_flight}"));
        options.max_items = 10;
        options.max_in_flight_batches = in_flight;
        let expiration = options.expiration;
        let handler = GateHandler::recording(Hold::Document("doc-5".into()), env.recorder(&options.instance));
        let a = env.processor(options, handler.clone()).await.start().await.unwrap();
        assert!(handler.wait_held_count(1).await, "the slow batch reached the handler");
        let b = env.start(env.options(&format!("b{in_flight}"))).await;
        let stopping = tokio::spawn(a.stop());
        // The handler holds the batch for 1.5 lease expirations after the stop began.
        tokio::time::sleep(expiration * 3 / 2).await;
        handler.open();
        tokio::time::timeout(Duration::from_secs(20), stopping)
            .await
            .expect("the stop completes")
            .unwrap();
        for n in 20..30 {
            upsert_doc(&env.items, n).await;
        }
        let all = env.delivered_within(30, Duration::from_secs(20)).await;
        let duplicates = env.deliveries.duplicates();
        report.push(format!(
            "{in_flight} in flight: all 30 delivered {all}, duplicates {}",
            duplicates.len()
        ));
        b.stop().await;
        assert!(all, "missing {:?}", env.deliveries.missing(ids(0..30)));
        assert!(
            duplicates.is_empty(),
            "{in_flight} in flight: delivered twice {duplicates:?}"
        );
    }
    println!("graceful stop with a batch 1.5 expirations long: {}", report.join("; "));
}

/// Rebalancing while every batch takes four renew intervals (under the lease expiration):
/// the owner hands a lease over after its batch instead of losing it to the requester, so a
/// newcomer delivers nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_waits_for_a_batch_slower_than_the_renew_interval() {
    let env = Env::new(2).await;
    let mut options = env.options("a");
    options.max_items = 5;
    // Longer than the renew interval and an acquire interval together, shorter than the expiration.
    let slow = options.renew_interval * 4;
    let a = env
        .processor(options, SlowHandler::of(&env, "a", slow))
        .await
        .start()
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            env.owners().await.get("a") == Some(&2)
        })
        .await
    );
    env.write(0..60).await;
    // Batches are in flight on both leases when the newcomer asks for one.
    tokio::time::sleep(slow).await;
    let mut options = env.options("b");
    options.max_items = 5;
    let b = env
        .processor(options, SlowHandler::of(&env, "b", slow))
        .await
        .start()
        .await
        .unwrap();
    let moved = eventually(Duration::from_secs(10), || async { fair(&env.owners().await, 2, 2) }).await;
    let all = env.delivered_within(60, Duration::from_secs(60)).await;
    let duplicates = env.deliveries.duplicates();
    println!(
        "handoff with batches of {slow:?} (renew interval {:?}): a lease moved {moved}, all 60 delivered {all}, duplicates {}",
        slow / 4,
        duplicates.len()
    );
    a.stop().await;
    b.stop().await;
    assert!(moved && all);
    assert!(duplicates.is_empty(), "delivered twice: {duplicates:?}");
}

/// Scale-out while every batch takes longer than the lease expiration (issue 59): the owner
/// accepts the newcomer's handoff request and keeps the lease until its batch in flight is
/// checkpointed — it acknowledges the request, and keeps acknowledging while it drains — so the
/// newcomer waits instead of taking the lease after its patience, and nothing is delivered twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_out_during_batches_slower_than_the_expiration_delivers_nothing_twice() {
    let env = Env::new(4).await;
    env.ensure_leases().await;
    let handler = GateHandler::recording(Hold::Nothing, env.recorder("a"));
    let options = env.options("a");
    let expiration = options.expiration;
    let a = env.processor(options, handler.clone()).await.start().await.unwrap();
    hold_a_batch_of_every_lease(&env, &handler, ("a", 4), 0..40).await;

    let b = env.start(env.options("b")).await;
    // Every held batch outlasts the expiration several times over while the newcomer asks.
    tokio::time::sleep(expiration * 3).await;
    let owners_while_held = env.owners().await;
    handler.open();
    let moved = eventually(Duration::from_secs(20), || async { fair(&env.owners().await, 2, 4) }).await;
    env.write(40..60).await;
    let all = env.delivered_within(60, Duration::from_secs(20)).await;
    let duplicates = env.deliveries.duplicates();
    println!(
        "scale-out with batches held {:?} (expiration {expiration:?}): owners while held {owners_while_held:?}, moved {moved}, all 60 delivered {all}, duplicates {}",
        expiration * 3,
        duplicates.len()
    );
    a.stop().await;
    b.stop().await;
    assert!(all, "missing {:?}", env.deliveries.missing(ids(0..60)));
    assert_eq!(
        owners_while_held.get("a"),
        Some(&4),
        "a lease was taken from a live owner draining its batch: {owners_while_held:?}"
    );
    assert!(
        moved,
        "the leases did not move once the batches ended: {:?}",
        env.owners().await
    );
    assert!(duplicates.is_empty(), "delivered twice: {duplicates:?}");
}

/// A newcomer that starts soon after a crash (autoscaling adds a replica as the lag grows) holds
/// back no takeover (issue 59): the survivor deals the crashed instance's leases to itself —
/// the newcomer cannot see them as expired yet, and would ask their dead owner — and the
/// newcomer's request is no sign of that owner's life. The leases run again within one
/// expiration and a listing of the crash; the newcomer gets its share by handoff afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_during_a_crash_holds_back_no_takeover() {
    let env = Env::new(4).await;
    let options = env.options("a");
    let (expiration, acquire) = (options.expiration, options.acquire_interval);
    let a = env.start(options).await;
    let b = env.start(env.options("b")).await;
    let fair_two = eventually(Duration::from_secs(10), || async { fair(&env.owners().await, 2, 4) }).await;
    assert!(fair_two, "{:?}", env.owners().await);
    // Long enough that b has watched everything for an expiration.
    tokio::time::sleep(expiration).await;
    let crashed_at = Instant::now();
    a.abort();
    // The newcomer comes as the crashed instance's leases are about to expire for the survivor.
    tokio::time::sleep(expiration * 3 / 4).await;
    let c = env.start(env.options("c")).await;
    let run_again = eventually(Duration::from_secs(15), || async {
        !env.owners().await.contains_key("a")
    })
    .await;
    let taken_after = crashed_at.elapsed();
    let shared = eventually(Duration::from_secs(15), || async { fair(&env.owners().await, 2, 4) }).await;
    env.write(0..40).await;
    let all = env.delivered_within(40, Duration::from_secs(20)).await;
    println!(
        "a crash, then a newcomer 3/4 of an expiration later: a's leases taken {taken_after:?} after the crash (expiration {expiration:?}, acquire interval {acquire:?}); shared {shared}"
    );
    b.stop().await;
    c.stop().await;
    assert!(run_again && all, "{:?}", env.owners().await);
    // One expiration and a listing, with room for a loaded machine's listing latency.
    let bound = expiration + acquire * 2;
    assert!(
        taken_after <= bound,
        "the crashed instance's leases were taken {taken_after:?} after the crash (bound {bound:?})"
    );
    assert!(shared, "the newcomer never got its share: {:?}", env.owners().await);
}

/// What the operator frees when a worker container ended and waits to start again: only what
/// the ended process held. When the container has been run again meanwhile (the pod's status
/// lags), the new process — same name, same pod — has taken its leases back under its own
/// epochs and heartbeat, and nothing of it is touched; once that one ends too, its leases are
/// freed. (Freeing every lease of the name, as for a deleted pod, freed the new process's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freeing_an_ended_process_leaves_its_successor_in_the_pod_alone() {
    use changefeed_operator::processor::evict_ended_process;
    let env = Env::new(4).await;
    let mut options = env.options("w");
    options.pod_uid = Some("uid-of-pod-w".into());
    let first = env.start_owning_all_with(options.clone(), 4).await;
    let store = env.store().await;
    let incarnation = |leases: &[changefeed_operator::processor::Lease]| -> std::collections::BTreeSet<String> {
        leases
            .iter()
            .filter_map(|l| Some(l.owner_epoch.as_deref()?.split('.').next()?.to_owned()))
            .collect()
    };
    let before = incarnation(&store.snapshot().await.unwrap().leases);
    first.abort();
    let ended = time::OffsetDateTime::now_utc();
    let second = env.start(options.clone()).await;
    // The successor takes all four back at once, under epochs of its own.
    assert!(
        eventually(Duration::from_secs(10), || async {
            let leases = store.snapshot().await.unwrap().leases;
            let now = incarnation(&leases);
            now.len() == 1 && now != before && leases.iter().all(|l| l.owner.as_deref() == Some("w"))
        })
        .await,
        "the successor retook the leases"
    );
    let spared = evict_ended_process(store.as_ref(), "w", ended).await.unwrap();
    let owned_after = env.owners().await;
    second.abort();
    let ended_too = time::OffsetDateTime::now_utc() + time::Duration::SECOND;
    let freed = evict_ended_process(store.as_ref(), "w", ended_too).await.unwrap();
    println!(
        "a process ended, its successor in the pod retook the leases: freeing the ended one's freed {spared:?}, owners after {owned_after:?}; the successor ended too: freed {} leases",
        freed.len()
    );
    assert!(spared.is_empty(), "the successor's leases were freed: {spared:?}");
    assert_eq!(owned_after.get("w"), Some(&4));
    assert_eq!(freed.len(), 4, "the ended successor's leases are freed");
    assert!(
        store.read_heartbeat("w").await.unwrap().is_none(),
        "its heartbeat removed"
    );
}
