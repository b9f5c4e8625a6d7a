//! Monitoring with the Prometheus Operator, checked with Prometheus' own tools (Debian's
//! `prometheus` package: `promtool` and the `prometheus` server) and a real `helm template`:
//! - a real Prometheus scrapes the operator's /metrics as the chart's ServiceMonitor says and
//!   answers the KEDA example's query, the dashboard's variables and panels and every alert with
//!   the processors' own `namespace` label (not `exported_namespace`);
//! - the worker PodMonitor selects the pods and port the operator renders;
//! - the PrometheusRule, taken from the rendered chart, passes `promtool check rules` and the unit
//!   tests of `tests/prometheus/` (every alert firing and staying quiet), and every alert links
//!   its runbook in `docs/runbooks/`;
//! - a deleted resource's series leave the operator's /metrics (a real kube-apiserver).
//!
//! The Prometheus tools come from PATH; a missing one fails the test with how to install it.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use changefeed_operator::operator::ChangeFeedProcessor;
use changefeed_operator::operator::metrics::{EstimateFigures, OperatorMetrics};
use changefeed_operator::operator::workload::worker_deployment;
use serde_json::Value;

use crate::common::{free_port, terminate};
use crate::control_plane;
use crate::operator_support::{
    FAKE_ENDPOINT, Operator, apply_ok, metrics_body, namespace, plane, resource, wait, wait_up_to,
};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/changefeed-operator");
/// The release namespace of every rendering here (the operator's own namespace).
const RELEASE_NAMESPACE: &str = "ops";

/// The directory of helm and the control-plane binaries (`tools/k8s/build.sh`, cached).
fn k8s_bin() -> &'static Path {
    control_plane::binaries().expect("tools/k8s/build.sh")
}

/// `helm args...`: (success, stdout, stderr).
fn helm(args: &[&str]) -> (bool, String, String) {
    control_plane::helm(k8s_bin(), None, args)
}

/// The YAML documents of `text` as JSON values (empty documents skipped).
fn documents(text: &str) -> Vec<Value> {
    control_plane::yaml_documents(text)
}

/// `helm template` of the chart in [`RELEASE_NAMESPACE`] with `--set` of each of `sets`.
fn render(sets: &[&str]) -> Vec<Value> {
    let mut args = vec!["template", "cfp", CHART, "--namespace", RELEASE_NAMESPACE];
    for set in sets {
        args.extend(["--set", set]);
    }
    let (ok, out, err) = helm(&args);
    assert!(ok, "helm template --set {sets:?}: {err}");
    documents(&out)
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// A program of Debian's `prometheus` package from PATH. Missing, the test fails saying how to
/// install it: these tests must not pass without running the real tools.
fn prometheus_tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|path| path.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not on PATH: the monitoring tests run Prometheus' own tools. Install Debian's \
                 `prometheus` package (`apt-get install prometheus`, as root; .ci/run does it) or put \
                 `{name}` on PATH"
            )
        })
}

/// The rendered PrometheusRule (with the ServiceMonitor, as users enable them together).
fn rendered_rule(extra: &[&str]) -> Value {
    let sets = [
        &["serviceMonitor.enabled=true", "prometheusRule.enabled=true"][..],
        extra,
    ]
    .concat();
    let docs = render(&sets);
    let rules = of_kind(&docs, "PrometheusRule");
    assert_eq!(rules.len(), 1, "one PrometheusRule");
    rules[0].clone()
}

/// The alerting rules of a rendered PrometheusRule.
fn alerts(rule: &Value) -> Vec<Value> {
    rule["spec"]["groups"]
        .as_array()
        .expect("spec.groups")
        .iter()
        .flat_map(|group| group["rules"].as_array().cloned().unwrap_or_default())
        .filter(|rule| rule.get("alert").is_some())
        .collect()
}

/// Writes the rule groups of the rendered chart, as shipped, to `dir/rules.yaml` (the file the
/// unit tests of `tests/prometheus/` load).
fn write_rules_file(dir: &Path) -> Value {
    let rule = rendered_rule(&[]);
    let file = serde_json::json!({"groups": rule["spec"]["groups"]});
    std::fs::write(dir.join("rules.yaml"), serde_yaml::to_string(&file).unwrap()).unwrap();
    rule
}

