//! An owner that ignores handoff requests (an older version during a rolling upgrade, another
//! tool) and checkpoints all the time cannot keep a lease forever: the instance that asked for it
//! takes it a lease expiration later, even though every listing it plans from is out of date by
//! the time it writes (a 412 is re-read and retried while the owner is the same).

use std::sync::Arc;
use std::time::Duration;

use changefeed_operator::bench::CountingStore;
use changefeed_operator::processor::LeaseStore;

use crate::common::{self, Env};

/// Rewrites every lease of `owner` (keeping what is in it, as a processor that does not know
/// handoff requests but keeps lease properties does) every few milliseconds until aborted.
fn checkpoint_all_the_time(store: Arc<dyn LeaseStore>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if let Ok(snapshot) = store.snapshot().await {
                for mut lease in snapshot.leases {
                    if lease.owner.as_deref() == Some("old") {
                        lease.timestamp = Some(time::OffsetDateTime::now_utc());
                        let _ = store.replace(&lease).await;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_taken_from_an_owner_that_ignores_handoffs_while_it_checkpoints_all_the_time() {
    let env = Env::new(2).await;
    env.ensure_leases().await;
    // "old" takes both leases, then stops answering handoff requests (its task is gone) while
    // its leases keep changing.
    let old = env.start_owning_all("old", 2).await;
    old.abort();
    let owner = checkpoint_all_the_time(env.store().await);

    // The newcomer's listings arrive 50 ms after they read: always older than the last write.
    let options = env.options("new");
    let expiration = options.expiration;
    let slow_listings = |store: CountingStore| store.with_slow_listings(Duration::from_millis(50));
    let (_, processor) = env.counted_processor(options, env.recorder("new"), slow_listings).await;
    let started = std::time::Instant::now();
    let new = processor.start().await.unwrap();
    let taken = common::eventually(expiration * 4, || async { env.owners().await.get("new") == Some(&1) }).await;
    let took = started.elapsed();
    owner.abort();
    println!(
        "an owner rewriting its leases every 5 ms and ignoring handoff requests, listings 50 ms stale: the newcomer took its fair share {taken} after {took:.1?} (expiration {expiration:?}); owners {:?}",
        env.owners().await
    );
    new.abort();
    assert!(
        taken,
        "the lease stayed with the owner that ignores requests: {:?}",
        env.owners().await
    );
}
