//! One function per benchmark figure, each measured against its baseline in the same run.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::BenchError;
use super::world::{DB, ITEMS, Received, World, now_micros, wait_until};
use super::{BenchSettings, Check, CountingStore, Figure};
use crate::cosmos::{CosmosAccount, StartFrom};
use crate::processor::policy::balancer::Balancing;
use crate::processor::{LeaseEvent, LeaseStore, ProcessorHandle};

/// Longest any single wait of the benchmark may take.
pub const PATIENCE: Duration = Duration::from_secs(300);

/// A raw SDK read of the whole backlog: documents/s to its last document, counted from the start
/// of the read and from its first page (as the loopback figures count processes, which start
/// first).
pub struct RawRead {
    /// From the start of the read to its last page.
    pub from_start: f64,
    /// From its first page to its last.
    pub from_first_page: f64,
}

/// Reads the whole backlog of `bench/<container>` with the SDK directly (a task per feed range,
/// as the processor runs a task per lease; pages of `page`).
pub async fn raw_read(
    account: &CosmosAccount,
    container: &str,
    documents: usize,
    page: u32,
) -> Result<RawRead, BenchError> {
    let monitored = account.monitored(DB, container).await?;
    let ranges = monitored.feed_ranges(true).await?;
    let first_page = Arc::new(std::sync::OnceLock::new());
    let started = Instant::now();
    let counts = futures::future::join_all(ranges.into_iter().map(|range| {
        let (monitored, first_page) = (monitored.clone(), first_page.clone());
        tokio::spawn(async move {
            let mut reader = monitored.reader(&range, None, StartFrom::Beginning, page).await?;
            let (mut count, mut last) = (0, None);
            loop {
                let page = reader.next_page(Duration::from_secs(65)).await?;
                if page.documents.is_empty() {
                    return Ok::<_, crate::cosmos::CosmosError>((count, last));
                }
                let now = Instant::now();
                first_page.get_or_init(|| now);
                (count, last) = (count + page.documents.len(), Some(now));
            }
        })
    }))
    .await;
    let (mut read, mut done) = (0, started);
    for result in counts {
        let (count, last) = result??;
        read += count;
        done = done.max(last.unwrap_or(started));
    }
    if read != documents {
        return Err(format!("the raw read saw {read} documents, not {documents}").into());
    }
    let rate = |from: Instant| documents as f64 / done.duration_since(from).as_secs_f64().max(0.001);
    Ok(RawRead {
        from_start: rate(started),
        from_first_page: rate(first_page.get().copied().unwrap_or(started)),
    })
}

/// One processor instance (no-op handler, pages of 1000) over the backlog: documents per second,
/// and the time to the first delivery.
async fn processor_read(world: &World, round: u32, documents: usize) -> Result<(f64, Duration), BenchError> {
    let mut options = World::options(&format!("throughput{round}"), "w0", 1.0);
    options.max_items = 1000;
    let received = Arc::new(Received::default());
    let started = Instant::now();
    let handle = world.start(options, received.clone()).await?;
    let done = wait_until(PATIENCE, || async {
        received.count.load(Ordering::SeqCst) >= documents
    })
    .await;
    let elapsed = started.elapsed();
    let first = received
        .first
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .map(|f| f.duration_since(started));
    handle.stop().await;
    done.ok_or("the processor did not deliver the backlog in time")?;
    Ok((documents as f64 / elapsed.as_secs_f64(), first.unwrap_or(elapsed)))
}

/// Figure 1 (and the first-document latency): the processor's throughput ÷ the raw SDK read's,
/// interleaved rounds on the same backlog; the median round counts.
pub async fn throughput(settings: &BenchSettings) -> Result<Vec<Figure>, BenchError> {
    let world = World::new(settings.partitions).await?;
    world.write(0..settings.documents).await?;
    let (mut raw, mut ours, mut first) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..settings.rounds {
        raw.push(
            raw_read(&world.account, ITEMS, settings.documents, 1000)
                .await?
                .from_start,
        );
        let (rate, first_delivery) = processor_read(&world, round, settings.documents).await?;
        ours.push(rate);
        first.push(first_delivery.as_secs_f64());
    }
    let (raw, ours, first) = (median(raw), median(ours), median(first));
    Ok(vec![
        Figure::ratio(
            "throughput (documents/s, 1 worker)",
            ours,
            "raw SDK change feed read",
            raw,
            "≥ 0.9 ×",
        )
        .against(Check::RatioAtLeast(0.9)),
        Figure::plain(
            "first document after start on the backlog (s)",
            first,
            "Java v4 processor: 1.7–2.4 s (reference measurement)",
            "< 0.5 s",
        )
        .against(Check::Below(0.5)),
    ])
}

