//! Figure 6: what a real `cfp worker` process costs — its idle resident memory with 8 leases and
//! its CPU time per 100 000 documents — against `cfp emulator` on loopback.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::{BenchSettings, Figure};

/// Kills the child when dropped (the benchmark never leaves processes behind).
struct Owned(Child);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.0.start_kill();
    }
}

/// `/proc/<pid>/status` VmRSS in MiB.
fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// User + system CPU seconds of a process (`/proc/<pid>/stat`, clock ticks of 1/100 s).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn cfp() -> Result<Command, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the cfp binary: {e}"))?;
    let mut command = Command::new(exe);
    command.kill_on_drop(true).env("RUST_LOG", "warn");
    Ok(command)
}

/// Starts `cfp emulator` with an 8-partition container; its endpoint.
async fn emulator() -> Result<(Owned, String), String> {
    let mut child = cfp()?
        .args(["emulator", "--port", "0", "--container", "bench/items:/pk:8"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting cfp emulator: {e}"))?;
    let stdout = child.stdout.take().ok_or("no emulator stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let endpoint = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(endpoint) = line.trim().strip_prefix("endpoint:") {
                return Some(endpoint.trim().to_owned());
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .ok_or("cfp emulator did not print its endpoint")?;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((Owned(child), endpoint))
}

/// The sum of `metric` in a worker's /metrics.
async fn metric(port: u16, metric: &str) -> f64 {
    let Ok(response) = reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await else {
        return 0.0;
    };
    let body = response.text().await.unwrap_or_default();
    body.lines()
        .filter(|l| l.starts_with(metric))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until `name` at a worker's /metrics reaches `at_least`; `None` after `timeout`.
async fn wait_for_metric(port: u16, name: &str, at_least: f64, timeout: Duration) -> Option<()> {
    let deadline = Instant::now() + timeout;
    while metric(port, name).await < at_least {
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Some(())
}

/// `cfp <command>` on the benchmark's `bench/items` at `endpoint`.
fn cfp_on(command: &str, endpoint: &str) -> Result<Command, String> {
    let mut cfp = cfp()?;
    cfp.args([
        command,
        "--endpoint",
        endpoint,
        "--database",
        "bench",
        "--container",
        "items",
    ]);
    Ok(cfp)
}

/// A free loopback port.
fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

/// Starts `cfp worker` as processor `processor` (stdout handler into /dev/null, metrics on a free
/// port); the process and its metrics port.
fn worker(endpoint: &str, processor: &str) -> Result<(Owned, u16), String> {
    let port = free_port()?;
    let child = cfp_on("worker", endpoint)?
        .args(["--processor", processor, "--instance", "w0", "--handler", "stdout"])
        .args(["--max-items", "1000", "--metrics-port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting cfp worker: {e}"))?;
    Ok((Owned(child), port))
}

/// Idle RSS of a worker owning 8 leases, and the CPU seconds a worker spends per 100 000
/// documents of a backlog delivered to a handler that discards them (stdout to /dev/null).
pub async fn worker_process(settings: &BenchSettings) -> Result<Vec<Figure>, String> {
    let (_emulator, endpoint) = emulator().await?;
    let (idle, port) = worker(&endpoint, "idle")?;
    let pid = idle.0.id().ok_or("the worker exited")?;
    wait_for_metric(port, "cfp_leases_owned", 8.0, Duration::from_secs(30))
        .await
        .ok_or("the worker did not take its 8 leases")?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle_rss = rss_mib(pid).ok_or("cannot read the worker's memory")?;
    drop(idle);
    // The loopback emulator takes writes far slower than the in-process one: a fifth of the
    // backlog (at least 2 000 documents) is enough for a per-100 000 figure.
    let documents = (settings.documents / 5).max(2_000.min(settings.documents));
    let status = cfp_on("write", &endpoint)?
        .args(["--count", &documents.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .map_err(|e| format!("cfp write: {e}"))?;
    if !status.success() {
        return Err("cfp write failed".into());
    }
    let (busy, port) = worker(&endpoint, "backlog")?;
    let pid = busy.0.id().ok_or("the worker exited")?;
    wait_for_metric(
        port,
        "cfp_documents_processed_total",
        documents as f64,
        Duration::from_secs(300),
    )
    .await
    .ok_or("the worker did not process the documents in time")?;
    let cpu = cpu_seconds(pid).ok_or("cannot read the worker's CPU time")?;
    let busy_rss = rss_mib(pid).unwrap_or_default();
    Ok(vec![
        Figure::plain(
            "worker idle RSS with 8 leases (MiB)",
            idle_rss,
            "~100 MB (.NET host, reference)",
            "≤ 20 MiB",
        ),
        Figure::plain(
            "worker CPU seconds per 100 000 documents (a backlog, from start)",
            cpu * 100_000.0 / documents as f64,
            &format!("RSS after the backlog {busy_rss:.1} MiB"),
            "–",
        ),
    ])
}
