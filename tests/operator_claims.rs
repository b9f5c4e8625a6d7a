//! Lease-set claims (issue 38 §1), against a real kube-apiserver + etcd and `cfp emulator`: a
//! resource in namespace B runs processor `orders`; a resource in namespace A names the same
//! lease set (endpoint, containers, processor name — none of them secret). A is refused
//! (`Ready=False`, `LeaseSetClaimed`, no workers, no lag); its rewind, its restore and its
//! deletion with `leases.deleteOnResourceDeletion` leave B's leases exactly as they were.

use changefeed_operator::cosmos::CosmosAccount;
use changefeed_operator::operator::ChangeFeedProcessor;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;

use crate::common::terminate;
use crate::operator_rewind::{checkpointed_emulator, export_config_map, leases};
use crate::operator_support::{
    Operator, Scene, apply_ok, namespace, replicas, resource, secret_yaml, wait, wait_event,
};

/// The claim document of processor `orders`: (namespace, name) of its holder.
async fn holder(account: &CosmosAccount) -> Option<(String, String)> {
    let store = crate::common::lease_store(account, "orders").await?;
    let (body, _) = store.read_marker("claim").await.ok()??;
    let claimant = &body["claimant"];
    Some((
        claimant["namespace"].as_str()?.to_owned(),
        claimant["name"].as_str()?.to_owned(),
    ))
}

/// Successful reconciles so far (the operator's metric).
async fn reconciles(operator: &Operator) -> u64 {
    operator.scrape().await.map_or(0, |(ok, _)| ok)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_namespace_cannot_run_rewind_restore_or_delete_a_claimed_lease_set() {
    let Scene { plane, ns, client } = Scene::new("claims-a").await;
    let other = namespace(plane, "claims-b");
    let (mut emulator, endpoint, account, export) = checkpointed_emulator().await;
    let operator = Operator::start_as(
        &ns,
        "op",
        "info,kube=warn",
        &[],
        &plane.kubeconfig,
        &["--namespace", &other, "--leader-election-namespace", &ns],
    );
    for namespace in [&ns, &other] {
        apply_ok(plane, namespace, &secret_yaml());
    }
    // B runs the processor first: it holds the lease set.
    apply_ok(plane, &other, &resource("orders", &endpoint, "  replicas: 1\n"));
    let deployments_b: Api<Deployment> = Api::namespaced(client.clone(), &other);
    wait("B's workers", || async {
        let d = deployments_b.get_opt("orders").await.ok().flatten()?;
        (replicas(&d) == Some(1)).then_some(())
    })
    .await;
    let held = wait("B's claim", || async { holder(&account).await }).await;
    assert_eq!(held, (other.clone(), "orders".to_owned()));
    let before = leases(&account).await;

    // A names the same lease set, and asks for its deletion with the resource.
    let a_spec = "  replicas: 2\n  leases:\n    deleteOnResourceDeletion: true\n";
    apply_ok(plane, &ns, &resource("orders", &endpoint, a_spec));
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    let refused = wait("A refused", || async {
        let cfp = cfps.get("orders").await.ok()?;
        cfp.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "LeaseSetClaimed")
    })
    .await;
    assert!(
        refused.message.contains(&format!("{other}/orders")),
        "{}",
        refused.message
    );
    let deployments_a: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let a_workers = deployments_a
        .get_opt("orders")
        .await
        .unwrap()
        .and_then(|d| replicas(&d))
        .unwrap_or(0);
    assert_eq!(a_workers, 0, "a refused resource starts no workers");
    let a_status = cfps.get("orders").await.unwrap().status.unwrap_or_default();
    assert!(
        a_status.estimated_lag.is_none() && a_status.leases.is_none(),
        "a refused resource reports no lag: {:?}",
        a_status.estimated_lag
    );

    // A's rewind and restore: the operator reconciles them and moves nothing.
    export_config_map(plane, &ns, &export);
    for annotation in [
        "changefeed.io/rewind-to=beginning",
        "changefeed.io/restore-from=orders-checkpoints",
    ] {
        let seen = reconciles(&operator).await;
        let (ok, _, err) = plane.kubectl_run(&["annotate", "--overwrite", "-n", &ns, "cfp/orders", annotation], None);
        assert!(ok, "kubectl annotate: {err}");
        wait("two reconciles after the annotation", || async {
            (reconciles(&operator).await >= seen + 2).then_some(())
        })
        .await;
        assert_eq!(leases(&account).await, before, "{annotation} from A moved B's leases");
    }

    // A's deletion with deleteOnResourceDeletion: the finalizer goes, the leases stay.
    assert!(
        plane
            .kubectl_run(&["delete", "cfp/orders", "-n", &ns, "--wait=false"], None)
            .0
    );
    let event = wait_event(&client, &ns, "LeaseCleanupRefused").await;
    wait("A gone", || async {
        cfps.get_opt("orders").await.ok()?.is_none().then_some(())
    })
    .await;
    let after = leases(&account).await;
    println!(
        "claims: B holds {held:?}; A refused ({}); rewind, restore and deletion from A: B's {} leases unchanged: {}; Event {:?}",
        refused.reason,
        after.len(),
        after == before,
        event.note.unwrap_or_default()
    );
    assert_eq!(after, before, "A's deletion changed B's leases");
    assert_eq!(holder(&account).await, Some((other.clone(), "orders".to_owned())));
    let b_workers = deployments_b.get("orders").await.unwrap();
    assert_eq!(replicas(&b_workers), Some(1), "B runs on");
    terminate(&mut emulator).await;
}
