//! KEDA's own `azure-cosmosdb` scaler (the Go module `github.com/kedacore/keda/v2` v2.21.0,
//! built unchanged by `tests/keda/build.sh`) reads the lease container `cfp worker` writes on
//! `cfp emulator` and reports the total lag `cfp estimate` reports: 0 and inactive after a drain,
//! N and active after N writes with no worker, and the same again after a split.
//!
//! KEDA reads version-0 leases (`LeaseToken` = the partition key range id) and finds them by the
//! id prefix `<processor><first label of the account host>.`; the emulator is addressed as
//! `127.0.0.1` so that prefix is our lease ids' `<processor>127.0.0.1_…`.

use std::time::Duration;

use changefeed_operator::cosmos::EMULATOR_KEY;

use crate::common::{
    CFP, DB, DiesWithTest, ITEMS, LEASES, cfp_estimate, cfp_write, emulator_control, eventually, start_emulator,
    terminate,
};

/// The processor name `cfp worker` and `cfp estimate` use by default.
const PROCESSOR: &str = "changefeed";

/// What KEDA's scaler published: (metric, active).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Keda {
    metric: u64,
    active: bool,
}

/// Builds KEDA's scaler command once per test binary and returns its path.
fn keda_scaler() -> String {
    static BIN: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    crate::common::built_once(&BIN, "tests/keda/build.sh", "KEDA's scaler (Go is needed")
}

/// Runs KEDA's scaler once against `endpoint` (a threshold above any backlog here, so that the
/// metric is the total lag).
async fn keda(bin: &str, endpoint: &str) -> Keda {
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(bin)
            .args([endpoint, EMULATOR_KEY, DB, ITEMS, DB, LEASES, PROCESSOR, "1000000"])
            .output(),
    )
    .await
    .expect("KEDA's scaler answers within 60 s")
    .expect("run KEDA's scaler");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let answer: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "KEDA's scaler printed {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    assert!(output.status.success(), "KEDA's scaler failed: {answer}");
    Keda {
        metric: answer["metric"].as_f64().map_or(u64::MAX, |m| m.round() as u64),
        active: answer["active"].as_bool().unwrap_or(false),
    }
}

/// `cfp estimate`'s total lag and lease count.
async fn estimate(endpoint: &str) -> (u64, u64) {
    match try_estimate(endpoint).await {
        Ok(figures) => figures,
        Err(error) => panic!("{error}"),
    }
}

/// Like [`estimate`]; the command's error while it fails (no lease container yet, say).
async fn try_estimate(endpoint: &str) -> Result<(u64, u64), String> {
    let output = cfp_estimate(endpoint, &["-o", "json"]).await;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).map_err(|e| e.to_string())?;
    Ok((
        json["totalLag"].as_u64().unwrap_or(u64::MAX),
        json["leaseCount"].as_u64().unwrap_or(0),
    ))
}

fn start_worker(endpoint: &str, per_partition: u32) -> tokio::process::Child {
    tokio::process::Command::new(CFP)
        .args(["worker", "--endpoint", endpoint, "--database", DB, "--container", ITEMS])
        .args(["--instance", "w", "--poll-interval", "100ms"])
        .args(["--leases-per-partition", &per_partition.to_string()])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .dies_with_test()
        .spawn()
        .expect("spawn cfp worker")
}

/// Runs a worker until `cfp estimate` says it drained `leases` leases, then stops it.
async fn drain(endpoint: &str, leases: u64) {
    drain_leases(endpoint, leases, 1).await;
}

