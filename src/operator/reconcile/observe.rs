//! The reconciler's reads: the referenced Secrets, the configuration check, the
//! HorizontalPodAutoscalers on `/scale` and the worker pods that cannot run. Thin: what the
//! answers mean is decided elsewhere.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::reflector::{ObjectRef, Store};

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, GetParams, ListParams};
use kube::{Client, ResourceExt};

use super::target::reachable;
use crate::operator::boundary::accounts::{AllowListFile, NotAllowed};
use crate::operator::config;
use crate::operator::crd::ChangeFeedProcessor;
use crate::operator::scaling::estimates::ResourceKey;
use crate::operator::scaling::external::ExternalAutoscaler;
use crate::operator::scaling::pause::{self, Pause};
use crate::operator::spec_values::ConfigProblem;
use crate::operator::status::PodProblem;
use crate::operator::workload::selector_string;

/// The Secrets `cfp` references that exist, by name (from the API server's watch cache).
pub(super) async fn found_secrets(
    secrets: &Api<Secret>,
    cfp: &ChangeFeedProcessor,
) -> Result<BTreeMap<String, Secret>, kube::Error> {
    let mut found = BTreeMap::new();
    for secret in config::referenced_secrets(cfp) {
        match secrets.get_with(&secret, &GetParams::any()).await {
            Ok(found_secret) => {
                found.insert(secret, found_secret);
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error),
        }
    }
    Ok(found)
}

/// How long a reconciliation waits for the Deployments' watch to have listed them once.
const CACHE_READY: Duration = Duration::from_secs(10);

/// The worker Deployment of `key`, from the watch's cache (read from the API server's cache
/// while the watch has not listed yet).
pub(super) async fn deployment(
    cache: &Store<Deployment>,
    client: &Client,
    key: &ResourceKey,
) -> Result<Option<Deployment>, kube::Error> {
    if tokio::time::timeout(CACHE_READY, cache.wait_until_ready())
        .await
        .is_ok_and(|r| r.is_ok())
    {
        let object = ObjectRef::<Deployment>::new(&key.name).within(&key.namespace);
        return Ok(cache.get(&object).map(|d| (*d).clone()));
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &key.namespace);
    match deployments.get_with(&key.name, &GetParams::any()).await {
        Ok(deployment) => Ok(Some(deployment)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(error) => Err(error),
    }
}

/// The configuration problem (the spec, the Secrets, the accounts the admin allows, the pause
/// annotations), if any, and the
/// pause when the annotations are valid.
pub(super) fn configuration(
    cfp: &ChangeFeedProcessor,
    found: &BTreeMap<String, Secret>,
    allowed: &AllowListFile,
) -> (Option<ConfigProblem>, Option<Pause>) {
    let pause = pause::pause_of(cfp.annotations());
    let not_allowed = |why: NotAllowed| ConfigProblem {
        reason: "AccountNotAllowed",
        message: why.to_string(),
    };
    let problem = config::check(cfp, |name| found.get(name).cloned()).err();
    let problem = problem.or_else(|| reachable(cfp, allowed).err().map(not_allowed));
    let problem = problem.or_else(|| {
        let message = pause.as_ref().err()?.to_string();
        Some(ConfigProblem {
            reason: "InvalidAnnotation",
            message,
        })
    });
    (problem, pause.ok().flatten())
}

/// The HorizontalPodAutoscaler that targets the resource's `/scale`, if any; an error when they
/// cannot be listed.
pub(super) async fn external_autoscaler(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<ExternalAutoscaler>, kube::Error> {
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), namespace);
    let list = hpas
        .list(&ListParams::default().match_any())
        .await
        .inspect_err(|error| {
            tracing::warn!(namespace, %error, "listing HorizontalPodAutoscalers failed; holding the replicas");
        })?;
    Ok(list
        .items
        .into_iter()
        .find(|hpa| {
            hpa.spec.as_ref().is_some_and(|spec| {
                let target = &spec.scale_target_ref;
                target.kind == "ChangeFeedProcessor"
                    && target.name == name
                    && target
                        .api_version
                        .as_deref()
                        .is_none_or(|v| v.starts_with("changefeed.io/"))
            })
        })
        .map(|hpa| ExternalAutoscaler {
            keda: made_by_keda(&hpa),
            acted: hpa
                .status
                .as_ref()
                .is_some_and(|s| s.last_scale_time.is_some() || s.observed_generation.is_some()),
            name: hpa.name_any(),
        }))
}

