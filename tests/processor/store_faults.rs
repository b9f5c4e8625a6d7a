//! The stores' faults: malformed, deleted and overlapping leases, failing reads, deleted
//! containers, other processors' leases.

use std::sync::Arc;
use std::time::{Duration, Instant};

use changefeed_operator::cosmos::MonitoredContainer;
use changefeed_operator::processor::leases::bootstrap::bootstrap;
use changefeed_operator::processor::{Lease, LeaseStore, LockAttempt};

use crate::common::{self, Env, eventually, fair, ids, upsert_doc};

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

/// A restore or import replaces a running owner's lease with leases of another layout (here two
/// halves of its range, at its checkpoint) and deletes it: the owner, finding its lease gone,
/// does not write it back over the replacement (issue 38 §4: that would undo the restore for
/// that range and read the overlap twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_replaced_by_a_restore_is_not_written_back_by_its_owner() {
    let env = Env::new(1).await;
    let a = env.start_owning_all("a", 1).await;
    let mut events = a.subscribe();
    env.write(0..50).await;
    assert!(env.delivered_within(50, Duration::from_secs(20)).await);
    let (old, closed) = replaced_by_halves(&env, &mut events).await;
    assert!(env.delivered_within(100, Duration::from_secs(20)).await);
    let ids_now: Vec<String> = env.leases().await.into_iter().map(|l| l.lease_token).collect();
    println!("a lease replaced by a restore: its owner closed it ({closed:?}); leases now {ids_now:?}");
    a.stop().await;
    assert_eq!(ids_now.len(), 2, "the replaced lease was written back: {ids_now:?}");
    assert!(!ids_now.contains(&old.lease_token));
}

/// Replaces the one lease of `env` by two halves with its checkpoint and deletes it (a restore of
/// another layout), writes documents 50..100, and waits for its owner's `events` to say it is
/// closed: the lease replaced and why it was closed.
async fn replaced_by_halves(
    env: &Env,
    events: &mut tokio::sync::broadcast::Receiver<changefeed_operator::processor::LeaseEvent>,
) -> (Lease, changefeed_operator::processor::CloseReason) {
    let store = env.store().await;
    let old = env.leases().await.remove(0);
    let range = old.range().cloned().expect("an EPK range");
    let mid = "80".to_owned();
    for half in [
        changefeed_operator::cosmos::EpkRange::new(range.min.clone(), mid.clone()),
        changefeed_operator::cosmos::EpkRange::new(mid.clone(), range.max.clone()),
    ] {
        let lease = Lease::new(store.prefix(), &half, old.continuation.clone());
        store.create(&lease).await.unwrap().expect("the half is new");
    }
    store.delete(&old).await.expect("delete the replaced lease");
    env.write(50..100).await;
    let closed = common::next_event(events, Duration::from_secs(10), |event| match event {
        changefeed_operator::processor::LeaseEvent::Closed { reason, .. } => Some(reason),
        _ => None,
    })
    .await
    .expect("the owner finds its lease gone");
    (old, closed)
}

/// The same while the owner's listings fail (a throttled lease container) when it finds its
/// lease gone: it cannot tell yet whether other leases cover the range, so it decides once a
/// listing works — never writing the replaced lease back from its older checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_replaced_while_its_owner_cannot_list_is_not_written_back() {
    let env = Env::new(1).await;
    env.ensure_leases().await;
    let (counted, processor) = env
        .counted_processor(env.options("a"), env.recorder("a"), |store| store)
        .await;
    let a = processor.start().await.unwrap();
    let mut events = a.subscribe();
    env.write(0..50).await;
    assert!(env.delivered_within(50, Duration::from_secs(20)).await);
    counted.fail_listings(true);
    let (old, _) = replaced_by_halves(&env, &mut events).await;
    // Its next cycles list in vain for a while, then list again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let while_failing: Vec<String> = env.leases().await.into_iter().map(|l| l.lease_token).collect();
    counted.fail_listings(false);
    let delivered = env.delivered_within(100, Duration::from_secs(20)).await;
    let ids_now: Vec<String> = env.leases().await.into_iter().map(|l| l.lease_token).collect();
    println!(
        "a lease replaced while its owner could not list: leases while it failed {while_failing:?}, after {ids_now:?}"
    );
    a.stop().await;
    assert!(delivered);
    assert!(
        !while_failing.contains(&old.lease_token),
        "written back while its owner could not list"
    );
    assert!(!ids_now.contains(&old.lease_token), "written back: {ids_now:?}");
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

