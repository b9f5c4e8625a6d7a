//! The `budgets` group (issue 40 §2): the processor on containers provisioned at 400 RU/s, the
//! service's smallest, as the SDK emulator models it — writes are charged request units and
//! debited from each physical partition's equal share of the budget in a one-second window, and
//! a write past it is answered 429 with a retry-after; the emulator's edge debits every request
//! of the container's documents from it too (a change feed page at 1 RU and 1 RU a KB it
//! returns, a query page at the SDK emulator's flat 1 RU), low priority refused first.
//!
//! - The scale group's run (one instance creating and taking every lease, then the rest of the
//!   fleet started at once) on a lease container at 400 RU/s with one physical partition (as the
//!   service gives such a container): the 429s on the way and how long the budget made it take;
//!   then the fleet idle (request units a second against the budget, beside the reference
//!   schedule's at this run's charges) and busy (checkpoints far beyond what the budget admits:
//!   no lease lost or moved, no heartbeat unwritten for an expiration, no error reported).
//! - A monitored container at 400 RU/s with a backlog: the processor's drain against a raw SDK
//!   read of the same container in the same run.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::broadcast::{self, error::TryRecvError};

use super::figures::{PATIENCE, median, raw_read, reference_charges};
use super::scale::{Fleet, Reference, layout, options, rebalance, write_steadily};
use super::world::{CountingHandler, DB, LEASES, Received, World, settings as worker_settings, wait_until};
use super::{BenchError, BenchSettings, Check, Figure};
use crate::emulator::ContainerLoad;
use crate::processor::{CloseReason, LeaseEvent, Processor, ProcessorHandle};

/// The provisioned throughput of the budgeted containers (RU/s): the service's smallest.
const BUDGET: f64 = 400.0;

/// What one window of the fleet showed.
#[derive(Debug, Default, Clone)]
struct Window {
    /// Request units a second the lease container charged (reads and writes).
    units_per_second: f64,
    /// Of those, the writes' (what the budget is debited).
    write_units_per_second: f64,
    /// Requests the lease container answered 429.
    throttled: u64,
    /// Leases closed as taken by another instance.
    lost: usize,
    /// Leases acquired.
    moved: usize,
    /// Errors the instances reported (what a user sees in the log).
    errors: Vec<String>,
    /// The longest time an instance's heartbeat went unwritten.
    longest_beat_gap: Duration,
    /// Batches the handlers received a minute.
    batches_per_minute: f64,
}

impl Window {
    /// Counts one lease event.
    fn count(&mut self, event: LeaseEvent) {
        match event {
            LeaseEvent::Closed {
                reason: CloseReason::LeaseLost,
                ..
            } => self.lost += 1,
            LeaseEvent::Acquired { .. } => self.moved += 1,
            LeaseEvent::Error { message, .. } => self.errors.push(message),
            _ => {}
        }
    }
}

/// The fleet with its lease events and what its handlers received.
struct Watched {
    fleet: Fleet,
    received: Arc<Received>,
    events: Vec<broadcast::Receiver<LeaseEvent>>,
}

impl Watched {
    fn new(fleet: Fleet, received: Arc<Received>) -> Self {
        let events = fleet.handles.iter().map(ProcessorHandle::subscribe).collect();
        Self {
            fleet,
            received,
            events,
        }
    }

    /// Counts the events since the last call into `window` (events a slow reader missed are
    /// skipped: checkpoints are most of them).
    fn drain_events(&mut self, window: &mut Window) {
        for events in &mut self.events {
            loop {
                match events.try_recv() {
                    Ok(event) => window.count(event),
                    Err(TryRecvError::Lagged(_)) => continue,
                    Err(_) => break,
                }
            }
        }
    }

