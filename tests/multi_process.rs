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

/// A `cfp emulator` of 16 partitions (the bootstrap holds the lock for a while), a worker
/// there bootstrapping, and its lease store.
struct FirstBootstrap {
    emulator: Child,
    endpoint: String,
    store: changefeed_operator::processor::CosmosLeaseStore,
    first: Child,
}

impl FirstBootstrap {
    /// Sends the first worker `signal` (`-STOP`, `-CONT`).
    async fn signal(&self, signal: &str) {
        let pid = self.first.id().expect("the first worker runs").to_string();
        let status = Command::new("kill").args([signal, &pid]).status().await.expect("kill");
        assert!(status.success(), "kill {signal}");
    }

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
/// `reached` says so of what its bootstrap wrote.
async fn killed_while_bootstrapping(reached: impl Fn(&Seen) -> bool) -> FirstBootstrap {
    let mut bootstrap = bootstrapping_until(reached).await;
    bootstrap.first.start_kill().expect("kill -9");
    let _ = bootstrap.first.wait().await;
    bootstrap
}

/// A `cfp worker` of [`bootstrapping_worker`] on a new emulator, once `reached` says so of what
/// its bootstrap wrote (looked at every 5 ms, at most 30 s).
async fn bootstrapping_until(reached: impl Fn(&Seen) -> bool) -> FirstBootstrap {
    let (emulator, endpoint) = start_emulator("db/items:/pk:16").await;
    let account = CosmosAccount::connect(&endpoint, &AccountAuth::emulator_key())
        .await
        .expect("connect");
    let account = &account;
    let first = bootstrapping_worker(&endpoint, "first");
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
    FirstBootstrap {
        emulator,
        endpoint,
        store,
        first,
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

/// A worker frozen (SIGSTOP) partway through creating its leases, past the few seconds after
/// which its lock is taken for a dead holder's, while the next worker — another layout, as in a
/// rollout that changes `--leases-per-partition` — bootstraps the lease set; resumed
/// (SIGCONT), it finds its lock taken and gives up its bootstrap: it refuses the layout marked
/// instead of creating the rest of its own over the keys the other's leases hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_frozen_while_it_bootstraps_gives_up_its_bootstrap_when_it_finds_its_lock_taken() {
    let mut frozen = bootstrapping_until(|seen| seen.leases >= 40).await;
    frozen.signal("-STOP").await;
    let left = frozen.store.snapshot().await.expect("listing").leases.len();
    let extra = ["--leases-per-partition", "32", "--lease-expiration", "60s"];
    let mut next = worker_with(&frozen.endpoint, "next", &extra, Stdio::null());
    let initialized = frozen.initialized_within(Duration::from_secs(30)).await;
    frozen.signal("-CONT").await;
    let gave_up = tokio::time::timeout(Duration::from_secs(30), frozen.first.wait()).await;
    let leases = frozen.store.snapshot().await.expect("listing").leases;
    let overlapping = leases
        .iter()
        .filter(|a| {
            leases
                .iter()
                .any(|b| a.id != b.id && a.range().zip(b.range()).is_some_and(|(x, y)| x.overlaps(y)))
        })
        .count();
    println!(
        "a worker frozen after {left} of 1,024 leases (64 a partition), the next bootstrapping 32 a partition: initialized {initialized}; the frozen one, resumed, ended {gave_up:?}; {} leases, {overlapping} overlapping another",
        leases.len()
    );
    terminate(&mut next).await;
    terminate(&mut frozen.emulator).await;
    assert!(initialized, "the next worker bootstrapped beside the frozen one");
    assert!(
        gave_up.is_ok_and(|status| status.is_ok_and(|s| !s.success())),
        "the resumed worker refuses the layout marked"
    );
    // Only what it sent before its first rewrite after resuming came back refused (a few
    // chunks of 8 creations), not the rest of its layout (1,400 and more before).
    assert!(overlapping <= 100, "{overlapping} leases overlap another");
}
