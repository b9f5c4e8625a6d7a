//! `cfp emulator` and three `cfp worker --handler stdout` processes over loopback HTTP: every
//! written document comes out of the workers' standard output.

use std::collections::HashSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::common::DiesWithTest;
use changefeed_operator::cosmos::{AccountAuth, CosmosAccount};
use changefeed_operator::processor::LeaseStore;

use crate::common::{CFP, cfp_write, lease_store, start_emulator, terminate};

/// `cfp worker` `instance` of processor `changefeed` on `db/items` with quick lease timings,
/// its documents on standard output (`stdout`), with the `extra` arguments.
fn worker_with(endpoint: &str, instance: &str, extra: &[&str], stdout: Stdio) -> Child {
    Command::new(CFP)
        .args([
            "worker",
            "--endpoint",
            endpoint,
            "--database",
            "db",
            "--container",
            "items",
        ])
        .args(["--instance", instance, "--handler", "stdout"])
        .args(["--lease-acquire-interval", "500ms", "--lease-renew-interval", "500ms"])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(stdout)
        .stderr(Stdio::inherit())
        .dies_with_test()
        .spawn()
        .expect("spawn cfp worker")
}

/// A worker of [`worker_with`] polling every 100 ms, its lease expiration 3 s, its documents
/// piped.
fn worker(endpoint: &str, instance: &str) -> Child {
    let extra = ["--poll-interval", "100ms", "--lease-expiration", "3s"];
    worker_with(endpoint, instance, &extra, Stdio::piped())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_worker_processes_deliver_every_document_on_stdout() {
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:6").await;
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let mut workers = Vec::new();
    for name in ["w1", "w2", "w3"] {
        let mut child = worker(&endpoint, name);
        let stdout = child.stdout.take().expect("worker stdout");
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let doc: serde_json::Value = serde_json::from_str(&line).expect("each stdout line is a JSON document");
                let _ = tx.send(doc["id"].as_str().unwrap_or_default().to_owned());
            }
        });
        workers.push(child);
    }
    drop(tx);

    let count = 3000;
    cfp_write(&endpoint, 0, count as u64).await;

    let mut seen = HashSet::new();
    let mut lines = 0;
    let all = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(id) = rx.recv().await {
            lines += 1;
            seen.insert(id);
            if seen.len() == count {
                break;
            }
        }
    })
    .await;
    println!(
        "3 worker processes: written {count}, distinct ids on stdout {}, lines {lines}",
        seen.len()
    );
    assert!(all.is_ok(), "only {} of {count} documents came out", seen.len());
    for n in 0..count {
        assert!(seen.contains(&format!("doc-{n}")), "doc-{n} missing");
    }
    for child in &mut workers {
        terminate(child).await;
    }
    terminate(&mut emulator).await;
}

/// `cfp worker` `instance` bootstrapping 64 leases a partition (the most), its lease expiration a
/// minute.
fn bootstrapping_worker(endpoint: &str, instance: &str) -> Child {
    let extra = ["--leases-per-partition", "64", "--lease-expiration", "60s"];
    worker_with(endpoint, instance, &extra, Stdio::null())
}

/// A worker killed (SIGKILL) while it holds the bootstrap lock, creating its leases, holds the
/// next instance back for a few of its lock renewals, not a lease expiration: a holder rewrites
/// the lock while it bootstraps, so one whose lock stays unchanged for longer is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_while_it_bootstraps_holds_the_next_back_for_a_few_renewals_not_an_expiration() {
    // 16 partitions of 64 leases: the bootstrap holds the lock for a while.
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:16").await;
    let account = CosmosAccount::connect(&endpoint, &AccountAuth::emulator_key())
        .await
        .expect("connect");
    let mut first = bootstrapping_worker(&endpoint, "first");
    let locked = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Some(store) = lease_store(&account, "changefeed").await
                && let Ok(leases) = account.documents(crate::common::DB, crate::common::LEASES).await
            {
                let lock = format!("{}.lock", store.prefix());
                if leases.read(&lock, &lock).await.is_ok_and(|doc| doc.is_some()) {
                    return store;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the first worker took the bootstrap lock");
    first.start_kill().expect("kill -9");
    let _ = first.wait().await;
    assert!(
        !locked.snapshot().await.expect("listing").initialized,
        "killed before its bootstrap ended"
    );
    let started = Instant::now();
    let mut next = bootstrapping_worker(&endpoint, "next");
    let initialized = tokio::time::timeout(Duration::from_secs(25), async {
        while !locked.snapshot().await.is_ok_and(|s| s.initialized) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    println!(
        "a worker killed while it bootstrapped (lock renewals every 500 ms, expiration 60 s): the next one had initialized the leases {:?} after it started",
        started.elapsed()
    );
    terminate(&mut next).await;
    terminate(&mut emulator).await;
    assert!(initialized.is_ok(), "the next worker waited for the dead holder's lock");
}
