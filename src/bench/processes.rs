//! The processes some figures run: `cfp emulator` on loopback, `cfp worker`s, and what the
//! kernel says of them (resident memory, CPU time).

use super::BenchError;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Kills the child when dropped (the benchmark never leaves processes behind).
pub struct Owned(pub Child);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.0.start_kill();
    }
}

/// `/proc/<pid>/status` VmRSS in MiB.
pub fn rss_mib(pid: u32) -> Option<f64> {
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
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// A command running this very `cfp` binary (so a `dist` build measures itself), killed when
/// dropped, logging warnings only.
pub fn cfp() -> Result<Command, BenchError> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the cfp binary: {e}"))?;
    let mut command = Command::new(exe);
    command.kill_on_drop(true).env("RUST_LOG", "warn");
    Ok(command)
}

/// Starts `cfp emulator` with `containers` (specs such as `bench/items:/pk:8`); its endpoint.
pub async fn emulator(containers: &[&str]) -> Result<(Owned, String), BenchError> {
    let mut command = cfp()?;
    command.args(["emulator", "--port", "0"]);
    for spec in containers {
        command.args(["--container", spec]);
    }
    let mut child = command
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
pub async fn metric(port: u16, metric: &str) -> f64 {
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
pub async fn wait_for_metric(port: u16, name: &str, at_least: f64, timeout: Duration) -> Option<()> {
    let deadline = Instant::now() + timeout;
    while metric(port, name).await < at_least {
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Some(())
}

/// `cfp <command>` on the benchmark's `bench/<container>` at `endpoint`.
pub fn cfp_on(command: &str, endpoint: &str, container: &str) -> Result<Command, BenchError> {
    let mut cfp = cfp()?;
    cfp.args([
        command,
        "--endpoint",
        endpoint,
        "--database",
        "bench",
        "--container",
        container,
    ]);
    Ok(cfp)
}

/// A free loopback port.
pub fn free_port() -> Result<u16, BenchError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Starts `cfp worker` of `bench/<container>` as instance `instance` of processor `processor` (stdout
/// handler into /dev/null, pages of 1000, metrics on a free port, more flags in `flags`); the
/// process and its metrics port.
pub fn worker(
    endpoint: &str,
    container: &str,
    processor: &str,
    instance: &str,
    flags: &[&str],
) -> Result<(Owned, u16), BenchError> {
    let port = free_port()?;
    let child = cfp_on("worker", endpoint, container)?
        .args(["--processor", processor, "--instance", instance, "--handler", "stdout"])
        .args(["--max-items", "1000", "--metrics-port", &port.to_string()])
        .args(flags)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting cfp worker: {e}"))?;
    Ok((Owned(child), port))
}

/// Writes a backlog of `documents` into `bench/items` at `endpoint`; how many were written.
pub async fn write_loopback_backlog(endpoint: &str, documents: usize) -> Result<usize, BenchError> {
    let status = cfp_on("write", endpoint, "items")?
        .args(["--count", &documents.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .map_err(|e| format!("cfp write: {e}"))?;
    if status.success() {
        Ok(documents)
    } else {
        Err("cfp write failed".into())
    }
}
