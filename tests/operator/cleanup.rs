//! The lease-cleanup finalizer: a deleted resource that asks for it takes its lease documents
//! with it, within its cleanup timeout.

use std::process::Stdio;
use std::time::Duration;

use changefeed_operator::operator::ChangeFeedProcessor;
use changefeed_operator::processor::LeaseStore;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DeleteParams};
use tokio::process::Command;

use crate::common::DiesWithTest;
use crate::common::{CFP, eventually, lease_store, leases_of, start_emulator, terminate};
use crate::operator_support::{
    FAKE_ENDPOINT, Operator, Scene, TIMEOUT, apply_ok, replicas, resource, secret_yaml, wait, wait_event, wait_up_to,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_resource_that_asks_for_it_removes_its_lease_documents() {
    let Scene { plane, ns, client } = Scene::new("cleanup").await;
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:3").await;
    let account = changefeed_operator::cosmos::CosmosAccount::connect(
        &endpoint,
        &changefeed_operator::cosmos::AccountAuth::emulator_key(),
    )
    .await
    .unwrap();
    // Two processors' leases in the same lease container: only the deleted one's go.
    for processor in ["orders", "keep"] {
        let mut worker = Command::new(CFP)
            .args([
                "worker",
                "--endpoint",
                &endpoint,
                "--database",
                "db",
                "--container",
                "items",
                "--processor",
                processor,
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .dies_with_test()
            .spawn()
            .unwrap();
        let created = eventually(TIMEOUT, || async {
            match lease_store(&account, processor).await {
                Some(store) => store.snapshot().await.map(|s| s.leases.len() == 3).unwrap_or(false),
                None => false,
            }
        })
        .await;
        assert!(created, "leases of {processor} not created");
        terminate(&mut worker).await;
    }
    let mut operator = Operator::start(plane, &ns, "op");
    apply_ok(plane, &ns, &secret_yaml());
    apply_ok(
        plane,
        &ns,
        &resource("orders", &endpoint, "  leases:\n    deleteOnResourceDeletion: true\n"),
    );
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    wait("the finalizer", || async {
        let cfp = cfps.get("orders").await.ok()?;
        cfp.metadata
            .finalizers
            .filter(|f| f.iter().any(|f| f == "changefeed.io/lease-cleanup"))
    })
    .await;
    // A worker pod still runs (no kubelet here: a Pod object stands for it).
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment = wait("the Deployment", || async {
        deployments.get_opt("orders").await.ok().flatten()
    })
    .await;
    let labels = deployment.spec.unwrap().template.metadata.unwrap().labels.unwrap();
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "orders-5d8-w1", "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "worker", "image": "cfp:test"}]},
    });
    assert!(plane.kubectl_run(&["create", "-f", "-"], Some(&pod.to_string())).0);
    cfps.delete("orders", &DeleteParams::default()).await.unwrap();
    // First the workers go to zero, and nothing is deleted while a worker pod exists.
    wait("the workers scaled to 0", || async {
        let d = deployments.get("orders").await.ok()?;
        (replicas(&d) == Some(0)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let while_running = leases_of(&account, "orders").await.len();
    assert!(
        cfps.get_opt("orders").await.unwrap().is_some(),
        "the resource waits for the pods"
    );
    assert_eq!(while_running, 3, "no lease is deleted while a worker pod exists");
    // What the ReplicaSet controller does after the scale to 0.
    assert!(
        plane
            .kubectl_run(&["delete", "pod", "orders-5d8-w1", "-n", &ns, "--wait=false"], None)
            .0
    );
    wait("the resource gone", || async {
        cfps.get_opt("orders")
            .await
            .ok()
            .and_then(|o| o.is_none().then_some(()))
    })
    .await;
    let orders = lease_store(&account, "orders").await.unwrap().snapshot().await.unwrap();
    let keep = lease_store(&account, "keep").await.unwrap().snapshot().await.unwrap();
    println!(
        "lease cleanup: workers scaled to 0 first, 3 leases kept while a worker pod existed; after it went, processor orders has {} leases (init marker {}), processor keep still {}",
        orders.leases.len(),
        orders.initialized,
        keep.leases.len()
    );
    assert!(orders.leases.is_empty() && !orders.initialized);
    assert_eq!(keep.leases.len(), 3);
    terminate(&mut operator.child).await;
    terminate(&mut emulator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_whose_leases_cannot_be_deleted_still_goes_away_within_the_cleanup_timeout() {
    let Scene { plane, ns, client } = Scene::new("stuck-cleanup").await;
    let mut operator = Operator::start(plane, &ns, "op");
    apply_ok(plane, &ns, &secret_yaml());
    // A long cleanupTimeout: a credential that is gone is not waited for.
    let extra = "  leases:\n    deleteOnResourceDeletion: true\n    cleanupTimeout: 10m\n";
    apply_ok(plane, &ns, &resource("orders", FAKE_ENDPOINT, extra));
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    wait("the finalizer", || async {
        let cfp = cfps.get("orders").await.ok()?;
        cfp.metadata
            .finalizers
            .filter(|f| f.iter().any(|f| f == "changefeed.io/lease-cleanup"))
    })
    .await;
    // The key is gone before the resource: its leases cannot be reached any more.
    assert!(plane.kubectl_run(&["delete", "secret", "cosmos", "-n", &ns], None).0);
    let deleted = tokio::time::Instant::now();
    cfps.delete("orders", &DeleteParams::default()).await.unwrap();
    wait_up_to("the resource gone", Duration::from_secs(30), || async {
        cfps.get_opt("orders")
            .await
            .ok()
            .and_then(|o| o.is_none().then_some(()))
    })
    .await;
    let took = deleted.elapsed();
    let abandoned = wait_event(&client, &ns, "LeaseCleanupAbandoned").await;
    println!(
        "cleanup without the Secret: the resource was gone {took:.1?} after its deletion (cleanupTimeout 10 m); Warning Event {:?}",
        abandoned.note
    );
    assert!(took < Duration::from_secs(15), "{took:?}");
    assert_eq!(abandoned.type_.as_deref(), Some("Warning"));
    let note = abandoned.note.unwrap_or_default();
    assert!(note.contains("may be left in the lease container"), "{note}");
    assert!(
        note.contains("gave up at once") && note.contains("\"cosmos\""),
        "{note}"
    );
    terminate(&mut operator.child).await;
}
