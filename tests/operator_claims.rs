//! Lease-set claims (issue 38 §1), against a real kube-apiserver + etcd and an account with key
//! auth disabled (the emulator's Entra ID mode): the operator signs in with its own workload
//! identity, and both resources use `auth: WorkloadIdentity`. A resource in namespace B runs
//! processor `orders`; a resource in namespace A names the same lease set (endpoint, containers,
//! processor name — none of them secret). A is refused (`Ready=False`, `LeaseSetClaimed`, no
//! workers, no lag); its rewind, its restore and its deletion with
//! `leases.deleteOnResourceDeletion` leave B's leases — owners and continuations — exactly as they
//! were.

use std::process::Stdio;

use changefeed_operator::cosmos::CosmosAccount;
use changefeed_operator::operator::ChangeFeedProcessor;
use changefeed_operator::processor::Lease;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::common::{self, cfp_worker, eventually};
use crate::entra_support::{EntraAccount, TokenEndpoint};
use crate::operator_rewind::{export_config_map, leases};
use crate::operator_support::{Operator, Scene, TIMEOUT, apply_ok, namespace, replicas, wait, wait_event};

/// Signs `cfp` commands in with the workload identity of their environment.
const TOKEN: [&str; 2] = ["--auth", "workload-identity"];

/// B's worker: the owner its leases keep.
const B_WORKER: &str = "orders-7d9f5-b1";

/// `orders` in the namespace it is applied to, at `endpoint`, signed in with a token: no Secret,
/// no key.
fn entra_resource(endpoint: &str, extra: &str) -> String {
    format!(
        "apiVersion: changefeed.io/v1alpha1\nkind: ChangeFeedProcessor\nmetadata:\n  name: orders\nspec:\n  connection:\n    endpoint: {endpoint}\n    auth: WorkloadIdentity\n  monitored:\n    database: db\n    container: items\n  worker:\n    serviceAccountName: orders-identity\n{extra}"
    )
}

/// A key is refused; B's worker [`B_WORKER`] of processor `orders`, signed in with a token, runs
/// until its 2 leases hold a checkpoint of the 100 documents written, and is then killed (`kill
/// -9`), so its leases keep their owner as a running worker's do; returns `cfp checkpoints
/// export` of them.
async fn checkpointed_with_token(entra: &EntraAccount, identity: &[(&str, String)]) -> String {
    let endpoint = entra.endpoint.as_str();
    let items = ["--endpoint", endpoint, "--database", "db", "--container", "items"];
    let write = [&["write", "--count", "1"][..], &items].concat();
    let (code, _, keyed) = common::cfp_output(&write, &[], "warn").await;
    assert!(
        code != Some(0) && keyed.contains("the account refused the key"),
        "key auth is disabled: {keyed}"
    );
    let mut worker = cfp_worker(endpoint)
        .args(["--processor", "orders", "--instance", B_WORKER])
        .args(TOKEN)
        .envs(identity.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    common::cfp_write_with(endpoint, 0, 100, &TOKEN, identity).await;
    let done = eventually(TIMEOUT, || async {
        let leases = leases(&entra.account).await;
        leases.len() == 2 && leases.iter().all(|l| l.continuation.is_some())
    })
    .await;
    assert!(done, "the worker checkpointed its leases");
    worker.start_kill().unwrap();
    worker.wait().await.unwrap();
    let (code, export, err) = common::cfp_output(
        &[
            &["checkpoints", "export"][..],
            &items,
            &["--processor", "orders"],
            &TOKEN,
        ]
        .concat(),
        identity,
        "warn",
    )
    .await;
    assert_eq!(code, Some(0), "cfp checkpoints export with a token: {err}");
    export
}

/// What a rewind, a restore or a cleanup would change of a lease: its owner (name and epoch) and
/// its continuation.
#[derive(Debug, PartialEq)]
struct Position {
    id: String,
    owner: Option<String>,
    owner_epoch: Option<String>,
    continuation: Option<String>,
}

/// Asserts that A's `action` left B's leases as they were: owners and continuations first (the
/// clearer message), then the whole documents.
fn unchanged(now: &[Lease], before: &[Lease], action: &str) {
    assert_eq!(
        positions(now),
        positions(before),
        "the {action} from A moved B's owners or continuations"
    );
    assert_eq!(now, before, "the {action} from A changed B's leases");
}

fn positions(leases: &[Lease]) -> Vec<Position> {
    leases
        .iter()
        .map(|l| Position {
            id: l.id.clone(),
            owner: l.owner.clone(),
            owner_epoch: l.owner_epoch.clone(),
            continuation: l.continuation.clone(),
        })
        .collect()
}

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

/// The rewind and restore annotations.
const REWIND: &str = "changefeed.io/rewind-to";
const RESTORE: &str = "changefeed.io/restore-from";

/// Whether `cfp` is refused its lease set.
fn refused(cfp: &ChangeFeedProcessor) -> Option<Condition> {
    cfp.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "LeaseSetClaimed")
        .cloned()
}

