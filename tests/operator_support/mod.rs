//! What the operator tests share: the control plane with the CRD installed, a namespace per test,
//! `cfp operator` processes, resource YAML, bounded waits, and a stand-in for a kubelet that runs
//! a Deployment's pod template as a local `cfp worker` process.

use std::collections::BTreeMap;
use std::future::Future;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use tokio::process::{Child, Command};

use crate::common::DiesWithTest;
use crate::common::{CFP, http_get};
use crate::control_plane::ControlPlane;

pub const TIMEOUT: Duration = Duration::from_secs(60);

/// The shared control plane with the CRD installed (from `crds/`, as a user would).
pub async fn plane() -> &'static ControlPlane {
    static CRD: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    let plane = tokio::task::spawn_blocking(ControlPlane::shared)
        .await
        .expect("control plane");
    CRD.get_or_init(|| async {
        let crd = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/crds/changefeedprocessors.changefeed.io.yaml"
        );
        let (ok, _, err) = plane.kubectl_run(&["apply", "-f", crd], None);
        assert!(ok, "kubectl apply CRD: {err}");
        // `kubectl wait` fails at once (instead of waiting) while the new CRD has no conditions yet.
        let established = wait("the CRD established", || async {
            let (ok, out, _) = plane.kubectl_run(
                &[
                    "get",
                    "crd/changefeedprocessors.changefeed.io",
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
                ],
                None,
            );
            (ok && out.trim() == "True").then_some(())
        });
        established.await;
    })
    .await;
    plane
}

/// A fresh namespace for one test.
/// A test's own scene on the shared control plane: a namespace of its name and a client.
pub struct Scene {
    /// The shared control plane.
    pub plane: &'static ControlPlane,
    /// The test's namespace.
    pub ns: String,
    /// A client of the control plane.
    pub client: kube::Client,
}

impl Scene {
    /// The control plane with a namespace `name` (created when missing) and a client.
    pub async fn new(name: &str) -> Self {
        let plane = plane().await;
        let ns = namespace(plane, name);
        let client = plane.client().await;
        Self { plane, ns, client }
    }
}

pub fn namespace(plane: &ControlPlane, name: &str) -> String {
    let (ok, _, err) = plane.kubectl_run(&["create", "namespace", name], None);
    assert!(ok || err.contains("AlreadyExists"), "create namespace {name}: {err}");
    name.to_owned()
}

pub use crate::common::free_port;

/// A `cfp operator` process watching `ns`, with leader election in `ns`.
pub struct Operator {
    pub child: Child,
    pub metrics: std::net::SocketAddr,
}

impl Operator {
    pub fn start(plane: &ControlPlane, ns: &str, identity: &str) -> Self {
        Self::start_logging(plane, ns, identity, "info,kube=warn")
    }

