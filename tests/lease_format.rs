//! The lease format (issue 39 §1, §3): lease sets written by earlier versions of this project —
//! version-1 (EPK) leases over whole partitions — keep working and are rewritten in place as
//! version-0 leases when a worker of this version acquires them: same continuation, no lease
//! moved to another instance, nothing read again.

use std::time::Duration;

use changefeed_operator::processor::Lease;

use crate::common::{self, Env, eventually, ids};

/// Writes the lease set an earlier version's bootstrap wrote after `written` documents were
/// handled: one version-1 lease per partition, at each partition's current position, owned by
/// `owner` (gone: its heartbeat is not there).
async fn earlier_version_lease_set(env: &Env, owner: &str) -> Vec<Lease> {
    env.ensure_leases().await;
    let store = env.store().await;
    let monitored = env.account.monitored(common::DB, common::ITEMS).await.unwrap();
    let mut written = Vec::new();
    for range in monitored.feed_ranges(true).await.unwrap() {
        // The position after everything written so far: an empty read from "now".
        let mut reader = monitored
            .reader(&range, None, changefeed_operator::cosmos::StartFrom::Now, 1)
            .await
            .unwrap();
        let page = reader.next_page(Duration::from_secs(10)).await.unwrap();
        let continuation = page.continuations[0].continuation.clone();
        let mut lease = Lease::new(store.prefix(), &range, Some(continuation));
        lease.owner = Some(owner.to_owned());
        lease.timestamp = Some(time::OffsetDateTime::now_utc() - time::Duration::minutes(5));
        written.push(store.create(&lease).await.unwrap().expect("created"));
    }
    store
        .mark_initialized(&format!("{}/{}", common::DB, common::ITEMS), 1)
        .await
        .unwrap();
    written
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_versions_lease_set_is_rewritten_in_place_as_version_0() {
    let env = Env::new(3).await;
    env.write(0..100).await;
    let old = earlier_version_lease_set(&env, "old-pod").await;
    assert!(old.iter().all(|l| l.version == 1 && l.lease_token.contains('-')));
    env.write(100..200).await;
    let handle = env.start(env.options("new-pod")).await;
    let rewritten = eventually(Duration::from_secs(20), || async {
        let leases = env.leases().await;
        leases.len() == 3 && leases.iter().all(|l| l.version == 0)
    })
    .await;
    let leases = env.leases().await;
    assert!(
        rewritten,
        "not rewritten: {:?}",
        leases.iter().map(|l| (&l.lease_token, l.version)).collect::<Vec<_>>()
    );
    assert!(env.delivered_within(100, Duration::from_secs(20)).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let missing = env.deliveries.missing(ids(100..200));
    let early = env
        .deliveries
        .ids()
        .iter()
        .filter(|id| ids(0..100).contains(id))
        .count();
    println!(
        "earlier version's lease set (3 version-1 leases): rewritten as {:?}; 100 written after its checkpoints: lost {}, delivered from before {early}, twice {}",
        leases.iter().map(|l| l.lease_token.as_str()).collect::<Vec<_>>(),
        missing.len(),
        env.deliveries.duplicates().len()
    );
    handle.stop().await;
    assert!(missing.is_empty(), "lost {missing:?}");
    assert_eq!(early, 0, "documents handled under the old leases were read again");
    for lease in &leases {
        let before = old.iter().find(|o| o.range() == lease.range()).expect("same ranges");
        assert!(lease.id.ends_with(&format!("..{}", lease.lease_token)));
        assert_ne!(before.id, lease.id);
    }
}

/// A rewrite whose old document could not be deleted leaves two leases over one range, and then
/// its instance crashes: of the two instances that come next, neither takes the one given way
/// while the other reads the one kept — each change is read once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_leases_left_over_one_range_by_a_crash_are_read_as_one() {
    let env = Env::new(2).await;
    env.write(0..100).await;
    earlier_version_lease_set(&env, "old-pod").await;
    let (store, processor) = env
        .counted_processor(env.options("a"), env.recorder("a"), |store| store)
        .await;
    store.fail_deletes(true);
    let a = processor.start().await.unwrap();
    let both = eventually(Duration::from_secs(20), || async {
        let leases = env.leases().await;
        leases.iter().filter(|l| l.version == 0).count() == 2 && leases.len() == 4
    })
    .await;
    assert!(
        both,
        "not rewritten beside the old leases: {:?}",
        tokens(&env.leases().await)
    );
    a.abort();
    env.write(100..300).await;
    let b = env.start(env.options("b")).await;
    let c = env.start(env.options("c")).await;
    let one_each = eventually(Duration::from_secs(20), || async { env.leases().await.len() == 2 }).await;
    let delivered = env.delivered_within(200, Duration::from_secs(20)).await;
    let leases = env.leases().await;
    let missing = env.deliveries.missing(ids(100..300));
    let twice = env.deliveries.duplicates();
    println!(
        "a rewrite whose old leases could not be deleted, then a crash: leases after {:?}; 200 written after: lost {}, twice {}",
        tokens(&leases),
        missing.len(),
        twice.len()
    );
    b.stop().await;
    c.stop().await;
    assert!(one_each, "both leases of a range survive: {:?}", tokens(&leases));
    assert!(delivered && missing.is_empty(), "lost {missing:?}");
    assert!(twice.is_empty(), "read twice: {twice:?}");
}

fn tokens(leases: &[Lease]) -> Vec<(&str, u32)> {
    leases.iter().map(|l| (l.lease_token.as_str(), l.version)).collect()
}