/// [`drain`] with `per_partition` leases per partition.
async fn drain_leases(endpoint: &str, leases: u64, per_partition: u32) {
    let mut worker = start_worker(endpoint, per_partition);
    // Until the worker has created the lease container, `cfp estimate` fails: waited for too.
    let drained = eventually(Duration::from_secs(60), || async {
        try_estimate(endpoint).await == Ok((0, leases))
    })
    .await;
    terminate(&mut worker).await;
    assert!(
        drained,
        "the worker did not drain {leases} leases: {:?}",
        estimate(endpoint).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kedas_scaler_reports_the_lag_cfp_estimate_reports() {
    let bin = tokio::task::spawn_blocking(keda_scaler)
        .await
        .expect("build KEDA's scaler");
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:2").await;
    assert!(endpoint.contains("127.0.0.1"), "{endpoint}");
    cfp_write(&endpoint, 0, 200).await;
    drain(&endpoint, 2).await;
    let drained = keda(&bin, &endpoint).await;

    cfp_write(&endpoint, 200, 300).await;
    let backlog = (estimate(&endpoint).await, keda(&bin, &endpoint).await);

    let split = format!("split?database={DB}&container={ITEMS}");
    emulator_control(&endpoint, reqwest::Method::POST, &split).await;
    let just_split = (estimate(&endpoint).await, keda(&bin, &endpoint).await);
    drain(&endpoint, 3).await;
    let split_drained = keda(&bin, &endpoint).await;
    cfp_write(&endpoint, 500, 150).await;
    let after_split = (estimate(&endpoint).await, keda(&bin, &endpoint).await);
    println!(
        "KEDA after a drain: {drained:?}; 300 writes: cfp estimate {:?}, KEDA {:?}; \
         right after a split: cfp estimate {:?}, KEDA {:?}; drained after it: {split_drained:?}; \
         150 more writes: cfp estimate {:?}, KEDA {:?}",
        backlog.0, backlog.1, just_split.0, just_split.1, after_split.0, after_split.1
    );
    assert_eq!(
        drained,
        Keda {
            metric: 0,
            active: false
        }
    );
    assert_eq!(backlog.0, (300, 2));
    assert_eq!(
        backlog.1,
        Keda {
            metric: 300,
            active: true
        }
    );
    // The parent's lease still names the gone range: KEDA cannot read it and asks for a worker
    // (active) to split it, as it does for the .NET processor's leases.
    assert_eq!(just_split.0, (300, 2));
    assert!(just_split.1.active, "{:?}", just_split.1);
    assert_eq!(
        split_drained,
        Keda {
            metric: 0,
            active: false
        }
    );
    assert_eq!(after_split.0, (150, 3));
    assert_eq!(
        after_split.1,
        Keda {
            metric: 150,
            active: true
        }
    );
    terminate(&mut emulator).await;
}

/// More lease documents than a query page holds (issue 54): the service answers a query that
/// asks for no page size 100 items at a time, and `cfp emulator` does the same. KEDA's scaler
/// reads the first page of its lease query only, so over 128 partitions it sees about 100 of
/// the leases and publishes the lag of those alone: less than the backlog (docs/migration.md
/// says so; `cfp estimate` and the operator follow every page).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kedas_scaler_reads_one_page_of_leases_and_misses_the_lag_of_the_others() {
    let bin = tokio::task::spawn_blocking(keda_scaler)
        .await
        .expect("build KEDA's scaler");
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:128").await;
    drain(&endpoint, 128).await;
    cfp_write(&endpoint, 0, 1000).await;
    let (lag, leases) = estimate(&endpoint).await;
    let seen = keda(&bin, &endpoint).await;
    let reading = keda_reading(&endpoint).await;
    println!(
        "128 leases, 1000 writes: cfp estimate {lag} over {leases} leases; KEDA {seen:?}; cfp estimate's KEDA reading {reading}"
    );
    terminate(&mut emulator).await;
    assert_eq!((lag, leases), (1000, 128));
    assert!(seen.active && seen.metric > 0 && seen.metric < lag, "{seen:?}");
    // 128 leases and .info at least: past the one page KEDA reads.
    assert!(reading["documents"].as_u64() >= Some(129), "{reading}");
    assert_eq!(reading["unreadable"], serde_json::json!([]), "{reading}");
}

/// Leases narrower than a partition (`leases.perPartition` 2, version-1 leases named by their
/// EPK range): KEDA's scaler sends each `LeaseToken` as a partition key range id, gets 410/1002,
/// counts none of their lag and reports a metric of 1 and active whatever the backlog — drained
/// or not. `cfp estimate` marks each such lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kedas_scaler_counts_no_lag_of_leases_narrower_than_a_partition_and_stays_active() {
    let bin = tokio::task::spawn_blocking(keda_scaler)
        .await
        .expect("build KEDA's scaler");
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:2").await;
    drain_leases(&endpoint, 4, 2).await;
    let drained = (estimate(&endpoint).await, keda(&bin, &endpoint).await);
    cfp_write(&endpoint, 0, 300).await;
    let backlog = (estimate(&endpoint).await, keda(&bin, &endpoint).await);
    let reading = keda_reading(&endpoint).await;
    let table = cfp_estimate(&endpoint, &[]).await;
    let table = String::from_utf8_lossy(&table.stdout);
    println!(
        "4 leases over 2 partitions: drained, cfp estimate {:?}, KEDA {:?}; 300 writes, cfp estimate {:?}, KEDA {:?}; KEDA reading {reading}\n{table}",
        drained.0, drained.1, backlog.0, backlog.1
    );
    terminate(&mut emulator).await;
    let pinned = Keda {
        metric: 1,
        active: true,
    };
    assert_eq!(drained, ((0, 4), pinned));
    assert_eq!(backlog, ((300, 4), pinned));
    assert_eq!(reading["unreadable"].as_array().map(Vec::len), Some(4), "{reading}");
    assert_eq!(table.matches(" *").count(), 4, "{table}");
    assert!(
        table.contains("KEDA's azure-cosmosdb scaler cannot read 4 lease(s)"),
        "{table}"
    );
}

/// What `cfp estimate -o json` says KEDA's scaler would read.
async fn keda_reading(endpoint: &str) -> serde_json::Value {
    let output = cfp_estimate(endpoint, &["-o", "json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    json["keda"].clone()
}
