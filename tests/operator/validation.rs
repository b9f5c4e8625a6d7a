//! What the API server and the operator refuse, and the status that says why workers do not
//! run.

use changefeed_operator::operator::ChangeFeedProcessor;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams};

use crate::common::{lease_store, start_emulator, terminate};
use crate::operator_support::{
    Deployed, FAKE_ENDPOINT, Operator, Scene, apply, apply_ok, deployed, namespace, plane, replicas, resource,
    secret_yaml, wait, wait_event,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_resources_are_rejected_and_a_missing_secret_blocks_until_created() {
    let Scene { plane, ns, client } = Scene::new("invalid").await;
    // An account whose lease-set claim the operator can read: the workers start only then.
    let (_emulator, endpoint) = crate::common::start_emulator("db/items:/pk:2").await;
    let endpoint = endpoint.as_str();
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
async fn a_lease_halted_by_its_handler_makes_the_processor_degraded() {
    let Scene { plane, ns, client } = Scene::new("degraded").await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_says_why_the_workers_do_not_run() {
    let Deployed {
        plane,
        ns,
        mut operator,
        deployments,
        endpoint,
        emulator: _emulator,
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
    apply_ok(plane, &ns, &resource("orders", &endpoint, bad));
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
