//! A graceful stop that outlasts an acquire cycle (a batch in flight, a lease container at its
//! budget releasing one lease at a time): the instances that stay take the leases it has
//! released while it is still stopping. A stopping instance is not counted as a live one with a
//! share of its own, or the fair shares would send it every lease it frees, to lie unprocessed.

use std::time::{Duration, Instant};

use changefeed_operator::processor::Lease;

use crate::common::gate::{GateHandler, Hold, hold_a_batch_of_every_lease};
use crate::common::{Env, eventually, fair, ids};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leases_a_stopping_instance_released_are_taken_while_its_stop_waits_for_a_batch() {
    let env = Env::new(4).await;
    env.ensure_leases().await;
    let stays = env.start_owning_all("stays", 4).await;
    let handler = GateHandler::recording(Hold::Nothing, env.recorder("leaves"));
    let options = env.options("leaves");
    let acquire = options.acquire_interval;
    let leaves = env.processor(options, handler.clone()).await.start().await.unwrap();
    let fair = eventually(Duration::from_secs(10), || async {
        let owners = env.owners().await;
        owners.get("stays") == Some(&2) && owners.get("leaves") == Some(&2)
    })
    .await;
    assert!(fair, "no fair share: {:?}", env.owners().await);

    handler.hold(Hold::Next);
    env.write(0..40).await;
    assert!(
        handler.wait_held_count(1).await,
        "no batch of the instance that leaves reached its handler"
    );
    let stop_began = Instant::now();
    let stopping = tokio::spawn(leaves.stop());
    // Its other lease is released at once; the one whose batch is held stays its own.
    let taken = eventually(acquire * 8, || async { env.owners().await.get("stays") == Some(&3) }).await;
    let owners = env.owners().await;
    let still_stopping = !stopping.is_finished();
    handler.open();
    tokio::time::timeout(Duration::from_secs(20), stopping)
        .await
        .expect("the stop completes")
        .unwrap();
    println!(
        "{:.1} s into the stop (acquire interval {acquire:?}): {owners:?}, still stopping {still_stopping}",
        stop_began.elapsed().as_secs_f64()
    );
    assert!(
        taken && still_stopping,
        "the lease released by the instance that leaves was not taken while it stopped: {owners:?}"
    );
    let all = eventually(Duration::from_secs(10), || async {
        env.owners().await.get("stays") == Some(&4)
    })
    .await;
    assert!(all, "after the stop: {:?}", env.owners().await);
    let delivered = env.delivered_within(40, Duration::from_secs(20)).await;
    stays.stop().await;
    assert!(delivered, "missing {:?}", env.deliveries.missing(ids(0..40)));
}

