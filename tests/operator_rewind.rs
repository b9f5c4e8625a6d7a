//! Rewinding and restoring checkpoints with annotations, against a real kube-apiserver + etcd and
//! `cfp emulator` (no kubelet: a Pod object stands for a running worker): the operator scales the
//! workers to 0, waits for their pods to go, moves the checkpoints, restores the replicas,
//! records `status.lastRewind` and an Event, and removes the annotation; a failure leaves the
//! checkpoints where they were with the reason in the `Rewound` condition.

use std::process::Stdio;

use changefeed_operator::cosmos::{AccountAuth, CosmosAccount};
use changefeed_operator::operator::ChangeFeedProcessor;
use changefeed_operator::processor::{Lease, LeaseStore};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use serde_json::json;

use crate::common::{cfp_worker, cfp_write, eventually, lease_store, start_emulator, terminate};
use crate::operator_support::{Operator, Scene, TIMEOUT, apply_ok, replicas, resource, secret_yaml, wait, wait_event};

/// The leases of processor `orders`.
pub(crate) async fn leases(account: &CosmosAccount) -> Vec<Lease> {
    match lease_store(account, "orders").await {
        Some(store) => store.snapshot().await.map(|s| s.leases).unwrap_or_default(),
        None => Vec::new(),
    }
}

/// Runs a `cfp worker` of processor `orders` until its 2 leases hold a checkpoint of the 100
/// documents written, then stops it (its leases released).
pub(crate) async fn checkpointed(endpoint: &str, account: &CosmosAccount) {
    let mut worker = cfp_worker(endpoint)
        .args(["--processor", "orders"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    cfp_write(endpoint, 0, 100).await;
    let done = eventually(TIMEOUT, || async {
        let leases = leases(account).await;
        leases.len() == 2 && leases.iter().all(|l| l.continuation.is_some())
    })
    .await;
    assert!(done, "the worker checkpointed its leases");
    terminate(&mut worker).await;
}

/// `cfp emulator` with processor `orders` checkpointed (see [`checkpointed`]): the emulator, its
/// endpoint, an account on it and `cfp checkpoints export` of the leases.
pub(crate) async fn checkpointed_emulator() -> (tokio::process::Child, String, CosmosAccount, String) {
    let (emulator, endpoint) = start_emulator("db/items:/pk:2").await;
    let account = CosmosAccount::connect(&endpoint, &AccountAuth::emulator_key())
        .await
        .unwrap();
    checkpointed(&endpoint, &account).await;
    let (_, export, _) = crate::common::cfp_checkpoints(&endpoint, "export", &["--processor", "orders"]).await;
    (emulator, endpoint, account, export)
}

/// Creates ConfigMap `orders-checkpoints` in `ns` holding `export` (what `restore-from` names).
pub(crate) fn export_config_map(plane: &crate::control_plane::ControlPlane, ns: &str, export: &str) {
    let config_map = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "orders-checkpoints", "namespace": ns},
        "data": {"export.json": export},
    });
    assert!(
        plane
            .kubectl_run(&["create", "-f", "-"], Some(&config_map.to_string()))
            .0
    );
}

/// A Pod object `name` with the worker pods' labels (what the ReplicaSet controller would create).
pub(crate) fn create_pod(plane: &crate::control_plane::ControlPlane, ns: &str, deployment: &Deployment, name: &str) {
    let labels = deployment
        .spec
        .clone()
        .unwrap()
        .template
        .metadata
        .unwrap()
        .labels
        .unwrap();
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "worker", "image": "cfp:test"}]},
    });
    assert!(plane.kubectl_run(&["create", "-f", "-"], Some(&pod.to_string())).0);
}

