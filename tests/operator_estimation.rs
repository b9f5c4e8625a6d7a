//! The operator's estimate from the workers' lag reports (`autoscaling.estimation:
//! WorkerReports`) against the change feed read of every lease (`ChangeFeed`, what `cfp
//! estimate` does), on the in-memory emulator with real workers: the same figures, without
//! reading the feed for owned leases that are caught up or whose report is exact.

use std::time::Duration;

use changefeed_operator::cosmos::MonitoredContainer;
use changefeed_operator::operator::crd::Estimation;
use changefeed_operator::operator::scaling::estimates::{How, estimate_in};
use changefeed_operator::operator::scaling::worker_reports::ReportMemory;
use changefeed_operator::processor::leases::lag_report::LATEST_LSN_PROPERTY;
use changefeed_operator::processor::{LeaseStore, ProcessorEstimate, ProcessorOptions};

use crate::common::gate::{GateHandler, Hold};
use crate::common::{DB, Env, ITEMS, eventually};

/// Estimates one processor's leases, as the operator does.
struct Probe<'a> {
    store: &'a dyn LeaseStore,
    monitored: &'a MonitoredContainer,
    options: &'a ProcessorOptions,
}

impl Probe<'_> {
    async fn estimate(&self, mode: Estimation, memory: &mut ReportMemory) -> ProcessorEstimate {
        let how = How {
            mode,
            stale_after: Duration::from_secs(60),
        };
        estimate_in(self.store, self.monitored, self.options, how, memory)
            .await
            .unwrap()
    }
}

fn lags(estimate: &ProcessorEstimate) -> Vec<(String, u64)> {
    estimate.leases.iter().map(|l| (l.lease_token.clone(), l.lag)).collect()
}

fn reads(estimate: &ProcessorEstimate) -> u32 {
    estimate.leases.iter().map(|l| l.reads).sum()
}

