//! The service's own conditions on `cfp emulator` (issue 40 §1), against the real binary: a
//! container's provisioned throughput (429s with a retry-after under a burst, and the SDK's
//! writes still all land), a merge of two physical partitions (one partition covering both
//! ranges, every document readable), a failover of the write region (the account reports the new
//! one, writes keep landing, a region taken offline leaves the account), a read region that
//! lags (a change feed reader there gets every write, in order, a replication delay late), and
//! the 400s that bad parameters get.

use std::time::{Duration, Instant};

use changefeed_operator::cosmos::{AccountAuth, CosmosAccount, DocumentContainer};
use futures::StreamExt as _;
use serde_json::{Value, json};

use crate::common::{self, DB, ITEMS, emulator_control, start_emulator_with};

/// The account's `db/items` through our SDK client.
async fn items(endpoint: &str) -> DocumentContainer {
    let account = CosmosAccount::connect(endpoint, &AccountAuth::emulator_key())
        .await
        .expect("connect to cfp emulator");
    account.documents(DB, ITEMS).await.expect("db/items")
}

/// Writes `ids` (partition key = id) through the SDK, `concurrency` at a time; the failures.
async fn write_all(items: &DocumentContainer, ids: &[String], concurrency: usize) -> Vec<String> {
    futures::stream::iter(ids.iter().cloned())
        .map(|id| async move {
            let body = json!({"id": id, "pk": id, "payload": "x".repeat(200)});
            items.upsert(&id, &body).await.err().map(|e| format!("{id}: {e}"))
        })
        .buffer_unordered(concurrency)
        .filter_map(|failure| async move { failure })
        .collect()
        .await
}

/// How many of `ids` read back through the SDK.
async fn readable(items: &DocumentContainer, ids: &[String]) -> usize {
    let mut found = 0;
    for id in ids {
        if matches!(items.read(id, id).await, Ok(Some(_))) {
            found += 1;
        }
    }
    found
}

/// A control request expected to fail: its status and message.
async fn control_status(endpoint: &str, method: reqwest::Method, action: &str) -> (u16, String) {
    let answer = reqwest::Client::new()
        .request(method, format!("{endpoint}_emulator/{action}"))
        .send()
        .await
        .expect("the control API answers");
    let status = answer.status().as_u16();
    let body: Value = serde_json::from_slice(&answer.bytes().await.unwrap_or_default()).unwrap_or(Value::Null);
    (status, body["message"].as_str().unwrap_or_default().to_owned())
}

/// What the emulator answered a raw write.
#[derive(Debug)]
struct RawAnswer {
    status: u16,
    retry_after_ms: Option<u64>,
    sub_status: Option<String>,
}

/// Raw writes (not retried) of `count` documents of about 250 bytes, 60 at a time, in `bucket`
/// if any: what each was answered.
async fn raw_burst(endpoint: &str, prefix: &str, count: usize, bucket: Option<&str>) -> Vec<RawAnswer> {
    let http = reqwest::Client::new();
    let url = format!("{endpoint}dbs/{DB}/colls/{ITEMS}/docs");
    futures::stream::iter(0..count)
        .map(|n| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let id = format!("{prefix}-{n}");
                let mut request = http
                    .post(&url)
                    .header("x-ms-version", "2020-07-15")
                    .header("x-ms-documentdb-partitionkey", format!("[\"{id}\"]"))
                    .header("content-type", "application/json")
                    .body(json!({"id": id, "pk": id, "payload": "x".repeat(200)}).to_string());
                if let Some(bucket) = bucket {
                    request = request.header("x-ms-cosmos-throughput-bucket", bucket);
                }
                let answer = request.send().await.expect("the emulator answers");
                RawAnswer {
                    status: answer.status().as_u16(),
                    retry_after_ms: header(&answer, "x-ms-retry-after-ms").and_then(|v| v.parse().ok()),
                    sub_status: header(&answer, "x-ms-substatus"),
                }
            }
        })
        .buffer_unordered(60)
        .collect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_a_throughput_bucket_are_refused_past_its_share_with_3212() {
    let (_emulator, endpoint) = start_emulator_with(&[
        "--port",
        "0",
        "--container",
        "db/items:/pk:1",
        "--throughput",
        "db/items=400",
        "--throughput-bucket",
        "db/items:1=10",
    ])
    .await;
    // Bucket 1 may spend 40 RU a second: of 40 writes of about 7 RU sent at once, a handful
    // land and the rest are refused 429/3212; the same burst in no bucket fits the 400.
    let bucketed = raw_burst(&endpoint, "in-bucket", 40, Some("1")).await;
    let plain = raw_burst(&endpoint, "plain", 40, None).await;
    let count = |answers: &[RawAnswer], status: u16, sub: Option<&str>| {
        answers
            .iter()
            .filter(|a| a.status == status && (sub.is_none() || a.sub_status.as_deref() == sub))
            .count()
    };
    println!(
        "in bucket 1 (10 % of 400 RU/s): {} created, {} refused 429/3212; in no bucket: {} created, {} refused",
        count(&bucketed, 201, None),
        count(&bucketed, 429, Some("3212")),
        count(&plain, 201, None),
        count(&plain, 429, None)
    );
    assert!(count(&bucketed, 201, None) <= 10, "{bucketed:?}");
    assert!(count(&bucketed, 429, Some("3212")) >= 30, "{bucketed:?}");
    assert_eq!(count(&plain, 429, Some("3212")), 0, "{plain:?}");
    let load = common::emulator_control(&endpoint, reqwest::Method::GET, "load").await;
    assert_eq!(
        load["db/items"]["bucketThrottled"].as_u64(),
        Some(count(&bucketed, 429, Some("3212")) as u64)
    );
}