/// A lease this instance asked for, handed over by its owner (after the batch it was handling)
/// once this instance has begun to stop, is freed and taken by another: owned by a name whose
/// heartbeat still beats, it would lie unprocessed until the stop ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_handed_over_to_an_instance_that_is_stopping_is_freed_and_taken_by_another() {
    let env = Env::new(4).await;
    env.ensure_leases().await;
    // A requester's patience is a lease expiration: long enough for the steps below.
    let with_patience = |name: &str| {
        let mut options = env.options(name);
        options.expiration = Duration::from_secs(20);
        options
    };
    let stays_handler = GateHandler::recording(Hold::Every, env.recorder("stays"));
    let stays = env
        .processor(with_patience("stays"), stays_handler.clone())
        .await
        .start()
        .await
        .unwrap();
    let owns_all = eventually(Duration::from_secs(10), || async {
        env.owners().await.get("stays") == Some(&4)
    })
    .await;
    assert!(owns_all, "{:?}", env.owners().await);
    env.write(0..40).await;
    let tokens: Vec<String> = env.leases().await.into_iter().map(|l| l.lease_token).collect();
    assert!(
        stays_handler.wait_held(&tokens).await,
        "held: {:?}",
        stays_handler.held()
    );

    let leaves_handler = GateHandler::recording(Hold::Nothing, env.recorder("leaves"));
    let leaves = env
        .processor(with_patience("leaves"), leaves_handler.clone())
        .await
        .start()
        .await
        .unwrap();
    let asked = eventually(Duration::from_secs(10), || async {
        requested_by(&env, "leaves").await.len() == 2
    })
    .await;
    assert!(asked, "the newcomer asked for no two leases: {:?}", env.leases().await);
    let requested = requested_by(&env, "leaves").await;
    let (first, second) = (&requested[0], &requested[1]);

    // The first is handed over after its batch, and the newcomer holds a batch of it.
    leaves_handler.hold(Hold::Every);
    let given_epoch = lease_of(&env, first).await.owner_epoch;
    stays_handler.release(first);
    // Written once the newcomer took it up (an epoch of its own), so that they are its to read.
    let taken_up = eventually(Duration::from_secs(10), || async {
        let lease = lease_of(&env, first).await;
        lease.owner.as_deref() == Some("leaves") && lease.owner_epoch != given_epoch
    })
    .await;
    assert!(
        taken_up,
        "the first lease was not taken up: {:?}",
        lease_of(&env, first).await
    );
    env.write(40..80).await;
    assert!(
        leaves_handler.wait_held(std::slice::from_ref(first)).await,
        "held: {:?}",
        leaves_handler.held()
    );

    let stop_began = Instant::now();
    let stopping = tokio::spawn(leaves.stop());
    // The second is handed over while the newcomer stops (its batch keeps the stop going).
    stays_handler.release(second);
    // Handed over (decided before the stop), then taken again by the instance that stays: an
    // ownership of its own, a new epoch.
    let handed_epoch = lease_of(&env, second).await.owner_epoch;
    let taken = eventually(Duration::from_secs(10), || async {
        let lease = lease_of(&env, second).await;
        lease.owner.as_deref() == Some("stays") && lease.owner_epoch != handed_epoch
    })
    .await;
    let owner = lease_of(&env, second).await.owner;
    let still_stopping = !stopping.is_finished();
    println!(
        "{:.1} s into the stop: lease {second} owned by {owner:?}, still stopping {still_stopping}",
        stop_began.elapsed().as_secs_f64()
    );
    stays_handler.open();
    leaves_handler.open();
    tokio::time::timeout(Duration::from_secs(20), stopping)
        .await
        .expect("the stop completes")
        .unwrap();
    assert!(
        taken && still_stopping,
        "the lease handed over to the stopping instance was not taken while it stopped: {owner:?}"
    );
    let delivered = env.delivered_within(80, Duration::from_secs(20)).await;
    stays.stop().await;
    assert!(delivered, "missing {:?}", env.deliveries.missing(ids(0..80)));
}

/// The last checkpoint of a handoff is retried like any other (issue 59): an owner whose lease
/// container is out of reach for a moment as it hands a lease over still writes where it got to
/// before it releases the lease, and the requester delivers nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoffs_last_checkpoint_is_retried_until_it_is_written() {
    let env = Env::new(2).await;
    env.ensure_leases().await;
    let options = env.options("a");
    let acquire = options.acquire_interval;
    let gate = GateHandler::recording(Hold::Nothing, env.recorder("a"));
    let (store, processor) = env.counted_processor(options, gate.clone(), |s| s).await;
    let a = processor.start().await.unwrap();
    hold_a_batch_of_every_lease(&env, &gate, ("a", 2), 0..20).await;
    let b = env.start(env.options("b")).await;
    let asked = eventually(Duration::from_secs(10), || async {
        requested_by(&env, "b").await.len() == 1
    })
    .await;
    assert!(asked, "the newcomer asked for no lease: {:?}", env.leases().await);
    // The owner sees the request at its next listing and accepts it (its batch still held).
    tokio::time::sleep(acquire * 2).await;
    // The batches end while the owner's lease container is out of reach (under an expiration).
    store.cut_off(true);
    gate.open();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    store.cut_off(false);
    let moved = eventually(Duration::from_secs(10), || async { fair(&env.owners().await, 2, 2) }).await;
    env.write(20..30).await;
    let all = env.delivered_within(30, Duration::from_secs(20)).await;
    let duplicates = env.deliveries.duplicates();
    a.stop().await;
    b.stop().await;
    assert!(all, "missing {:?}", env.deliveries.missing(ids(0..30)));
    assert!(moved, "{:?}", env.owners().await);
    assert!(duplicates.is_empty(), "delivered twice: {duplicates:?}");
}

