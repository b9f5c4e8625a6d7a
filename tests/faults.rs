//! Injected service faults: `cfp emulator` answers a share of all Cosmos requests (change feed
//! reads, lease reads, replaces and queries, writes) with 429 (retry-after), 503 or 408, as the
//! service does, and then fails everything for twice the lease expiration. Two `cfp worker`
//! processes keep going: nothing is lost, no lease is left behind, the read errors show in the
//! workers' metrics, and after the outage every lease is processed again.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use changefeed_operator::cosmos::{AccountAuth, CosmosAccount, DocumentContainer, ErrorKind};
use changefeed_operator::processor::LeaseStore;
use tokio::process::{Child, Command};

use crate::common::DiesWithTest;
use crate::common::{self, CFP, DB, ITEMS, http_get, lease_store, start_emulator, terminate};

fn worker(endpoint: &str, receiver: &str, instance: &str, metrics: u16) -> Child {
    worker_with(endpoint, receiver, instance, metrics, &[])
}

/// A worker of processor `faults` delivering over HTTP to `receiver`, with `extra` flags.
pub(crate) fn worker_with(endpoint: &str, receiver: &str, instance: &str, metrics: u16, extra: &[&str]) -> Child {
    Command::new(CFP)
        .args(["worker", "--endpoint", endpoint, "--database", DB, "--container", ITEMS])
        .args(["--processor", "faults", "--instance", instance, "--handler", "http"])
        .args([
            "--handler-url",
            receiver,
            "--poll-interval",
            "100ms",
            "--max-items",
            "50",
        ])
        .args(common::FAST_LEASES)
        .args(["--metrics-port", &metrics.to_string()])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(
            std::fs::File::create(std::env::temp_dir().join(format!("cfp-faults-{instance}.log"))).expect("log file"),
        )
        .dies_with_test()
        .spawn()
        .expect("spawn cfp worker")
}

