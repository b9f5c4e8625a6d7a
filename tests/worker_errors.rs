//! Configuration errors end `cfp worker` with one clear line and a non-zero exit.

mod common;

use std::time::Duration;

use common::{CFP, start_emulator, terminate};

async fn worker(args: &[&str]) -> (Option<i32>, String) {
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(CFP)
            .arg("worker")
            .args(args)
            .env("RUST_LOG", "off")
            .output(),
    )
    .await
    .expect("the worker exits by itself")
    .expect("run cfp worker");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    )
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
    let account = [
        "--endpoint",
        endpoint.as_str(),
        "--database",
        "db",
        "--container",
        "items",
    ];
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
