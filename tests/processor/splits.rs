//! Splits: the parent lease is replaced by its children and nothing is lost.

use std::time::Duration;

use changefeed_operator::bench::CountingStore;
use changefeed_operator::processor::LeaseEvent;

use super::while_writing;
use crate::common::{self, Env, eventually, fair, ids};

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
    let partitions = while_writing(
        &env,
        1000..4000,
        env.emulator
            .split(common::DB, common::ITEMS, None, Duration::from_millis(200)),
    )
    .await
    .unwrap();
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
    // As the .NET processor writes them: each lease over a whole partition is version 0, named
    // by its partition key range id — the split's children too.
    for lease in env.leases().await {
        let partition = partitions.iter().find(|p| Some(&p.range) == lease.range());
        assert_eq!(
            (lease.version, Some(lease.lease_token.as_str())),
            (0, partition.map(|p| p.id.as_str())),
            "lease {} is not the version-0 lease of its partition",
            lease.id
        );
    }
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
    let partitions = while_writing(
        &env,
        1000..2000,
        env.emulator
            .split(common::DB, common::ITEMS, None, Duration::from_millis(200)),
    )
    .await
    .unwrap();
    let delivered = env.delivered_within(2000, Duration::from_secs(40)).await;
    let missing = env.deliveries.missing(ids(0..2000));
    // The lease across the split point is split when it next reads (a recording that fails is
    // retried with back-off, so a loaded machine may need a while).
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

/// A deposed owner splits nothing (issue 59): its lease taken meanwhile (written here as another
/// instance would; its listings answer late, so only the split itself can find out), a split of
/// its partition makes it create no child lease and leaves the parent, which is the new
/// owner's, where it is — children are created only after a fenced write of the parent, and undone
/// when the parent turns out lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_owner_splits_nothing() {
    let env = Env::new(1).await;
    let slow_listings = |store: CountingStore| store.with_slow_listings(Duration::from_secs(3));
    let (_, processor) = env
        .counted_processor(env.options("a"), env.recorder("a"), slow_listings)
        .await;
    let a = processor.start().await.unwrap();
    let owns = eventually(Duration::from_secs(15), || async {
        env.owners().await.get("a") == Some(&1)
    })
    .await;
    assert!(owns, "{:?}", env.owners().await);
    env.write(0..10).await;
    assert!(env.delivered_within(10, Duration::from_secs(10)).await);
    let mut lease = env.leases().await.remove(0);
    lease.owner = Some("usurper".into());
    lease.owner_epoch = Some("usurper.1".into());
    env.store().await.replace(&lease).await.unwrap();
    env.emulator
        .split(common::DB, common::ITEMS, None, Duration::from_millis(200))
        .await
        .unwrap();
    env.write(10..20).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let leases = env.leases().await;
    a.stop().await;
    let owners: Vec<(String, Option<String>)> = leases
        .iter()
        .map(|l| (l.lease_token.clone(), l.owner.clone()))
        .collect();
    println!("after a split under a deposed owner: {owners:?}");
    assert!(
        leases.iter().all(|l| l.owner.as_deref() != Some("a")),
        "the deposed owner created children: {owners:?}"
    );
    assert!(
        leases
            .iter()
            .any(|l| l.id == lease.id && l.owner.as_deref() == Some("usurper")),
        "the new owner's lease is gone: {owners:?}"
    );
}

/// What became of a split begun by a crashed instance: whether the lease set ended as the two
/// partitions, each owned by the successor, and the documents written after the crash missing.
struct SplitTakenUp {
    finished: bool,
    missing: usize,
}

/// A split that a crashed instance "w" began — one child lease written (owned by
/// `child_owner`: its own name, a name no process has any more, or none once the operator
/// evicted it), the parent left — taken up by instance `successor`.
async fn a_split_begun_by_a_crash(child_owner: Option<&str>, successor: &str) -> SplitTakenUp {
    let env = Env::new(1).await;
    let first = env.start_owning_all("w", 1).await;
    env.write(0..300).await;
    assert!(env.delivered_within(300, Duration::from_secs(20)).await);
    first.abort();
    let mut partitions = env
        .emulator
        .split(common::DB, common::ITEMS, None, Duration::from_millis(200))
        .await
        .unwrap();
    partitions.sort_by(|a, b| a.range.cmp(&b.range));
    let store = env.store().await;
    let parent = env.leases().await.remove(0);
    let begun = &partitions[0];
    let mut child = if parent.names_a_partition() {
        changefeed_operator::processor::Lease::for_partition(
            store.prefix(),
            &begun.id,
            &begun.range,
            parent.continuation.clone(),
        )
    } else {
        changefeed_operator::processor::Lease::new(store.prefix(), &begun.range, parent.continuation.clone())
    };
    if let Some(owner) = child_owner {
        child.take_for(owner, "crashed-incarnation.7".into());
    }
    child.timestamp = Some(time::OffsetDateTime::now_utc());
    store.create(&child).await.unwrap();
    env.deliveries.clear();
    env.write(300..800).await;
    let second = env.start(env.options(successor)).await;
    let finished = eventually(Duration::from_secs(30), || async {
        let leases = env.leases().await;
        let mut ranges: Vec<_> = leases.iter().filter_map(|l| l.range().cloned()).collect();
        ranges.sort();
        let want: Vec<_> = partitions.iter().map(|p| p.range.clone()).collect();
        ranges == want && leases.iter().all(|l| l.owner.as_deref() == Some(successor))
    })
    .await;
    env.delivered_within(500, Duration::from_secs(20)).await;
    let missing = env.deliveries.missing(ids(300..800)).len();
    println!(
        "a split begun by a crashed instance, its child owned by {child_owner:?}, taken up by {successor:?}: finished {finished}, leases {:?}, 500 written, {} delivered distinct, lost {missing}",
        env.leases()
            .await
            .iter()
            .map(|l| (l.lease_token.clone(), l.owner.clone()))
            .collect::<Vec<_>>(),
        env.deliveries.distinct(),
    );
    second.stop().await;
    SplitTakenUp { finished, missing }
}

/// A split that a crashed predecessor of the same name began is finished by its successor: the
/// child is taken over (it is the name's, and this process holds the name), the other child
/// created, the parent deleted, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_a_crashed_predecessor_began_is_finished_by_its_successor() {
    let taken_up = a_split_begun_by_a_crash(Some("w"), "w").await;
    assert!(taken_up.finished, "the split was not finished");
    assert_eq!(taken_up.missing, 0);
}

/// A split that a crashed instance began is finished by whichever instance takes the parent —
/// also under another name (the pod replaced), the child owned by the crashed one's name, or by
/// none (the operator evicted the crashed instance): the child is taken over once it is free,
/// and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_a_crashed_instance_began_is_finished_by_another_instance() {
    for child_owner in [Some("w"), None] {
        let taken_up = a_split_begun_by_a_crash(child_owner, "x").await;
        assert!(
            taken_up.finished,
            "the split was not finished (child owned by {child_owner:?})"
        );
        assert_eq!(taken_up.missing, 0, "child owned by {child_owner:?}");
    }
}