/// A lease whose requester stopped while its owner drained a batch is freed, not left under the
/// stopped name for an expiration (issue 59): the owner writes a requester in as the new owner
/// only while its request is still on the lease, and clears the requests of instances that left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_requester_stopped_while_its_owner_drained_is_freed() {
    let env = Env::new(2).await;
    env.ensure_leases().await;
    let with_expiration = |name: &str| {
        let mut options = env.options(name);
        options.expiration = Duration::from_secs(6);
        options
    };
    let options = with_expiration("a");
    let (acquire, expiration) = (options.acquire_interval, options.expiration);
    let gate = GateHandler::recording(Hold::Nothing, env.recorder("a"));
    let a = env.processor(options, gate.clone()).await.start().await.unwrap();
    hold_a_batch_of_every_lease(&env, &gate, ("a", 2), 0..20).await;
    let b = env.start(with_expiration("b")).await;
    let asked = eventually(Duration::from_secs(10), || async {
        requested_by(&env, "b").await.len() == 1
    })
    .await;
    assert!(asked, "the newcomer asked for no lease: {:?}", env.leases().await);
    let requested = requested_by(&env, "b").await.remove(0);
    // The owner accepts the request; the requester stops before the batch ends, and the owner
    // sees it gone.
    tokio::time::sleep(acquire * 2).await;
    b.stop().await;
    tokio::time::sleep(acquire * 2).await;
    let draining_epoch = lease_of(&env, &requested).await.owner_epoch;
    let opened = Instant::now();
    gate.open();
    // Released, then taken up again by the instance that stays (an epoch of its own).
    let back = eventually(expiration, || async {
        let lease = lease_of(&env, &requested).await;
        lease.owner.as_deref() == Some("a") && lease.owner_epoch != draining_epoch
    })
    .await;
    let after = opened.elapsed();
    let all = env.delivered_within(20, Duration::from_secs(10)).await;
    println!(
        "a lease handed over to a requester that stopped: processed again {after:?} after its batch ended (expiration {expiration:?})"
    );
    a.stop().await;
    assert!(all, "missing {:?}", env.deliveries.missing(ids(0..20)));
    assert!(
        back,
        "the lease stayed under the stopped requester's name: {:?}",
        lease_of(&env, &requested).await
    );
    assert!(
        after < expiration / 2,
        "taken up {after:?} after the batch ended, not at once"
    );
}

/// The lease tokens that carry a handoff request to `to`.
async fn requested_by(env: &Env, to: &str) -> Vec<String> {
    let leases = env.leases().await;
    let asked = leases
        .iter()
        .filter(|l| l.handoff_request().is_some_and(|(t, _)| t == to));
    asked.map(|l| l.lease_token.clone()).collect()
}

/// The lease with token `token`.
async fn lease_of(env: &Env, token: &str) -> Lease {
    let leases = env.leases().await;
    leases
        .into_iter()
        .find(|l| l.lease_token == token)
        .expect("the lease is listed")
}

/// A rolling restart while every batch takes longer than the lease expiration (issue 59 §6): the
/// new instance joins and asks for its share while the old one's batches run, then the old one
/// is stopped with every batch still in flight. Each lease moves only once its batch is
/// checkpointed: nothing delivered twice, nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_during_batches_slower_than_the_expiration_delivers_nothing_twice() {
    let env = Env::new(4).await;
    env.ensure_leases().await;
    let handler = GateHandler::recording(Hold::Nothing, env.recorder("old"));
    let options = env.options("old");
    let expiration = options.expiration;
    let old = env.processor(options, handler.clone()).await.start().await.unwrap();
    hold_a_batch_of_every_lease(&env, &handler, ("old", 4), 0..40).await;
    let new = env.start(env.options("new")).await;
    // The newcomer asks for its share while the batches run, then the old instance is stopped.
    tokio::time::sleep(expiration).await;
    let stopping = tokio::spawn(old.stop());
    tokio::time::sleep(expiration * 2).await;
    let owners_while_held = env.owners().await;
    handler.open();
    let stopped = tokio::time::timeout(Duration::from_secs(20), stopping).await;
    let moved = eventually(Duration::from_secs(20), || async {
        env.owners().await.get("new") == Some(&4)
    })
    .await;
    env.write(40..60).await;
    let all = env.delivered_within(60, Duration::from_secs(20)).await;
    let duplicates = env.deliveries.duplicates();
    println!(
        "rolling restart with batches held {:?} (expiration {expiration:?}): owners while held {owners_while_held:?}, all moved {moved}, all 60 delivered {all}, duplicates {}",
        expiration * 3,
        duplicates.len()
    );
    new.stop().await;
    assert!(
        stopped.is_ok_and(|joined| joined.is_ok()),
        "the old instance's stop did not end"
    );
    assert_eq!(
        owners_while_held.get("old"),
        Some(&4),
        "a lease was taken from its owner while it drained: {owners_while_held:?}"
    );
    assert!(moved, "{:?}", env.owners().await);
    assert!(all, "missing {:?}", env.deliveries.missing(ids(0..60)));
    assert!(duplicates.is_empty(), "delivered twice: {duplicates:?}");
}
