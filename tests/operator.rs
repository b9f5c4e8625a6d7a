//! The operator against a real kube-apiserver + etcd (no kubelet: tests check the objects the
//! operator writes), with real `kubectl`, `cfp operator` processes and `cfp emulator`.

use std::process::Stdio;
use std::time::Duration;

use changefeed_operator::operator::ChangeFeedProcessor;
use changefeed_operator::operator::workload::worker_deployment;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Api, DeleteParams, ListParams};
use tokio::process::Command;

use crate::common::{self, CFP, cfp_write, eventually, http_get, lease_store, start_emulator, terminate};
use crate::operator_support::{
    self, Deployed, FAKE_ENDPOINT, LocalWorker, Operator, TIMEOUT, apply, apply_ok, deployed, namespace, plane,
    replicas, resource, secret_yaml, wait, wait_event, wait_up_to, worker_env,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applying_a_resource_creates_the_rendered_workload_and_status() {
    let plane = plane().await;
    let ns = namespace(plane, "create");
    let client = plane.client().await;
    let mut operator = Operator::start(plane, &ns, "op");
    apply_ok(plane, &ns, &secret_yaml());
    let (ok, out, err) = apply(
        plane,
        &ns,
        &resource("orders", "https://acct.documents.azure.com:443/", "  replicas: 2\n"),
    );
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
            .filter(|s| s.observed_generation == cfp.metadata.generation && s.conditions.len() == 4)
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
    } = deployed("update").await;

    let changed = "  replicas: 3\n  pollInterval: 1s\n  worker:\n    resources:\n      limits:\n        memory: 64Mi\n";
    apply_ok(plane, &ns, &resource("orders", FAKE_ENDPOINT, changed));
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
async fn invalid_resources_are_rejected_and_a_missing_secret_blocks_until_created() {
    let plane = plane().await;
    let ns = namespace(plane, "invalid");
    let client = plane.client().await;
    let endpoint = FAKE_ENDPOINT;
    let (ok, _, err) = apply(
        plane,
        &ns,
        &resource(
            "bad-scaling",
            endpoint,
            "  autoscaling:\n    enabled: true\n    minReplicas: 5\n    maxReplicas: 2\n",
        ),
    );
    assert!(!ok);
    assert!(
        err.contains("autoscaling.minReplicas must not be greater than autoscaling.maxReplicas"),
        "{err}"
    );
    let (ok, _, err) = apply(plane, &ns, &resource("bad-start", endpoint, "  startFrom: yesterday\n"));
    assert!(!ok);
    assert!(
        err.contains("startFrom must be Beginning, Now, or an RFC 3339 time"),
        "{err}"
    );
    let (ok, _, err) = apply(
        plane,
        &ns,
        &resource(
            "bad-timings",
            endpoint,
            "  leaseTimings:\n    renewInterval: 90s\n    expiration: 60s\n",
        ),
    );
    assert!(!ok);
    assert!(
        err.contains("renewInterval must be shorter than leaseTimings.expiration"),
        "{err}"
    );
    println!("rejected: {}", err.lines().next().unwrap_or_default());

    let mut operator = Operator::start(plane, &ns, "op");
    apply_ok(plane, &ns, &resource("orders", endpoint, ""));
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    let ready = wait("Ready=False SecretNotFound", || async {
        let status = cfps.get("orders").await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready" && c.reason == "SecretNotFound")
    })
    .await;
    assert_eq!(ready.status, "False");
    assert!(ready.message.contains("\"cosmos\""), "{}", ready.message);
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    let event = wait("a SecretNotFound Event", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("SecretNotFound")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("orders")
        })
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    assert!(
        deployments.get_opt("orders").await.unwrap().is_none(),
        "no workload without the Secret"
    );

    apply_ok(plane, &ns, &secret_yaml());
    wait("the Deployment after the Secret appeared", || async {
        deployments.get_opt("orders").await.ok().flatten()
    })
    .await;
    let config_valid = wait("ConfigValid=True", || async {
        let status = cfps.get("orders").await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "ConfigValid" && c.status == "True")
    })
    .await;
    // A rotated key rolls the workers onto it: the pod template carries a digest of the values.
    let digest_of = |deployment: &Deployment| {
        deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get("changefeed.io/secrets-digest").cloned())
    };
    let before = digest_of(&deployments.get("orders").await.unwrap());
    assert!(before.is_some(), "the pod template carries the Secret digest");
    apply_ok(
        plane,
        &ns,
        &secret_yaml().replace(changefeed_operator::cosmos::EMULATOR_KEY, "cm90YXRlZC1rZXk="),
    );
    let after = wait("a new Secret digest after the key was rotated", || async {
        let digest = digest_of(&deployments.get("orders").await.ok()?);
        digest.filter(|d| Some(d) != before.as_ref())
    })
    .await;
    println!("key rotated: pod template digest {before:?} -> {after:?} (the workers roll onto the new key)");
    // A working resource whose Secret goes away keeps its workers and reports the problem.
    let (ok, _, err) = plane.kubectl_run(&["delete", "secret", "cosmos", "-n", &ns], None);
    assert!(ok, "{err}");
    wait("Ready=False after the Secret was deleted", || async {
        let status = cfps.get("orders").await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready" && c.reason == "SecretNotFound")
    })
    .await;
    let kept = deployments.get("orders").await.unwrap();
    assert_eq!(replicas(&kept), Some(1), "the existing workload stays");
    println!(
        "missing Secret: Ready=False/SecretNotFound, Warning Event {:?}; after creating it: {}; after deleting it again the Deployment stays",
        event.note, config_valid.reason
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
async fn only_the_leader_reconciles_and_a_killed_leader_hands_over() {
    let plane = plane().await;
    let ns = namespace(plane, "leader");
    let client = plane.client().await;
    apply_ok(plane, &ns, &secret_yaml());
    let mut first = Operator::start(plane, &ns, "first");
    // The first one leads before the second starts.
    wait("the first operator leads", || async {
        first.scrape().await.filter(|(_, leader)| *leader == 1)
    })
    .await;
    let mut second = Operator::start(plane, &ns, "second");
    wait("the second operator serves metrics", || async { second.scrape().await }).await;
    apply_ok(plane, &ns, &resource("one", FAKE_ENDPOINT, ""));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    wait("deployment one", || async {
        deployments.get_opt("one").await.ok().flatten()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (leader_reconciles, _) = first.scrape().await.unwrap();
    let (follower_reconciles, follower_leads) = second.scrape().await.unwrap();
    assert!(leader_reconciles > 0);
    assert_eq!(
        (follower_reconciles, follower_leads),
        (0, 0),
        "the follower must not reconcile"
    );

    first.child.start_kill().unwrap();
    let _ = first.child.wait().await;
    let killed = tokio::time::Instant::now();
    apply_ok(plane, &ns, &resource("two", FAKE_ENDPOINT, ""));
    wait("deployment two from the new leader", || async {
        deployments.get_opt("two").await.ok().flatten()
    })
    .await;
    let handover = killed.elapsed();
    let (reconciles, leads) = wait("the new leader's metrics", || async {
        second.scrape().await.filter(|(r, l)| *r > 0 && *l == 1)
    })
    .await;
    println!(
        "leader election: leader reconciled {leader_reconciles} times, follower 0; after SIGKILL the follower led and reconciled within {handover:.1?} (lease 3 s)"
    );
    assert!(reconciles > 0 && leads == 1);
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), &ns);
    let lease = leases.get("changefeed-operator").await.unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("second"));
    terminate(&mut second.child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_resource_that_asks_for_it_removes_its_lease_documents() {
    let plane = plane().await;
    let ns = namespace(plane, "cleanup");
    let client = plane.client().await;
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
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let created = eventually(TIMEOUT, || async {
            match lease_store(&account, processor).await {
                Some(store) => {
                    use changefeed_operator::processor::LeaseStore;
                    store.snapshot().await.map(|s| s.leases.len() == 3).unwrap_or(false)
                }
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
    use changefeed_operator::processor::LeaseStore;
    let while_running = lease_store(&account, "orders")
        .await
        .unwrap()
        .snapshot()
        .await
        .unwrap()
        .leases
        .len();
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
async fn the_rendered_pod_template_runs_as_a_working_worker() {
    let plane = plane().await;
    let ns = namespace(plane, "template");
    let client = plane.client().await;
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
    let plane = plane().await;
    let ns = namespace(plane, "http");
    let client = plane.client().await;
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
async fn a_lease_halted_by_its_handler_makes_the_processor_degraded() {
    let plane = plane().await;
    let ns = namespace(plane, "degraded");
    let client = plane.client().await;
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:3").await;
    let mut operator = Operator::start(plane, &ns, "op");
    apply_ok(plane, &ns, &secret_yaml());
    let extra = "  autoscaling:\n    estimateInterval: 1s\n";
    apply_ok(plane, &ns, &resource("orders", &endpoint, extra));
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    let healthy = wait("Degraded=False", || async {
        let status = cfps.get("orders").await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Degraded" && c.status == "False")
    })
    .await;
    // What a worker whose handler keeps failing writes into its lease (see the http_handler tests).
    let account = changefeed_operator::cosmos::CosmosAccount::connect(
        &endpoint,
        &changefeed_operator::cosmos::AccountAuth::emulator_key(),
    )
    .await
    .unwrap();
    use changefeed_operator::processor::LeaseStore;
    let store = lease_store(&account, "orders").await.unwrap();
    let mut lease = store.snapshot().await.unwrap().leases.remove(0);
    lease.properties.insert(
        "handlerFailing".into(),
        "since 2026-11-23T03:00:00Z: POST http://localhost:8080/changes answered 500".into(),
    );
    let lease = store.replace(&lease).await.unwrap();
    let degraded = wait("Degraded=True/HandlerFailing", || async {
        let status = cfps.get("orders").await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Degraded" && c.reason == "HandlerFailing")
    })
    .await;
    let warning = wait_event(&client, &ns, "HandlerFailing").await;
    let mut fixed = lease.clone();
    fixed.properties.remove("handlerFailing");
    store.replace(&fixed).await.unwrap();
    wait("Degraded=False again", || async {
        let status = cfps.get("orders").await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Degraded" && c.status == "False")
    })
    .await;
    println!(
        "degraded: {} → Degraded=True/HandlerFailing: {:?}; Warning Event {:?}; after the lease recovered Degraded=False",
        healthy.reason, degraded.message, warning.note
    );
    assert!(degraded.message.contains(&lease.lease_token), "{}", degraded.message);
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    terminate(&mut operator.child).await;
    terminate(&mut emulator).await;
}

/// Resident memory of a process in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrelated_secrets_do_not_grow_the_operator() {
    let plane = plane().await;
    let ns = namespace(plane, "noise");
    let mut operator = Operator::start(plane, &ns, "op");
    apply_ok(plane, &ns, &secret_yaml());
    apply_ok(plane, &ns, &resource("orders", FAKE_ENDPOINT, ""));
    let client = plane.client().await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    wait("the first reconcile", || async {
        deployments.get_opt("orders").await.ok().flatten()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = operator.child.id().expect("operator pid");
    let before = rss_kib(pid);
    // 1000 Secrets of 10 KiB the operator has nothing to do with (10 MiB of data).
    let blob = "x".repeat(10 * 1024);
    let mut yaml = String::new();
    for n in 0..1000 {
        yaml.push_str(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: noise-{n}\nstringData:\n  blob: {blob}\n---\n"
        ));
    }
    let (ok, _, err) = plane.kubectl_run(&["create", "-n", &ns, "-f", "-"], Some(&yaml));
    assert!(ok, "{err}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = rss_kib(pid);
    // A new operator starts over a namespace that already holds them (the initial list).
    let mut fresh = Operator::start(plane, &ns, "fresh");
    wait("the fresh operator serves metrics", || async { fresh.scrape().await }).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let fresh_rss = rss_kib(fresh.child.id().expect("pid"));
    println!(
        "operator RSS: {:.1} MiB before, {:.1} MiB after 1000 unrelated 10 KiB Secrets (10 MiB of data) appeared; a new operator over them: {:.1} MiB (the Secret watch is metadata-only)",
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        fresh_rss as f64 / 1024.0
    );
    assert!(
        after < before + 5 * 1024,
        "the operator grew by {} KiB: Secret data is being cached",
        after.saturating_sub(before)
    );
    terminate(&mut fresh.child).await;
    terminate(&mut operator.child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_is_replaced_and_never_reconciles_after_it_resumes() {
    let plane = plane().await;
    let ns = namespace(plane, "frozen");
    let client = plane.client().await;
    apply_ok(plane, &ns, &secret_yaml());
    let first = Operator::start(plane, &ns, "first");
    wait("the first operator leads", || async {
        first.scrape().await.filter(|(_, leader)| *leader == 1)
    })
    .await;
    let mut second = Operator::start(plane, &ns, "second");
    wait("the second operator serves metrics", || async { second.scrape().await }).await;
    let endpoint = FAKE_ENDPOINT;
    apply_ok(plane, &ns, &resource("one", endpoint, ""));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    wait("deployment one", || async {
        deployments.get_opt("one").await.ok().flatten()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (before, _) = first.scrape().await.expect("first metrics");
    let pid = first.child.id().expect("pid").to_string();
    let signal = |sig: &'static str| {
        let pid = pid.clone();
        async move {
            let status = Command::new("kill").args([sig, &pid]).status().await.unwrap();
            assert!(status.success());
        }
    };
    signal("-STOP").await;
    let frozen = tokio::time::Instant::now();
    wait("the second operator leads", || async {
        second.scrape().await.filter(|(_, leader)| *leader == 1)
    })
    .await;
    let takeover = frozen.elapsed();
    apply_ok(plane, &ns, &resource("two", endpoint, ""));
    wait("deployment two from the new leader", || async {
        deployments.get_opt("two").await.ok().flatten()
    })
    .await;
    signal("-CONT").await;
    // Work for a leader right after the old one resumes: only the new one may do it.
    apply_ok(plane, &ns, &resource("three", endpoint, "  replicas: 2\n"));
    apply_ok(plane, &ns, &resource("one", endpoint, "  replicas: 3\n"));
    wait("deployment three", || async {
        deployments.get_opt("three").await.ok().flatten()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (after, leads) = wait("the resumed operator's metrics", || async { first.scrape().await }).await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), &ns);
    let holder = leases
        .get("changefeed-operator")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity;
    println!(
        "frozen leader: the follower led {takeover:.1?} after SIGSTOP (lease 3 s, deadline 2 s); after SIGCONT the old leader reconciled {} more times (before {before}, after {after}), leader gauge {leads}, Lease holder {holder:?}",
        after - before
    );
    assert_eq!(after, before, "the resumed old leader reconciled");
    assert_eq!(leads, 0);
    assert_eq!(holder.as_deref(), Some("second"));
    let mut first = first;
    terminate(&mut first.child).await;
    terminate(&mut second.child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_says_why_the_workers_do_not_run() {
    let Deployed {
        plane,
        ns,
        mut operator,
        deployments,
    } = deployed("truth").await;
    let client = plane.client().await;
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    let ready = |reason: &'static str| {
        let cfps = cfps.clone();
        async move {
            wait(&format!("Ready reason {reason}"), || async {
                let status = cfps.get("orders").await.ok()?.status?;
                status
                    .conditions
                    .into_iter()
                    .find(|c| c.type_ == "Ready" && c.reason == reason)
            })
            .await
        }
    };
    let deployment = deployments.get("orders").await.unwrap();
    let generation = deployment.metadata.generation.unwrap_or(1);
    let set_status = |status: serde_json::Value| {
        let (ns, plane) = (ns.clone(), plane);
        async move {
            let patch = serde_json::json!({"status": status}).to_string();
            let (ok, _, err) = plane.kubectl_run(
                &[
                    "patch",
                    "deployment",
                    "orders",
                    "-n",
                    &ns,
                    "--subresource=status",
                    "--type=merge",
                    "-p",
                    &patch,
                ],
                None,
            );
            assert!(ok, "{err}");
        }
    };
    // What the Deployment controller reports once every pod runs.
    set_status(serde_json::json!({"observedGeneration": generation, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1})).await;
    let all_ready = ready("WorkersReady").await;

    // A worker pod crash-looping, as a kubelet reports it.
    let labels = deployment.spec.unwrap().template.metadata.unwrap().labels.unwrap();
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "orders-7c9d-x1", "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "worker", "image": "cfp:test"}]},
    });
    assert!(plane.kubectl_run(&["create", "-f", "-"], Some(&pod.to_string())).0);
    let pod_status = serde_json::json!({"status": {"containerStatuses": [{
        "name": "worker", "image": "cfp:test", "imageID": "", "ready": false, "restartCount": 6,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 2m40s restarting failed container=worker"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}
    }]}});
    let (ok, _, err) = plane.kubectl_run(
        &[
            "patch",
            "pod",
            "orders-7c9d-x1",
            "-n",
            &ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            &pod_status.to_string(),
        ],
        None,
    );
    assert!(ok, "{err}");
    set_status(serde_json::json!({"observedGeneration": generation, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 0, "availableReplicas": 0})).await;
    let crash = ready("CrashLoopBackOff").await;
    assert!(
        crash.message.contains("pod orders-7c9d-x1 container worker"),
        "{}",
        crash.message
    );
    assert!(crash.message.contains("last exit code 1"), "{}", crash.message);

    // Pods refused by admission, as the Deployment controller reports it.
    set_status(serde_json::json!({"observedGeneration": generation, "replicas": 0, "updatedReplicas": 0, "readyReplicas": 0, "conditions": [{
        "type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
        "message": "pods \"orders-7c9d-x2\" is forbidden: violates PodSecurity \"restricted:latest\""
    }]})).await;
    let refused = ready("ReplicaFailure").await;
    assert!(refused.message.contains("violates PodSecurity"), "{}", refused.message);

    // The API server refuses the rendered Deployment: condition and Warning Event with its message.
    let bad = "  worker:\n    volumes:\n    - name: Bad_Volume\n      emptyDir: {}\n";
    apply_ok(plane, &ns, &resource("orders", FAKE_ENDPOINT, bad));
    let refused_apply = ready("ApplyFailed").await;
    let event = wait_event(&client, &ns, "ApplyFailed").await;
    println!(
        "status truth: {} → {}: {:?} → ReplicaFailure: {:?} → ApplyFailed: {:?} (Warning Event {:?})",
        all_ready.reason, crash.reason, crash.message, refused.message, refused_apply.message, event.type_
    );
    assert!(
        refused_apply.message.contains("Bad_Volume"),
        "{}",
        refused_apply.message
    );
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    terminate(&mut operator.child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_whose_leases_cannot_be_deleted_still_goes_away_within_the_cleanup_timeout() {
    let plane = plane().await;
    let ns = namespace(plane, "stuck-cleanup");
    let client = plane.client().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fields_that_locate_the_checkpoints_are_immutable() {
    let plane = plane().await;
    let ns = namespace(plane, "immutable");
    let endpoint = FAKE_ENDPOINT;
    apply_ok(
        plane,
        &ns,
        &resource("orders", endpoint, "  leases:\n    container: cfp-leases\n"),
    );
    let changed_container = resource("orders", endpoint, "  leases:\n    container: cfp-leases\n")
        .replace("container: items", "container: payments");
    let cases = [
        (changed_container, "monitored is immutable"),
        (
            resource(
                "orders",
                endpoint,
                "  processorName: orders-v2\n  leases:\n    container: cfp-leases\n",
            ),
            "processorName is immutable",
        ),
        (
            resource("orders", endpoint, "  leases:\n    container: other-leases\n"),
            "leases.container is immutable",
        ),
        (
            resource(
                "orders",
                endpoint,
                "  leases:\n    container: cfp-leases\n    perPartition: 4\n",
            ),
            "leases.perPartition is immutable",
        ),
        (
            resource(
                "orders",
                endpoint,
                "  leases:\n    container: cfp-leases\n  mode: AllVersionsAndDeletes\n  startFrom: Now\n",
            ),
            "mode is immutable",
        ),
    ];
    // Adding, removing and changing what locates the checkpoints, not only changing it.
    let other_account = "    connection:\n      endpoint: https://other.documents.azure.com:443/\n      keySecretRef:\n        name: cosmos\n";
    apply_ok(
        plane,
        &ns,
        &resource("payments", endpoint, "  leases:\n    database: meta\n"),
    );
    apply_ok(
        plane,
        &ns,
        &resource("refunds", endpoint, &format!("  leases:\n{other_account}")),
    );
    let located = [
        (resource("orders", endpoint, ""), "leases.container is immutable"),
        (
            resource(
                "orders",
                endpoint,
                "  leases:\n    container: cfp-leases\n    database: meta\n",
            ),
            "leases.database is immutable",
        ),
        (resource("payments", endpoint, ""), "leases.database is immutable"),
        (
            resource(
                "payments",
                endpoint,
                "  leases:\n    database: meta\n    container: added\n",
            ),
            "leases.container is immutable",
        ),
        (
            resource("payments", endpoint, "  leases:\n    database: other\n"),
            "leases.database is immutable",
        ),
        (
            resource(
                "orders",
                endpoint,
                &format!("  leases:\n    container: cfp-leases\n{other_account}"),
            ),
            "the lease account is immutable",
        ),
        (resource("refunds", endpoint, ""), "the lease account is immutable"),
        (
            resource(
                "refunds",
                endpoint,
                &format!(
                    "  leases:\n{}",
                    other_account.replace("other.documents", "third.documents")
                ),
            ),
            "the lease account is immutable",
        ),
    ];
    for (yaml, message) in cases.iter().chain(&located) {
        let (ok, _, err) = apply(plane, &ns, yaml);
        assert!(!ok && err.contains(message), "expected {message:?}: {err}");
    }
    // Naming the default explicitly moves nothing, so it is accepted.
    let (ok, _, err) = apply(
        plane,
        &ns,
        &resource(
            "orders",
            endpoint,
            "  leases:\n    container: cfp-leases\n    database: db\n",
        ),
    );
    assert!(ok, "the default lease database named explicitly: {err}");
    // Other fields still change.
    let (ok, _, err) = apply(
        plane,
        &ns,
        &resource(
            "orders",
            endpoint,
            "  leases:\n    container: cfp-leases\n  pollInterval: 1m30s\n",
        ),
    );
    assert!(ok, "{err}");
    let (ok, listed, _) = plane.kubectl_run(&["get", "changefeed", "-n", &ns], None);
    assert!(ok && listed.contains("orders"), "category changefeed: {listed}");
    let (ok, explain, _) = plane.kubectl_run(&["explain", "cfp"], None);
    assert!(
        ok && explain.contains("A ChangeFeedProcessor runs Azure Cosmos DB change feed processing"),
        "{explain}"
    );
    println!(
        "immutable: {} changes refused ({}), {} additions/removals refused; pollInterval 1m30s accepted; kubectl get changefeed lists it; kubectl explain cfp describes it",
        cases.len(),
        cases.iter().map(|(_, m)| *m).collect::<Vec<_>>().join(", "),
        located.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_account_key_appears_nowhere_it_should_not() {
    use base64::Engine;
    let plane = plane().await;
    let ns = namespace(plane, "canary");
    let client = plane.client().await;
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
async fn the_rendered_worker_pod_passes_the_restricted_pod_security_standard() {
    let Deployed {
        plane,
        ns,
        mut operator,
        deployments,
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
    apply_ok(plane, &ns, &resource("orders", FAKE_ENDPOINT, sidecar));
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
async fn workload_identity_resources_run_without_keys_and_the_operator_estimates_with_its_own_identity() {
    use crate::entra_support::TokenEndpoint;
    let plane = plane().await;
    let ns = namespace(plane, "entra");
    let client = plane.client().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_refuses_bad_values_with_messages_that_say_what_to_do() {
    let plane = plane().await;
    let ns = namespace(plane, "badvalues");
    let base = |extra: &str| resource("bad", FAKE_ENDPOINT, extra);
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "endpoint scheme",
            base("").replace(FAKE_ENDPOINT, "ftp://cosmos.example"),
            "endpoint must be an http(s) URL",
        ),
        (
            "start position",
            base("  startFrom: yesterday\n"),
            "startFrom must be Beginning, Now, or an RFC 3339 time",
        ),
        (
            "duration with words",
            base("  pollInterval: 5 seconds\n"),
            "must be a duration such as 500ms",
        ),
        (
            "zero batch size",
            base("  maxItems: 0\n"),
            "should be greater than or equal to 1",
        ),
        (
            "negative replicas",
            base("  replicas: -1\n"),
            "should be greater than or equal to 0",
        ),
        (
            "renew slower than expiry",
            base("  leaseTimings: {renewInterval: 90s, expiration: 60s}\n"),
            "leaseTimings.renewInterval must be shorter than leaseTimings.expiration",
        ),
        (
            "all versions from the beginning",
            base("  mode: AllVersionsAndDeletes\n"),
            "mode AllVersionsAndDeletes starts only from now",
        ),
        ("unknown mode", base("  mode: Everything\n"), "Unsupported value"),
        (
            "no batch in flight",
            base("  maxInFlightBatches: 0\n"),
            "should be greater than or equal to 1",
        ),
        (
            "no leases per partition",
            base("  leases: {perPartition: 0}\n"),
            "should be greater than or equal to 1",
        ),
        (
            "too many leases per partition",
            base("  leases: {perPartition: 65}\n"),
            "should be less than or equal to 64",
        ),
        (
            "autoscaling bounds upside down",
            base("  autoscaling: {enabled: true, minReplicas: 5, maxReplicas: 2}\n"),
            "autoscaling.minReplicas must not be greater than autoscaling.maxReplicas",
        ),
        (
            "Http handler without a url",
            base("  handler: {type: Http}\n"),
            "handler.http (with a url) is required",
        ),
        (
            "handler url without a scheme",
            base("  handler: {type: Http, http: {url: \"localhost:8080\"}}\n"),
            "handler.http.url must be an http:// or https:// URL",
        ),
        (
            "dead letter without a container",
            base("  handler: {onExhausted: DeadLetter}\n"),
            "handler.onExhausted DeadLetter needs deadLetter.container",
        ),
        (
            "header with value and valueFrom",
            base(
                "  handler: {type: Http, http: {url: \"http://h/\", headers: [{name: A, value: b, valueFrom: {secretKeyRef: {name: s, key: k}}}]}}\n",
            ),
            "a header needs exactly one of value and valueFrom",
        ),
        (
            "readiness path without a slash",
            base("  handler: {type: Http, http: {url: \"http://h/\", readinessPath: ready}}\n"),
            "handler.http.readinessPath must start with /",
        ),
        (
            "unknown handler type",
            base("  handler: {type: Kafka}\n"),
            "Unsupported value: \"Kafka\"",
        ),
        (
            "unknown auth mode",
            base("").replace("    keySecretRef:", "    auth: Password\n    keySecretRef:"),
            "Unsupported value: \"Password\"",
        ),
        (
            "processor name too long",
            base(&format!("  processorName: {}\n", "p".repeat(200))),
            "Too long",
        ),
    ];
    let mut refused = Vec::new();
    for (name, yaml, message) in &cases {
        let (ok, _, err) = apply(plane, &ns, yaml);
        assert!(!ok, "{name}: accepted");
        assert!(err.contains(message), "{name}: expected {message:?} in {err}");
        refused.push(*name);
    }
    apply_ok(plane, &ns, &base("  pollInterval: 1m30s\n  maxItems: 1\n"));
    println!(
        "bad values: {} refused with their messages ({}); the valid resource is accepted",
        refused.len(),
        refused.join(", ")
    );
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
    let forbidden: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("forbidden") || l.contains("Forbidden"))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_network_policy_is_applied_when_asked_and_deleted_when_turned_off() {
    let plane = plane().await;
    let ns = namespace(plane, "worker-netpol");
    let client = plane.client().await;
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
