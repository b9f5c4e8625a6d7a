//! The reference processors' reported bugs as our regression tests (issue 40 §5), each named by
//! the report it guards against.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use changefeed_operator::cosmos::{FeedMode, StartFrom};
use changefeed_operator::processor::LeaseEvent;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::common::{self, Env, cfp_worker, cfp_write, eventually, ids, start_emulator, terminate};

/// .NET #5617: with start "now", the first change written right after the processor started is
/// delivered (the start position is anchored when the leases are created, not when a lease is
/// first read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dotnet_5617_the_first_change_after_start_is_delivered() {
    let env = Env::new(4).await;
    let mut options = env.options("a");
    options.start_from = StartFrom::Now;
    let handle = env.start(options).await;
    env.write(0..1).await;
    let delivered = env.delivered_within(1, Duration::from_secs(10)).await;
    handle.stop().await;
    assert!(delivered, "the first change after start was not delivered");
}

/// Java #46075: a split's child leases never start with an empty continuation (which would read
/// their range from the start position again): each carries the parent's position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_46075_split_children_never_start_with_an_empty_continuation() {
    let env = Env::new(1).await;
    let handle = env.start_owning_all("a", 1).await;
    let mut events = handle.subscribe();
    env.write(0..200).await;
    assert!(env.delivered_within(200, Duration::from_secs(20)).await);
    env.emulator
        .split(common::DB, common::ITEMS, None, Duration::from_millis(100))
        .await
        .unwrap();
    env.write(200..300).await;
    let split = common::next_event(&mut events, Duration::from_secs(20), |event| match event {
        LeaseEvent::Split { children, .. } => Some(children),
        _ => None,
    })
    .await
    .expect("the lease splits");
    let children: Vec<_> = env
        .leases()
        .await
        .into_iter()
        .filter(|l| split.contains(&l.lease_token))
        .collect();
    assert!(env.delivered_within(300, Duration::from_secs(20)).await);
    let redelivered = env
        .deliveries
        .ids()
        .iter()
        .filter(|id| env.deliveries.count(id) > 1)
        .count();
    handle.stop().await;
    assert_eq!(children.len(), 2);
    assert!(
        children
            .iter()
            .all(|c| c.continuation.as_deref().is_some_and(|t| !t.is_empty())),
        "a child lease without a continuation: {children:?}"
    );
    assert!(env.deliveries.missing(ids(0..300)).is_empty());
    assert!(
        redelivered <= 100,
        "the children read their ranges again: {redelivered} redelivered"
    );
}

/// Java #43798: a lease prefix in use by a latest-version processor refuses a processor of the
/// same name in the all-versions-and-deletes mode (and the other way round), with a reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_43798_a_prefix_refuses_a_second_processor_in_another_mode() {
    let env = Env::new(2).await;
    let first = env.start_owning_all("a", 2).await;
    let mut other = env.options("b");
    other.mode = FeedMode::AllVersionsAndDeletes;
    other.start_from = StartFrom::Now;
    let refused = env.processor(other, env.recorder("b")).await.start().await;
    first.stop().await;
    let error = refused.err().expect("the second mode is refused").to_string();
    assert!(error.contains("mode"), "{error}");
}