    /// Watches the fleet for `watch` while `work` runs.
    async fn window<F, Fut>(&mut self, world: &World, watch: Duration, work: F) -> Window
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let mut window = Window::default();
        self.drain_events(&mut Window::default());
        for store in &self.fleet.stores {
            store.beats.restart();
        }
        let before = world.load(LEASES);
        let batches = self.received.batches.load(Ordering::SeqCst);
        let started = Instant::now();
        tokio::join!(work(), tokio::time::sleep(watch));
        let seconds = started.elapsed().as_secs_f64();
        let after = world.load(LEASES);
        window.units_per_second = (after.request_units - before.request_units) / seconds;
        window.write_units_per_second = (after.write_units - before.write_units) / seconds;
        window.throttled = after.throttled - before.throttled;
        let handled = self.received.batches.load(Ordering::SeqCst) - batches;
        window.batches_per_minute = handled as f64 * 60.0 / seconds;
        window.longest_beat_gap = self
            .fleet
            .stores
            .iter()
            .map(|s| s.beats.longest_gap())
            .max()
            .unwrap_or_default();
        self.drain_events(&mut window);
        window
    }
}

/// The scale run at the budget: creating the leases, one instance taking them, the rest of
/// the fleet started.
#[derive(Debug, Default, Clone, Copy)]
struct Run {
    /// From the first instance's start to the fair share.
    seconds: f64,
    /// From the newcomers' start to the fair share.
    rebalance_seconds: f64,
    /// The newcomers' acquire cycles that took a lease, and the leases they took.
    cycles: u64,
    moves: usize,
    /// What the lease container answered during the run.
    load: ContainerLoad,
}

/// What the budgets group's fleet showed, and what to compare it with.
struct LeaseFigures {
    fleet_name: String,
    run: Run,
    idle: Window,
    busy: Window,
    /// The reference schedule's request units a minute at the default timings (renewals and
    /// listings), and what one renewal (a checkpoint costs the same) and one listing were charged.
    reference: f64,
    renewal: f64,
    listing: f64,
    expiration: Duration,
    /// Writes a second while busy, and the lease timings as a share of the defaults.
    rate: u32,
    scale: f64,
}

/// The scale group's fleet on a lease container at 400 RU/s: its run, idle and busy.
pub async fn lease_container(settings: &BenchSettings) -> Result<Vec<Figure>, BenchError> {
    let (partitions, per_partition, leases) = layout(settings.scale_leases);
    let instances = settings.scale_instances.max(2);
    let world = World::new(partitions).await?;
    // One physical partition: the service gives a container of 400 RU/s one.
    world.provision(LEASES, "/id", 1, BUDGET as u64).await?;
    let received = Arc::new(Received::default());
    let started = Instant::now();
    // The budget, not the balancing, sets the pace: every lease moved is a few writes of it.
    let patience = PATIENCE * 3;
    let rebalanced = rebalance(&world, &received, settings, (per_partition, leases), patience).await?;
    let run = Run {
        seconds: started.elapsed().as_secs_f64(),
        rebalance_seconds: rebalanced.seconds,
        cycles: rebalanced.cycles,
        moves: rebalanced.moves,
        load: world.load(LEASES),
    };
    let mut watched = Watched::new(rebalanced.fleet, received);
    let watch = Duration::from_secs(settings.idle_seconds);
    let idle = watched.window(&world, watch, || async {}).await;
    let busy = watched
        .window(&world, watch, || write_steadily(&world, settings.rate, watch))
        .await;
    let priced = watched.fleet.stores[0].clone();
    watched.fleet.stop().await;
    let (renewal, listing) = reference_charges(&priced).await?;
    let reference = Reference {
        leases: leases as f64,
        instances: instances as f64,
    }
    .units(renewal, listing, 0.0);
    let figures = LeaseFigures {
        fleet_name: format!("{leases} leases × {instances} instances"),
        run,
        idle,
        busy,
        reference,
        renewal,
        listing,
        expiration: options("x", per_partition, settings.scale_timing_scale).expiration,
        rate: settings.rate,
        scale: settings.scale_timing_scale,
    };
    Ok(figures.render())
}

impl LeaseFigures {
    /// Every figure of the lease container.
    fn render(&self) -> Vec<Figure> {
        let mut figures = self.run_figures();
        figures.extend(self.idle_figures());
        figures.extend(self.busy_figures());
        figures
    }