/// Leases taken by another instance while this one's acquire cycles run back to back (a lease
/// container answering slower than the acquire interval): each lost lease's end is settled —
/// closed, no longer counted as this instance's — as soon as the cycle that found it is over, not
/// one per later cycle (the soak's logs showed 14 leases closed 9 s after they were lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_lost_while_cycles_run_back_to_back_are_closed_after_the_cycle_that_found_them() {
    use changefeed_operator::processor::{CloseReason, LeaseEvent};
    let env = Env::new(16).await;
    let (_, processor) = env
        .counted_processor(env.options("a"), env.recorder("a"), |s| {
            s.with_latency(Duration::from_millis(700))
        })
        .await;
    let handle = processor.start().await.unwrap();
    let mut events = handle.subscribe();
    assert!(
        eventually(Duration::from_secs(60), || async {
            env.owners().await.get("a") == Some(&16)
        })
        .await,
        "a took every lease: {:?}",
        env.owners().await
    );
    let direct = env.store().await;
    for mut lease in direct.snapshot().await.unwrap().leases {
        lease.take_for("b", "b-1".into());
        direct.replace(&lease).await.unwrap();
    }
    let taken = Instant::now();
    let mut closed = 0;
    let all_closed = tokio::time::timeout(Duration::from_secs(30), async {
        while closed < 16 {
            if let Ok(LeaseEvent::Closed {
                reason: CloseReason::LeaseLost,
                ..
            }) = events.recv().await
            {
                closed += 1;
            }
        }
    })
    .await;
    let took = taken.elapsed();
    println!(
        "16 leases lost while cycles of 0.7 s listings ran back to back: all closed {took:?} after they were taken"
    );
    handle.abort();
    assert!(all_closed.is_ok(), "{closed} of 16 closed within 30 s");
    assert!(
        took < Duration::from_secs(3),
        "closed only {took:?} after they were taken"
    );
}

/// Two partitions, a lease container, and its store, for bootstraps run by hand.
struct Bootstrapping {
    env: Env,
    monitored: MonitoredContainer,
    store: Arc<dyn LeaseStore>,
}

impl Bootstrapping {
    async fn new() -> Self {
        let env = Env::new(2).await;
        env.ensure_leases().await;
        let monitored = env.account.monitored(common::DB, common::ITEMS).await.unwrap();
        let store = env.store().await;
        Self { env, monitored, store }
    }
}

/// A bootstrap dropped while it holds the bootstrap lock (the operator's estimate timing out,
/// its leadership lost) leaves the lock behind; the next bootstrap of the same process must not
/// wait a whole lease expiration for it to look abandoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_dropped_while_it_holds_the_lock_does_not_hold_up_the_next_one() {
    let Bootstrapping { env, monitored, store } = Bootstrapping::new().await;
    let leases = env.account.documents(common::DB, common::LEASES).await.unwrap();
    let mut options = env.options("operator");
    options.expiration = Duration::from_secs(60);
    // Many leases to create: the lock is held for a while, and the attempt is dropped as soon as
    // the lock is seen.
    options.leases_per_partition = 200;
    let lock = format!("{}.lock", store.prefix());
    let seen = async {
        while leases.read(&lock, &lock).await.unwrap().is_none() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::select! {
        done = bootstrap(store.as_ref(), &monitored, &options) => panic!("the bootstrap ended before its lock was seen: {done:?}"),
        () = seen => {}
    }
    assert!(!store.snapshot().await.unwrap().initialized);
    let started = Instant::now();
    let next = tokio::time::timeout(Duration::from_secs(20), bootstrap(store.as_ref(), &monitored, &options)).await;
    println!(
        "a bootstrap dropped holding the lock: the next one took {:?} (expiration {:?})",
        started.elapsed(),
        options.expiration
    );
    assert!(
        matches!(next, Ok(Ok(()))),
        "the next bootstrap waited for the lock left behind: {next:?}"
    );
    assert!(store.snapshot().await.unwrap().initialized);
    assert!(
        leases.read(&lock, &lock).await.unwrap().is_none(),
        "the lock is given back"
    );
}

