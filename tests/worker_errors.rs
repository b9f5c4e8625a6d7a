//! Configuration errors end `cfp worker` with one clear line and a non-zero exit.

use std::time::Duration;

use crate::common::DiesWithTest;
use crate::common::{self, CFP, start_emulator, terminate};

/// `--endpoint <endpoint> --database db --container items`.
fn account_args(endpoint: &str) -> [&str; 6] {
    ["--endpoint", endpoint, "--database", "db", "--container", "items"]
}

async fn worker(args: &[&str]) -> (Option<i32>, String) {
    let (code, _, stderr) = common::cfp_output(&[&["worker"][..], args].concat(), &[], "off").await;
    (code, stderr.trim().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_errors_end_the_worker_with_one_clear_line() {
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:2").await;
    // A lease container partitioned on something other than /id.
    let status = tokio::process::Command::new(CFP)
        .args([
            "write",
            "--endpoint",
            &endpoint,
            "--database",
            "db",
            "--container",
            "items",
            "--count",
            "1",
        ])
        .status()
        .await
        .unwrap();
    assert!(status.success());
    let cases: [(&str, Vec<&str>, &str); 4] = [
        (
            "bad endpoint",
            vec!["--endpoint", "not a url", "--database", "db", "--container", "items"],
            "invalid endpoint URL",
        ),
        (
            "missing container",
            vec!["--endpoint", &endpoint, "--database", "db", "--container", "nope"],
            "the monitored container db/nope does not exist",
        ),
        (
            "lease container partitioned on another key",
            vec![
                "--endpoint",
                &endpoint,
                "--database",
                "db",
                "--container",
                "items",
                "--lease-container",
                "items",
            ],
            "must be partitioned on /id",
        ),
        (
            "missing lease container that may not be created",
            vec![
                "--endpoint",
                &endpoint,
                "--database",
                "db",
                "--container",
                "items",
                "--lease-container",
                "absent",
                "--no-create-leases",
            ],
            "the lease container db/absent does not exist",
        ),
    ];
    for (name, args, want) in cases {
        let (code, stderr) = worker(&args).await;
        println!("{name}: exit {code:?}: {stderr}");
        assert!(code.is_some_and(|c| c != 0), "{name}: exit {code:?}");
        assert_eq!(stderr.lines().count(), 1, "{name}: one line, got {stderr:?}");
        assert!(
            stderr.starts_with("error: cfp worker:") && stderr.contains(want),
            "{name}: {stderr}"
        );
    }
    terminate(&mut emulator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_account_key_ends_the_worker_with_one_line_naming_the_key() {
    // An account that checks signatures, as the service does.
    let key = "c2lnbmF0dXJlcy1hcmUtY2hlY2tlZC1oZXJlLWNmcA==";
    let (mut emulator, endpoint) =
        common::start_emulator_with(&["--port", "0", "--container", "db/items:/pk:2", "--key", key]).await;
    let account = account_args(&endpoint);
    let write = tokio::process::Command::new(CFP)
        .arg("write")
        .args(account)
        .args(["--key", key, "--count", "5"])
        .status()
        .await
        .unwrap();
    assert!(
        write.success(),
        "the right key writes (signatures of every request type check out)"
    );
    let (code, stderr) = worker(&[&account[..], &["--key", changefeed_operator::cosmos::EMULATOR_KEY]].concat()).await;
    println!("wrong key: exit {code:?}: {stderr}");
    assert!(code.is_some_and(|c| c != 0));
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert!(stderr.contains("the account refused the key"), "{stderr}");
    assert!(!stderr.contains(key), "the key is never printed");
    terminate(&mut emulator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitored_container_created_again_ends_the_worker_with_one_line_and_a_restart_reads_it() {
    use changefeed_operator::cosmos::{AccountAuth, CosmosAccount};
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:2").await;
    let spawn = || {
        common::cfp_worker(&endpoint)
            .args(["--instance", "w", "--handler", "stdout"])
            .args(common::FAST_LEASES)
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .dies_with_test()
            .spawn()
            .expect("spawn cfp worker")
    };
    let first = spawn();
    common::cfp_write(&endpoint, 0, 5).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let account = CosmosAccount::connect(&endpoint, &AccountAuth::emulator_key())
        .await
        .unwrap();
    account.delete_container(common::DB, common::ITEMS).await.unwrap();
    account
        .ensure_container(common::DB, common::ITEMS, "/pk")
        .await
        .unwrap();
    common::cfp_write(&endpoint, 100, 5).await;
    let output = tokio::time::timeout(Duration::from_secs(30), first.wait_with_output())
        .await
        .expect("the worker exits by itself")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    let error_lines: Vec<&str> = stderr.lines().filter(|l| l.contains("created again")).collect();
    // Started again (as Kubernetes would), the worker reads the new container from its start.
    let mut second = spawn();
    let stdout = second.stdout.take().unwrap();
    let delivered = tokio::time::timeout(Duration::from_secs(30), async {
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let mut seen = std::collections::BTreeSet::new();
        while let Ok(Some(line)) = lines.next_line().await {
            for n in 100..105 {
                if line.contains(&format!("\"doc-{n}\"")) {
                    seen.insert(n);
                }
            }
            if seen.len() == 5 {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    println!(
        "monitored container created again: the worker exited {:?} with {:?}; restarted, it delivered the 5 documents of the new container: {delivered}",
        output.status.code(),
        error_lines
    );
    assert!(output.status.code().is_some_and(|c| c != 0));
    assert_eq!(error_lines.len(), 1, "{stderr}");
    assert!(delivered);
    terminate(&mut second).await;
    terminate(&mut emulator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_all_versions_mode_prints_each_change_with_its_operation_and_refuses_the_beginning() {
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:2").await;
    let account = account_args(&endpoint);
    let (code, stderr) = worker(
        &[
            &account[..],
            &["--mode", "all-versions-and-deletes", "--start-from", "beginning"],
        ]
        .concat(),
    )
    .await;
    assert!(code.is_some_and(|c| c != 0));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("starts only from now"), "{stderr}");

    let mut worker = common::cfp_worker(&endpoint)
        .args([
            "--instance",
            "avad",
            "--handler",
            "stdout",
            "--mode",
            "all-versions-and-deletes",
        ])
        .args(["--start-from", "now"])
        .args(common::FAST_LEASES)
        .stdout(std::process::Stdio::piped())
        .dies_with_test()
        .spawn()
        .unwrap();
    let stdout = worker.stdout.take().unwrap();
    // Written once the leases exist (the start is "now").
    let leases = tokio::spawn({
        let endpoint = endpoint.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            common::cfp_write(&endpoint, 0, 5).await;
        }
    });
    let lines = tokio::time::timeout(Duration::from_secs(30), async {
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let mut changes = Vec::new();
        while changes.len() < 5 {
            match lines.next_line().await {
                Ok(Some(line)) => changes.push(serde_json::from_str::<serde_json::Value>(&line).unwrap()),
                _ => break,
            }
        }
        changes
    })
    .await
    .unwrap_or_default();
    leases.await.unwrap();
    println!(
        "--start-from beginning: {stderr}; first change line: {}",
        lines.first().cloned().unwrap_or_default()
    );
    assert_eq!(lines.len(), 5);
    assert!(
        lines
            .iter()
            .all(|l| l["operationType"] == "create" && l["document"]["id"].is_string() && l["timestamp"].is_u64()),
        "{lines:?}"
    );
    terminate(&mut worker).await;
    terminate(&mut emulator).await;
}