    /// What the scale run cost at the budget.
    fn run_figures(&self) -> Vec<Figure> {
        let run = &self.run;
        let needed = run.load.write_units / BUDGET;
        vec![
            Figure::plain(
                &format!(
                    "scale run on a lease container at {BUDGET} RU/s ({}: one instance creating and taking every lease, then the rest started; {:.0} s, the rebalance {:.0} s, {} acquire cycles, {} moves): requests answered 429",
                    self.fleet_name, run.seconds, run.rebalance_seconds, run.cycles, run.moves
                ),
                run.load.throttled as f64,
                "–",
                "0",
            )
            .against(Check::AtMost(0.0)).counted(),
            Figure::ratio(
                &format!(
                    "scale run at {BUDGET} RU/s: seconds (its writes were charged {:.0} RU)",
                    run.load.write_units
                ),
                run.seconds,
                "seconds of the whole budget those writes take (the shortest the run can be at this budget)",
                needed,
                "–",
            ),
        ]
    }

    /// The fleet idle, rates at the default timings (scaled timings run that much faster: the
    /// rate at the default timings is the measured one times the scale).
    fn idle_figures(&self) -> Vec<Figure> {
        let (scale, reference) = (self.scale, self.reference / 60.0);
        vec![
            Figure::ratio(
                &format!(
                    "idle lease-container request units a second, {} at {BUDGET} RU/s (default timings; writes {:.1} of them)",
                    self.fleet_name,
                    self.idle.write_units_per_second * scale,
                ),
                self.idle.units_per_second * scale,
                "the lease container's budget (RU/s)",
                BUDGET,
                "≤ 25 % of the budget",
            )
            .against(Check::RatioAtMost(0.25)).counted(),
            Figure::ratio(
                &format!(
                    "idle: the reference schedule's request units a second, {} (renew 17 s, list 13 s; renewal {:.2} RU, listing {:.2} RU)",
                    self.fleet_name, self.renewal, self.listing
                ),
                reference,
                "the lease container's budget (RU/s)",
                BUDGET,
                "–",
            ),
            Figure::plain(
                &format!("idle lease-container requests answered 429 ({BUDGET} RU/s)"),
                self.idle.throttled as f64,
                "–",
                "0",
            )
            .against(Check::AtMost(0.0)).counted(),
        ]
    }

    /// The fleet busy: checkpoints beyond what the budget admits.
    fn busy_figures(&self) -> Vec<Figure> {
        let (busy, scale) = (&self.busy, self.scale);
        // The reference pays the same checkpoints (one per batch) on top of its schedule.
        let reference = (self.reference / scale + busy.batches_per_minute * self.renewal) / 60.0;
        vec![
            Figure::ratio(
                &format!(
                    "busy lease-container request units a second ({} writes/s, {:.0} batches a minute, timings ×{scale}; {} checkpoints answered 429, each waited and was sent again)",
                    self.rate, busy.batches_per_minute, busy.throttled
                ),
                busy.units_per_second,
                "the reference schedule plus a checkpoint per batch, at this run's charges (RU/s)",
                reference,
                "≤ 1 ×",
            )
            .against(Check::RatioAtMost(1.0)).counted(),
            Figure::ratio(
                "busy: request units a second the budget was debited (writes)",
                busy.write_units_per_second,
                "the lease container's budget (RU/s)",
                BUDGET,
                "–",
            ),
            Figure::plain(
                "busy: leases lost or moved while checkpoints exceed the budget",
                (busy.lost + busy.moved) as f64,
                "–",
                "0",
            )
            .against(Check::AtMost(0.0)).counted(),
            Figure::ratio(
                "busy: longest time an instance's heartbeat went unwritten (s)",
                busy.longest_beat_gap.as_secs_f64(),
                "the lease expiration (longer: its leases could be taken)",
                self.expiration.as_secs_f64(),
                "< 1 ×",
            )
            .against(Check::RatioAtMost(1.0)),
            errors_figure("busy: errors reported beyond the throttling metric", &busy.errors),
        ]
    }
}

/// The count of `errors`, the first one in the name; goal none.
fn errors_figure(what: &str, errors: &[String]) -> Figure {
    let first = errors.first().map(|e| format!(" (first: {e})")).unwrap_or_default();
    Figure::plain(&format!("{what}{first}"), errors.len() as f64, "–", "0")
        .against(Check::AtMost(0.0))
        .counted()
}

