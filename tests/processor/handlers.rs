//! Handlers: failing, panicking and slow handlers, in-flight batches, and the all-versions mode.

use std::sync::Arc;
use std::time::Duration;

use changefeed_operator::processor::{Batch, ChangeHandler, CloseReason, HandlerError, LeaseEvent};

use crate::common::gate::{GateHandler, Hold};
use crate::common::{self, Env, eventually, ids, upsert_doc};

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
    let processor = env.processor(options, handler.clone()).await;
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

/// One lease of 100 documents in write order (10 per batch) whose first batch hangs: how many
/// other documents were handled while it hung, and the checkpoint then.
async fn slow_first_batch(
    env: &Env,
    in_flight: u32,
) -> (usize, Option<String>, changefeed_operator::processor::ProcessorHandle) {
    let mut options = env.options(&format!("slow{in_flight}"));
    options.max_items = 10;
    options.max_in_flight_batches = in_flight;
    let handler = GateHandler::recording(Hold::Document("doc-5".into()), env.recorder(&options.instance));
    let handle = env.processor(options, handler.clone()).await.start().await.unwrap();
    assert!(handler.wait_held_count(1).await, "the slow batch reached the handler");
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
    let handler = GateHandler::recording(Hold::Document("doc-5".into()), env.recorder("ahead"));
    let reads = Arc::new(ReadCounter::default());
    let handle = env
        .processor(options, handler.clone())
        .await
        .with_observer(reads.clone())
        .start()
        .await
        .unwrap();
    assert!(
        handler.wait_held_count(1).await,
        "the first batch (doc-5 among doc-0..9) reached the handler"
    );
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
    handler.open();
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
