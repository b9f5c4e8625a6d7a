//! The demo's script while it runs: workers and a writer started, then every tick the scripted
//! events (a `kill -9`, a split, a new worker, the end of writing) and what they led to
//! (failover, the split's children, rebalancing, the drain), shown as they happen.

use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::fleet::{Deliveries, Worker};
use super::view::{Frame, View, WorkerLine};
use super::{CONTAINER, DATABASE, DemoError, DemoSettings, Done, Schedule, Verification, Writer, estimate, owners};
use crate::cosmos::MonitoredContainer;
use crate::emulator::Emulator;
use crate::processor::{CosmosLeaseStore, ProcessorOptions};
use crate::worker::{WorkerSettings, open};

/// The longest wait for the drain after writing stopped.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// A running demo.
pub(super) struct Demo {
    settings: DemoSettings,
    emulator: Emulator,
    monitored: MonitoredContainer,
    store: CosmosLeaseStore,
    logs: std::path::PathBuf,
    view: View,
    started: Instant,
    deliveries: Deliveries,
    workers: Vec<Worker>,
    writer: Writer,
    schedule: Schedule,
    done: Done,
    verification: Verification,
    killed: Option<(String, Instant)>,
    added: Option<(String, Instant)>,
    writing_stopped: Option<Instant>,
    /// When the last frame was shown, with the documents written and deliveries then.
    last: (Instant, u64, usize),
    lag: Option<u64>,
}

impl Demo {
    /// Opens the containers, starts the first workers and the writer.
    pub(super) async fn start(settings: DemoSettings, emulator: Emulator) -> Result<Self, DemoError> {
        let account = emulator.account().await?;
        let items = account.documents(DATABASE, CONTAINER).await?;
        let lease_settings = WorkerSettings {
            database: DATABASE.into(),
            container: CONTAINER.into(),
            lease_database: DATABASE.into(),
            lease_container: "leases".into(),
            create_leases: true,
            options: ProcessorOptions::new("demo", "cfp-demo"),
        };
        let (monitored, store) = open(&account, &account, &lease_settings).await?;
        let logs = std::env::temp_dir().join(format!("cfp-demo-{}", std::process::id()));
        std::fs::create_dir_all(&logs).map_err(DemoError::Spawn)?;
        let mut demo = Demo {
            settings,
            emulator,
            monitored,
            store,
            logs,
            view: View::new(),
            started: Instant::now(),
            deliveries: Deliveries::default(),
            workers: Vec::new(),
            writer: Writer::start(items, settings.rate),
            schedule: Schedule::new(settings.duration),
            done: Done::default(),
            verification: Verification::empty(settings.partitions as usize),
            killed: None,
            added: None,
            writing_stopped: None,
            last: (Instant::now(), 0, 0),
            lag: None,
        };
        demo.view.event(
            Duration::ZERO,
            &format!(
                "emulator at {}: {DATABASE}/{CONTAINER} with {} partitions; {} workers; writing {}/s for {} s",
                demo.emulator.endpoint(),
                settings.partitions,
                settings.workers,
                settings.rate,
                settings.duration.as_secs()
            ),
        );
        for n in 1..=settings.workers {
            demo.spawn(&format!("worker-{n}"))?;
        }
        Ok(demo)
    }

    /// Starts worker process `name`, its log in the demo's log directory.
    fn spawn(&mut self, name: &str) -> Result<(), DemoError> {
        let log = std::fs::File::create(self.logs.join(format!("{name}.log"))).map_err(DemoError::Spawn)?;
        let endpoint = self.emulator.endpoint();
        let worker =
            Worker::start(name, &endpoint, DATABASE, CONTAINER, log, &self.deliveries).map_err(DemoError::Spawn)?;
        self.workers.push(worker);
        Ok(())
    }

    /// One tick of the script; `true` when the demo is over (drained, or the drain took too long).
    pub(super) async fn step(&mut self) -> Result<bool, DemoError> {
        let elapsed = self.started.elapsed();
        let owners = owners(&self.store).await;
        let lease_count = owners.values().sum::<usize>();
        if self.verification.leases.0 == 0 && lease_count > 0 {
            self.verification.leases = (lease_count, lease_count);
        }
        self.kill_one(elapsed).await;
        self.notice_failover(elapsed, &owners);
        self.split(elapsed).await;
        if self.done.split && lease_count > self.verification.leases.1 {
            self.verification.leases.1 = lease_count;
            self.view.event(
                elapsed,
                &format!("the split lease was replaced by its children: {lease_count} leases"),
            );
        }
        self.add_worker(elapsed)?;
        self.notice_rebalance(elapsed, &owners, lease_count);
        if elapsed >= self.settings.duration && self.writing_stopped.is_none() {
            self.writer.stop.store(true, Ordering::SeqCst);
            self.writing_stopped = Some(Instant::now());
            self.view.event(elapsed, "stopping the writer; draining");
        }
        self.lag = estimate(&self.monitored, &self.store).await.or(self.lag);
        self.show(elapsed, &owners, lease_count);
        Ok(self.drained())
    }