/// A handler that does work: one lease, pages of 100, the handler taking `HANDLER_TIME` a batch.
/// The next page is read while the handler runs, so the lease should move at the handler's own
/// limit (page size ÷ handler time) rather than at page size ÷ (handler time + read time).
pub async fn busy_handler(settings: &BenchSettings) -> Result<Vec<Figure>, BenchError> {
    const HANDLER_TIME: Duration = Duration::from_millis(100);
    const PAGE: u32 = 100;
    let world = World::new(1).await?;
    let documents = (settings.documents / 20).max(500);
    world.write(0..documents).await?;
    // The same lease with a handler that returns at once: how fast reads and checkpoints alone go.
    let reads_only = one_lease_rate(&world, "reads-only", PAGE, Duration::ZERO, documents).await?;
    let busy = one_lease_rate(&world, "busy", PAGE, HANDLER_TIME, documents).await?;
    let handler_limit = f64::from(PAGE) / HANDLER_TIME.as_secs_f64();
    Ok(vec![Figure::ratio(
        &format!(
            "throughput with a handler taking {} ms a batch (documents/s, 1 lease, pages of {PAGE})",
            HANDLER_TIME.as_millis()
        ),
        busy,
        &format!(
            "the slower of the handler's own limit ({handler_limit:.0}: page size ÷ handler time) and the same lease with a handler that returns at once ({reads_only:.0})"
        ),
        handler_limit.min(reads_only),
        "≥ 0.9 × (→ 1 ×)",
    ).against(Check::RatioAtLeast(0.9))])
}

/// Documents per second one lease of processor `processor` delivers (pages of `page`, a handler
/// taking `handler_time` a batch) over the `documents` of `world`'s container, from the end of
/// its first batch to the end of the last.
async fn one_lease_rate(
    world: &World,
    processor: &str,
    page: u32,
    handler_time: Duration,
    documents: usize,
) -> Result<f64, BenchError> {
    let mut options = World::options(processor, "w0", 1.0);
    options.max_items = page;
    let received = Arc::new(Received {
        handler_time,
        ..Received::default()
    });
    let handle = world.start(options, received.clone()).await?;
    let done = wait_until(PATIENCE, || async {
        received.count.load(Ordering::SeqCst) >= documents
    })
    .await;
    handle.stop().await;
    done.ok_or("the processor did not deliver the backlog in time")?;
    // From the end of the first batch to the end of the last, as the handler saw them.
    let (first, first_batch) = *received.first_done.get().ok_or("the processor delivered nothing")?;
    let last = received
        .last_done
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .unwrap_or(first);
    let elapsed = last.duration_since(first).as_secs_f64().max(0.001);
    Ok(documents.saturating_sub(first_batch) as f64 / elapsed)
}

/// Starts `names` as instances of `processor` at once, each recording ids into `received`.
async fn start_all(
    world: &World,
    processor: &str,
    names: &[String],
    scale: f64,
    balancing: Balancing,
    received: &Arc<Received>,
) -> Result<Vec<(String, ProcessorHandle)>, BenchError> {
    let mut handles = Vec::new();
    for name in names {
        let mut options = World::options(processor, name, scale);
        options.leases_per_partition = 4;
        options.balancing = balancing;
        options.poll_interval = Duration::from_millis(200);
        handles.push((name.clone(), world.start(options, received.clone()).await?));
    }
    Ok(handles)
}

/// Whether `counts` has `instances` owners holding `leases` between them as evenly as possible.
pub fn is_fair(counts: &HashMap<String, usize>, instances: usize, leases: usize) -> bool {
    let owned: Vec<usize> = counts.iter().filter(|(o, _)| !o.is_empty()).map(|(_, n)| *n).collect();
    owned.len() == instances
        && owned.iter().sum::<usize>() == leases
        && owned
            .iter()
            .all(|n| *n == leases / instances || *n == leases.div_ceil(instances))
}