/// The monitored container of the drain figure.
const BUDGETED: &str = "budgeted";

/// Documents a page in the drain figure: small enough that a backlog the budget admits in a
/// minute is read in tens of pages.
const PAGE: u32 = 100;

/// A backlog on a monitored container at 400 RU/s (one physical partition): written at what
/// the budget admits, then drained by one processor and by a raw SDK read, in the same run.
pub async fn monitored_container(settings: &BenchSettings) -> Result<Vec<Figure>, BenchError> {
    let documents = (settings.documents / 30).max(120);
    let world = World::new(1).await?;
    world.provision(BUDGETED, "/pk", 1, BUDGET as u64).await?;
    // Each round's worker (a processor of its own) has its lease before the backlog exists,
    // as in production.
    let rounds: Vec<String> = (0..settings.rounds.max(1)).map(|r| format!("drain{r}")).collect();
    for name in &rounds {
        let (handle, _) = start_drain(&world, name, Arc::default()).await?;
        wait_until(PATIENCE, || async { !handle.owned_leases().is_empty() })
            .await
            .ok_or("the worker did not take the lease of the budgeted container")?;
        handle.stop().await;
    }
    let written = write_backlog(&world, documents).await?;
    let (mut raw, mut ours, mut errors) = (Vec::new(), Vec::new(), Vec::new());
    for name in &rounds {
        raw.push(
            raw_read(&world.account, BUDGETED, documents, PAGE)
                .await?
                .from_first_page,
        );
        let (drained, reported) = drain(&world, name, documents).await?;
        ours.push(drained);
        errors.extend(reported);
    }
    Ok(vec![
        Figure::ratio(
            &format!(
                "writing a {documents}-document backlog to a monitored container at {BUDGET} RU/s (documents/s; {} writes answered 429 and retried by the SDK)",
                written.throttled
            ),
            written.rate,
            &format!(
                "what the budget admits: {BUDGET} RU/s ÷ the write's charge ({:.2} RU)",
                written.charge
            ),
            BUDGET / written.charge.max(0.01),
            "–",
        ),
        Figure::ratio(
            &format!(
                "drain of that backlog by one worker (documents/s from its first delivery to its last, pages of {PAGE}, median of {} rounds; change feed pages are debited at 1 RU and 1 RU a KB they return)",
                rounds.len()
            ),
            median(ours),
            "a raw SDK read of the same backlog on the same container, from its first page to its last (what the budget lets a reader have here)",
            median(raw),
            "≥ 0.9 ×",
        )
        .against(Check::RatioAtLeast(0.9)),
        errors_figure("drain: errors reported beyond throttling metrics", &errors),
    ])
}

/// How the backlog was written.
struct Written {
    /// Documents a second.
    rate: f64,
    /// Writes answered 429 (the SDK retried them).
    throttled: u64,
    /// Request units a document's write was charged, on average.
    charge: f64,
}

