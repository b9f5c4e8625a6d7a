//! Figure 6, the operator's half: the resident memory of a `cfp operator` process watching 10
//! `ChangeFeedProcessor` resources (10 Deployments, an estimate of each every 2 s against `cfp
//! emulator` on loopback), beside the same process watching none — on a real API server.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::{Client, CustomResourceExt};

use super::BenchError;
use super::control_plane::ControlPlane;
use super::figures::PATIENCE;
use super::processes::{Owned, cfp, emulator, free_port, rss_mib, wait_for_metric};
use super::world::wait_until;
use super::{Check, Figure};
use crate::cosmos::EMULATOR_KEY;
use crate::operator::ChangeFeedProcessor;

/// The resources the operator watches.
const RESOURCES: usize = 10;
/// Their namespace (the API server makes it itself).
pub(super) const NAMESPACE: &str = "default";

/// The operator's RSS watching none and then [`RESOURCES`] resources, with the control plane
/// from `k8s_bin` (`tools/k8s/build.sh`).
pub async fn operator_memory(k8s_bin: &Path) -> Result<Vec<Figure>, BenchError> {
    let (_emulator, endpoint) = emulator(&["bench/items:/pk:2"]).await?;
    let plane = ControlPlane::start(k8s_bin).await?;
    let client = plane.client.clone();
    install(&client).await?;
    let (operator, port) = start_operator(&plane, &endpoint, &[])?;
    let pid = operator.0.id().ok_or("the operator exited")?;
    wait_for_metric(port, "cfp_operator_leader", 1.0, PATIENCE)
        .await
        .ok_or("the operator did not become the leader")?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let watching_none = rss_mib(pid).ok_or("cannot read the operator's memory")?;

    let processors: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), NAMESPACE);
    for n in 0..RESOURCES {
        processors
            .create(
                &PostParams::default(),
                &processor(&format!("orders-{n}"), &endpoint, "2s")?,
            )
            .await
            .map_err(|e| format!("creating ChangeFeedProcessor orders-{n}: {e}"))?;
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    wait_until(PATIENCE, || {
        all_rendered_and_estimated(&processors, &deployments, RESOURCES)
    })
    .await
    .ok_or_else(|| format!("the operator did not render and estimate all {RESOURCES} resources in {PATIENCE:?}"))?;
    // Several estimate rounds of all of them after the first.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let watching_ten = rss_mib(pid).ok_or("cannot read the operator's memory")?;
    drop(operator);
    Ok(vec![
        Figure::ratio(
            "operator RSS watching 10 resources (MiB; 10 Deployments, an estimate of each every 2 s)",
            watching_ten,
            "the same operator watching none",
            watching_none,
            "≤ 40 MiB",
        )
        .against(Check::AtMost(40.0)),
    ])
}

/// The CRD (established) and the Secret with the emulator's key.
pub(super) async fn install(client: &Client) -> Result<(), BenchError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = ChangeFeedProcessor::crd();
    let name = crd.metadata.name.clone().unwrap_or_default();
    crds.create(&PostParams::default(), &crd)
        .await
        .map_err(|e| format!("creating the CRD: {e}"))?;
    let established = || async {
        crds.get_opt(&name).await.ok().flatten().is_some_and(|crd| {
            crd.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
    };
    wait_until(PATIENCE, established)
        .await
        .ok_or("the CRD was not established in time")?;
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": "cosmos" },
        "stringData": { "key": EMULATOR_KEY },
    }))?;
    Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await
        .map_err(|e| format!("creating the Secret: {e}"))?;
    Ok(())
}

/// A resource processing `bench/items` at `endpoint`, estimating every `interval`.
pub(super) fn processor(name: &str, endpoint: &str, interval: &str) -> Result<ChangeFeedProcessor, BenchError> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "changefeed.io/v1alpha1",
        "kind": "ChangeFeedProcessor",
        "metadata": { "name": name },
        "spec": {
            "connection": { "endpoint": endpoint, "keySecretRef": { "name": "cosmos" } },
            "monitored": { "database": "bench", "container": "items" },
            "autoscaling": { "estimateInterval": interval },
        },
    }))
    .map_err(|e| BenchError::from(format!("the benchmark's ChangeFeedProcessor: {e}")))
}

/// `cfp operator` for [`NAMESPACE`] against the control plane (with `extra` arguments), allowed
/// to reach the emulator at `endpoint` over plain http; the process and its metrics port.
pub(super) fn start_operator(plane: &ControlPlane, endpoint: &str, extra: &[&str]) -> Result<(Owned, u16), BenchError> {
    let port = free_port()?;
    let allowed = plane.kubeconfig.with_file_name("allowed-accounts.yaml");
    std::fs::write(
        &allowed,
        format!("- endpoint: {endpoint}\n  namespaces: [{NAMESPACE}]\n"),
    )
    .map_err(|e| format!("writing the operator's allowed accounts: {e}"))?;
    let child = cfp()?
        .args(["operator", "--namespace", NAMESPACE, "--identity", "bench"])
        .arg("--allowed-accounts")
        .arg(&allowed)
        .args(["--metrics-port", &port.to_string(), "--worker-image", "cfp:bench"])
        .args(extra)
        .env("KUBECONFIG", &plane.kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting cfp operator: {e}"))?;
    Ok((Owned(child), port))
}

/// All `resources` have their Deployment and an estimate (a lease count) in their status.
pub(super) async fn all_rendered_and_estimated(
    processors: &Api<ChangeFeedProcessor>,
    deployments: &Api<Deployment>,
    resources: usize,
) -> bool {
    let Ok(rendered) = deployments.list(&Default::default()).await else {
        return false;
    };
    let Ok(listed) = processors.list(&Default::default()).await else {
        return false;
    };
    let estimated = listed
        .items
        .iter()
        .filter(|p| p.status.as_ref().is_some_and(|s| s.leases.is_some()))
        .count();
    rendered.items.len() == resources && estimated == resources
}
