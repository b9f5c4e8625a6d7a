//! A deposed owner — its lease freed or taken by a write while it runs — stops handing batches to
//! its handler within a tenth of the lease expiration in every checkpoint mode that does not write
//! after each batch: a checkpoint every N batches or every interval, manual checkpoints, several
//! batches in flight. Only the batches already with the handler then finish (none is checkpointed).
//! With a checkpoint after each batch, one at a time (the defaults), the checkpoint finds the
//! change: at most one more batch. The renew and acquire intervals are long here, so neither finds
//! the change first: the bound comes from the confirmation before each delivery.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use changefeed_operator::processor::{
    Batch, ChangeHandler, CheckpointHandle, CheckpointPolicy, Handler, HandlerError, ManualCheckpointHandler,
    Processor, ProcessorHandle, ProcessorOptions,
};
use tokio::time::Instant;

use crate::common::{self, Env};

/// The lease expiration: batches are confirmed when the last confirmation is older than a tenth.
const EXPIRATION: Duration = Duration::from_secs(10);
/// Scheduling slack on a loaded machine.
const SLACK: Duration = Duration::from_millis(300);

/// Records when each batch reached the handler; each takes a moment.
#[derive(Default)]
struct Timed {
    starts: Mutex<Vec<Instant>>,
}

impl Timed {
    async fn take(&self) {
        self.starts.lock().unwrap().push(Instant::now());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    fn started_after(&self, at: Instant) -> Vec<Duration> {
        let starts = self.starts.lock().unwrap();
        starts.iter().filter(|s| **s >= at).map(|s| *s - at).collect()
    }

    fn count(&self) -> usize {
        self.starts.lock().unwrap().len()
    }
}

#[async_trait]
impl ChangeHandler for Timed {
    async fn handle(&self, _batch: Batch<'_>) -> Result<(), HandlerError> {
        self.take().await;
        Ok(())
    }
}

#[async_trait]
impl ManualCheckpointHandler for Timed {
    async fn handle(&self, _batch: Batch<'_>, _checkpoint: CheckpointHandle) -> Result<(), HandlerError> {
        // Takes the batch and checkpoints later (never, within this test).
        self.take().await;
        Ok(())
    }
}

/// Runs one instance in `mode` while documents keep coming, deposes it by writing another owner
/// into its lease, and returns when each of its batches started after the deposition (relative
/// to the moment the write was answered) and how many batches it delivered before.
async fn deposed(mode: &str, change: impl FnOnce(&mut ProcessorOptions), manual: bool) -> (Vec<Duration>, usize) {
    let env = Env::new(1).await;
    let mut options = env.options(&format!("owner-{mode}"));
    options.max_items = 5;
    options.expiration = EXPIRATION;
    options.renew_interval = Duration::from_secs(4);
    options.acquire_interval = Duration::from_secs(4);
    change(&mut options);
    let timed = Arc::new(Timed::default());
    let settings = env.settings(options.clone());
    let (monitored, leases) = changefeed_operator::worker::open(&env.account, &env.account, &settings)
        .await
        .unwrap();
    let handler = if manual {
        Handler::Manual(timed.clone())
    } else {
        Handler::Automatic(timed.clone())
    };
    let handle: ProcessorHandle = Processor::with_handler(monitored, Arc::new(leases), handler, options)
        .start()
        .await
        .unwrap();
    let writing = tokio::spawn({
        let items = env.items.clone();
        async move {
            for n in 0.. {
                common::upsert_doc(&items, n).await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
    let flowing = common::eventually(Duration::from_secs(10), || async { timed.count() >= 20 }).await;
    assert!(flowing, "{mode}: batches flow before the deposition");
    let (deposed_at, usurped) = depose(&env).await;
    let before = timed.count();
    // Long enough for the bound and several renew-free seconds of today's behaviour.
    tokio::time::sleep(EXPIRATION / 10 + Duration::from_secs(2)).await;
    writing.abort();
    let after = timed.started_after(deposed_at);
    handle.abort();
    // Nothing the deposed owner handled was checkpointed: the lease is as the usurper wrote it.
    let now = env.store().await.read(&usurped.id).await.unwrap().unwrap();
    assert_eq!(
        now.owner.as_deref(),
        Some("usurper"),
        "{mode}: the deposed owner took the lease back"
    );
    assert_eq!(
        now.etag, usurped.etag,
        "{mode}: the deposed owner wrote the lease (checkpointed?)"
    );
    (after, before)
}

/// Writes another owner into the only lease (as an operator freeing it for a pod it saw die, or
/// another instance taking it, does); the moment the write was answered, and the lease written.
async fn depose(env: &Env) -> (Instant, changefeed_operator::processor::Lease) {
    let store = env.store().await;
    for _ in 0..50 {
        let mut lease = store.snapshot().await.unwrap().leases.remove(0);
        lease.owner = Some("usurper".into());
        lease.clear_handoff();
        if let Ok(written) = store.replace(&lease).await {
            return (Instant::now(), written);
        }
    }
    panic!("could not write the lease (it kept changing)");
}

/// Asserts the bound and prints the figures.
fn check(mode: &str, in_flight: usize, (after, before): (Vec<Duration>, usize)) {
    let bound = EXPIRATION / 10 + SLACK;
    let late: Vec<&Duration> = after.iter().filter(|d| **d > bound).collect();
    println!(
        "deposed owner, {mode}: {before} batches before the deposition; {} started after it, the last {:?} after (bound {:?} + slack); {} started past the bound",
        after.len(),
        after.last(),
        EXPIRATION / 10,
        late.len()
    );
    assert!(late.is_empty(), "{mode}: batches handed over past the bound: {late:?}");
    // Within the bound: batches of ≥ 20 ms each, `in_flight` at a time, plus those in flight.
    let most = ((EXPIRATION / 10 + SLACK).as_millis() as usize / 20 + 1) * in_flight;
    assert!(
        after.len() <= most,
        "{mode}: {} batches after the deposition: {after:?}",
        after.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_owner_checkpointing_every_n_batches_stops_delivering_within_a_tenth_of_the_expiration() {
    let figures = deposed(
        "every-100-batches",
        |o| {
            o.checkpoint = CheckpointPolicy {
                every_batches: 100,
                interval: None,
            }
        },
        false,
    )
    .await;
    check("every 100 batches", 1, figures);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_owner_checkpointing_on_an_interval_stops_delivering_within_a_tenth_of_the_expiration() {
    let figures = deposed(
        "interval",
        |o| {
            o.checkpoint = CheckpointPolicy {
                every_batches: 1_000_000,
                interval: Some(Duration::from_secs(60)),
            }
        },
        false,
    )
    .await;
    check("every 60 s", 1, figures);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_owner_with_manual_checkpoints_stops_delivering_within_a_tenth_of_the_expiration() {
    let figures = deposed("manual", |_| {}, true).await;
    check("manual checkpoints", 1, figures);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_owner_with_batches_in_flight_stops_delivering_within_a_tenth_of_the_expiration() {
    let figures = deposed(
        "in-flight",
        |o| {
            o.max_in_flight_batches = 4;
            o.checkpoint = CheckpointPolicy {
                every_batches: 100,
                interval: None,
            };
        },
        false,
    )
    .await;
    check("4 batches in flight, every 100 batches", 4, figures);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_owner_checkpointing_every_batch_delivers_at_most_one_more_batch() {
    let (after, before) = deposed("every-batch", |_| {}, false).await;
    println!(
        "deposed owner, a checkpoint per batch: {before} batches before the deposition; {} started after it ({after:?})",
        after.len()
    );
    assert!(after.len() <= 1, "{after:?}");
}
