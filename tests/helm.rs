//! The Helm chart with a real `helm` (built from a pinned Go module) against a real kube-apiserver:
//! lint and render, the CRD and the no-Helm manifests kept equal to their sources, install with
//! Pod Security admission, least-privilege RBAC checked with `kubectl auth can-i` and by running
//! the operator as the chart's ServiceAccount, upgrade and uninstall.

use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use serde_json::Value;

use crate::common::DiesWithTest;
use crate::common::{CFP, eventually, terminate};
use crate::control_plane::{self, ControlPlane};

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/changefeed-operator");

fn plane() -> &'static ControlPlane {
    ControlPlane::for_helm()
}

/// Runs helm with `args` against the control plane: (success, stdout, stderr).
fn helm(args: &[&str]) -> (bool, String, String) {
    let plane = plane();
    control_plane::helm(&plane.bin, Some(&plane.kubeconfig), args)
}

/// The YAML documents of `text` as JSON values (empty documents skipped).
fn documents(text: &str) -> Vec<Value> {
    control_plane::yaml_documents(text)
}

fn kinds(docs: &[Value]) -> Vec<String> {
    let mut kinds: Vec<String> = docs
        .iter()
        .filter_map(|d| d["kind"].as_str().map(str::to_owned))
        .collect();
    kinds.sort();
    kinds
}

/// `value` with every number as a float: Helm's toYaml writes `1` where `cfp crd` writes `1.0`.
fn numbers_as_f64(value: Value) -> Value {
    match value {
        Value::Number(n) => n.as_f64().map(Value::from).unwrap_or(Value::Number(n)),
        Value::Array(items) => Value::Array(items.into_iter().map(numbers_as_f64).collect()),
        Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, numbers_as_f64(v))).collect()),
        other => other,
    }
}

fn cfp_crd() -> Value {
    let output = Command::new(CFP).arg("crd").output().expect("cfp crd");
    documents(&String::from_utf8_lossy(&output.stdout)).remove(0)
}

