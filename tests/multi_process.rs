//! `cfp emulator` and three `cfp worker --handler stdout` processes over loopback HTTP: every
//! written document comes out of the workers' standard output.

use std::collections::HashSet;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::common::DiesWithTest;
use crate::common::{CFP, cfp_write, start_emulator, terminate};

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
        .dies_with_test()
        .spawn()
        .expect("spawn cfp worker")
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
