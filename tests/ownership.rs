//! Ownership that cannot be confused (issue 37 §1): a lease task whose ownership epoch is gone
//! never writes again, whatever the `Owner` name says; a second process started under a live
//! instance name refuses to start; a process restarted after its predecessor crashed takes the
//! name back once the predecessor's heartbeat stays still for a lease expiration.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use changefeed_operator::processor::{CloseReason, LeaseEvent};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Child;
use tokio::sync::mpsc;

use crate::common::{Env, cfp_worker, cfp_write, start_emulator, terminate};

/// A lease that comes back to this instance's name under another process's epoch (a second
/// process of the same name took it) is not written by the task that held it before: its
/// next write meets a 412, and the copy it re-reads is not its ownership any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_task_never_writes_over_its_name_s_newer_ownership() {
    let env = Env::new(1).await;
    let mut options = env.options("a");
    // No acquire cycle within the test (the first runs at start): nothing but the task itself
    // judges the lease.
    options.acquire_interval = Duration::from_secs(120);
    let handle = env.start_owning_all_with(options, 1).await;
    let mut events = handle.subscribe();
    env.write(0..20).await;
    assert!(
        env.delivered_within(20, Duration::from_secs(10)).await,
        "the first documents flow"
    );

    // Another process under the same name takes the lease: its own epoch, the same name.
    let store = env.store().await;
    let usurped = loop {
        let mut lease = store.snapshot().await.unwrap().leases.remove(0);
        lease.owner_epoch = Some("another-process.1".into());
        if let Ok(written) = store.replace(&lease).await {
            break written;
        }
    };
    env.write(20..60).await;
    let closed = crate::common::next_event(&mut events, Duration::from_secs(10), |event| match event {
        LeaseEvent::Closed { reason, .. } => Some(reason),
        _ => None,
    })
    .await
    .expect("the deposed task stops within 10 s");
    assert_eq!(
        closed,
        CloseReason::LeaseLost,
        "it stops because the lease is not its own"
    );
    let now = store.read(&usurped.id).await.unwrap().unwrap();
    handle.abort();
    assert_eq!(now.owner_epoch.as_deref(), Some("another-process.1"));
    assert_eq!(
        now.etag, usurped.etag,
        "the deposed task wrote over the newer ownership (continuation {:?} → {:?})",
        usurped.continuation, now.continuation
    );
}

/// `cfp worker --instance <name>` with short lease timings and the stdout handler.
fn twin(endpoint: &str, name: &str) -> Child {
    cfp_worker(endpoint)
        .args(["--instance", name, "--handler", "stdout", "--poll-interval", "100ms"])
        .args(["--lease-acquire-interval", "500ms", "--lease-renew-interval", "500ms"])
        .args(["--lease-expiration", "3s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cfp worker")
}

/// Sends each id a worker prints to `tx`, tagged with `who`.
fn collect(child: &mut Child, who: &'static str, tx: mpsc::UnboundedSender<(&'static str, String)>) {
    let stdout = child.stdout.take().expect("worker stdout");
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(doc) = serde_json::from_str::<serde_json::Value>(&line) {
                let _ = tx.send((who, doc["id"].as_str().unwrap_or_default().to_owned()));
            }
        }
    });
}

/// Receives deliveries until `ids` distinct documents came, or `timeout`: (who, id) → count.
async fn deliveries(
    rx: &mut mpsc::UnboundedReceiver<(&'static str, String)>,
    counts: &mut HashMap<String, Vec<&'static str>>,
    ids: usize,
    timeout: Duration,
) -> bool {
    tokio::time::timeout(timeout, async {
        while let Some((who, id)) = rx.recv().await {
            counts.entry(id).or_default().push(who);
            if counts.len() >= ids {
                return;
            }
        }
    })
    .await
    .is_ok()
}

/// Two processes started with one instance name: the second finds the first's heartbeat
/// changing and exits with one line naming the name; the first delivers everything once.
/// Then the first crashes (`kill -9`) and a third process of the name takes it back, once the
/// dead heartbeat stayed still for the lease expiration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_per_instance_name() {
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:4").await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut first = twin(&endpoint, "twin");
    collect(&mut first, "first", tx.clone());
    cfp_write(&endpoint, 0, 50).await;
    let mut counts = HashMap::new();
    assert!(
        deliveries(&mut rx, &mut counts, 50, Duration::from_secs(30)).await,
        "the first worker delivers"
    );

    let mut second = twin(&endpoint, "twin");
    collect(&mut second, "second", tx.clone());
    cfp_write(&endpoint, 50, 450).await;
    let status = tokio::time::timeout(Duration::from_secs(30), second.wait())
        .await
        .expect("the second process exits within 30 s (a lease expiration of watching)")
        .expect("wait for the second process");
    let mut stderr = String::new();
    let _ = second.stderr.take().expect("stderr").read_to_string(&mut stderr).await;
    assert!(!status.success(), "the second process must not run: {stderr}");
    assert!(
        stderr.contains("another process is running as instance \"twin\""),
        "the second process says why: {stderr}"
    );
    assert!(
        deliveries(&mut rx, &mut counts, 500, Duration::from_secs(60)).await,
        "all 500 delivered"
    );
    let by_second = counts.values().filter(|who| who.contains(&"second")).count();
    let twice = counts.values().filter(|who| who.len() > 1).count();
    println!("one name, two processes: 500 written, {by_second} delivered by the second, {twice} twice");
    assert_eq!(by_second, 0, "the second process delivered documents");
    assert_eq!(twice, 0, "documents delivered twice");

    // A crash, then a restart under the same name.
    first.start_kill().expect("kill -9 the first process");
    let _ = first.wait().await;
    let mut third = twin(&endpoint, "twin");
    collect(&mut third, "third", tx.clone());
    cfp_write(&endpoint, 500, 50).await;
    let started = tokio::time::Instant::now();
    assert!(
        deliveries(&mut rx, &mut counts, 550, Duration::from_secs(45)).await,
        "the restarted process delivers what was written after the crash"
    );
    println!("restart under a crashed name: delivering after {:?}", started.elapsed());
    terminate(&mut third).await;
    terminate(&mut emulator).await;
}

