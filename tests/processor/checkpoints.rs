//! Checkpoints: restarts resume from them, the start position is anchored, the checkpoint
//! policy, and manual checkpoints.

use std::sync::Arc;
use std::time::Duration;

use changefeed_operator::processor::{Batch, HandlerError, LeaseEvent, LeaseStore};

use crate::common::{self, Env, eventually, ids, upsert_doc};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_from_the_checkpoints() {
    let env = Env::new(4).await;
    let a = env.start(env.options("a")).await;
    env.write(0..1000).await;
    assert!(env.delivered_within(1000, Duration::from_secs(20)).await);
    a.stop().await;
    env.deliveries.clear();
    env.write(1000..1500).await;
    let again = env.start(env.options("a2")).await;
    assert!(env.delivered_within(500, Duration::from_secs(20)).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let replayed: Vec<String> = env
        .deliveries
        .ids()
        .into_iter()
        .filter(|id| ids(0..1000).contains(id))
        .collect();
    let missing = env.deliveries.missing(ids(1000..1500));
    println!(
        "restart: after the restart delivered {} distinct, of them {} written before the stop, lost {}",
        env.deliveries.distinct(),
        replayed.len(),
        missing.len()
    );
    assert!(missing.is_empty());
    assert!(replayed.is_empty(), "replayed {replayed:?}");
    again.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_from_now_is_anchored_when_the_leases_are_created() {
    let env = Env::new(4).await;
    env.write(0..300).await;
    let mut options = env.options("a");
    options.start_from = changefeed_operator::cosmos::StartFrom::Now;
    // Slow first acquire: documents written right after start must not be skipped even though no
    // lease is read yet.
    options.acquire_interval = Duration::from_secs(2);
    let a = env.start(options).await;
    env.write(300..600).await;
    assert!(env.delivered_within(300, Duration::from_secs(20)).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let old: Vec<String> = env
        .deliveries
        .ids()
        .into_iter()
        .filter(|id| ids(0..300).contains(id))
        .collect();
    let missing = env.deliveries.missing(ids(300..600));
    println!(
        "start from now: 300 written before the first start, 300 right after; delivered {} ({} old, {} of the new missing)",
        env.deliveries.distinct(),
        old.len(),
        missing.len()
    );
    assert!(
        old.is_empty(),
        "documents from before the start were delivered: {old:?}"
    );
    assert!(
        missing.is_empty(),
        "documents written after the start were skipped: {missing:?}"
    );
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpointing_every_ten_batches_writes_a_tenth_and_a_stop_still_checkpoints() {
    let env = Env::new(2).await;
    let mut options = env.options("a");
    options.max_items = 10;
    options.checkpoint = changefeed_operator::processor::CheckpointPolicy {
        every_batches: 10,
        interval: None,
    };
    let processor = env
        .processor(
            options.clone(),
            Arc::new(common::RecordingHandler {
                instance: "a".into(),
                deliveries: env.deliveries.clone(),
            }),
        )
        .await;
    let mut events = processor.subscribe();
    let a = processor.start().await.unwrap();
    env.write(0..1000).await;
    assert!(env.delivered_within(1000, Duration::from_secs(30)).await);
    let (mut batches, mut checkpoints) = (0usize, 0usize);
    while let Ok(event) = events.try_recv() {
        if let LeaseEvent::Checkpointed { .. } = event {
            checkpoints += 1;
        }
    }
    batches += env.deliveries.total().div_ceil(10);
    // A graceful stop writes the positions handled since the last checkpoint...
    a.stop().await;
    let b = env.start(env.options("b")).await;
    env.write(1000..1100).await;
    assert!(env.delivered_within(1100, Duration::from_secs(30)).await);
    let duplicates = env.deliveries.duplicates();
    println!(
        "checkpoint every 10 batches: ~{batches} batches of 10, {checkpoints} checkpoint writes; after a graceful stop and restart: 1100 delivered, {} duplicates",
        duplicates.len()
    );
    assert!(
        checkpoints <= batches / 5,
        "{checkpoints} checkpoints for {batches} batches"
    );
    assert!(
        duplicates.is_empty(),
        "a stop lost the deferred positions: {duplicates:?}"
    );
    b.stop().await;
}

/// Records deliveries and keeps every batch's checkpoint handle (it never checkpoints itself).
#[derive(Default)]
struct KeepHandles {
    deliveries: common::Deliveries,
    handles: std::sync::Mutex<Vec<(Vec<String>, changefeed_operator::processor::CheckpointHandle)>>,
}

#[async_trait::async_trait]
impl changefeed_operator::processor::ManualCheckpointHandler for KeepHandles {
    async fn handle(
        &self,
        batch: Batch<'_>,
        checkpoint: changefeed_operator::processor::CheckpointHandle,
    ) -> Result<(), HandlerError> {
        let ids: Vec<String> = batch
            .documents
            .iter()
            .filter_map(|d| d["id"].as_str().map(str::to_owned))
            .collect();
        self.deliveries.record("manual", ids.clone());
        self.handles.lock().unwrap().push((ids, checkpoint));
        Ok(())
    }
}

/// Starts instance `name` (10 documents a batch) delivering to `handler`, which checkpoints
/// itself, over the lease store `store` makes of the real one (a slower one, say).
async fn start_manual(
    env: &Env,
    handler: Arc<KeepHandles>,
    name: &str,
    store: impl FnOnce(Arc<dyn LeaseStore>) -> Arc<dyn LeaseStore>,
) -> changefeed_operator::processor::ProcessorHandle {
    let mut options = env.options(name);
    options.max_items = 10;
    start_manual_with(env, handler, options, store).await.unwrap()
}

/// Like [`start_manual`], with `options`: the start's answer.
async fn start_manual_with(
    env: &Env,
    handler: Arc<KeepHandles>,
    options: changefeed_operator::processor::ProcessorOptions,
    store: impl FnOnce(Arc<dyn LeaseStore>) -> Arc<dyn LeaseStore>,
) -> Result<changefeed_operator::processor::ProcessorHandle, changefeed_operator::processor::ProcessorError> {
    let settings = env.settings(options);
    let (monitored, leases) = changefeed_operator::worker::open(&env.account, &env.account, &settings)
        .await
        .unwrap();
    let manual = changefeed_operator::processor::Handler::Manual(handler);
    changefeed_operator::processor::Processor::with_handler(
        monitored,
        store(Arc::new(leases)),
        manual,
        settings.options,
    )
    .start()
    .await
}

/// Manual checkpoints with several batches in flight are refused at start: a handler that
/// checkpoints its batch records every earlier one of the lease, and cannot know that one running
/// beside it failed — the checkpoint would move past it, and a move of the lease lose it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_checkpoints_with_several_batches_in_flight_are_refused_at_start() {
    let env = Env::new(1).await;
    let mut options = env.options("manual");
    options.max_in_flight_batches = 2;
    let started = start_manual_with(&env, Arc::new(KeepHandles::default()), options, |store| store).await;
    let refused = started.as_ref().err().map(ToString::to_string);
    println!("manual checkpoints with 2 batches in flight: {refused:?}");
    if let Ok(handle) = started {
        handle.stop().await;
    }
    assert!(
        refused.is_some_and(|e| e.contains("one batch in flight")),
        "started with manual checkpoints and 2 batches in flight"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_checkpoints_write_what_the_handler_confirms_and_a_split_restarts_from_it() {
    use changefeed_operator::processor::CheckpointError;
    let env = Env::new(1).await;
    for n in 0..50 {
        upsert_doc(&env.items, n).await;
    }
    let handler = Arc::new(KeepHandles::default());
    let processor = start_manual(&env, handler.clone(), "manual", |store| store).await;
    let seen = |n: usize| {
        let handler = handler.clone();
        async move { eventually(Duration::from_secs(20), || async { handler.deliveries.distinct() >= n }).await }
    };
    assert!(seen(50).await);
    let lease = || async { env.leases().await.into_iter().next().unwrap() };
    let unwritten = lease().await.continuation.is_none();
    let handle = |i: usize| handler.handles.lock().unwrap()[i].1.clone();
    // The handler confirms its second batch: the lease moves there; an older handle then writes
    // nothing (a checkpoint never goes backwards).
    handle(1).checkpoint().await.unwrap();
    let confirmed = lease().await.continuation.clone();
    handle(0).checkpoint().await.unwrap();
    let kept = lease().await.continuation == confirmed;

    // A split while batches 3.. are handled but not confirmed: the children start from the
    // confirmed position, not from where the reader was.
    for n in 50..80 {
        upsert_doc(&env.items, n).await;
    }
    assert!(seen(80).await);
    let before_split = handler.handles.lock().unwrap().len();
    env.emulator
        .split(common::DB, common::ITEMS, None, Duration::from_millis(100))
        .await
        .unwrap();
    let split = eventually(Duration::from_secs(20), || async { env.leases().await.len() == 2 }).await;
    let redelivered = eventually(Duration::from_secs(20), || async {
        ids(20..80).iter().all(|id| handler.deliveries.count(id) >= 2)
    })
    .await;
    let once = ids(0..20).iter().all(|id| handler.deliveries.count(id) == 1);
    let stale = handle(before_split - 1).checkpoint().await;

    // A handle whose lease another instance took writes nothing (If-Match on the ETag).
    let children = env.leases().await;
    let latest = handler.handles.lock().unwrap().last().unwrap().1.clone();
    let store = env.store().await;
    let mut taken = store
        .read(
            &children
                .iter()
                .find(|l| l.lease_token == latest.lease_token())
                .unwrap()
                .id,
        )
        .await
        .unwrap()
        .unwrap();
    taken.owner = Some("intruder".into());
    let taken = store.replace(&taken).await.unwrap();
    let after_take = latest.checkpoint().await;
    let untouched = store.read(&taken.id).await.unwrap().unwrap().continuation == taken.continuation;
    println!(
        "manual checkpoints: nothing written before the handler confirmed {unwritten}; confirming batch 2 moved the lease, an older handle then kept it {kept}; split {split}: the children redelivered the 60 unconfirmed documents {redelivered}, the 20 confirmed ones once {once}; the split parent's handle: {stale:?}; a handle of a lease another instance took: {after_take:?}, lease untouched {untouched}"
    );
    assert!(unwritten && confirmed.is_some() && kept);
    assert!(split && redelivered && once);
    assert!(matches!(stale, Err(CheckpointError::LeaseLost(_))), "{stale:?}");
    assert!(
        matches!(after_take, Err(CheckpointError::LeaseLost(_))),
        "{after_take:?}"
    );
    assert!(untouched);
    processor.abort();
}

/// Two manual checkpoints of the same lease at once (the handler confirms batches from several
/// tasks): the older one never lands last, so the lease never moves backwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_manual_checkpoints_never_move_a_lease_backwards() {
    let env = Env::new(1).await;
    for n in 0..400 {
        upsert_doc(&env.items, n).await;
    }
    let handler = Arc::new(KeepHandles::default());
    // A lease container answering in 100 ms, as a loaded one does: the renewer holds the lease
    // often, and handles arriving meanwhile are under way at once.
    let slow = |store| -> Arc<dyn LeaseStore> {
        Arc::new(changefeed_operator::bench::CountingStore::new(store).with_latency(Duration::from_millis(100)))
    };
    let processor = start_manual(&env, handler.clone(), "manual-race", slow).await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            handler.deliveries.distinct() >= 400
        })
        .await
    );
    let handle = |i: usize| handler.handles.lock().unwrap()[i].1.clone();
    let continuation = || async { env.leases().await.into_iter().next().unwrap().continuation };
    let mut backwards = Vec::new();
    for pair in 0..20 {
        let (older, newer) = (handle(2 * pair), handle(2 * pair + 1));
        // The newer handle first: an older one that read the lease before it wrote must not win.
        let racing = (
            {
                let newer = newer.clone();
                tokio::spawn(async move { newer.checkpoint().await })
            },
            tokio::spawn(async move { older.checkpoint().await }),
        );
        racing.0.await.unwrap().unwrap();
        racing.1.await.unwrap().unwrap();
        let after_race = continuation().await;
        // Where the newer handle alone leaves the lease: it writes nothing if the lease is there.
        newer.checkpoint().await.unwrap();
        if continuation().await != after_race {
            backwards.push(pair);
        }
        // Let a renewal come around: the next race may meet it.
        tokio::time::sleep(Duration::from_millis(170)).await;
    }
    println!("concurrent manual checkpoints: 20 races of two handles, the lease went backwards in {backwards:?}");
    assert!(
        backwards.is_empty(),
        "the older checkpoint landed last in pairs {backwards:?}"
    );
    processor.stop().await;
}

/// Counts handled batches and checkpoint writes (every write of a lease's position).
#[derive(Default)]
struct Writes {
    batches: std::sync::atomic::AtomicUsize,
    checkpoints: std::sync::atomic::AtomicUsize,
}

impl changefeed_operator::processor::ProcessorObserver for Writes {
    fn handler_done(&self, _lease: &str, _elapsed: Duration, ok: bool, documents: usize) {
        if ok && documents > 0 {
            self.batches.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn checkpointed(&self, _lease: &str, _elapsed: Duration) {
        self.checkpoints.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Writes {
    fn now(&self) -> (usize, usize) {
        let read = |n: &std::sync::atomic::AtomicUsize| n.load(std::sync::atomic::Ordering::SeqCst);
        (read(&self.batches), read(&self.checkpoints))
    }
}

/// Whether every lease reports that it caught up (lag 0 at its checkpoint).
async fn all_caught_up(env: &Env, leases: usize) -> bool {
    let all = env.leases().await;
    all.len() == leases
        && all
            .iter()
            .all(|l| changefeed_operator::processor::leases::lag_report::reported_lag(l) == Some(0))
}

/// Requests the lease container answered so far.
fn lease_requests(env: &Env) -> u64 {
    env.emulator.load(common::DB, common::LEASES).requests
}

/// Eight leases over one physical partition (sub-ranges) and a trickle of 5 writes a second:
/// each lease has a batch every second or two and is quiet (empty pages) in between. A
/// checkpoint per handled batch is what the reference processors write, also where a batch's
/// report is inexact (a sub-range: the partition's latest LSN counts the other sub-ranges'
/// writes): no caught-up report after each batch. Once the trickle stops, every lease still
/// reports that it caught up (the operator trusts that report). The lease container's requests
/// are counted by the emulator, less the instance's idle rate (heartbeats, listings) measured
/// first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickle_over_sub_range_leases_writes_one_checkpoint_per_batch() {
    const LEASES: usize = 8;
    let env = Env::new(1).await;
    let mut options = env.options("a");
    options.leases_per_partition = LEASES as u32;
    options.poll_interval = Duration::from_secs(2);
    // Fewer idle requests, so that the writes stand out from them.
    (options.acquire_interval, options.renew_interval) = (Duration::from_secs(2), Duration::from_secs(1));
    options.expiration = Duration::from_secs(6);
    let writes = Arc::new(Writes::default());
    let processor = env
        .processor(options, env.recorder("a"))
        .await
        .with_observer(writes.clone());
    let a = processor.start().await.unwrap();
    let ready = eventually(Duration::from_secs(30), || async {
        env.owners().await.get("a") == Some(&LEASES) && all_caught_up(&env, LEASES).await
    })
    .await;
    assert!(ready, "a took the {LEASES} leases and reported them caught up");
    let (idle_from, idle_started) = (lease_requests(&env), std::time::Instant::now());
    tokio::time::sleep(Duration::from_secs(4)).await;
    let idle_rate = (lease_requests(&env) - idle_from) as f64 / idle_started.elapsed().as_secs_f64();
    let (before, from, started) = (writes.now(), lease_requests(&env), std::time::Instant::now());
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    for n in 0..60 {
        tick.tick().await;
        upsert_doc(&env.items, n).await;
    }
    assert!(env.delivered_within(60, Duration::from_secs(20)).await);
    // This test's own reads of the leases are not the instance's.
    let (probe_from, probes) = (lease_requests(&env), std::sync::atomic::AtomicU64::new(1));
    all_caught_up(&env, LEASES).await;
    let per_probe = lease_requests(&env) - probe_from;
    let caught_up = eventually(Duration::from_secs(20), || {
        probes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        all_caught_up(&env, LEASES)
    })
    .await;
    let ours = per_probe * probes.load(std::sync::atomic::Ordering::SeqCst);
    let requests = (lease_requests(&env) - from - ours) as f64 - idle_rate * started.elapsed().as_secs_f64();
    let after = writes.now();
    let (batches, checkpoints) = (after.0 - before.0, after.1 - before.1);
    println!(
        "{LEASES} sub-range leases, 60 writes at 5/s: {batches} batches, {requests:.0} lease requests beyond the idle {idle_rate:.1}/s ({checkpoints} checkpoints counted); every lease reported caught up afterwards: {caught_up}"
    );
    assert!(
        caught_up,
        "every lease reports that it caught up once the trickle stopped"
    );
    assert!(
        requests <= (batches + 2 * LEASES) as f64,
        "{requests:.0} lease writes for {batches} batches: one per batch and a caught-up report per lease and quiet spell"
    );
    a.stop().await;
}