fn annotations(cfp: &ChangeFeedProcessor) -> Vec<String> {
    cfp.metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, _)| k.clone())
        .filter(|k| k.starts_with("changefeed.io/re"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rewind_annotations_stop_the_workers_move_the_checkpoints_and_restore_them() {
    let Scene { plane, ns, client } = Scene::new("rewind").await;
    let (mut emulator, endpoint, account, export) = checkpointed_emulator().await;
    let before = leases(&account).await;
    let mut operator = Operator::start(plane, &ns, "op");
    apply_ok(plane, &ns, &secret_yaml());
    apply_ok(plane, &ns, &resource("orders", &endpoint, "  replicas: 2\n"));
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment = wait("the Deployment at 2", || async {
        let d = deployments.get_opt("orders").await.ok().flatten()?;
        (replicas(&d) == Some(2)).then_some(d)
    })
    .await;
    create_pod(plane, &ns, &deployment, "orders-5d8-w1");
    // An evicted worker pod: `Failed` until pod garbage collection, it runs no worker.
    create_pod(plane, &ns, &deployment, "orders-5d8-evicted");
    let evicted =
        r#"{"status":{"phase":"Failed","reason":"Evicted","message":"The node was low on resource: memory."}}"#;
    let (ok, _, err) = plane.kubectl_run(
        &[
            "patch",
            "pod",
            "orders-5d8-evicted",
            "-n",
            &ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            evicted,
        ],
        None,
    );
    assert!(ok, "kubectl patch --subresource=status: {err}");

    // 1. Rewind to the beginning: workers to 0, and nothing moves while a worker pod exists.
    let annotate = |value: &str| {
        let (ok, _, err) = plane.kubectl_run(&["annotate", "-n", &ns, "cfp/orders", value], None);
        assert!(ok, "kubectl annotate: {err}");
    };
    annotate("changefeed.io/rewind-to=beginning");
    wait("the workers scaled to 0 and the rewind recorded", || async {
        let d = deployments.get("orders").await.ok()?;
        let cfp = cfps.get("orders").await.ok()?;
        let stopping = cfp.status?.rewind.is_some_and(|r| r.phase == "Stopping");
        (replicas(&d) == Some(0) && stopping).then_some(())
    })
    .await;
    assert_eq!(
        leases(&account).await,
        before,
        "no checkpoint moves while a worker pod that can run exists"
    );
    assert!(
        plane
            .kubectl_run(&["delete", "pod", "orders-5d8-w1", "-n", &ns, "--wait=false"], None)
            .0
    );
    // The evicted pod stays; it runs no worker, so the rewind goes on without waiting for it.
    let done = wait("the rewind recorded and the annotation removed", || async {
        let cfp = cfps.get("orders").await.ok()?;
        let status = cfp.status.clone()?;
        (annotations(&cfp).is_empty() && status.rewind.is_none()).then_some(status.last_rewind?)
    })
    .await;
    let event = wait_event(&client, &ns, "Rewound").await;
    wait("the replicas restored", || async {
        let d = deployments.get("orders").await.ok()?;
        (replicas(&d) == Some(2)).then_some(())
    })
    .await;
    let rewound = leases(&account).await;
    println!(
        "rewind-to=beginning: lastRewind {:?} ({}), Event {:?}, replicas 2 → 0 → 2, leases without checkpoint {} of {}",
        done.request,
        done.message,
        event.note.unwrap_or_default(),
        rewound.iter().filter(|l| l.continuation.is_none()).count(),
        rewound.len()
    );
    assert_eq!(done.request, "beginning");
    assert!(rewound.iter().all(|l| l.continuation.is_none() && l.properties.get("startFrom").map(String::as_str) == Some("beginning")));

    // 2. A restore from a ConfigMap that does not exist: nothing moves, the reason is in status.
    annotate("changefeed.io/restore-from=missing");
    let failed = wait("the Rewound condition False", || async {
        let cfp = cfps.get("orders").await.ok()?;
        let status = cfp.status.clone()?;
        let condition = status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Rewound" && c.status == "False")?;
        (annotations(&cfp).is_empty() && status.rewind.is_none()).then_some(condition)
    })
    .await;
    wait_event(&client, &ns, "RewindFailed").await;
    assert_eq!(failed.reason, "RewindFailed");
    assert!(
        failed.message.contains("ConfigMap missing does not exist"),
        "{}",
        failed.message
    );
    let unchanged = leases(&account).await;
    assert_eq!(
        unchanged.iter().map(|l| &l.etag).collect::<Vec<_>>(),
        rewound.iter().map(|l| &l.etag).collect::<Vec<_>>(),
        "a failed restore leaves the leases as they were"
    );

    // 3. A restore from the export taken before: the checkpoints are back.
    export_config_map(plane, &ns, &export);
    annotate("changefeed.io/restore-from=orders-checkpoints");
    let restored = wait("the restore recorded", || async {
        let cfp = cfps.get("orders").await.ok()?;
        let last = cfp.status?.last_rewind?;
        (last.request == "configmap/orders-checkpoints" && annotations(&cfps.get("orders").await.ok()?).is_empty())
            .then_some(last)
    })
    .await;
    let back = leases(&account).await;
    println!(
        "restore-from=orders-checkpoints: {}; continuations equal to the export's: {}; failed restore before: {}",
        restored.message,
        back.iter()
            .zip(&before)
            .filter(|(a, b)| a.continuation == b.continuation)
            .count(),
        failed.message
    );
    assert_eq!(
        back.iter().map(|l| l.continuation.clone()).collect::<Vec<_>>(),
        before.iter().map(|l| l.continuation.clone()).collect::<Vec<_>>()
    );
    terminate(&mut operator.child).await;
    terminate(&mut emulator).await;
}

/// The `Rewound=False` condition once the annotations are gone and no rewind is in progress.
async fn refused(
    cfps: &Api<ChangeFeedProcessor>,
    since: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    wait("the Rewound condition False", || async {
        let cfp = cfps.get("orders").await.ok()?;
        let status = cfp.status.clone()?;
        let condition = status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Rewound" && c.status == "False" && c.message.contains(since))?;
        (annotations(&cfp).is_empty() && status.rewind.is_none()).then_some(condition)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_refuses_an_export_of_another_container_or_of_one_created_again() {
    let Scene { plane, ns, client } = Scene::new("restore-foreign").await;
    let (mut emulator, endpoint) = crate::common::start_emulator_with(&[
        "--port",
        "0",
        "--container",
        "db/items:/pk:2",
        "--container",
        "db/audit:/pk:2",
    ])
    .await;
    let account = CosmosAccount::connect(&endpoint, &AccountAuth::emulator_key())
        .await
        .unwrap();
    checkpointed(&endpoint, &account).await;
    let (_, text, _) = crate::common::cfp_checkpoints(&endpoint, "export", &["--processor", "orders"]).await;
    let export: serde_json::Value = serde_json::from_str(&text).unwrap();
    // The same checkpoints, as an export of db/audit would name them.
    let audit = account.monitored("db", "audit").await.unwrap();
    let mut of_audit = export.clone();
    of_audit["container"] = "db/audit".into();
    of_audit["containerRid"] = audit.rid().into();
    let config_map = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "exports", "namespace": ns},
        "data": {"items.json": text, "audit.json": of_audit.to_string()},
    });
    assert!(
        plane
            .kubectl_run(&["create", "-f", "-"], Some(&config_map.to_string()))
            .0
    );
    let mut operator = Operator::start(plane, &ns, "op");
    apply_ok(plane, &ns, &secret_yaml());
    apply_ok(plane, &ns, &resource("orders", &endpoint, "  replicas: 1\n"));
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    let annotate = |value: &str| {
        let (ok, _, err) = plane.kubectl_run(&["annotate", "-n", &ns, "cfp/orders", value], None);
        assert!(ok, "kubectl annotate: {err}");
    };
    let before = leases(&account).await;

    // 1. Another container's export.
    annotate("changefeed.io/restore-from=exports/audit.json");
    let other = refused(&cfps, "db/audit").await;
    let after_other = leases(&account).await;

    // 2. The container deleted and created again under its name: a new resource id, an empty
    // lease set (the lease prefix names the resource id), and the old export does not apply.
    account.delete_container("db", "items").await.unwrap();
    account.ensure_container("db", "items", "/pk").await.unwrap();
    let recreated_rid = account.monitored("db", "items").await.unwrap().rid().to_owned();
    annotate("changefeed.io/restore-from=exports/items.json");
    let recreated = refused(&cfps, "export is of container db/items").await;
    let after_recreated = leases(&account).await;
    println!(
        "restore of db/audit's export: {} ({}); leases moved {} of {}; restore into db/items created again (resource id {} → {recreated_rid}): {} ({}); leases created {}",
        other.reason,
        other.message,
        after_other
            .iter()
            .zip(&before)
            .filter(|(a, b)| a.etag != b.etag)
            .count(),
        before.len(),
        export["containerRid"],
        recreated.reason,
        recreated.message,
        after_recreated.len()
    );
    assert_eq!(other.reason, "ForeignExport");
    assert_eq!(
        after_other.iter().map(|l| &l.etag).collect::<Vec<_>>(),
        before.iter().map(|l| &l.etag).collect::<Vec<_>>(),
        "another container's export moves nothing"
    );
    assert_eq!(recreated.reason, "ForeignExport");
    for message in [&other.message, &recreated.message] {
        assert!(
            !message.contains(&recreated_rid) && !message.contains(export["containerRid"].as_str().unwrap_or("-")),
            "a refusal names no container's resource id (part of its lease prefix): {message}"
        );
    }
    assert!(
        after_recreated.is_empty(),
        "no lease of the old container's positions: {after_recreated:?}"
    );
    terminate(&mut operator.child).await;
    terminate(&mut emulator).await;
}

/// A rewind never scales a Deployment of the resource's name that is not its own (one orphaned
/// from an earlier resource of that name, its selector the workers'): refused as the conflict
/// it is, the Deployment left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewind_never_scales_a_deployment_of_its_name_that_is_not_its_own() {
    let Scene { plane, ns, client } = Scene::new("rewind-conflict").await;
    let (mut emulator, endpoint, _, _) = checkpointed_emulator().await;
    let labels = json!({"changefeed.io/processor": "orders", "app.kubernetes.io/component": "worker"});
    let orphan = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "orders", "namespace": ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels},
                         "spec": {"containers": [{"name": "worker", "image": "cfp:orphaned"}]}},
        },
    });
    apply_ok(plane, &ns, &orphan.to_string());
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let before = deployments.get("orders").await.unwrap();
    let mut operator = Operator::start(plane, &ns, "op");
    apply_ok(plane, &ns, &secret_yaml());
    apply_ok(plane, &ns, &resource("orders", &endpoint, "  replicas: 1\n"));
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    let (ok, _, err) = plane.kubectl_run(
        &["annotate", "-n", &ns, "cfp/orders", "changefeed.io/rewind-to=beginning"],
        None,
    );
    assert!(ok, "kubectl annotate: {err}");
    let refusal = refused(&cfps, "is not this resource's").await;
    let after = deployments.get("orders").await.unwrap();
    println!(
        "a rewind beside another's Deployment of its name: {}; the Deployment's version kept: {}, replicas {:?}, owners {:?}",
        refusal.message,
        after.metadata.resource_version == before.metadata.resource_version,
        replicas(&after),
        after.metadata.owner_references
    );
    terminate(&mut operator.child).await;
    terminate(&mut emulator).await;
    assert_eq!(after.metadata.resource_version, before.metadata.resource_version);
    assert!(after.metadata.owner_references.is_none());
}