    /// At its time, kills the second live worker with SIGKILL.
    async fn kill_one(&mut self, elapsed: Duration) {
        if elapsed < self.schedule.kill || self.done.kill || self.workers.iter().filter(|w| w.alive()).count() <= 1 {
            return;
        }
        self.done.kill = true;
        if let Some(victim) = self.workers.iter_mut().filter(|w| w.alive()).nth(1) {
            victim.kill().await;
            let name = victim.name.clone();
            self.view.event(
                elapsed,
                &format!("kill -9 {name}: its leases free themselves after the lease expiration"),
            );
            self.killed = Some((name, Instant::now()));
        }
    }

    /// Notes when the killed worker's leases all have other owners.
    fn notice_failover(&mut self, elapsed: Duration, owners: &std::collections::BTreeMap<String, usize>) {
        let Some((name, at)) = &self.killed else { return };
        if self.verification.failover.is_none() && !owners.contains_key(name) {
            self.verification.failover = Some(at.elapsed());
            self.view.event(
                elapsed,
                &format!(
                    "failover: the other workers took all of {name}'s leases in {:.1?}",
                    at.elapsed()
                ),
            );
        }
    }

    /// At its time, splits partition 0 of the monitored container.
    async fn split(&mut self, elapsed: Duration) {
        if elapsed < self.schedule.split || self.done.split {
            return;
        }
        self.done.split = true;
        self.view.event(
            elapsed,
            "splitting partition 0 (reads of it fail for 200 ms, as on the service)",
        );
        match self
            .emulator
            .split(DATABASE, CONTAINER, None, Duration::from_millis(200))
            .await
        {
            Ok(after) => {
                self.verification.partitions.1 = after.len();
                let said = format!("split done: {} partitions", after.len());
                self.view.event(self.started.elapsed(), &said);
            }
            Err(error) => self
                .view
                .event(self.started.elapsed(), &format!("split failed: {error}")),
        }
    }

    /// At its time, starts one more worker.
    fn add_worker(&mut self, elapsed: Duration) -> Result<(), DemoError> {
        if elapsed < self.schedule.add || self.done.add {
            return Ok(());
        }
        self.done.add = true;
        let name = format!("worker-{}", self.workers.len() + 1);
        self.spawn(&name)?;
        self.view.event(elapsed, &format!("added {name}"));
        self.added = Some((name, Instant::now()));
        Ok(())
    }

    /// Notes when the added worker owns its share of the leases.
    fn notice_rebalance(
        &mut self,
        elapsed: Duration,
        owners: &std::collections::BTreeMap<String, usize>,
        leases: usize,
    ) {
        let Some((name, at)) = &self.added else { return };
        if self.verification.rebalance.is_some() {
            return;
        }
        let alive = self.workers.iter().filter(|w| w.alive()).count().max(1);
        if owners.get(name).copied().unwrap_or(0) >= leases / alive && leases > 0 {
            self.verification.rebalance = Some(at.elapsed());
            self.view.event(
                elapsed,
                &format!("rebalanced: {name} owns its share after {:.1?}", at.elapsed()),
            );
        }
    }

    /// Shows the current frame: throughput, lag and each worker's leases.
    fn show(&mut self, elapsed: Duration, owners: &std::collections::BTreeMap<String, usize>, leases: usize) {
        let (delivered, total) = self.deliveries.totals();
        let written = self.writer.count();
        let since = self.last.0.elapsed().as_secs_f64().max(0.001);
        let workers = self
            .workers
            .iter()
            .map(|w| WorkerLine {
                name: w.name.clone(),
                leases: owners.get(&w.name).copied().unwrap_or(0),
                handled: w.handled(),
                state: if w.killed {
                    "killed -9"
                } else if w.stopped {
                    "stopped"
                } else {
                    "running"
                },
            })
            .collect();
        self.view.show(&Frame {
            elapsed,
            written,
            delivered,
            lag: self.lag,
            writes_per_second: written.saturating_sub(self.last.1) as f64 / since,
            deliveries_per_second: total.saturating_sub(self.last.2) as f64 / since,
            leases,
            workers,
        });
        self.last = (Instant::now(), written, total);
    }

    /// Whether every written document was delivered after writing stopped (or the drain gave up).
    fn drained(&mut self) -> bool {
        let Some(at) = self.writing_stopped else { return false };
        let all = self.writer.written().iter().all(|id| self.deliveries.contains(id));
        if all && self.writer.idle() {
            self.verification.drain = Some(at.elapsed());
            let said = format!(
                "drained: all {} documents delivered {:.1?} after writing stopped",
                self.writer.count(),
                at.elapsed()
            );
            self.view.event(self.started.elapsed(), &said);
            return true;
        }
        if at.elapsed() > DRAIN_LIMIT {
            self.view
                .event(self.started.elapsed(), "drain did not finish within 60 s");
            return true;
        }
        false
    }

    /// Stops the workers, counts what was written and delivered, and prints the verification.
    pub(super) async fn finish(mut self) -> Verification {
        for worker in &mut self.workers {
            worker.stop().await;
        }
        self.view.finish();
        let written = self.writer.written();
        let (delivered, total) = self.deliveries.totals();
        let verification = &mut self.verification;
        verification.written = written.len();
        verification.delivered = delivered;
        verification.lost = written.iter().filter(|id| !self.deliveries.contains(id)).count();
        verification.duplicates = total.saturating_sub(delivered);
        // Nobody may read any more (a closed pipe): the demo still ends as it should.
        let _ = write!(
            std::io::stdout(),
            "\n{}worker logs: {}\n",
            verification.table(),
            self.logs.display()
        );
        self.verification
    }
}
