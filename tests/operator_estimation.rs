//! The operator's estimate from the workers' lag reports (`autoscaling.estimation:
//! WorkerReports`) against the change feed read of every lease (`ChangeFeed`, what `cfp
//! estimate` does), on the in-memory emulator with real workers: the same figures, without
//! reading the feed for owned leases that are caught up or whose report is exact.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use changefeed_operator::cosmos::MonitoredContainer;
use changefeed_operator::operator::crd::Estimation;
use changefeed_operator::operator::estimation::{How, estimate_in};
use changefeed_operator::operator::reported::ReportMemory;
use changefeed_operator::processor::lag_report::LATEST_LSN_PROPERTY;
use changefeed_operator::processor::{
    Batch, ChangeHandler, HandlerError, LeaseStore, ProcessorEstimate, ProcessorOptions,
};
use tokio::sync::Semaphore;

use crate::common::{DB, Env, ITEMS, eventually};

/// Delivers every lease's first batch at once, then waits for a permit per batch.
struct GatedHandler {
    gate: Arc<Semaphore>,
    seen: std::sync::Mutex<std::collections::HashSet<String>>,
}

#[async_trait]
impl ChangeHandler for GatedHandler {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        let first = self
            .seen
            .lock()
            .map(|mut seen| seen.insert(batch.lease_token.to_owned()))
            .unwrap_or(false);
        if !first {
            // The permit is given back: once opened, the gate stays open.
            drop(self.gate.acquire().await);
        }
        Ok(())
    }
}

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
    let gate = Arc::new(Semaphore::new(0));
    let handler = Arc::new(GatedHandler {
        gate: gate.clone(),
        seen: Default::default(),
    });
    let worker = env.processor(options.clone(), handler).await.start().await.unwrap();
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
    let probe = Probe {
        store: store.as_ref(),
        monitored: &monitored,
        options: &options,
    };
    let mut memory = ReportMemory::default();
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
    if per_partition == 1 {
        assert_eq!(reads(&reported), 0, "whole partitions: exact from the reports");
    }

    gate.add_permits(1);
    let caught_up = eventually(Duration::from_secs(30), || async {
        let mut fresh = ReportMemory::default();
        let now = probe.estimate(Estimation::WorkerReports, &mut fresh).await;
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