fn run(command: &mut Command) -> (bool, String) {
    let output = command.output().expect("run");
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

#[test]
fn the_service_monitor_honors_the_processors_namespace_label() {
    let docs = render(&["serviceMonitor.enabled=true"]);
    let monitors = of_kind(&docs, "ServiceMonitor");
    assert_eq!(monitors.len(), 1);
    let endpoints = monitors[0]["spec"]["endpoints"].as_array().expect("endpoints");
    assert!(!endpoints.is_empty());
    for endpoint in endpoints {
        assert_eq!(
            endpoint["honorLabels"], true,
            "the per-processor series carry their own `namespace` label; without honorLabels \
             Prometheus renames it exported_namespace: {endpoint}"
        );
        assert_eq!(endpoint["port"], "metrics");
    }
    // The endpoint selects the operator's metrics Service by its port name.
    let services = of_kind(&docs, "Service");
    let service = services
        .iter()
        .find(|s| s["metadata"]["name"] == "cfp-changefeed-operator-metrics")
        .expect("the metrics Service");
    assert_eq!(service["spec"]["ports"][0]["name"], "metrics");
    let selector = monitors[0]["spec"]["selector"]["matchLabels"].as_object().unwrap();
    for (key, value) in selector {
        assert_eq!(&service["metadata"]["labels"][key], value, "label {key} of the Service");
    }
}

/// The operator's metrics served over HTTP, as `cfp operator --metrics-port` serves them.
fn serve_metrics(metrics: Arc<OperatorMetrics>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut buffer = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buffer[..n]),
                }
            }
            let body = metrics.render();
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    address
}

