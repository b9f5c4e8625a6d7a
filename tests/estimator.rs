//! The remaining-work estimator, `cfp estimate`, and the worker's metrics endpoints.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use changefeed_operator::cosmos::{CosmosAccount, StartFrom};
use changefeed_operator::processor::leases::bootstrap::bootstrap;
use changefeed_operator::processor::{LeaseEstimate, LeaseStore, estimate_leases};
use changefeed_operator::worker::metrics::WorkerMetrics;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::common::DiesWithTest;
use crate::common::{
    self, CFP, DB, Env, ITEMS, RecordingHandler, cfp_write, eventually, http_get, lease_store, start_emulator,
    terminate,
};

async fn estimate(env: &Env) -> Vec<LeaseEstimate> {
    let monitored = env.account.monitored(DB, ITEMS).await.unwrap();
    estimate_leases(&monitored, &env.leases().await, StartFrom::Beginning, 8)
        .await
        .unwrap()
}

/// Operations written per lease token: creates of `doc-<n>` for `creates` and one update each of
/// `doc-<n>` for `updates`, attributed to leases by their physical partition (`epk_of` names the
/// partition of a key, so every lease must cover whole partitions).
async fn write_ops(
    env: &Env,
    creates: std::ops::Range<usize>,
    updates: std::ops::Range<usize>,
) -> BTreeMap<String, u64> {
    let monitored = env.account.monitored(DB, ITEMS).await.unwrap();
    let leases = env.leases().await;
    let mut lease_of_key = BTreeMap::new();
    for pk in (0..97).map(|k| format!("pk-{k}")) {
        let epk = monitored.epk_of(&pk).await.unwrap();
        let lease = leases
            .iter()
            .find(|l| l.range().unwrap().contains_epk(&epk))
            .expect("a lease covers every key");
        lease_of_key.insert(pk, lease.lease_token.clone());
    }
    write_ops_to(env, &lease_of_key, creates, updates).await
}

/// The operations of [`write_ops`], attributed to leases by `lease_of_key`.
async fn write_ops_to(
    env: &Env,
    lease_of_key: &BTreeMap<String, String>,
    creates: std::ops::Range<usize>,
    updates: std::ops::Range<usize>,
) -> BTreeMap<String, u64> {
    let mut per_lease = BTreeMap::new();
    for n in creates.chain(updates) {
        let pk = format!("pk-{}", n % 97);
        env.items
            .upsert(&pk, &json!({"id": format!("doc-{n}"), "pk": pk, "n": n, "v": 2}))
            .await
            .unwrap();
        *per_lease.entry(lease_of_key[&pk].clone()).or_default() += 1;
    }
    per_lease
}

