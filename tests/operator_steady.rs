//! What the operator costs the API server when nothing changes, and estimation turned off (for
//! KEDA or an HPA): against a real kube-apiserver + etcd, `cfp operator` and `cfp emulator`.

use changefeed_operator::operator::ChangeFeedProcessor;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;

use crate::common::{start_emulator, terminate};
use crate::operator_support::{Operator, apply_ok, namespace, plane, resource, secret_yaml, wait};

const ESTIMATES: &str = "cfp_processor_estimate_duration_seconds_count";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_estimates_of_the_same_figures_write_nothing() {
    let plane = plane().await;
    let ns = namespace(plane, "steady");
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:2").await;
    let mut operator = Operator::start(plane, &ns, "op");
    apply_ok(plane, &ns, &secret_yaml());
    apply_ok(
        plane,
        &ns,
        &resource("orders", &endpoint, "  autoscaling:\n    estimateInterval: 500ms\n"),
    );
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(plane.client().await, &ns);
    let estimates_past = |at_least: f64| {
        let operator = &operator;
        async move {
            let count = operator.metric(ESTIMATES).await?;
            (count >= at_least).then_some(count)
        }
    };
    // Settled: a few estimates after the first, all of the same (empty) container.
    wait("the status with an estimate", || async {
        cfps.get("orders").await.ok()?.status?.leases
    })
    .await;
    let settled = wait("three estimates", || estimates_past(3.0)).await;
    let before = cfps.get("orders").await.unwrap();
    wait("four more estimates", || estimates_past(settled + 4.0)).await;
    let after = cfps.get("orders").await.unwrap();
    println!(
        "after 4 more estimates of the same figures: resourceVersion {:?} → {:?}, lastEstimateTime {:?} → {:?}",
        before.metadata.resource_version,
        after.metadata.resource_version,
        before.status.as_ref().and_then(|s| s.last_estimate_time.clone()),
        after.status.as_ref().and_then(|s| s.last_estimate_time.clone()),
    );
    assert_eq!(
        before.metadata.resource_version, after.metadata.resource_version,
        "no status write for the same figures"
    );
    terminate(&mut operator.child).await;
    terminate(&mut emulator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_estimation_disabled_the_workers_run_and_nothing_is_estimated() {
    let plane = plane().await;
    let ns = namespace(plane, "no-estimate");
    let (mut emulator, endpoint) = start_emulator("db/items:/pk:2").await;
    let mut operator = Operator::start(plane, &ns, "op");
    apply_ok(plane, &ns, &secret_yaml());
    let disabled = "  replicas: 2\n  autoscaling:\n    estimation: Disabled\n    estimateInterval: 500ms\n";
    apply_ok(plane, &ns, &resource("orders", &endpoint, disabled));
    let client = plane.client().await;
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(client, &ns);
    wait("the Deployment of 2 workers", || async {
        let spec = deployments.get("orders").await.ok()?.spec?;
        (spec.replicas == Some(2)).then_some(())
    })
    .await;
    let status = wait("a status", || async {
        let status = cfps.get("orders").await.ok()?.status?;
        status.observed_generation.map(|_| status)
    })
    .await;
    // Over many estimate intervals (500 ms), still no estimate and no lag series.
    let mut status = status;
    for _ in 0..15 {
        status = cfps.get("orders").await.ok().and_then(|c| c.status).unwrap_or(status);
        assert!(
            status.leases.is_none() && status.last_estimate_time.is_none(),
            "{status:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let lag_series = operator.metric("cfp_processor_estimated_lag{").await;
    println!(
        "estimation Disabled: leases {:?}, lag {:?}, lastEstimateTime {:?}, lag series {lag_series:?}",
        status.leases, status.estimated_lag, status.last_estimate_time
    );
    assert!(lag_series.is_none());

    // Built-in autoscaling needs an estimate: the configuration says so.
    let contradicting = "  autoscaling:\n    enabled: true\n    estimation: Disabled\n";
    apply_ok(plane, &ns, &resource("orders", &endpoint, contradicting));
    let condition = wait("ConfigValid=False", || async {
        let status = cfps.get("orders").await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "ConfigValid" && c.status == "False")
    })
    .await;
    println!(
        "enabled with estimation Disabled: {} — {}",
        condition.reason, condition.message
    );
    assert!(
        condition.message.contains("autoscaling.estimation"),
        "{}",
        condition.message
    );
    terminate(&mut operator.child).await;
    terminate(&mut emulator).await;
}