/// Java #43701: a 429 on a later page of a read skips no record — with 5 documents a page and
/// 30 % of requests throttled, every one of 1,000 documents arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_43701_a_429_in_the_middle_of_a_page_skips_no_record() {
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:2").await;
    cfp_write(&endpoint, 0, 1000).await;
    common::emulator_control(&endpoint, reqwest::Method::POST, "faults?rate=0.3&kinds=429").await;
    let mut worker = cfp_worker(&endpoint)
        .args(["--instance", "w", "--handler", "stdout", "--max-items", "5"])
        .args(["--start-from", "beginning", "--poll-interval", "100ms"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let seen = read_ids(&mut worker, 1000, Duration::from_secs(120)).await;
    let report = common::emulator_control(&endpoint, reqwest::Method::GET, "faults").await;
    terminate(&mut worker).await;
    terminate(&mut emulator).await;
    println!(
        "java #43701: 1000 written, {} delivered with 429s injected: {report}",
        seen.len()
    );
    assert_eq!(seen.len(), 1000);
}

/// .NET #5807: a lease container partitioned on `/partitionKey` (the .NET alternative to `/id`)
/// works: leases created, balanced and checkpointed there, nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dotnet_5807_a_lease_container_partitioned_on_partition_key_works() {
    let env = Env::new(2).await;
    env.account
        .ensure_container(common::DB, common::LEASES, "/partitionKey")
        .await
        .unwrap();
    let a = env.start(env.options("a")).await;
    let b = env.start(env.options("b")).await;
    env.write(0..300).await;
    let all = env.delivered_within(300, Duration::from_secs(20)).await;
    let leases = env.leases().await;
    a.stop().await;
    b.stop().await;
    assert!(all, "missing {:?}", env.deliveries.missing(ids(0..300)));
    assert_eq!(leases.len(), 2);
    assert!(leases.iter().all(|l| l.continuation.is_some()));
}

/// A container with more than 100 physical partitions (the reference processors' users report
/// 1,920): processed by two workers and estimated, its lag right before and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_with_more_than_100_partitions_is_processed_and_estimated() {
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:128").await;
    let mut workers: Vec<_> = ["w0", "w1"]
        .iter()
        .map(|name| {
            cfp_worker(&endpoint)
                .args(["--instance", name, "--handler", "stdout", "--poll-interval", "200ms"])
                .args(common::FAST_LEASES)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    for worker in &mut workers {
        let mut lines = BufReader::new(worker.stdout.take().expect("piped stdout")).lines();
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(id) = serde_json::from_str::<Value>(&line)
                    .ok()
                    .and_then(|d| d["id"].as_str().map(str::to_owned))
                {
                    let _ = tx.send(id);
                }
            }
        });
    }
    cfp_write(&endpoint, 0, 1000).await;
    let mut delivered = BTreeSet::new();
    let _ = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(id) = rx.recv().await {
            delivered.insert(id);
            if delivered.len() >= 1000 {
                break;
            }
        }
    })
    .await;
    let caught_up = eventually(Duration::from_secs(30), || async { lag(&endpoint).await == Some(0) }).await;
    for worker in &mut workers {
        terminate(worker).await;
    }
    cfp_write(&endpoint, 1000, 100).await;
    let behind = lag(&endpoint).await;
    terminate(&mut emulator).await;
    println!(
        "128 partitions: 1000 written, {} delivered by 2 workers; lag after {caught_up}, with 100 more and no worker {behind:?}",
        delivered.len()
    );
    assert_eq!(delivered.len(), 1000);
    assert!(caught_up, "the estimate did not reach 0");
    assert_eq!(behind, Some(100));
}

/// The total lag `cfp estimate` reads.
async fn lag(endpoint: &str) -> Option<u64> {
    let output = common::cfp_estimate(endpoint, &["-o", "json"]).await;
    let estimate: Value = serde_json::from_slice(&output.stdout).ok()?;
    estimate["totalLag"].as_u64()
}

/// Reads the document ids a `--handler stdout` worker prints until `want` distinct came (or the
/// time is up; the rest a moment later is not waited for).
async fn read_ids(worker: &mut tokio::process::Child, want: usize, timeout: Duration) -> BTreeSet<String> {
    let stdout = worker.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = BTreeSet::new();
    let _ = tokio::time::timeout(timeout, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(id) = serde_json::from_str::<Value>(&line)
                .ok()
                .and_then(|doc| doc["id"].as_str().map(str::to_owned))
            {
                seen.insert(id);
                if seen.len() >= want {
                    break;
                }
            }
        }
    })
    .await;
    seen
}
