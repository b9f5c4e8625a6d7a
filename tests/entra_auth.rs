//! Microsoft Entra ID auth (`--auth workload-identity`) against an account with key auth disabled:
//! `cfp emulator --entra-token-file` accepts only one bearer token, which only the HTTPS token
//! endpoint this test runs issues, and only for the federated service account token that
//! workload identity puts in `AZURE_FEDERATED_TOKEN_FILE`.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::common::DiesWithTest;
use crate::common::{self, CFP, DB, ITEMS, terminate};
use crate::entra_support::{ACCESS_TOKEN, FEDERATED_TOKEN, TokenEndpoint};

/// `cfp <args>` with `env`, bounded, logging at debug; (exit code, stdout, stderr).
async fn cfp(args: &[&str], env: &[(&str, String)]) -> (Option<i32>, String, String) {
    common::cfp_output(args, env, "debug").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_identity_tokens_write_process_and_estimate_where_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = TokenEndpoint::start(dir.path()).await;
    let federated = dir.path().join("federated-token");
    std::fs::write(&federated, FEDERATED_TOKEN).unwrap();
    let (mut emulator, endpoint) = TokenEndpoint::start_emulator(dir.path(), "db/items:/pk:4").await;
    let env = tokens.pod_env(&federated);
    let account = ["--endpoint", &endpoint, "--database", DB, "--container", ITEMS];

    // Key auth is refused with a hint at Entra ID, before anything is written.
    let (code, _, stderr) = cfp(&[&["write", "--count", "1"][..], &account].concat(), &[]).await;
    assert_ne!(code, Some(0), "a key-signed write must fail: {stderr}");
    assert!(stderr.contains("the account refused the key"), "{stderr}");

    // Writes with a token.
    let auth = ["--auth", "workload-identity"];
    let (code, _, stderr) = cfp(&[&["write", "--count", "60"][..], &account, &auth].concat(), &env).await;
    assert_eq!(code, Some(0), "write with workload identity: {stderr}");

    // Entra ID identities may not create containers (403/5301, as the service answers): a
    // missing lease container is reported with the command that creates it, not as a key.
    let worker_args = [
        &["worker", "--handler", "stdout", "--processor", "entra"][..],
        &account,
        &auth,
    ]
    .concat();
    let (code, _, missing) = cfp(&worker_args, &env).await;
    let missing = missing
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_default()
        .to_owned();
    assert_ne!(code, Some(0), "no lease container: {missing}");
    assert!(
        missing.contains("this identity may not create containers")
            && missing.contains("403/5301")
            && missing.contains("az cosmosdb sql container create")
            && !missing.contains("refused the key"),
        "{missing}"
    );
    common::create_container_as_admin(&endpoint, DB, "leases").await;

    // A worker with a token processes every document.
    let mut worker = tokio::process::Command::new(CFP)
        .args(
            [
                &["worker", "--handler", "stdout", "--processor", "entra"][..],
                &account,
                &auth,
            ]
            .concat(),
        )
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .dies_with_test()
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(worker.stdout.take().unwrap()).lines();
    let mut stderr_lines = BufReader::new(worker.stderr.take().unwrap()).lines();
    let worker_log = tokio::spawn(async move {
        let mut log = String::new();
        while let Ok(Some(line)) = stderr_lines.next_line().await {
            log.push_str(&line);
            log.push('\n');
        }
        log
    });
    let mut ids = BTreeSet::new();
    let delivered = tokio::time::timeout(Duration::from_secs(60), async {
        while ids.len() < 60 {
            let Ok(Some(line)) = lines.next_line().await else { break };
            let doc: serde_json::Value = serde_json::from_str(&line).expect("a JSON line per document");
            ids.insert(doc["id"].as_str().unwrap_or_default().to_owned());
        }
    })
    .await;
    assert!(delivered.is_ok(), "delivered {} of 60 within 60 s", ids.len());

    // The estimator (the operator's code path) reads the leases with a token too.
    let (code, stdout, stderr) = cfp(
        &[&["estimate", "--processor", "entra", "-o", "json"][..], &account, &auth].concat(),
        &env,
    )
    .await;
    assert_eq!(code, Some(0), "estimate with workload identity: {stderr}");
    let estimate: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    terminate(&mut worker).await;
    let worker_log = worker_log.await.unwrap();

    // A pod whose federated token Entra ID does not accept gets a clear error, not a hang.
    let wrong = dir.path().join("wrong-federated-token");
    std::fs::write(&wrong, "eyJ-some-other-service-account").unwrap();
    let (code, _, refused) = cfp(
        &[&["write", "--count", "1"][..], &account, &auth].concat(),
        &tokens.pod_env(&wrong),
    )
    .await;

    let seen = tokens.seen();
    println!(
        "no lease container: {missing}\ntoken endpoint: {} tokens issued, refused {:?}; worker delivered {} distinct of 60; estimate {}; wrong token: exit {code:?}, {}",
        seen.issued,
        seen.refused,
        ids.len(),
        estimate["totalLag"],
        refused.lines().find(|l| l.starts_with("error:")).unwrap_or_default()
    );
    assert_eq!(ids.len(), 60);
    assert_eq!(estimate["totalLag"], 0, "{estimate}");
    assert!(
        seen.issued >= 3,
        "write, worker and estimate each got a token: {seen:?}"
    );
    assert_ne!(code, Some(0));
    assert!(
        refused.contains("AADSTS700213"),
        "the token endpoint's reason is shown: {refused}"
    );
    assert_eq!(seen.refused.len(), 1, "{seen:?}");
    for secret in [ACCESS_TOKEN, FEDERATED_TOKEN] {
        assert!(
            !worker_log.contains(secret),
            "a token appeared in the worker's debug log"
        );
        assert!(
            !stderr.contains(secret),
            "a token appeared in the estimator's debug log"
        );
    }
    terminate(&mut emulator).await;
}