/// Scale-out 1 → 4 over 32 leases: (seconds to fair share, acquire cycles, lease moves).
async fn scale_out(
    world: &World,
    processor: &str,
    scale: f64,
    balancing: Balancing,
    idle: Duration,
) -> Result<(f64, u64, usize), BenchError> {
    let received = Arc::new(Received::default());
    let first = start_all(world, processor, &["a".into()], scale, balancing, &received).await?;
    wait_until(PATIENCE, || async {
        world.owners(processor).await.is_ok_and(|c| c.get("a") == Some(&32))
    })
    .await
    .ok_or("the first instance did not take the 32 leases")?;
    // Alone with every lease, the first instance lists less and less often meanwhile.
    tokio::time::sleep(idle).await;
    let names: Vec<String> = ["b", "c", "d"].iter().map(|s| (*s).to_owned()).collect();
    let started = Instant::now();
    let joined = start_all(world, processor, &names, scale, balancing, &received).await?;
    let mut events: Vec<_> = joined.iter().map(|(_, h)| h.subscribe()).collect();
    // Fair when every instance processes its 8 (the store shows a handed-over lease a moment
    // before its new owner takes it up).
    let processing = || first.iter().chain(&joined).all(|(_, h)| h.owned_leases().len() == 8);
    let fair = wait_until(PATIENCE, || async {
        processing() && world.owners(processor).await.is_ok_and(|c| is_fair(&c, 4, 32))
    })
    .await;
    let seconds = started.elapsed().as_secs_f64();
    let cycles = joined.iter().map(|(_, h)| h.acquire_cycles()).max().unwrap_or_default();
    let mut moves = 0;
    for rx in &mut events {
        while let Ok(event) = rx.try_recv() {
            // Every lease a new instance acquires moved away from another instance.
            if matches!(event, LeaseEvent::Acquired { .. }) {
                moves += 1;
            }
        }
    }
    for (_, handle) in first.into_iter().chain(joined) {
        handle.stop().await;
    }
    fair.ok_or("no fair share within the time limit")?;
    Ok((seconds, cycles, moves))
}

/// Figure 2: rebalancing 1 → 4 instances over 32 leases, ours against the reference strategy.
pub async fn rebalance(settings: &BenchSettings) -> Result<Vec<Figure>, BenchError> {
    let world = World::new(8).await?;
    let scale = settings.timing_scale;
    let (fair_s, fair_cycles, fair_moves) = scale_out(&world, "fair", scale, Balancing::Fair, Duration::ZERO).await?;
    let (steal_s, steal_cycles, steal_moves) =
        scale_out(&world, "stealone", scale, Balancing::StealOne, Duration::ZERO).await?;
    // Long enough for the idle back-off to stretch the first instance's listing to the expiration.
    let idle = World::options("x", "x", scale).expiration.mul_f64(2.0);
    let (idle_s, idle_cycles, _) = scale_out(&world, "fairidle", scale, Balancing::Fair, idle).await?;
    Ok(vec![
        Figure::ratio(
            "rebalance 1 → 4 over 32 leases: acquire cycles",
            fair_cycles as f64,
            "steal-one (the reference strategy)",
            steal_cycles as f64,
            "≤ 2 vs 8",
        )
        .against(Check::AtMost(2.0))
        .counted(),
        Figure::ratio(
            "rebalance 1 → 4 over 32 leases: seconds",
            fair_s,
            "steal-one",
            steal_s,
            "–",
        ),
        Figure::ratio(
            "rebalance 1 → 4 from idle (the first instance's listing backed off): acquire cycles",
            idle_cycles as f64,
            "steal-one",
            steal_cycles as f64,
            "≤ 2 vs 8",
        )
        .against(Check::AtMost(2.0))
        .counted(),
        Figure::ratio(
            "rebalance 1 → 4 from idle: seconds",
            idle_s,
            "the same without the idle time before it",
            fair_s,
            "–",
        ),
        Figure::ratio(
            "rebalance 1 → 4 over 32 leases: lease moves",
            fair_moves as f64,
            "steal-one",
            steal_moves as f64,
            "≤ 24 + 10 %",
        )
        .against(Check::AtMost(24.0 * 1.1))
        .counted(),
    ])
}

