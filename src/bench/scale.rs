//! The `scale` group: the processor at the size users run it — thousands of leases, tens of
//! instances — on the in-memory emulator at scaled lease timings. Rebalancing 1 → N instances
//! (cycles and moves against the steal-one rule), the lease container's requests and request
//! units per minute idle and busy (against the reference schedule priced at this run's charges),
//! and the longest time a lease went unrenewed with 500 leases on one instance under injected
//! faults (`cfp emulator` on loopback).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::counting_store::CountingStore;
use super::figures::{PATIENCE, is_fair, reference_charges};
use super::processes::emulator;
use super::world::{DB, ITEMS, Received, World, caught_up_reports, wait_until};
use super::{BenchError, BenchSettings, Check, Figure};
use crate::cosmos::{AccountAuth, CosmosAccount};
use crate::processor::{LeaseEvent, LeaseStore, Processor, ProcessorHandle, ProcessorOptions};
use crate::worker::open;

/// The reference schedule: each lease renewed every 17 s, every instance lists every 13 s.
const REFERENCE_RENEW_S: f64 = 17.0;
const REFERENCE_LIST_S: f64 = 13.0;

/// Instances of one processor over many leases, each with its counted lease store.
pub(super) struct Fleet {
    pub(super) handles: Vec<ProcessorHandle>,
    pub(super) stores: Vec<Arc<CountingStore>>,
}

impl Fleet {
    /// Requests and request units of every instance's lease store so far.
    fn totals(&self) -> (u64, f64) {
        let requests = self.stores.iter().map(|s| s.requests.total()).sum();
        let charged = self.stores.iter().map(|s| s.request_charge()).sum();
        (requests, charged)
    }

    /// Requests of one kind of every instance's lease store so far.
    fn count(&self, kind: fn(&super::StoreRequests) -> &std::sync::atomic::AtomicU64) -> u64 {
        self.stores
            .iter()
            .map(|s| kind(&s.requests).load(Ordering::SeqCst))
            .sum()
    }

    /// Requests by kind so far: listings, point reads, replaces, others.
    fn by_kind(&self) -> [u64; 4] {
        [
            self.count(|r| &r.listings),
            self.count(|r| &r.reads),
            self.count(|r| &r.replaces),
            self.count(|r| &r.other),
        ]
    }

    /// Waits until the fleet wrote no lease document for `quiet`.
    pub(super) async fn settled(&self, quiet: Duration, patience: Duration) -> Result<(), BenchError> {
        let writes = || self.count(|r| &r.replaces);
        let last = std::sync::Mutex::new((writes(), Instant::now()));
        wait_until(patience, || async {
            let Ok(mut last) = last.lock() else { return false };
            let now = writes();
            if now != last.0 {
                *last = (now, Instant::now());
            }
            last.1.elapsed() >= quiet
        })
        .await
        .map(|_| ())
        .ok_or_else(|| "the fleet kept writing its leases after the rebalance".into())
    }

    /// Stops the fleet for `error`, and gives it back.
    async fn stopped_for(self, error: BenchError) -> BenchError {
        self.stop().await;
        error
    }

    pub(super) async fn stop(self) {
        futures::future::join_all(self.handles.into_iter().map(ProcessorHandle::stop)).await;
    }
}

/// Physical partitions and leases per partition (at most 50) that make about `leases` leases;
/// how many leases that is.
pub(super) fn layout(leases: usize) -> (u32, u32, usize) {
    let partitions = leases.div_ceil(50).max(1);
    let per_partition = (leases / partitions).max(1);
    (partitions as u32, per_partition as u32, partitions * per_partition)
}

/// Options of instance `name` over `per_partition` leases per partition, timings scaled.
pub(super) fn options(name: &str, per_partition: u32, scale: f64) -> ProcessorOptions {
    let mut options = World::options("scale", name, scale);
    options.leases_per_partition = per_partition;
    options
}

/// The scale figures: rebalance, lease-container cost idle and busy, renewal gap under faults.
pub async fn scale(settings: &BenchSettings) -> Result<Vec<Figure>, BenchError> {
    let mut figures = rebalance_and_cost(settings).await?;
    figures.extend(renewal_gap(settings).await?);
    Ok(figures)
}

/// How a fleet reached its fair share.
pub(super) struct Rebalanced {
    pub(super) fleet: Fleet,
    /// The latest of the new instances' own acquire cycles that took a lease.
    pub(super) cycles: u64,
    /// The most acquire cycles a new instance ran until the fair share (re-listings while
    /// handoffs were under way included).
    pub(super) ran: u64,
    /// Leases the new instances took in their first acquire cycle.
    pub(super) in_first: usize,
    /// Leases acquired by the new instances.
    pub(super) moves: usize,
    /// Seconds from the newcomers' start to the fair share.
    pub(super) seconds: f64,
}

