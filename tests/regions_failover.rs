//! Regional failures while workers run and checkpoint (issue 40 §4), on a two-region `cfp
//! emulator` (East US takes writes, West US gets them after a replication delay) with real `cfp
//! worker` processes delivering over HTTP, and documents created and replaced all along by a
//! client that follows the write region:
//!
//! - the write region fails over to West US, then the read region (East US, now the one that
//!   lags) goes offline and comes back: every latest version is delivered, every lease ends
//!   owned by a live worker whose heartbeat is renewed and checkpointed up to the write region's
//!   last change, and from the failover on the lease writes go to West US (the emulator counts
//!   what each region took);
//! - a worker reading a region 1.5 s behind is killed (-9); another, reading the write region,
//!   takes its leases over and hands one back when it restarts: nothing lost.
//!
//! In both, every lease's checkpoint is compared with what the handler acknowledged for it ten
//! times a second: a checkpoint never names a position past the highest LSN delivered.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use changefeed_operator::cosmos::{AccountAuth, CosmosAccount, continuation_lsn};
use changefeed_operator::processor::{CosmosLeaseStore, LeaseStore};
use serde_json::Value;
use time::OffsetDateTime;
use tokio::process::Child;

use crate::common::{self, DB, ITEMS, emulator_control, eventually, terminate};

const PROCESSOR: &str = "regions";

/// One document version as the handler received it.
#[derive(Debug, Clone)]
struct Delivered {
    instance: String,
    lease: String,
    id: String,
    version: u64,
    lsn: u64,
}

type Deliveries = Arc<Mutex<Vec<Delivered>>>;

/// The user's service: records each batch (before answering 200, so what it holds covers every
/// batch a worker saw acknowledged); its URL and what it received.
async fn receiver() -> (String, Deliveries) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let deliveries = Deliveries::default();
    let sink = deliveries.clone();
    common::receive_batches(listener, move |path, batch| {
        let instance = path.trim_start_matches('/');
        let lease = batch["lease"].as_str().unwrap_or_default();
        let documents = batch["documents"].as_array().into_iter().flatten();
        let delivered = documents.filter_map(|d| {
            Some(Delivered {
                instance: instance.to_owned(),
                lease: lease.to_owned(),
                id: d["id"].as_str()?.to_owned(),
                version: d["v"].as_u64()?,
                lsn: d["_lsn"].as_u64()?,
            })
        });
        sink.lock().unwrap().extend(delivered);
    });
    (url, deliveries)
}

/// The documents each instance delivered.
fn by_instance(deliveries: &Mutex<Vec<Delivered>>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for d in deliveries.lock().unwrap().iter() {
        *counts.entry(d.instance.clone()).or_insert(0) += 1;
    }
    counts
}

/// The highest LSN delivered per lease.
fn highest_delivered(deliveries: &Mutex<Vec<Delivered>>) -> BTreeMap<String, u64> {
    let mut highest = BTreeMap::new();
    for d in deliveries.lock().unwrap().iter() {
        let entry = highest.entry(d.lease.clone()).or_insert(0);
        *entry = d.lsn.max(*entry);
    }
    highest
}

/// `cfp emulator` with East US and West US, `delay_ms` apart, `db/items` of `partitions`
/// physical partitions and `db/leases`.
async fn two_regions(delay_ms: u64, partitions: u32) -> (Child, String) {
    let items = format!("{DB}/{ITEMS}:/pk:{partitions}");
    common::start_two_regions(&[&items, "db/leases"], delay_ms).await
}

/// `cfp worker` `instance` delivering to `receiver` with more `flags`, its log in the temp dir.
fn worker(endpoint: &str, receiver: &str, instance: &str, flags: &[&str]) -> Child {
    let log = std::env::temp_dir().join(format!("cfp-regions-{instance}.log"));
    common::cfp_worker(endpoint)
        .args(["--processor", PROCESSOR, "--instance", instance, "--handler", "http"])
        .args(["--handler-url", &format!("{receiver}{instance}")])
        .args([
            "--start-from",
            "beginning",
            "--poll-interval",
            "100ms",
            "--max-items",
            "50",
        ])
        .args(["--metrics-port", &common::free_port().to_string()])
        .args(common::FAST_LEASES)
        .args(flags)
        .env(
            "RUST_LOG",
            std::env::var("CFP_REGIONS_RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .expect("spawn cfp worker")
}

/// Region `name` of a `/_emulator/regions` answer.
fn region<'a>(topology: &'a Value, name: &str) -> &'a Value {
    topology["regions"]
        .as_array()
        .and_then(|regions| regions.iter().find(|r| r["name"] == name))
        .unwrap_or_else(|| panic!("no region {name} in {topology}"))
}