/// Figures 3 and 4: 4 instances over 32 leases; one is killed (no release): seconds until its
/// leases are processed again; then one stops gracefully while documents are written: seconds
/// to hand over, and duplicates.
pub async fn failover(settings: &BenchSettings) -> Result<Vec<Figure>, BenchError> {
    let world = World::new(8).await?;
    let received = Arc::new(Received {
        record_ids: true,
        ..Received::default()
    });
    let names: Vec<String> = ["a", "b", "c", "d"].iter().map(|s| (*s).to_owned()).collect();
    let scale = settings.timing_scale;
    let mut handles = start_all(&world, "failover", &names, scale, Balancing::Fair, &received).await?;
    wait_until(PATIENCE, || async {
        world.owners("failover").await.is_ok_and(|c| is_fair(&c, 4, 32))
    })
    .await
    .ok_or("no fair share before the crash")?;
    let (_, crashed) = handles.remove(0);
    crashed.abort();
    let taken = wait_until(PATIENCE, || async {
        world
            .owners("failover")
            .await
            .is_ok_and(|c| !c.contains_key("a") && is_fair(&c, 3, 32))
    })
    .await
    .ok_or("the crashed instance's leases were not taken over")?;
    let (_, leaving) = handles.remove(0);
    let (handed, written) = graceful_scale_in(&world, leaving).await?;
    wait_until(PATIENCE, || async {
        received
            .ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
            >= written
    })
    .await
    .ok_or("documents written during the scale-in were not all delivered")?;
    let duplicates = received.duplicates();
    for (_, handle) in handles {
        handle.stop().await;
    }
    let options = World::options("x", "x", scale);
    let (expiration, acquire) = (options.expiration.as_secs_f64(), options.acquire_interval.as_secs_f64());
    Ok(failover_figures(
        taken.as_secs_f64(),
        handed,
        duplicates,
        written,
        expiration,
        acquire,
    ))
}

/// Stops instance `leaving` ("b", one of 3) while documents are written: the seconds until the
/// other two own its leases, and how many documents were written meanwhile.
async fn graceful_scale_in(world: &World, leaving: ProcessorHandle) -> Result<(f64, usize), BenchError> {
    let writing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let writer = {
        let writing = writing.clone();
        async move {
            let mut n = 0;
            while writing.load(Ordering::SeqCst) {
                world.write_one(n, None).await?;
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok::<usize, BenchError>(n)
        }
    };
    let scale_in = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let started = Instant::now();
        leaving.stop().await;
        let handed = wait_until(PATIENCE, || async {
            world
                .owners("failover")
                .await
                .is_ok_and(|c| !c.contains_key("b") && is_fair(&c, 2, 32))
        })
        .await;
        let seconds = started.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs(1)).await;
        writing.store(false, Ordering::SeqCst);
        handed
            .map(|_| seconds)
            .ok_or("the stopped instance's leases were not taken over")
    };
    let (written, handed) = tokio::join!(writer, scale_in);
    Ok((handed?, written?))
}

/// The failover figures from what was measured (seconds) and the lease timings (seconds).
fn failover_figures(
    crash_s: f64,
    handed: f64,
    duplicates: usize,
    written: usize,
    expiration: f64,
    acquire: f64,
) -> Vec<Figure> {
    vec![
        Figure::ratio(
            "crash failover (kill one of 4): seconds until its leases run again",
            crash_s,
            "lease expiration + one acquire (reference)",
            expiration + acquire,
            "≤ expiration + 1 acquire",
        )
        .against(Check::RatioAtMost(1.0)),
        Figure::ratio(
            "crash failover in lease expirations (the same time ÷ the lease expiration)",
            crash_s / expiration,
            "lease expiration + one acquire (reference), in lease expirations",
            (expiration + acquire) / expiration,
            "≤ 1 + 1 acquire",
        )
        .against(Check::RatioAtMost(1.0)),
        Figure::ratio(
            "graceful scale-in (stop one of 4): seconds to hand over",
            handed,
            "one acquire cycle",
            acquire,
            "≤ 1 acquire cycle",
        )
        .against(Check::RatioAtMost(1.0)),
        Figure::plain(
            "graceful scale-in: documents delivered twice",
            duplicates as f64,
            &format!("{written} written during it"),
            "0",
        )
        .against(Check::AtMost(0.0))
        .counted(),
    ]
}

