//! Instance liveness: an instance's heartbeat, one write every renew interval, keeps all its
//! leases alive, so an idle lease is not written at all — and yet nobody takes a live
//! instance's lease, a crashed instance's leases are taken one expiration after its last beat,
//! a fleet in the middle of an upgrade (instances that judge leases one by one beside ones that
//! keep them by heartbeat) moves no lease and loses nothing, and an owner cut off from the lease
//! store hands no batch to its handler once nothing kept its lease alive, and a graceful stop
//! while a heartbeat's answer is on its way leaves no heartbeat behind.

use std::collections::BTreeMap;
use std::time::Duration;

use changefeed_operator::bench::CountingStore;
use changefeed_operator::processor::{LeaseLiveness, ProcessorHandle, ProcessorOptions};
use tokio::time::Instant;

use crate::common::{self, Env, eventually, fair};

/// Lease id → (owner, ETag).
async fn versions(env: &Env) -> BTreeMap<String, (Option<String>, String)> {
    env.leases()
        .await
        .into_iter()
        .map(|l| (l.id, (l.owner, l.etag)))
        .collect()
}

/// The beat each live instance's heartbeat shows.
async fn beats(env: &Env) -> BTreeMap<String, String> {
    let snapshot = env.store().await.snapshot().await.unwrap();
    snapshot
        .instances
        .into_iter()
        .map(|(name, beat)| (name, beat.to_string()))
        .collect()
}