/// A `prometheus` server on loopback, killed when dropped.
struct Prometheus {
    child: Child,
    address: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(config: &str, dir: tempfile::TempDir) -> Self {
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let address = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(prometheus_tool("prometheus"))
            .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={address}"))
            .arg("--log.level=warn")
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        Self {
            child,
            address,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET path?params` of the HTTP API: its `data`, when the answer is a success.
    async fn api(&self, path: &str, params: &[(&str, &str)]) -> Option<Value> {
        let url = url::Url::parse_with_params(&format!("http://{}{path}", self.address), params).ok()?;
        // reqwest, not a hand-written request: Prometheus sends larger answers chunked.
        let body = reqwest::get(url).await.ok()?.text().await.ok()?;
        let answer: Value = serde_json::from_str(&body).ok()?;
        (answer["status"] == "success").then(|| answer["data"].clone())
    }

    /// The result vector of an instant query.
    async fn query(&self, promql: &str) -> Vec<Value> {
        self.api("/api/v1/query", &[("query", promql)])
            .await
            .and_then(|data| data["result"].as_array().cloned())
            .unwrap_or_default()
    }
}

/// Polls `get` every 200 ms until it returns a value; fails with `what` (and the server's log)
/// after 60 s.
async fn until<T, F, Fut>(prometheus: &Prometheus, what: &str, mut get: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(value) = get().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; prometheus log:\n{}",
            prometheus.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `label_values(<selector>, <label>)` of a Grafana variable query: (selector, label).
fn label_values(query: &str) -> (String, String) {
    let inner = query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .unwrap_or_else(|| panic!("not a label_values query: {query}"));
    let (selector, label) = inner.rsplit_once(',').unwrap();
    (selector.trim().to_owned(), label.trim().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prometheus_scraping_as_the_service_monitor_says_serves_keda_the_dashboard_and_the_alerts() {
    prometheus_tool("prometheus");
    let docs = render(&["serviceMonitor.enabled=true", "prometheusRule.enabled=true"]);
    let monitor = of_kind(&docs, "ServiceMonitor")[0].clone();
    let endpoint = &monitor["spec"]["endpoints"][0];
    let rule = of_kind(&docs, "PrometheusRule")[0].clone();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rules.yaml"),
        serde_yaml::to_string(&serde_json::json!({"groups": rule["spec"]["groups"]})).unwrap(),
    )
    .unwrap();

    // The KEDA example's resource and query.
    let keda =
        documents(&std::fs::read_to_string(format!("{ROOT}/manifests/examples/keda-scaledobject.yaml")).unwrap());
    let processor = of_kind(&keda, "ChangeFeedProcessor")[0];
    let name = processor["metadata"]["name"].as_str().unwrap().to_owned();
    let processor_namespace = processor["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_owned();
    let scaled = of_kind(&keda, "ScaledObject")[0];
    let keda_query = scaled["spec"]["triggers"][0]["metadata"]["query"]
        .as_str()
        .unwrap()
        .to_owned();

    // The operator's series for that resource, a processor in trouble on every count.
    let metrics = OperatorMetrics::new().unwrap();
    let figures = |lag| EstimateFigures {
        estimated_lag: lag,
        leases: 4,
        leases_with_lag: 2,
        lease_owners: 1,
        leases_unowned: 2,
        leases_stalled: 1,
        oldest_pending_seconds: Some(420),
    };
    metrics.estimated(&processor_namespace, &name, figures(3000), Duration::from_millis(20));
    metrics.desired_replicas(&processor_namespace, &name, 2);
    metrics.leases_freed(&processor_namespace, &name, 1);
    metrics.ready(&processor_namespace, &name, false);
    metrics.set_leader(false);
    let target = serve_metrics(metrics.clone());

    // The scrape job the Prometheus Operator makes of the ServiceMonitor: its honorLabels, and
    // the target labels it attaches (the Service's namespace, the Service, the pod, ...).
    let honor_labels = endpoint["honorLabels"].as_bool().unwrap_or(false);
    let service = "cfp-changefeed-operator-metrics";
    let config = format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
         rule_files: [rules.yaml]\n\
         scrape_configs:\n\
         - job_name: serviceMonitor/{RELEASE_NAMESPACE}/cfp-changefeed-operator/0\n\
         \x20 honor_labels: {honor_labels}\n\
         \x20 metrics_path: /metrics\n\
         \x20 static_configs:\n\
         \x20 - targets: ['{target}']\n\
         \x20   labels: {{namespace: {RELEASE_NAMESPACE}, service: {service}, job: {service}, endpoint: {port}, \
         pod: cfp-changefeed-operator-7d9f-abcde, container: operator}}\n",
        port = endpoint["port"].as_str().unwrap(),
    );
    let prometheus = Prometheus::start(&config, dir);

    let value_of = |result: &[Value]| -> Option<String> { result.first()?["value"][1].as_str().map(str::to_owned) };
    let raw = format!("cfp_processor_estimated_lag{{name=\"{name}\"}}");
    let scraped = until(&prometheus, "the first scrape of the lag", || async {
        let result = prometheus.query(&raw).await;
        (!result.is_empty()).then_some(result)
    })
    .await;
    let keda_answer = prometheus.query(&keda_query).await;
    assert_eq!(
        value_of(&keda_answer).as_deref(),
        Some("3000"),
        "the KEDA query `{keda_query}` answers {keda_answer:?}; the scraped series: {scraped:?}"
    );
    // The lag grows: the next estimate is higher.
    metrics.estimated(&processor_namespace, &name, figures(4000), Duration::from_millis(20));
    metrics.estimate_failed(&processor_namespace, &name, "timeout", Duration::from_secs(1));
    until(&prometheus, "the KEDA query to answer 4000", || async {
        let result = prometheus.query(&keda_query).await;
        (value_of(&result).as_deref() == Some("4000")).then_some(())
    })
    .await;

    // The dashboard's variables and panels.
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{CHART}/files/dashboard.json")).unwrap()).unwrap();
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let mut chosen: Vec<(String, String)> = Vec::new();
    for variable in variables {
        let var = variable["name"].as_str().unwrap();
        let mut query = variable["query"].as_str().unwrap().to_owned();
        for (name, value) in &chosen {
            query = query.replace(&format!("${name}"), value);
        }
        let (selector, label) = label_values(&query);
        let values = prometheus
            .api(&format!("/api/v1/label/{label}/values"), &[("match[]", &selector)])
            .await
            .unwrap_or_default();
        let values: Vec<String> = values
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        let want = match label.as_str() {
            "namespace" => &processor_namespace,
            "name" => &name,
            other => panic!("variable {var} lists label {other}"),
        };
        assert_eq!(
            values,
            std::slice::from_ref(want),
            "dashboard variable {var} ({query}) offers the processor's {label}"
        );
        chosen.push((var.to_owned(), want.clone()));
    }
    let panels = dashboard["panels"].as_array().unwrap();
    for panel in panels {
        for target in panel["targets"].as_array().unwrap() {
            let mut expr = target["expr"].as_str().unwrap().to_owned();
            for (name, value) in &chosen {
                expr = expr.replace(&format!("${name}"), value);
            }
            let result = until(&prometheus, &format!("the dashboard query `{expr}`"), || async {
                let result = prometheus.query(&expr).await;
                (!result.is_empty()).then_some(result)
            })
            .await;
            for series in result {
                assert_eq!(
                    series["metric"]["namespace"],
                    processor_namespace.as_str(),
                    "{expr}: {series}"
                );
            }
        }
    }

    // Every alert of the operator's series matches the scraped series: each is pending (or
    // firing) for the processor, named by its own namespace; the operator's leader alert by the
    // operator's. (The workers' alert reads the workers' series, scraped through the PodMonitor.)
    let names: BTreeSet<String> = alerts(&rule)
        .iter()
        .filter(|a| {
            !a["expr"]
                .as_str()
                .unwrap_or_default()
                .contains("cfp_lease_errors_total")
        })
        .map(|a| a["alert"].as_str().unwrap().to_owned())
        .collect();
    let seen = std::sync::Mutex::new(Vec::new());
    let active = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Some(data) = prometheus.api("/api/v1/alerts", &[]).await
                && let Some(active) = data["alerts"].as_array()
            {
                let have: BTreeSet<String> = active
                    .iter()
                    .filter_map(|a| a["labels"]["alertname"].as_str().map(str::to_owned))
                    .collect();
                if have == names {
                    return active.clone();
                }
                *seen.lock().unwrap() = active.clone();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "not every alert of {names:?} became active; active: {:?}; prometheus log:\n{}",
            seen.lock().unwrap(),
            prometheus.log()
        )
    });
    for alert in &active {
        let labels = &alert["labels"];
        if labels["alertname"] == "ChangeFeedOperatorNoLeader" {
            assert_eq!(labels["namespace"], RELEASE_NAMESPACE, "{alert}");
        } else {
            assert_eq!(labels["namespace"], processor_namespace.as_str(), "{alert}");
            assert_eq!(labels["name"], name.as_str(), "{alert}");
            let summary = alert["annotations"]["summary"].as_str().unwrap_or_default();
            assert!(summary.contains(&format!("{processor_namespace}/{name}")), "{alert}");
        }
    }
    println!(
        "prometheus scraped as the ServiceMonitor says (honorLabels {honor_labels}): KEDA query answered, \
         {} dashboard variables and {} panels answered, {} alerts active: {names:?}",
        variables.len(),
        panels.len(),
        active.len()
    );
}

#[test]
fn the_worker_pod_monitor_is_off_by_default_and_selects_the_rendered_worker_pods() {
    let docs = render(&[]);
    assert!(of_kind(&docs, "PodMonitor").is_empty(), "off by default");

    let (ok, out, err) = helm(&["lint", "--strict", CHART, "--set", "workerPodMonitor.enabled=true"]);
    assert!(ok, "helm lint --strict: {out}{err}");
    let docs = render(&["workerPodMonitor.enabled=true", "workerPodMonitor.labels.release=prom"]);
    let monitors = of_kind(&docs, "PodMonitor");
    assert_eq!(monitors.len(), 1);
    let monitor = monitors[0];
    assert_eq!(monitor["metadata"]["namespace"], RELEASE_NAMESPACE);
    assert_eq!(monitor["metadata"]["labels"]["release"], "prom");
    assert_eq!(
        monitor["spec"]["namespaceSelector"],
        serde_json::json!({"any": true}),
        "the operator watches every namespace"
    );

    // The pods and port the operator renders for a resource.
    let cfp: ChangeFeedProcessor = serde_yaml::from_str(&resource("orders", FAKE_ENDPOINT, "")).unwrap();
    let mut cfp = cfp;
    cfp.metadata.namespace = Some("shop".into());
    let deployment = worker_deployment(&cfp, "cfp:test", 2);
    let template = deployment.spec.unwrap().template;
    let pod_labels = template.metadata.unwrap().labels.unwrap();
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels");
    assert!(!selector.is_empty());
    for (key, value) in selector {
        assert_eq!(
            pod_labels.get(key).map(String::as_str),
            value.as_str(),
            "the PodMonitor selects {key}={value}; the worker pod has {pod_labels:?}"
        );
    }
    let ports: Vec<String> = template.spec.unwrap().containers[0]
        .ports
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| p.name)
        .collect();
    let endpoints = monitor["spec"]["podMetricsEndpoints"]
        .as_array()
        .expect("podMetricsEndpoints");
    assert_eq!(endpoints.len(), 1);
    let endpoint = &endpoints[0];
    assert!(
        ports.iter().any(|p| endpoint["port"] == p.as_str()),
        "the endpoint's port {} is a worker container port {ports:?}",
        endpoint["port"]
    );
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(endpoint["interval"], "30s");
    // The worker series get the resource's name as `name`, as the operator's series have it.
    let relabelings = endpoint["relabelings"].as_array().expect("relabelings");
    assert!(
        relabelings.iter().any(|r| r["targetLabel"] == "name"
            && r["sourceLabels"] == serde_json::json!(["__meta_kubernetes_pod_label_changefeed_io_processor"])),
        "{relabelings:?}"
    );

    // Namespaced mode: only the watched namespaces.
    let docs = render(&["workerPodMonitor.enabled=true", "watchNamespaces={team-a,team-b}"]);
    let monitor = of_kind(&docs, "PodMonitor")[0];
    assert_eq!(
        monitor["spec"]["namespaceSelector"],
        serde_json::json!({"matchNames": ["team-a", "team-b"]})
    );
    let (ok, _, err) = helm(&["template", "cfp", CHART, "--set", "workerPodMonitor.interval=soon"]);
    assert!(!ok && err.contains("workerPodMonitor"), "{err}");
}

/// The unit-test files of `tests/prometheus/`.
fn rule_tests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(format!("{ROOT}/tests/prometheus"))
        .expect("tests/prometheus")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.to_string_lossy().ends_with(".test.yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no tests/prometheus/*.test.yaml");
    files
}

#[test]
fn the_alert_rules_pass_promtool_check_and_a_unit_test_per_alert() {
    let promtool = prometheus_tool("promtool");
    let (_, version) = run(Command::new(&promtool).arg("--version"));
    let dir = tempfile::tempdir().unwrap();
    let rule = write_rules_file(dir.path());
    let (ok, out) = run(Command::new(&promtool)
        .arg("check")
        .arg("rules")
        .arg(dir.path().join("rules.yaml")));
    assert!(ok, "promtool check rules:\n{out}");
    println!("{}", version.lines().next().unwrap_or_default());
    println!("{}", out.trim());

    // Every alert is tested firing and staying quiet.
    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    let mut copies = Vec::new();
    for file in rule_tests() {
        let text = std::fs::read_to_string(&file).unwrap();
        let tests: Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(
            tests["rule_files"],
            serde_json::json!(["rules.yaml"]),
            "{}: the rules come from the rendered chart",
            file.display()
        );
        for test in tests["tests"].as_array().unwrap() {
            for case in test["alert_rule_test"].as_array().cloned().unwrap_or_default() {
                let alert = case["alertname"].as_str().unwrap().to_owned();
                match case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                    true => fires.insert(alert),
                    false => quiet.insert(alert),
                };
            }
        }
        let copy = dir.path().join(file.file_name().unwrap());
        std::fs::write(&copy, text).unwrap();
        copies.push(copy);
    }
    for alert in alerts(&rule) {
        let name = alert["alert"].as_str().unwrap();
        assert!(fires.contains(name), "no unit test where {name} fires");
        assert!(quiet.contains(name), "no unit test where {name} stays quiet");
    }
    let (ok, out) = run(Command::new(&promtool)
        .arg("test")
        .arg("rules")
        .args(&copies)
        .current_dir(dir.path()));
    assert!(ok, "promtool test rules:\n{out}");
    println!("{}", out.trim());
}

#[test]
fn every_alert_links_its_runbook() {
    let rule = rendered_rule(&[]);
    let names: Vec<String> = alerts(&rule)
        .iter()
        .map(|a| a["alert"].as_str().unwrap().to_owned())
        .collect();
    assert!(names.len() >= 5, "{names:?}");
    for alert in alerts(&rule) {
        let name = alert["alert"].as_str().unwrap();
        let url = alert["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} has no runbook_url"));
        assert!(url.ends_with(&format!("/docs/runbooks/{name}.md")), "{name}: {url}");
        let page = std::fs::read_to_string(format!("{ROOT}/docs/runbooks/{name}.md"))
            .unwrap_or_else(|e| panic!("docs/runbooks/{name}.md: {e}"));
        assert!(
            page.starts_with(&format!("# {name}\n")),
            "docs/runbooks/{name}.md starts with its title"
        );
        for section in ["## Meaning", "## What to check", "## How to fix"] {
            assert!(page.contains(section), "docs/runbooks/{name}.md has no `{section}`");
        }
        for key in ["summary", "description"] {
            assert!(alert["annotations"][key].is_string(), "{name} has no {key}");
        }
    }
    // Runbooks elsewhere (a fork, an internal wiki).
    let rule = rendered_rule(&["prometheusRule.runbookBaseUrl=https://runbooks.example/cfp/"]);
    for alert in alerts(&rule) {
        let name = alert["alert"].as_str().unwrap();
        assert_eq!(
            alert["annotations"]["runbook_url"],
            format!("https://runbooks.example/cfp/{name}.md")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_resource_leaves_no_series_behind() {
    let plane = plane().await;
    let ns = namespace(plane, "metrics-deleted");
    let mut operator = Operator::start(plane, &ns, "op");
    // No Secret: the resource is misconfigured (Ready=False, SecretNotFound) and never estimated.
    apply_ok(plane, &ns, &resource("broken", FAKE_ENDPOINT, ""));
    let ready = format!("cfp_processor_ready{{name=\"broken\",namespace=\"{ns}\"}}");
    let value = wait("cfp_processor_ready of the misconfigured resource", || {
        operator.metric(&ready)
    })
    .await;
    assert_eq!(value, 0.0);
    let (ok, _, err) = plane.kubectl_run(&["delete", "cfp", "broken", "-n", &ns, "--wait"], None);
    assert!(ok, "kubectl delete: {err}");
    let started = Instant::now();
    wait_up_to("no series of the deleted resource", Duration::from_secs(20), || async {
        let body = metrics_body(operator.metrics).await?;
        (!body.contains("name=\"broken\"")).then_some(())
    })
    .await;
    println!(
        "the deleted misconfigured resource's series left /metrics {:.1?} after kubectl delete",
        started.elapsed()
    );
    terminate(&mut operator.child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_stops_leading_exports_no_processor_series() {
    let plane = plane().await;
    let ns = namespace(plane, "metrics-leader");
    let first = Operator::start(plane, &ns, "first");
    wait("the first operator leads", || async {
        first.scrape().await.filter(|(_, leader)| *leader == 1)
    })
    .await;
    let second = Operator::start(plane, &ns, "second");
    wait("the second operator serves metrics", || async { second.scrape().await }).await;
    // Misconfigured (no Secret): never estimated, so no estimate task removes its series.
    apply_ok(plane, &ns, &resource("broken", FAKE_ENDPOINT, ""));
    let ready = format!("cfp_processor_ready{{name=\"broken\",namespace=\"{ns}\"}}");
    wait("cfp_processor_ready from the leader", || first.metric(&ready)).await;
    let pid = first.child.id().expect("pid").to_string();
    let signal = |sig: &'static str| {
        let pid = pid.clone();
        async move {
            let status = tokio::process::Command::new("kill")
                .args([sig, &pid])
                .status()
                .await
                .unwrap();
            assert!(status.success());
        }
    };
    signal("-STOP").await;
    wait("the second operator leads", || async {
        second.scrape().await.filter(|(_, leader)| *leader == 1)
    })
    .await;
    let value = wait("cfp_processor_ready from the new leader", || second.metric(&ready)).await;
    assert_eq!(value, 0.0);
    signal("-CONT").await;
    wait_up_to(
        "the resumed former leader without processor series",
        Duration::from_secs(20),
        || async {
            let body = metrics_body(first.metrics).await?;
            let leads = body.lines().any(|l| l == "cfp_operator_leader 1");
            (!leads && !body.contains("cfp_processor_")).then_some(())
        },
    )
    .await;
    // The series a Prometheus alert sees come from the leader only.
    assert_eq!(second.metric(&ready).await, Some(0.0));
    let (mut first, mut second) = (first, second);
    terminate(&mut first.child).await;
    terminate(&mut second.child).await;
}