/// Rebalances 1 → N over the leases, then watches the fleet idle and busy.
async fn rebalance_and_cost(settings: &BenchSettings) -> Result<Vec<Figure>, BenchError> {
    let (instances, scale) = (settings.scale_instances.max(2), settings.scale_timing_scale);
    let (partitions, per_partition, leases) = layout(settings.scale_leases);
    let world = World::new(partitions).await?;
    let received = Arc::new(Received::default());
    let Rebalanced {
        fleet,
        cycles,
        ran,
        in_first,
        moves,
        seconds,
    } = rebalance(&world, &received, settings, (per_partition, leases), PATIENCE).await?;
    let watch = Duration::from_secs(settings.idle_seconds);
    let observer = options("observer", per_partition, scale);
    let idle = match idle_cost(&world, &fleet, (&observer, leases), watch).await {
        Ok(idle) => idle,
        Err(error) => return Err(fleet.stopped_for(error).await),
    };
    let batches_before = received.batches.load(Ordering::SeqCst);
    let busy = per_minute(&fleet, watch, || write_steadily(&world, settings.rate, watch)).await;
    let batches = (received.batches.load(Ordering::SeqCst) - batches_before) as f64 * 60.0 / watch.as_secs_f64();
    let priced = fleet.stores[0].clone();
    fleet.stop().await;
    let (renewal, listing) = reference_charges(&priced).await?;
    let share = leases.div_ceil(instances);
    let reference = Reference {
        leases: leases as f64,
        instances: instances as f64,
    };
    let name = format!("{leases} leases, 1 → {instances} instances");
    Ok(vec![
        Figure::ratio(
            &format!(
                "rebalance {name}: acquire cycles to fair share (the newcomers' cycle that took or asked for each lease, {in_first} of {moves} in their first; the busiest ran {ran} cycles in {seconds:.1} s, {:.1} acquire intervals)",
                seconds / options("s0", per_partition, scale).acquire_interval.as_secs_f64()
            ),
            cycles as f64,
            "steal-one: one lease per instance a cycle (its rule)",
            share as f64,
            "≤ 2",
        )
        .against(Check::AtMost(2.0)).counted(),
        Figure::ratio(
            &format!("rebalance {name}: lease moves ({seconds:.1} s)"),
            moves as f64,
            "the fewest possible (every lease beyond the first instance's share moves once)",
            (leases - share) as f64,
            "≤ minimum + 10 %",
        )
        .against(Check::RatioAtMost(1.1)).counted(),
        Figure::ratio(
            &format!("idle lease-container requests per minute, {leases} leases × {instances} instances (default timings)"),
            idle.0 * scale,
            "reference schedule (renew 17 s, list 13 s)",
            reference.requests(1.0, 0.0),
            "≤ 10 % of the reference",
        )
        .against(Check::RatioAtMost(0.1)).counted(),
        Figure::ratio(
            "idle lease-container request units per minute (default timings)",
            idle.1 * scale,
            &format!("reference schedule at this run's charges (renewal {renewal:.2} RU, listing {listing:.2} RU)"),
            reference.units(renewal, listing, 0.0),
            "≤ 10 % of the reference",
        )
        .against(Check::RatioAtMost(0.1)).counted(),
        Figure::ratio(
            &format!(
                "busy lease-container requests per minute ({} writes/s, {batches:.0} batches a minute; this run's timings ×{scale})",
                settings.rate
            ),
            busy.0,
            "reference schedule plus a checkpoint per batch",
            reference.requests(scale, batches),
            "≤ reference",
        )
        .against(Check::RatioAtMost(1.0)).counted(),
    ])
}

/// The fleet's lease-container requests and request units a minute over `watch` in its idle
/// steady state: once every lease carries its owner's caught-up report (one-off writes that come
/// seconds after a rebalance, while the polls back off) and then no lease was written for a
/// renew interval of `options`.
async fn idle_cost(
    world: &World,
    fleet: &Fleet,
    (options, leases): (&ProcessorOptions, usize),
    watch: Duration,
) -> Result<(f64, f64), BenchError> {
    let settling = Instant::now();
    let (store, _) = world.store(options).await?;
    caught_up_reports(&store, leases, PATIENCE).await?;
    fleet.settled(options.renew_interval, PATIENCE).await?;
    tracing::info!(
        seconds = settling.elapsed().as_secs_f64(),
        "idle: every lease reported, none written for a renew interval"
    );
    Ok(per_minute(fleet, watch, || async {}).await)
}

