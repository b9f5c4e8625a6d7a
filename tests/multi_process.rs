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

/// Sends the id of each document `child` writes on its standard output to `tx`.
fn send_ids(child: &mut Child, tx: mpsc::UnboundedSender<String>) {
    let stdout = child.stdout.take().expect("worker stdout");
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let doc: serde_json::Value = serde_json::from_str(&line).expect("each stdout line is a JSON document");
            let _ = tx.send(doc["id"].as_str().unwrap_or_default().to_owned());
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_worker_processes_deliver_every_document_on_stdout() {
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:6").await;
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let mut workers = Vec::new();
    for name in ["w1", "w2", "w3"] {
        let mut child = worker(&endpoint, name);
        send_ids(&mut child, tx.clone());
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

/// What a bootstrap had written when it was looked at.
struct Seen {
    /// Whether its lock exists.
    lock: bool,
    /// How many leases it created.
    leases: usize,
}

/// A `cfp emulator` of 16 partitions (the bootstrap holds the lock for a while), and the lease
/// store of a worker there that was killed while it bootstrapped.
struct Killed {
    emulator: Child,
    endpoint: String,
    store: changefeed_operator::processor::CosmosLeaseStore,
}

impl Killed {
    /// Whether the leases are marked initialized within `timeout`.
    async fn initialized_within(&self, timeout: Duration) -> bool {
        let marked = async {
            while !self.store.snapshot().await.is_ok_and(|s| s.initialized) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::time::timeout(timeout, marked).await.is_ok()
    }
}

/// A `cfp worker` of [`bootstrapping_worker`] on a new emulator, killed (SIGKILL) once
/// `reached` says so of what its bootstrap wrote (looked at every 5 ms, at most 30 s).
async fn killed_while_bootstrapping(reached: impl Fn(&Seen) -> bool) -> Killed {
    let (emulator, endpoint) = start_emulator("db/items:/pk:16").await;
    let account = CosmosAccount::connect(&endpoint, &AccountAuth::emulator_key())
        .await
        .expect("connect");
    let account = &account;
    let mut first = bootstrapping_worker(&endpoint, "first");
    let store = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            // The worker creates the lease container.
            if let Some(store) = lease_store(account, "changefeed").await
                && let Ok(lease_docs) = account.documents(crate::common::DB, crate::common::LEASES).await
            {
                let lock = format!("{}.lock", store.prefix());
                let seen = Seen {
                    lock: lease_docs.read(&lock, &lock).await.is_ok_and(|doc| doc.is_some()),
                    leases: store.snapshot().await.map(|s| s.leases.len()).unwrap_or_default(),
                };
                if reached(&seen) {
                    return store;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the first worker's bootstrap got that far");
    first.start_kill().expect("kill -9");
    let _ = first.wait().await;
    Killed {
        emulator,
        endpoint,
        store,
    }
}

/// A worker killed (SIGKILL) while it holds the bootstrap lock, creating its leases, holds the
/// next instance back for a few of its lock renewals, not a lease expiration: a holder rewrites
/// the lock while it bootstraps, so one whose lock stays unchanged for longer is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_while_it_bootstraps_holds_the_next_back_for_a_few_renewals_not_an_expiration() {
    let mut killed = killed_while_bootstrapping(|seen| seen.lock).await;
    assert!(
        !killed.store.snapshot().await.expect("listing").initialized,
        "killed before its bootstrap ended"
    );
    let started = Instant::now();
    let mut next = bootstrapping_worker(&killed.endpoint, "next");
    let initialized = killed.initialized_within(Duration::from_secs(25)).await;
    println!(
        "a worker killed while it bootstrapped (lock renewals every 500 ms, expiration 60 s): the next one had initialized the leases {:?} after it started",
        started.elapsed()
    );
    terminate(&mut next).await;
    terminate(&mut killed.emulator).await;
    assert!(initialized, "the next worker waited for the dead holder's lock");
}

/// A worker killed (SIGKILL) partway through creating its leases — some of a partition's
/// created, the rest not: the next worker creates the ones left out, and every document written
/// after it started comes out (keys no lease covers would never be read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_partway_through_its_bootstrap_leaves_no_keys_unread() {
    let all = 16 * 64;
    let mut killed = killed_while_bootstrapping(|seen| seen.leases >= 40).await;
    let left = killed.store.snapshot().await.expect("listing");
    assert!(
        !left.initialized && left.leases.len() < all,
        "killed before its bootstrap ended: {} of {all} leases",
        left.leases.len()
    );
    let extra = [
        "--leases-per-partition",
        "64",
        "--lease-expiration",
        "60s",
        "--poll-interval",
        "100ms",
    ];
    let mut next = worker_with(&killed.endpoint, "next", &extra, Stdio::piped());
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    send_ids(&mut next, tx);
    let initialized = killed.initialized_within(Duration::from_secs(30)).await;
    let count = 2000;
    cfp_write(&killed.endpoint, 0, count as u64).await;
    let mut seen = HashSet::new();
    let _ = tokio::time::timeout(Duration::from_secs(60), async {
        while seen.len() < count
            && let Some(id) = rx.recv().await
        {
            seen.insert(id);
        }
    })
    .await;
    let leases = killed
        .store
        .snapshot()
        .await
        .map(|s| s.leases.len())
        .unwrap_or_default();
    println!(
        "a worker killed after {} of {all} leases: the next left {leases} leases; {} of {count} documents came out",
        left.leases.len(),
        seen.len()
    );
    terminate(&mut next).await;
    terminate(&mut killed.emulator).await;
    assert!(initialized, "the next worker did not initialize the leases");
    assert_eq!(leases, all, "every piece of every partition has its lease");
    assert_eq!(seen.len(), count, "documents of keys no lease covers were never read");
}
