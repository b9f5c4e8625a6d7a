//! Secrets and identities: keys appear nowhere they should not, workload identity, and the
//! operator without a Secret watch.

use std::time::Duration;

use changefeed_operator::operator::ChangeFeedProcessor;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use crate::common::{self, cfp_write, start_emulator, terminate};
use crate::operator_support::{
    self, FAKE_ENDPOINT, LocalWorker, Operator, Scene, apply, apply_ok, namespace, plane, replicas, resource,
    secret_yaml, wait, wait_event, worker_env,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_account_key_appears_nowhere_it_should_not() {
    use base64::Engine;
    let Scene { plane, ns, client } = Scene::new("canary").await;
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:2").await;
    // A recognisable key (the in-memory emulator accepts any well-formed key) and handler token.
    let nonce = std::process::id();
    let key = base64::engine::general_purpose::STANDARD.encode(format!("cfp-leak-canary-key-{nonce}-0123456789abcdef"));
    let token = format!("Bearer cfp-leak-canary-token-{nonce}");
    let secrets = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: cosmos\nstringData:\n  key: {key}\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: handler\nstringData:\n  token: {token}\n"
    );
    apply_ok(plane, &ns, &secrets);
    let mut operator = Operator::start_logging(plane, &ns, "op", "debug,kube=debug");
    let extra = "  autoscaling:\n    estimateInterval: 1s\n  handler:\n    type: Http\n    http:\n      url: http://127.0.0.1:9/changes\n      headers:\n      - name: Authorization\n        valueFrom: {secretKeyRef: {name: handler, key: token}}\n";
    apply_ok(plane, &ns, &resource("orders", &endpoint, extra));
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    wait("an estimate in the status", || async {
        cfps.get("orders").await.ok()?.status?.last_estimate_time
    })
    .await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment = deployments.get("orders").await.unwrap();
    let secret_api: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let mut worker = LocalWorker::start(&deployment, &secret_api, "orders-6f5d-canary", &[("RUST_LOG", "debug")]).await;
    cfp_write(&endpoint, 0, 20).await;
    // Let the worker read, fail the (unreachable) handler with its header, and retry a few times.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let worker_metrics = operator_support::metrics_body(worker.metrics).await.unwrap_or_default();
    let operator_metrics = operator_support::metrics_body(operator.metrics)
        .await
        .unwrap_or_default();
    terminate(&mut worker.child).await;
    terminate(&mut operator.child).await;
    terminate(&mut emulator).await;
    let (_, status, _) = plane.kubectl_run(&["get", "cfp", "orders", "-n", &ns, "-o", "yaml"], None);
    let (_, events, _) = plane.kubectl_run(&["get", "events", "-n", &ns, "-o", "yaml"], None);
    let (_, rendered, _) = plane.kubectl_run(&["get", "deployment,service,pdb", "-n", &ns, "-o", "yaml"], None);
    let places = [
        (
            "operator log (debug)",
            std::fs::read_to_string(Operator::log_path(&ns, "op")).unwrap_or_default(),
        ),
        (
            "worker log (debug)",
            std::fs::read_to_string(LocalWorker::log_path("orders-6f5d-canary")).unwrap_or_default(),
        ),
        ("worker /metrics", worker_metrics),
        ("operator /metrics", operator_metrics),
        ("resource and status", status),
        ("Events", events),
        ("rendered objects", rendered),
    ];
    let mut scanned = Vec::new();
    for (place, text) in &places {
        assert!(!text.is_empty(), "{place} is empty: nothing was scanned");
        assert!(!text.contains(&key), "the account key leaked into the {place}");
        assert!(!text.contains(&token), "the handler token leaked into the {place}");
        assert!(!text.contains("cfp-leak-canary"), "a canary leaked into the {place}");
        scanned.push(format!("{place} ({} KiB)", text.len() / 1024));
    }
    println!("no key or token in: {}", scanned.join(", "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_identity_resources_run_without_keys_and_the_operator_estimates_with_its_own_identity() {
    use crate::entra_support::TokenEndpoint;
    let Scene { plane, ns, client } = Scene::new("entra").await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = TokenEndpoint::start(dir.path()).await;
    let (mut emulator, endpoint) = TokenEndpoint::start_emulator(dir.path(), "db/items:/pk:4").await;
    let identity = tokens.pod_env_in(dir.path());
    common::cfp_write_with(&endpoint, 0, 40, &["--auth", "workload-identity"], &identity).await;

    // The API server refuses what cannot work, with messages that say what to do.
    let entra = |extra: &str| {
        format!(
            "apiVersion: changefeed.io/v1alpha1\nkind: ChangeFeedProcessor\nmetadata:\n  name: orders\nspec:\n  connection:\n    endpoint: {endpoint}\n    auth: WorkloadIdentity\n{extra}  monitored:\n    database: db\n    container: items\n  pollInterval: 100ms\n  autoscaling:\n    enabled: true\n    maxReplicas: 4\n    targetLagPerReplica: 10\n    estimateInterval: 1s\n"
        )
    };
    let refusals = [
        (entra(""), "auth WorkloadIdentity needs worker.serviceAccountName"),
        (
            entra("    keySecretRef:\n      name: cosmos\n"),
            "leave it out with auth WorkloadIdentity",
        ),
        (
            resource("keyless", &endpoint, "").replace("    keySecretRef:\n      name: cosmos\n", ""),
            "set keySecretRef with auth Key",
        ),
    ];
    for (yaml, message) in &refusals {
        let (ok, _, err) = apply(plane, &ns, yaml);
        assert!(!ok && err.contains(message), "expected {message:?}: {err}");
    }

    // The operator runs with its own workload identity; there is no Secret in the namespace.
    let mut operator = Operator::start_with_env(plane, &ns, "op", "info,kube=warn", &identity);
    let keyless = entra("").replace(
        "  pollInterval:",
        "  worker:\n    serviceAccountName: orders-identity\n  pollInterval:",
    );
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    let ready_reason = |reason: &'static str| {
        let cfps = cfps.clone();
        async move {
            let status = cfps.get("orders").await.ok()?.status?;
            status
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Ready" && c.reason == reason)
        }
    };
    // No lease container, and Entra ID identities may not create one (403/5301): the status and
    // an Event say so, with the command that creates it — asked to create it, and by default.
    apply_ok(
        plane,
        &ns,
        &keyless.replacen(
            "  monitored:",
            "  leases:\n    createIfNotExists: true\n  monitored:",
            1,
        ),
    );
    let refused = wait("Ready=False/ContainerCreationRefused", || {
        ready_reason("ContainerCreationRefused")
    })
    .await;
    let refused_event = wait_event(&client, &ns, "ContainerCreationRefused").await;
    apply_ok(plane, &ns, &keyless);
    let missing = wait("Ready=False/LeaseContainerMissing", || {
        ready_reason("LeaseContainerMissing")
    })
    .await;
    let missing_event = wait_event(&client, &ns, "LeaseContainerMissing").await;
    println!(
        "no lease container: {}; Event {:?}\nnot to be created: {}; Event {:?}",
        refused.message, refused_event.note, missing.message, missing_event.note
    );
    assert!(refused.message.contains("403/5301"), "{}", refused.message);
    for message in [&refused.message, &missing.message] {
        assert!(message.contains("az cosmosdb sql container create"), "{message}");
        assert!(!message.contains("refused the key"), "{message}");
    }
    assert!(
        missing_event
            .note
            .unwrap_or_default()
            .contains("db/leases does not exist")
    );
    // Created by an administrator, the container is used as it is.
    common::create_container_as_admin(&endpoint, "db", "leases").await;
    let lag = wait("the operator's estimate with its token", || async {
        let status = cfps.get("orders").await.ok()?.status?;
        status.estimated_lag.filter(|lag| *lag == 40)
    })
    .await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment = wait("4 replicas for lag 40", || async {
        let deployment = deployments.get_opt("orders").await.ok()??;
        (replicas(&deployment) == Some(4)).then_some(deployment)
    })
    .await;
    let template = deployment.spec.clone().unwrap().template;
    let labels = template.metadata.clone().unwrap().labels.unwrap();
    let pod = template.spec.clone().unwrap();
    let env = worker_env(&deployment);
    assert_eq!(
        labels.get("azure.workload.identity/use").map(String::as_str),
        Some("true")
    );
    assert_eq!(pod.service_account_name.as_deref(), Some("orders-identity"));
    assert_eq!(env["CFP_AUTH"].value.as_deref(), Some("workload-identity"));
    assert!(!env.contains_key("CFP_KEY"), "no key in a keyless pod");

    // The pod template, with what the workload identity webhook injects, processes everything.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let injected: Vec<(&str, &str)> = identity.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut worker = LocalWorker::start(&deployment, &secrets, "orders-5c7d9-entra", &injected).await;
    wait("lag 0 after the keyless worker ran", || async {
        let status = cfps.get("orders").await.ok()?.status?;
        (status.estimated_lag == Some(0)).then_some(())
    })
    .await;
    let seen = tokens.seen();
    println!(
        "workload identity: {} refusals ({}); operator estimated lag {lag} with its token → 4 replicas; pod label + service account + CFP_AUTH, no CFP_KEY; keyless worker drained lag to 0; token endpoint issued {} tokens, refused {}",
        refusals.len(),
        refusals.iter().map(|(_, m)| *m).collect::<Vec<_>>().join("; "),
        seen.issued,
        seen.refused.len()
    );
    assert!(seen.issued >= 3 && seen.refused.is_empty(), "{seen:?}");
    terminate(&mut worker.child).await;
    terminate(&mut operator.child).await;
    terminate(&mut emulator).await;
}

/// The objects of `helm template` of the chart with `sets`, of the given kinds, as one JSON `List`.
fn chart_objects(plane: &crate::control_plane::ControlPlane, ns: &str, sets: &str, kinds: &[&str]) -> String {
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/changefeed-operator");
    let (ok, out, err) = crate::control_plane::helm(
        &plane.bin,
        None,
        &["template", "least", chart, "--namespace", ns, "--set", sets],
    );
    assert!(ok, "helm template --set {sets}: {err}");
    let items: Vec<serde_json::Value> = crate::control_plane::yaml_documents(&out)
        .into_iter()
        .filter(|d| d["kind"].as_str().is_some_and(|k| kinds.contains(&k)))
        .collect();
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

/// `apiserver_request_total` of refused (403) LIST and WATCH requests of Secrets.
fn refused_secret_reads(plane: &crate::control_plane::ControlPlane) -> f64 {
    let (ok, metrics, err) = plane.kubectl_run(&["get", "--raw", "/metrics"], None);
    assert!(ok, "{err}");
    metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains("resource=\"secrets\""))
        .filter(|l| l.contains("code=\"403\"") && (l.contains("verb=\"LIST\"") || l.contains("verb=\"WATCH\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_secrets_watch_false_the_operator_only_gets_named_secrets_and_a_rotated_key_reaches_the_workers() {
    let plane = plane().await;
    let ns = namespace(plane, "secrets-get-only");
    // The chart's own RBAC for one watched namespace with secrets.watch=false.
    let sets = format!("secrets.watch=false,watchNamespaces={{{ns}}},crds.install=false,replicaCount=1");
    let rbac = chart_objects(plane, &ns, &sets, &["ServiceAccount", "Role", "RoleBinding"]);
    let (ok, _, err) = plane.kubectl_run(&["apply", "-f", "-"], Some(&rbac));
    assert!(ok, "{err}");
    let sa = format!("system:serviceaccount:{ns}:least-changefeed-operator");
    let can = |verb: &str| {
        let (_, out, _) = plane.kubectl_run(&["auth", "can-i", verb, "secrets", "--as", &sa, "-n", &ns], None);
        out.trim() == "yes"
    };
    assert!(
        can("get") && !can("list") && !can("watch"),
        "the chart grants get alone on Secrets"
    );

    // The operator as that ServiceAccount, rechecking Secrets every 2 s.
    let refused_before = refused_secret_reads(plane);
    let kubeconfig = plane.kubeconfig_as(&sa);
    let recheck = Duration::from_secs(2);
    // No --cluster-identity (as `helm template` or Argo CD render it, without Helm's lookup) and
    // no read of the kube-system namespace: the operator names the cluster by its digest-key
    // Secret's UID instead of a name other clusters share.
    let args = ["--watch-secrets=false", "--secrets-recheck-interval=2s"];
    let mut operator = Operator::start_as(&ns, "least", "info,kube=warn", &[], &kubeconfig, &args);
    apply_ok(plane, &ns, &secret_yaml());
    apply_ok(plane, &ns, &resource("orders", FAKE_ENDPOINT, ""));
    let deployments: Api<Deployment> = Api::namespaced(plane.client().await, &ns);
    let digest_of = |deployment: &Deployment| {
        deployment
            .spec
            .as_ref()?
            .template
            .metadata
            .as_ref()?
            .annotations
            .as_ref()?
            .get("changefeed.io/secrets-digest")
            .cloned()
    };
    let before = wait("the worker Deployment, applied as the ServiceAccount", || async {
        digest_of(&deployments.get_opt("orders").await.ok()??)
    })
    .await;
    let log = std::fs::read_to_string(Operator::log_path(&ns, "least")).unwrap_or_default();
    assert!(
        log.contains("this installation's digest-key Secret names the cluster"),
        "the cluster identity without kube-system: {log}"
    );
    // A rotated key is read at the next reconciliation: nothing watches the Secret.
    let rotated = std::time::Instant::now();
    apply_ok(
        plane,
        &ns,
        &secret_yaml().replace(changefeed_operator::cosmos::EMULATOR_KEY, "cm90YXRlZC1rZXk="),
    );
    let after = wait("the rotated key's digest on the pod template", || async {
        digest_of(&deployments.get_opt("orders").await.ok()??).filter(|d| *d != before)
    })
    .await;
    let took = rotated.elapsed();
    assert!(took < recheck + Duration::from_secs(10), "{took:?}");
    terminate(&mut operator.child).await;
    let refused = refused_secret_reads(plane) - refused_before;
    let log = std::fs::read_to_string(Operator::log_path(&ns, "least")).unwrap_or_default();
    // The one refusal expected: the kube-system namespace, read once at start for the cluster's
    // identity (the digest-key Secret names it instead).
    let forbidden: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("forbidden") || l.contains("Forbidden"))
        .filter(|l| !l.contains("digest-key Secret names the cluster"))
        .collect();
    assert!(
        forbidden.is_empty(),
        "the operator was refused something: {forbidden:?}"
    );
    assert_eq!(
        refused, 0.0,
        "the API server refused LIST/WATCH of Secrets {refused} times"
    );
    println!(
        "secrets.watch=false: the chart's Role grants get alone (can-i get yes, list no, watch no); the operator as {sa} applied the workers and, {:.1} s after the key was rotated (recheck 2 s), the pod template's digest {before} -> {after}; refused LIST/WATCH of Secrets on the API server: {refused}; no 'forbidden' in the operator log",
        took.as_secs_f64()
    );
}