/// `cfp worker --instance <name>` in the pod of UID `pod` (`CFP_POD_UID`, as the operator sets
/// it), with the default lease expiration (60 s) and a heartbeat every second.
fn pod_worker(endpoint: &str, name: &str, pod: &str) -> Child {
    cfp_worker(endpoint)
        .args(["--instance", name, "--handler", "stdout", "--poll-interval", "100ms"])
        .args(["--lease-acquire-interval", "1s", "--lease-renew-interval", "1s"])
        .env("CFP_POD_UID", pod)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cfp worker")
}

/// A worker restarted in its pod (issue 56): with the default lease expiration of 60 s, a worker
/// killed with SIGKILL and started again under its name in the same pod delivers what was
/// written after the crash within 5 s, none of it twice; a process of that name from another pod
/// is refused while it runs and delivers nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_restarted_in_its_pod_resumes_at_once_and_one_from_another_pod_is_refused() {
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:4").await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut first = pod_worker(&endpoint, "worker-0", "pod-uid-a");
    collect(&mut first, "first", tx.clone());
    cfp_write(&endpoint, 0, 100).await;
    let mut counts = HashMap::new();
    assert!(
        deliveries(&mut rx, &mut counts, 100, Duration::from_secs(30)).await,
        "the first worker delivers"
    );
    first.start_kill().expect("kill -9 the worker");
    let _ = first.wait().await;
    let mut restarted = pod_worker(&endpoint, "worker-0", "pod-uid-a");
    collect(&mut restarted, "restarted", tx.clone());
    let started = tokio::time::Instant::now();
    cfp_write(&endpoint, 100, 100).await;
    let resumed = deliveries(&mut rx, &mut counts, 200, Duration::from_secs(50)).await;
    let took = started.elapsed();

    let mut other_pod = pod_worker(&endpoint, "worker-0", "pod-uid-b");
    collect(&mut other_pod, "other pod", tx.clone());
    cfp_write(&endpoint, 200, 100).await;
    let status = tokio::time::timeout(Duration::from_secs(30), other_pod.wait())
        .await
        .expect("the process of another pod exits within 30 s")
        .expect("wait for it");
    let mut stderr = String::new();
    let _ = other_pod
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .await;
    let all = deliveries(&mut rx, &mut counts, 300, Duration::from_secs(30)).await;
    // The batches the crash caught before their checkpoint come again (at least once); nothing
    // written after it does.
    let written_after = |id: &str| id.strip_prefix("doc-").and_then(|n| n.parse::<u64>().ok()) >= Some(100);
    let in_flight = counts
        .iter()
        .filter(|(id, who)| !written_after(id) && who.len() > 1)
        .count();
    let twice = counts
        .iter()
        .filter(|(id, who)| written_after(id) && who.len() > 1)
        .count();
    let by_other = counts.values().filter(|who| who.contains(&"other pod")).count();
    println!(
        "restart in the pod (expiration 60 s): delivering again after {took:?}; another pod's process: {status}, delivered {by_other}; 300 written, {} delivered, {in_flight} of the 100 before the crash again (not checkpointed), {twice} of the 200 after it twice",
        counts.len()
    );
    terminate(&mut restarted).await;
    terminate(&mut emulator).await;
    assert!(resumed, "the restarted worker delivered within 50 s");
    assert!(took < Duration::from_secs(5), "the restarted worker waited {took:?}");
    assert!(
        !status.success() && stderr.contains("another process is running as instance"),
        "{stderr}"
    );
    assert!(all, "all 300 delivered");
    assert_eq!((by_other, twice), (0, 0));
}
