//! What the operator renders and keeps: the worker Deployment, Service, sidecar handler,
//! pod security and NetworkPolicy, roll-outs, drift and `/scale`.

use changefeed_operator::operator::ChangeFeedProcessor;
use changefeed_operator::operator::workload::worker_deployment;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::Api;

use crate::common::{cfp_write, eventually, http_get, start_emulator, terminate};
use crate::operator_support::{
    self, Deployed, FAKE_ENDPOINT, LocalWorker, Operator, Scene, TIMEOUT, apply, apply_ok, deployed, namespace, plane,
    replicas, resource, secret_yaml, wait, wait_event, worker_env,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applying_a_resource_creates_the_rendered_workload_and_status() {
    let Scene { plane, ns, client } = Scene::new("create").await;
    // An account whose lease-set claim the operator can read: the workers start only then.
    let (_emulator, endpoint) = start_emulator("db/items:/pk:2").await;
    let mut operator = Operator::start(plane, &ns, "op");
    apply_ok(plane, &ns, &secret_yaml());
    let (ok, out, err) = apply(plane, &ns, &resource("orders", &endpoint, "  replicas: 2\n"));
    assert!(ok, "{err}");
    assert!(out.contains("created"), "{out}");

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment = wait("the worker Deployment", || async {
        deployments.get_opt("orders").await.ok().flatten()
    })
    .await;
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    let cfp = cfps.get("orders").await.unwrap();
    let rendered = worker_deployment(&cfp, "cfp:test", 2);
    let (got, want) = (deployment.spec.clone().unwrap(), rendered.spec.unwrap());
    assert_eq!(got.replicas, want.replicas);
    assert_eq!(got.selector, want.selector);
    let (got_pod, want_pod) = (got.template.spec.unwrap(), want.template.spec.unwrap());
    assert_eq!(got_pod.containers[0].image, want_pod.containers[0].image);
    assert_eq!(got_pod.containers[0].args, want_pod.containers[0].args);
    assert_eq!(got_pod.containers[0].env, want_pod.containers[0].env);
    assert_eq!(
        got_pod.containers[0].security_context,
        want_pod.containers[0].security_context
    );
    assert_eq!(got_pod.automount_service_account_token, Some(false));
    assert_eq!(
        deployment.metadata.owner_references.as_ref().unwrap()[0].uid,
        cfp.metadata.uid.clone().unwrap()
    );
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    wait("the metrics Service", || async {
        services.get_opt("orders-metrics").await.ok().flatten()
    })
    .await;
    let budgets: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    let budget = wait("the PodDisruptionBudget", || async {
        budgets.get_opt("orders").await.ok().flatten()
    })
    .await;
    assert_eq!(
        budget.spec.and_then(|s| s.max_unavailable),
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );
    let managers: Vec<String> = deployment
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager.filter(|_| m.operation.as_deref() == Some("Apply")))
        .collect();
    assert_eq!(managers, vec!["changefeed-operator".to_owned()]);

    let status = wait("status", || async {
        let cfp = cfps.get("orders").await.ok()?;
        cfp.status
            .filter(|s| s.observed_generation == cfp.metadata.generation && s.conditions.len() >= 4)
    })
    .await;
    let reasons: Vec<(String, String, String)> = status
        .conditions
        .iter()
        .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
        .collect();
    assert!(
        reasons.contains(&("ConfigValid".into(), "True".into(), "Valid".into())),
        "{reasons:?}"
    );
    // No Deployment controller runs here: the rollout is never observed, and status says so.
    assert!(
        reasons.contains(&("Ready".into(), "False".into(), "RolloutInProgress".into())),
        "{reasons:?}"
    );
    assert!(
        reasons.contains(&("Progressing".into(), "True".into(), "RolloutInProgress".into())),
        "{reasons:?}"
    );
    assert!(status.selector.contains("changefeed.io/processor=orders"));

    let (ok, table, _) = plane.kubectl_run(&["get", "cfp", "-n", &ns], None);
    assert!(ok);
    println!("kubectl get cfp:\n{table}");
    let header = table.lines().next().unwrap_or_default();
    for column in ["NAME", "REPLICAS", "READY", "LEASES", "LAG", "STATUS", "AGE"] {
        assert!(header.contains(column), "column {column} missing: {header}");
    }
    assert!(table.contains("RolloutInProgress"));
    let (ok, explain, _) = plane.kubectl_run(&["explain", "cfp.spec.connection.keySecretRef"], None);
    assert!(
        ok && explain.contains("The Secret key that holds the account key"),
        "{explain}"
    );
    terminate(&mut operator.child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_install_manifests_are_accepted_by_the_api_server() {
    let plane = plane().await;
    // A dry run creates nothing, so the namespace the other objects go into must exist.
    namespace(plane, "changefeed-operator");
    let manifests = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/operator.yaml");
    let (ok, out, err) = plane.kubectl_run(&["apply", "--dry-run=server", "-f", manifests], None);
    assert!(ok, "{err}");
    assert!(
        out.contains("deployment.apps/changefeed-operator created (server dry run)"),
        "{out}"
    );
    assert!(
        out.contains("clusterrole.rbac.authorization.k8s.io/changefeed-operator created (server dry run)"),
        "{out}"
    );
    // The examples are valid resources.
    let ns = namespace(plane, "examples");
    for (file, name) in [("autoscaling.yaml", "orders"), ("emulator.yaml", "items")] {
        let example = format!("{}/manifests/examples/{file}", env!("CARGO_MANIFEST_DIR"));
        let (ok, out, err) = plane.kubectl_run(&["apply", "--dry-run=server", "-n", &ns, "-f", &example], None);
        assert!(ok, "{file}: {err}");
        assert!(
            out.contains(&format!(
                "changefeedprocessor.changefeed.io/{name} created (server dry run)"
            )),
            "{out}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_changes_roll_out_and_drift_is_reverted() {
    let Deployed {
        plane,
        ns,
        mut operator,
        deployments,
        endpoint,
        emulator: _emulator,
    } = deployed("update").await;

    let changed = "  replicas: 3\n  pollInterval: 1s\n  worker:\n    resources:\n      limits:\n        memory: 64Mi\n";
    apply_ok(plane, &ns, &resource("orders", &endpoint, changed));
    let updated = wait("the changed Deployment", || async {
        let d = deployments.get("orders").await.ok()?;
        let env = worker_env(&d);
        (replicas(&d) == Some(3) && env["CFP_POLL_INTERVAL"].value.as_deref() == Some("1s")).then_some(d)
    })
    .await;
    let pod = updated.spec.unwrap().template.spec.unwrap();
    let limits = pod.containers[0].resources.clone().unwrap().limits.unwrap();
    assert_eq!(limits["memory"].0, "64Mi");

    // Someone edits fields the operator owns: it puts them back.
    let (ok, _, err) = plane.kubectl_run(&["scale", "deployment/orders", "-n", &ns, "--replicas=7"], None);
    assert!(ok, "{err}");
    let (ok, _, err) = plane.kubectl_run(
        &[
            "set",
            "env",
            "deployment/orders",
            "-n",
            &ns,
            "-c",
            "worker",
            "CFP_MAX_ITEMS=5",
        ],
        None,
    );
    assert!(ok, "{err}");
    wait("drift reverted", || async {
        let d = deployments.get("orders").await.ok()?;
        (replicas(&d) == Some(3) && worker_env(&d)["CFP_MAX_ITEMS"].value.as_deref() == Some("100")).then_some(())
    })
    .await;
    println!(
        "spec change rolled out (replicas 3, pollInterval 1s, memory limit 64Mi); manual edits (replicas 7, CFP_MAX_ITEMS=5) reverted"
    );
    terminate(&mut operator.child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_scale_drives_the_deployment_through_the_scale_subresource() {
    let Deployed {
        plane,
        ns,
        mut operator,
        deployments,
        emulator: _emulator,
        ..
    } = deployed("scale").await;
    let (ok, out, err) = plane.kubectl_run(&["scale", "cfp/orders", "-n", &ns, "--replicas=3"], None);
    assert!(ok, "{err}");
    assert!(out.contains("scaled"), "{out}");
    wait("3 replicas", || async {
        let d = deployments.get("orders").await.ok()?;
        (replicas(&d) == Some(3)).then_some(())
    })
    .await;
    let (ok, scale, _) = plane.kubectl_run(
        &[
            "get",
            "--raw",
            &format!("/apis/changefeed.io/v1alpha1/namespaces/{ns}/changefeedprocessors/orders/scale"),
        ],
        None,
    );
    assert!(ok);
    let scale: serde_json::Value = serde_json::from_str(&scale).unwrap();
    assert_eq!(scale["spec"]["replicas"], 3);
    assert!(
        scale["status"]["selector"]
            .as_str()
            .unwrap_or_default()
            .contains("changefeed.io/processor=orders")
    );
    println!(
        "kubectl scale cfp/orders --replicas=3: Deployment replicas 3, /scale selector {}",
        scale["status"]["selector"]
    );
    terminate(&mut operator.child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rendered_pod_template_runs_as_a_working_worker() {
    let Scene { plane, ns, client } = Scene::new("template").await;
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:4").await;
    let mut operator = Operator::start(plane, &ns, "op");
    apply_ok(plane, &ns, &secret_yaml());
    apply_ok(plane, &ns, &resource("orders", &endpoint, "  pollInterval: 100ms\n"));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment = wait("deployment", || async {
        deployments.get_opt("orders").await.ok().flatten()
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    // What a kubelet would do: resolve the environment and run the container's command.
    let mut worker = LocalWorker::start(&deployment, &secrets, "orders-7d9f-abcde", &[]).await;
    cfp_write(&endpoint, 0, 500).await;
    let all = eventually(TIMEOUT, || async { worker.ids().len() == 500 }).await;
    let seen = worker.ids();
    let ready = http_get(worker.metrics, "/readyz").await.0;
    println!(
        "rendered pod template as a process: {} of 500 documents on stdout, /readyz {ready}",
        seen.len()
    );
    assert!(all, "only {} documents delivered", seen.len());
    assert_eq!(ready, 200);
    terminate(&mut worker.child).await;
    terminate(&mut operator.child).await;
    terminate(&mut emulator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_handler_in_a_sidecar_is_rendered_and_bad_handlers_are_rejected() {
    let Scene { plane, ns, client } = Scene::new("http").await;
    let endpoint = FAKE_ENDPOINT;
    let handler = |url: &str, extra: &str| {
        format!(
            "  handler:\n    type: Http\n    http:\n      url: {url}\n      format: CloudEvents\n      headers:\n      - name: Authorization\n        valueFrom:\n          secretKeyRef: {{name: handler, key: token}}\n{extra}"
        )
    };
    let (ok, _, err) = apply(
        plane,
        &ns,
        &resource("bad-url", endpoint, &handler("localhost:8080/changes", "")),
    );
    assert!(!ok);
    assert!(
        err.contains("handler.http.url must be an http:// or https:// URL"),
        "{err}"
    );
    let (ok, _, err) = apply(
        plane,
        &ns,
        &resource("no-url", endpoint, "  handler:\n    type: Http\n"),
    );
    assert!(!ok);
    assert!(err.contains("handler.http (with a url) is required"), "{err}");
    let (ok, _, err) = apply(
        plane,
        &ns,
        &resource("no-dead-letter", endpoint, "  handler:\n    onExhausted: DeadLetter\n"),
    );
    assert!(!ok);
    assert!(
        err.contains("handler.onExhausted DeadLetter needs deadLetter.container"),
        "{err}"
    );

    let mut operator = Operator::start(plane, &ns, "op");
    apply_ok(plane, &ns, &secret_yaml());
    let sidecar = "    onExhausted: DeadLetter\n  deadLetter:\n    container: poison\n  worker:\n    sidecars:\n    - name: handler\n      image: example.com/orders-handler:1\n      ports:\n      - containerPort: 8080\n";
    let (ok, _, err) = apply(
        plane,
        &ns,
        &resource("orders", endpoint, &handler("http://localhost:8080/changes", sidecar)),
    );
    assert!(ok, "{err}");
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    // The header's Secret is missing: no workload until it exists.
    wait("Ready=False/SecretNotFound for the header Secret", || async {
        let status = cfps.get("orders").await.ok()?.status?;
        status.conditions.into_iter().find(|c| {
            c.type_ == "Ready" && c.reason == "SecretNotFound" && c.message.contains("headers[Authorization]")
        })
    })
    .await;
    let token = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: handler\nstringData:\n  token: Bearer abc\n";
    apply_ok(plane, &ns, token);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment = wait("the Deployment", || async {
        deployments.get_opt("orders").await.ok().flatten()
    })
    .await;
    let env = worker_env(&deployment);
    let value = |name: &str| env.get(name).and_then(|e| e.value.clone());
    let pod = deployment.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let names: Vec<&str> = pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
        .map(|c| c.name.as_str())
        .collect();
    let header = env["CFP_HANDLER_HEADER_Authorization"]
        .value_from
        .as_ref()
        .and_then(|s| s.secret_key_ref.as_ref())
        .map(|r| (r.name.clone(), r.key.clone()));
    println!(
        "http handler: containers {names:?}, CFP_HANDLER={:?} CFP_HANDLER_URL={:?} CFP_HANDLER_FORMAT={:?} CFP_ON_EXHAUSTED={:?} CFP_DEAD_LETTER_CONTAINER={:?}, Authorization from {header:?}",
        value("CFP_HANDLER"),
        value("CFP_HANDLER_URL"),
        value("CFP_HANDLER_FORMAT"),
        value("CFP_ON_EXHAUSTED"),
        value("CFP_DEAD_LETTER_CONTAINER")
    );
    assert_eq!(names, ["worker", "handler"]);
    assert_eq!(value("CFP_HANDLER").as_deref(), Some("http"));
    assert_eq!(
        value("CFP_HANDLER_URL").as_deref(),
        Some("http://localhost:8080/changes")
    );
    assert_eq!(value("CFP_HANDLER_FORMAT").as_deref(), Some("cloudevents"));
    assert_eq!(value("CFP_ON_EXHAUSTED").as_deref(), Some("dead-letter"));
    assert_eq!(value("CFP_DEAD_LETTER_CONTAINER").as_deref(), Some("poison"));
    assert_eq!(header, Some(("handler".to_owned(), "token".to_owned())));
    assert!(env["CFP_HANDLER_HEADER_Authorization"].value.is_none());
    terminate(&mut operator.child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rendered_worker_pod_passes_the_restricted_pod_security_standard() {
    let Deployed {
        plane,
        ns,
        mut operator,
        deployments,
        endpoint,
        emulator: _emulator,
    } = deployed("pss-worker").await;
    let restricted = namespace(plane, "pss-restricted");
    let (ok, _, err) = plane.kubectl_run(
        &[
            "label",
            "namespace",
            &restricted,
            "pod-security.kubernetes.io/enforce=restricted",
        ],
        None,
    );
    assert!(ok, "{err}");
    // With a sidecar that sets no security context of its own: it gets the worker's.
    let sidecar = "  worker:\n    sidecars:\n    - name: handler\n      image: example.com/handler:1\n";
    apply_ok(plane, &ns, &resource("orders", &endpoint, sidecar));
    let deployment = wait("the Deployment with the sidecar", || async {
        let d = deployments.get("orders").await.ok()?;
        let sidecars = d.spec.as_ref()?.template.spec.as_ref()?.init_containers.as_ref()?.len();
        (sidecars == 1).then_some(d)
    })
    .await;
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "worker-pod-check", "namespace": restricted},
        "spec": deployment.spec.unwrap().template.spec,
    });
    let (ok, _, err) = plane.kubectl_run(&["create", "--dry-run=server", "-f", "-"], Some(&pod.to_string()));
    println!("rendered worker pod (worker + sidecar) under enforce=restricted: admitted {ok} {err}");
    assert!(ok, "the worker pod is refused by Pod Security: {err}");
    terminate(&mut operator.child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_network_policy_is_applied_when_asked_and_deleted_when_turned_off() {
    let Scene { plane, ns, client } = Scene::new("worker-netpol").await;
    let mut operator = Operator::start(plane, &ns, "op");
    apply_ok(plane, &ns, &secret_yaml());
    let handler = "  handler:\n    type: Http\n    http: {url: 'http://orders-handler.shop.svc:8000/changes'}\n";
    let policy = "  worker:\n    networkPolicy:\n      enabled: true\n      cosmosCidrs: [10.20.0.0/16]\n      metricsFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}]\n";
    apply_ok(
        plane,
        &ns,
        &resource("orders", FAKE_ENDPOINT, &format!("{handler}{policy}")),
    );
    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    let applied = wait("the workers' NetworkPolicy", || async {
        policies.get_opt("orders").await.ok().flatten()
    })
    .await;
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    let cfp = cfps.get("orders").await.unwrap();
    let owner = &applied.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.clone()),
        ("ChangeFeedProcessor", cfp.metadata.uid.clone().unwrap())
    );
    let managers: Vec<String> = applied
        .metadata
        .managed_fields
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager.filter(|_| m.operation.as_deref() == Some("Apply")))
        .collect();
    assert_eq!(managers, ["changefeed-operator"], "server-side applied");
    let spec = serde_json::to_value(applied.spec.unwrap()).unwrap();
    assert_eq!(spec["podSelector"]["matchLabels"]["changefeed.io/processor"], "orders");
    assert_eq!(spec["policyTypes"], serde_json::json!(["Ingress", "Egress"]));
    assert_eq!(spec["ingress"][0]["ports"][0]["port"], 9090);
    let egress = spec["egress"].as_array().unwrap();
    let ports = operator_support::egress_ports(&spec);
    assert_eq!(
        ports,
        ["UDP/53+TCP/53", "TCP/443", "TCP/8000"],
        "DNS, Cosmos, the handler"
    );
    assert_eq!(egress[1]["to"][0]["ipBlock"]["cidr"], "10.20.0.0/16");

    // A CIDR the API server refuses is reported on the resource.
    apply_ok(
        plane,
        &ns,
        &resource(
            "orders",
            FAKE_ENDPOINT,
            &format!("{handler}{}", policy.replace("10.20.0.0/16", "10.20.0.0/99")),
        ),
    );
    let refused = wait_event(&client, &ns, "ApplyFailed").await;
    assert!(
        refused.note.as_deref().unwrap_or_default().contains("cidr"),
        "{:?}",
        refused.note
    );
    // Turned off: the NetworkPolicy goes.
    apply_ok(plane, &ns, &resource("orders", FAKE_ENDPOINT, handler));
    wait("the NetworkPolicy deleted", || async {
        policies
            .get_opt("orders")
            .await
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .await;
    terminate(&mut operator.child).await;
    println!(
        "spec.worker.networkPolicy: applied by server-side apply (manager changefeed-operator), owned by cfp/orders, egress {ports:?}, Cosmos to 10.20.0.0/16, ingress to 9090 from the monitoring namespace; a bad CIDR refused by the API server and reported (ApplyFailed: {:?}); enabled false → deleted",
        refused.note.unwrap_or_default().chars().take(160).collect::<String>()
    );
}