/// The lease writes region `name` took and refused, as the emulator counted them.
fn lease_writes(topology: &Value, name: &str) -> (u64, u64) {
    let counts = &region(topology, name)["writes"]["db/leases"];
    (
        counts["accepted"].as_u64().unwrap_or(0),
        counts["refused"].as_u64().unwrap_or(0),
    )
}

/// The LSN of the latest change of physical partition `partition` of `db/items` in the region
/// at `endpoint` (a change feed read from now answers with it as its ETag); `None` when the
/// region does not answer.
async fn latest_lsn(endpoint: &str, partition: &str) -> Option<u64> {
    let answer = reqwest::Client::new()
        .get(format!("{endpoint}dbs/{DB}/colls/{ITEMS}/docs"))
        .header("x-ms-version", "2020-07-15")
        .header("a-im", "Incremental feed")
        .header("x-ms-documentdb-partitionkeyrangeid", partition)
        .header("if-none-match", "*")
        .send()
        .await
        .ok()?;
    continuation_lsn(answer.headers().get("etag")?.to_str().ok()?)
}

/// The latest LSN of each of `partitions` in the region at `endpoint`.
async fn latest_lsns(endpoint: &str, partitions: u32) -> BTreeMap<String, u64> {
    let mut latest = BTreeMap::new();
    for partition in (0..partitions).map(|p| p.to_string()) {
        if let Some(lsn) = latest_lsn(endpoint, &partition).await {
            latest.insert(partition, lsn);
        }
    }
    latest
}

/// How long until every lease delivered a change written after now (past the write region's
/// latest LSN of its partition now); `None` when that took longer than `timeout`.
async fn every_lease_moves_on(
    deliveries: &Mutex<Vec<Delivered>>,
    write_region: &str,
    partitions: u32,
    timeout: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    let marks = latest_lsns(write_region, partitions).await;
    let passed = eventually(timeout, || async {
        let highest = highest_delivered(deliveries);
        marks.len() == partitions as usize
            && marks
                .iter()
                .all(|(lease, mark)| highest.get(lease).is_some_and(|lsn| lsn > mark))
    })
    .await;
    passed.then(|| started.elapsed())
}

/// [`every_lease_moves_on`] round after round for at least `hold`: (rounds, the longest one);
/// `None` when a round took longer than `timeout`.
async fn leases_keep_moving(
    deliveries: &Mutex<Vec<Delivered>>,
    write_region: &str,
    partitions: u32,
    hold: Duration,
    timeout: Duration,
) -> Option<(usize, Duration)> {
    let started = Instant::now();
    let (mut rounds, mut longest) = (0, Duration::ZERO);
    while rounds == 0 || started.elapsed() < hold {
        let took = every_lease_moves_on(deliveries, write_region, partitions, timeout).await?;
        (rounds, longest) = (rounds + 1, longest.max(took));
    }
    Some((rounds, longest))
}

/// Each lease: (lease token, owner, checkpointed LSN).
type LeaseRow = (String, Option<String>, Option<u64>);

/// The processor's leases and the instances with a heartbeat (name, last beat).
async fn leases(store: &CosmosLeaseStore) -> (Vec<LeaseRow>, Vec<(String, OffsetDateTime)>) {
    let snapshot = store.snapshot().await.expect("lease snapshot");
    let rows = snapshot
        .leases
        .into_iter()
        .map(|l| {
            let lsn = l.continuation.as_deref().and_then(continuation_lsn);
            (l.lease_token, l.owner, lsn)
        })
        .collect();
    (rows, snapshot.instances)
}

