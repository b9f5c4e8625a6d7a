//! Leader election (a killed or frozen leader is replaced) and what the operator holds in
//! memory.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use tokio::process::Command;

use crate::common::terminate;
use crate::operator_support::{
    FAKE_ENDPOINT, Operator, Scene, apply_ok, namespace, plane, resource, secret_yaml, wait,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_reconciles_and_a_killed_leader_hands_over() {
    let Scene { plane, ns, client } = Scene::new("leader").await;
    apply_ok(plane, &ns, &secret_yaml());
    let mut first = Operator::start(plane, &ns, "first");
    // The first one leads before the second starts.
    wait("the first operator leads", || async {
        first.scrape().await.filter(|(_, leader)| *leader == 1)
    })
    .await;
    let mut second = Operator::start(plane, &ns, "second");
    wait("the second operator serves metrics", || async { second.scrape().await }).await;
    apply_ok(plane, &ns, &resource("one", FAKE_ENDPOINT, ""));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    wait("deployment one", || async {
        deployments.get_opt("one").await.ok().flatten()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (leader_reconciles, _) = first.scrape().await.unwrap();
    let (follower_reconciles, follower_leads) = second.scrape().await.unwrap();
    assert!(leader_reconciles > 0);
    assert_eq!(
        (follower_reconciles, follower_leads),
        (0, 0),
        "the follower must not reconcile"
    );

    first.child.start_kill().unwrap();
    let _ = first.child.wait().await;
    let killed = tokio::time::Instant::now();
    apply_ok(plane, &ns, &resource("two", FAKE_ENDPOINT, ""));
    wait("deployment two from the new leader", || async {
        deployments.get_opt("two").await.ok().flatten()
    })
    .await;
    let handover = killed.elapsed();
    let (reconciles, leads) = wait("the new leader's metrics", || async {
        second.scrape().await.filter(|(r, l)| *r > 0 && *l == 1)
    })
    .await;
    println!(
        "leader election: leader reconciled {leader_reconciles} times, follower 0; after SIGKILL the follower led and reconciled within {handover:.1?} (lease 3 s)"
    );
    assert!(reconciles > 0 && leads == 1);
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), &ns);
    let lease = leases.get("changefeed-operator").await.unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("second"));
    terminate(&mut second.child).await;
}

/// Resident memory of a process in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrelated_secrets_do_not_grow_the_operator() {
    let plane = plane().await;
    let ns = namespace(plane, "noise");
    let mut operator = Operator::start(plane, &ns, "op");
    apply_ok(plane, &ns, &secret_yaml());
    apply_ok(plane, &ns, &resource("orders", FAKE_ENDPOINT, ""));
    let client = plane.client().await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    wait("the first reconcile", || async {
        deployments.get_opt("orders").await.ok().flatten()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = operator.child.id().expect("operator pid");
    let before = rss_kib(pid);
    // 1000 Secrets of 10 KiB the operator has nothing to do with (10 MiB of data).
    let blob = "x".repeat(10 * 1024);
    let mut yaml = String::new();
    for n in 0..1000 {
        yaml.push_str(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: noise-{n}\nstringData:\n  blob: {blob}\n---\n"
        ));
    }
    let (ok, _, err) = plane.kubectl_run(&["create", "-n", &ns, "-f", "-"], Some(&yaml));
    assert!(ok, "{err}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = rss_kib(pid);
    // A new operator starts over a namespace that already holds them (the initial list).
    let mut fresh = Operator::start(plane, &ns, "fresh");
    wait("the fresh operator serves metrics", || async { fresh.scrape().await }).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let fresh_rss = rss_kib(fresh.child.id().expect("pid"));
    println!(
        "operator RSS: {:.1} MiB before, {:.1} MiB after 1000 unrelated 10 KiB Secrets (10 MiB of data) appeared; a new operator over them: {:.1} MiB (the Secret watch is metadata-only)",
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        fresh_rss as f64 / 1024.0
    );
    assert!(
        after < before + 5 * 1024,
        "the operator grew by {} KiB: Secret data is being cached",
        after.saturating_sub(before)
    );
    terminate(&mut fresh.child).await;
    terminate(&mut operator.child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_is_replaced_and_never_reconciles_after_it_resumes() {
    let Scene { plane, ns, client } = Scene::new("frozen").await;
    apply_ok(plane, &ns, &secret_yaml());
    let first = Operator::start(plane, &ns, "first");
    wait("the first operator leads", || async {
        first.scrape().await.filter(|(_, leader)| *leader == 1)
    })
    .await;
    let mut second = Operator::start(plane, &ns, "second");
    wait("the second operator serves metrics", || async { second.scrape().await }).await;
    let endpoint = FAKE_ENDPOINT;
    apply_ok(plane, &ns, &resource("one", endpoint, ""));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    wait("deployment one", || async {
        deployments.get_opt("one").await.ok().flatten()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (before, _) = first.scrape().await.expect("first metrics");
    let pid = first.child.id().expect("pid").to_string();
    let signal = |sig: &'static str| {
        let pid = pid.clone();
        async move {
            let status = Command::new("kill").args([sig, &pid]).status().await.unwrap();
            assert!(status.success());
        }
    };
    signal("-STOP").await;
    let frozen = tokio::time::Instant::now();
    wait("the second operator leads", || async {
        second.scrape().await.filter(|(_, leader)| *leader == 1)
    })
    .await;
    let takeover = frozen.elapsed();
    apply_ok(plane, &ns, &resource("two", endpoint, ""));
    wait("deployment two from the new leader", || async {
        deployments.get_opt("two").await.ok().flatten()
    })
    .await;
    signal("-CONT").await;
    // Work for a leader right after the old one resumes: only the new one may do it.
    apply_ok(plane, &ns, &resource("three", endpoint, "  replicas: 2\n"));
    apply_ok(plane, &ns, &resource("one", endpoint, "  replicas: 3\n"));
    wait("deployment three", || async {
        deployments.get_opt("three").await.ok().flatten()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (after, leads) = wait("the resumed operator's metrics", || async { first.scrape().await }).await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), &ns);
    let holder = leases
        .get("changefeed-operator")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity;
    println!(
        "frozen leader: the follower led {takeover:.1?} after SIGSTOP (lease 3 s, deadline 2 s); after SIGCONT the old leader reconciled {} more times (before {before}, after {after}), leader gauge {leads}, Lease holder {holder:?}",
        after - before
    );
    assert_eq!(after, before, "the resumed old leader reconciled");
    assert_eq!(leads, 0);
    assert_eq!(holder.as_deref(), Some("second"));
    let mut first = first;
    terminate(&mut first.child).await;
    terminate(&mut second.child).await;
}
