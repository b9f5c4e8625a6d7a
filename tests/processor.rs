//! The change feed processor against the SDK's in-memory emulator: balancing, failover,
//! graceful handoff, splits, lost leases and restarts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use changefeed_operator::processor::{Batch, ChangeHandler, CloseReason, HandlerError, Lease, LeaseEvent, LeaseStore};

use crate::common::{self, Env, eventually, fair, ids, upsert_doc};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_share_eight_partitions_and_lose_nothing() {
    let env = Env::new(8).await;
    let mut handles = Vec::new();
    for name in ["a", "b", "c", "d"] {
        handles.push(env.start(env.options(name)).await);
    }
    let total = 20_000;
    let writer = async {
        for chunk in 0..20 {
            env.write(chunk * 1000..(chunk + 1) * 1000).await;
        }
    };
    writer.await;
    let delivered = eventually(Duration::from_secs(120), || async {
        env.deliveries.distinct() >= total
    })
    .await;
    let missing = env.deliveries.missing(ids(0..total));
    assert!(
        delivered && missing.is_empty(),
        "{} documents never delivered, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    let balanced = eventually(Duration::from_secs(10), || async { fair(&env.owners().await, 4, 8) }).await;
    let owners = env.owners().await;
    println!(
        "4 instances / 8 partitions: written {total}, delivered {} distinct ({} deliveries, {} duplicates), lost 0, leases per instance {owners:?}",
        env.deliveries.distinct(),
        env.deliveries.total(),
        env.deliveries.duplicates().len()
    );
    assert!(balanced, "not at fair share: {owners:?}");
    for handle in handles {
        handle.stop().await;
    }
}

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
    env.write(2000..4000).await;
    let taken = eventually(Duration::from_secs(15), || async {
        env.owners().await.get("b") == Some(&4)
    })
    .await;
    let after_crash = crashed_at.elapsed();
    assert!(taken, "b did not take a's leases: {:?}", env.owners().await);
    // Timed from a's last beat (the heartbeat an abort leaves as it was) to b's takes (the
    // timestamps b wrote into the leases): b counts the expiration from when it saw that beat,
    // which is after it was written, so no take comes sooner than an expiration after it.
    let snapshot = env.store().await.snapshot().await.unwrap();
    let last_beat = snapshot
        .instances
        .iter()
        .find(|(name, _)| name == "a")
        .map(|(_, beat)| *beat)
        .expect("a's heartbeat is kept after a crash");
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

/// Holds every batch while `hold` is set, until `release` is closed; counts the batches held.
struct HeldHandler {
    hold: std::sync::atomic::AtomicBool,
    held: std::sync::atomic::AtomicUsize,
    release: tokio::sync::Semaphore,
    recorder: Arc<common::RecordingHandler>,
}

#[async_trait::async_trait]
impl ChangeHandler for HeldHandler {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        use std::sync::atomic::Ordering;
        if self.hold.load(Ordering::SeqCst) {
            self.held.fetch_add(1, Ordering::SeqCst);
            // Closed: let go.
            let _ = self.release.acquire().await;
        }
        self.recorder.handle(batch).await
    }
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
/// removal. (It used to cancel the lease tasks, and those that ran before the coordinator was
/// dropped took the graceful path: the survivor then took released leases before their expiry.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_writes_nothing_to_the_lease_container() {
    use std::sync::atomic::Ordering;
    let env = Env::new(8).await;
    let handler = Arc::new(HeldHandler {
        hold: false.into(),
        held: 0.into(),
        release: tokio::sync::Semaphore::new(0),
        recorder: env.recorder("a"),
    });
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
    handler.hold.store(true, Ordering::SeqCst);
    env.write(200..201).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            handler.held.load(Ordering::SeqCst) > 0
        })
        .await,
        "no batch reached the handler"
    );
    let before = lease_versions(&env, "a").await;
    a.abort();
    handler.release.close();
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
/// every lease keeps its owner and the heartbeat stays, as after a `kill -9`. (The lease tasks
/// already queued on the runtime's workers used to take the graceful path — drain, checkpoint,
/// release — before the coordinator that holds them was dropped: the CI failures "taken before
/// expiry: 1.54 s".)
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
/// acquire interval). Expiry is counted from when this instance first saw them unchanged (its
/// own clock), whatever their timestamps say.
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
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "written before b's second cycle"
    );
    // b's cycles: at start; 4 s later it first sees the crashed leases; at 8 s they are overdue,
    // expiring 6 s after it first saw them (10 s): one more look then; the next regular cycle,
    // which would have taken them without it, is at 12 s.
    let first_seen = started + Duration::from_secs(4);
    let expires = first_seen + Duration::from_secs(6);
    let next_regular_cycle = started + Duration::from_secs(12);
    let owned_all = eventually(Duration::from_secs(15), || async {
        env.owners().await.get("b") == Some(&4)
    })
    .await;
    let taken = Instant::now();
    println!(
        "a stopped owner's leases: taken {:.2} s after b started (first seen at 4 s, expired at 10 s; its regular cycles at 0, 4, 8 and 12 s)",
        started.elapsed().as_secs_f64()
    );
    assert!(
        owned_all,
        "b did not take the crashed owner's leases: {:?}",
        env.owners().await
    );
    assert!(
        taken + Duration::from_millis(100) >= expires,
        "taken before they had been seen unrenewed for the expiration"
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
async fn scaling_one_to_four_reaches_fair_share_within_two_cycles() {
    let env = Env::new(32).await;
    let a = env.start_owning_all("a", 32).await;
    // Scaling a Deployment from 1 to 4 starts three pods at once.
    let mut processors = Vec::new();
    for name in ["b", "c", "d"] {
        let handler = Arc::new(common::RecordingHandler {
            instance: name.into(),
            deliveries: env.deliveries.clone(),
        });
        processors.push(env.processor(env.options(name), handler).await);
    }
    let mut events: Vec<_> = processors.iter().map(|p| p.subscribe()).collect();
    let new: Vec<_> = futures::future::join_all(processors.into_iter().map(|p| p.start()))
        .await
        .into_iter()
        .map(|started| started.expect("start"))
        .collect();
    let reached = eventually(Duration::from_secs(10), || async { fair(&env.owners().await, 4, 32) }).await;
    assert!(reached, "no fair share: {:?}", env.owners().await);
    // Let one more cycle pass: nothing may move after the fair share was reached.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut moves = 0;
    let mut cycles = 0;
    for rx in &mut events {
        while let Ok(event) = rx.try_recv() {
            if let LeaseEvent::Acquired {
                previous_owner, cycle, ..
            } = event
            {
                moves += usize::from(previous_owner.is_some());
                cycles = cycles.max(cycle);
            }
        }
    }
    println!(
        "scale 1 -> 4 over 32 leases: fair share after {cycles} acquire cycles of the new instances, {moves} lease moves (minimum 24), final {:?}",
        env.owners().await
    );
    assert!(cycles <= 2, "took {cycles} cycles");
    assert!(moves <= 26, "moves {moves} > minimum 24 + 10 %");
    assert!(fair(&env.owners().await, 4, 32));
    a.stop().await;
    for handle in new {
        handle.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_alone_with_every_lease_lists_less_often_yet_newcomers_get_their_share_within_two_cycles() {
    let env = Env::new(32).await;
    // The default timings scaled down 10 times: acquire 13 s, renew 17 s, expiration 60 s.
    let scaled = |name: &str| {
        let mut options = env.options(name);
        options.acquire_interval = Duration::from_millis(1300);
        options.renew_interval = Duration::from_millis(1700);
        options.expiration = Duration::from_secs(6);
        options
    };
    let a = env.start_owning_all_with(scaled("a"), 32).await;
    // Alone and owning everything: the waits grow from the acquire interval (1.3 s) to the renew
    // interval (1.7 s), within which a newcomer's request must be met by a listing (idle leases
    // are not renewed, so no write of a's meets it sooner); listing every acquire interval
    // would make 9 listings in 12 s, at the renew interval at most 8.
    let before = a.acquire_cycles();
    tokio::time::sleep(Duration::from_secs(12)).await;
    let quiet = a.acquire_cycles() - before;
    println!("alone with 32 leases: {quiet} listings in 12 s (9 at the acquire interval)");
    assert!(quiet <= 8, "{quiet} listings in 12 s: no idle back-off");
    // Three pods start: they ask a for their shares, which a's next listing meets.
    let mut processors = Vec::new();
    for name in ["b", "c", "d"] {
        let handler = Arc::new(common::RecordingHandler {
            instance: name.into(),
            deliveries: env.deliveries.clone(),
        });
        processors.push(env.processor(scaled(name), handler).await);
    }
    let mut events: Vec<_> = processors.iter().map(|p| p.subscribe()).collect();
    let started = Instant::now();
    let new: Vec<_> = futures::future::join_all(processors.into_iter().map(|p| p.start()))
        .await
        .into_iter()
        .map(|started| started.expect("start"))
        .collect();
    let reached = eventually(Duration::from_secs(20), || async { fair(&env.owners().await, 4, 32) }).await;
    assert!(reached, "no fair share: {:?}", env.owners().await);
    let mut cycles = 0;
    for rx in &mut events {
        while let Ok(event) = rx.try_recv() {
            if let LeaseEvent::Acquired { cycle, .. } = event {
                cycles = cycles.max(cycle);
            }
        }
    }
    println!(
        "1 -> 4 from idle: fair share {:.2} s after the new instances started, in {cycles} of their acquire cycles",
        started.elapsed().as_secs_f64()
    );
    assert!(cycles <= 2, "took {cycles} cycles");
    // No longer alone: a lists every acquire interval again (a crashed peer's leases are taken
    // as they expire).
    let before = a.acquire_cycles();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let listings = a.acquire_cycles() - before;
    assert!(
        listings >= 2,
        "{listings} listings in 4 s beside three instances: still backed off"
    );
    a.stop().await;
    for handle in new {
        handle.stop().await;
    }
}

/// Writes `docs` one by one while the first partition splits; the partitions after the split.
async fn split_while_writing(
    env: &Env,
    docs: std::ops::Range<usize>,
) -> Vec<changefeed_operator::emulator::PhysicalPartition> {
    let writes = tokio::spawn({
        let items = env.items.clone();
        async move {
            for n in docs {
                upsert_doc(&items, n).await;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let partitions = env
        .emulator
        .split(common::DB, common::ITEMS, None, Duration::from_millis(200))
        .await
        .unwrap();
    writes.await.unwrap();
    partitions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_while_writing_replaces_the_parent_lease_and_loses_nothing() {
    let env = Env::new(2).await;
    let a = env.start(env.options("a")).await;
    let b = env.start(env.options("b")).await;
    let mut events = a.subscribe();
    let mut events_b = b.subscribe();
    // One lease each before documents flow, so that only the split can move work around.
    assert!(eventually(Duration::from_secs(10), || async { fair(&env.owners().await, 2, 2) }).await);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    env.write(0..1000).await;
    let partitions = split_while_writing(&env, 1000..4000).await;
    assert_eq!(partitions.len(), 3);
    let replaced = eventually(Duration::from_secs(20), || async {
        let leases = env.leases().await;
        let mut ranges: Vec<_> = leases.iter().filter_map(|l| l.range().cloned()).collect();
        ranges.sort();
        let mut want: Vec<_> = partitions.iter().map(|p| p.range.clone()).collect();
        want.sort();
        ranges == want
    })
    .await;
    assert!(
        replaced,
        "leases {:?} do not match partitions {partitions:?}",
        env.leases()
            .await
            .iter()
            .map(|l| l.lease_token.clone())
            .collect::<Vec<_>>()
    );
    assert!(env.delivered_within(4000, Duration::from_secs(30)).await);
    let missing = env.deliveries.missing(ids(0..4000));
    let mut splits = 0;
    for rx in [&mut events, &mut events_b] {
        while let Ok(event) = rx.try_recv() {
            if matches!(event, LeaseEvent::Split { .. }) {
                splits += 1;
            }
        }
    }
    println!(
        "split while writing: {} leases after the split, {splits} split event(s), written 4000, delivered {} distinct, {} duplicates, lost {}",
        env.leases().await.len(),
        env.deliveries.distinct(),
        env.deliveries.duplicates().len(),
        missing.len()
    );
    assert_eq!(splits, 1);
    let duplicates = env.deliveries.duplicates().len();
    assert!(
        duplicates <= 100,
        "a split replays at most the batch in flight, not {duplicates}"
    );
    assert!(missing.is_empty(), "lost {missing:?}");
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
async fn a_restart_resumes_from_the_checkpoints() {
    let env = Env::new(4).await;
    let a = env.start(env.options("a")).await;
    env.write(0..1000).await;
    assert!(env.delivered_within(1000, Duration::from_secs(20)).await);
    a.stop().await;
    env.deliveries.clear();
    env.write(1000..1500).await;
    let again = env.start(env.options("a2")).await;
    assert!(env.delivered_within(500, Duration::from_secs(20)).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let replayed: Vec<String> = env
        .deliveries
        .ids()
        .into_iter()
        .filter(|id| ids(0..1000).contains(id))
        .collect();
    let missing = env.deliveries.missing(ids(1000..1500));
    println!(
        "restart: after the restart delivered {} distinct, of them {} written before the stop, lost {}",
        env.deliveries.distinct(),
        replayed.len(),
        missing.len()
    );
    assert!(missing.is_empty());
    assert!(replayed.is_empty(), "replayed {replayed:?}");
    again.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_from_now_is_anchored_when_the_leases_are_created() {
    let env = Env::new(4).await;
    env.write(0..300).await;
    let mut options = env.options("a");
    options.start_from = changefeed_operator::cosmos::StartFrom::Now;
    // Slow first acquire: documents written right after start must not be skipped even though no
    // lease is read yet.
    options.acquire_interval = Duration::from_secs(2);
    let a = env.start(options).await;
    env.write(300..600).await;
    assert!(env.delivered_within(300, Duration::from_secs(20)).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let old: Vec<String> = env
        .deliveries
        .ids()
        .into_iter()
        .filter(|id| ids(0..300).contains(id))
        .collect();
    let missing = env.deliveries.missing(ids(300..600));
    println!(
        "start from now: 300 written before the first start, 300 right after; delivered {} ({} old, {} of the new missing)",
        env.deliveries.distinct(),
        old.len(),
        missing.len()
    );
    assert!(
        old.is_empty(),
        "documents from before the start were delivered: {old:?}"
    );
    assert!(
        missing.is_empty(),
        "documents written after the start were skipped: {missing:?}"
    );
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_parent_left_behind_by_a_crash_is_deleted_and_nothing_is_lost() {
    let env = Env::new(2).await;
    let a = env.start(env.options("a")).await;
    env.write(0..500).await;
    assert!(env.delivered_within(500, Duration::from_secs(20)).await);
    a.stop().await;
    // A crash between creating the children and deleting the parent leaves both.
    let store = env.store().await;
    let parent = env.leases().await.remove(0);
    let range = parent.range().unwrap().clone();
    let middle = changefeed_operator::cosmos::EpkRange::new("08", "08").min;
    for child in [
        changefeed_operator::cosmos::EpkRange::new(range.min.clone(), middle.clone()),
        changefeed_operator::cosmos::EpkRange::new(middle.clone(), range.max.clone()),
    ] {
        let lease = changefeed_operator::processor::Lease::new(store.prefix(), &child, parent.continuation.clone());
        store.create(&lease).await.unwrap();
    }
    env.deliveries.clear();
    env.write(500..1500).await;
    let b = env.start(env.options("b")).await;
    let cleaned = eventually(Duration::from_secs(10), || async {
        env.leases().await.iter().all(|l| l.id != parent.id)
    })
    .await;
    assert!(env.delivered_within(1000, Duration::from_secs(20)).await);
    let missing = env.deliveries.missing(ids(500..1500));
    println!(
        "split parent left by a crash: deleted {cleaned}, leases now {}, written 1000, delivered {} distinct, {} duplicates, lost {}",
        env.leases().await.len(),
        env.deliveries.distinct(),
        env.deliveries.duplicates().len(),
        missing.len()
    );
    assert!(cleaned, "the superseded parent is still there");
    assert!(missing.is_empty());
    assert!(
        env.deliveries.duplicates().is_empty(),
        "the parent and its children were both processed"
    );
    b.stop().await;
}

/// Fails (or panics in) the first batches that hold `doc-<poison>`, then records like the others.
struct Unreliable {
    inner: common::RecordingHandler,
    poison: String,
    failures_left: std::sync::atomic::AtomicU32,
    panic: bool,
}

#[async_trait::async_trait]
impl changefeed_operator::processor::ChangeHandler for Unreliable {
    async fn handle(
        &self,
        batch: changefeed_operator::processor::Batch<'_>,
    ) -> Result<(), changefeed_operator::processor::HandlerError> {
        use std::sync::atomic::Ordering;
        let poisoned = batch.documents.iter().any(|d| d["id"] == self.poison.as_str());
        if poisoned
            && self
                .failures_left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            if self.panic {
                panic!("handler bug on {}", self.poison);
            }
            return Err(changefeed_operator::processor::HandlerError::new(
                "downstream unavailable",
            ));
        }
        self.inner.handle(batch).await
    }
}

async fn unreliable_run(panic: bool) -> (usize, usize, Vec<CloseReason>) {
    let env = Env::new(2).await;
    let mut options = env.options("a");
    options.retry.initial_backoff = Duration::from_millis(20);
    options.retry.max_backoff = Duration::from_millis(100);
    let handler = Arc::new(Unreliable {
        inner: common::RecordingHandler {
            instance: "a".into(),
            deliveries: env.deliveries.clone(),
        },
        poison: "doc-50".into(),
        failures_left: std::sync::atomic::AtomicU32::new(3),
        panic,
    });
    let processor = env.processor(options, handler).await;
    let mut events = processor.subscribe();
    let handle = processor.start().await.unwrap();
    env.write(0..200).await;
    let all = eventually(Duration::from_secs(30), || async { env.deliveries.distinct() == 200 }).await;
    let mut closed = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let LeaseEvent::Closed { reason, .. } = event {
            closed.push(reason);
        }
    }
    let owned = handle.owned_leases().len();
    handle.stop().await;
    assert!(all, "only {} of 200 delivered", env.deliveries.distinct());
    (env.deliveries.distinct(), owned, closed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_error_is_retried_and_nothing_is_lost() {
    let (delivered, owned, closed) = unreliable_run(false).await;
    println!(
        "handler failing 3 times on doc-50: {delivered} of 200 delivered, leases owned {owned}, leases closed {closed:?}"
    );
    assert!(closed.is_empty(), "errors are retried in place: {closed:?}");
    assert_eq!(owned, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_releases_its_lease_which_is_processed_again() {
    let (delivered, owned, closed) = unreliable_run(true).await;
    println!(
        "handler panicking 3 times on doc-50: {delivered} of 200 delivered, leases owned {owned} at the end, leases closed {closed:?}"
    );
    assert!(closed.contains(&CloseReason::Panicked), "{closed:?}");
    assert_eq!(owned, 2, "the released lease was taken again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_lease_document_is_skipped_and_counted_not_fatal() {
    let env = Env::new(2).await;
    // Garbage under the processor's lease prefix before it ever starts (a hand edit, another
    // tool's document...): bootstrap, balancing and processing must all go on.
    env.ensure_leases().await;
    let store = env.store().await;
    let garbage = serde_json::json!({"id": format!("{}..garbage", store.prefix()), "LeaseToken": 42, "Owner": ["x"]});
    let leases = env.account.documents(common::DB, common::LEASES).await.unwrap();
    leases.create(garbage["id"].as_str().unwrap(), &garbage).await.unwrap();
    let a = env.start(env.options("a")).await;
    assert!(eventually(Duration::from_secs(10), || async { a.owned_leases().len() == 2 }).await);
    env.write(0..300).await;
    let all = eventually(Duration::from_secs(20), || async { env.deliveries.distinct() == 300 }).await;
    let snapshot = store.snapshot().await;
    println!(
        "a malformed lease document: {} of 300 delivered; snapshot {}; invalid documents reported: {:?}",
        env.deliveries.distinct(),
        if snapshot.is_ok() { "ok" } else { "failed" },
        snapshot.as_ref().map(|s| s.invalid.clone()).unwrap_or_default()
    );
    assert!(all);
    let snapshot = snapshot.unwrap();
    assert_eq!(snapshot.leases.len(), 2);
    assert_eq!(snapshot.invalid.len(), 1);
    a.stop().await;
}

/// Creates the leases of `env` (an instance that starts and stops), then gives one of them a
/// continuation the service refuses; the store and that lease.
async fn with_a_refused_continuation(env: &Env) -> (Arc<dyn LeaseStore>, Lease) {
    let first = env.start(env.options("first")).await;
    assert!(eventually(Duration::from_secs(10), || async { first.owned_leases().len() == 2 }).await);
    first.stop().await;
    let store = env.store().await;
    let mut broken = env.leases().await.remove(0);
    broken.continuation = Some("{\"kind\":\"not_a_cursor\"}".into());
    store.replace(&broken).await.unwrap();
    (store, broken)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_reads_keep_failing_is_reported_and_the_others_flow() {
    let env = Env::new(2).await;
    let (_, broken) = with_a_refused_continuation(&env).await;
    let a = env.start(env.options("a")).await;
    env.write(0..200).await;
    let monitor = a.monitor();
    let reported = eventually(Duration::from_secs(20), || async { monitor.read_problem().is_some() }).await;
    let flowing = eventually(Duration::from_secs(20), || async { env.deliveries.distinct() > 0 }).await;
    let problem = monitor.read_problem();
    println!(
        "a lease with a refused continuation: readiness problem {problem:?}; the other lease delivered {} documents; the broken lease still owned: {}",
        env.deliveries.distinct(),
        a.owned_leases().contains(&broken.lease_token)
    );
    assert!(reported && flowing);
    assert!(problem.unwrap_or_default().contains(&broken.lease_token));
    assert!(
        a.owned_leases().contains(&broken.lease_token),
        "nothing is skipped: the lease stays and retries"
    );
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_lease_taken_by_another_instance_is_no_longer_reported_here() {
    let env = Env::new(2).await;
    let (store, broken) = with_a_refused_continuation(&env).await;
    let a = env.start(env.options("a")).await;
    let reported = eventually(Duration::from_secs(20), || async {
        a.monitor()
            .read_problem()
            .is_some_and(|p| p.contains(&broken.lease_token))
    })
    .await;
    assert!(reported, "the failing lease is reported first");
    // Another instance takes the failing lease (an operator moving it, a handoff): `a` stops
    // processing it, and its /readyz no longer names it.
    let b = env.start(env.options("b")).await;
    let taken = eventually(Duration::from_secs(10), || async {
        let Ok(Some(mut lease)) = store.read(&broken.id).await else {
            return false;
        };
        lease.owner = Some("b".into());
        lease.timestamp = Some(time::OffsetDateTime::now_utc());
        lease.clear_handoff();
        store.replace(&lease).await.is_ok()
    })
    .await;
    let gone_here = eventually(Duration::from_secs(10), || async {
        !a.owned_leases().contains(&broken.lease_token)
    })
    .await;
    let cleared = eventually(Duration::from_secs(10), || async {
        a.monitor().read_problem().is_none()
    })
    .await;
    println!(
        "a failing lease taken by b: taken {taken}, no longer processed by a {gone_here}, a's readiness problem then {:?}, b's {:?}",
        a.monitor().read_problem(),
        b.monitor().read_problem()
    );
    assert!(taken && gone_here);
    assert!(cleared, "a lease this instance no longer processes is not its problem");
    a.stop().await;
    b.stop().await;
}

/// A [`common::RecordingHandler`] that takes its time per batch (a batch in flight most of the
/// time, as a real handler's would be).
struct SlowHandler(Duration, common::RecordingHandler);

impl SlowHandler {
    /// Records for instance `name` of `env`, taking `took` per batch.
    fn of(env: &Env, name: &str, took: Duration) -> Arc<Self> {
        Arc::new(Self(
            took,
            common::RecordingHandler {
                instance: name.into(),
                deliveries: env.deliveries.clone(),
            },
        ))
    }
}

#[async_trait::async_trait]
impl ChangeHandler for SlowHandler {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        tokio::time::sleep(self.0).await;
        self.1.handle(batch).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalancing_under_load_hands_leases_over_without_redelivering_anything() {
    let env = Env::new(8).await;
    let slow = |name: &str| SlowHandler::of(&env, name, Duration::from_millis(30));
    let a_processor = env.processor(env.options("a"), slow("a")).await;
    let mut a_events = a_processor.subscribe();
    let a = a_processor.start().await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            env.owners().await.get("a") == Some(&8)
        })
        .await
    );
    // Every lease busy: writes keep coming while the new instances join.
    let writes = tokio::spawn({
        let items = env.items.clone();
        async move {
            for n in 0..3000usize {
                upsert_doc(&items, n).await;
                if n % 10 == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut joined = Vec::new();
    for name in ["b", "c", "d"] {
        joined.push(
            env.processor(env.options(name), slow(name))
                .await
                .start()
                .await
                .unwrap(),
        );
    }
    let started = Instant::now();
    let fair_share = eventually(Duration::from_secs(10), || async { fair(&env.owners().await, 4, 8) }).await;
    let balanced = started.elapsed();
    writes.await.unwrap();
    assert!(env.delivered_within(3000, Duration::from_secs(60)).await);
    let mut handed_over = 0;
    while let Ok(event) = a_events.try_recv() {
        handed_over += usize::from(matches!(
            event,
            LeaseEvent::Closed {
                reason: CloseReason::HandedOver,
                ..
            }
        ));
    }
    let duplicates = env.deliveries.duplicates();
    let missing = env.deliveries.missing(ids(0..3000));
    println!(
        "rebalance under load 1 -> 4 instances, 8 busy leases: fair share after {balanced:.2?}, {handed_over} leases handed over by a, written 3000, delivered {} distinct, duplicates {}, lost {}",
        env.deliveries.distinct(),
        duplicates.len(),
        missing.len()
    );
    assert!(fair_share, "{:?}", env.owners().await);
    assert_eq!(handed_over, 6, "a handed 6 of its 8 leases over");
    assert!(
        missing.is_empty() && duplicates.is_empty(),
        "missing {missing:?} duplicates {duplicates:?}"
    );
    a.stop().await;
    for handle in joined {
        handle.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_that_ignores_a_handoff_request_loses_the_lease_after_an_expiration() {
    let env = Env::new(2).await;
    let a = env.start_owning_all("a", 2).await;
    a.abort();
    env.store().await.remove_heartbeat("a").await.unwrap();
    // An owner of another version: it keeps renewing both leases and never looks at requests.
    let store = env.store().await;
    let renewing = tokio::spawn({
        let store = store.clone();
        async move {
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
                let _ = store.heartbeat("old-version", false).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_deleted_while_processed_is_recreated_from_its_checkpoint() {
    let env = Env::new(2).await;
    let a = env.start(env.options("a")).await;
    env.write(0..100).await;
    assert!(env.delivered_within(100, Duration::from_secs(20)).await);
    let store = env.store().await;
    let victim = env.leases().await.remove(0);
    store
        .delete(&victim)
        .await
        .expect("delete the lease behind the owner's back");
    env.write(100..300).await;
    let recreated = eventually(Duration::from_secs(20), || async {
        env.leases().await.iter().any(|l| l.id == victim.id)
    })
    .await;
    assert!(env.delivered_within(300, Duration::from_secs(30)).await);
    let back = env.leases().await.into_iter().find(|l| l.id == victim.id);
    let missing = env.deliveries.missing(ids(0..300));
    println!(
        "lease deleted while processed: recreated {recreated} (checkpoint kept: {}), 300 written, {} delivered, {} lost, {} duplicates",
        back.as_ref().is_some_and(|l| l.continuation.is_some()),
        env.deliveries.distinct(),
        missing.len(),
        env.deliveries.duplicates().len()
    );
    assert!(recreated && missing.is_empty(), "missing {missing:?}");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_store_marked_initialized_without_leases_is_bootstrapped_again() {
    let env = Env::new(3).await;
    env.ensure_leases().await;
    env.store().await.mark_initialized("db/items", 1).await.unwrap();
    env.write(0..150).await;
    let a = env.start(env.options("a")).await;
    let delivered = env.delivered_within(150, Duration::from_secs(20)).await;
    println!(
        ".info without leases: {} leases created, {} of 150 delivered",
        env.leases().await.len(),
        env.deliveries.distinct()
    );
    assert!(delivered);
    assert_eq!(env.leases().await.len(), 3);
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_processors_leases_in_the_same_container_are_never_touched() {
    let env = Env::new(2).await;
    env.ensure_leases().await;
    let foreign = common::lease_store(&env.account, "billing").await.unwrap();
    let range = changefeed_operator::cosmos::EpkRange::new("", "FF");
    let mut lease = changefeed_operator::processor::Lease::new(foreign.prefix(), &range, Some("\"42\"".into()));
    lease.owner = Some("billing-0".into());
    lease.timestamp = Some(time::OffsetDateTime::now_utc());
    let before = foreign.create(&lease).await.unwrap().expect("created");
    let a = env.start(env.options("a")).await;
    env.write(0..100).await;
    assert!(env.delivered_within(100, Duration::from_secs(20)).await);
    let after = foreign.read(&before.id).await.unwrap().expect("still there");
    println!(
        "foreign processor's lease: owner {:?}, etag unchanged {}; ours: {} leases, 100 delivered",
        after.owner,
        after.etag == before.etag,
        env.leases().await.len()
    );
    assert_eq!(after.etag, before.etag, "another processor's lease was written");
    assert_eq!(env.leases().await.len(), 2);
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_container_deleted_while_running_is_reported_and_processing_resumes_when_it_is_back() {
    let env = Env::new(4).await;
    let a = env.start(env.options("a")).await;
    let b = env.start(env.options("b")).await;
    env.write(0..200).await;
    assert!(env.delivered_within(200, Duration::from_secs(20)).await);
    assert!(eventually(Duration::from_secs(10), || async { fair(&env.owners().await, 2, 4) }).await);
    env.account.delete_container(common::DB, common::LEASES).await.unwrap();
    let deleted = Instant::now();
    let reported = eventually(Duration::from_secs(10), || async {
        a.monitor()
            .read_problem()
            .is_some_and(|p| p.contains("lease container"))
            && b.monitor().read_problem().is_some()
    })
    .await;
    let problem = a.monitor().read_problem();
    env.write(200..400).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    env.ensure_leases().await;
    let back = Instant::now();
    let resumed = env.delivered_within(400, Duration::from_secs(30)).await;
    // The documents may have reached the handler while the container was gone (only their
    // checkpoints waited): readiness clears at the next listing, the leases come back with the
    // checkpoints held here.
    let cleared = eventually(Duration::from_secs(10), || async {
        a.monitor().read_problem().is_none() && b.monitor().read_problem().is_none()
    })
    .await;
    let written_back = eventually(Duration::from_secs(10), || async { env.leases().await.len() == 4 }).await;
    let missing = env.deliveries.missing(ids(0..400));
    let leases = env.leases().await;
    println!(
        "lease container deleted: reported {reported} after {:.1?} ({problem:?}); recreated {:.1?} later: 400 delivered {resumed} within {:.1?}, lost {}, duplicates {}, leases {} with checkpoints {}, readiness cleared {cleared}",
        back.duration_since(deleted).saturating_sub(Duration::from_secs(2)),
        back.duration_since(deleted),
        back.elapsed(),
        missing.len(),
        env.deliveries.duplicates().len(),
        leases.len(),
        leases.iter().filter(|l| l.continuation.is_some()).count()
    );
    assert!(reported, "readiness names the missing lease container");
    assert!(resumed && missing.is_empty(), "missing {missing:?}");
    assert!(cleared);
    assert!(written_back, "leases {leases:?}");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpointing_every_ten_batches_writes_a_tenth_and_a_stop_still_checkpoints() {
    let env = Env::new(2).await;
    let mut options = env.options("a");
    options.max_items = 10;
    options.checkpoint = changefeed_operator::processor::CheckpointPolicy {
        every_batches: 10,
        interval: None,
    };
    let processor = env
        .processor(
            options.clone(),
            Arc::new(common::RecordingHandler {
                instance: "a".into(),
                deliveries: env.deliveries.clone(),
            }),
        )
        .await;
    let mut events = processor.subscribe();
    let a = processor.start().await.unwrap();
    env.write(0..1000).await;
    assert!(env.delivered_within(1000, Duration::from_secs(30)).await);
    let (mut batches, mut checkpoints) = (0usize, 0usize);
    while let Ok(event) = events.try_recv() {
        if let LeaseEvent::Checkpointed { .. } = event {
            checkpoints += 1;
        }
    }
    batches += env.deliveries.total().div_ceil(10);
    // A graceful stop writes the positions handled since the last checkpoint...
    a.stop().await;
    let b = env.start(env.options("b")).await;
    env.write(1000..1100).await;
    assert!(env.delivered_within(1100, Duration::from_secs(30)).await);
    let duplicates = env.deliveries.duplicates();
    println!(
        "checkpoint every 10 batches: ~{batches} batches of 10, {checkpoints} checkpoint writes; after a graceful stop and restart: 1100 delivered, {} duplicates",
        duplicates.len()
    );
    assert!(
        checkpoints <= batches / 5,
        "{checkpoints} checkpoints for {batches} batches"
    );
    assert!(
        duplicates.is_empty(),
        "a stop lost the deferred positions: {duplicates:?}"
    );
    b.stop().await;
}

/// Records the lease errors a processor reports (what `cfp_lease_errors_total` counts).
#[derive(Default)]
struct LeaseErrors(std::sync::Mutex<Vec<String>>);

impl changefeed_operator::processor::ProcessorObserver for LeaseErrors {
    fn lease_error(&self, reason: &str) {
        self.0.lock().unwrap().push(reason.to_owned());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_overlapping_another_is_reported_once_and_nothing_is_lost() {
    let env = Env::new(2).await;
    env.start_owning_all("a", 2).await.stop().await;
    // A lease straddling the boundary of the two real ones (a hand edit, another tool).
    let leases = env.leases().await;
    let boundary = leases
        .iter()
        .filter_map(|l| l.range())
        .map(|r| r.max.clone())
        .min()
        .unwrap();
    let bogus_range = changefeed_operator::cosmos::EpkRange::new("10", format!("{boundary}1"));
    let store = env.store().await;
    store
        .create(&changefeed_operator::processor::Lease::new(
            store.prefix(),
            &bogus_range,
            None,
        ))
        .await
        .unwrap();
    let errors = Arc::new(LeaseErrors::default());
    let processor = env
        .processor(env.options("b"), env.recorder("b"))
        .await
        .with_observer(errors.clone());
    let b = processor.start().await.unwrap();
    env.write(0..200).await;
    assert!(env.delivered_within(200, Duration::from_secs(20)).await);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let reported = errors.0.lock().unwrap().clone();
    println!(
        "overlapping lease [10, {boundary}1): reported {:?} over several cycles; 200 written, {} delivered, {} lost",
        reported,
        env.deliveries.distinct(),
        env.deliveries.missing(ids(0..200)).len()
    );
    let overlapping = reported.iter().filter(|r| *r == "overlapping_range").count();
    assert_eq!(
        overlapping, 3,
        "each of the three overlapping leases reported once: {reported:?}"
    );
    assert!(env.deliveries.missing(ids(0..200)).is_empty());
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitored_container_deleted_while_running_is_reported_and_a_recreated_one_is_processed_from_its_start() {
    let env = Env::new(4).await;
    let mut options = env.options("a");
    options.start_from = changefeed_operator::cosmos::StartFrom::Now;
    let a = env.start(options.clone()).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            env.owners().await.get("a") == Some(&4)
        })
        .await
    );
    env.write(0..100).await;
    assert!(env.delivered_within(100, Duration::from_secs(20)).await);
    env.account.delete_container(common::DB, common::ITEMS).await.unwrap();
    let deleted = Instant::now();
    let reported = eventually(Duration::from_secs(15), || async {
        a.monitor().read_problem().is_some_and(|p| p.contains("does not exist"))
    })
    .await;
    let problem = a.monitor().read_problem();
    let reported_after = deleted.elapsed();
    let alive_while_missing = a.monitor().is_alive() && a.owned_leases().len() == 4;
    // Created again, with another partition count: a new container and a new change feed, which
    // a restarted worker (start from "now", the default) reads from its start.
    let spec = changefeed_operator::emulator::ContainerSpec {
        database: common::DB.into(),
        container: common::ITEMS.into(),
        partition_key: "/pk".into(),
        partitions: 2,
    };
    env.emulator.create_container(&spec).await.unwrap();
    let items = env.account.documents(common::DB, common::ITEMS).await.unwrap();
    for n in 100..150 {
        upsert_doc(&items, n).await;
    }
    let halted = tokio::time::timeout(Duration::from_secs(15), a.halted()).await;
    a.stop().await;
    for n in 150..200 {
        upsert_doc(&items, n).await;
    }
    let restarted = env.start(options).await;
    let resumed = env.delivered_within(200, Duration::from_secs(30)).await;
    let missing = env.deliveries.missing(ids(0..200));
    println!(
        "monitored container deleted: reported {reported} after {reported_after:.1?} ({problem:?}), leases kept {alive_while_missing}; recreated with 2 partitions: halted {halted:?}; restarted: 100 documents of the new container delivered {resumed}, lost {}, duplicates {}, leases {}",
        missing.len(),
        env.deliveries.duplicates().len(),
        env.leases().await.len(),
    );
    assert!(reported, "readiness names the missing monitored container: {problem:?}");
    assert!(
        alive_while_missing,
        "a missing container keeps the processor and its leases"
    );
    assert!(
        halted.as_ref().is_ok_and(|reason| reason.contains("created again")),
        "{halted:?}"
    );
    assert!(resumed && missing.is_empty(), "missing {missing:?}");
    assert!(env.deliveries.duplicates().is_empty());
    assert!(restarted.monitor().read_problem().is_none());
    restarted.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_leases_per_partition_let_six_instances_share_two_partitions_through_a_split() {
    // Two physical partitions, three leases each: six instances all get work (the reference
    // processors stop at two), nothing is lost through a split of a partition in the middle of a
    // lease, and a different count on the same lease set is refused.
    let env = Env::new(2).await;
    let options = |name: &str| {
        let mut options = env.options(name);
        options.leases_per_partition = 3;
        options
    };
    let names: Vec<String> = (0..6).map(|i| format!("w{i}")).collect();
    let mut handles = Vec::new();
    for name in &names {
        handles.push(env.start(options(name)).await);
    }
    let shared = eventually(Duration::from_secs(20), || async { fair(&env.owners().await, 6, 6) }).await;
    let owners = env.owners().await;
    env.write(0..1000).await;
    let partitions = split_while_writing(&env, 1000..2000).await;
    let delivered = env.delivered_within(2000, Duration::from_secs(40)).await;
    let missing = env.deliveries.missing(ids(0..2000));
    // The lease across the split point is split when it next reads (a recording that fails is
    // retried with back-off, so a loaded machine may need a while: seen once at 10 s in CI).
    eventually(Duration::from_secs(30), || async { env.leases().await.len() == 7 }).await;
    let leases = env.leases().await;
    let busy = names.iter().filter(|n| env.deliveries.delivered_by(n) > 0).count();
    let mut refused = env.options("other");
    refused.leases_per_partition = 2;
    let started = env
        .processor(refused, env.recorder("other"))
        .await
        .start()
        .await
        .err()
        .map(|e| e.to_string());
    println!(
        "2 partitions x 3 leases: owners {owners:?} (fair {shared}); split to {} partitions while writing: {} leases, 2000 written, delivered {delivered}, lost {}, duplicates {}, instances that processed documents {busy}/6; 2 per partition on that lease set: {started:?}",
        partitions.len(),
        leases.len(),
        missing.len(),
        env.deliveries.duplicates().len()
    );
    assert!(shared, "six instances, one lease each: {owners:?}");
    assert!(delivered && missing.is_empty(), "lost {missing:?}");
    assert_eq!(busy, 6, "every instance processed documents");
    let ranges: Vec<(&str, Option<&str>)> = leases.iter().map(|l| (l.id.as_str(), l.owner.as_deref())).collect();
    assert_eq!(
        leases.len(),
        7,
        "the lease across the split point was split: {ranges:?}"
    );
    assert!(
        started
            .as_deref()
            .is_some_and(|e| e.contains("created with 3 lease(s) per partition, not 2")),
        "{started:?}"
    );
    for handle in handles {
        handle.stop().await;
    }
}

/// Records deliveries; the batch holding `doc-5` waits until `release` is notified.
struct SlowDocumentHandler {
    inner: Arc<common::RecordingHandler>,
    slow_started: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl ChangeHandler for SlowDocumentHandler {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        if batch.documents.iter().any(|d| d["id"] == "doc-5") {
            self.slow_started.notify_one();
            self.release.notified().await;
        }
        self.inner.handle(batch).await
    }
}

/// One lease of 100 documents in write order (10 per batch) whose first batch hangs: how many
/// other documents were handled while it hung, and the checkpoint then.
async fn slow_first_batch(
    env: &Env,
    in_flight: u32,
) -> (usize, Option<String>, changefeed_operator::processor::ProcessorHandle) {
    let mut options = env.options(&format!("slow{in_flight}"));
    options.max_items = 10;
    options.max_in_flight_batches = in_flight;
    let (slow_started, release) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let handler = Arc::new(SlowDocumentHandler {
        inner: env.recorder(&options.instance),
        slow_started: slow_started.clone(),
        release,
    });
    let handle = env.processor(options, handler).await.start().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), slow_started.notified())
        .await
        .expect("the slow batch reached the handler");
    // Give the lease time to hand out what it may while the slow batch hangs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let checkpoint = env.leases().await[0].continuation.clone();
    (env.deliveries.distinct(), checkpoint, handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_batch_does_not_stall_its_lease_with_four_in_flight_and_a_crash_redelivers_from_it() {
    // Baseline: one batch at a time, the lease waits for the slow batch.
    let env = Env::new(1).await;
    for n in 0..100 {
        upsert_doc(&env.items, n).await;
    }
    let (alone, _, handle) = slow_first_batch(&env, 1).await;
    handle.abort();
    env.deliveries.clear();
    let before = env.leases().await[0].continuation.clone();

    // Four in flight: the three batches after the slow one are handled meanwhile, the checkpoint
    // stays before the slow batch, and a crash then redelivers from it — nothing is skipped.
    let (meanwhile, checkpoint, handle) = slow_first_batch(&env, 4).await;
    let held = checkpoint == before;
    handle.abort();
    let after_crash = env.start(env.options("after")).await;
    let all = env.delivered_within(100, Duration::from_secs(20)).await;
    let missing = env.deliveries.missing(ids(0..100));
    let redelivered = env.deliveries.duplicates().len();
    println!(
        "a batch hangs in the handler: {alone} other documents handled meanwhile with 1 batch in flight, {meanwhile} with 4; checkpoint held before the hung batch {held}; after a crash all 100 delivered {all}, lost {}, redelivered {redelivered} (at most the 3 batches handled ahead)",
        missing.len()
    );
    assert_eq!(alone, 0, "one in flight: the lease waits");
    assert_eq!(meanwhile, 30, "four in flight: the next three batches are handled");
    assert!(held, "the checkpoint never passes an unfinished batch");
    assert!(all && missing.is_empty(), "lost {missing:?}");
    assert!(redelivered <= 30, "redelivered {redelivered}");
    after_crash.stop().await;
}

/// Counts the change feed reads of a processor.
#[derive(Default)]
struct ReadCounter(std::sync::atomic::AtomicUsize);

impl changefeed_operator::processor::ProcessorObserver for ReadCounter {
    fn feed_read(&self, _lease: &str, _elapsed: Duration, _request_charge: f64) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_page_is_read_while_the_handler_runs_and_waits_until_the_batch_before_it_settles() {
    let env = Env::new(1).await;
    for n in 0..30 {
        upsert_doc(&env.items, n).await;
    }
    let mut options = env.options("ahead");
    options.max_items = 10;
    let (slow_started, release) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let handler = Arc::new(SlowDocumentHandler {
        inner: env.recorder("ahead"),
        slow_started: slow_started.clone(),
        release: release.clone(),
    });
    let reads = Arc::new(ReadCounter::default());
    let handle = env
        .processor(options, handler)
        .await
        .with_observer(reads.clone())
        .start()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), slow_started.notified())
        .await
        .expect("the first batch (doc-5 among doc-0..9) reached the handler");
    // The first page is the batch in hand; the next is read while it is with the handler (it
    // may be read before or after the handler starts: count all reads, not those after a moment)...
    let read_ahead = eventually(Duration::from_secs(10), || async {
        reads.0.load(std::sync::atomic::Ordering::SeqCst) >= 2
    })
    .await;
    // ...but neither handed to the handler nor read past while the batch hangs.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reads_while_hung = reads.0.load(std::sync::atomic::Ordering::SeqCst).saturating_sub(1);
    let delivered_while_hung = env.deliveries.distinct();
    let checkpoint_while_hung = env.leases().await[0].continuation.clone();
    release.notify_one();
    let all = env.delivered_within(30, Duration::from_secs(10)).await;
    let missing = env.deliveries.missing(ids(0..30));
    println!(
        "a batch hangs: {reads_while_hung} page(s) read ahead meanwhile, {delivered_while_hung} documents delivered meanwhile, checkpoint {checkpoint_while_hung:?}; after it returns all 30 delivered {all}, duplicates {}",
        env.deliveries.duplicates().len()
    );
    assert!(read_ahead, "the next page was read while the handler ran");
    assert_eq!(reads_while_hung, 1, "one page ahead, no more");
    assert_eq!(
        delivered_while_hung, 0,
        "the page read ahead waits for the batch before it"
    );
    assert!(
        checkpoint_while_hung.is_none(),
        "no checkpoint before the first batch returns"
    );
    assert!(all && missing.is_empty(), "lost {missing:?}");
    assert!(env.deliveries.duplicates().is_empty(), "delivered once each");
    handle.stop().await;
}

/// Records deliveries and keeps every batch's checkpoint handle (it never checkpoints itself).
#[derive(Default)]
struct KeepHandles {
    deliveries: common::Deliveries,
    handles: std::sync::Mutex<Vec<(Vec<String>, changefeed_operator::processor::CheckpointHandle)>>,
}

#[async_trait::async_trait]
impl changefeed_operator::processor::ManualCheckpointHandler for KeepHandles {
    async fn handle(
        &self,
        batch: Batch<'_>,
        checkpoint: changefeed_operator::processor::CheckpointHandle,
    ) -> Result<(), HandlerError> {
        let ids: Vec<String> = batch
            .documents
            .iter()
            .filter_map(|d| d["id"].as_str().map(str::to_owned))
            .collect();
        self.deliveries.record("manual", ids.clone());
        self.handles.lock().unwrap().push((ids, checkpoint));
        Ok(())
    }
}

/// Starts instance `name` (10 documents a batch) delivering to `handler`, which checkpoints
/// itself, over the lease store `store` makes of the real one (a slower one, say).
async fn start_manual(
    env: &Env,
    handler: Arc<KeepHandles>,
    name: &str,
    store: impl FnOnce(Arc<dyn LeaseStore>) -> Arc<dyn LeaseStore>,
) -> changefeed_operator::processor::ProcessorHandle {
    let mut options = env.options(name);
    options.max_items = 10;
    let settings = env.settings(options);
    let (monitored, leases) = changefeed_operator::worker::open(&env.account, &env.account, &settings)
        .await
        .unwrap();
    let manual = changefeed_operator::processor::Handler::Manual(handler);
    changefeed_operator::processor::ChangeFeedProcessor::with_handler(
        monitored,
        store(Arc::new(leases)),
        manual,
        settings.options,
    )
    .start()
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_checkpoints_write_what_the_handler_confirms_and_a_split_restarts_from_it() {
    use changefeed_operator::processor::CheckpointError;
    let env = Env::new(1).await;
    for n in 0..50 {
        upsert_doc(&env.items, n).await;
    }
    let handler = Arc::new(KeepHandles::default());
    let processor = start_manual(&env, handler.clone(), "manual", |store| store).await;
    let seen = |n: usize| {
        let handler = handler.clone();
        async move { eventually(Duration::from_secs(20), || async { handler.deliveries.distinct() >= n }).await }
    };
    assert!(seen(50).await);
    let lease = || async { env.leases().await.into_iter().next().unwrap() };
    let unwritten = lease().await.continuation.is_none();
    let handle = |i: usize| handler.handles.lock().unwrap()[i].1.clone();
    // The handler confirms its second batch: the lease moves there; an older handle then writes
    // nothing (a checkpoint never goes backwards).
    handle(1).checkpoint().await.unwrap();
    let confirmed = lease().await.continuation.clone();
    handle(0).checkpoint().await.unwrap();
    let kept = lease().await.continuation == confirmed;

    // A split while batches 3.. are handled but not confirmed: the children start from the
    // confirmed position, not from where the reader was.
    for n in 50..80 {
        upsert_doc(&env.items, n).await;
    }
    assert!(seen(80).await);
    let before_split = handler.handles.lock().unwrap().len();
    env.emulator
        .split(common::DB, common::ITEMS, None, Duration::from_millis(100))
        .await
        .unwrap();
    let split = eventually(Duration::from_secs(20), || async { env.leases().await.len() == 2 }).await;
    let redelivered = eventually(Duration::from_secs(20), || async {
        ids(20..80).iter().all(|id| handler.deliveries.count(id) >= 2)
    })
    .await;
    let once = ids(0..20).iter().all(|id| handler.deliveries.count(id) == 1);
    let stale = handle(before_split - 1).checkpoint().await;

    // A handle whose lease another instance took writes nothing (If-Match on the ETag).
    let children = env.leases().await;
    let latest = handler.handles.lock().unwrap().last().unwrap().1.clone();
    let store = env.store().await;
    let mut taken = store
        .read(
            &children
                .iter()
                .find(|l| l.lease_token == latest.lease_token())
                .unwrap()
                .id,
        )
        .await
        .unwrap()
        .unwrap();
    taken.owner = Some("intruder".into());
    let taken = store.replace(&taken).await.unwrap();
    let after_take = latest.checkpoint().await;
    let untouched = store.read(&taken.id).await.unwrap().unwrap().continuation == taken.continuation;
    println!(
        "manual checkpoints: nothing written before the handler confirmed {unwritten}; confirming batch 2 moved the lease, an older handle then kept it {kept}; split {split}: the children redelivered the 60 unconfirmed documents {redelivered}, the 20 confirmed ones once {once}; the split parent's handle: {stale:?}; a handle of a lease another instance took: {after_take:?}, lease untouched {untouched}"
    );
    assert!(unwritten && confirmed.is_some() && kept);
    assert!(split && redelivered && once);
    assert!(matches!(stale, Err(CheckpointError::LeaseLost(_))), "{stale:?}");
    assert!(
        matches!(after_take, Err(CheckpointError::LeaseLost(_))),
        "{after_take:?}"
    );
    assert!(untouched);
    processor.abort();
}

/// Records every batch's documents with their change metadata.
#[derive(Default)]
struct ChangeRecorder {
    seen: std::sync::Mutex<Vec<(serde_json::Value, Option<changefeed_operator::cosmos::Change>)>>,
}

#[async_trait::async_trait]
impl ChangeHandler for ChangeRecorder {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        let mut seen = self.seen.lock().unwrap();
        for (i, document) in batch.documents.iter().enumerate() {
            seen.push((document.clone(), batch.changes.get(i).cloned()));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_versions_and_deletes_delivers_changes_with_metadata_and_the_leases_keep_the_mode() {
    use changefeed_operator::cosmos::{FeedMode, Operation, StartFrom};
    let env = Env::new(2).await;
    let mut options = env.options("avad");
    options.mode = FeedMode::AllVersionsAndDeletes;
    // The service (and the emulator) refuse this mode from the beginning: said before starting.
    let from_beginning = options.validate().err();
    options.start_from = StartFrom::Now;
    let recorder = Arc::new(ChangeRecorder::default());
    let handle = env.processor(options, recorder.clone()).await.start().await.unwrap();
    env.write(0..40).await;
    let all = eventually(Duration::from_secs(20), || async {
        recorder.seen.lock().unwrap().len() >= 40
    })
    .await;
    let seen = recorder.seen.lock().unwrap().clone();
    let modes: Vec<Option<String>> = env.leases().await.into_iter().map(|l| l.mode).collect();
    handle.stop().await;
    // A latest-version worker on these leases stops with one clear error instead of mixing modes.
    let latest = env
        .processor(env.options("latest"), env.recorder("latest"))
        .await
        .start()
        .await
        .err()
        .map(|e| e.to_string());
    let first = seen.first().cloned();
    println!(
        "all versions and deletes: from the beginning refused ({from_beginning:?}); 40 creates delivered {all}, first {first:?}; lease modes {modes:?}; a latest-version worker on them: {latest:?}"
    );
    assert!(from_beginning.is_some_and(|e| e.to_string().contains("starts only from now")));
    assert!(all);
    assert!(
        seen.iter().all(|(doc, change)| doc["id"].is_string()
            && change
                .as_ref()
                .is_some_and(|c| c.operation_type == Operation::Create && c.timestamp.is_some())),
        "{seen:?}"
    );
    assert!(
        modes.iter().all(|m| m.as_deref() == Some("Full-Fidelity Feed")),
        "{modes:?}"
    );
    assert!(latest.is_some_and(|e| e.contains("written in the all-versions-and-deletes mode, not latest-version")),);
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
        let (slow_started, release) = (
            Arc::new(tokio::sync::Notify::new()),
            Arc::new(tokio::sync::Notify::new()),
        );
        let handler = Arc::new(SlowDocumentHandler {
            inner: env.recorder(&options.instance),
            slow_started: slow_started.clone(),
            release: release.clone(),
        });
        let a = env.processor(options, handler).await.start().await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), slow_started.notified())
            .await
            .expect("the slow batch reached the handler");
        let b = env.start(env.options(&format!("b{in_flight}"))).await;
        let stopping = tokio::spawn(a.stop());
        // The handler holds the batch for 1.5 lease expirations after the stop began.
        tokio::time::sleep(expiration * 3 / 2).await;
        release.notify_one();
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

/// Two manual checkpoints of the same lease at once (the handler confirms batches from several
/// tasks): the older one never lands last, so the lease never moves backwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_manual_checkpoints_never_move_a_lease_backwards() {
    let env = Env::new(1).await;
    for n in 0..400 {
        upsert_doc(&env.items, n).await;
    }
    let handler = Arc::new(KeepHandles::default());
    // A lease container answering in 100 ms, as a loaded one does: the renewer holds the lease
    // often, and handles arriving meanwhile are under way at once.
    let slow = |store| -> Arc<dyn LeaseStore> {
        Arc::new(changefeed_operator::bench::CountingStore::new(store).with_latency(Duration::from_millis(100)))
    };
    let processor = start_manual(&env, handler.clone(), "manual-race", slow).await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            handler.deliveries.distinct() >= 400
        })
        .await
    );
    let handle = |i: usize| handler.handles.lock().unwrap()[i].1.clone();
    let continuation = || async { env.leases().await.into_iter().next().unwrap().continuation };
    let mut backwards = Vec::new();
    for pair in 0..20 {
        let (older, newer) = (handle(2 * pair), handle(2 * pair + 1));
        // The newer handle first: an older one that read the lease before it wrote must not win.
        let racing = (
            {
                let newer = newer.clone();
                tokio::spawn(async move { newer.checkpoint().await })
            },
            tokio::spawn(async move { older.checkpoint().await }),
        );
        racing.0.await.unwrap().unwrap();
        racing.1.await.unwrap().unwrap();
        let after_race = continuation().await;
        // Where the newer handle alone leaves the lease: it writes nothing if the lease is there.
        newer.checkpoint().await.unwrap();
        if continuation().await != after_race {
            backwards.push(pair);
        }
        // Let a renewal come around: the next race may meet it.
        tokio::time::sleep(Duration::from_millis(170)).await;
    }
    println!("concurrent manual checkpoints: 20 races of two handles, the lease went backwards in {backwards:?}");
    assert!(
        backwards.is_empty(),
        "the older checkpoint landed last in pairs {backwards:?}"
    );
    processor.stop().await;
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