/// Starts `a` and `b` on four leases and waits until each owns two.
async fn balanced_pair(env: &Env, a: ProcessorOptions, b: ProcessorOptions) -> (ProcessorHandle, ProcessorHandle) {
    let first = env.start_owning_all_with(a, 4).await;
    let second = env.start(b).await;
    let shared = eventually(Duration::from_secs(15), || async { fair(&env.owners().await, 2, 4) }).await;
    assert!(shared, "no fair share: {:?}", env.owners().await);
    (first, second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_leases_are_not_written_and_no_live_instances_lease_is_taken() {
    let env = Env::new(4).await;
    let (a, b) = balanced_pair(&env, env.options("a"), env.options("b")).await;
    // One listing after the balance, so that both know nobody judges leases one by one.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = versions(&env).await;
    let beats_before = beats(&env).await;
    // Three lease expirations (2 s) without a document: a lease judged by its own writes expires.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let after = versions(&env).await;
    let beats_after = beats(&env).await;
    println!("idle for three expirations: leases {before:?} → {after:?}; beats {beats_before:?} → {beats_after:?}");
    assert_eq!(after, before, "an idle lease was written (renewed, or taken)");
    for name in ["a", "b"] {
        assert_ne!(beats_before.get(name), beats_after.get(name), "{name} did not beat");
    }
    // Still alive: a document written now is delivered once.
    env.write(0..20).await;
    assert!(env.delivered_within(20, Duration::from_secs(10)).await);
    assert!(env.deliveries.duplicates().is_empty());
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_instances_leases_are_taken_one_expiration_after_its_last_beat() {
    let env = Env::new(4).await;
    let (a, b) = balanced_pair(&env, env.options("a"), env.options("b")).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    a.abort();
    let crashed = Instant::now();
    let taken = eventually(Duration::from_secs(15), || async {
        env.owners().await.get("b") == Some(&4)
    })
    .await;
    let failover = crashed.elapsed();
    println!(
        "failover after a crash, idle leases kept by heartbeat: {failover:.2?} (expiration 2 s, renew 300 ms, acquire 500 ms)"
    );
    assert!(taken, "{:?}", env.owners().await);
    // Not before its heartbeat could have expired (the last beat was at most a renew interval
    // before the crash), and about one expiration plus a listing after.
    assert!(
        failover >= Duration::from_millis(1700),
        "taken before the expiration: {failover:?}"
    );
    env.write(0..40).await;
    assert!(env.delivered_within(40, Duration::from_secs(10)).await);
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_in_the_middle_of_an_upgrade_moves_no_lease_and_loses_nothing() {
    let env = Env::new(4).await;
    let mut old = env.options("old");
    old.liveness = LeaseLiveness::EachLease;
    let (old, new) = balanced_pair(&env, old, env.options("new")).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let owners = |v: &BTreeMap<String, (Option<String>, String)>| -> Vec<Option<String>> {
        v.values().map(|(owner, _)| owner.clone()).collect()
    };
    let before = versions(&env).await;
    let writing = async {
        for round in 0..10 {
            env.write(round * 20..round * 20 + 20).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    writing.await;
    // Idle for two expirations beside the older version: the new instance renews each of its
    // leases (the old one would take them otherwise) and no lease moves.
    let idle_start = versions(&env).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let idle_end = versions(&env).await;
    assert_eq!(owners(&idle_end), owners(&before), "a lease moved in the mixed fleet");
    for (id, (owner, etag)) in &idle_end {
        assert_ne!(
            Some(etag),
            idle_start.get(id).map(|(_, e)| e),
            "{owner:?}'s lease {id} was not renewed"
        );
    }
    assert!(env.delivered_within(200, Duration::from_secs(10)).await);
    assert!(
        env.deliveries.duplicates().is_empty(),
        "{:?}",
        env.deliveries.duplicates()
    );
    // The older version leaves (its leases are released and taken): the fleet keeps its leases
    // by heartbeat again, and idle leases are no longer written.
    old.stop().await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            env.owners().await.get("new") == Some(&4)
        })
        .await
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let alone = versions(&env).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        versions(&env).await,
        alone,
        "leases still renewed one by one after the upgrade"
    );
    env.write(200..220).await;
    assert!(env.delivered_within(220, Duration::from_secs(10)).await);
    assert!(
        env.deliveries.duplicates().is_empty(),
        "{:?}",
        env.deliveries.duplicates()
    );
    new.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_cut_off_from_the_lease_store_delivers_nothing_once_its_lease_may_be_taken() {
    let env = Env::new(1).await;
    // The defaults' checkpoint mode: a checkpoint after each batch, one at a time.
    let options = env.options("cut");
    let (store, processor) = env.counted_processor(options, env.recorder("cut"), |s| s).await;
    let handle = processor.start().await.unwrap();
    usurped_while_cut_off(&env, &store).await;
    env.write(10..20).await;
    // The owner still reads the monitored container; nothing confirms its lease.
    tokio::time::sleep(Duration::from_secs(2)).await;
    store.cut_off(false);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let late: Vec<String> = common::ids(10..20)
        .into_iter()
        .filter(|id| env.deliveries.count(id) > 0)
        .collect();
    println!("delivered by the deposed owner: {late:?}");
    assert!(
        late.is_empty(),
        "the cut-off owner delivered {late:?} after its lease was taken"
    );
    assert_eq!(env.owners().await.get("usurper"), Some(&1));
    handle.stop().await;
}

/// The first heartbeat after a silence longer than half an expiration vouches for no lease
/// (issue 59): a lease last confirmed before the silence is confirmed again before its next
/// batch, so an owner whose lease was taken meanwhile delivers nothing — also when its heartbeat
/// landed before that batch was read. Listings answer late here, so that only the batch's own
/// check can find the lease lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_heartbeat_after_a_silence_vouches_for_no_lease() {
    let env = Env::new(1).await;
    let options = env.options("cut");
    let slow_listings = |store: CountingStore| store.with_slow_listings(Duration::from_secs(3));
    let (store, processor) = env.counted_processor(options, env.recorder("cut"), slow_listings).await;
    let handle = processor.start().await.unwrap();
    usurped_while_cut_off(&env, &store).await;
    let beat_before = heartbeat_of(&env, "cut").await;
    store.cut_off(false);
    let beat_again = eventually(Duration::from_secs(5), || async {
        heartbeat_of(&env, "cut").await != beat_before
    })
    .await;
    assert!(beat_again, "no heartbeat after the silence");
    env.write(10..20).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let late: Vec<String> = common::ids(10..20)
        .into_iter()
        .filter(|id| env.deliveries.count(id) > 0)
        .collect();
    handle.stop().await;
    assert!(
        late.is_empty(),
        "delivered after a silence, on the word of the heartbeat alone: {late:?}"
    );
}

/// An acquisition vouches for the lease as of when it was sent, not when its answer came
/// (issue 59 §6, found by the soak's freeze across a split): a process frozen between writing
/// itself into a lease and reading the answer, whose lease another instance took meanwhile,
/// confirms it before its first batch — and delivers nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_answered_after_a_freeze_vouches_for_nothing_since_it_was_sent() {
    let env = Env::new(1).await;
    env.ensure_leases().await;
    let options = env.options("late");
    // Listings answer late, so that only the batch's own check can find the lease lost.
    let slow_listings = |store: CountingStore| store.with_slow_listings(Duration::from_secs(3));
    let (store, processor) = env
        .counted_processor(options, env.recorder("late"), slow_listings)
        .await;
    store.freeze_after(|l| l.owner.as_deref() == Some("late"), Duration::from_secs(5));
    let late = processor.start().await.unwrap();
    let taken = eventually(Duration::from_secs(15), || async {
        env.owners().await.get("late") == Some(&1)
    })
    .await;
    assert!(taken, "{:?}", env.owners().await);
    // Frozen for more than the expiration: another instance takes the lease as expired.
    let other = env.start(env.options("other")).await;
    env.write(0..10).await;
    let all = env.delivered_within(10, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let by_late = env.deliveries.delivered_by("late");
    late.stop().await;
    other.stop().await;
    println!("documents delivered by the owner whose acquisition was answered after its lease was taken: {by_late}");
    assert!(all, "missing {:?}", env.deliveries.missing(common::ids(0..10)));
    assert_eq!(by_late, 0, "the deposed owner delivered");
}

/// Once instance `cut` owns the only lease and delivered 10 documents, cuts it off from the lease
/// store for more than an expiration, while another instance takes the lease as expired (written
/// here as it would) and then renews it as a live owner does, for as long as the test runs (a
/// usurper that never wrote again would be dead, its lease expired an expiration after its write,
/// and `cut` would rightly take the lease back).
async fn usurped_while_cut_off(env: &Env, store: &CountingStore) {
    let owns = eventually(Duration::from_secs(15), || async {
        env.owners().await.get("cut") == Some(&1)
    })
    .await;
    assert!(owns, "{:?}", env.owners().await);
    env.write(0..10).await;
    assert!(env.delivered_within(10, Duration::from_secs(10)).await);
    store.cut_off(true);
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let mut lease = env.leases().await.remove(0);
    lease.owner = Some("usurper".into());
    let store = env.store().await;
    let mut lease = store.replace(&lease).await.unwrap();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            lease.timestamp = Some(time::OffsetDateTime::now_utc());
            match store.replace(&lease).await {
                Ok(renewed) => lease = renewed,
                Err(_) => return,
            }
        }
    });
}

