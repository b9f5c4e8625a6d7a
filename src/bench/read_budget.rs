//! The `budgets: read budget` group (issue 55 §5a): eight workers draining a backlog from a
//! container provisioned at 1,000 RU/s while an application writes at 600 RU/s of it, with a
//! read budget of 300 RU/s. The emulator charges a change feed page by what it returns and
//! refuses low-priority requests first ([`crate::emulator`]). Measured in one run:
//!
//! - the application alone for the watch (its 429s: the baseline), then with the fleet;
//! - the fleet's read request units a second in every window of [`WINDOW`], against its budget;
//! - the documents the fleet handled a second, against what the budget allows at what a document
//!   cost to read.
//!
//! The backlog is written while the container is provisioned far higher (the management plane's
//! throughput update then sets 1,000 RU/s: [`crate::emulator::Emulator::set_throughput`]), so that
//! setting it up does not take the 1,000 RU/s ten minutes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::world::{CountingHandler, DB, Received, World, settings as worker_settings, wait_until};
use super::{BenchError, BenchSettings, Check, Figure};
use crate::processor::{Processor, ProcessorHandle, ReadBudget};

/// The monitored container of this group.
const CONTAINER: &str = "reads";
/// Its provisioned throughput while measured (RU/s), and while the backlog is written.
const PROVISIONED: u64 = 1_000;
const SETUP_THROUGHPUT: u64 = 1_000_000;
/// What the application spends of it (RU/s, writes at high priority).
const APPLICATION_UNITS: f64 = 600.0;
/// The fleet's read budget (RU/s).
const READ_BUDGET: u32 = 300;
/// Workers, physical partitions, and leases per partition (two leases a worker).
const WORKERS: usize = 8;
const PARTITIONS: u32 = 4;
const PER_PARTITION: u32 = 4;
/// A document's filler: about 1 KB a document.
const PAYLOAD: usize = 800;
/// How long one window of the fleet's reads is.
const WINDOW: Duration = Duration::from_secs(10);
/// How far the fleet's read request units of any window may be from its budget.
const WINDOW_TOLERANCE: f64 = 0.10;
/// How long the fleet may take to start and share the leases while it already drains, as far
/// as the backlog's size counts it (seconds).
const SHARING_ALLOWANCE: f64 = 20.0;
/// The least a document of [`PAYLOAD`] costs to read (RU): a change feed page is charged by the
/// kilobytes it returns.
const LEAST_UNITS_A_DOCUMENT: f64 = 1.0;

/// What one window showed.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    /// Read request units (change feed pages, listings) a second.
    read_units: f64,
    /// Documents the fleet handled a second.
    handled: f64,
}

/// What one phase showed.
#[derive(Debug, Clone, Default)]
struct Phase {
    /// The application's writes answered 429 (high priority: the SDK retried them).
    throttled: u64,
    /// The application's writes sent.
    writes: u64,
    /// The windows of the fleet's reads (none without it).
    windows: Vec<Window>,
}

