//! A lease container deleted and created again while several instances run: every instance's
//! checkpoints survive, also with `startFrom: now` (a range started again from "now" would skip
//! what was written since its last checkpoint).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use changefeed_operator::cosmos::{DocumentContainer, StartFrom};
use changefeed_operator::processor::ProcessorHandle;
use changefeed_operator::processor::leases::bootstrap::bootstrap;
use tokio_util::sync::CancellationToken;

use crate::common::{self, Env, eventually, ids, upsert_doc};

/// Writes `doc-0`, `doc-1`, ... (four at a time, about 100 a second) until stopped.
struct Writer {
    written: Arc<AtomicUsize>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    fn start(items: DocumentContainer) -> Self {
        let written = Arc::new(AtomicUsize::new(0));
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let (written, stop) = (written.clone(), stop.clone());
            async move {
                while !stop.is_cancelled() {
                    let next = written.load(Ordering::SeqCst);
                    futures::future::join_all((next..next + 4).map(|n| upsert_doc(&items, n))).await;
                    written.store(next + 4, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(40)).await;
                }
            }
        });
        Self { written, stop, task }
    }

    fn written(&self) -> usize {
        self.written.load(Ordering::SeqCst)
    }

    /// Waits until `more` documents were written after this call.
    async fn write_more(&self, more: usize) {
        let target = self.written() + more;
        assert!(eventually(Duration::from_secs(30), || async { self.written() >= target }).await);
    }

    /// Stops writing; returns how many documents were written.
    async fn finish(self) -> usize {
        self.stop.cancel();
        self.task.await.unwrap();
        self.written.load(Ordering::SeqCst)
    }
}

/// Three instances starting from "now" sharing four leases, each with checkpoints, and a writer.
async fn running(env: &Env) -> (Vec<ProcessorHandle>, Writer) {
    let mut handles = Vec::new();
    for name in ["a", "b", "c"] {
        let mut options = env.options(name);
        options.start_from = StartFrom::Now;
        options.max_items = 10;
        handles.push(env.start(options).await);
    }
    // Every document is written after the leases were anchored at "now".
    let writer = Writer::start(env.items.clone());
    // Each lease processed by a lease task (not on its way from one instance to another: a lease
    // in a handoff when the container goes has nobody to write it back) and checkpointed.
    let settled = eventually(Duration::from_secs(20), || async {
        let owned: Vec<usize> = handles.iter().map(|h| h.monitor().owned_leases()).collect();
        let leases = env.leases().await;
        owned.iter().sum::<usize>() == 4
            && owned.iter().all(|n| *n > 0)
            && leases
                .iter()
                .all(|l| l.checkpoint_time.is_some() && l.handoff_request().is_none())
    })
    .await;
    assert!(settled, "three owners with checkpoints: {:?}", env.owners().await);
    (handles, writer)
}

/// [`running`], then deletes the lease container, waits until every instance reports it, with
/// documents written meanwhile, and creates it again (empty).
async fn lease_container_deleted_and_back(env: &Env) -> (Vec<ProcessorHandle>, Writer) {
    let (handles, writer) = running(env).await;
    env.account.delete_container(common::DB, common::LEASES).await.unwrap();
    let reported = eventually(Duration::from_secs(10), || async {
        handles.iter().all(|h| h.monitor().read_problem().is_some())
    })
    .await;
    assert!(reported, "every instance reports the missing lease container");
    writer.write_more(200).await;
    env.ensure_leases().await;
    (handles, writer)
}

/// Writes on, stops the writer and checks that every document arrived: (written, lost, ids
/// delivered more than once, deliveries beyond one per document).
async fn settle(env: &Env, handles: Vec<ProcessorHandle>, writer: Writer) -> (usize, usize, usize, usize) {
    writer.write_more(200).await;
    let written = writer.finish().await;
    env.delivered_within(written, Duration::from_secs(30)).await;
    let lost = env.deliveries.missing(ids(0..written)).len();
    let duplicates = env.deliveries.duplicates().len();
    let extra = env.deliveries.total() - env.deliveries.distinct();
    for handle in handles {
        handle.stop().await;
    }
    (written, lost, duplicates, extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_instance_keeps_its_checkpoints_when_the_lease_container_comes_back() {
    let env = Env::new(4).await;
    let (handles, writer) = lease_container_deleted_and_back(&env).await;
    let (written, lost, duplicates, extra) = settle(&env, handles, writer).await;
    let leases = env.leases().await;
    println!(
        "lease container deleted and created again under 3 instances (start from now, 4 leases, maxItems 10): written {written}, lost {lost}, duplicates {duplicates} documents ({extra} extra deliveries), leases {} owned {}",
        leases.len(),
        leases.iter().filter(|l| l.owner.is_some()).count()
    );
    assert_eq!(lost, 0, "documents written while the leases were missing were skipped");
    assert!(
        extra <= 4 * 10,
        "more than the batch in flight per lease delivered again: {extra}"
    );
    assert_eq!(leases.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_before_the_instances_write_back_loses_none_of_their_checkpoints() {
    let env = Env::new(4).await;
    let (handles, writer) = lease_container_deleted_and_back(&env).await;
    // Someone who knows nothing of the running instances (the operator's estimator, an instance
    // starting now) finds the lease set empty and creates every lease from "now".
    let mut options = env.options("operator");
    options.start_from = StartFrom::Now;
    let monitored = env.account.monitored(common::DB, common::ITEMS).await.unwrap();
    bootstrap(env.store().await.as_ref(), &monitored, &options)
        .await
        .unwrap();
    let (written, lost, duplicates, extra) = settle(&env, handles, writer).await;
    println!(
        "lease container created again and bootstrapped from now before 3 instances wrote their leases back: written {written}, lost {lost}, duplicates {duplicates} documents ({extra} extra deliveries)"
    );
    assert_eq!(
        lost, 0,
        "a write-back met a lease created from now and dropped its checkpoint"
    );
}