/// Whether KEDA made `hpa` for a ScaledObject: owned by one, or labelled with its name as KEDA
/// labels the HPAs it makes.
fn made_by_keda(hpa: &HorizontalPodAutoscaler) -> bool {
    let owned = hpa
        .owner_references()
        .iter()
        .any(|o| o.kind == "ScaledObject" && o.api_version.starts_with("keda.sh/"));
    owned || hpa.labels().contains_key("scaledobject.keda.sh/name")
}

/// Container states that keep a worker pod from running, as kubelets report them.
const POD_PROBLEMS: [&str; 7] = [
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "InvalidImageName",
    "RunContainerError",
];

/// The first worker pod whose container cannot run.
pub(super) async fn pod_problem(client: &Client, namespace: &str, cfp: &ChangeFeedProcessor) -> Option<PodProblem> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let list = match pods
        .list(&ListParams::default().match_any().labels(&selector_string(cfp)))
        .await
    {
        Ok(list) => list,
        Err(error) => {
            tracing::debug!(%error, "listing worker pods failed");
            return None;
        }
    };
    list.items.into_iter().find_map(problem_of)
}

/// The first container of `pod` waiting in one of the [`POD_PROBLEMS`], with its last exit.
fn problem_of(pod: Pod) -> Option<PodProblem> {
    let statuses = pod.status.and_then(|s| s.container_statuses).unwrap_or_default();
    for container in statuses {
        let waiting = container.state.and_then(|s| s.waiting);
        if let Some(waiting) = waiting.filter(|w| w.reason.as_deref().is_some_and(|r| POD_PROBLEMS.contains(&r))) {
            let last_exit = container
                .last_state
                .and_then(|s| s.terminated)
                .map(|t| {
                    format!(
                        " (last exit code {}{})",
                        t.exit_code,
                        t.reason.map(|r| format!(", {r}")).unwrap_or_default()
                    )
                })
                .unwrap_or_default();
            return Some(PodProblem {
                pod: pod.metadata.name.clone().unwrap_or_default(),
                container: container.name,
                reason: waiting.reason.unwrap_or_default(),
                message: format!("{}{last_exit}", waiting.message.unwrap_or_default()),
            });
        }
    }
    None
}

/// Whether a worker pod can still run a worker: not ended (`Failed` or `Succeeded`, as evicted
/// pods and pods of a shut-down node stay until pod garbage collection). A terminating pod can.
pub(crate) fn can_still_run(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Failed" | "Succeeded"))
}

/// The names of `cfp`'s worker pods that can still run (what a rewind or a lease cleanup waits
/// for).
pub(crate) async fn runnable_worker_pods(
    client: &Client,
    namespace: &str,
    cfp: &ChangeFeedProcessor,
) -> kube::Result<Vec<String>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let listed = pods.list(&ListParams::default().labels(&selector_string(cfp))).await?;
    Ok(listed
        .items
        .iter()
        .filter(|p| can_still_run(p))
        .map(|p| p.name_any())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pods_that_ended_cannot_run() {
        let pod = |phase: Option<&str>, terminating: bool| {
            let mut pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "w"},
                "status": phase.map(|p| serde_json::json!({"phase": p})),
            }))
            .expect("a pod");
            if terminating {
                pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
            }
            pod
        };
        let cases = [
            (None, false, true),
            (Some("Pending"), false, true),
            (Some("Running"), false, true),
            (Some("Running"), true, true),
            (Some("Unknown"), false, true),
            (Some("Failed"), false, false),
            (Some("Succeeded"), false, false),
        ];
        for (phase, terminating, can) in cases {
            assert_eq!(
                can_still_run(&pod(phase, terminating)),
                can,
                "{phase:?}, terminating {terminating}"
            );
        }
    }
}