    /// The log file of the operator started with `identity` in `ns`.
    pub fn log_path(ns: &str, identity: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("cfp-operator-{ns}-{identity}.log"))
    }

    /// Like [`Operator::start`], logging at `rust_log`.
    pub fn start_logging(plane: &ControlPlane, ns: &str, identity: &str, rust_log: &str) -> Self {
        Self::start_with_env(plane, ns, identity, rust_log, &[])
    }

    /// Like [`Operator::start_logging`], with more environment variables (its pod's identity).
    pub fn start_with_env(
        plane: &ControlPlane,
        ns: &str,
        identity: &str,
        rust_log: &str,
        env: &[(&str, String)],
    ) -> Self {
        Self::start_as(ns, identity, rust_log, env, &plane.kubeconfig, &[])
    }

    /// Like [`Operator::start_with_env`], with the credentials of `kubeconfig` (for example
    /// [`ControlPlane::kubeconfig_as`] a ServiceAccount) and more arguments.
    pub fn start_as(
        ns: &str,
        identity: &str,
        rust_log: &str,
        env: &[(&str, String)],
        kubeconfig: &std::path::Path,
        more_args: &[&str],
    ) -> Self {
        let port = free_port();
        let log = std::fs::File::create(Self::log_path(ns, identity)).expect("log");
        // `CFP_OPERATOR_BIN` runs another build of the operator (to measure the shipped binary).
        let bin = std::env::var("CFP_OPERATOR_BIN").unwrap_or_else(|_| CFP.to_owned());
        let child = Command::new(bin)
            .args([
                "operator",
                "--namespace",
                ns,
                "--identity",
                identity,
                "--metrics-port",
                &port.to_string(),
            ])
            .args([
                "--worker-image",
                "cfp:test",
                "--leader-lease-duration",
                "3s",
                "--leader-renew-deadline",
                "2s",
                "--leader-renew-interval",
                "500ms",
            ])
            .args(more_args)
            // As a variable, which builds without it ignore (`CFP_OPERATOR_BIN`).
            .env("CFP_ALLOWED_ACCOUNTS", crate::common::allowed_accounts_file())
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", rust_log)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null())
            .stderr(log)
            .dies_with_test()
            .spawn()
            .expect("spawn cfp operator");
        Self {
            child,
            metrics: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    /// (successful reconciles, leader gauge) from /metrics.
    pub async fn scrape(&self) -> Option<(u64, u64)> {
        let body = metrics_body(self.metrics).await?;
        Some((
            metric_value(&body, "cfp_operator_reconciles_total{result=\"ok\"}")? as u64,
            metric_value(&body, "cfp_operator_leader")? as u64,
        ))
    }

    /// The value of the first series of /metrics that starts with `prefix`.
    pub async fn metric(&self, prefix: &str) -> Option<f64> {
        metric_value(&metrics_body(self.metrics).await?, prefix)
    }
}

/// The /metrics text at `address`, if it answers 200 within 2 s.
pub async fn metrics_body(address: std::net::SocketAddr) -> Option<String> {
    let (status, body) = tokio::time::timeout(Duration::from_secs(2), http_get(address, "/metrics"))
        .await
        .ok()?;
    (status == 200).then_some(body)
}

/// The value of the first series in `body` whose line starts with `prefix`.
pub fn metric_value(body: &str, prefix: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
}

pub fn resource(name: &str, endpoint: &str, extra: &str) -> String {
    format!(
        "apiVersion: changefeed.io/v1alpha1\nkind: ChangeFeedProcessor\nmetadata:\n  name: {name}\nspec:\n  connection:\n    endpoint: {endpoint}\n    keySecretRef:\n      name: cosmos\n  monitored:\n    database: db\n    container: items\n{extra}"
    )
}

pub fn secret_yaml() -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: cosmos\nstringData:\n  key: {}\n",
        changefeed_operator::cosmos::EMULATOR_KEY
    )
}

/// An account endpoint for tests where no Cosmos request has to succeed.
pub const FAKE_ENDPOINT: &str = "https://acct.documents.azure.com/";

/// `kubectl apply` of `yaml` in `ns`; fails the test with kubectl's message when it is refused.
pub fn apply_ok(plane: &ControlPlane, ns: &str, yaml: &str) {
    let (ok, _, err) = apply(plane, ns, yaml);
    assert!(ok, "kubectl apply: {err}");
}

pub fn apply(plane: &ControlPlane, ns: &str, yaml: &str) -> (bool, String, String) {
    plane.kubectl_run(&["apply", "-n", ns, "-f", "-"], Some(yaml))
}

pub async fn wait<T, F, Fut>(what: &str, get: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_up_to(what, TIMEOUT, get).await
}

/// Polls `get` every 100 ms until it returns a value; fails the test after `timeout`.
pub async fn wait_up_to<T, F, Fut>(what: &str, timeout: Duration, mut get: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = get().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A namespace with an operator, the Secret and a resource `orders` whose Deployment exists, on
/// an emulator (the operator reads the resource's lease-set claim there: workers start only
/// where it can).
pub struct Deployed {
    pub plane: &'static ControlPlane,
    pub ns: String,
    pub operator: Operator,
    pub deployments: Api<Deployment>,
    /// The account endpoint of `orders`.
    pub endpoint: String,
    /// The emulator serving it.
    pub emulator: Child,
}

pub async fn deployed(name: &str) -> Deployed {
    let plane = plane().await;
    let ns = namespace(plane, name);
    let (emulator, endpoint) = crate::common::start_emulator("db/items:/pk:2").await;
    let operator = Operator::start(plane, &ns, "op");
    assert!(apply(plane, &ns, &secret_yaml()).0);
    assert!(apply(plane, &ns, &resource("orders", &endpoint, "")).0);
    let deployments: Api<Deployment> = Api::namespaced(plane.client().await, &ns);
    wait("deployment", || async {
        deployments.get_opt("orders").await.ok().flatten()
    })
    .await;
    Deployed {
        plane,
        ns,
        operator,
        deployments,
        endpoint,
        emulator,
    }
}

pub fn replicas(deployment: &Deployment) -> Option<i32> {
    deployment.spec.as_ref().and_then(|s| s.replicas)
}

pub fn worker_env(deployment: &Deployment) -> BTreeMap<String, k8s_openapi::api::core::v1::EnvVar> {
    let pod = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    pod.containers[0]
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name.clone(), e))
        .collect()
}