fn ids(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|n| format!("{prefix}-{n}")).collect()
}

/// Raw writes in the burst at the 400 RU/s container.
const BURST: usize = 360;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_at_400_rus_answers_a_burst_with_429s_and_every_sdk_write_lands() {
    let (_emulator, endpoint) = start_emulator_with(&[
        "--port",
        "0",
        "--container",
        "db/items:/pk:1",
        "--throughput",
        "db/items=400",
    ])
    .await;
    // A burst of raw writes, not retried: the budget of the second is spent and the rest are
    // throttled as on the service. The burst is six seconds' budget (about 6.8 RU a write), so
    // even a machine too loaded to send it within a second meets the budget.
    let burst_started = Instant::now();
    let answers = raw_burst(&endpoint, "raw", BURST, None).await;
    let burst_took = burst_started.elapsed();
    let created = answers.iter().filter(|a| a.status == 201).count();
    let throttled: Vec<u64> = answers
        .iter()
        .filter(|a| a.status == 429)
        .map(|a| a.retry_after_ms.expect("a 429 carries x-ms-retry-after-ms"))
        .collect();
    // Through the SDK: every write lands, however often it is throttled on the way.
    let items = items(&endpoint).await;
    let sdk = ids("sdk", 150);
    let started = Instant::now();
    let failures = write_all(&items, &sdk, 16).await;
    let took = started.elapsed();
    let charged = items.request_charge();
    let found = readable(&items, &sdk).await;
    println!(
        "400 RU/s, 1 partition: raw burst of {BURST} writes in {burst_took:.1?}: {created} created, {} throttled (429, retry-after {}..{} ms); SDK: 150 writes, {} failed, {found} readable, {took:.1?}, {charged:.0} RU charged ({:.0} RU/s)",
        throttled.len(),
        throttled.iter().min().unwrap_or(&0),
        throttled.iter().max().unwrap_or(&0),
        failures.len(),
        charged / took.as_secs_f64()
    );
    assert!(
        !throttled.is_empty(),
        "a burst past 400 RU/s is throttled ({BURST} writes in {burst_took:?})"
    );
    assert_eq!(
        created + throttled.len(),
        BURST,
        "every answer is 201 or 429: {answers:?}"
    );
    assert!(
        throttled.iter().all(|ms| (1..=1000).contains(ms)),
        "retry-after within the second"
    );
    assert!(failures.is_empty(), "the SDK's writes all land: {failures:?}");
    assert_eq!(found, sdk.len());
    assert!(
        charged / took.as_secs_f64() < 400.0 * 1.5,
        "the writes kept to about the budget"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_of_two_partitions_leaves_one_covering_both_and_every_document_readable() {
    let (_emulator, endpoint) = start_emulator_with(&["--port", "0", "--container", "db/items:/pk:2"]).await;
    let items = items(&endpoint).await;
    let before = ids("before", 40);
    assert!(write_all(&items, &before, 8).await.is_empty());
    let ranges = emulator_control(&endpoint, reqwest::Method::GET, "ranges?database=db&container=items").await;
    let partitions = ranges["partitions"].as_array().expect("partitions").clone();
    assert_eq!(partitions.len(), 2, "{ranges}");
    let started = Instant::now();
    let merged = emulator_control(
        &endpoint,
        reqwest::Method::POST,
        "merge?database=db&container=items&partitions=0,1&lockMs=50",
    )
    .await;
    let merge_took = started.elapsed();
    let after_ranges = emulator_control(&endpoint, reqwest::Method::GET, "ranges?database=db&container=items").await;
    assert_eq!(
        merged["partitions"], after_ranges["partitions"],
        "the merge answers with the partitions after it"
    );
    let after_partitions = after_ranges["partitions"].as_array().expect("partitions");
    assert_eq!(after_partitions.len(), 1, "{after_ranges}");
    assert_eq!(after_partitions[0]["min"], partitions[0]["min"]);
    assert_eq!(after_partitions[0]["max"], partitions[1]["max"]);
    let after = ids("after", 40);
    let failures = write_all(&items, &after, 8).await;
    let found_before = readable(&items, &before).await;
    let found_after = readable(&items, &after).await;
    println!(
        "merge of partitions 0 [{}, {}) and 1 [{}, {}): {merge_took:.1?}, now {} [{}, {}); readable: {found_before}/40 written before, {found_after}/40 after ({} writes failed)",
        partitions[0]["min"],
        partitions[0]["max"],
        partitions[1]["min"],
        partitions[1]["max"],
        after_partitions[0]["id"],
        after_partitions[0]["min"],
        after_partitions[0]["max"],
        failures.len()
    );
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!((found_before, found_after), (40, 40));
}

/// A raw write of document `id` to the region at `endpoint` (not retried): its status and
/// sub-status.
async fn raw_write(endpoint: &str, id: &str) -> (u16, String) {
    raw_write_by(&reqwest::Client::new(), endpoint, id).await
}

/// The value of header `name` of `answer`, when it has one in ASCII.
fn header(answer: &reqwest::Response, name: &str) -> Option<String> {
    Some(answer.headers().get(name)?.to_str().ok()?.to_owned())
}

/// [`raw_write`] on `client`'s connections.
async fn raw_write_by(client: &reqwest::Client, endpoint: &str, id: &str) -> (u16, String) {
    let answer = client
        .post(format!("{endpoint}dbs/{DB}/colls/{ITEMS}/docs"))
        .header("x-ms-version", "2020-07-15")
        .header("x-ms-documentdb-partitionkey", format!("[\"{id}\"]"))
        .header("content-type", "application/json")
        .body(json!({"id": id, "pk": id}).to_string())
        .send()
        .await
        .expect("the emulator answers");
    let sub_status = header(&answer, "x-ms-substatus").unwrap_or_default();
    (answer.status().as_u16(), sub_status)
}

/// A raw read of document `id` from the region at `endpoint`: its status.
async fn raw_read(endpoint: &str, id: &str) -> u16 {
    reqwest::Client::new()
        .get(format!("{endpoint}dbs/{DB}/colls/{ITEMS}/docs/{id}"))
        .header("x-ms-version", "2020-07-15")
        .header("x-ms-documentdb-partitionkey", format!("[\"{id}\"]"))
        .send()
        .await
        .expect("the emulator answers")
        .status()
        .as_u16()
}

/// The account metadata's write regions, as `GET /` reports them to every SDK.
async fn writable_locations(endpoint: &str) -> Vec<String> {
    let body = reqwest::get(endpoint)
        .await
        .expect("GET /")
        .bytes()
        .await
        .expect("body");
    let account: Value = serde_json::from_slice(&body).expect("JSON");
    account["writableLocations"]
        .as_array()
        .expect("writableLocations")
        .iter()
        .map(|l| l["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_moves_the_write_region_and_writes_keep_landing() {
    let (_emulator, endpoint) = common::start_two_regions(&["db/items:/pk:1"], 300).await;
    let regions = emulator_control(&endpoint, reqwest::Method::GET, "regions").await;
    let west = regions["regions"][1]["endpoint"]
        .as_str()
        .expect("West US endpoint")
        .to_owned();
    assert_ne!(west, endpoint, "each region has an endpoint of its own");
    assert_eq!(writable_locations(&endpoint).await, ["East US"]);
    // A write reaches the other region after the replication delay.
    assert_eq!(raw_write(&endpoint, "replicated").await.0, 201);
    let unreplicated = raw_read(&west, "replicated").await;
    let written = Instant::now();
    let replicated = common::eventually(Duration::from_secs(3), || async {
        raw_read(&west, "replicated").await == 200
    })
    .await;
    let lag = written.elapsed();
    assert_eq!(unreplicated, 404, "not in West US before the replication delay");
    assert!(replicated, "in West US after the replication delay");
    let items = items(&endpoint).await;
    let before = ids("east", 20);
    assert!(write_all(&items, &before, 4).await.is_empty());

    let topology = emulator_control(&endpoint, reqwest::Method::POST, "failover?region=West%20US").await;
    assert_eq!(topology["writeRegion"], "West US", "{topology}");
    let reported = (writable_locations(&endpoint).await, writable_locations(&west).await);
    let old_region_write = raw_write(&endpoint, "to-the-old-write-region").await;
    let after = ids("west", 20);
    let started = Instant::now();
    let failures = write_all(&items, &after, 4).await;
    let writes_took = started.elapsed();
    // The old write region goes offline: it leaves the account, and reads go elsewhere.
    let offline = emulator_control(&west, reqwest::Method::POST, "region-offline?region=East%20US").await;
    let readable_started = Instant::now();
    let all: Vec<String> = before.iter().chain(&after).cloned().collect();
    let read_back = common::eventually(Duration::from_secs(5), || async { readable(&items, &all).await == 40 }).await;
    let read_took = readable_started.elapsed();
    let reported_offline = writable_locations(&west).await;
    println!(
        "replication delay 300 ms: 404 in West US right after the write, 200 after {lag:.1?}; failover East US -> West US: writable locations {:?} / {:?}, a raw write to East US {:?}; 20 SDK writes after it in {writes_took:.1?} ({} failed); East US offline: online {}, writable {reported_offline:?}, 40/40 readable {read_back} in {read_took:.1?}",
        reported.0,
        reported.1,
        old_region_write,
        failures.len(),
        offline["regions"][0]["online"]
    );
    assert_eq!(reported.0, ["West US"]);
    assert_eq!(reported.1, ["West US"]);
    assert_eq!(
        old_region_write,
        (403, "3".to_owned()),
        "the old write region refuses writes"
    );
    assert!(
        failures.is_empty(),
        "writes keep landing after the failover: {failures:?}"
    );
    assert_eq!(offline["regions"][0]["online"], false);
    assert_eq!(reported_offline, ["West US"]);
    assert!(read_back, "every document is readable with the old region offline");
}

/// A change feed read of physical partition 0 of `db/items` in the region at `endpoint` from
/// the continuation `from` (`"0"`: the start): the ids read and the continuation after them.
async fn feed_from(endpoint: &str, from: &str) -> (Vec<String>, String) {
    let answer = reqwest::Client::new()
        .get(format!("{endpoint}dbs/{DB}/colls/{ITEMS}/docs"))
        .header("x-ms-version", "2020-07-15")
        .header("a-im", "Incremental feed")
        .header("x-ms-documentdb-partitionkeyrangeid", "0")
        .header("if-none-match", from)
        .send()
        .await
        .expect("the emulator answers");
    let etag = header(&answer, "etag").unwrap_or_else(|| from.to_owned());
    let page: Value = serde_json::from_slice(&answer.bytes().await.expect("body")).unwrap_or_default();
    let ids = page["Documents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d["id"].as_str().map(str::to_owned))
        .collect();
    (ids, etag)
}

/// Four writers create documents in East US as fast as they can while a reader follows West
/// US's change feed, 300 ms behind: the reader skips none of them (each region applies the
/// writes of a partition in their order, as the service's do) and West US has them all a
/// replication delay after the last (the SDK emulator's own delayed replication does neither:
/// `emulator::lag`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_feed_reader_of_a_lagging_region_gets_every_write_in_order_a_delay_late() {
    let (_emulator, endpoint) = common::start_two_regions(&["db/items:/pk:1"], 300).await;
    let regions = emulator_control(&endpoint, reqwest::Method::GET, "regions").await;
    let west = regions["regions"][1]["endpoint"].as_str().expect("West US").to_owned();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (endpoint, stop) = (endpoint.clone(), stop.clone());
            tokio::spawn(async move {
                let (client, mut written) = (reqwest::Client::new(), Vec::new());
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let id = format!("w{w}-{}", written.len());
                    assert_eq!(raw_write_by(&client, &endpoint, &id).await.0, 201, "{id}");
                    written.push(id);
                }
                written
            })
        })
        .collect();
    let (mut read, mut continuation) = (std::collections::BTreeSet::new(), "\"0\"".to_owned());
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let (ids, next) = feed_from(&west, &continuation).await;
        (read, continuation) = (read.into_iter().chain(ids).collect(), next);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut written = Vec::new();
    for writer in writers {
        written.extend(writer.await.expect("writer"));
    }
    let stopped = Instant::now();
    let all_there = common::eventually(Duration::from_secs(5), || async {
        feed_from(&west, "\"0\"").await.0.len() == written.len()
    })
    .await;
    let caught_up = stopped.elapsed();
    let (ids, _) = feed_from(&west, &continuation).await;
    read.extend(ids);
    let skipped: Vec<&String> = written.iter().filter(|id| !read.contains(*id)).collect();
    println!(
        "lagging region (300 ms): {} writes by 4 writers in 3 s; West US had them all {all_there} {caught_up:.1?} after the last; its change feed reader skipped {}",
        written.len(),
        skipped.len()
    );
    assert!(all_there, "West US has every write soon after the delay");
    assert!(
        skipped.is_empty(),
        "a reader of West US skipped {}: {:?}",
        skipped.len(),
        &skipped[..skipped.len().min(10)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_parameters_get_a_400_that_says_what_is_expected() {
    let (_emulator, endpoint) = start_emulator_with(&["--port", "0", "--container", "db/items:/pk:4"]).await;
    let post = reqwest::Method::POST;
    let cases = [
        (
            "merge?database=db&container=items&partitions=0",
            "two adjacent physical partitions",
        ),
        ("merge?database=db&container=items&partitions=0,2", "not adjacent"),
        (
            "merge?database=db&container=items&partitions=0,9",
            "not both partitions",
        ),
        ("merge?database=db&container=items&partitions=0,1&lockMs=soon", "lockMs"),
        ("split?database=db&container=items&lockMs=soon", "lockMs"),
        ("containers?database=db&container=slow&throughput=300", "at least 400"),
        ("containers?database=db&container=slow&throughput=lots", "at least 400"),
        ("failover?region=Nowhere", "Nowhere"),
        ("failover", "region is required"),
        ("region-offline?region=East%20US", "East US"),
        (
            "merge?container=items&partitions=0,1",
            "database and container are required",
        ),
    ];
    let mut seen = Vec::new();
    for (action, expected) in cases {
        let (status, message) = control_status(&endpoint, post.clone(), action).await;
        println!("POST {action}: {status} {message}");
        seen.push((action, status, message.contains(expected), message));
    }
    // The command line refuses what does not fit, naming it.
    let (code, _, stderr) = common::cfp_output(
        &[
            "emulator",
            "--port",
            "0",
            "--container",
            "db/items",
            "--throughput",
            "db/other=400",
        ],
        &[],
        "warn",
    )
    .await;
    let (low_code, _, low_stderr) = common::cfp_output(
        &[
            "emulator",
            "--port",
            "0",
            "--container",
            "db/items",
            "--throughput",
            "db/items=100",
        ],
        &[],
        "warn",
    )
    .await;
    let (bucket_code, _, bucket_stderr) = common::cfp_output(
        &[
            "emulator",
            "--port",
            "0",
            "--container",
            "db/items",
            "--throughput-bucket",
            "db/items:1=10",
        ],
        &[],
        "warn",
    )
    .await;
    println!(
        "--throughput-bucket without a throughput: {bucket_code:?} {}",
        bucket_stderr.trim()
    );
    assert_ne!(bucket_code, Some(0));
    assert!(bucket_stderr.contains("has no --throughput"), "{bucket_stderr}");
    println!("--throughput of no container: {code:?} {}", stderr.trim());
    println!("--throughput 100: {low_code:?} {}", low_stderr.trim());
    for (action, status, explained, message) in &seen {
        assert_eq!(*status, 400, "{action}: {message}");
        assert!(explained, "{action}: {message}");
    }
    assert_ne!(code, Some(0));
    assert!(stderr.contains("no --container creates db/other"), "{stderr}");
    assert_ne!(low_code, Some(0));
    assert!(low_stderr.contains("at least 400"), "{low_stderr}");
}
