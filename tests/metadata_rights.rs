//! Accounts that refuse database and container writes — keys of accounts with
//! `disableKeyBasedMetadataWriteAccess` here (`cfp emulator --deny-metadata-writes`), Microsoft
//! Entra ID identities in `entra_auth.rs` and `operator.rs`: an existing lease or dead-letter
//! container is used as it is, and a missing one is reported in one line with the command that
//! creates it, never as a wrong key.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::common::DiesWithTest;
use crate::common::{self, CFP, create_container_as_admin, start_emulator_with, terminate};

/// `cfp <args>`, bounded, quiet; (exit code, stdout, stderr trimmed).
async fn cfp<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (Option<i32>, String, String) {
    let (code, stdout, stderr) = common::cfp_output(args, &[], "off").await;
    (code, stdout, stderr.trim().to_owned())
}

/// Asserts `cfp` failed with one `error:` line holding every one of `want` and no key hint.
fn assert_one_line(what: &str, result: &(Option<i32>, String, String), want: &[&str]) {
    let (code, _, stderr) = result;
    println!("{what}: exit {code:?}: {stderr}");
    assert!(code.is_some_and(|c| c != 0), "{what}: exit {code:?}");
    assert_eq!(stderr.lines().count(), 1, "{what}: one line, got {stderr:?}");
    assert!(stderr.starts_with("error: "), "{what}: {stderr}");
    for part in want {
        assert!(stderr.contains(part), "{what}: {part:?} missing from {stderr}");
    }
    assert!(
        !stderr.contains("refused the key") && !stderr.contains("--key"),
        "{what}: not a key problem: {stderr}"
    );
}

const CREATE_LEASES: &str = "az cosmosdb sql container create --account-name <account> --resource-group <resource-group> --database-name db --name leases --partition-key-path /id";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_refusing_metadata_writes_runs_on_existing_containers_and_says_how_to_create_missing_ones() {
    let (mut emulator, endpoint) =
        start_emulator_with(&["--port", "0", "--container", "db/items:/pk:2", "--deny-metadata-writes"]).await;
    common::cfp_write(&endpoint, 0, 20).await;
    let account = [
        "--endpoint",
        endpoint.as_str(),
        "--database",
        "db",
        "--container",
        "items",
    ];
    let worker = |extra: &[&str]| -> Vec<String> {
        ["worker", "--processor", "rbac"]
            .iter()
            .chain(&account)
            .chain(extra)
            .map(|s| (*s).to_owned())
            .collect()
    };
    let dead_letters = ["--on-exhausted", "dead-letter", "--dead-letter-container", "poison"];

    // Without the lease container: creating it is tried and refused (403), and said so.
    let refused = cfp(&worker(&[])).await;
    assert_one_line(
        "worker, creation refused",
        &refused,
        &["this identity may not create containers", "status 403", CREATE_LEASES],
    );
    let not_allowed = cfp(&worker(&["--no-create-leases"])).await;
    assert_one_line(
        "worker, --no-create-leases",
        &not_allowed,
        &["the lease container db/leases does not exist; create it", CREATE_LEASES],
    );
    let other_database = cfp(&worker(&["--no-create-leases", "--lease-database", "meta"])).await;
    assert_one_line(
        "worker, missing lease database",
        &other_database,
        &[
            "az cosmosdb sql database create --account-name <account> --resource-group <resource-group> --name meta && az cosmosdb sql container create",
        ],
    );
    let estimate = cfp(&[&["estimate", "--processor", "rbac"][..], &account].concat()).await;
    assert_one_line("estimate", &estimate, &["db/leases does not exist", CREATE_LEASES]);
    let letters = [
        "--endpoint",
        endpoint.as_str(),
        "--dead-letter-database",
        "db",
        "--dead-letter-container",
        "poison",
    ];
    let list = cfp(&[&["deadletter", "list", "--processor", "rbac"][..], &letters].concat()).await;
    assert_one_line(
        "deadletter list",
        &list,
        &[
            "db/poison does not exist; create it",
            "--name poison --partition-key-path /id",
        ],
    );

    // Created by an administrator, the lease container is used as it is; the missing dead-letter
    // container is refused the same way.
    create_container_as_admin(&endpoint, "db", "leases").await;
    let no_dead_letters = cfp(&worker(&dead_letters)).await;
    assert_one_line(
        "worker, dead-letter container refused",
        &no_dead_letters,
        &[
            "dead-letter container db/poison",
            "this identity may not create containers",
            "--name poison",
        ],
    );
    create_container_as_admin(&endpoint, "db", "poison").await;

    // With both in place the worker processes everything, never trying to create anything.
    let mut running = tokio::process::Command::new(CFP)
        .args(worker(&dead_letters))
        .args(common::FAST_LEASES)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .dies_with_test()
        .spawn()
        .expect("spawn cfp worker");
    let mut lines = BufReader::new(running.stdout.take().expect("stdout")).lines();
    let mut ids = BTreeSet::new();
    let delivered = tokio::time::timeout(Duration::from_secs(60), async {
        while ids.len() < 20 {
            let Ok(Some(line)) = lines.next_line().await else { break };
            let doc: serde_json::Value = serde_json::from_str(&line).expect("a JSON line per document");
            ids.insert(doc["id"].as_str().unwrap_or_default().to_owned());
        }
    })
    .await;
    terminate(&mut running).await;
    let (code, stdout, stderr) =
        cfp(&[&["estimate", "--processor", "rbac", "-o", "json"][..], &account].concat()).await;
    let (list_code, _, list_err) = cfp(&[&["deadletter", "list", "--processor", "rbac"][..], &letters].concat()).await;
    println!(
        "existing containers: worker delivered {} of 20; estimate exit {code:?} {}; deadletter list exit {list_code:?}",
        ids.len(),
        stdout.trim()
    );
    assert!(delivered.is_ok(), "delivered {} of 20 within 60 s", ids.len());
    assert_eq!(code, Some(0), "estimate: {stderr}");
    let estimate: serde_json::Value = serde_json::from_str(&stdout).expect("estimate JSON");
    assert_eq!(estimate["totalLag"], 0, "{estimate}");
    assert_eq!(list_code, Some(0), "deadletter list: {list_err}");
    terminate(&mut emulator).await;
}
