//! Stalled leases: a lease whose owner keeps it alive but whose reader no longer advances (a
//! handler call or a change feed read that never returns) is detected after the stall timeout,
//! logged, counted and recorded on the lease; its reader is restarted from the checkpoint once,
//! and if it stays stalled the lease is released so that another instance can try. An idle lease
//! and a slow lease that advances raise no alarm.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use changefeed_operator::processor::{
    Batch, ChangeHandler, CloseReason, HandlerError, LeaseEvent, LeaseStore, ProcessorHandle, ProcessorOptions,
};
use tokio::time::Instant;

use crate::common::{self, Env, eventually};
use crate::faults::{connect, metric_sum, receiver, wait_delivered, worker_with, write};

const STALL: Duration = Duration::from_millis(1500);

/// A handler whose calls never return; counts them.
#[derive(Default)]
struct NeverReturns {
    calls: AtomicUsize,
}

#[async_trait]
impl ChangeHandler for NeverReturns {
    async fn handle(&self, _batch: Batch<'_>) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
}

/// A handler that takes `delay` per batch and records what it handled.
struct Slow {
    delay: Duration,
    inner: Arc<common::RecordingHandler>,
}

#[async_trait]
impl ChangeHandler for Slow {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        tokio::time::sleep(self.delay).await;
        self.inner.handle(batch).await
    }
}

fn options(env: &Env, name: &str) -> ProcessorOptions {
    let mut options = env.options(name);
    options.stall_timeout = STALL;
    options
}

/// The `stalled` property of the only lease, if set.
async fn stalled_note(env: &Env) -> Option<String> {
    env.leases().await.first()?.properties.get("stalled").cloned()
}