/// Two bootstraps of one process for one lease set (the operator estimating two resources that
/// name it, with different layouts): one at a time, so one layout is written and the other
/// refused — never leases of both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bootstraps_of_one_process_for_one_lease_set_run_one_at_a_time() {
    let Bootstrapping { env, monitored, store } = Bootstrapping::new().await;
    let (mut one, mut two) = (env.options("operator"), env.options("operator"));
    one.leases_per_partition = 1;
    two.leases_per_partition = 2;
    let (first, second) = tokio::join!(
        bootstrap(store.as_ref(), &monitored, &one),
        bootstrap(store.as_ref(), &monitored, &two)
    );
    let leases = store.snapshot().await.unwrap().leases.len();
    println!(
        "two bootstraps at once, 1 and 2 leases per partition: {leases} leases; {} and {}",
        if first.is_ok() { "ok" } else { "refused" },
        if second.is_ok() { "ok" } else { "refused" }
    );
    assert!(
        first.is_ok() != second.is_ok(),
        "exactly one layout: {first:?} / {second:?}"
    );
    assert_eq!(leases, if first.is_ok() { 2 } else { 4 }, "one layout's leases only");
}

/// A bootstrap whose lock another instance broke and took (it saw the lock unchanged for a few
/// renewals: a holder frozen, or its rewrites throttled); when the slow one ends it
/// gives back its own lock only — never the one the other instance holds now, which would let a
/// third bootstrap run beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_whose_lock_was_taken_over_gives_back_only_its_own() {
    let Bootstrapping { env, store, .. } = Bootstrapping::new().await;
    let leases = env.account.documents(common::DB, common::LEASES).await.unwrap();
    let lock = format!("{}.lock", store.prefix());
    let holder = || async {
        leases
            .read(&lock, &lock)
            .await
            .unwrap()
            .map(|doc| doc.body["Owner"].clone())
    };
    let LockAttempt::Taken { etag: slow } = store.try_lock("slow", Duration::from_secs(5)).await.unwrap() else {
        panic!("the lock is free")
    };
    let LockAttempt::Held { etag, .. } = store.try_lock("other", Duration::from_secs(5)).await.unwrap() else {
        panic!("the slow instance's lock is held")
    };
    store.break_lock(&etag).await.unwrap();
    assert!(matches!(
        store.try_lock("other", Duration::from_secs(5)).await.unwrap(),
        LockAttempt::Taken { .. }
    ));
    store.unlock(&slow).await.unwrap();
    let left = holder().await;
    println!("the slow bootstrap gave its lock back after another took it over: the lock is {left:?}");
    assert_eq!(
        left,
        Some(serde_json::json!("other")),
        "the other instance's lock is left alone"
    );
}

/// A bootstrap killed partway (some of a partition's leases created, the rest not, no `.info`):
/// the next bootstrap creates the leases it left out — a partition some lease overlaps is not
/// therefore covered, and the keys no lease covers would never be read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_after_one_killed_partway_creates_the_leases_it_left_out() {
    let Bootstrapping { env, monitored, store } = Bootstrapping::new().await;
    let mut options = env.options("next");
    options.leases_per_partition = 4;
    let ranges = monitored.feed_ranges(true).await.unwrap();
    // What the killed holder had created: the first two of the first partition's four leases.
    for piece in ranges[0].divide(4).unwrap().iter().take(2) {
        store.create(&Lease::new(store.prefix(), piece, None)).await.unwrap();
    }
    bootstrap(store.as_ref(), &monitored, &options).await.unwrap();
    let leases = env.leases().await;
    let uncovered: Vec<_> = ranges
        .iter()
        .flat_map(|range| range.divide(4).unwrap())
        .filter(|piece| !leases.iter().any(|l| l.range() == Some(piece)))
        .collect();
    env.write(0..300).await;
    let a = env.start(options).await;
    let delivered = env.delivered_within(300, Duration::from_secs(10)).await;
    println!(
        "a bootstrap after one killed partway: {} leases for {} partitions of 4; uncovered {uncovered:?}; {} of 300 delivered",
        leases.len(),
        ranges.len(),
        env.deliveries.distinct()
    );
    assert!(uncovered.is_empty(), "keys no lease covers: {uncovered:?}");
    assert!(delivered, "documents were lost");
    a.stop().await;
}
