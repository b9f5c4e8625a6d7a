//! Preferred regions (issue 40 §4): on a two-region `cfp emulator` (East US takes writes, West US
//! receives them after a replication delay), a worker told `--preferred-regions "West US"` reads
//! the change feed from West US — its documents arrive a replication delay after the write — while
//! a worker with the default (the account's own order) reads from East US at once. Both deliver
//! everything, and neither checkpoints past what it handled.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::common::{self, cfp_worker, cfp_write, eventually, http_get};

const DELAY: Duration = Duration::from_millis(2000);

/// The lines a worker printed, with when they arrived.
type Lines = Arc<Mutex<Vec<(Instant, String)>>>;

/// A worker of processor `name` printing documents; its metrics port and the lines it printed.
fn worker(endpoint: &str, name: &str, flags: &[&str]) -> (tokio::process::Child, u16, Lines) {
    let port = common::free_port();
    let mut child = cfp_worker(endpoint)
        .args(["--processor", name, "--instance", name, "--handler", "stdout"])
        .args(["--poll-interval", "100ms", "--start-from", "beginning"])
        .args(common::FAST_LEASES)
        .args(["--metrics-port", &port.to_string()])
        .args(flags)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn cfp worker");
    let lines = Arc::new(Mutex::new(Vec::new()));
    let stdout = child.stdout.take().expect("piped stdout");
    let seen = lines.clone();
    tokio::spawn(async move {
        let mut reader = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            seen.lock().unwrap().push((Instant::now(), line));
        }
    });
    (child, port, lines)
}

/// When the document `id` arrived, if it did.
fn arrival(lines: &Mutex<Vec<(Instant, String)>>, id: &str) -> Option<Instant> {
    let needle = format!("\"id\":\"{id}\"");
    lines
        .lock()
        .unwrap()
        .iter()
        .find(|(_, l)| l.contains(&needle))
        .map(|(t, _)| *t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_reads_from_its_preferred_region_and_one_without_from_the_account_s_first() {
    let delay = u64::try_from(DELAY.as_millis()).unwrap();
    let (_emulator, endpoint) = common::start_two_regions(&["db/items:/pk:1"], delay).await;
    cfp_write(&endpoint, 0, 1).await;
    let (mut near, near_port, near_lines) = worker(&endpoint, "near", &[]);
    let (mut far, far_port, far_lines) = worker(&endpoint, "far", &["--preferred-regions", "West US"]);
    // Both have caught up with the first document before the one that is timed is written.
    let caught_up = eventually(Duration::from_secs(30), || async {
        arrival(&near_lines, "doc-0").is_some() && arrival(&far_lines, "doc-0").is_some()
    })
    .await;
    assert!(caught_up, "both workers deliver the first document");
    let written = Instant::now();
    cfp_write(&endpoint, 1, 1).await;
    let both = eventually(Duration::from_secs(30), || async {
        arrival(&near_lines, "doc-1").is_some() && arrival(&far_lines, "doc-1").is_some()
    })
    .await;
    let after = |lines: &Mutex<Vec<(Instant, String)>>| arrival(lines, "doc-1").map(|t| t.duration_since(written));
    let (near_after, far_after) = (after(&near_lines), after(&far_lines));
    let ready = [
        http_get(([127, 0, 0, 1], near_port).into(), "/readyz").await.0,
        http_get(([127, 0, 0, 1], far_port).into(), "/readyz").await.0,
    ];
    common::terminate(&mut near).await;
    common::terminate(&mut far).await;
    println!(
        "regions (replication delay {DELAY:?}): the default worker delivered a new document {near_after:?} after the write, the one preferring West US {far_after:?}; /readyz {ready:?}"
    );
    assert!(both, "both workers deliver the new document");
    let (near_after, far_after) = (near_after.unwrap_or_default(), far_after.unwrap_or_default());
    assert!(
        far_after >= DELAY.mul_f64(0.8),
        "the worker preferring West US read it before it was replicated there: {far_after:?}"
    );
    assert!(
        near_after < DELAY.mul_f64(0.8),
        "the default worker reads from the write region: {near_after:?}"
    );
    assert_eq!(ready, [200, 200]);
}