/// A worker stuck in each lease's second batch of a backlog, then let go: the reported estimate
/// equals the change feed's at both moments; with one lease per partition it reads nothing.
async fn reports_match_the_change_feed(per_partition: u32) {
    let env = Env::new(2).await;
    let mut options = env.options("w");
    options.leases_per_partition = per_partition;
    options.max_items = 10;
    let leases = 2 * per_partition as usize;
    env.write(0..300).await;
    let gate = GateHandler::silent(Hold::AfterFirst);
    let worker = env
        .processor(options.clone(), gate.clone())
        .await
        .start()
        .await
        .unwrap();
    let store = env.store().await;
    let monitored = env.account.monitored(DB, ITEMS).await.unwrap();
    // Every lease checkpointed its first batch (with a report) and is stuck in its second.
    let reported_all = eventually(Duration::from_secs(20), || async {
        let leases_now = env.leases().await;
        leases_now.len() == leases
            && leases_now
                .iter()
                .all(|l| l.owner.is_some() && l.properties.contains_key(LATEST_LSN_PROPERTY))
    })
    .await;
    assert!(reported_all, "every lease reported: {:?}", env.leases().await);
    // Let the pending changes age (freshness is in whole seconds).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let probe = Probe {
        store: store.as_ref(),
        monitored: &monitored,
        options: &options,
    };
    let mut memory = ReportMemory::default();
    // The first estimate sees the owner for the first time: no sign of life yet, so its reports
    // are not trusted and every lease is read. Once its heartbeat is seen beating, they are.
    let beat = || async { env.store().await.snapshot().await.unwrap().instances };
    let first_beats = beat().await;
    let first = probe.estimate(Estimation::WorkerReports, &mut memory).await;
    assert!(
        first.leases.len() == leases && first.leases.iter().all(|l| l.reads > 0),
        "a first sight is no sign of life: every lease is read: {:?}",
        first
            .leases
            .iter()
            .map(|l| (&l.lease_token, l.reads))
            .collect::<Vec<_>>()
    );
    let beaten = eventually(Duration::from_secs(10), || async { beat().await != first_beats }).await;
    assert!(beaten, "the worker's heartbeat beats");
    let reported = probe.estimate(Estimation::WorkerReports, &mut memory).await;
    let read = probe.estimate(Estimation::ChangeFeed, &mut memory).await;
    println!(
        "{per_partition} lease(s) per partition, stuck with a backlog: reported {:?} ({} reads), read {:?} ({} reads)",
        lags(&reported),
        reads(&reported),
        lags(&read),
        reads(&read)
    );
    assert_eq!(lags(&reported), lags(&read));
    assert!(reported.total_lag > 0);
    // Freshness told rather than read: at most the age of the newest change each checkpoint
    // covers, so never below what the read finds, and here (one burst of writes) within a second
    // or two of it.
    println!(
        "oldest pending: reported {:?} s, read {:?} s",
        reported.oldest_pending_seconds, read.oldest_pending_seconds
    );
    let (told, found) = (reported.oldest_pending_seconds, read.oldest_pending_seconds);
    assert!(
        told.zip(found)
            .is_some_and(|(told, found)| told + 1 >= found && told <= found + 2),
        "told {told:?} against read {found:?}"
    );
    if per_partition == 1 {
        assert_eq!(reads(&reported), 0, "whole partitions: exact from the reports");
    }

    gate.open();
    let warm = tokio::sync::Mutex::new(ReportMemory::default());
    let caught_up = eventually(Duration::from_secs(30), || async {
        let now = probe.estimate(Estimation::WorkerReports, &mut *warm.lock().await).await;
        now.total_lag == 0 && reads(&now) == 0
    })
    .await;
    let read = probe.estimate(Estimation::ChangeFeed, &mut memory).await;
    println!("caught up: read {:?}", lags(&read));
    assert!(caught_up, "caught up, told by the reports alone");
    assert_eq!(read.total_lag, 0);
    worker.stop().await;

    // Scaled to zero: nobody owns the leases, their feed is read.
    let idle = probe.estimate(Estimation::WorkerReports, &mut memory).await;
    assert_eq!(reads(&idle), leases as u32, "unowned leases are read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_lags_match_the_change_feed_for_whole_partitions() {
    reports_match_the_change_feed(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_lags_match_the_change_feed_for_sub_ranges() {
    reports_match_the_change_feed(2).await;
}

/// A worker killed (`kill -9`) after it reported every lease caught up leaves its name as the
/// owner and its report of 0: the operator does not trust a report of an owner it has not seen
/// alive within the lease expiration, so 500 changes written after the crash show within two
/// estimates (a processor at zero replicas would otherwise stay there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_owner_s_last_report_is_not_trusted() {
    let (_emulator, endpoint) = crate::common::start_emulator("db/items:/pk:2").await;
    crate::common::cfp_write(&endpoint, 0, 100).await;
    let mut worker = crate::common::cfp_worker(&endpoint)
        .args(["--processor", "p", "--instance", "gone", "--poll-interval", "100ms"])
        .args(crate::common::FAST_LEASES)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn cfp worker");
    let account = changefeed_operator::cosmos::CosmosAccount::connect(
        &endpoint,
        &changefeed_operator::cosmos::AccountAuth::emulator_key(),
    )
    .await
    .unwrap();
    let mut store = None;
    for _ in 0..200 {
        store = crate::common::lease_store(&account, "p").await;
        if store.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let store = store.expect("the worker created its lease container within 20 s");
    let monitored = account.monitored(DB, ITEMS).await.unwrap();
    let mut options = ProcessorOptions::new("p", "operator");
    options.expiration = Duration::from_secs(3);
    let probe = Probe {
        store: &store,
        monitored: &monitored,
        options: &options,
    };
    // Every lease owned by "gone" and reported caught up.
    let caught_up = eventually(Duration::from_secs(30), || async {
        let leases = store.snapshot().await.map(|s| s.leases).unwrap_or_default();
        let read = probe
            .estimate(Estimation::ChangeFeed, &mut ReportMemory::default())
            .await;
        !leases.is_empty()
            && read.total_lag == 0
            && leases.iter().all(|l| {
                l.owner.as_deref() == Some("gone")
                    && l.properties.contains_key(LATEST_LSN_PROPERTY)
                    && changefeed_operator::processor::leases::lag_report::reported_lag(l) == Some(0)
            })
    })
    .await;
    assert!(caught_up, "the worker reported every lease caught up");
    let mut memory = ReportMemory::default();
    // The operator sees the owner alive (its heartbeat beats) before it dies.
    probe.estimate(Estimation::WorkerReports, &mut memory).await;
    let beats = || async { store.snapshot().await.map(|s| s.instances).unwrap_or_default() };
    let before = beats().await;
    assert!(eventually(Duration::from_secs(10), || async { beats().await != before }).await);
    let alive = probe.estimate(Estimation::WorkerReports, &mut memory).await;
    assert_eq!(
        (alive.total_lag, reads(&alive)),
        (0, 0),
        "a live owner's reports are trusted"
    );

    worker.start_kill().expect("kill -9 the worker");
    let _ = worker.wait().await;
    crate::common::cfp_write(&endpoint, 100, 500).await;
    // Estimates as the operator runs them, until one shows the backlog: within the expiration
    // after the owner's last beat (and a margin for a loaded machine).
    let killed = std::time::Instant::now();
    let memory = tokio::sync::Mutex::new(memory);
    let shown = eventually(options.expiration * 2 + Duration::from_secs(2), || async {
        let estimate = probe
            .estimate(Estimation::WorkerReports, &mut *memory.lock().await)
            .await;
        estimate.total_lag == 500
    })
    .await;
    println!(
        "after kill -9 and 500 writes: the backlog shown after {:.1?}",
        killed.elapsed()
    );
    assert!(
        shown,
        "the backlog of a dead owner's leases shows within two expirations"
    );
}