/// Figure 5: write → handler delay under a steady write rate, with the default poll interval.
pub async fn latency(settings: &BenchSettings) -> Result<Vec<Figure>, BenchError> {
    let world = World::new(settings.partitions).await?;
    let received = Arc::new(Received::default());
    let options = World::options("latency", "w0", 1.0);
    let poll = options.poll_interval;
    let handle = world.start(options, received.clone()).await?;
    wait_until(PATIENCE, || async {
        handle.owned_leases().len() == settings.partitions as usize
    })
    .await
    .ok_or("the worker did not take its leases")?;
    let interval = Duration::from_secs_f64(1.0 / f64::from(settings.rate.max(1)));
    let mut tick = tokio::time::interval(interval);
    let total = (settings.latency_seconds * u64::from(settings.rate)) as usize;
    for n in 0..total {
        tick.tick().await;
        world.write_one(n, Some(now_micros())).await?;
    }
    wait_until(PATIENCE, || async { received.count.load(Ordering::SeqCst) >= total })
        .await
        .ok_or("not every document arrived")?;
    handle.stop().await;
    let mut delays = received.delays.lock().map(|d| d.clone()).unwrap_or_default();
    delays.sort_unstable();
    let at = |q: f64| {
        delays
            .get(((delays.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or_default() as f64
            / 1000.0
    };
    Ok(vec![
        Figure::ratio(
            &format!("write → handler p50 (ms) at {} writes/s", settings.rate),
            at(0.5),
            "the reference: half the poll interval",
            poll.as_secs_f64() * 500.0,
            "< 100 ms",
        )
        .against(Check::Below(100.0)),
        Figure::plain(
            &format!("write → handler p99 (ms) at {} writes/s", settings.rate),
            at(0.99),
            "–",
            "–",
        ),
    ])
}

/// Figure 7: requests and request units to the lease container per lease per minute while idle
/// (1 instance, 8 leases, default timings), against the reference schedule (a renewal per lease
/// every 17 s and a full listing per instance every 13 s) priced at the charges of a renewal and
/// a listing measured on the same store in the same run.
pub async fn lease_cost(settings: &BenchSettings) -> Result<Vec<Figure>, BenchError> {
    const LEASES: usize = 8;
    let world = World::new(LEASES as u32).await?;
    let received = Arc::new(Received::default());
    let options = World::options("idle", "w0", settings.timing_scale);
    let (handle, store) = world.start_counted(options, received).await?;
    wait_until(PATIENCE, || async { handle.owned_leases().len() == LEASES })
        .await
        .ok_or("the worker did not take its leases")?;
    let (requests_before, charge_before) = (store.requests.total(), store.request_charge());
    tokio::time::sleep(Duration::from_secs(settings.idle_seconds)).await;
    let made = store.requests.total() - requests_before;
    let charged = store.request_charge() - charge_before;
    handle.stop().await;
    let (renewal, listing) = reference_charges(&store).await?;
    // Timings scaled by `timing_scale` run that much faster: the rate at the default timings is
    // the measured one times the scale.
    let per_lease_minute = settings.timing_scale / LEASES as f64 / (settings.idle_seconds as f64 / 60.0);
    let (renewals, listings) = (60.0 / 17.0, 60.0 / 13.0 / LEASES as f64);
    Ok(vec![
        Figure::ratio(
            "idle lease-container requests per lease per minute (default timings)",
            made as f64 * per_lease_minute,
            "reference schedule (renew 17 s, list 13 s)",
            renewals + listings,
            "≤ reference",
        )
        .against(Check::RatioAtMost(1.0))
        .counted(),
        Figure::ratio(
            "idle lease-container request units per lease per minute",
            charged * per_lease_minute,
            &format!("reference schedule at this run's charges (renewal {renewal:.2} RU, listing {listing:.2} RU)"),
            renewals * renewal + listings * listing,
            "≤ reference",
        )
        .against(Check::RatioAtMost(1.0))
        .counted(),
    ])
}

/// The request units of one renewal-shaped write (a lease written back with an owner and a new
/// timestamp) and of one listing, made on `store` after its worker stopped.
pub(super) async fn reference_charges(store: &CountingStore) -> Result<(f64, f64), BenchError> {
    let before = store.request_charge();
    let snapshot = store.snapshot().await?;
    let listing = store.request_charge() - before;
    let mut lease = snapshot.leases.into_iter().next().ok_or("the store has no lease")?;
    lease.owner = Some("w0".into());
    lease.timestamp = Some(time::OffsetDateTime::now_utc());
    let before = store.request_charge();
    store.replace(&lease).await?;
    Ok((store.request_charge() - before, listing))
}

/// The middle value (the upper one of an even count).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or_default()
}
