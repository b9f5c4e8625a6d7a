//! The `scale` group, the operator's estimate (issue 28, figure 4): Cosmos requests per lease
//! per minute of the operator's remaining-work estimate at its default interval (15 s), while
//! a worker owns every lease (caught up) and while the processor is scaled to zero — beside
//! `estimation: ChangeFeed` (every lease's change feed read each time, measured in the same run)
//! and KEDA's `azure-cosmosdb` scaler at its 30 s default (a listing plus one change-feed page
//! per lease per poll). On the in-memory emulator, many leases over few partitions
//! (`leases.perPartition`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::counting_store::CountingStore;
use super::figures::PATIENCE;
use super::world::{Received, World, caught_up_reports, wait_until};
use super::{BenchError, BenchSettings, Check, Figure};
use crate::cosmos::MonitoredContainer;
use crate::operator::crd::Estimation;
use crate::operator::scaling::estimates::{How, estimate_in};
use crate::operator::scaling::worker_reports::{ReportMemory, stale_after};
use crate::processor::{LeaseStore, ProcessorOptions};

/// The operator's default estimate interval, in seconds.
const ESTIMATE_INTERVAL_S: f64 = 15.0;
/// KEDA's `azure-cosmosdb` scaler's default polling interval, in seconds.
const KEDA_POLL_S: f64 = 30.0;
/// Estimates measured per figure.
const ROUNDS: u32 = 4;

/// Physical partitions and leases per partition (at most 50) that make about `leases` leases;
/// how many leases that is.
fn layout(leases: usize) -> (u32, u32, usize) {
    let partitions = leases.div_ceil(50).max(1);
    let per_partition = (leases / partitions).max(1);
    (partitions as u32, per_partition as u32, partitions * per_partition)
}

/// Requests (listings + change-feed reads) of one estimate in `mode`, averaged over [`ROUNDS`].
async fn per_estimate(
    store: &CountingStore,
    monitored: &MonitoredContainer,
    options: &ProcessorOptions,
    mode: Estimation,
) -> Result<f64, BenchError> {
    let how = How {
        mode,
        stale_after: stale_after(std::time::Duration::from_secs(15)),
    };
    let mut memory = ReportMemory::default();
    warm_up(store, monitored, options, how, &mut memory).await?;
    let before = store.requests.total();
    let mut reads = 0u64;
    for _ in 0..ROUNDS {
        let estimate = estimate_in(store as &dyn LeaseStore, monitored, options, how, &mut memory)
            .await
            .map_err(|e| format!("estimating: {e}"))?;
        reads += estimate.leases.iter().map(|l| u64::from(l.reads)).sum::<u64>();
    }
    let listings = store.requests.total() - before;
    Ok((listings + reads) as f64 / f64::from(ROUNDS))
}

/// The operator's first estimate, and a heartbeat of each running owner seen beating after it:
/// the steady state, where the operator knows which owners are alive (a first sight is no sign of
/// life, so the first estimate after the operator starts reads every lease).
async fn warm_up(
    store: &CountingStore,
    monitored: &MonitoredContainer,
    options: &ProcessorOptions,
    how: How,
    memory: &mut ReportMemory,
) -> Result<(), BenchError> {
    let snapshot = store.snapshot().await.map_err(|e| format!("listing the leases: {e}"))?;
    let owned = snapshot.leases.iter().any(|l| l.owner.is_some());
    let beats = || async { store.snapshot().await.map(|s| s.instances).unwrap_or_default() };
    estimate_in(store as &dyn LeaseStore, monitored, options, how, memory)
        .await
        .map_err(|e| format!("estimating: {e}"))?;
    // Listed after the estimate, not before: a beat between a listing before it and its own
    // would pass for the sign of life the estimate had already seen as a first sight.
    let first = beats().await;
    if owned {
        wait_until(PATIENCE, || async { beats().await != first })
            .await
            .ok_or("the worker's heartbeat did not beat")?;
        estimate_in(store as &dyn LeaseStore, monitored, options, how, memory)
            .await
            .map_err(|e| format!("estimating: {e}"))?;
    }
    Ok(())
}

/// Requests per lease per minute of an estimate every `interval_s` costing `requests`.
fn per_lease_minute(requests: f64, leases: usize, interval_s: f64) -> f64 {
    requests * (60.0 / interval_s) / leases.max(1) as f64
}

/// The operator's estimate while a worker runs and while scaled to zero, against `ChangeFeed`'s
/// and KEDA's.
pub async fn estimation_cost(settings: &BenchSettings) -> Result<Vec<Figure>, BenchError> {
    let (partitions, per_partition, leases) = layout(settings.scale_leases);
    let world = World::new(partitions).await?;
    let mut options = World::options("estimated", "w0", settings.timing_scale);
    options.leases_per_partition = per_partition;
    let received = Arc::new(Received::default());
    let worker = world.start(options.clone(), received.clone()).await?;
    wait_until(PATIENCE, || async { worker.owned_leases().len() == leases })
        .await
        .ok_or("the worker did not take every lease")?;
    let documents = leases * 2;
    world.write(0..documents).await?;
    wait_until(PATIENCE, || async {
        received.count.load(Ordering::SeqCst) >= documents
    })
    .await
    .ok_or("the worker did not process the documents")?;
    let operator = World::options("estimated", "changefeed-operator", 1.0);
    let (store, monitored) = world.store(&options).await?;
    // The steady state: every lease's report says it caught up (written once a lease was quiet
    // for a poll interval), as it is at every estimate but the first after a drain.
    caught_up_reports(&store, leases, PATIENCE).await?;
    let running = per_estimate(&store, &monitored, &operator, Estimation::WorkerReports).await?;
    let running_today = per_estimate(&store, &monitored, &operator, Estimation::ChangeFeed).await?;
    worker.stop().await;
    let idle = per_estimate(&store, &monitored, &operator, Estimation::WorkerReports).await?;
    let idle_today = per_estimate(&store, &monitored, &operator, Estimation::ChangeFeed).await?;
    let rate = |requests| per_lease_minute(requests, leases, ESTIMATE_INTERVAL_S);
    let keda = per_lease_minute(1.0 + leases as f64, leases, KEDA_POLL_S);
    let about = format!("{leases} leases, {per_partition} per partition; an estimate every 15 s");
    let today = "today's operator (every lease's change feed each estimate), same run";
    Ok(vec![
        Figure::ratio(
            &format!("operator estimate while workers run: Cosmos requests per lease per minute ({about})"),
            rate(running),
            &format!("{today}; KEDA azure-cosmosdb at 30 s: {keda:.2}"),
            rate(running_today),
            "≤ 0.1",
        )
        .against(Check::AtMost(0.1))
        .counted(),
        Figure::ratio(
            &format!("operator estimate scaled to zero: Cosmos requests per lease per minute ({about})"),
            rate(idle),
            &format!("{today}; KEDA azure-cosmosdb at 30 s: {keda:.2}"),
            rate(idle_today),
            "–",
        ),
    ])
}