/// Starts one instance over every lease, then `settings.scale_instances - 1` more, and waits for
/// the fair share.
pub(super) async fn rebalance(
    world: &World,
    received: &Arc<Received>,
    settings: &BenchSettings,
    (per_partition, leases): (u32, usize),
    patience: Duration,
) -> Result<Rebalanced, BenchError> {
    let (instances, scale) = (settings.scale_instances.max(2), settings.scale_timing_scale);
    let (first, first_store) = world
        .start_counted(options("s0", per_partition, scale), received.clone())
        .await?;
    wait_until(patience, || async { first.owned_leases().len() == leases })
        .await
        .ok_or("the first instance did not take every lease")?;
    let mut fleet = Fleet {
        handles: vec![first],
        stores: vec![first_store],
    };
    let started = Instant::now();
    let mut events = Vec::new();
    // All at once, as a Deployment scaled from 1 to N starts its pods.
    let starts =
        (1..instances).map(|i| world.start_counted(options(&format!("s{i}"), per_partition, scale), received.clone()));
    for start in futures::future::join_all(starts).await {
        let (handle, store) = start?;
        events.push(handle.subscribe());
        fleet.handles.push(handle);
        fleet.stores.push(store);
    }
    tracing::info!(seconds = started.elapsed().as_secs_f64(), "newcomers started");
    let progress = std::sync::Mutex::new(Instant::now());
    let fair = wait_until(patience, || async {
        let share = leases / instances;
        log_progress(&fleet, share, started, &progress);
        fleet.handles.iter().all(|h| h.owned_leases().len() >= share)
            && world
                .owners("scale")
                .await
                .is_ok_and(|c| is_fair(&c, instances, leases))
    })
    .await;
    let seconds = started.elapsed().as_secs_f64();
    let ran = fleet.handles[1..]
        .iter()
        .map(|h| h.acquire_cycles())
        .max()
        .unwrap_or_default();
    let by_cycle = taken_by_cycle(&mut events);
    tracing::info!(
        seconds,
        ?by_cycle,
        "fair share: leases the newcomers took, by the cycle that took them"
    );
    if fair.is_none() {
        fleet.stop().await;
        return Err(format!("no fair share of {leases} leases over {instances} instances in time").into());
    }
    Ok(Rebalanced {
        fleet,
        cycles: by_cycle.keys().max().copied().unwrap_or_default(),
        ran,
        in_first: by_cycle.get(&1).copied().unwrap_or_default(),
        moves: by_cycle.values().sum(),
        seconds,
    })
}

/// The leases the newcomers took, by their own acquire cycle that took each, counted as the
/// balancing tests count (for a lease its owner handed over, the cycle that asked for it).
fn taken_by_cycle(events: &mut [tokio::sync::broadcast::Receiver<LeaseEvent>]) -> BTreeMap<u64, usize> {
    let mut by_cycle = BTreeMap::new();
    for rx in events {
        while let Ok(event) = rx.try_recv() {
            if let LeaseEvent::Acquired { cycle, .. } = event {
                *by_cycle.entry(cycle).or_default() += 1;
            }
        }
    }
    by_cycle
}

/// Every 10 s while the fleet rebalances: where it stands (`RUST_LOG=changefeed_operator::bench=info`).
fn log_progress(fleet: &Fleet, share: usize, started: Instant, last: &std::sync::Mutex<Instant>) {
    let Ok(mut last) = last.lock() else { return };
    if last.elapsed() < Duration::from_secs(10) {
        return;
    }
    *last = Instant::now();
    let owned: Vec<usize> = fleet.handles.iter().map(|h| h.owned_leases().len()).collect();
    let cycles: Vec<u64> = fleet.handles[1..].iter().map(|h| h.acquire_cycles()).collect();
    let [listings, reads, replaces, _] = fleet.by_kind();
    tracing::info!(
        listings,
        reads,
        replaces,
        seconds = started.elapsed().as_secs(),
        first = owned[0],
        below_share = owned.iter().filter(|n| **n < share).count(),
        newcomers_own = owned[1..].iter().sum::<usize>(),
        fewest = owned.iter().min().copied().unwrap_or_default(),
        cycles_min = cycles.iter().min().copied().unwrap_or_default(),
        cycles_max = cycles.iter().max().copied().unwrap_or_default(),
        "rebalancing"
    );
}

/// The reference processors' lease-container schedule for a fleet.
pub(super) struct Reference {
    /// Leases of the fleet.
    pub(super) leases: f64,
    /// Instances of the fleet.
    pub(super) instances: f64,
}

