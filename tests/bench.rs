//! `cfp bench --small`: every figure is measured and reported with its baseline (a short run, so
//! that the benchmark cannot rot), and no goal slides unseen: every count (requests, request
//! units, writes, lease moves, acquire cycles, 429s, duplicates, errors) meets its goal, and every
//! measure of time, rate or memory meets its goal within [`MEASURE_MARGIN`] — a regression of
//! several times fails, the noise of a small run on a busy machine does not.

use crate::common;
use crate::control_plane;

/// How far a measure (not a count) of the small run may miss its goal: this run is a debug
/// build beside the rest of the suite, the published figures a release build alone.
const MEASURE_MARGIN: f64 = 4.0;

/// Measures the small run cannot take: the loopback drains of 2 000 documents last tens of
/// milliseconds, timed by polling every 20 ms (ours) and inside the JVM (Java's); the budgeted
/// backlog is 133 documents, two pages of 100, so both of its drain rates span one page's
/// interval (about a millisecond: a raw read timed at 120 000 documents/s in one suite run,
/// ours 17 600). The full run measures both.
const BELOW_RESOLUTION: [&str; 2] = [
    "throughput vs the Java v4 processor",
    "drain of that backlog by one worker",
];

/// Whether `figure` meets its goal, loosened by `margin` (1: the goal itself).
fn meets(figure: &serde_json::Value, margin: f64) -> bool {
    let value = figure["value"].as_f64().unwrap_or(f64::NAN);
    let ratio = figure["ratio"].as_f64();
    let Some((check, limit)) = figure["check"].as_object().and_then(|c| c.iter().next()) else {
        return true;
    };
    let limit = limit.as_f64().unwrap_or(f64::NAN);
    match check.as_str() {
        "atMost" => value <= limit * margin,
        "below" => value < limit * margin,
        "atLeast" => value >= limit / margin,
        "ratioAtMost" => ratio.is_some_and(|r| r <= limit * margin),
        "ratioAtLeast" => ratio.is_some_and(|r| r >= limit / margin),
        other => panic!("unknown check {other} in {figure}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_small_benchmark_reports_every_figure_with_its_baseline() -> Result<(), String> {
    let _heavy = common::heavy().await;
    let json = std::env::temp_dir().join(format!("cfp-bench-{}.json", std::process::id()));
    let k8s_bin = control_plane::binaries().expect("etcd and kube-apiserver (tools/k8s/build.sh)");
    // About 4 minutes alone; three times that beside the suite's other tests on 2 cores.
    let output = tokio::time::timeout(
        std::time::Duration::from_secs(900),
        tokio::process::Command::new(common::CFP)
            .args(["bench", "--small", "--java-peer", &common::java_peer_jar(), "--json"])
            .arg(&json)
            .arg("--k8s-bin")
            .arg(k8s_bin)
            .env("RUST_LOG", "error")
            // A run past the limit is killed with the test, not left running.
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("cfp bench --small finishes")
    .expect("run cfp bench");
    let table = String::from_utf8_lossy(&output.stdout);
    println!("{table}");
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(format!("cfp bench --small: {}\n{}", output.status, tail.join("\n")));
    }
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let names: Vec<&str> = report["figures"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["name"].as_str())
        .collect();
    for wanted in [
        "throughput",
        "handler taking",
        "first document",
        "acquire cycles",
        "lease moves",
        "rebalance 1 → 4 from idle",
        "balance by work",
        "crash failover",
        "crash failover in lease expirations",
        "in-place restart",
        "graceful scale-in",
        "delivered twice",
        "p50",
        "p99",
        "idle RSS",
        "4 worker processes",
        "CPU seconds",
        "operator RSS watching 10 resources",
        "lease-container requests",
        "lease-container request units",
        "vs the Java v4 processor",
        "first document after process start",
        "CPU seconds of the process from its start",
        "what the emulator serves",
        "over 32 leases vs Java v4",
        "acquire cycles to fair share",
        "idle lease-container requests per minute",
        "busy lease-container requests per minute",
        "without a sign of life",
        "scale run on a lease container at 400 RU/s",
        "idle lease-container request units a second",
        "busy: leases lost or moved while checkpoints exceed the budget",
        "drain of that backlog",
        "operator estimate while workers run",
    ] {
        assert!(
            names.iter().any(|n| n.contains(wanted)),
            "no {wanted:?} figure in {names:?}"
        );
    }
    // Returned, not asserted: a panic's backtrace would push the reason out of the tail of the
    // suite's output, which is what CI shows.
    for list in ["failed", "skipped"] {
        let entries = report[list].as_array().map(Vec::len).unwrap_or_default();
        if entries > 0 {
            return Err(format!("{list} groups: {}", report[list]));
        }
    }
    let mut missed = Vec::new();
    for figure in report["figures"].as_array().unwrap() {
        assert!(figure["value"].as_f64().is_some_and(f64::is_finite), "{figure}");
        // Every figure says whether it meets its goal (null only for one without a goal).
        let met = &figure["met"];
        assert!(met.is_boolean() || (met.is_null() && figure["goal"] == "–"), "{figure}");
        let margin = if figure["kind"] == "count" { 1.0 } else { MEASURE_MARGIN };
        let name = figure["name"].as_str().unwrap_or_default();
        if !meets(figure, margin) && !BELOW_RESOLUTION.iter().any(|n| name.contains(n)) {
            missed.push(format!(
                "{} ({}): {} against goal {}",
                figure["name"], figure["kind"], figure["value"], figure["goal"]
            ));
        }
    }
    let counts = report["figures"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "count")
        .count();
    assert!(counts >= 15, "only {counts} figures are counts");
    if missed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "goals missed (measures by more than {MEASURE_MARGIN}×):\n{}",
            missed.join("\n")
        ))
    }
}
