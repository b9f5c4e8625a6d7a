//! A graceful stop that outlasts an acquire cycle (a batch in flight, a lease container at its
//! budget releasing one lease at a time): the instances that stay take the leases it has
//! released while it is still stopping. A stopping instance is not counted as a live one with a
//! share of its own, or the fair shares would send it every lease it frees, to lie unprocessed.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use changefeed_operator::processor::{Batch, ChangeHandler, HandlerError, Lease};

use crate::common::{self, Env, eventually, ids};

/// Records deliveries; once armed, the next batch waits until `release` is notified.
struct HoldsNextBatch {
    inner: Arc<common::RecordingHandler>,
    armed: AtomicBool,
    held: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl ChangeHandler for HoldsNextBatch {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.held.notify_one();
            self.release.notified().await;
        }
        self.inner.handle(batch).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leases_a_stopping_instance_released_are_taken_while_its_stop_waits_for_a_batch() {
    let env = Env::new(4).await;
    env.ensure_leases().await;
    let stays = env.start_owning_all("stays", 4).await;
    let handler = Arc::new(HoldsNextBatch {
        inner: env.recorder("leaves"),
        armed: AtomicBool::new(false),
        held: tokio::sync::Notify::new(),
        release: tokio::sync::Notify::new(),
    });
    let options = env.options("leaves");
    let acquire = options.acquire_interval;
    let leaves = env.processor(options, handler.clone()).await.start().await.unwrap();
    let fair = eventually(Duration::from_secs(10), || async {
        let owners = env.owners().await;
        owners.get("stays") == Some(&2) && owners.get("leaves") == Some(&2)
    })
    .await;
    assert!(fair, "no fair share: {:?}", env.owners().await);

    handler.armed.store(true, Ordering::SeqCst);
    env.write(0..40).await;
    tokio::time::timeout(Duration::from_secs(10), handler.held.notified())
        .await
        .expect("a batch of the instance that leaves is in its handler");
    let stop_began = Instant::now();
    let stopping = tokio::spawn(leaves.stop());
    // Its other lease is released at once; the one whose batch is held stays its own.
    let taken = eventually(acquire * 8, || async { env.owners().await.get("stays") == Some(&3) }).await;
    let owners = env.owners().await;
    let still_stopping = !stopping.is_finished();
    handler.release.notify_one();
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

/// Holds every batch while `holding` is set, until the batch's lease is released.
struct HoldsLeases {
    inner: Arc<common::RecordingHandler>,
    holding: AtomicBool,
    held: tokio::sync::watch::Sender<BTreeSet<String>>,
    released: tokio::sync::watch::Sender<BTreeSet<String>>,
}

impl HoldsLeases {
    fn new(inner: Arc<common::RecordingHandler>, holding: bool) -> Arc<Self> {
        Arc::new(Self {
            inner,
            holding: AtomicBool::new(holding),
            held: tokio::sync::watch::channel(BTreeSet::new()).0,
            released: tokio::sync::watch::channel(BTreeSet::new()).0,
        })
    }

    /// Waits (at most 10 s) until a batch of each of `tokens` is held.
    async fn wait_held(&self, tokens: &[String]) -> bool {
        let mut held = self.held.subscribe();
        let all = held.wait_for(|held| tokens.iter().all(|t| held.contains(t)));
        tokio::time::timeout(Duration::from_secs(10), all)
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The leases whose batch is held now.
    fn held(&self) -> Vec<String> {
        self.held.borrow().iter().cloned().collect()
    }

    /// Lets the held batch of `token` (and any later one) go.
    fn release(&self, token: &str) {
        self.released.send_modify(|r| {
            r.insert(token.to_owned());
        });
    }
}

#[async_trait::async_trait]
impl ChangeHandler for HoldsLeases {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        let token = batch.lease_token.to_owned();
        if self.holding.load(Ordering::SeqCst) && !self.released.borrow().contains(&token) {
            let mut released = self.released.subscribe();
            self.held.send_modify(|h| {
                h.insert(token.clone());
            });
            let _ = released.wait_for(|r| r.contains(&token)).await;
            self.held.send_modify(|h| {
                h.remove(&token);
            });
        }
        self.inner.handle(batch).await
    }
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
    let stays_handler = HoldsLeases::new(env.recorder("stays"), true);
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

    let leaves_handler = HoldsLeases::new(env.recorder("leaves"), false);
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
    leaves_handler.holding.store(true, Ordering::SeqCst);
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
    stays_handler.holding.store(false, Ordering::SeqCst);
    tokens.iter().for_each(|t| stays_handler.release(t));
    leaves_handler.release(first);
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