/// Every lease's checkpoint compared with the highest LSN the handler acknowledged for it, ten
/// times a second until `stop`: (comparisons, checkpoints past what was delivered).
async fn watch_checkpoints(
    store: Arc<CosmosLeaseStore>,
    deliveries: Deliveries,
    stop: Arc<AtomicBool>,
) -> (usize, Vec<String>) {
    let (mut compared, mut past) = (0, Vec::new());
    while !stop.load(Ordering::Relaxed) {
        if let Ok(snapshot) = store.snapshot().await {
            // Read after the leases: every batch checkpointed in them was recorded before.
            let highest = highest_delivered(&deliveries);
            for lease in snapshot.leases {
                let Some(lsn) = lease.continuation.as_deref().and_then(continuation_lsn) else {
                    continue;
                };
                compared += 1;
                let delivered = highest.get(&lease.lease_token).copied().unwrap_or(0);
                if lsn > delivered {
                    past.push(format!("lease {} at {lsn}, delivered {delivered}", lease.lease_token));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (compared, past)
}

/// The latest versions in `written` not delivered within `timeout`, and the versions delivered.
async fn missing_after(
    deliveries: &Mutex<Vec<Delivered>>,
    written: &BTreeMap<String, u64>,
    timeout: Duration,
) -> (Vec<(String, u64)>, usize) {
    let missing = || {
        let delivered: std::collections::BTreeSet<(String, u64)> = deliveries
            .lock()
            .unwrap()
            .iter()
            .map(|d| (d.id.clone(), d.version))
            .collect();
        (crate::common::writer::undelivered(written, &delivered), delivered.len())
    };
    eventually(timeout, || async { missing().0.is_empty() }).await;
    missing()
}

/// Nothing missing, and no checkpoint was past what its lease delivered.
fn assert_lost_nothing_and_ran_ahead_nowhere(missing: &[(String, u64)], past: &[String]) {
    assert!(missing.is_empty(), "lost: {:?}", &missing[..missing.len().min(20)]);
    assert!(past.is_empty(), "checkpoints past what was delivered: {past:?}");
}

/// A lease store and a checkpoint watcher of the processor, stopped through the flag returned.
async fn watcher(
    account: &CosmosAccount,
    deliveries: &Deliveries,
) -> (
    Arc<CosmosLeaseStore>,
    Arc<AtomicBool>,
    tokio::task::JoinHandle<(usize, Vec<String>)>,
) {
    let store = Arc::new(common::lease_store(account, PROCESSOR).await.expect("lease store"));
    let stop = Arc::new(AtomicBool::new(false));
    let watch = tokio::spawn(watch_checkpoints(store.clone(), deliveries.clone(), stop.clone()));
    (store, stop, watch)
}

/// Whether every lease is owned by one of `live` (and together they own them all), checkpointed
/// up to `latest`, and every one of `live` beat after `since`.
async fn settled(
    store: &CosmosLeaseStore,
    live: &[&str],
    latest: &BTreeMap<String, u64>,
    since: OffsetDateTime,
) -> bool {
    let (rows, beats) = leases(store).await;
    let owned = rows
        .iter()
        .all(|(_, owner, _)| owner.as_deref().is_some_and(|o| live.contains(&o)));
    let caught_up = rows.iter().all(|(token, _, lsn)| *lsn == latest.get(token).copied());
    let beating = live
        .iter()
        .all(|name| beats.iter().any(|(n, at)| n == name && *at > since));
    !rows.is_empty() && owned && caught_up && beating
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_and_a_read_region_offline_while_workers_run_lose_nothing_and_strand_no_lease() {
    const PARTITIONS: u32 = 4;
    // Each fault lasts longer than the workers' lease expiration (3 s).
    const HOLD: Duration = Duration::from_secs(4);
    let (mut emulator, endpoint) = two_regions(300, PARTITIONS).await;
    let account = CosmosAccount::connect(&endpoint, &AccountAuth::emulator_key())
        .await
        .unwrap();
    let items = account.documents(DB, ITEMS).await.unwrap();
    let (receiver, deliveries) = receiver().await;
    // w0 reads in the account's order (the write region first); w1 prefers East US, which
    // becomes the lagging read region after the failover.
    let mut workers = [
        worker(&endpoint, &receiver, "w0", &[]),
        worker(&endpoint, &receiver, "w1", &["--preferred-regions", "East US"]),
    ];
    let started = Instant::now();
    let stop_writing = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(crate::common::writer::write_continuously(items, stop_writing.clone()));
    let (store, stop_watching, watch) = watcher(&account, &deliveries).await;
    let running = eventually(Duration::from_secs(30), || async {
        let (rows, _) = leases(&store).await;
        let owners: std::collections::BTreeSet<_> = rows.iter().filter_map(|(_, o, _)| o.clone()).collect();
        rows.len() == PARTITIONS as usize && rows.iter().all(|(_, o, _)| o.is_some()) && owners.len() == 2
    })
    .await;
    assert!(running, "both workers own leases");
    let warmed_up = every_lease_moves_on(&deliveries, &endpoint, PARTITIONS, Duration::from_secs(20)).await;
    assert!(warmed_up.is_some(), "every lease delivers before the failover");

    // The write region fails over to West US.
    let failover_at = Instant::now();
    let failover = emulator_control(&endpoint, reqwest::Method::POST, "failover?region=West%20US").await;
    let failover_took = failover_at.elapsed();
    let west = region(&failover, "West US")["endpoint"].as_str().unwrap().to_owned();
    // Past the lease expiration, with w1 reading the region that now lags.
    let after_failover = leases_keep_moving(&deliveries, &west, PARTITIONS, HOLD, Duration::from_secs(20)).await;
    let lagging = emulator_control(&west, reqwest::Method::GET, "regions").await;
    let east_reads_lagging = region(&lagging, "East US")["reads"].as_u64().unwrap_or(0)
        - region(&failover, "East US")["reads"].as_u64().unwrap_or(0);

    // The read region, East US, goes offline and comes back.
    emulator_control(&west, reqwest::Method::POST, "region-offline?region=East%20US").await;
    let while_offline = leases_keep_moving(&deliveries, &west, PARTITIONS, HOLD, Duration::from_secs(20)).await;
    emulator_control(&west, reqwest::Method::DELETE, "region-offline?region=East%20US").await;
    let when_back = every_lease_moves_on(&deliveries, &west, PARTITIONS, Duration::from_secs(20)).await;

    stop_writing.store(true, Ordering::Relaxed);
    let (written, refused) = writer.await.unwrap();
    let stopped = OffsetDateTime::now_utc();
    let (missing, versions_delivered) = missing_after(&deliveries, &written, Duration::from_secs(30)).await;
    let settle_started = Instant::now();
    let latest = latest_lsns(&west, PARTITIONS).await;
    let settled = eventually(Duration::from_secs(15), || {
        settled(&store, &["w0", "w1"], &latest, stopped)
    })
    .await;
    let settle_took = settle_started.elapsed();
    let (rows, _) = leases(&store).await;
    let end = emulator_control(&west, reqwest::Method::GET, "regions").await;
    stop_watching.store(true, Ordering::Relaxed);
    let (compared, past) = watch.await.unwrap();
    let alive = workers
        .iter_mut()
        .map(|w| w.try_wait())
        .filter(|s| matches!(s, Ok(None)))
        .count();
    for child in &mut workers {
        terminate(child).await;
    }
    terminate(&mut emulator).await;

    let (east_before, _) = lease_writes(&failover, "East US");
    let (east_after, east_refused) = lease_writes(&end, "East US");
    let (west_at_failover, _) = lease_writes(&failover, "West US");
    let (west_after, _) = lease_writes(&end, "West US");
    let total = deliveries.lock().unwrap().len();
    let by = by_instance(&deliveries);
    let versions_written: u64 = written.values().sum();
    println!(
        "regions failover (replication delay 300 ms, 2 workers, 4 leases, {:.1?} in all): {} documents, {versions_written} versions written ({refused} write attempts refused and retried), {versions_delivered} versions delivered in {total} deliveries ({by:?}), latest versions missing {}; failover answered in {failover_took:.1?}, for {HOLD:?} after it every lease kept delivering later changes (rounds, longest) {after_failover:.1?} (East US, now lagging, answered {east_reads_lagging} reads meanwhile), with East US offline for {HOLD:?} too {while_offline:.1?}, back: {when_back:.1?}; lease writes East US {east_before} before the failover, {east_after} at the end ({east_refused} refused), West US {west_at_failover} at the failover, {west_after} at the end; settled {settled} within {settle_took:.1?}: {rows:?} (write region latest {latest:?}); checkpoints compared with deliveries {compared} times, past them {}; {alive}/2 workers running",
        started.elapsed(),
        written.len(),
        missing.len(),
        past.len()
    );
    assert_lost_nothing_and_ran_ahead_nowhere(&missing, &past);
    assert!(after_failover.is_some(), "every lease goes on after the failover");
    assert!(
        while_offline.is_some(),
        "every lease goes on with the read region offline"
    );
    assert!(when_back.is_some(), "every lease goes on with the read region back");
    assert!(
        settled,
        "a lease is stuck (not owned by a live worker, behind, or not renewed): {rows:?}, latest {latest:?}"
    );
    assert_eq!(alive, 2);
    assert_eq!(east_after, east_before, "East US took lease writes after the failover");
    assert!(
        west_at_failover == 0 && west_after > 0,
        "the lease writes moved to West US"
    );
    assert!(
        east_reads_lagging > 0,
        "the worker preferring East US read it after the failover"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_reading_a_lagging_region_is_killed_and_its_leases_lose_nothing_and_never_run_ahead() {
    const PARTITIONS: u32 = 2;
    let (mut emulator, endpoint) = two_regions(1500, PARTITIONS).await;
    let account = CosmosAccount::connect(&endpoint, &AccountAuth::emulator_key())
        .await
        .unwrap();
    let items = account.documents(DB, ITEMS).await.unwrap();
    let topology = emulator_control(&endpoint, reqwest::Method::GET, "regions").await;
    let west = region(&topology, "West US")["endpoint"].as_str().unwrap().to_owned();
    let (receiver, deliveries) = receiver().await;
    let far = ["--preferred-regions", "West US"];
    let mut lagging = worker(&endpoint, &receiver, "lagging", &far);
    let started = Instant::now();
    let stop_writing = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(crate::common::writer::write_continuously(items, stop_writing.clone()));
    let (store, stop_watching, watch) = watcher(&account, &deliveries).await;
    let reading = every_lease_moves_on(&deliveries, &endpoint, PARTITIONS, Duration::from_secs(30)).await;
    assert!(reading.is_some(), "the lagging worker delivers");
    let busy = eventually(Duration::from_secs(30), || async {
        deliveries.lock().unwrap().len() >= 200
    })
    .await;
    assert!(busy, "the lagging worker delivers 200 documents");
    // Killed in the middle of its work.
    lagging.start_kill().unwrap();
    let _ = lagging.wait().await;
    let (rows, _) = leases(&store).await;
    let handled = highest_delivered(&deliveries);
    let (east_latest, west_latest) = (
        latest_lsns(&endpoint, PARTITIONS).await,
        latest_lsns(&west, PARTITIONS).await,
    );
    let at_kill: Vec<(String, Option<u64>, u64, u64, u64)> = rows
        .iter()
        .map(|(token, _, lsn)| {
            let of = |m: &BTreeMap<String, u64>| m.get(token).copied().unwrap_or(0);
            (token.clone(), *lsn, of(&handled), of(&west_latest), of(&east_latest))
        })
        .collect();

    // The write region's reader takes the leases over; the lagging one, restarted, gets its share
    // back by a handoff (from a checkpoint its region may not have reached yet).
    let mut leader = worker(&endpoint, &receiver, "leader", &[]);
    let takeover_at = Instant::now();
    let taken_over = eventually(Duration::from_secs(20), || async {
        let (rows, _) = leases(&store).await;
        rows.iter().all(|(_, owner, _)| owner.as_deref() == Some("leader"))
    })
    .await;
    let takeover = takeover_at.elapsed();
    let mut lagging = worker(&endpoint, &receiver, "lagging", &far);
    let shared = eventually(Duration::from_secs(20), || async {
        let (rows, _) = leases(&store).await;
        let owners: std::collections::BTreeSet<_> = rows.iter().filter_map(|(_, o, _)| o.clone()).collect();
        owners.len() == 2
    })
    .await;
    let after_handback = every_lease_moves_on(&deliveries, &endpoint, PARTITIONS, Duration::from_secs(20)).await;

    stop_writing.store(true, Ordering::Relaxed);
    let (written, refused) = writer.await.unwrap();
    let (missing, versions_delivered) = missing_after(&deliveries, &written, Duration::from_secs(30)).await;
    stop_watching.store(true, Ordering::Relaxed);
    let (compared, past) = watch.await.unwrap();
    let (end_rows, _) = leases(&store).await;
    terminate(&mut lagging).await;
    terminate(&mut leader).await;
    terminate(&mut emulator).await;
    let total = deliveries.lock().unwrap().len();
    let by = by_instance(&deliveries);
    println!(
        "lagging region (replication delay 1.5 s, {:.1?} in all): {} documents written ({refused} attempts retried), {versions_delivered} versions delivered in {total} deliveries ({by:?}), latest versions missing {}; at the kill -9, per lease (checkpoint, highest delivered, West US latest, East US latest): {at_kill:?}; taken over by the write region's reader {taken_over} in {takeover:.1?}, shared again {shared}, every lease on past the write region {after_handback:.1?} later; leases at the end {end_rows:?}; checkpoints compared with deliveries {compared} times, past them {}",
        started.elapsed(),
        written.len(),
        missing.len(),
        past.len()
    );
    assert_lost_nothing_and_ran_ahead_nowhere(&missing, &past);
    for (token, checkpoint, handled, west, east) in &at_kill {
        let checkpoint = checkpoint.unwrap_or(0);
        assert!(
            checkpoint <= *handled,
            "lease {token}: checkpoint {checkpoint} past {handled} handled"
        );
        assert!(
            *handled <= *west,
            "lease {token}: delivered {handled}, more than West US has ({west})"
        );
        assert!(*west < *east, "lease {token}: West US does not lag ({west} of {east})");
    }
    assert!(
        taken_over && shared,
        "the leases moved: taken over {taken_over}, shared {shared}"
    );
    assert!(after_handback.is_some(), "every lease goes on after the handback");
}
