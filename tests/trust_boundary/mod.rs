//! The operator's trust boundary (issue 53), tried as a hostile tenant would on a real
//! kube-apiserver: a tenant who may only write `ChangeFeedProcessor`s in its namespace gets
//! neither the operator's identity sent to an endpoint it names, nor another tenant's leases,
//! nor objects it does not own. Each test is the adversary of one promise.

mod listener;

use std::process::Stdio;
use std::time::Duration;

use changefeed_operator::cosmos::CosmosAccount;
use changefeed_operator::operator::ChangeFeedProcessor;
use changefeed_operator::processor::{Lease, LeaseStore};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::common::{self, cfp_worker, emulator_control, eventually, lease_store, terminate};
use crate::entra_support::TokenEndpoint;
use crate::operator_rewind::{checkpointed_emulator, create_pod, leases};
use crate::operator_support::{
    FAKE_ENDPOINT, Operator, Scene, TIMEOUT, apply, apply_ok, namespace, resource, secret_yaml, wait, wait_event,
    wait_up_to,
};
use listener::Recording;

/// A resource `name` whose operator-side access uses the operator's own workload identity.
fn identity_resource(name: &str, endpoint: &str) -> String {
    format!(
        "apiVersion: changefeed.io/v1alpha1\nkind: ChangeFeedProcessor\nmetadata:\n  name: {name}\nspec:\n  connection:\n    endpoint: {endpoint}\n    auth: WorkloadIdentity\n  monitored:\n    database: db\n    container: items\n  worker:\n    serviceAccountName: orders-identity\n"
    )
}

/// Waits until `name` is `Ready=False` for `reason`; returns that condition.
async fn not_ready(cfps: &Api<ChangeFeedProcessor>, name: &str, reason: &str) -> Condition {
    wait(&format!("{name} Ready=False {reason}"), || async {
        let cfp = cfps.get(name).await.ok()?;
        cfp.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready" && c.status == "False" && c.reason == reason)
    })
    .await
}

