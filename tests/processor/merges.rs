//! Merges: two physical partitions merged while workers run. Nothing is lost, the duplicates
//! are counted, and the leases afterwards cover the key space once, as EPK (version 1) leases
//! over the merged partition (what the .NET processor turns a version-0 lease into when its
//! partition merged); the estimate stays right across it.

use std::time::Duration;

use changefeed_operator::cosmos::{EpkRange, StartFrom};
use changefeed_operator::processor::{Lease, ProcessorEstimate, estimate_leases};

use super::while_writing;
use crate::common::{self, Env, eventually, fair, ids};

/// The estimated total lag of `leases` (as they were when taken) against the feed now.
async fn lag_of(env: &Env, leases: &[Lease]) -> u64 {
    let monitored = env.account.monitored(common::DB, common::ITEMS).await.unwrap();
    let estimates = estimate_leases(&monitored, leases, StartFrom::Beginning, 8)
        .await
        .unwrap();
    assert!(estimates.iter().all(|e| e.error.is_none()), "{estimates:?}");
    estimates.iter().map(|e| e.lag).sum()
}

/// The leases' ranges, sorted, and whether they cover the whole key space exactly once.
fn tiles(leases: &[Lease]) -> (Vec<EpkRange>, bool) {
    let mut ranges: Vec<EpkRange> = leases.iter().filter_map(|l| l.range().cloned()).collect();
    ranges.sort();
    let full = EpkRange::full();
    let mut cursor = full.min.clone();
    let mut exact = ranges.len() == leases.len();
    for range in &ranges {
        exact &= range.min == cursor;
        cursor.clone_from(&range.max);
    }
    (ranges.clone(), exact && cursor == full.max)
}

/// Whether every lease is an EPK lease (version 1) and none names a partition that is gone.
fn epk_over(leases: &[Lease], merged: &EpkRange) -> bool {
    leases
        .iter()
        .all(|l| l.version == 1 && l.range().is_some_and(|r| merged.contains(r)))
}

