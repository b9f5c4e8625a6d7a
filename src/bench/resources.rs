//! Figure 6: what a real `cfp worker` process costs — its idle resident memory with 8 leases and
//! its CPU time per 100 000 documents — against `cfp emulator` on loopback.

use std::time::Duration;

use super::BenchError;
use super::processes::{cpu_seconds, emulator, rss_mib, wait_for_metric, worker, write_loopback_backlog};
use super::{BenchSettings, Check, Figure};

/// Idle RSS of a worker owning 8 leases, and the CPU seconds a worker spends per 100 000
/// documents of a backlog delivered to a handler that discards them (stdout to /dev/null).
pub async fn worker_process(settings: &BenchSettings) -> Result<Vec<Figure>, BenchError> {
    let (_emulator, endpoint) = emulator(&["bench/items:/pk:8"]).await?;
    let (idle, port) = worker(&endpoint, "items", "idle", "w0", &[])?;
    let pid = idle.0.id().ok_or("the worker exited")?;
    wait_for_metric(port, "cfp_leases_owned", 8.0, Duration::from_secs(30))
        .await
        .ok_or("the worker did not take its 8 leases")?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle_rss = rss_mib(pid).ok_or("cannot read the worker's memory")?;
    drop(idle);
    let documents = write_loopback_backlog(&endpoint, settings.loopback_documents()).await?;
    let (busy, port) = worker(&endpoint, "items", "backlog", "w0", &[])?;
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
        )
        .against(Check::AtMost(20.0)),
        Figure::plain(
            "worker CPU seconds per 100 000 documents (a backlog, from start)",
            cpu * 100_000.0 / documents as f64,
            &format!("RSS after the backlog {busy_rss:.1} MiB"),
            "–",
        ),
    ])
}