/// Changes `name`'s spec (its replicas) and waits until the operator has published the status
/// of that generation: at least one more reconcile of it.
async fn reconciled_again(cfps: &Api<ChangeFeedProcessor>, name: &str, replicas: i32) {
    let patch = json!({"spec": {"replicas": replicas}});
    let patched = cfps
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let generation = patched.metadata.generation;
    wait(&format!("{name}'s status of generation {generation:?}"), || async {
        let cfp = cfps.get(name).await.ok()?;
        (cfp.status?.observed_generation == generation).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_sends_nothing_to_an_endpoint_the_admin_did_not_allow() {
    let Scene { plane, ns, client } = Scene::new("tenant-a").await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = TokenEndpoint::start(dir.path()).await;
    let identity = tokens.pod_env_in(dir.path());
    let tenant = Recording::start().await;
    let _operator = Operator::start_with_env(plane, &ns, "op", "info,kube=warn", &identity);
    apply_ok(plane, &ns, &secret_yaml());
    // The operator's own identity, and the tenant's key, each sent to the tenant's listener.
    apply_ok(plane, &ns, &identity_resource("lent", &tenant.endpoint));
    apply_ok(plane, &ns, &resource("signed", &tenant.endpoint, ""));
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    let mut refusals = Vec::new();
    for name in ["lent", "signed"] {
        let refused = not_ready(&cfps, name, "AccountNotAllowed").await;
        reconciled_again(&cfps, name, 2).await;
        refusals.push(refused.message);
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let lent_workers = deployments.get_opt("lent").await.unwrap();
    let heads = tenant.heads();
    println!(
        "tenant endpoint {}: {} requests received; tokens issued to the operator: {}; refusals: {refusals:?}",
        tenant.endpoint,
        heads.len(),
        tokens.seen().issued
    );
    assert!(
        heads.is_empty(),
        "the operator sent requests to the tenant's endpoint: {heads:?}"
    );
    assert_eq!(tokens.seen().issued, 0, "the operator signed in for nobody");
    assert!(lent_workers.is_none(), "a refused resource gets no workers");
    for message in &refusals {
        assert!(
            message.contains(&format!("namespaces: [{ns}]")) && message.contains("allowedAccounts"),
            "the refusal says what the admin must add: {message}"
        );
    }
    assert!(refusals[0].contains("use its own identity") && refusals[1].contains("plain http"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processor_name_that_could_reach_into_another_prefix_is_refused_by_the_api_server() {
    let Scene { plane, ns, .. } = Scene::new("prefix-grammar").await;
    let named =
        |name: &str, processor: &str| resource(name, FAKE_ENDPOINT, &format!("  processorName: \"{processor}\"\n"));
    let mut refused = Vec::new();
    for (name, processor) in [
        ("nested", "orders..x"),
        ("rid", "ordersacct_KmhJAA==_x"),
        ("dot", "orders."),
    ] {
        let (ok, _, err) = apply(plane, &ns, &named(name, processor));
        assert!(!ok, "processorName {processor:?} was accepted");
        assert!(err.contains("processorName must be letters"), "{err}");
        refused.push(processor);
    }
    let (ok, _, err) = apply(plane, &ns, &named("dotted", "orders.v2"));
    assert!(ok, "a dotted name is a name: {err}");
    println!("processorName refused by the API server: {refused:?}; accepted: orders.v2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_beyond_the_schema_s_size_limits_is_refused_by_the_api_server() {
    let Scene { plane, ns, .. } = Scene::new("size-limits").await;
    let worker = |name: &str, worker: &str| resource(name, FAKE_ENDPOINT, &format!("  worker:\n{worker}"));
    let sidecar =
        |args: &str| format!("    sidecars:\n      - name: s\n        image: i\n        args: [\"{args}\"]\n");
    let long_key = format!(
        "    tolerations:\n      - key: \"{}\"\n        operator: Exists\n",
        "k".repeat(5000)
    );
    let many_values: String = (0..65).map(|i| format!("\"z{i}\", ")).collect();
    let many = format!(
        "    affinity:\n      nodeAffinity:\n        requiredDuringSchedulingIgnoredDuringExecution:\n          nodeSelectorTerms:\n            - matchExpressions:\n                - key: zone\n                  operator: In\n                  values: [{many_values}]\n"
    );
    let cases = [
        ("long-script", sidecar(&"x".repeat(33 * 1024)), "Too long"),
        ("long-toleration-key", long_key, "Too long"),
        ("many-values", many, "Too many"),
    ];
    for (name, extra, message) in &cases {
        let (ok, _, err) = apply(plane, &ns, &worker(name, extra));
        assert!(!ok, "{name} was accepted");
        assert!(err.contains(message), "{name}: {err}");
    }
    let (ok, _, err) = apply(plane, &ns, &worker("script-within", &sidecar(&"x".repeat(30 * 1024))));
    assert!(ok, "a 30 KiB script is within the limits: {err}");
    println!(
        "refused by the API server: {:?}; accepted a 30 KiB sidecar argument",
        cases.map(|(name, _, _)| name)
    );
}

/// A lease-shaped copy of `lease` under `id`, owned by nobody (free for the taking).
fn foreign_copy(lease: &Lease, id: &str) -> serde_json::Value {
    let mut body = serde_json::to_value(lease).unwrap();
    body["id"] = id.into();
    body["Owner"] = serde_json::Value::Null;
    body.as_object_mut().map(|o| o.remove("_etag"));
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_that_only_starts_with_a_processor_s_prefix_is_never_taken_or_deleted() {
    let (mut emulator, endpoint, account, _) = checkpointed_emulator().await;
    let store = lease_store(&account, "orders").await.expect("orders' lease store");
    let ours = leases(&account).await;
    let prefix = store.prefix().to_owned();
    // What a nested prefix would create: ids under `{prefix}..`, one per range of ours, free for
    // the taking, plus a heartbeat of an instance nobody runs.
    let mut planted = Vec::new();
    for lease in &ours {
        let id = format!("{prefix}..x{}..{}", &prefix[prefix.len() / 2..], lease.lease_token);
        store.create_document(&foreign_copy(lease, &id)).await.unwrap();
        planted.push(id);
    }
    let beat = json!({"id": format!("{prefix}.instance.x..y"), "timestamp": "2099-01-01T00:00:00Z"});
    store.create_document(&beat).await.unwrap();
    let planted_before = documents(&account, &planted).await;
    let mut worker = cfp_worker(&endpoint)
        .args([
            "--processor",
            "orders",
            "--instance",
            "w1",
            "--lease-acquire-interval",
            "500ms",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let delivered = delivered_lines(&mut worker);
    common::cfp_write(&endpoint, 100, 50).await;
    let all = eventually(TIMEOUT, || async {
        delivered.load(std::sync::atomic::Ordering::SeqCst) >= 50
    })
    .await;
    let owned = eventually(TIMEOUT, || async {
        let now = leases(&account).await;
        now.len() == ours.len() && now.iter().all(|l| l.owner.as_deref() == Some("w1"))
    })
    .await;
    terminate(&mut worker).await;
    let planted_after = documents(&account, &planted).await;
    println!(
        "planted {} documents under {prefix}..: unchanged {}; orders' {} leases kept and owned: {owned}; delivered {} of 50",
        planted.len(),
        planted_after == planted_before,
        ours.len(),
        delivered.load(std::sync::atomic::Ordering::SeqCst)
    );
    assert!(all, "the worker delivered the 50 new documents");
    assert!(owned, "orders' own leases are kept and taken by its worker");
    assert_eq!(
        planted_after, planted_before,
        "a foreign document was taken, changed or deleted"
    );
    terminate(&mut emulator).await;
}

/// Counts the documents `worker` prints (a JSON line each) as they come.
fn delivered_lines(worker: &mut tokio::process::Child) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    use tokio::io::AsyncBufReadExt;
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = count.clone();
    let stdout = worker.stdout.take().expect("the worker's stdout");
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        while let Ok(Some(_)) = lines.next_line().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    count
}

/// The ETags of the documents `ids` in the lease container (`None`: gone).
async fn documents(account: &CosmosAccount, ids: &[String]) -> Vec<Option<String>> {
    let docs = account.documents(common::DB, common::LEASES).await.unwrap();
    let mut etags = Vec::new();
    for id in ids {
        etags.push(docs.read(id, id).await.unwrap().map(|d| d.etag));
    }
    etags
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_cannot_be_read_deletes_nothing() {
    let Scene { plane, ns, client } = Scene::new("cleanup-closed-a").await;
    let other = namespace(plane, "cleanup-closed-b");
    let (mut emulator, endpoint, account, _) = checkpointed_emulator().await;
    let before = leases(&account).await;
    let watch = ["--namespace", &other, "--leader-election-namespace", &ns];
    let mut operator = Operator::start_as(&ns, "op", "info,kube=warn", &[], &plane.kubeconfig, &watch);
    // B holds the lease set; A names it too and asks for the leases' deletion with it.
    for namespace in [&other, &ns] {
        apply_ok(plane, namespace, &secret_yaml());
    }
    apply_ok(plane, &other, &resource("orders", &endpoint, "  replicas: 0\n"));
    let claimed = eventually(TIMEOUT, || async {
        let store = lease_store(&account, "orders").await;
        let claim = match store {
            Some(store) => store.read_marker("claim").await.ok().flatten(),
            None => None,
        };
        claim.is_some_and(|(body, _)| body["claimant"]["namespace"] == other.as_str())
    })
    .await;
    assert!(claimed, "B holds the lease set");
    let a_spec = "  replicas: 0\n  leases:\n    deleteOnResourceDeletion: true\n";
    apply_ok(plane, &ns, &resource("orders", &endpoint, a_spec));
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    not_ready(&cfps, "orders", "LeaseSetClaimed").await;
    // The operator starts again (nothing remembered) while every request to the account takes
    // 2–6 s: the claim cannot be read within the operator's 5 s, A's deletion must wait.
    terminate(&mut operator.child).await;
    emulator_control(&endpoint, reqwest::Method::POST, "faults?rate=0&latencyMs=4000").await;
    assert!(
        plane
            .kubectl_run(&["delete", "cfp/orders", "-n", &ns, "--wait=false"], None)
            .0
    );
    let _operator = Operator::start_as(&ns, "op2", "info,kube=warn", &[], &plane.kubeconfig, &watch);
    let waiting = wait_event(&client, &ns, "LeaseCleanupWaiting").await;
    emulator_control(&endpoint, reqwest::Method::DELETE, "faults").await;
    let left = wait_event(&client, &ns, "LeaseCleanupRefused").await;
    wait_up_to("A gone", TIMEOUT, || async {
        cfps.get_opt("orders").await.ok()?.is_none().then_some(())
    })
    .await;
    let after = leases(&account).await;
    let holder = lease_store(&account, "orders")
        .await
        .unwrap()
        .read_marker("claim")
        .await
        .unwrap();
    println!(
        "A deleted while its claim could not be read: {:?}; then {:?}; B's {} leases unchanged: {}",
        waiting.note,
        left.note,
        after.len(),
        after == before
    );
    assert_eq!(after, before, "A's deletion removed or changed B's leases");
    assert!(holder.is_some_and(|(body, _)| body["claimant"]["namespace"] == other.as_str()));
    terminate(&mut emulator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_of_a_resource_s_name_that_are_not_its_own_are_left_alone() {
    let Scene { plane, ns, client } = Scene::new("name-conflict").await;
    // The platform's NetworkPolicy and another team's Service, named as resources would name theirs.
    let platform = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "deny-all", "namespace": ns},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    });
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "billing-metrics", "namespace": ns},
        "spec": {"selector": {"app": "billing"}, "ports": [{"port": 80}]},
    });
    for object in [&platform, &service] {
        apply_ok(plane, &ns, &object.to_string());
    }
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let policy_before = policies.get("deny-all").await.unwrap();
    let service_before = services.get("billing-metrics").await.unwrap();
    let _operator = Operator::start(plane, &ns, "op");
    apply_ok(plane, &ns, &secret_yaml());
    apply_ok(plane, &ns, &resource("deny-all", FAKE_ENDPOINT, ""));
    apply_ok(plane, &ns, &resource("billing", FAKE_ENDPOINT, ""));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    wait("deny-all's workers", || async {
        deployments.get_opt("deny-all").await.ok().flatten()
    })
    .await;
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    let conflict = not_ready(&cfps, "billing", "NameConflict").await;
    reconciled_again(&cfps, "deny-all", 2).await;
    reconciled_again(&cfps, "billing", 2).await;
    let policy_after = policies.get_opt("deny-all").await.unwrap();
    let service_after = services.get("billing-metrics").await.unwrap();
    let billing_workers = deployments.get_opt("billing").await.unwrap();
    println!(
        "NetworkPolicy deny-all kept: {}; Service billing-metrics unchanged: {}; billing's condition: {}",
        policy_after.is_some(),
        service_after.metadata.resource_version == service_before.metadata.resource_version,
        conflict.message
    );
    let policy_after = policy_after.expect("the platform's NetworkPolicy was deleted");
    assert_eq!(
        policy_after.metadata.resource_version,
        policy_before.metadata.resource_version
    );
    assert_eq!(
        service_after.metadata.resource_version,
        service_before.metadata.resource_version
    );
    assert!(billing_workers.is_none(), "nothing is applied beside a conflict");
    assert!(
        conflict.message.contains("Service \"billing-metrics\""),
        "{}",
        conflict.message
    );
}

/// The operator's resident memory in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// The chart's memory limit of the operator.
const OPERATOR_MEMORY_LIMIT_MIB: f64 = 128.0;

/// How soon each of the others is reconciled (its status shows its generation) after it was
/// created, whatever the hostile resource does.
const RECONCILED_WITHIN: std::time::Duration = std::time::Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hostile_resource_among_fifty_neither_delays_the_others_nor_exhausts_the_operator() {
    let _heavy = common::heavy().await;
    let Scene { plane, ns, client } = Scene::new("fair-tenants").await;
    let hostile_ns = namespace(plane, "fair-hostile");
    // An https endpoint that accepts connections and never answers: every read of the hostile
    // resource's claim and every estimate of it hangs until the operator's time limits.
    let black_hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hole = format!("https://{}/", black_hole.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = black_hole.accept().await {
            open.push(stream);
        }
    });
    let watch = ["--namespace", &hostile_ns, "--leader-election-namespace", &ns];
    let operator = Operator::start_as(&ns, "op", "info,kube=warn", &[], &plane.kubeconfig, &watch);
    let pid = operator.child.id().expect("the operator runs");
    for namespace in [&ns, &hostile_ns] {
        apply_ok(plane, namespace, &secret_yaml());
    }
    // The hostile resource: estimates every 1 ms, 1 MiB of environment values (the schema's
    // limits and etcd's 1.5 MiB per object bound it).
    let env: String = (0..128)
        .map(|i| format!("    - name: V{i}\n      value: \"{}\"\n", "x".repeat(8192)))
        .collect();
    let hostile = format!("  autoscaling:\n    estimateInterval: 1ms\n  worker:\n    env:\n{env}");
    // Created, not applied: a client-side apply keeps a copy in an annotation of at most 256 KiB.
    let hostile = resource("hostile", &hole, &hostile);
    let (ok, _, err) = plane.kubectl_run(&["create", "-n", &hostile_ns, "-f", "-"], Some(&hostile));
    assert!(ok, "kubectl create of the hostile resource: {err}");
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    let created = tokio::time::Instant::now();
    let others: String = (0..50)
        .map(|i| format!("{}---\n", resource(&format!("p{i}"), FAKE_ENDPOINT, "")))
        .collect();
    apply_ok(plane, &ns, &others);
    let mut slowest = std::time::Duration::ZERO;
    for i in 0..50 {
        let name = format!("p{i}");
        wait_up_to(&format!("{name} reconciled"), RECONCILED_WITHIN, || async {
            let cfp = cfps.get(&name).await.ok()?;
            (cfp.status?.observed_generation == cfp.metadata.generation).then_some(())
        })
        .await;
        slowest = slowest.max(created.elapsed());
    }
    let rss = rss_mib(pid);
    println!(
        "50 resources beside a hostile one (estimateInterval 1ms, an endpoint that never answers, 128 env values of 8 KiB): all reconciled {slowest:.1?} after they were created (bound {RECONCILED_WITHIN:?}); operator RSS {rss:.1} MiB (limit {OPERATOR_MEMORY_LIMIT_MIB})"
    );
    assert!(slowest < RECONCILED_WITHIN);
    assert!(rss < OPERATOR_MEMORY_LIMIT_MIB, "{rss} MiB");
    held.abort();
}

/// The namespace of the resource that holds processor `orders`' claim, if any.
async fn claim_holder(account: &CosmosAccount) -> Option<String> {
    let store = lease_store(account, "orders").await?;
    let (body, _) = store.read_marker("claim").await.ok()??;
    body["claimant"]["namespace"].as_str().map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_left_by_a_deleted_resource_passes_to_another_namespace_only_when_asked() {
    let Scene { plane, ns, client } = Scene::new("left-claim-a").await;
    let other = namespace(plane, "left-claim-b");
    let (mut emulator, endpoint, account, _) = checkpointed_emulator().await;
    let before = leases(&account).await;
    let watch = ["--namespace", &other, "--leader-election-namespace", &ns];
    let _operator = Operator::start_as(&ns, "op", "info,kube=warn", &[], &plane.kubeconfig, &watch);
    for namespace in [&other, &ns] {
        apply_ok(plane, namespace, &secret_yaml());
    }
    // B holds the lease set, and is deleted without its leases: its claim stays, holder gone.
    apply_ok(plane, &other, &resource("orders", &endpoint, "  replicas: 0\n"));
    let held = eventually(TIMEOUT, || async {
        claim_holder(&account).await.as_deref() == Some(other.as_str())
    })
    .await;
    assert!(held, "B holds the lease set");
    assert!(plane.kubectl_run(&["delete", "cfp/orders", "-n", &other], None).0);
    // A names it, with a rewind asked for before it holds anything.
    let rewinding = resource("orders", &endpoint, "  replicas: 0\n").replace(
        "  name: orders\n",
        "  name: orders\n  annotations:\n    changefeed.io/rewind-to: beginning\n",
    );
    apply_ok(plane, &ns, &rewinding);
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    let refused = not_ready(&cfps, "orders", "LeaseSetClaimed").await;
    reconciled_again(&cfps, "orders", 1).await;
    assert_eq!(
        claim_holder(&account).await.as_deref(),
        Some(other.as_str()),
        "taken unasked"
    );
    // Asked for (the annotation the admission policy leaves to cluster admins): taken, and the
    // rewind of before is dropped, not run.
    let ask = format!("changefeed.io/take-over-lease-set-from={other}/orders");
    assert!(plane.kubectl_run(&["annotate", "-n", &ns, "cfp/orders", &ask], None).0);
    let taken = eventually(TIMEOUT, || async {
        claim_holder(&account).await.as_deref() == Some(ns.as_str())
    })
    .await;
    let dropped = wait_event(&client, &ns, "RequestBeforeClaimDropped").await;
    let annotations = cfps
        .get("orders")
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap_or_default();
    let after = leases(&account).await;
    let continuations = |leases: &[Lease]| leases.iter().map(|l| l.continuation.clone()).collect::<Vec<_>>();
    println!(
        "claim left by {other}/orders: refused unasked ({}); asked: taken {taken}; {:?}; rewind annotation left: {}; continuations unchanged: {}",
        refused.message,
        dropped.note,
        annotations.contains_key("changefeed.io/rewind-to"),
        continuations(&after) == continuations(&before)
    );
    assert!(
        refused.message.contains("changefeed.io/take-over-lease-set-from"),
        "{}",
        refused.message
    );
    assert!(taken, "taken once asked");
    assert!(
        !annotations.contains_key("changefeed.io/rewind-to"),
        "the earlier rewind is removed"
    );
    assert_eq!(continuations(&after), continuations(&before), "the earlier rewind ran");
    terminate(&mut emulator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_handover_no_longer_names_anyone_in_the_claim() {
    let Scene { plane, ns, client } = Scene::new("handover-cancelled").await;
    let (mut emulator, endpoint, account, _) = checkpointed_emulator().await;
    let _operator = Operator::start(plane, &ns, "op");
    apply_ok(plane, &ns, &secret_yaml());
    apply_ok(plane, &ns, &resource("orders", &endpoint, "  replicas: 0\n"));
    let handed_to = || async {
        let store = lease_store(&account, "orders").await?;
        let (body, _) = store.read_marker("claim").await.ok()??;
        Some(body["handOverTo"].as_str().map(str::to_owned))
    };
    let held = eventually(TIMEOUT, || async { handed_to().await == Some(None) }).await;
    assert!(held, "orders holds its lease set");
    let annotation = "changefeed.io/hand-over-lease-set-to";
    assert!(
        plane
            .kubectl_run(
                &[
                    "annotate",
                    "-n",
                    &ns,
                    "cfp/orders",
                    &format!("{annotation}=other/orders")
                ],
                None
            )
            .0
    );
    let armed = eventually(TIMEOUT, || async {
        handed_to().await == Some(Some("other/orders".into()))
    })
    .await;
    // Cancelled: the annotation removed. Nobody may take the lease set on the strength of it.
    assert!(
        plane
            .kubectl_run(&["annotate", "-n", &ns, "cfp/orders", &format!("{annotation}-")], None)
            .0
    );
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    let disarmed = eventually(TIMEOUT, || async { handed_to().await == Some(None) }).await;
    let ready = cfps.get("orders").await.unwrap().status.unwrap_or_default();
    println!(
        "handover to other/orders written: {armed}; annotation removed → claim names nobody: {disarmed}; conditions {:?}",
        ready
            .conditions
            .iter()
            .map(|c| (&c.type_, &c.reason))
            .collect::<Vec<_>>()
    );
    assert!(armed, "the handover was written into the claim");
    assert!(disarmed, "a cancelled handover still named other/orders in the claim");
    terminate(&mut emulator).await;
}

/// A claim document names whatever its writer likes: a tenant that forges its claim to name a
/// resource of another namespace (handing the lease set over to the tenant) learns nothing of
/// that namespace from what the operator then does — the holder a claim names is that very
/// resource (its uid), never another of its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_claim_naming_another_namespace_s_resource_tells_nothing_of_it() {
    let Scene { plane, ns, client } = Scene::new("forged-claim-a").await;
    let other = namespace(plane, "forged-claim-b");
    let (mut emulator, endpoint, account, _) = checkpointed_emulator().await;
    let watch = ["--namespace", &other, "--leader-election-namespace", &ns];
    let _operator = Operator::start_as(&ns, "op", "info,kube=warn", &[], &plane.kubeconfig, &watch);
    for namespace in [&other, &ns] {
        apply_ok(plane, namespace, &secret_yaml());
    }
    // The victim: resource `x` in the other namespace, its workers running.
    apply_ok(plane, &other, &resource("x", &endpoint, "  replicas: 1\n"));
    let victims: Api<Deployment> = Api::namespaced(client.clone(), &other);
    let deployment = wait("x's workers", || async { victims.get_opt("x").await.ok().flatten() }).await;
    create_pod(plane, &other, &deployment, "x-5d8-w1");
    // The tenant holds its own lease set, then forges its claim: held by the victim, who hands
    // it over to the tenant.
    apply_ok(plane, &ns, &resource("orders", &endpoint, "  replicas: 0\n"));
    let held = eventually(TIMEOUT, || async {
        claim_holder(&account).await.as_deref() == Some(ns.as_str())
    })
    .await;
    assert!(held, "the tenant holds its lease set");
    let store = lease_store(&account, "orders").await.expect("the lease store");
    let (mut claim, _) = store.read_marker("claim").await.unwrap().expect("the claim");
    claim["claimant"]["namespace"] = json!(other);
    claim["claimant"]["name"] = json!("x");
    claim["claimant"]["uid"] = json!("forged-uid");
    claim["handOverTo"] = json!(format!("{ns}/orders"));
    let id = format!("{}.claim", store.prefix());
    let documents = account.documents(common::DB, common::LEASES).await.unwrap();
    documents.upsert(&id, &claim).await.unwrap();
    // Whatever x is, a claim naming another uid is no claim of x's: the tenant takes it back, as
    // it would if x did not exist. The standing is read again 30 s after it was last read; the
    // resource is touched every 5 s to be reconciled.
    let mut taken = false;
    for touch in 0..20 {
        let value = format!("example.com/touched={touch}");
        let annotate = ["annotate", "--overwrite", "-n", &ns, "cfp/orders", &value];
        assert!(plane.kubectl_run(&annotate, None).0);
        taken = eventually(Duration::from_secs(5), || async {
            claim_holder(&account).await.as_deref() == Some(ns.as_str())
        })
        .await;
        if taken {
            break;
        }
    }
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    let status = cfps.get("orders").await.unwrap().status.unwrap_or_default();
    println!(
        "a claim forged to name {other}/x (another uid), handing over to {ns}/orders: taken back {taken}; conditions {:?}",
        status
            .conditions
            .iter()
            .map(|c| (&c.type_, &c.reason, &c.message))
            .collect::<Vec<_>>()
    );
    terminate(&mut emulator).await;
    assert!(taken, "the tenant's outcome depended on the other namespace's resource");
}