#[test]
fn the_chart_lints_and_renders_with_default_and_other_values() {
    let (ok, out, err) = helm(&["lint", "--strict", CHART]);
    assert!(ok, "helm lint --strict: {out}{err}");
    let others = [
        "--set",
        "watchNamespaces={team-a,team-b}",
        "--set",
        "serviceMonitor.enabled=true,prometheusRule.enabled=true,grafanaDashboard.enabled=true",
        "--set",
        "emulator.enabled=true,leaderElection.enabled=false,replicaCount=1,logFormat=text,image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "--set",
        "workloadIdentity.clientId=0b5d6c3a-0000-4000-8000-00000000beef,podLabels.team=payments",
    ];
    let (ok, out, err) = helm(&[&["lint", "--strict", CHART][..], &others[..]].concat());
    assert!(ok, "helm lint --strict with other values: {out}{err}");

    let (ok, default, err) = helm(&["template", "cfp", CHART, "--namespace", "ops"]);
    assert!(ok, "{err}");
    let docs = documents(&default);
    assert_eq!(
        kinds(&docs),
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "CustomResourceDefinition",
            "Deployment",
            "PodDisruptionBudget",
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "Service",
            "ServiceAccount"
        ]
    );
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(deployment["spec"]["replicas"], 2);
    // Two replicas: spread over nodes, and evicted one at a time without ever blocking a drain.
    let spread = &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(
        spread["podAffinityTerm"]["topologyKey"], "kubernetes.io/hostname",
        "{pod}"
    );
    assert_eq!(
        spread["podAffinityTerm"]["labelSelector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let budget = docs.iter().find(|d| d["kind"] == "PodDisruptionBudget").unwrap();
    assert_eq!(budget["spec"]["maxUnavailable"], 1);
    assert_eq!(budget["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
    assert_eq!(
        budget["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(pod["containers"][0]["image"], "ghcr.io/changefeed-operator/cfp:0.1.0");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let args: Vec<&str> = pod["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(args.contains(&"--all-namespaces"), "{args:?}");
    assert!(
        args.contains(&"--digest-key-secret=cfp-changefeed-operator-digest-key"),
        "{args:?}"
    );

    let (ok, other, err) = helm(&[&["template", "cfp", CHART, "--namespace", "ops"][..], &others[..]].concat());
    assert!(ok, "{err}");
    let docs = documents(&other);
    let kinds = kinds(&docs);
    for kind in ["ConfigMap", "PrometheusRule", "ServiceMonitor"] {
        assert!(kinds.contains(&kind.to_owned()), "{kind} missing: {kinds:?}");
    }
    assert!(
        !kinds.contains(&"ClusterRole".to_owned()),
        "namespaced mode has no ClusterRole"
    );
    let roles: Vec<&str> = docs
        .iter()
        .filter(|d| d["kind"] == "Role")
        .filter_map(|d| d["metadata"]["namespace"].as_str())
        .collect();
    // The watched namespaces, and the release namespace for the digest key's Secret.
    assert_eq!(roles, ["team-a", "team-b", "ops"]);
    let operator = docs
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "cfp-changefeed-operator")
        .unwrap();
    let pod_labels = &operator["spec"]["template"]["metadata"]["labels"];
    assert_eq!(pod_labels["azure.workload.identity/use"], "true", "{pod_labels}");
    assert_eq!(pod_labels["team"], "payments", "{pod_labels}");
    let account = docs.iter().find(|d| d["kind"] == "ServiceAccount").unwrap();
    assert_eq!(
        account["metadata"]["annotations"]["azure.workload.identity/client-id"],
        "0b5d6c3a-0000-4000-8000-00000000beef"
    );
    let container = &operator["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        args.contains(&"--namespace=team-a,team-b") && args.contains(&"--no-leader-election"),
        "{args:?}"
    );
    assert!(container["image"].as_str().unwrap().contains("@sha256:"));
    let env: Vec<&str> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(
        env.contains(&"AZURE_COSMOS_EMULATOR_HOST"),
        "workers reach the emulator: {env:?}"
    );
    let emulator = docs
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "cfp-changefeed-operator-emulator")
        .expect("the emulator Deployment");
    let emulator_args = emulator["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(
        emulator_args.contains("--advertise-url=http://cfp-changefeed-operator-emulator.ops.svc:8081/"),
        "{emulator_args}"
    );

    // A wrong value fails with a message that names it.
    let (ok, _, err) = helm(&["template", "cfp", CHART, "--set", "logFormat=xml"]);
    assert!(
        !ok && err.contains("/logFormat") && err.contains("'text', 'json'"),
        "{err}"
    );
    // Replicas without an election would all reconcile.
    let (ok, _, err) = helm(&["template", "cfp", CHART, "--set", "leaderElection.enabled=false"]);
    assert!(!ok && err.contains("/replicaCount") && err.contains("want 1"), "{err}");
    let (ok, hard, err) = helm(&["template", "cfp", CHART, "--set", "podAntiAffinity=hard"]);
    assert!(
        ok && hard.contains("requiredDuringSchedulingIgnoredDuringExecution"),
        "{err}"
    );
    let (ok, _, err) = helm(&["template", "cfp", CHART, "--set", "replicas=3"]);
    assert!(
        !ok && err.contains("additional properties 'replicas' not allowed"),
        "{err}"
    );
    println!(
        "helm lint --strict: ok (default and other values); template: default {} objects, other values {} objects; wrong values rejected",
        documents(&default).len(),
        docs.len()
    );
}

#[test]
fn the_chart_crd_is_cfp_crd_and_the_versions_follow_the_crate() {
    let (ok, out, err) = helm(&["template", "cfp", CHART, "--show-only", "templates/crd.yaml"]);
    assert!(ok, "{err}");
    let mut chart_crd = documents(&out).remove(0);
    assert_eq!(
        chart_crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
        "the CRD survives helm uninstall"
    );
    let metadata = chart_crd["metadata"].as_object_mut().unwrap();
    metadata.remove("annotations");
    metadata.remove("labels");
    assert_eq!(
        numbers_as_f64(chart_crd),
        numbers_as_f64(cfp_crd()),
        "the chart's CRD differs from `cfp crd`"
    );
    let file = std::fs::read_to_string(format!("{CHART}/files/changefeedprocessors.changefeed.io.yaml")).unwrap();
    let crds = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crds/changefeedprocessors.changefeed.io.yaml"
    ))
    .unwrap();
    assert_eq!(
        file, crds,
        "charts/changefeed-operator/files/ must be a copy of crds/ (cfp crd)"
    );
    let chart: Value = serde_yaml::from_str(&std::fs::read_to_string(format!("{CHART}/Chart.yaml")).unwrap()).unwrap();
    assert_eq!(chart["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn the_install_manifests_are_rendered_from_the_chart() {
    let rendered = std::env::temp_dir().join(format!("cfp-manifests-{}.yaml", std::process::id()));
    let status = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tools/render-manifests.sh"))
        .arg(&rendered)
        .stderr(Stdio::null())
        .status()
        .expect("render");
    assert!(status.success());
    let want = std::fs::read_to_string(&rendered).unwrap();
    let have = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/operator.yaml")).unwrap();
    assert!(
        want == have,
        "manifests/operator.yaml differs from the chart: run tools/render-manifests.sh"
    );
}

fn kubectl(args: &[&str]) -> (bool, String, String) {
    plane().kubectl_run(args, None)
}

/// `kubectl auth can-i` as `sa`; `resource` may name a subresource (`changefeedprocessors.changefeed.io/status`).
fn can_i(sa: &str, verb: &str, resource: &str, namespace: Option<&str>) -> bool {
    let (resource, subresource) = match resource.split_once('/') {
        Some((resource, sub)) => (resource, Some(format!("--subresource={sub}"))),
        None => (resource, None),
    };
    let mut args = vec!["auth", "can-i", verb, resource, "--as", sa];
    if let Some(sub) = &subresource {
        args.push(sub);
    }
    match namespace {
        Some(ns) => args.extend(["-n", ns]),
        None => args.push("--all-namespaces"),
    }
    let (_, out, _) = kubectl(&args);
    out.trim() == "yes"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_upgrade_and_uninstall_against_the_api_server() {
    let plane = tokio::task::spawn_blocking(plane).await.unwrap();
    let ns = "cfp-system";
    assert!(kubectl(&["create", "namespace", ns]).0);
    let (ok, _, err) = kubectl(&[
        "label",
        "namespace",
        ns,
        "pod-security.kubernetes.io/enforce=restricted",
    ]);
    assert!(ok, "{err}");
    let (ok, out, err) = helm(&["install", "cfp", CHART, "--namespace", ns]);
    assert!(ok, "helm install: {out}{err}");
    // `kubectl wait` fails at once (instead of waiting) while the new CRD has no conditions yet.
    let established = eventually(Duration::from_secs(30), || async {
        let (ok, out, _) = kubectl(&[
            "get",
            "crd/changefeedprocessors.changefeed.io",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
        ]);
        ok && out.trim() == "True"
    })
    .await;
    assert!(established, "the CRD was not established within 30 s");
    for object in [
        "deployment/cfp-changefeed-operator",
        "serviceaccount/cfp-changefeed-operator",
        "service/cfp-changefeed-operator-metrics",
        "role/cfp-changefeed-operator-leader-election",
        "role/cfp-changefeed-operator-digest-key",
    ] {
        assert!(kubectl(&["get", object, "-n", ns]).0, "{object} missing");
    }
    assert!(kubectl(&["get", "clusterrole/cfp-changefeed-operator"]).0);

    // The operator's pod passes the restricted Pod Security Standard (the API server enforces it).
    let client = plane.client().await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let deployment = deployments.get("cfp-changefeed-operator").await.unwrap();
    let template = deployment.spec.unwrap().template;
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "operator-pod-check", "namespace": ns},
        "spec": template.spec,
    });
    let (ok, _, err) = plane.kubectl_run(&["create", "--dry-run=server", "-f", "-"], Some(&pod.to_string()));
    assert!(ok, "the operator pod is refused by Pod Security: {err}");
    let mut privileged = pod.clone();
    privileged["spec"]["containers"][0]["securityContext"] = serde_json::json!({"privileged": true});
    let (ok, _, err) = plane.kubectl_run(
        &["create", "--dry-run=server", "-f", "-"],
        Some(&privileged.to_string()),
    );
    assert!(!ok && err.contains("violates PodSecurity"), "enforcement is on: {err}");

    // Least privilege: what the operator needs, and a few things it must not have.
    let sa = format!("system:serviceaccount:{ns}:cfp-changefeed-operator");
    let needed = [
        ("list", "changefeedprocessors.changefeed.io"),
        ("watch", "changefeedprocessors.changefeed.io"),
        ("patch", "changefeedprocessors.changefeed.io/status"),
        ("patch", "deployments.apps"),
        ("create", "deployments.apps"),
        ("get", "secrets"),
        ("watch", "pods"),
        ("list", "horizontalpodautoscalers.autoscaling"),
        ("create", "events.events.k8s.io"),
        ("patch", "poddisruptionbudgets.policy"),
    ];
    for (verb, resource) in needed {
        assert!(
            can_i(&sa, verb, resource, None),
            "the operator cannot {verb} {resource}"
        );
    }
    // And every verb of every rule the chart grants is effective for the ServiceAccount.
    let mut granted = 0;
    for (kind, namespace) in [
        ("clusterrole/cfp-changefeed-operator", None),
        ("role/cfp-changefeed-operator-leader-election", Some(ns)),
        ("role/cfp-changefeed-operator-digest-key", Some(ns)),
    ] {
        let mut args = vec!["get", kind, "-o", "json"];
        if let Some(ns) = namespace {
            args.extend(["-n", ns]);
        }
        let (ok, json, err) = kubectl(&args);
        assert!(ok, "{err}");
        let role: Value = serde_json::from_str(&json).unwrap();
        for rule in role["rules"].as_array().unwrap() {
            let group = rule["apiGroups"][0].as_str().unwrap_or_default();
            // A rule for named objects (the kube-system namespace) is checked on those objects.
            let names: Vec<&str> = rule["resourceNames"]
                .as_array()
                .map(|names| names.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for resource in rule["resources"].as_array().unwrap().iter().filter_map(Value::as_str) {
                let qualified = match resource.split_once('/') {
                    Some((base, sub)) if !group.is_empty() => format!("{base}.{group}/{sub}"),
                    _ if !group.is_empty() => format!("{resource}.{group}"),
                    _ => resource.to_owned(),
                };
                for verb in rule["verbs"].as_array().unwrap().iter().filter_map(Value::as_str) {
                    let allowed = if names.is_empty() {
                        can_i(&sa, verb, &qualified, namespace)
                    } else {
                        names.iter().all(|name| {
                            let object = format!("{qualified}/{name}");
                            let mut args = vec!["auth", "can-i", verb, &object, "--as", &sa];
                            // A Role's named objects (the digest key's Secret) are in its namespace.
                            args.extend(namespace.iter().flat_map(|ns| ["-n", ns]));
                            let (_, out, _) = kubectl(&args);
                            out.trim() == "yes"
                        })
                    };
                    assert!(allowed, "the operator cannot {verb} {qualified} {names:?}");
                    granted += 1;
                }
            }
        }
    }
    assert!(can_i(&sa, "update", "leases.coordination.k8s.io", Some(ns)));
    let forbidden = [
        ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
        ("create", "pods/exec"),
        ("update", "secrets"),
        ("delete", "deployments.apps"),
        ("update", "changefeedprocessors.changefeed.io"),
        ("create", "pods"),
    ];
    for (verb, resource) in forbidden {
        assert!(!can_i(&sa, verb, resource, None), "the operator may {verb} {resource}");
    }
    assert!(!can_i(&sa, "update", "leases.coordination.k8s.io", Some("default")));

    // Those permissions suffice: the operator, acting as the chart's ServiceAccount, reconciles.
    let team = "team-a";
    assert!(kubectl(&["create", "namespace", team]).0);
    let kubeconfig = plane.kubeconfig_as(&sa);
    let log = std::fs::File::create(std::env::temp_dir().join("cfp-operator-as-sa.log")).unwrap();
    let mut operator = tokio::process::Command::new(CFP)
        .args(["operator", "--all-namespaces", "--leader-election-namespace", ns])
        .args(["--digest-key-secret", "cfp-changefeed-operator-digest-key"])
        .args(["--identity", "as-sa", "--worker-image", "cfp:test"])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "info,kube=warn")
        .stderr(log)
        .dies_with_test()
        .spawn()
        .unwrap();
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: cosmos\n  namespace: {team}\nstringData:\n  key: {}\n",
        changefeed_operator::cosmos::EMULATOR_KEY
    );
    assert!(plane.kubectl_run(&["apply", "-f", "-"], Some(&secret)).0);
    let resource = format!(
        "apiVersion: changefeed.io/v1alpha1\nkind: ChangeFeedProcessor\nmetadata:\n  name: orders\n  namespace: {team}\nspec:\n  connection:\n    endpoint: https://acct.documents.azure.com/\n    keySecretRef: {{name: cosmos}}\n  monitored: {{database: db, container: items}}\n  leases: {{deleteOnResourceDeletion: true}}\n"
    );
    assert!(plane.kubectl_run(&["apply", "-f", "-"], Some(&resource)).0);
    let team_deployments: Api<Deployment> = Api::namespaced(client.clone(), team);
    let reconciled = eventually(Duration::from_secs(30), || async {
        team_deployments.get_opt("orders").await.ok().flatten().is_some()
    })
    .await;
    let (_, status, _) = kubectl(&[
        "get",
        "cfp",
        "orders",
        "-n",
        team,
        "-o",
        "jsonpath={.status.conditions[*].type}",
    ]);
    let (_, finalizers, _) = kubectl(&[
        "get",
        "cfp",
        "orders",
        "-n",
        team,
        "-o",
        "jsonpath={.metadata.finalizers}",
    ]);
    terminate(&mut operator).await;
    assert!(
        reconciled,
        "the operator as the chart's ServiceAccount created no Deployment"
    );
    assert!(
        status.contains("Ready") && status.contains("ConfigValid"),
        "status written: {status}"
    );
    assert!(
        finalizers.contains("changefeed.io/lease-cleanup"),
        "finalizer set: {finalizers}"
    );

    // helm upgrade with other values changes the objects.
    let (ok, out, err) = helm(&[
        "upgrade",
        "cfp",
        CHART,
        "--namespace",
        ns,
        "--set",
        "replicaCount=3,logLevel=debug",
    ]);
    assert!(ok, "helm upgrade: {out}{err}");
    let upgraded = deployments.get("cfp-changefeed-operator").await.unwrap();
    let spec = upgraded.spec.unwrap();
    let env = spec.template.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap_or_default();
    let rust_log = env
        .iter()
        .find(|e| e.name == "RUST_LOG")
        .and_then(|e| e.value.clone())
        .unwrap_or_default();
    assert_eq!(spec.replicas, Some(3));
    assert!(rust_log.starts_with("debug,"), "{rust_log}");

    // helm uninstall leaves the CRD and the user's resources.
    let (ok, out, err) = helm(&["uninstall", "cfp", "--namespace", ns]);
    assert!(ok, "helm uninstall: {out}{err}");
    assert!(
        !kubectl(&["get", "deployment/cfp-changefeed-operator", "-n", ns]).0,
        "the operator is gone"
    );
    assert!(
        kubectl(&["get", "crd/changefeedprocessors.changefeed.io"]).0,
        "the CRD stays"
    );
    assert!(
        kubectl(&["get", "cfp", "orders", "-n", team]).0,
        "the user's resource stays"
    );
    println!(
        "helm install: CRD established, operator Deployment/ServiceAccount/RBAC/Service present, operator pod admitted under PSS restricted (a privileged one refused); can-i: {} needed verbs yes, all {granted} granted (resource, verb) pairs effective, {} forbidden no; the operator as {sa} reconciled orders (conditions {status}); helm upgrade → replicas 3, RUST_LOG {rust_log}; helm uninstall kept the CRD and cfp/orders",
        needed.len(),
        forbidden.len()
    );
}