/// The close reasons `handle` published so far.
fn closed(events: &mut tokio::sync::broadcast::Receiver<LeaseEvent>) -> Vec<CloseReason> {
    std::iter::from_fn(|| events.try_recv().ok())
        .filter_map(|e| match e {
            LeaseEvent::Closed { reason, .. } => Some(reason),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_never_returns_is_restarted_once_then_its_lease_released_to_another_instance() {
    let env = Env::new(1).await;
    let hung = Arc::new(NeverReturns::default());
    let a = env
        .processor(options(&env, "a"), hung.clone())
        .await
        .start()
        .await
        .unwrap();
    let owned = eventually(Duration::from_secs(10), || async {
        env.owners().await.get("a") == Some(&1)
    })
    .await;
    assert!(owned, "a did not take the lease: {:?}", env.owners().await);
    let mut events = a.subscribe();
    let b: ProcessorHandle = env.start(options(&env, "b")).await;
    let written = Instant::now();
    env.write(0..10).await;
    // Restarted once: the batch goes to the handler again, and the lease says it is stalled —
    // the restart's write of the position the empty pages before the batch moved is no
    // progress, and does not erase the record (until the release, a stall timeout later).
    let restarted = eventually(Duration::from_secs(10), || async {
        hung.calls.load(Ordering::SeqCst) >= 2
    })
    .await;
    assert!(
        restarted,
        "the reader was not restarted (handler calls {}, owners {:?})",
        hung.calls.load(Ordering::SeqCst),
        env.owners().await
    );
    let restarted_after = written.elapsed();
    let note = stalled_note(&env).await;
    println!("restarted after {restarted_after:?}: {note:?}");
    assert!(note.is_some(), "the stall record was erased by the restart");
    // While it is stalled, the lease says so: where, since when, doing what.
    let note = note.unwrap_or_default();
    assert!(note.starts_with("on a at "), "{note}");
    // The batch in the handler: the 10 documents, or those written by the time its page was read.
    assert!(
        note.contains("in the handler for") && note.contains(" documents)"),
        "{note}"
    );
    // Released after the restart did not help; b takes it and delivers everything once.
    assert!(
        env.delivered_within(10, Duration::from_secs(15)).await,
        "b did not deliver: {:?} (owners {:?})",
        env.deliveries.ids(),
        env.owners().await
    );
    let delivered_after = written.elapsed();
    assert_eq!(env.deliveries.delivered_by("b"), 10);
    assert!(env.deliveries.duplicates().is_empty());
    assert_eq!(
        hung.calls.load(Ordering::SeqCst),
        2,
        "the batch, and once more after the restart"
    );
    assert!(closed(&mut events).contains(&CloseReason::Stalled));
    println!("restarted once, released, delivered by b {delivered_after:?} after the write");
    // b's checkpoint clears the record.
    let cleared = eventually(Duration::from_secs(5), || async { stalled_note(&env).await.is_none() }).await;
    assert!(cleared, "the stall record stayed: {:?}", stalled_note(&env).await);
    a.abort();
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_lease_and_a_slow_lease_that_advances_raise_no_alarm() {
    let env = Env::new(2).await;
    let mut options = options(&env, "a");
    options.max_items = 5;
    let slow = Arc::new(Slow {
        delay: Duration::from_millis(600),
        inner: env.recorder("a"),
    });
    let a = env.processor(options, slow).await.start().await.unwrap();
    let owned = eventually(Duration::from_secs(10), || async {
        env.owners().await.get("a") == Some(&2)
    })
    .await;
    assert!(owned, "a did not take the leases: {:?}", env.owners().await);
    let mut events = a.subscribe();
    // Idle for three stall timeouts.
    tokio::time::sleep(STALL * 3).await;
    // Then a backlog that takes several stall timeouts to work through, 600 ms a batch of 5.
    env.write(0..60).await;
    let started = Instant::now();
    assert!(env.delivered_within(60, Duration::from_secs(30)).await);
    println!("60 documents in 5-document batches of 600 ms: {:?}", started.elapsed());
    assert!(
        started.elapsed() > STALL * 2,
        "the backlog was not slow enough to test anything"
    );
    assert!(!closed(&mut events).contains(&CloseReason::Stalled));
    let notes: Vec<_> = env
        .leases()
        .await
        .into_iter()
        .filter_map(|l| l.properties.get("stalled").cloned())
        .collect();
    assert!(notes.is_empty(), "false alarm: {notes:?}");
    a.stop().await;
}

/// A healthy handler slower than the stall timeout is not stalled while each batch is within
/// its handler timeout: every batch goes to the handler once (a stall restart would hand it
/// over again) and the lease advances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_slower_than_the_stall_timeout_within_its_handler_timeout_is_not_a_stall() {
    use crate::http_handler::{Endpoint, config};
    use changefeed_operator::processor::{HttpFormat, HttpHandler};
    let env = Env::new(1).await;
    let per_batch = STALL + Duration::from_millis(700);
    let endpoint = Endpoint::start(Arc::new(move |_, _| (200, None, per_batch))).await;
    let handler = HttpHandler::new(config(&endpoint.url, HttpFormat::Json, Duration::from_secs(30))).unwrap();
    let mut options = options(&env, "a");
    options.max_items = 5;
    let a = env.processor(options, Arc::new(handler)).await.start().await.unwrap();
    let mut events = a.subscribe();
    env.write(0..15).await;
    let delivered = eventually(Duration::from_secs(30), || async { endpoint.delivered().len() >= 15 }).await;
    let batches: Vec<String> = endpoint
        .requests()
        .iter()
        .map(|r| r.body["batch"].as_str().unwrap_or_default().to_owned())
        .collect();
    let mut distinct = batches.clone();
    distinct.sort();
    distinct.dedup();
    let closes = closed(&mut events);
    println!(
        "batches of {per_batch:?}, stall timeout {STALL:?}, handler timeout 30 s: {} requests for {} batches, delivered {} of 15, closes {closes:?}",
        batches.len(),
        distinct.len(),
        endpoint.delivered().len()
    );
    assert!(delivered, "the lease did not advance");
    assert_eq!(
        batches.len(),
        distinct.len(),
        "a batch was handed over again: {batches:?}"
    );
    assert!(!closes.contains(&CloseReason::Stalled), "{closes:?}");
    assert_eq!(stalled_note(&env).await, None);
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_change_feed_read_that_never_returns_is_reported_and_heals_once_reads_answer() {
    let (mut emulator, endpoint) = common::start_emulator("db/items:/pk:1").await;
    let (account, items) = connect(&endpoint).await;
    let (url, seen, _) = receiver().await;
    let port = common::free_port();
    let mut worker = worker_with(&endpoint, &url, "h0", port, &["--stall-timeout", "3s"]);
    write(&items, 0..10).await;
    assert!(
        wait_delivered(&seen, 10, Duration::from_secs(30)).await,
        "nothing delivered"
    );
    // Every change feed read of the one partition now hangs, unanswered.
    common::emulator_control(&endpoint, reqwest::Method::POST, "hang?partition=0").await;
    write(&items, 10..20).await;
    let stalled = eventually(Duration::from_secs(20), || async {
        metric_sum(port, "cfp_lease_stalled").await >= 1.0
    })
    .await;
    assert!(stalled, "cfp_lease_stalled did not rise");
    let restarted = metric_sum(port, "cfp_lease_stalls_total{action=\"restarted\"").await;
    // The lease (what the operator's estimate reads) says so, with what the reader was doing.
    let store = common::lease_store(&account, "faults").await.expect("lease store");
    let leases = store.snapshot().await.expect("listing").leases;
    let note = leases[0].properties.get("stalled").cloned().unwrap_or_default();
    println!("stalled: restarted {restarted}, the lease says {note:?}");
    assert_eq!(restarted, 1.0);
    assert!(
        note.starts_with("on h0 at ") && note.contains("in a change feed read"),
        "{note}"
    );
    // Reads answer again: the held read returns, the lease advances, the report is cleared.
    let held = common::emulator_control(&endpoint, reqwest::Method::DELETE, "hang").await;
    println!("reads held by the emulator: {}", held["held"]);
    assert!(wait_delivered(&seen, 20, Duration::from_secs(30)).await, "not healed");
    let cleared = eventually(Duration::from_secs(10), || async {
        metric_sum(port, "cfp_lease_stalled").await == 0.0
    })
    .await;
    assert!(cleared, "cfp_lease_stalled stayed up");
    common::terminate(&mut worker).await;
    common::terminate(&mut emulator).await;
}