/// Sets A's `annotations` (null removes one) and, in the same patch, `spec.replicas`, a new
/// generation; returns once the operator has published the status of that generation — from a
/// reconcile that saw the annotations — and A is still refused.
async fn annotate_and_reconcile(cfps: &Api<ChangeFeedProcessor>, annotations: serde_json::Value, replicas: i32) {
    let patch = json!({"metadata": {"annotations": annotations}, "spec": {"replicas": replicas}});
    let patched = cfps
        .patch("orders", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let generation = patched.metadata.generation;
    wait("A's status of the annotated generation, refused", || async {
        let cfp = cfps.get("orders").await.ok()?;
        let seen = cfp.status.as_ref()?.observed_generation == generation;
        (seen && refused(&cfp).is_some()).then_some(())
    })
    .await;
}

/// A's standing once it names B's lease set: `Ready=False`/`LeaseSetClaimed` naming B, no
/// workers, no lag.
async fn a_refused(client: &kube::Client, ns: &str, other: &str) -> Condition {
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), ns);
    let refused = wait("A refused", || async { refused(&cfps.get("orders").await.ok()?) }).await;
    assert!(
        refused.message.contains(&format!("{other}/orders")),
        "{}",
        refused.message
    );
    let deployments_a: Api<Deployment> = Api::namespaced(client.clone(), ns);
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
    refused
}

/// Deletes A (`--wait=false`) and waits until the operator has refused the cleanup (its Event)
/// and removed the finalizer.
async fn delete_a(
    plane: &crate::control_plane::ControlPlane,
    client: &kube::Client,
    ns: &str,
) -> k8s_openapi::api::events::v1::Event {
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), ns);
    assert!(
        plane
            .kubectl_run(&["delete", "cfp/orders", "-n", ns, "--wait=false"], None)
            .0
    );
    let event = wait_event(client, ns, "LeaseCleanupRefused").await;
    wait("A gone", || async {
        cfps.get_opt("orders").await.ok()?.is_none().then_some(())
    })
    .await;
    event
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_namespace_cannot_run_rewind_restore_or_delete_a_claimed_lease_set() {
    let Scene { plane, ns, client } = Scene::new("claims-a").await;
    let other = namespace(plane, "claims-b");
    let dir = tempfile::tempdir().unwrap();
    let tokens = TokenEndpoint::start(dir.path()).await;
    let identity = tokens.pod_env_in(dir.path());
    let entra = EntraAccount::serve(&["db/items:/pk:2", "db/leases"]).await;
    let (endpoint, account) = (entra.endpoint.as_str(), &entra.account);
    let export = checkpointed_with_token(&entra, &identity).await;
    let before = leases(account).await;
    assert!(
        before.iter().all(|l| l.owner.as_deref() == Some(B_WORKER)),
        "B's worker owns its leases: {:?}",
        positions(&before)
    );
    let issued_before_operator = tokens.seen().issued;
    let _operator = Operator::start_as(
        &ns,
        "op",
        "info,kube=warn",
        &identity,
        &plane.kubeconfig,
        &["--namespace", &other, "--leader-election-namespace", &ns],
    );
    // B runs the processor first: it holds the lease set.
    apply_ok(plane, &other, &entra_resource(endpoint, "  replicas: 1\n"));
    let deployments_b: Api<Deployment> = Api::namespaced(client.clone(), &other);
    wait("B's workers", || async {
        let d = deployments_b.get_opt("orders").await.ok().flatten()?;
        (replicas(&d) == Some(1)).then_some(())
    })
    .await;
    let held = wait("B's claim", || async { holder(account).await }).await;
    assert_eq!(held, (other.clone(), "orders".to_owned()));
    assert_eq!(leases(account).await, before, "B's claim changed its leases");

    // A names the same lease set, and asks for its deletion with the resource.
    let a_spec = "  replicas: 2\n  leases:\n    deleteOnResourceDeletion: true\n";
    apply_ok(plane, &ns, &entra_resource(endpoint, a_spec));
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    let refused = a_refused(&client, &ns, &other).await;

    // A's rewind, then its restore alone: the operator reconciles them and moves nothing.
    export_config_map(plane, &ns, &export);
    let requests = [
        ("rewind", json!({REWIND: "beginning"}), 3),
        ("restore", json!({REWIND: null, RESTORE: "orders-checkpoints"}), 4),
    ];
    for (action, annotations, replicas) in requests {
        annotate_and_reconcile(&cfps, annotations, replicas).await;
        unchanged(&leases(account).await, &before, action);
    }

    // A's deletion with deleteOnResourceDeletion: the finalizer goes, the leases stay.
    let event = delete_a(plane, &client, &ns).await;
    let after = leases(account).await;
    let owned = after.iter().filter(|l| l.owner.as_deref() == Some(B_WORKER)).count();
    let continued = after.iter().filter(|l| l.continuation.is_some()).count();
    let seen = tokens.seen();
    println!(
        "claims (Entra ID, key auth disabled): B holds {held:?}; A refused ({}); rewind, restore and deletion from A: B's {} leases unchanged: {} (owner {B_WORKER} on {owned}, continuations on {continued}, owners and continuations equal: {}); operator token requests: {}; Event {:?}",
        refused.reason,
        after.len(),
        after == before,
        positions(&after) == positions(&before),
        seen.issued - issued_before_operator,
        event.note.unwrap_or_default()
    );
    unchanged(&after, &before, "deletion");
    assert_eq!(holder(account).await, Some((other.clone(), "orders".to_owned())));
    let b_workers = deployments_b.get("orders").await.unwrap();
    assert_eq!(replicas(&b_workers), Some(1), "B runs on");
    assert!(seen.refused.is_empty(), "{seen:?}");
    assert!(
        seen.issued > issued_before_operator,
        "the operator signed in with a token: {seen:?}"
    );
}
