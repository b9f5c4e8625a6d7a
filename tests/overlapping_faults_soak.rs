//! The soak's short run (issue 40 §6): eight `cfp worker` processes over 256 leases (16 physical
//! partitions × 16 leases each) on `cfp emulator` (two regions, a request-unit budget on both
//! containers) while a seeded schedule makes every fault we can make — `kill -9`, SIGSTOP past
//! the lease expiration, 429s, 503 outages, flaky requests, a slow store, hung change feed reads,
//! splits, merges, a failover, slow handlers, a second process under a live name, a rolling
//! restart, a worker replaced, and their unlucky combinations (a worker more while batches take
//! longer than the expiration, a freeze across a split, a newcomer right after a crash, a
//! handoff under throttling) — two workers' wall clocks 8 s ahead and behind (libfaketime).
//! Then an independent checker (`tools/soak/check.py`, Python's standard library, nothing of the
//! processor) verifies the logs: nothing lost, per partition key in order within each delivery
//! run, no checkpoint moving backwards, duplicates only around faults and counted, twins
//! refused, no late deliveries by a deposed owner past its batches in flight. See docs/soak.md.
//!
//! One round of the schedule (each fault once). `CFP_SOAK_SEED=<n>` replays a schedule (default
//! 40), `CFP_SOAK_DURATION=30m` makes it the long run; the logs stay in
//! `/tmp/soak-<seed>-<time>` when it fails.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncBufReadExt;

use crate::common::{self, CFP, DiesWithTest};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Every kind of fault of the schedule (tools/soak/schedule.py's `KINDS`).
const KINDS: [&str; 18] = [
    "kill",
    "freeze",
    "throttle",
    "outage",
    "flaky",
    "split",
    "merge",
    "failover",
    "slow_handler",
    "twin",
    "rolling_restart",
    "replace",
    "slow_store",
    "hang",
    "slow_scale_out",
    "freeze_split",
    "newcomer_crash",
    "throttled_handoff",
];

/// Runs `tools/soak/soak.py` with `args` to its end (at most `limit`), its output shown as it
/// comes; answers its exit code and output.
async fn soak(args: &[&str], limit: Duration) -> (Option<i32>, String) {
    let mut child = tokio::process::Command::new("python3")
        .arg(format!("{ROOT}/tools/soak/soak.py"))
        .args(["--cfp", CFP])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .dies_with_test()
        .spawn()
        .expect("python3 runs tools/soak/soak.py");
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    let errors = tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        let mut all = String::new();
        while let Ok(Some(line)) = lines.next_line().await {
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let mut output = String::new();
    let read = async {
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            println!("{line}");
            output.push_str(&line);
            output.push('\n');
        }
        child.wait().await.ok().and_then(|status| status.code())
    };
    let code = tokio::time::timeout(limit, read).await.unwrap_or(None);
    output.push_str(&errors.await.unwrap_or_default());
    (code, output)
}

/// The value of the environment variable `name`, or `default`.
fn knob(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_workers_over_256_leases_lose_nothing_under_every_fault_as_an_independent_checker_sees_it() {
    let _heavy = common::heavy().await;
    let seed = knob("CFP_SOAK_SEED", "40");
    // One round by default, with shorter pauses between the faults; `CFP_SOAK_DURATION` runs
    // rounds for that long instead.
    let rounds: &[&str] = if std::env::var_os("CFP_SOAK_DURATION").is_some() {
        &[]
    } else {
        &["--rounds", "1", "--gap", "0.5"]
    };
    let duration = knob("CFP_SOAK_DURATION", "1s");
    let out = format!(
        "/tmp/soak-{seed}-ci-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    );
    let mut args = vec![
        "--seed",
        seed.as_str(),
        "--duration",
        duration.as_str(),
        "--out",
        out.as_str(),
    ];
    args.extend(rounds);
    let (code, output) = soak(&args, Duration::from_secs(3600 * 2)).await;
    assert_eq!(
        code,
        Some(0),
        "the soak failed (seed {seed}, logs in {out}; replay with CFP_SOAK_SEED={seed}):\n{output}"
    );
    let report: serde_json::Value = std::fs::read(format!("{out}/report.json"))
        .ok()
        .and_then(|raw| serde_json::from_slice(&raw).ok())
        .unwrap_or_default();
    let faults = &report["faults"];
    let missing: Vec<&str> = KINDS
        .iter()
        .copied()
        .filter(|k| faults[k].as_u64().unwrap_or(0) == 0)
        .collect();
    assert!(
        missing.is_empty(),
        "faults the schedule did not make: {missing:?} ({report})"
    );
    assert!(
        report["twins"].as_u64().unwrap_or(0) >= 1,
        "no twin was started: {report}"
    );
    assert!(report["writes"].as_u64().unwrap_or(0) > 0 && report["batches"].as_u64().unwrap_or(0) > 0);
    let _ = std::fs::remove_dir_all(&out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soak_checker_finds_each_kind_of_violation_in_logs_made_for_it() {
    let output = tokio::process::Command::new("python3")
        .args(["-m", "unittest", "-q", "test_check"])
        .current_dir(format!("{ROOT}/tools/soak"))
        .output()
        .await
        .expect("python3 runs the checker's tests");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
