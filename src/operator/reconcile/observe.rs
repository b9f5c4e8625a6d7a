//! The reconciler's reads: the referenced Secrets, the configuration check, the
//! HorizontalPodAutoscalers on `/scale` and the worker pods that cannot run. Thin: what the
//! answers mean is decided elsewhere.

use std::collections::BTreeMap;

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::super::config::{self, ConfigProblem};
use super::super::crd::ChangeFeedProcessor;
use super::super::external::ExternalAutoscaler;
use super::super::pause::{self, Pause};
use super::super::workload::selector_string;
use super::report::PodProblem;

/// The Secrets `cfp` references that exist, by name.
pub(super) async fn found_secrets(
    secrets: &Api<Secret>,
    cfp: &ChangeFeedProcessor,
) -> Result<BTreeMap<String, Secret>, kube::Error> {
    let mut found = BTreeMap::new();
    for secret in config::referenced_secrets(cfp) {
        if let Some(found_secret) = secrets.get_opt(&secret).await? {
            found.insert(secret, found_secret);
        }
    }
    Ok(found)
}

/// The configuration problem (the spec, the Secrets, the pause annotations), if any, and the
/// pause when the annotations are valid.
pub(super) fn configuration(
    cfp: &ChangeFeedProcessor,
    found: &BTreeMap<String, Secret>,
) -> (Option<ConfigProblem>, Option<Pause>) {
    let pause = pause::pause_of(cfp.annotations());
    let problem = config::check(cfp, |name| found.get(name).cloned()).err().or_else(|| {
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
    let list = hpas.list(&ListParams::default()).await.inspect_err(|error| {
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
            acted: hpa
                .status
                .as_ref()
                .is_some_and(|s| s.last_scale_time.is_some() || s.observed_generation.is_some()),
            name: hpa.name_any(),
        }))
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
    let list = match pods.list(&ListParams::default().labels(&selector_string(cfp))).await {
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
            return Some((
                pod.metadata.name.clone().unwrap_or_default(),
                container.name,
                waiting.reason.unwrap_or_default(),
                format!("{}{last_exit}", waiting.message.unwrap_or_default()),
            ));
        }
    }
    None
}