/// The application: writes of about 1 KB at a steady rate, at high priority, until stopped.
struct Application {
    stop: CancellationToken,
    writes: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Application {
    fn start(items: crate::cosmos::DocumentContainer, per_second: f64) -> Self {
        let stop = CancellationToken::new();
        let writes = Arc::new(AtomicU64::new(0));
        let every = Duration::from_secs_f64(1.0 / per_second.max(1.0));
        let task = tokio::spawn({
            let (stop, writes) = (stop.clone(), writes.clone());
            async move {
                let mut tick = tokio::time::interval(every);
                // A late tick is not made up in a burst: the application writes steadily.
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while !stop.is_cancelled() {
                    tick.tick().await;
                    let n = writes.fetch_add(1, Ordering::SeqCst);
                    let items = items.clone();
                    tokio::spawn(async move {
                        let _ = items.upsert(&pk(n as usize), &document("app", n as usize)).await;
                    });
                }
            }
        });
        Self { stop, writes, task }
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// The partition key of document `n`.
fn pk(n: usize) -> String {
    format!("pk-{}", n % 997)
}

/// Document `n` of `kind`, about 1 KB.
fn document(kind: &str, n: usize) -> serde_json::Value {
    serde_json::json!({"id": format!("{kind}-{n}"), "pk": pk(n), "payload": "x".repeat(PAYLOAD)})
}

/// Writes the backlog, 64 at a time; returns what a write was charged, on average.
async fn write_backlog(
    world: &World,
    items: &crate::cosmos::DocumentContainer,
    documents: usize,
) -> Result<f64, BenchError> {
    let before = world.load(CONTAINER);
    let results: Vec<Result<(), BenchError>> = futures::stream::iter(0..documents)
        .map(|n| async move {
            items
                .upsert(&pk(n), &document("doc", n))
                .await
                .map(|_| ())
                .map_err(BenchError::from)
        })
        .buffer_unordered(64)
        .collect()
        .await;
    results.into_iter().collect::<Result<(), _>>()?;
    let after = world.load(CONTAINER);
    Ok((after.write_units - before.write_units) / documents.max(1) as f64)
}

/// Watches `windows` windows: the application's 429s and writes, and (with `received`) the
/// fleet's reads and what it handled in each.
async fn watch(
    world: &World,
    app: &Application,
    received: Option<&Received>,
    windows: usize,
    window: Duration,
) -> Phase {
    let start = world.load(CONTAINER);
    let writes = app.writes.load(Ordering::SeqCst);
    let mut phase = Phase::default();
    for _ in 0..windows {
        let before = world.load(CONTAINER);
        let handled = received.map_or(0, |r| r.count.load(Ordering::SeqCst));
        let started = Instant::now();
        tokio::time::sleep(window).await;
        let seconds = started.elapsed().as_secs_f64();
        let after = world.load(CONTAINER);
        if let Some(received) = received {
            let reads = (after.request_units - after.write_units) - (before.request_units - before.write_units);
            phase.windows.push(Window {
                read_units: reads / seconds,
                handled: (received.count.load(Ordering::SeqCst) - handled) as f64 / seconds,
            });
        }
    }
    let end = world.load(CONTAINER);
    let high = |load: &crate::emulator::ContainerLoad| load.throttled - load.low_priority_throttled;
    phase.throttled = high(&end) - high(&start);
    phase.writes = app.writes.load(Ordering::SeqCst) - writes;
    phase
}

/// Starts worker `name` of the fleet with the read budget, delivering to `received`.
async fn start_worker(
    world: &World,
    name: &str,
    received: Arc<Received>,
    scale: f64,
) -> Result<ProcessorHandle, BenchError> {
    let mut options = World::options("reads", name, scale);
    options.leases_per_partition = PER_PARTITION;
    options.read_budget = Some(ReadBudget::RequestUnits(READ_BUDGET));
    let mut settings = worker_settings(&options);
    settings.container = CONTAINER.into();
    let (monitored, store) = crate::worker::open(&world.account, &world.account, &settings).await?;
    Ok(
        Processor::new(monitored, Arc::new(store), Arc::new(CountingHandler(received)), options)
            .start()
            .await?,
    )
}

/// The group: see the module.
pub async fn read_budget(settings: &BenchSettings) -> Result<Vec<Figure>, BenchError> {
    let world = World::new(1).await?;
    world.provision(CONTAINER, "/pk", PARTITIONS, SETUP_THROUGHPUT).await?;
    let items = world.account.documents(DB, CONTAINER).await?;
    // The watch: a minute in windows of ten seconds in the full run.
    let window = WINDOW.min(Duration::from_secs(settings.idle_seconds.max(1)));
    let windows = usize::try_from(settings.idle_seconds / window.as_secs().max(1))
        .unwrap_or(1)
        .max(1);
    let documents = settings.documents.max(backlog_for(window, windows));
    let charge = write_backlog(&world, &items, documents).await?;
    world.set_throughput(CONTAINER, PROVISIONED);
    let app = Application::start(items, APPLICATION_UNITS / charge.max(0.1));
    let alone = watch(&world, &app, None, windows, window).await;
    let received = Arc::new(Received::default());
    let mut fleet = Vec::new();
    for i in 0..WORKERS {
        fleet.push(start_worker(&world, &format!("w{i}"), received.clone(), settings.timing_scale).await?);
    }
    let leases = (PARTITIONS * PER_PARTITION) as usize / WORKERS;
    let shared = wait_until(Duration::from_secs(120), || async {
        fleet.iter().all(|h| h.owned_leases().len() == leases)
    })
    .await;
    // A window's settling after the leases are shared: the parts of the budget follow them.
    tokio::time::sleep(window).await;
    let with = watch(&world, &app, Some(&received), windows, window).await;
    let left = documents.saturating_sub(received.count.load(Ordering::SeqCst));
    for handle in fleet {
        handle.stop().await;
    }
    app.stop().await;
    shared.ok_or("the fleet did not share the leases in time")?;
    if left == 0 {
        // An idle fleet reads below its budget: its windows would measure the backlog's end.
        return Err(format!("the backlog of {documents} documents ran out before the watch ended").into());
    }
    Ok(figures(&alone, &with, charge, left))
}

/// The documents the budget lets the fleet read while it starts, shares the leases, settles
/// and is watched for `windows` of `window`, twice over: a fleet that runs dry reads below its
/// budget, however slowly the machine starts it.
fn backlog_for(window: Duration, windows: usize) -> usize {
    let seconds = SHARING_ALLOWANCE + window.as_secs_f64() * (windows + 1) as f64;
    let per_second = f64::from(READ_BUDGET) / LEAST_UNITS_A_DOCUMENT;
    (2.0 * seconds * per_second).ceil() as usize
}

/// The group's figures.
fn figures(alone: &Phase, with: &Phase, charge: f64, left: usize) -> Vec<Figure> {
    let budget = f64::from(READ_BUDGET);
    let worst = with
        .windows
        .iter()
        .map(|w| (w.read_units - budget).abs() / budget)
        .fold(0.0, f64::max);
    let windows: Vec<String> = with.windows.iter().map(|w| format!("{:.0}", w.read_units)).collect();
    let seconds = with.windows.len().max(1) as f64;
    let read_units = with.windows.iter().map(|w| w.read_units).sum::<f64>() / seconds;
    let handled = with.windows.iter().map(|w| w.handled).sum::<f64>() / seconds;
    let per_document = if handled > 0.0 {
        read_units / handled
    } else {
        f64::INFINITY
    };
    vec![
        Figure::plain(
            &format!(
                "read budget: the fleet's read request units a second, farthest window from the budget ({} windows: {} RU/s; {WORKERS} workers, {:.0} documents left of the backlog)",
                with.windows.len(),
                windows.join(", "),
                left
            ),
            worst,
            &format!("the read budget, {READ_BUDGET} RU/s, of a container of {PROVISIONED} RU/s"),
            &format!("≤ {WINDOW_TOLERANCE} off in every window"),
        )
        .against(Check::AtMost(WINDOW_TOLERANCE)),
        Figure::plain(
            &format!(
                "read budget: the application's writes answered 429 while the fleet drains ({} writes at ~{APPLICATION_UNITS} RU/s, {charge:.1} RU each)",
                with.writes
            ),
            with.throttled as f64,
            &format!(
                "the same application alone in the same run: {} of {} writes answered 429",
                alone.throttled, alone.writes
            ),
            "no more than alone",
        )
        .against(Check::AtMost(alone.throttled as f64)),
        Figure::ratio(
            &format!(
                "read budget: documents the fleet handled a second (pages cost {per_document:.2} RU a document)"
            ),
            handled,
            "what the budget allows at that cost a document",
            budget / per_document,
            "≥ 0.9 ×",
        )
        .against(Check::RatioAtLeast(0.9)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(throttled: u64, reads: &[f64]) -> Phase {
        Phase {
            throttled,
            writes: 1_000,
            windows: reads
                .iter()
                .map(|r| Window {
                    read_units: *r,
                    handled: r / 1.5,
                })
                .collect(),
        }
    }

    #[test]
    fn the_backlog_lasts_past_the_watch_at_the_budgets_pace_for_small_and_full_runs() {
        for (window, windows) in [(Duration::from_secs(3), 1), (WINDOW, 6)] {
            let seconds = backlog_for(window, windows) as f64 * LEAST_UNITS_A_DOCUMENT / f64::from(READ_BUDGET);
            let watched = window.as_secs_f64() * (windows + 1) as f64;
            assert!(
                seconds >= SHARING_ALLOWANCE + watched,
                "{seconds} s for {watched} s watched"
            );
        }
    }

    #[test]
    fn each_read_budget_figure_is_met_on_its_own_goal() {
        let good = figures(&phase(2, &[]), &phase(1, &[290.0, 305.0, 320.0]), 6.0, 1_000);
        assert!(good.iter().all(|f| f.met == Some(true)), "{good:#?}");
        let bad = figures(&phase(0, &[]), &phase(3, &[250.0, 300.0, 400.0]), 6.0, 0);
        assert_eq!(bad[0].met, Some(false), "a window a third over");
        assert!((bad[0].value - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(bad[1].met, Some(false), "more 429s than alone");
        let slow = figures(&phase(0, &[]), &phase(0, &[200.0, 200.0]), 6.0, 0);
        assert_eq!(slow[2].met, Some(false), "two thirds of what the budget allows");
    }
}
