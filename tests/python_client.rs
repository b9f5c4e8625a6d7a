//! A client nobody here wrote — the Python `azure-cosmos` SDK — against `cfp emulator`; the
//! documents it writes come out of our change feed reader.

use std::time::Duration;

use changefeed_operator::cosmos::{CosmosAccount, EMULATOR_KEY, StartFrom};

use crate::common::{start_emulator, terminate};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_writes_through_cfp_emulator_and_the_change_feed_sees_it() {
    let (mut emulator, endpoint) = start_emulator("unused/unused").await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/emulator_client.py");
    let output = tokio::process::Command::new("python3")
        .args([script, &endpoint, EMULATOR_KEY, "25"])
        .output()
        .await
        .expect("python3 (with azure-cosmos, see .ci/run) must be installed");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "python client failed: {}{}",
        stdout,
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout.trim(), "ok 25");

    let account = CosmosAccount::connect(&endpoint, &changefeed_operator::cosmos::AccountAuth::emulator_key())
        .await
        .unwrap();
    let monitored = account.monitored("py", "docs").await.unwrap();
    let mut ids = Vec::new();
    for range in monitored.feed_ranges(false).await.unwrap() {
        let mut reader = monitored.reader(&range, None, StartFrom::Beginning, 100).await.unwrap();
        loop {
            let page = reader.next_page(Duration::from_secs(10)).await.unwrap();
            if page.documents.is_empty() {
                break;
            }
            ids.extend(
                page.documents
                    .iter()
                    .filter_map(|d| d["id"].as_str().map(str::to_owned)),
            );
        }
    }
    ids.sort();
    println!(
        "python azure-cosmos wrote 25 documents through cfp emulator; our change feed read {}",
        ids.len()
    );
    assert_eq!(ids.len(), 25);
    terminate(&mut emulator).await;
}

/// The Python SDK reads `cfp emulator`'s change feed in the service's formats: `_lsn` on every
/// document, the quoted-LSN range continuation (resumed from, one document at a time, nothing
/// skipped), `max_item_count` honoured and the session token of the range read only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_reads_the_change_feed_in_the_services_formats() {
    let (mut emulator, endpoint) = start_emulator("fmt/cf:/pk:3").await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/change_feed_formats.py");
    let output = tokio::process::Command::new("python3")
        .args([script, &endpoint, EMULATOR_KEY, "fmt", "cf", "30"])
        .output()
        .await
        .expect("python3 (with azure-cosmos, see .ci/run) must be installed");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stderr}");
    assert!(
        output.status.success(),
        "the change feed differs from the service's: {stdout}{stderr}"
    );
    assert_eq!(stdout.trim(), "ok 30");
    terminate(&mut emulator).await;
}