impl Reference {
    /// Requests a minute at the default timings scaled by `scale`, plus `batches` checkpoints.
    pub(super) fn requests(&self, scale: f64, batches: f64) -> f64 {
        (self.leases * 60.0 / REFERENCE_RENEW_S + self.instances * 60.0 / REFERENCE_LIST_S) / scale + batches
    }

    /// Request units a minute at the default timings, priced at `renewal` and `listing`, plus
    /// `batches` checkpoints priced as renewals.
    pub(super) fn units(&self, renewal: f64, listing: f64, batches: f64) -> f64 {
        (self.leases * 60.0 / REFERENCE_RENEW_S + batches) * renewal
            + self.instances * 60.0 / REFERENCE_LIST_S * listing
    }
}

/// Requests and request units a minute of the fleet's lease stores while `work` runs for `watch`.
async fn per_minute<F, Fut>(fleet: &Fleet, watch: Duration, work: F) -> (f64, f64)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (requests, charged) = fleet.totals();
    let kinds = fleet.by_kind();
    let started = Instant::now();
    tokio::join!(work(), tokio::time::sleep(watch));
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    let (after, charged_after) = fleet.totals();
    let during: Vec<u64> = fleet
        .by_kind()
        .iter()
        .zip(kinds)
        .map(|(after, before)| after - before)
        .collect();
    tracing::info!(
        ?during,
        seconds = minutes * 60.0,
        "watched: listings, reads, replaces, others"
    );
    ((after - requests) as f64 / minutes, (charged_after - charged) / minutes)
}

/// Writes `rate` documents a second for `watch`.
pub(super) async fn write_steadily(world: &World, rate: u32, watch: Duration) {
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
    let started = Instant::now();
    let mut n = 0;
    while started.elapsed() < watch {
        tick.tick().await;
        let _ = world.write_one(1_000_000 + n, None).await;
        n += 1;
    }
}

/// The longest time any of `settings.gap_leases` leases on one instance went without a sign of
/// life — a write of its owner's heartbeat, which keeps them all alive — against `cfp emulator`
/// failing a tenth of the requests (429, 503) and answering each slowly.
async fn renewal_gap(settings: &BenchSettings) -> Result<Vec<Figure>, BenchError> {
    let (partitions, per_partition, leases) = layout(settings.gap_leases);
    let (_emulator, endpoint) = emulator(&[&format!("{DB}/{ITEMS}:/pk:{partitions}")]).await?;
    let account = CosmosAccount::connect(&endpoint, &AccountAuth::emulator_key()).await?;
    let mut options = options("gap", per_partition, settings.timing_scale.max(0.1));
    options.expiration = options.expiration.max(options.renew_interval * 4);
    let renew = options.renew_interval;
    let (monitored, store) = open(&account, &account, &super::world::settings(&options)).await?;
    let store = Arc::new(CountingStore::new(Arc::new(store)));
    let writes = store.writes.clone();
    let beats = store.beats.clone();
    let handler = Arc::new(super::world::CountingHandler(Arc::new(Received::default())));
    let handle = Processor::new(monitored, store, handler, options).start().await?;
    let took = wait_until(PATIENCE, || async { writes.leases() >= leases }).await;
    let faults = reqwest::Client::new()
        .post(format!(
            "{endpoint}_emulator/faults?rate=0.1&kinds=429,503&latencyMs=40"
        ))
        .send()
        .await;
    let measured = async {
        took.ok_or("the instance did not take its leases")?;
        faults.map_err(|e| format!("injecting faults: {e}"))?;
        tokio::time::sleep(renew).await;
        beats.restart();
        tokio::time::sleep(renew * 3).await;
        Ok::<_, BenchError>((beats.longest_gap(), beats.slowest()))
    }
    .await;
    handle.abort();
    let (gap, slowest) = measured?;
    Ok(vec![Figure::ratio(
        &format!("longest time a lease went without a sign of life (s; its owner's heartbeat keeps all of them alive): {leases} leases on one instance, 10 % of requests failing (429, 503), each answered in 20–60 ms"),
        gap.as_secs_f64(),
        &format!("the renew interval plus the slowest heartbeat ({:.2} s)", slowest.as_secs_f64()),
        (renew + slowest).as_secs_f64(),
        "< renew interval + slowest request",
    )
    .against(Check::RatioAtMost(1.0))])
}

#[cfg(test)]
mod tests {
    #[test]
    fn leases_are_laid_out_at_most_50_a_partition() {
        for (wanted, layout) in [
            (2000, (40, 50, 2000)),
            (500, (10, 50, 500)),
            (64, (2, 32, 64)),
            (50, (1, 50, 50)),
        ] {
            assert_eq!(super::layout(wanted), layout, "{wanted}");
        }
    }
}
