//! The demo's worker processes: `cfp worker` children with short lease timings, their deliveries
//! (one JSON line per document on stdout) counted per worker and per document id.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

/// The lease timings of demo workers: failover and rebalancing happen within seconds.
pub const ACQUIRE_INTERVAL: Duration = Duration::from_secs(1);
/// A demo worker's lease renew interval.
pub const RENEW_INTERVAL: Duration = Duration::from_secs(1);
/// A demo worker's lease expiration (what a crash costs without the operator's pod watch).
pub const LEASE_EXPIRATION: Duration = Duration::from_secs(5);

/// Every delivery: document id → how many times it was delivered.
#[derive(Clone, Default)]
pub struct Deliveries {
    counts: Arc<Mutex<HashMap<String, u32>>>,
}

impl Deliveries {
    fn record(&self, id: String) {
        *self.counts().entry(id).or_default() += 1;
    }

    /// (distinct documents, deliveries in all).
    pub fn totals(&self) -> (usize, usize) {
        let counts = self.counts();
        (counts.len(), counts.values().map(|n| *n as usize).sum())
    }

    /// Whether document `id` was delivered.
    pub fn contains(&self, id: &str) -> bool {
        self.counts().contains_key(id)
    }

    /// The deliveries by document; a lock poisoned by a panic elsewhere is used as it is.
    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One worker process.
pub struct Worker {
    /// Its instance name.
    pub name: String,
    /// Documents it handled.
    pub handled: Arc<std::sync::atomic::AtomicU64>,
    /// Killed (-9) by the demo.
    pub killed: bool,
    /// Stopped gracefully at the end.
    pub stopped: bool,
    child: Child,
}

impl Worker {
    /// Starts `cfp worker` as instance `name` against `endpoint`, logging to `log`.
    pub fn start(
        name: &str,
        endpoint: &str,
        database: &str,
        container: &str,
        log: std::fs::File,
        deliveries: &Deliveries,
    ) -> std::io::Result<Self> {
        let exe = std::env::current_exe()?;
        let seconds = |d: Duration| format!("{}ms", d.as_millis());
        let mut child = Command::new(exe)
            .args([
                "worker",
                "--endpoint",
                endpoint,
                "--database",
                database,
                "--container",
                container,
            ])
            .args(["--processor", "demo", "--instance", name, "--handler", "stdout"])
            .args(["--poll-interval", "100ms", "--max-items", "100"])
            .args(["--lease-acquire-interval", &seconds(ACQUIRE_INTERVAL)])
            .args(["--lease-renew-interval", &seconds(RENEW_INTERVAL)])
            .args(["--lease-expiration", &seconds(LEASE_EXPIRATION)])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        let handled = Arc::new(std::sync::atomic::AtomicU64::new(0));
        if let Some(stdout) = child.stdout.take() {
            let (deliveries, handled) = (deliveries.clone(), handled.clone());
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let id = serde_json::from_str::<serde_json::Value>(&line)
                        .ok()
                        .and_then(|doc| doc.get("id").and_then(|id| id.as_str().map(str::to_owned)));
                    if let Some(id) = id {
                        deliveries.record(id);
                        handled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
        Ok(Self {
            name: name.to_owned(),
            handled,
            killed: false,
            stopped: false,
            child,
        })
    }

    /// Kills the process at once (SIGKILL): no lease is released.
    pub async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        self.killed = true;
    }

    /// Stops the process gracefully (SIGTERM): it finishes its batch and releases its leases.
    pub async fn stop(&mut self) {
        if self.killed || self.stopped {
            return;
        }
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: kill(2) with a pid of our own child and a valid signal number.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
        }
        self.stopped = true;
    }

    /// Documents handled so far.
    pub fn handled(&self) -> u64 {
        self.handled.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether it is still meant to run.
    pub fn alive(&self) -> bool {
        !self.killed && !self.stopped
    }
}