/// The heartbeat `instance` wrote last, as listed.
async fn heartbeat_of(env: &Env, instance: &str) -> Option<String> {
    let snapshot = env.store().await.snapshot().await.ok()?;
    let (_, beat) = snapshot.instances.into_iter().find(|(name, _)| name == instance)?;
    Some(beat.to_string())
}

/// A graceful stop that comes while a heartbeat was written and its answer is still on its way
/// leaves no heartbeat behind: the stop waits for that answer before it removes the heartbeat
/// (a removal with the previous beat's ETag is refused, and the fresh heartbeat would keep the
/// instance "running" for `cfp checkpoints` and its leases for an expiration).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_while_a_heartbeats_answer_is_on_its_way_leaves_no_heartbeat() {
    let env = Env::new(1).await;
    let options = env.options("late");
    let late = options.renew_interval * 4 / 5;
    let late_answers = |store: CountingStore| store.with_late_heartbeat_answers(late);
    let (store, processor) = env.counted_processor(options, env.recorder("late"), late_answers).await;
    let handle = processor.start().await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            env.owners().await.get("late") == Some(&1)
        })
        .await
    );
    // Stop just after a heartbeat was written, while its answer is still on its way.
    let before = store.beats.last_written("late");
    let beaten = eventually(Duration::from_secs(5), || async {
        store.beats.last_written("late") != before
    })
    .await;
    assert!(beaten, "no heartbeat written");
    handle.stop().await;
    let left = beats(&env).await;
    println!("heartbeats after the stop: {left:?}");
    assert!(
        !left.contains_key("late"),
        "a graceful stop left its heartbeat: {left:?}"
    );
}