/// Each lease as `token vN [min,max) owner`.
fn show(leases: &[Lease]) -> Vec<String> {
    leases
        .iter()
        .map(|l| {
            let range = l.range().map(|r| format!("[{},{})", r.min, r.max)).unwrap_or_default();
            format!(
                "{} v{} {range} {}",
                l.lease_token,
                l.version,
                l.owner.as_deref().unwrap_or("-")
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_while_writing_keeps_the_leases_as_epk_leases_and_loses_nothing() {
    let started = std::time::Instant::now();
    let env = Env::new(2).await;
    let a = env.start(env.options("a")).await;
    let b = env.start(env.options("b")).await;
    assert!(eventually(Duration::from_secs(10), || async { fair(&env.owners().await, 2, 2) }).await);
    env.write(0..1000).await;
    assert!(env.delivered_within(1000, Duration::from_secs(10)).await);
    // Everything checkpointed: a copy of the leases now is the position the estimate counts from.
    assert!(
        eventually(Duration::from_secs(5), || async {
            lag_of(&env, &env.leases().await).await == 0
        })
        .await
    );
    let before_leases = env.leases().await;
    env.write(1000..1300).await;
    let estimate_before = lag_of(&env, &before_leases).await;

    let partitions = while_writing(
        &env,
        1300..2300,
        env.emulator
            .merge(common::DB, common::ITEMS, ["0", "1"], Duration::from_millis(200)),
    )
    .await
    .unwrap();
    assert_eq!(partitions.len(), 1, "{partitions:?}");
    let merged = partitions[0].range.clone();
    let delivered = env.delivered_within(2300, Duration::from_secs(10)).await;
    let reshaped = eventually(Duration::from_secs(5), || async {
        let leases = env.leases().await;
        tiles(&leases).1 && epk_over(&leases, &merged)
    })
    .await;
    let leases = env.leases().await;
    let missing = env.deliveries.missing(ids(0..2300));
    let duplicates = env.deliveries.duplicates().len();

    // The estimate after the merge, from the leases as they are once everything is handled.
    eventually(Duration::from_secs(5), || async {
        lag_of(&env, &env.leases().await).await == 0
    })
    .await;
    let after_leases = env.leases().await;
    env.write(2300..2600).await;
    let estimate_after = lag_of(&env, &after_leases).await;
    // What the operator's autoscaler reads as the lease count (`ProcessorEstimate::lease_count`).
    let monitored = env.account.monitored(common::DB, common::ITEMS).await.unwrap();
    let lease_count = ProcessorEstimate::new(
        common::PROCESSOR,
        estimate_leases(&monitored, &env.leases().await, StartFrom::Beginning, 8)
            .await
            .unwrap(),
    )
    .lease_count;
    let delivered_after = env.delivered_within(2600, Duration::from_secs(10)).await;
    let missing_after = env.deliveries.missing(ids(2300..2600));
    let shown = show(&leases);
    println!(
        "merge of partitions 0+1 into {} while writing: written 1300 before, 1000 during, 300 after; delivered {} distinct, {duplicates} duplicates, lost {} (after the merge: {}); leases after {shown:?}; estimate of 300 pending before the merge {estimate_before}, after it {estimate_after}; lease count for the autoscaler {lease_count}; {:.1} s",
        partitions[0].id,
        env.deliveries.distinct(),
        missing.len(),
        missing_after.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(delivered && missing.is_empty(), "lost {missing:?}");
    assert!(
        delivered_after && missing_after.is_empty(),
        "lost after the merge: {missing_after:?}"
    );
    assert!(
        reshaped,
        "leases {shown:?} are not EPK leases tiling the merged partition {merged:?}"
    );
    // As on the service, the merged partition's documents keep their LSNs and each parent's
    // continuation resumes where it stopped: with every batch checkpointed and no owner
    // changing, nothing is delivered twice (the emulator's renumbering from 1 is translated
    // at its edge).
    assert_eq!(duplicates, 0, "delivered twice: {:?}", env.deliveries.duplicates());
    assert_eq!(
        lease_count, 2,
        "the autoscaler counts the lease documents: two EPK leases"
    );
    assert_eq!(estimate_before, 300);
    assert_eq!(estimate_after, 300);
    a.stop().await;
    b.stop().await;
}

/// `cfp worker` of processor `merge` posting its batches to `receiver`.
fn worker(endpoint: &str, receiver: &str, instance: &str) -> tokio::process::Child {
    common::cfp_worker(endpoint)
        .args(["--processor", "merge", "--instance", instance, "--handler", "http"])
        .args(["--handler-url", receiver, "--poll-interval", "100ms"])
        .args(common::FAST_LEASES)
        .spawn()
        .expect("spawn cfp worker")
}

/// What `cfp worker --handler http` posts to the URL returned, recorded by document id.
async fn receiver() -> (common::Deliveries, String) {
    let deliveries = common::Deliveries::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/w", listener.local_addr().unwrap());
    common::receive_batches(listener, {
        let deliveries = deliveries.clone();
        move |_, body| {
            let ids = body["documents"].as_array().into_iter().flatten();
            deliveries.record("w", ids.filter_map(|d| d["id"].as_str().map(str::to_owned)));
        }
    });
    (deliveries, url)
}

/// `cfp estimate -o json` of processor `merge`: (total lag, lease count).
async fn cli_estimate(endpoint: &str) -> (u64, u64) {
    let output = common::cfp_estimate(endpoint, &["--processor", "merge", "-o", "json"]).await;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("cfp estimate JSON");
    (
        json["totalLag"].as_u64().unwrap_or(u64::MAX),
        json["leaseCount"].as_u64().unwrap_or(u64::MAX),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_0_leases_released_before_a_merge_become_epk_leases_when_a_cfp_worker_takes_them() {
    let started = std::time::Instant::now();
    let (mut emulator, endpoint) = common::start_emulator("db/items:/pk:2").await;
    let (deliveries, receiver) = receiver().await;
    let account = changefeed_operator::cosmos::CosmosAccount::connect(
        &endpoint,
        &changefeed_operator::cosmos::AccountAuth::emulator_key(),
    )
    .await
    .unwrap();
    let delivered = |n: usize| {
        let deliveries = deliveries.clone();
        async move { eventually(Duration::from_secs(10), || async { deliveries.distinct() >= n }).await }
    };
    let leases = || common::leases_of(&account, "merge");

    let mut first = worker(&endpoint, &receiver, "w1");
    common::cfp_write(&endpoint, 0, 500).await;
    assert!(delivered(500).await);
    common::terminate(&mut first).await;
    let before = leases().await;
    common::cfp_write(&endpoint, 500, 300).await;
    let estimate_before = cli_estimate(&endpoint).await;
    let url = format!("{endpoint}_emulator/merge?database=db&container=items&partitions=0,1");
    let merged = reqwest::Client::new().post(url).send().await.unwrap();
    assert!(merged.status().is_success());
    let ranges = common::emulator_control(&endpoint, reqwest::Method::GET, "ranges?database=db&container=items").await
        ["partitions"]
        .clone();
    // The leases still hold continuations of the partitions before the merge; each resumes on
    // the merged partition where it stopped, as on the service.
    let estimate_merged = cli_estimate(&endpoint).await;
    common::cfp_write(&endpoint, 800, 200).await;

    let mut second = worker(&endpoint, &receiver, "w2");
    let all = delivered(1000).await;
    let reshaped = eventually(Duration::from_secs(10), || async {
        let leases = leases().await;
        tiles(&leases).1 && epk_over(&leases, &EpkRange::full())
    })
    .await;
    let after = leases().await;
    // Once everything is handled, stop the worker and write 300 more: the estimate counts them.
    eventually(Duration::from_secs(5), || async {
        cli_estimate(&endpoint).await.0 == 0
    })
    .await;
    common::terminate(&mut second).await;
    common::cfp_write(&endpoint, 1000, 300).await;
    let estimate_after = cli_estimate(&endpoint).await;
    let missing_after_merge = deliveries.missing(ids(800..1000));
    println!(
        "merge with no worker running, then a cfp worker: partitions after {ranges}; leases before {:?}, after {:?}; written 800 before the merge, 200 after; delivered {} distinct ({all}), {} duplicates, missing {} (after the merge {}); cfp estimate (lag, leases) of 300 pending before the merge {estimate_before:?}, right after it {estimate_merged:?}, of 300 pending later {estimate_after:?}; {:.1} s",
        show(&before),
        show(&after),
        deliveries.distinct(),
        deliveries.duplicates().len(),
        deliveries.missing(ids(0..1000)).len(),
        missing_after_merge.len(),
        started.elapsed().as_secs_f64()
    );
    common::terminate(&mut emulator).await;
    assert!(
        missing_after_merge.is_empty(),
        "written after the merge, lost: {missing_after_merge:?}"
    );
    let missing = deliveries.missing(ids(0..1000));
    assert!(all && missing.is_empty(), "lost: {missing:?}");
    assert_eq!(
        deliveries.duplicates(),
        Vec::<String>::new(),
        "checkpointed before the merge, delivered again after it"
    );
    assert!(reshaped, "leases after: {:?}", show(&after));
    assert_eq!(estimate_before, (300, 2));
    assert_eq!(estimate_after, (300, 2));
}