/// The lease token of each partition key written so far, for leases narrower than a partition
/// (`leases.perPartition` > 1): the lease whose change feed, read from the beginning, holds the
/// key's documents (a sub-range's feed holds exactly the documents hashed into it,
/// `cosmos_feed.rs`).
async fn lease_of_keys(env: &Env) -> BTreeMap<String, String> {
    let monitored = env.account.monitored(DB, ITEMS).await.unwrap();
    let mut lease_of_key = BTreeMap::new();
    for lease in env.leases().await {
        let mut reader = monitored
            .reader(lease.range().unwrap(), None, StartFrom::Beginning, 1000)
            .await
            .unwrap();
        loop {
            let page = reader.next_page(Duration::from_secs(10)).await.unwrap();
            if page.documents.is_empty() {
                break;
            }
            for doc in &page.documents {
                lease_of_key.insert(doc["pk"].as_str().unwrap().to_owned(), lease.lease_token.clone());
            }
        }
    }
    lease_of_key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_estimate_counts_pending_operations_exactly_and_drops_to_zero() {
    let env = Env::new(4).await;
    let a = env.start(env.options("a")).await;
    env.write(0..400).await;
    assert!(env.delivered_within(400, Duration::from_secs(20)).await);
    a.stop().await;

    let expected = write_ops(&env, 400..700, 0..200).await;
    let estimates = estimate(&env).await;
    let got: BTreeMap<String, u64> = estimates.iter().map(|e| (e.lease_token.clone(), e.lag)).collect();
    let total: u64 = expected.values().sum();
    println!(
        "estimator with workers stopped: written {total} operations (300 creates, 200 updates), per lease expected {expected:?}, estimated {got:?}"
    );
    assert_eq!(got, expected);

    let b = env.start(env.options("b")).await;
    let caught_up = eventually(Duration::from_secs(20), || async {
        estimate(&env).await.iter().all(|e| e.lag == 0)
    })
    .await;
    println!(
        "after catching up: lags {:?}",
        estimate(&env).await.iter().map(|e| e.lag).collect::<Vec<_>>()
    );
    assert!(caught_up);
    b.stop().await;
}

/// Freshness: each lease's estimate says how old its oldest pending change is (from that
/// change's `_ts`, read by the request that reads the lag), 0 once nothing is pending; the
/// processor's is the oldest of all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_estimate_says_how_old_the_oldest_pending_change_is() {
    let env = Env::new(4).await;
    let a = env.start(env.options("a")).await;
    env.write(0..100).await;
    assert!(env.delivered_within(100, Duration::from_secs(20)).await);
    a.stop().await;
    let written = std::time::Instant::now();
    env.write(100..200).await;
    // The age to be measured (the emulator stamps `_ts` in whole seconds).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let estimates = estimate(&env).await;
    let bound = written.elapsed().as_secs() + 1;
    let ages: Vec<(u64, Option<u64>)> = estimates.iter().map(|e| (e.lag, e.oldest_pending_seconds)).collect();
    let whole = changefeed_operator::processor::ProcessorEstimate::new("p", estimates);
    println!(
        "100 changes written {bound} s ago at most, (lag, oldest pending) per lease: {ages:?}; processor: {:?}",
        whole.oldest_pending_seconds
    );
    assert!(
        ages.iter()
            .all(|(lag, age)| *lag > 0 && age.is_some_and(|s| (2..=bound).contains(&s))),
        "{ages:?}"
    );
    assert!(whole.oldest_pending_seconds.is_some_and(|s| (2..=bound).contains(&s)));

    let b = env.start(env.options("b")).await;
    let fresh = eventually(Duration::from_secs(20), || async {
        estimate(&env)
            .await
            .iter()
            .all(|e| e.lag == 0 && e.oldest_pending_seconds == Some(0))
    })
    .await;
    b.stop().await;
    assert!(fresh, "caught up: every lease's oldest pending change is 0 s old");
}