#[test]
fn namespaced_mode_grants_nothing_outside_the_watched_namespaces() {
    let ns = "cfp-scoped";
    for namespace in [ns, "team-b", "team-c"] {
        assert!(kubectl(&["create", "namespace", namespace]).0);
    }
    // The CRD belongs to the cluster-wide release of the other test.
    let (ok, out, err) = helm(&[
        "install",
        "scoped",
        CHART,
        "--namespace",
        ns,
        "--set",
        "watchNamespaces={team-b},crds.install=false",
    ]);
    assert!(ok, "helm install: {out}{err}");
    let sa = format!("system:serviceaccount:{ns}:scoped-changefeed-operator");
    assert!(can_i(&sa, "get", "secrets", Some("team-b")));
    assert!(can_i(&sa, "patch", "deployments.apps", Some("team-b")));
    assert!(
        !can_i(&sa, "get", "secrets", Some("team-c")),
        "no Secrets outside the watched namespaces"
    );
    assert!(!can_i(&sa, "get", "secrets", Some(ns)));
    assert!(
        !can_i(&sa, "list", "changefeedprocessors.changefeed.io", None),
        "nothing cluster-wide"
    );
    let (ok, _, _) = kubectl(&["get", "clusterrole", "scoped-changefeed-operator"]);
    assert!(!ok, "no ClusterRole in namespaced mode");
    println!(
        "namespaced mode (watchNamespaces team-b): secrets in team-b yes, in team-c and {ns} no, nothing cluster-wide, no ClusterRole"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_metadata_is_what_artifact_hub_and_helm_read() {
    let chart: Value = serde_yaml::from_str(&std::fs::read_to_string(format!("{CHART}/Chart.yaml")).unwrap()).unwrap();
    // kubeVersion: Helm refuses older clusters (native sidecars need 1.29) and takes providers'
    // version strings; the API server of these tests is 1.35.
    assert_eq!(chart["kubeVersion"], ">=1.29.0-0");
    for (version, accepted) in [
        ("1.28.9", false),
        ("1.29.0", true),
        ("1.30.4-eks-a737599", true),
        ("1.35.4", true),
    ] {
        let (ok, _, err) = helm(&["template", "cfp", CHART, "--kube-version", version]);
        assert_eq!(ok, accepted, "kube {version}: {err}");
    }
    let annotations = &chart["annotations"];
    let yaml = |key: &str| -> Value {
        serde_yaml::from_str(annotations[key].as_str().unwrap_or_else(|| panic!("{key} missing"))).unwrap()
    };
    assert_eq!(annotations["artifacthub.io/license"], env!("CARGO_PKG_LICENSE"));
    assert_eq!(annotations["artifacthub.io/operator"], "true");
    let levels = [
        "Basic Install",
        "Seamless Upgrades",
        "Full Lifecycle",
        "Deep Insights",
        "Auto Pilot",
    ];
    assert!(levels.contains(&annotations["artifacthub.io/operatorCapabilities"].as_str().unwrap()));
    // The CRD entry names the CRD `cfp crd` prints.
    let crd = cfp_crd();
    let entry = &yaml("artifacthub.io/crds")[0];
    assert_eq!(entry["name"], crd["metadata"]["name"]);
    assert_eq!(entry["kind"], crd["spec"]["names"]["kind"]);
    assert_eq!(entry["version"], crd["spec"]["versions"][0]["name"]);
    // The image is the one the chart deploys by default.
    let (ok, rendered, err) = helm(&["template", "cfp", CHART, "--show-only", "templates/deployment.yaml"]);
    assert!(ok, "{err}");
    let deployment = documents(&rendered).remove(0);
    let images = yaml("artifacthub.io/images");
    assert_eq!(
        images[0]["image"],
        deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    );
    for link in yaml("artifacthub.io/links").as_array().unwrap() {
        assert!(link["url"].as_str().unwrap().starts_with("https://"), "{link}");
    }
    // The example resource is one the API server accepts.
    let shared = crate::operator_support::plane().await;
    let ns = crate::operator_support::namespace(shared, "artifacthub-example");
    let examples = yaml("artifacthub.io/crdsExamples");
    for example in examples.as_array().unwrap() {
        let (ok, out, err) = shared.kubectl_run(
            &["apply", "--dry-run=server", "-n", &ns, "-f", "-"],
            Some(&example.to_string()),
        );
        assert!(ok && out.contains("created (server dry run)"), "{out}{err}");
    }
    println!(
        "Chart.yaml: kubeVersion >=1.29.0-0 (helm template refuses 1.28.9, takes 1.29.0, 1.30.4-eks-…, 1.35.4); Artifact Hub: license {}, operator, capabilities {}, CRD {} = cfp crd, image {} = the deployed default, {} example(s) accepted by the API server (server dry run)",
        env!("CARGO_PKG_LICENSE"),
        annotations["artifacthub.io/operatorCapabilities"],
        entry["name"],
        images[0]["image"],
        examples.as_array().unwrap().len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_network_policy_is_accepted_by_the_api_server() {
    let shared = crate::operator_support::plane().await;
    let ns = crate::operator_support::namespace(shared, "chart-netpol");
    let sets = "networkPolicy.enabled=true,emulator.enabled=true,networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring";
    let (ok, out, err) = helm(&[
        "template",
        "cfp",
        CHART,
        "--namespace",
        &ns,
        "--set",
        sets,
        "--show-only",
        "templates/networkpolicy.yaml",
    ]);
    assert!(ok, "{err}");
    let policy = documents(&out).remove(0);
    let (ok, applied, err) = shared.kubectl_run(
        &["apply", "--dry-run=server", "-o", "json", "-f", "-"],
        Some(&policy.to_string()),
    );
    assert!(ok, "the API server refused the chart's NetworkPolicy: {err}");
    let applied: Value = serde_json::from_str(&applied).unwrap();
    let spec = &applied["spec"];
    assert_eq!(spec["policyTypes"], serde_json::json!(["Ingress", "Egress"]));
    assert_eq!(spec["ingress"][0]["ports"][0]["port"], 8080);
    assert_eq!(
        spec["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]["team"],
        "monitoring"
    );
    let egress_ports = crate::operator_support::egress_ports(spec);
    assert_eq!(
        egress_ports,
        ["UDP/53+TCP/53", "TCP/443+TCP/6443", "TCP/443", "TCP/8081"],
        "DNS, API server, Cosmos, emulator"
    );
    // Off by default.
    let (ok, default, _) = helm(&["template", "cfp", CHART]);
    assert!(ok && !default.contains("kind: NetworkPolicy"));
    let (ok, _, err) = helm(&[
        "template",
        "cfp",
        CHART,
        "--set",
        "networkPolicy.cosmos.cidrs={10.0.0.300}",
    ]);
    assert!(!ok && err.contains("/networkPolicy/cosmos/cidrs/0"), "{err}");
    println!(
        "networkPolicy.enabled: the chart's NetworkPolicy accepted by the API server (server dry run): ingress 8080 from the monitoring peers, egress ports {egress_ports:?} (DNS, API server, Cosmos, emulator); off by default; a CIDR without a prefix refused by the values schema"
    );
}

/// One row of the values table: (key, default as JSON, description).
type ValueRow = (String, String, String);

/// The rows of the chart README's values table, from values.yaml: each value (a leaf, or a map or
/// list none of whose entries is commented) with the comment block right above its key; a map
/// with commented entries gives a row per entry. Pure.
fn values_rows(text: &str) -> Vec<ValueRow> {
    let values: Value = serde_yaml::from_str(text).expect("values.yaml");
    // The comment block above each key, by dotted path.
    let mut comments = std::collections::BTreeMap::new();
    let (mut block, mut path): (Vec<String>, Vec<(usize, String)>) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some(comment) = trimmed.strip_prefix('#') {
            block.push(comment.trim().to_owned());
            continue;
        }
        let key = trimmed.split_once(':').map(|(k, _)| k).filter(|k| {
            !trimmed.starts_with('-') && !k.is_empty() && k.chars().all(|c| c.is_alphanumeric() || c == '_')
        });
        if let Some(key) = key {
            path.retain(|(i, _)| *i < indent);
            path.push((indent, key.to_owned()));
            let dotted: Vec<&str> = path.iter().map(|(_, k)| k.as_str()).collect();
            comments.insert(dotted.join("."), block.join(" "));
        }
        block.clear();
    }
    let mut rows = Vec::new();
    collect_rows(&values, "", &comments, &mut rows);
    rows
}

fn collect_rows(
    value: &Value,
    prefix: &str,
    comments: &std::collections::BTreeMap<String, String>,
    rows: &mut Vec<ValueRow>,
) {
    let Some(map) = value.as_object() else { return };
    for (key, child) in map {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let documented_entries = child.as_object().is_some_and(|m| {
            m.keys()
                .any(|k| comments.get(&format!("{path}.{k}")).is_some_and(|c| !c.is_empty()))
        });
        if documented_entries {
            collect_rows(child, &path, comments, rows);
        } else {
            let comment = comments.get(&path).cloned().unwrap_or_default();
            rows.push((path, child.to_string(), comment));
        }
    }
}

/// The values table as the chart README holds it.
fn values_table(rows: &[ValueRow]) -> String {
    let mut table = String::from("| value | default | description |\n|---|---|---|\n");
    for (key, default, description) in rows {
        let cell = |text: &str| text.replace('|', "\\|");
        table.push_str(&format!("| `{key}` | `{}` | {} |\n", cell(default), cell(description)));
    }
    table
}

const TABLE_START: &str =
    "<!-- values: generated from values.yaml by tests/helm.rs; CFP_WRITE_CHART_README=1 rewrites it -->\n";
const TABLE_END: &str = "<!-- values end -->";

#[test]
fn the_chart_readme_documents_every_value_with_its_default() {
    let values = std::fs::read_to_string(format!("{CHART}/values.yaml")).unwrap();
    let rows = values_rows(&values);
    let undocumented: Vec<&str> = rows.iter().filter(|r| r.2.is_empty()).map(|r| r.0.as_str()).collect();
    assert!(
        undocumented.is_empty(),
        "values.yaml: no comment above {undocumented:?}"
    );
    let path = format!("{CHART}/README.md");
    let readme = std::fs::read_to_string(&path).unwrap_or_default();
    let table = values_table(&rows);
    let (before, rest) = readme.split_once(TABLE_START).unwrap_or((&readme, ""));
    let after = rest.split_once(TABLE_END).map_or("", |(_, after)| after);
    let want = format!("{before}{TABLE_START}{table}{TABLE_END}{after}");
    if std::env::var_os("CFP_WRITE_CHART_README").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    assert!(
        readme == want,
        "charts/changefeed-operator/README.md: its values table differs from values.yaml (a value missing, or another default or comment): run `CFP_WRITE_CHART_README=1 cargo test --test integration helm::the_chart_readme`"
    );
    println!(
        "chart README: {} values documented, each with its default and the comment above it in values.yaml",
        rows.len()
    );
}