/// A Deployment's pod template run as a local process, as a kubelet would run its worker
/// container: the environment resolved (Secret keys, the pod name), `CFP_METRICS_PORT` on a free
/// port, stdout (one JSON line per delivered document) collected.
pub struct LocalWorker {
    /// The pod name (and so the instance name).
    pub pod: String,
    /// The process.
    pub child: Child,
    /// Its /metrics, /healthz and /readyz.
    pub metrics: std::net::SocketAddr,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl LocalWorker {
    /// Starts the worker container of `deployment` as pod `pod`, with `overrides` of its environment.
    pub async fn start(deployment: &Deployment, secrets: &Api<Secret>, pod: &str, overrides: &[(&str, &str)]) -> Self {
        let template = deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .expect("pod spec");
        let container = &template.containers[0];
        let port = free_port();
        let mut command = Command::new(CFP);
        command
            .args(container.args.clone().unwrap_or_default())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "warn");
        for var in container.env.clone().unwrap_or_default() {
            let value = match (var.value, var.value_from) {
                (Some(value), _) => value,
                (None, Some(source)) => {
                    if let Some(key) = source.secret_key_ref {
                        let secret = secrets.get(&key.name).await.expect("secret");
                        String::from_utf8(secret.data.expect("secret data")[&key.key].0.clone()).expect("utf-8 key")
                    } else if let Some(field) = source.field_ref.map(|f| f.field_path) {
                        match field.as_str() {
                            "metadata.name" => pod.to_owned(),
                            // One per pod, as the API server gives each pod its own.
                            "metadata.uid" => format!("uid-of-{pod}"),
                            _ => panic!("unsupported field {field} for {}", var.name),
                        }
                    } else {
                        panic!("unsupported env source for {}", var.name)
                    }
                }
                _ => String::new(),
            };
            command.env(&var.name, value);
        }
        command.env("CFP_METRICS_PORT", port.to_string());
        for (name, value) in overrides {
            command.env(name, value);
        }
        let log = std::fs::File::create(Self::log_path(pod)).expect("log");
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(log)
            .dies_with_test()
            .spawn()
            .expect("spawn cfp worker");
        let stdout = child.stdout.take().expect("stdout");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncBufReadExt;
            let mut reader = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                sink.lock().expect("lines").push(line);
            }
        });
        Self {
            pod: pod.to_owned(),
            child,
            metrics: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            lines,
        }
    }

    /// The log file of the worker of pod `pod`.
    pub fn log_path(pod: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("cfp-worker-{pod}.log"))
    }

    /// The ids of the documents delivered so far.
    pub fn ids(&self) -> std::collections::HashSet<String> {
        self.lines
            .lock()
            .expect("lines")
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|d| d["id"].as_str().map(str::to_owned))
            .collect()
    }

    /// The value of the first series of its /metrics that starts with `prefix`.
    pub async fn metric(&self, prefix: &str) -> Option<f64> {
        metric_value(&metrics_body(self.metrics).await?, prefix)
    }

    /// Sends `signal` (for example `-STOP`, `-CONT`) to the process.
    pub async fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("running worker");
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .await
            .expect("kill");
        assert!(status.success(), "kill {signal} {pid}");
    }
}

/// Waits for an Event with `reason` in `namespace` and returns it.
pub async fn wait_event(client: &kube::Client, namespace: &str, reason: &str) -> k8s_openapi::api::events::v1::Event {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), namespace);
    wait(&format!("a {reason} Event"), || async {
        let list = events.list(&kube::api::ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| e.reason.as_deref() == Some(reason))
    })
    .await
}

/// The ports of each egress rule of a NetworkPolicy `spec`, as `UDP/53+TCP/53`.
pub fn egress_ports(spec: &serde_json::Value) -> Vec<String> {
    let rules = spec["egress"].as_array().cloned().unwrap_or_default();
    rules
        .iter()
        .map(|rule| {
            let ports = rule["ports"].as_array().cloned().unwrap_or_default();
            let ports: Vec<String> = ports
                .iter()
                .map(|p| format!("{}/{}", p["protocol"].as_str().unwrap_or("TCP"), p["port"]))
                .collect();
            ports.join("+")
        })
        .collect()
}