/// Writes `doc-<n>` for `range`, retrying what the service refuses (clients retry faults).
pub(crate) async fn write(items: &DocumentContainer, range: std::ops::Range<usize>) {
    for n in range {
        let doc = serde_json::json!({"id": format!("doc-{n}"), "pk": format!("pk-{}", n % 13)});
        for attempt in 0.. {
            match items.upsert(&format!("pk-{}", n % 13), &doc).await {
                Ok(_) => break,
                Err(e) if attempt >= 100 => panic!("writing doc-{n}: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

/// The emulator's account (well-known key) and its `db/items`.
pub(crate) async fn connect(endpoint: &str) -> (CosmosAccount, DocumentContainer) {
    let account = CosmosAccount::connect(endpoint, &AccountAuth::emulator_key())
        .await
        .unwrap();
    // The emulator's injected faults may answer the metadata reads too: transient, retried.
    for attempt in 0.. {
        match account.documents(DB, ITEMS).await {
            Ok(items) => return (account, items),
            Err(e) if e.kind == ErrorKind::Transient && attempt < 50 => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("opening {DB}/{ITEMS}: {e}"),
        }
    }
    unreachable!("the loop returns or panics")
}

/// Delivered document ids and the number of deliveries.
type Received = (Arc<Mutex<BTreeSet<String>>>, Arc<Mutex<usize>>);

/// An HTTP handler endpoint recording what it receives: its URL, the ids seen, the deliveries.
pub(crate) async fn receiver() -> (String, Arc<Mutex<BTreeSet<String>>>, Arc<Mutex<usize>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let (seen, deliveries): Received = Default::default();
    let (sink, count) = (seen.clone(), deliveries.clone());
    common::receive_batches(listener, move |_, batch| {
        let ids: Vec<String> = batch["documents"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["id"].as_str().map(str::to_owned))
            .collect();
        *count.lock().unwrap() += ids.len();
        sink.lock().unwrap().extend(ids);
    });
    (url, seen, deliveries)
}

pub(crate) async fn wait_delivered(seen: &Mutex<BTreeSet<String>>, count: usize, timeout: Duration) -> bool {
    wait_delivered_from(seen, 0..count, timeout).await
}

/// Whether `doc-<n>` for every n of `docs` was seen within `timeout`.
async fn wait_delivered_from(seen: &Mutex<BTreeSet<String>>, docs: std::ops::Range<usize>, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if docs.clone().all(|n| seen.lock().unwrap().contains(&format!("doc-{n}"))) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// The sum of the series of `metric` at a worker's /metrics.
pub(crate) async fn metric_sum(port: u16, metric: &str) -> f64 {
    let (_, body) = http_get(SocketAddr::from(([127, 0, 0, 1], port)), "/metrics").await;
    body.lines()
        .filter(|l| l.starts_with(metric))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Change feed reads the workers on `ports` retried or saw fail (their metrics).
async fn read_retries_and_errors(ports: &[u16]) -> f64 {
    let mut retried = 0.0;
    for port in ports {
        retried += metric_sum(*port, "cfp_feed_read_retries_total").await
            + metric_sum(*port, "cfp_feed_read_errors_total").await;
    }
    retried
}

/// The owner of every lease of processor `faults`.
async fn lease_owners(account: &CosmosAccount) -> Vec<Option<String>> {
    let store = lease_store(account, "faults").await.expect("lease store");
    store
        .snapshot()
        .await
        .unwrap()
        .leases
        .into_iter()
        .map(|l| l.owner)
        .collect()
}

/// How many of `workers` still run.
fn running(workers: &mut [Child]) -> usize {
    workers
        .iter_mut()
        .map(|w| w.try_wait())
        .filter(|status| matches!(status, Ok(None)))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_ride_out_throttling_errors_timeouts_and_an_outage_without_losing_anything() {
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:4").await;
    let (account, items) = connect(&endpoint).await;
    let (receiver, seen, deliveries) = receiver().await;
    write(&items, 0..300).await;

    // 10 % of every request fails while the workers start and documents keep coming.
    common::emulator_control(
        &endpoint,
        reqwest::Method::POST,
        "faults?rate=0.1&kinds=429,503,408,reset",
    )
    .await;
    let ports = [common::free_port(), common::free_port()];
    let mut workers = vec![
        worker(&endpoint, &receiver, "f0", ports[0]),
        worker(&endpoint, &receiver, "f1", ports[1]),
    ];
    let started = Instant::now();
    write(&items, 300..1000).await;
    let through_faults = wait_delivered(&seen, 1000, Duration::from_secs(90)).await;
    let faults_took = started.elapsed();
    // A drain of a few seconds may see no read fail (each fails one time in ten): while the
    // faults last, keep the reads coming until one did (bounded).
    let mut extra = 5000..5010;
    let mut retried = read_retries_and_errors(&ports).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while retried == 0.0 && Instant::now() < deadline {
        write(&items, extra.clone()).await;
        extra = extra.end..extra.end + 10;
        tokio::time::sleep(Duration::from_millis(200)).await;
        retried = read_retries_and_errors(&ports).await;
    }
    // The estimator (the operator's code path) answers through the same faults.
    let estimate = common::cfp_estimate(&endpoint, &["--processor", "faults", "-o", "json"]).await;
    let estimated: serde_json::Value = serde_json::from_slice(&estimate.stdout).unwrap_or_default();
    let injected = common::emulator_control(&endpoint, reqwest::Method::GET, "faults").await;

    // Everything fails for twice the lease expiration; then documents written afterwards arrive.
    common::emulator_control(&endpoint, reqwest::Method::DELETE, "faults").await;
    common::emulator_control(&endpoint, reqwest::Method::POST, "outage?ms=6000").await;
    tokio::time::sleep(Duration::from_millis(6000)).await;
    let recovered_from = Instant::now();
    write(&items, 1000..1300).await;
    let after_outage = wait_delivered(&seen, 1300, Duration::from_secs(60)).await;
    let recovery = recovered_from.elapsed();
    let owners = lease_owners(&account).await;
    let outage = common::emulator_control(&endpoint, reqwest::Method::GET, "faults").await;
    let alive = running(&mut workers);
    for child in &mut workers {
        terminate(child).await;
    }
    terminate(&mut emulator).await;

    let delivered = *deliveries.lock().unwrap();
    println!(
        "faults: injected {} during the faulty phase; 1000/1000 delivered {through_faults} in {faults_took:.1?}; workers counted {retried} retried or failed change feed reads; cfp estimate under faults: exit {:?}, totalLag {}; outage of 6 s (2x expiration): {} requests refused, then 300 more delivered {after_outage} within {recovery:.1?}; lease owners {owners:?}; {alive}/2 workers running; deliveries {delivered} for 1300 documents",
        injected["injected"],
        estimate.status.code(),
        estimated["totalLag"],
        outage["injected"]["503"]
    );
    assert!(through_faults, "lost under faults");
    assert_eq!(
        alive, 2,
        "a worker gave up (a transient fault at startup must be retried)"
    );
    // The outage is logged once per kind and lease, not once per cycle.
    for instance in ["f0", "f1"] {
        let log = std::fs::read_to_string(std::env::temp_dir().join(format!("cfp-faults-{instance}.log")))
            .unwrap_or_default();
        let renews = log.lines().filter(|l| l.contains("renew failed")).count();
        assert!(
            renews <= 4,
            "{instance} logged {renews} renew failures for 4 leases over a 6 s outage"
        );
    }
    assert!(after_outage, "not processed again after the outage");
    assert!(retried > 0.0, "the injected faults show in the workers' metrics");
    assert!(
        estimate.status.success() && estimated["totalLag"].is_u64(),
        "the estimator rides out the faults: {}",
        String::from_utf8_lossy(&estimate.stderr)
    );
    assert!(
        owners.iter().all(|o| matches!(o.as_deref(), Some("f0" | "f1"))),
        "every lease owned by a live worker after the outage: {owners:?}"
    );
}

/// Regenerates the emulator's account key as `key`.
async fn rotate_key(endpoint: &str, key: &str) {
    let value: String = url::form_urlencoded::byte_serialize(key.as_bytes()).collect();
    common::emulator_control(endpoint, reqwest::Method::POST, &format!("key?value={value}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_rotated_while_running_is_reported_on_readyz_and_processing_resumes_when_the_key_works() {
    let old_key = changefeed_operator::cosmos::EMULATOR_KEY;
    let new_key = "cm90YXRlZC1rZXktZm9yLXRoZS13b3JrZXJzLXRlc3Q=";
    let (mut emulator, endpoint) =
        common::start_emulator_with(&["--port", "0", "--container", "db/items:/pk:2", "--key", old_key]).await;
    let (_account, items) = connect(&endpoint).await;
    let (receiver, seen, _) = receiver().await;
    let port = common::free_port();
    let mut worker = worker(&endpoint, &receiver, "k0", port);
    write(&items, 0..20).await;
    assert!(wait_delivered(&seen, 20, Duration::from_secs(30)).await);
    let address = SocketAddr::from(([127, 0, 0, 1], port));

    // The account key is regenerated; the worker still signs with the old one.
    rotate_key(&endpoint, new_key).await;
    let rotated = Instant::now();
    let mut readiness = (0, String::new());
    while rotated.elapsed() < Duration::from_secs(20) {
        readiness = http_get(address, "/readyz").await;
        if readiness.0 == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reported_after = rotated.elapsed();
    // Writers with the new key go on (another process: one process keeps one key per account).
    common::cfp_write_with(&endpoint, 20, 20, &["--key", new_key], &[]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let alive = matches!(worker.try_wait(), Ok(None));

    // Fixed: the key the worker has works again (on a cluster the operator rolls the workers onto
    // the new key instead: the pod template carries a digest of the Secret).
    rotate_key(&endpoint, old_key).await;
    let fixed = Instant::now();
    let resumed = wait_delivered(&seen, 40, Duration::from_secs(30)).await;
    let resumed_after = fixed.elapsed();
    let ready_again = http_get(address, "/readyz").await;
    terminate(&mut worker).await;
    terminate(&mut emulator).await;
    let log = std::fs::read_to_string(std::env::temp_dir().join("cfp-faults-k0.log")).unwrap_or_default();
    let refusals = log.lines().filter(|l| l.contains("status 401")).count();
    println!(
        "key rotated while running: /readyz {} after {reported_after:.1?}: {:?}; worker alive {alive}, {refusals} log lines about the refusal; key works again: 20 documents written meanwhile delivered {resumed} within {resumed_after:.1?}, /readyz {}",
        readiness.0,
        readiness.1.trim(),
        ready_again.0
    );
    assert_eq!(readiness.0, 503, "readiness reports the refused key");
    assert!(readiness.1.contains("refused this worker's key"), "{}", readiness.1);
    assert!(
        !readiness.1.contains(old_key) && !log.contains(old_key),
        "the key is never shown"
    );
    assert!(alive, "the worker keeps running and backs off");
    assert_eq!(refusals, 1, "one line for the refused key:\n{log}");
    assert!(resumed, "processing resumes once the key works");
    assert_eq!(ready_again.0, 200, "{}", ready_again.1);
}

/// A lease whose change feed kept failing (reported on `/readyz`) and that then ends through a
/// split found by a failed read takes its report with it: the children read, and the processor
/// is healthy again without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_splits_after_failing_reads_leaves_no_failure_behind() {
    use changefeed_operator::cosmos::StartFrom;
    use changefeed_operator::processor::ProcessorOptions;
    use changefeed_operator::worker::WorkerSettings;
    let (_emulator, endpoint) = start_emulator("db/items:/pk:1").await;
    let (account, items) = connect(&endpoint).await;
    let mut options = ProcessorOptions::new(common::PROCESSOR, "splitting");
    options.start_from = StartFrom::Beginning;
    options.acquire_interval = Duration::from_secs(1);
    options.renew_interval = Duration::from_secs(1);
    options.expiration = Duration::from_secs(30);
    options.poll_interval = Duration::from_millis(100);
    options.min_backoff = Duration::from_millis(50);
    options.max_backoff = Duration::from_millis(300);
    let settings = WorkerSettings {
        database: DB.into(),
        container: ITEMS.into(),
        lease_database: DB.into(),
        lease_container: common::LEASES.into(),
        create_leases: true,
        options: options.clone(),
    };
    let deliveries = common::Deliveries::default();
    let handler = Arc::new(common::RecordingHandler {
        instance: "splitting".into(),
        deliveries: deliveries.clone(),
    });
    let processor = changefeed_operator::worker::build_processor(&account, &account, &settings, handler)
        .await
        .unwrap();
    let monitor = processor.monitor();
    let handle = processor.start().await.unwrap();
    write(&items, 0..20).await;
    let delivered = common::eventually(Duration::from_secs(20), || async { deliveries.distinct() >= 20 }).await;
    assert!(delivered, "delivered before the outage");

    common::emulator_control(&endpoint, reqwest::Method::POST, "outage?ms=3000").await;
    let reported = common::eventually(Duration::from_secs(10), || async { monitor.read_problem().is_some() }).await;
    let problem = monitor.read_problem();
    // The partition splits while the outage lasts; reads after it meet the split in progress.
    let split = tokio::spawn({
        let endpoint = endpoint.clone();
        async move {
            common::emulator_control(
                &endpoint,
                reqwest::Method::POST,
                "split?database=db&container=items&lockMs=3000",
            )
            .await
        }
    });
    let healthy = common::eventually(Duration::from_secs(30), || async {
        monitor.owned_leases() == 2 && monitor.read_problem().is_none()
    })
    .await;
    split.await.unwrap();
    write(&items, 20..40).await;
    let after = common::eventually(Duration::from_secs(20), || async { deliveries.distinct() >= 40 }).await;
    println!(
        "failing reads then a split: reported {reported} ({problem:?}); two children and no problem left {healthy} (now {:?}, {} leases); 40/40 delivered {after}",
        monitor.read_problem(),
        monitor.owned_leases()
    );
    handle.abort();
    assert!(reported, "the failing reads are reported");
    assert!(
        healthy,
        "a problem of the split parent stayed: {:?}",
        monitor.read_problem()
    );
    assert!(after, "the children deliver");
}

/// The answers the SDK turns into its own 503/20310–20312 once its recovery fails (a read session
/// not available, a region that takes no writes, an account the region does not know) and the
/// 429/3212 of a spent throughput bucket, on a share of every request while two workers run:
/// nothing lost, no worker gives up, every lease owned by a live worker afterwards. At this rate
/// the SDK's own retries absorb them; at higher rates its 503/20310–20312 reach the workers,
/// which log them and try again (the classification: `cosmos::error` tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_ride_out_the_sdk_s_synthetic_unavailability_and_bucket_throttling_without_losing_anything() {
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:4").await;
    let (account, items) = connect(&endpoint).await;
    let (receiver, seen, deliveries) = receiver().await;
    write(&items, 0..200).await;
    common::emulator_control(
        &endpoint,
        reqwest::Method::POST,
        "faults?rate=0.1&kinds=429/3212,404/1002,403/3,403/1008",
    )
    .await;
    let ports = [common::free_port(), common::free_port()];
    let mut workers = vec![
        worker(&endpoint, &receiver, "s0", ports[0]),
        worker(&endpoint, &receiver, "s1", ports[1]),
    ];
    let started = Instant::now();
    let kinds = ["429/3212", "404/1002", "403/3", "403/1008"];
    let mut written = 600;
    write(&items, 200..written).await;
    let mut delivered_all = wait_delivered(&seen, written, Duration::from_secs(60)).await;
    // More documents until each kind was injected (bounded): a quick run may send too few of
    // the requests a kind applies to (404/1002: reads only; a rehearsal drained in 1.9 s with
    // none of them injected).
    let until = Instant::now() + Duration::from_secs(30);
    let mut injected = common::emulator_control(&endpoint, reqwest::Method::GET, "faults").await;
    while delivered_all
        && Instant::now() < until
        && kinds
            .iter()
            .any(|kind| injected["injected"][kind].as_u64().unwrap_or(0) == 0)
    {
        write(&items, written..written + 100).await;
        written += 100;
        delivered_all = wait_delivered(&seen, written, Duration::from_secs(60)).await;
        injected = common::emulator_control(&endpoint, reqwest::Method::GET, "faults").await;
    }
    let took = started.elapsed();
    common::emulator_control(&endpoint, reqwest::Method::DELETE, "faults").await;
    let retried = read_retries_and_errors(&ports).await;
    let owners = lease_owners(&account).await;
    let alive = running(&mut workers);
    for child in &mut workers {
        terminate(child).await;
    }
    terminate(&mut emulator).await;
    let delivered = *deliveries.lock().unwrap();
    println!(
        "synthetic faults: injected {}; {written}/{written} delivered {delivered_all} in {took:.1?} ({delivered} deliveries); {retried} retried or failed change feed reads; lease owners {owners:?}; {alive}/2 workers running",
        injected["injected"]
    );
    for kind in kinds {
        assert!(
            injected["injected"][kind].as_u64().unwrap_or(0) > 0,
            "{kind} was injected: {injected}"
        );
    }
    assert!(delivered_all, "lost under the SDK's synthetic faults");
    assert_eq!(alive, 2, "a worker gave up on a fault that passes");
    assert!(
        owners.iter().all(|o| matches!(o.as_deref(), Some("s0" | "s1"))),
        "every lease owned by a live worker: {owners:?}"
    );
}

/// A worker reading ahead (two batches with the handler at once) on an account slower than
/// half the lease expiration: the next batch's ownership check (a renewal, holding the lease's
/// lock while it writes) and the checkpoint of the batch before never wait on each other, so no
/// lease stops silently while its owner lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_reading_ahead_on_a_slow_account_never_stops_a_lease() {
    const DOCS: usize = 200;
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:4").await;
    let (_account, items) = connect(&endpoint).await;
    write(&items, 0..DOCS).await;
    let (url, seen, _) = receiver().await;
    let mut worker = common::cfp_worker(&endpoint)
        .args(["--processor", "ahead", "--instance", "ahead", "--handler", "http"])
        .args(["--handler-url", &url, "--poll-interval", "100ms", "--max-items", "10"])
        .args(["--max-in-flight-batches", "2", "--lease-acquire-interval", "500ms"])
        .args(["--lease-renew-interval", "300ms", "--lease-expiration", "1s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn cfp worker");
    // Once it runs, every request is answered after 0.3 to 0.9 s: every ownership check before
    // a batch is a renewal (nothing kept the lease alive for half the expiration).
    assert!(
        wait_delivered(&seen, 1, Duration::from_secs(30)).await,
        "the worker delivers"
    );
    common::emulator_control(
        &endpoint,
        reqwest::Method::POST,
        "faults?rate=0&kinds=429&latencyMs=600",
    )
    .await;
    let started = Instant::now();
    let delivered = wait_delivered(&seen, DOCS, Duration::from_secs(60)).await;
    let got = seen.lock().unwrap().len();
    terminate(&mut worker).await;
    terminate(&mut emulator).await;
    println!(
        "slow account, 2 batches in flight: {got} of {DOCS} delivered ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    assert!(delivered, "a lease stopped: {got} of {DOCS} delivered");
}

/// A worker started while the account takes no writes (a failover under way: 403/3, which the
/// SDK answers with 503/20311 once its own recovery failed) keeps trying to start, rather than
/// exiting (a crash loop under Kubernetes), and processes once writes land again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_started_while_the_account_takes_no_writes_starts_once_it_does() {
    const DOCS: usize = 50;
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:2").await;
    let (_account, items) = connect(&endpoint).await;
    write(&items, 0..DOCS).await;
    let (url, seen, _) = receiver().await;
    let worker = |instance: &str| {
        common::cfp_worker(&endpoint)
            .args(["--processor", "nowrites", "--instance", instance, "--handler", "http"])
            .args(["--handler-url", &url, "--poll-interval", "100ms"])
            .args(common::FAST_LEASES)
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(std::env::temp_dir().join(format!("cfp-faults-{instance}.log"))).expect("log"),
            )
            .spawn()
            .expect("spawn cfp worker")
    };
    // A first worker bootstraps the leases and stops: what the next start writes first is its
    // heartbeat (as a worker restarted during a failover does).
    let mut first = worker("nowrites-first");
    assert!(
        wait_delivered(&seen, DOCS, Duration::from_secs(30)).await,
        "the first worker delivers"
    );
    terminate(&mut first).await;
    seen.lock().unwrap().clear();
    common::emulator_control(&endpoint, reqwest::Method::POST, "faults?rate=1&kinds=403/3").await;
    let mut worker = worker("nowrites");
    // Until its start's writes were refused many times over (the SDK retries each a few times).
    let refused = || async {
        let faults = common::emulator_control(&endpoint, reqwest::Method::GET, "faults").await;
        faults["injected"]["403/3"].as_u64().unwrap_or(0)
    };
    let mut exited = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    while refused().await < 8 && exited.is_none() && Instant::now() < deadline {
        exited = worker.try_wait().expect("the worker's status");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refused_writes = refused().await;
    common::emulator_control(&endpoint, reqwest::Method::DELETE, "faults").await;
    write(&items, DOCS..2 * DOCS).await;
    let delivered = wait_delivered_from(&seen, DOCS..2 * DOCS, Duration::from_secs(30)).await;
    let exited = exited.or(worker.try_wait().expect("the worker's status"));
    let got = seen.lock().unwrap().len();
    terminate(&mut worker).await;
    terminate(&mut emulator).await;
    println!("no writes at start: {refused_writes} writes refused; exited {exited:?}; {got} of {DOCS} delivered after");
    assert_eq!(exited, None, "the worker exited instead of starting once writes landed");
    assert!(delivered, "{got} of {DOCS} written after delivered");
}
