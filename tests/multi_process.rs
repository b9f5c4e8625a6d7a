//! `cfp emulator` and three `cfp worker --handler stdout` processes over loopback HTTP: every
//! written document comes out of the workers' standard output.

use std::collections::HashSet;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

const CFP: &str = env!("CARGO_BIN_EXE_cfp");

/// Starts `cfp emulator --port 0` and returns it with the endpoint it printed.
async fn start_emulator() -> (Child, String) {
    let mut child = Command::new(CFP)
        .args(["emulator", "--port", "0", "--container", "db/items:/pk:6"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn cfp emulator");
    let stdout = child.stdout.take().expect("emulator stdout");
    let mut lines = BufReader::new(stdout).lines();
    let endpoint = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(endpoint) = line.trim().strip_prefix("endpoint:") {
                return endpoint.trim().to_owned();
            }
        }
        panic!("the emulator exited without printing its endpoint");
    })
    .await
    .expect("emulator endpoint within 20 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, endpoint)
}

fn worker(endpoint: &str, instance: &str) -> Child {
    Command::new(CFP)
        .args([
            "worker",
            "--endpoint",
            endpoint,
            "--database",
            "db",
            "--container",
            "items",
            "--instance",
            instance,
            "--handler",
            "stdout",
            "--poll-interval",
            "100ms",
            "--lease-acquire-interval",
            "500ms",
            "--lease-renew-interval",
            "500ms",
            "--lease-expiration",
            "3s",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn cfp worker")
}

async fn terminate(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status().await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_worker_processes_deliver_every_document_on_stdout() {
    let (mut emulator, endpoint) = start_emulator().await;
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
    let status = Command::new(CFP)
        .args([
            "write",
            "--endpoint",
            &endpoint,
            "--database",
            "db",
            "--container",
            "items",
            "--count",
            &count.to_string(),
        ])
        .stderr(Stdio::null())
        .status()
        .await
        .expect("run cfp write");
    assert!(status.success(), "cfp write failed");

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