/// The leases created (starting from the beginning: no continuation) with nothing processed.
async fn bootstrapped(
    env: &Env,
) -> (
    Arc<dyn changefeed_operator::processor::LeaseStore>,
    changefeed_operator::cosmos::MonitoredContainer,
) {
    let handler = Arc::new(RecordingHandler {
        instance: "x".into(),
        deliveries: env.deliveries.clone(),
    });
    // Building a processor creates the lease container; bootstrapping creates the leases.
    drop(env.processor(env.options("x"), handler).await);
    let store = env.store().await;
    let monitored = env.account.monitored(DB, ITEMS).await.unwrap();
    bootstrap(store.as_ref(), &monitored, &env.options("x")).await.unwrap();
    (store, monitored)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_never_checkpointed_counts_from_the_start_position() {
    let env = Env::new(3).await;
    let (_, monitored) = bootstrapped(&env).await;
    env.write(0..5000).await;
    let leases = env.leases().await;
    let from_beginning = estimate_leases(&monitored, &leases, StartFrom::Beginning, 8)
        .await
        .unwrap();
    let from_now = estimate_leases(&monitored, &leases, StartFrom::Now, 8).await.unwrap();
    let lags = |e: &[LeaseEstimate]| e.iter().map(|l| l.lag).collect::<Vec<_>>();
    println!(
        "never checkpointed, 5000 pending: from the beginning {:?} (total {}), from now {:?}",
        lags(&from_beginning),
        from_beginning.iter().map(|e| e.lag).sum::<u64>(),
        lags(&from_now)
    );
    assert_eq!(from_beginning.len(), 3);
    assert!(from_beginning.iter().all(|e| !e.started && e.lag > 0));
    assert_eq!(from_beginning.iter().map(|e| e.lag).sum::<u64>(), 5000);
    assert!(from_now.iter().all(|e| e.lag == 0), "nothing is new after now");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_split_the_estimate_still_covers_every_range() {
    let env = Env::new(2).await;
    let a = env.start(env.options("a")).await;
    env.write(0..300).await;
    assert!(env.delivered_within(300, Duration::from_secs(20)).await);
    a.stop().await;
    let partitions = env
        .emulator
        .split(DB, ITEMS, None, Duration::from_millis(10))
        .await
        .unwrap();
    assert_eq!(partitions.len(), 3);
    assert_eq!(env.leases().await.len(), 2, "nobody has split the leases yet");

    let expected: u64 = write_ops(&env, 300..800, 0..0).await.values().sum();
    let estimates = estimate(&env).await;
    let total: u64 = estimates.iter().map(|e| e.lag).sum();
    println!(
        "after a split (2 leases over 3 partitions): pending {expected}, estimated {total} ({:?})",
        estimates.iter().map(|e| e.lag).collect::<Vec<_>>()
    );
    assert_eq!(total, expected);
}

/// Per lease, the lags that are not 0.
fn nonzero(estimates: &[LeaseEstimate]) -> BTreeMap<String, u64> {
    estimates
        .iter()
        .filter(|e| e.lag > 0)
        .map(|e| (e.lease_token.clone(), e.lag))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_four_leases_per_partition_each_lease_counts_only_its_own_pending_documents() {
    let env = Env::new(2).await;
    let mut options = env.options("a");
    options.leases_per_partition = 4;
    let handler = env.recorder("a");
    drop(env.processor(options.clone(), handler).await);
    let store = env.store().await;
    let monitored = env.account.monitored(DB, ITEMS).await.unwrap();
    bootstrap(store.as_ref(), &monitored, &options).await.unwrap();
    assert_eq!(env.leases().await.len(), 8, "2 partitions × 4 leases");

    // Never checkpointed: each sub-range counts its documents from the start position (the first
    // 97, one per key, written again: 400 documents pending).
    env.write(0..97).await;
    let lease_of_key = lease_of_keys(&env).await;
    let unread = write_ops_to(&env, &lease_of_key, 97..400, 0..97).await;
    let from_start = estimate(&env).await;
    println!(
        "4 leases per partition, never checkpointed, 400 pending: expected {unread:?}, estimated {:?} (total {})",
        nonzero(&from_start),
        from_start.iter().map(|e| e.lag).sum::<u64>()
    );
    assert_eq!(nonzero(&from_start), unread);

    let a = env.start(options).await;
    assert!(env.delivered_within(400, Duration::from_secs(20)).await);
    a.stop().await;
    // Checkpointed: creates and updates of processed documents, in every sub-range.
    let expected = write_ops_to(&env, &lease_of_key, 400..700, 0..100).await;
    let estimates = estimate(&env).await;
    let total: u64 = estimates.iter().map(|e| e.lag).sum();
    println!(
        "4 leases per partition, checkpointed, 400 pending: expected {expected:?}, estimated {:?} (total {total})",
        nonzero(&estimates)
    );
    assert_eq!(nonzero(&estimates), expected);
    assert_eq!(total, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_range_backlog_beyond_three_reads_is_extrapolated_from_them() {
    let env = Env::new(1).await;
    let mut options = env.options("x");
    options.leases_per_partition = 2;
    drop(env.processor(options.clone(), env.recorder("x")).await);
    let store = env.store().await;
    let monitored = env.account.monitored(DB, ITEMS).await.unwrap();
    bootstrap(store.as_ref(), &monitored, &options).await.unwrap();
    let total = 10_000;
    env.write(0..total).await;
    let lease_of_key = lease_of_keys(&env).await;
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for n in 0..total {
        *expected
            .entry(lease_of_key[&format!("pk-{}", n % 97)].clone())
            .or_default() += 1;
    }
    let estimates = estimate(&env).await;
    println!(
        "2 leases on one partition, {total} pending, never checkpointed: per lease {expected:?}, estimated {:?} (at most 3 reads of 1000 each)",
        nonzero(&estimates)
    );
    assert_eq!(estimates.len(), 2);
    for estimate in &estimates {
        let want = expected[&estimate.lease_token] as f64;
        let error = (estimate.lag as f64 - want).abs() / want;
        assert!(
            estimate.lag > 3000 && error < 0.1,
            "{}: {} for {want}",
            estimate.lease_token,
            estimate.lag
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_parent_left_beside_its_children_counts_nothing() {
    let env = Env::new(1).await;
    let a = env.start(env.options("a")).await;
    env.write(0..100).await;
    assert!(env.delivered_within(100, Duration::from_secs(20)).await);
    let parent = env.leases().await.remove(0);
    env.emulator
        .split(DB, ITEMS, None, Duration::from_millis(10))
        .await
        .unwrap();
    env.write(100..200).await;
    assert!(env.delivered_within(200, Duration::from_secs(20)).await);
    let split = eventually(Duration::from_secs(20), || async {
        let leases = env.leases().await;
        leases.len() == 2 && leases.iter().all(|l| l.id != parent.id)
    })
    .await;
    assert!(split, "the lease was not split: {:?}", env.leases().await);
    a.stop().await;
    let expected = write_ops(&env, 200..500, 0..0).await;
    // A crash between creating the children and deleting the parent leaves the parent behind.
    let mut left = parent.clone();
    left.owner = None;
    env.store()
        .await
        .create(&left)
        .await
        .unwrap()
        .expect("the parent is back");
    assert_eq!(env.leases().await.len(), 3);
    let estimates = estimate(&env).await;
    let total: u64 = estimates.iter().map(|e| e.lag).sum();
    let parent_lag: u64 = estimates
        .iter()
        .filter(|e| e.lease_token == parent.lease_token)
        .map(|e| e.lag)
        .sum();
    println!(
        "a split parent beside its 2 children, 300 pending: expected {expected:?}, estimated {:?} (total {total}, parent {parent_lag})",
        nonzero(&estimates)
    );
    assert_eq!(parent_lag, 0, "the superseded parent is not counted");
    assert_eq!(nonzero(&estimates), expected);
    assert_eq!(total, 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_worker_serves_its_metrics_and_health() {
    let env = Env::new(4).await;
    let metrics = WorkerMetrics::new(common::PROCESSOR).unwrap();
    let handler = Arc::new(RecordingHandler {
        instance: "m".into(),
        deliveries: env.deliveries.clone(),
    });
    let processor = env
        .processor(env.options("m"), handler)
        .await
        .with_observer(metrics.clone());
    let monitor = processor.monitor();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(changefeed_operator::worker::metrics::serve(
        listener,
        shutdown.clone(),
        metrics.clone(),
        monitor.clone(),
    ));
    assert_eq!(http_get(address, "/readyz").await.0, 503, "not ready before start");
    let handle = processor.start().await.unwrap();
    tokio::spawn(changefeed_operator::worker::metrics::estimate_periodically(
        metrics,
        monitor,
        Duration::from_millis(200),
        shutdown.clone(),
    ));
    env.write(0..700).await;
    assert!(env.delivered_within(700, Duration::from_secs(20)).await);

    let scraped = eventually(Duration::from_secs(10), || async {
        let (_, body) = http_get(address, "/metrics").await;
        body.contains(&format!(
            "cfp_documents_processed_total{{processor=\"proc\"}} {}",
            env.deliveries.total()
        )) && body.contains("cfp_estimated_lag{lease=")
    })
    .await;
    let (status, body) = http_get(address, "/metrics").await;
    assert_eq!(status, 200);
    for name in [
        "cfp_documents_processed_total",
        "cfp_batches_processed_total",
        "cfp_handler_errors_total",
        "cfp_handler_duration_seconds_bucket",
        "cfp_leases_owned{processor=\"proc\"} 4",
        "cfp_leases_acquired_total",
        "cfp_leases_closed_total",
        "cfp_checkpoint_duration_seconds_bucket",
        "cfp_feed_read_duration_seconds_bucket",
        "cfp_feed_request_charge_total",
        "cfp_lease_request_charge_total",
        "cfp_estimated_lag",
        "cfp_lease_oldest_pending_seconds{lease=",
    ] {
        assert!(body.contains(name), "{name} missing from /metrics:\n{body}");
    }
    // Leases were created, acquired, renewed and checkpointed: the lease container charged for it.
    let lease_charge: f64 = body
        .lines()
        .find(|l| l.starts_with("cfp_lease_request_charge_total{"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_default();
    assert!(lease_charge > 0.0, "no lease request charge in /metrics:\n{body}");
    let processed = body
        .lines()
        .find(|l| l.starts_with("cfp_documents_processed_total{"))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or_default()
        .to_owned();
    println!(
        "metrics: cfp_documents_processed_total {processed}, handler deliveries {}",
        env.deliveries.total()
    );
    assert!(
        scraped,
        "processed count {processed} != deliveries {}",
        env.deliveries.total()
    );
    assert_eq!(http_get(address, "/healthz").await.0, 200);
    assert_eq!(http_get(address, "/readyz").await.0, 200);
    handle.stop().await;
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cfp_estimate_json_matches_the_library() {
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:5").await;
    let mut worker = tokio::process::Command::new(CFP)
        .args([
            "worker",
            "--endpoint",
            &endpoint,
            "--database",
            DB,
            "--container",
            ITEMS,
        ])
        .args(["--instance", "w", "--poll-interval", "100ms"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .dies_with_test()
        .spawn()
        .unwrap();
    cfp_write(&endpoint, 0, 200).await;
    let account = CosmosAccount::connect(&endpoint, &changefeed_operator::cosmos::AccountAuth::emulator_key())
        .await
        .unwrap();
    let monitored = account.monitored(DB, ITEMS).await.unwrap();
    let library = || async {
        let store = lease_store(&account, "changefeed").await?;
        let leases = store.snapshot().await.ok()?.leases;
        estimate_leases(&monitored, &leases, StartFrom::Beginning, 8).await.ok()
    };
    let caught_up = eventually(Duration::from_secs(20), || async {
        library()
            .await
            .is_some_and(|e| e.len() == 5 && e.iter().all(|l| l.lag == 0))
    })
    .await;
    assert!(caught_up, "the worker did not catch up");
    terminate(&mut worker).await;
    cfp_write(&endpoint, 200, 1000).await;

    let cfp_estimate = |extra: &'static [&'static str]| common::cfp_estimate(&endpoint, extra);
    let output = cfp_estimate(&["-o", "json"]).await;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let cli: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let library = library().await.unwrap();
    let library_total: u64 = library.iter().map(|e| e.lag).sum();
    let table = cfp_estimate(&[]).await;
    println!(
        "cfp estimate with a backlog of 1000:\n{}",
        String::from_utf8_lossy(&table.stdout)
    );
    assert_eq!(cli["processor"], "changefeed");
    assert_eq!(cli["leaseCount"], 5);
    assert_eq!(cli["totalLag"], json!(library_total));
    assert_eq!(library_total, 1000);
    for estimate in &library {
        let rows = cli["leases"].as_array().unwrap();
        let row = rows
            .iter()
            .find(|l| l["leaseToken"] == estimate.lease_token.as_str())
            .unwrap();
        assert_eq!(row["lag"], json!(estimate.lag));
        assert_eq!(row["owner"], json!(null), "released on shutdown");
        assert!(row["checkpointAge"].is_u64(), "{row}");
    }

    let missing = cfp_estimate(&["--processor", "nope"]).await;
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        !missing.status.success() && stderr.contains("has no leases"),
        "{stderr}"
    );
    terminate(&mut emulator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_cannot_be_estimated_does_not_hide_the_others() {
    let env = Env::new(3).await;
    let (store, monitored) = bootstrapped(&env).await;
    env.write(0..300).await;
    let mut broken = env.leases().await.remove(0);
    broken.continuation = Some("{\"kind\":\"not_a_cursor\"}".into());
    store.replace(&broken).await.unwrap();
    let estimates = estimate_leases(&monitored, &env.leases().await, StartFrom::Beginning, 8)
        .await
        .unwrap();
    let failed: Vec<&LeaseEstimate> = estimates.iter().filter(|e| e.error.is_some()).collect();
    let known: u64 = estimates.iter().filter(|e| e.error.is_none()).map(|e| e.lag).sum();
    println!(
        "one corrupted lease: {} of {} estimated (known lag {known}); the broken one: {:?}",
        estimates.len() - failed.len(),
        estimates.len(),
        failed.first().and_then(|e| e.error.clone())
    );
    assert_eq!(estimates.len(), 3);
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].lease_token, broken.lease_token);
    assert!(
        known > 0 && known < 300,
        "the other leases' work is still counted: {known}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_split_and_a_rewind_the_estimate_counts_each_change_once() {
    use changefeed_operator::processor::admin::checkpoint_requests::{MoveOptions, Request, move_checkpoints};
    use changefeed_operator::processor::admin::checkpoints::Selection;
    let env = Env::new(2).await;
    let a = env.start(env.options("a")).await;
    env.write(0..300).await;
    assert!(env.delivered_within(300, Duration::from_secs(20)).await);
    env.emulator
        .split(DB, ITEMS, None, Duration::from_millis(10))
        .await
        .unwrap();
    env.write(300..400).await;
    assert!(env.delivered_within(400, Duration::from_secs(20)).await);
    let split = eventually(Duration::from_secs(20), || async { env.leases().await.len() == 3 }).await;
    assert!(split, "the processor did not split its lease: {:?}", env.leases().await);
    a.stop().await;
    // Everything again: every lease from the beginning (the split children too).
    let monitored = env.account.monitored(DB, ITEMS).await.unwrap();
    let store = lease_store(&env.account, common::PROCESSOR).await.unwrap();
    let rewind = Request::Rewind {
        to: StartFrom::Beginning,
        selection: Selection::default(),
    };
    let options = MoveOptions {
        holder: "rewinder".into(),
        take_leases: true,
        other_container: false,
        mode: None,
        dry_run: false,
        expiration: Duration::from_secs(2),
        watch: Duration::ZERO,
        on_watch: None,
    };
    move_checkpoints(&store, &monitored, &rewind, &options).await.unwrap();
    let estimates = estimate(&env).await;
    let total: u64 = estimates.iter().map(|e| e.lag).sum();
    env.deliveries.clear();
    let b = env.start(env.options("b")).await;
    let delivered = env.delivered_within(400, Duration::from_secs(30)).await;
    b.stop().await;
    println!(
        "after a split and a rewind to the beginning: estimated {total} ({:?}), delivered {} (400 written)",
        estimates
            .iter()
            .map(|e| (e.lease_token.as_str(), e.lag))
            .collect::<Vec<_>>(),
        env.deliveries.distinct()
    );
    assert!(delivered);
    assert_eq!(total, env.deliveries.distinct() as u64);
    assert!(estimates.iter().all(|e| !e.started && e.checkpoint_age.is_none()));
}