/// Writes `documents` to the budgeted container, 32 at a time (the SDK retries what the budget
/// refuses).
async fn write_backlog(world: &World, documents: usize) -> Result<Written, BenchError> {
    let items = world.account.documents(DB, BUDGETED).await?;
    let before = world.load(BUDGETED);
    let started = Instant::now();
    let results: Vec<Result<(), BenchError>> = futures::stream::iter(0..documents)
        .map(|n| {
            let items = items.clone();
            async move {
                let pk = format!("pk-{}", n % 97);
                let doc = serde_json::json!({"id": format!("doc-{n}"), "pk": pk, "n": n});
                items.upsert(&pk, &doc).await.map(|_| ()).map_err(BenchError::from)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect::<Result<(), _>>()?;
    let seconds = started.elapsed().as_secs_f64();
    let after = world.load(BUDGETED);
    Ok(Written {
        rate: documents as f64 / seconds,
        throttled: after.throttled - before.throttled,
        // A 429 is charged nothing: each document's one successful write.
        charge: (after.write_units - before.write_units) / documents.max(1) as f64,
    })
}

/// A worker of the budgeted container (pages of [`PAGE`], as the raw read) delivering to
/// `received`; its lease events.
async fn start_drain(
    world: &World,
    name: &str,
    received: Arc<Received>,
) -> Result<(ProcessorHandle, broadcast::Receiver<LeaseEvent>), BenchError> {
    let mut options = World::options(name, "w0", 1.0);
    options.max_items = PAGE;
    let mut settings = worker_settings(&options);
    settings.container = BUDGETED.into();
    let (monitored, store) = crate::worker::open(&world.account, &world.account, &settings).await?;
    let handle = Processor::new(monitored, Arc::new(store), Arc::new(CountingHandler(received)), options)
        .start()
        .await?;
    let events = handle.subscribe();
    Ok((handle, events))
}

/// One worker over the budgeted container: documents a second from its first delivery to its
/// last (how fast it drains; how soon it starts is the throughput group's first-document
/// figure), and the errors it reported.
async fn drain(world: &World, name: &str, documents: usize) -> Result<(f64, Vec<String>), BenchError> {
    let received = Arc::new(Received::default());
    let (handle, mut events) = start_drain(world, name, received.clone()).await?;
    let done = wait_until(PATIENCE, || async {
        received.count.load(Ordering::SeqCst) >= documents
    })
    .await;
    // To the last batch handled, not to the poll that saw it.
    let lock = |at: &std::sync::Mutex<Option<Instant>>| *at.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (first, last) = (lock(&received.first), lock(&received.last_done));
    let seconds = match (first, last) {
        (Some(first), Some(last)) => last.duration_since(first).as_secs_f64().max(0.001),
        _ => f64::INFINITY,
    };
    handle.stop().await;
    done.ok_or("the worker did not drain the backlog in time")?;
    let mut window = Window::default();
    while let Ok(event) = events.try_recv() {
        window.count(event);
    }
    Ok((documents as f64 / seconds, window.errors))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(idle_units: f64, busy: Window, throttled: u64) -> Vec<Figure> {
        LeaseFigures {
            fleet_name: "2000 leases × 50 instances".into(),
            run: Run {
                seconds: 300.0,
                rebalance_seconds: 200.0,
                cycles: 3,
                moves: 1960,
                load: ContainerLoad {
                    throttled,
                    write_units: 96_000.0,
                    ..ContainerLoad::default()
                },
            },
            idle: Window {
                units_per_second: idle_units,
                ..Window::default()
            },
            busy,
            reference: 83_511.0,
            renewal: 11.7,
            listing: 4.0,
            expiration: Duration::from_secs(60),
            rate: 500,
            scale: 1.0,
        }
        .render()
    }

    fn met(figures: &[Figure], starting: &str) -> Option<bool> {
        figures
            .iter()
            .find(|f| f.name.starts_with(starting))
            .and_then(|f| f.met)
    }

    #[test]
    fn each_budget_figure_is_met_or_not_on_its_own_goal() {
        let quiet = Window {
            units_per_second: 300.0,
            batches_per_minute: 20_000.0,
            longest_beat_gap: Duration::from_secs(17),
            ..Window::default()
        };
        let good = figures(46.7, quiet.clone(), 0);
        assert!(good.iter().all(|f| f.met != Some(false)), "{good:#?}");
        assert_eq!(met(&good, "idle lease-container request units"), Some(true));
        // The reference schedule's own cost is shown, against no goal: 83,511 RU a minute.
        let reference = good
            .iter()
            .find(|f| f.name.starts_with("idle: the reference"))
            .map(|f| f.value);
        assert!(reference.is_some_and(|r| (r - 1391.85).abs() < 0.01), "{reference:?}");

        let bad = figures(
            120.0,
            Window {
                lost: 1,
                longest_beat_gap: Duration::from_secs(61),
                errors: vec!["boom".into()],
                ..quiet
            },
            5,
        );
        for starting in [
            "scale run on a lease container",
            "idle lease-container request units",
            "busy: leases lost",
            "busy: longest time",
            "busy: errors reported beyond the throttling metric (first: boom)",
        ] {
            assert_eq!(met(&bad, starting), Some(false), "{starting}");
        }
    }
}
