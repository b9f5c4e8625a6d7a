//! The reconciler's writes: the workload by server-side apply, the held replicas through
//! `/scale`, the finalizer, and the report (Events, then the status). Thin: what to write is
//! decided elsewhere.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType};
use kube::{Client, Resource, ResourceExt};

use super::pace::digest;
use super::publish::{Apply, Note, Report};
use super::{Context, LEASE_FINALIZER, ReconcileError};
use crate::operator::boundary::owned_objects::{self, owned_by};
use crate::operator::crd::ChangeFeedProcessor;
use crate::operator::network_policy::worker_network_policy;
use crate::operator::spec_values::ConfigProblem;
use crate::operator::status::{MAX_EVENT_NOTE, bounded};
use crate::operator::workload::{
    FIELD_MANAGER, metrics_service, with_secrets_digest, worker_deployment, worker_disruption_budget,
};

/// The workload as rendered for a number of replicas.
pub(super) struct Workload<'a> {
    /// The resource.
    pub cfp: &'a ChangeFeedProcessor,
    /// The worker image.
    pub image: &'a str,
    /// The digest of the referenced Secrets' values (rolls the pods when a key rotates).
    pub secrets_digest: Option<String>,
}

/// The workload's objects as rendered, and their digest.
pub(super) struct Rendered {
    deployment: Deployment,
    service: Service,
    budget: PodDisruptionBudget,
    /// The workers' NetworkPolicy, when the resource asks for one.
    network_policy: Option<NetworkPolicy>,
    /// The digest of the four (what [`pace::needs_apply`](super::pace::needs_apply) compares).
    pub digest: String,
}

/// Renders the worker Deployment (for `replicas`), metrics Service and PodDisruptionBudget.
pub(super) fn render(workload: Workload<'_>, replicas: i32) -> Rendered {
    let cfp = workload.cfp;
    let deployment = with_secrets_digest(
        worker_deployment(cfp, workload.image, replicas),
        workload.secrets_digest,
    );
    let (service, budget) = (metrics_service(cfp), worker_disruption_budget(cfp));
    let network_policy = worker_network_policy(cfp);
    let json = |object: serde_json::Result<serde_json::Value>| object.unwrap_or_default();
    let digest = digest(&[
        json(serde_json::to_value(&deployment)),
        json(serde_json::to_value(&service)),
        json(serde_json::to_value(&budget)),
        json(serde_json::to_value(&network_policy)),
    ]);
    Rendered {
        deployment,
        service,
        budget,
        network_policy,
        digest,
    }
}

/// Applies the rendered Deployment, metrics Service and PodDisruptionBudget; returns what became
/// of them and the Deployment as applied. A refusal by the API server (admission, validation,
/// permissions) is reported on the resource; other failures are retried.
pub(super) async fn apply_workload(
    client: &Client,
    namespace: &str,
    rendered: &Rendered,
) -> Result<(Apply, Option<Deployment>), ReconcileError> {
    match apply_objects(client, namespace, rendered).await {
        Ok(applied) => Ok((Apply::Applied, Some(applied))),
        Err(kube::Error::Api(status)) if !status.is_conflict() => {
            Ok((Apply::Refused(format!("{} ({})", status.message, status.reason)), None))
        }
        Err(error) => Err(error.into()),
    }
}

/// The problem of the first rendered object that exists under its name and is not the
/// resource's (owner `uid`): nothing is applied then.
pub(super) async fn name_conflict(
    client: &Client,
    namespace: &str,
    rendered: &Rendered,
    uid: &str,
) -> Result<Option<ConfigProblem>, kube::Error> {
    let deployment = rendered.deployment.name_any();
    let service = rendered.service.name_any();
    let budget = rendered.budget.name_any();
    if !ours::<Deployment>(client, namespace, &deployment, uid).await? {
        return Ok(Some(owned_objects::name_conflict("Deployment", &deployment)));
    }
    if !ours::<Service>(client, namespace, &service, uid).await? {
        return Ok(Some(owned_objects::name_conflict("Service", &service)));
    }
    if !ours::<PodDisruptionBudget>(client, namespace, &budget, uid).await? {
        return Ok(Some(owned_objects::name_conflict("PodDisruptionBudget", &budget)));
    }
    if let Some(policy) = &rendered.network_policy
        && !ours::<NetworkPolicy>(client, namespace, &policy.name_any(), uid).await?
    {
        return Ok(Some(owned_objects::name_conflict("NetworkPolicy", &policy.name_any())));
    }
    Ok(None)
}

/// Whether the object `name` of kind `K` is absent or the resource's (owner `uid`).
async fn ours<K>(client: &Client, namespace: &str, name: &str, uid: &str) -> Result<bool, kube::Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    Ok(api
        .get_opt(name)
        .await?
        .is_none_or(|object| owned_by(object.meta(), uid)))
}

async fn apply_objects(client: &Client, namespace: &str, rendered: &Rendered) -> Result<Deployment, kube::Error> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let name = rendered.deployment.name_any();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let applied = deployments
        .patch(&name, &params, &Patch::Apply(&rendered.deployment))
        .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let service_name = rendered.service.name_any();
    services
        .patch(&service_name, &params, &Patch::Apply(&rendered.service))
        .await?;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
    budgets
        .patch(&rendered.budget.name_any(), &params, &Patch::Apply(&rendered.budget))
        .await?;
    let uid = applied
        .owner_references()
        .first()
        .map(|o| o.uid.clone())
        .unwrap_or_default();
    apply_network_policy(client, namespace, &name, rendered.network_policy.as_ref(), &uid).await?;
    Ok(applied)
}

/// Applies the workers' NetworkPolicy, or deletes the one an earlier spec asked for — only when
/// it is the resource's (owner `uid`; the delete is conditional on that object's UID). A refused
/// delete (a NetworkPolicy that is not there, an operator not allowed to delete them) is no
/// error: a resource without one never needs the permission.
async fn apply_network_policy(
    client: &Client,
    namespace: &str,
    name: &str,
    policy: Option<&NetworkPolicy>,
    uid: &str,
) -> Result<(), kube::Error> {
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), namespace);
    if let Some(policy) = policy {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        policies.patch(name, &params, &Patch::Apply(policy)).await?;
        return Ok(());
    }
    let existing = match policies.get_opt(name).await {
        Ok(existing) => existing,
        Err(kube::Error::Api(status)) if status.code == 403 => return Ok(()),
        Err(error) => return Err(error),
    };
    let Some(existing) = existing.filter(|p| owned_by(&p.metadata, uid)) else {
        return Ok(());
    };
    let only_that_one = DeleteParams {
        preconditions: Some(Preconditions {
            uid: existing.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match policies.delete(name, &only_that_one).await {
        Ok(_) => tracing::info!(namespace, processor = name, "deleted the workers' NetworkPolicy"),
        Err(kube::Error::Api(status)) if matches!(status.code, 404 | 403 | 409) => {}
        Err(error) => return Err(error),
    }
    Ok(())
}

/// Applies the worker Deployment alone (scaling it down before the leases are deleted).
pub(super) async fn apply_deployment(
    deployments: &Api<Deployment>,
    workload: Workload<'_>,
    replicas: i32,
) -> Result<Deployment, kube::Error> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let deployment = with_secrets_digest(
        worker_deployment(workload.cfp, workload.image, replicas),
        workload.secrets_digest,
    );
    deployments
        .patch(&workload.cfp.name_any(), &params, &Patch::Apply(&deployment))
        .await
}

/// Sets the worker Deployment's replicas through its `/scale` subresource (nothing else of it).
pub(super) async fn hold_replicas(
    deployments: &Api<Deployment>,
    name: &str,
    replicas: i32,
) -> Result<Deployment, kube::Error> {
    let patch = serde_json::json!({"spec": {"replicas": replicas}});
    deployments
        .patch_scale(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    deployments.get(name).await
}

/// Adds or removes the lease-cleanup finalizer (guarded by the resource version).
pub(super) async fn set_finalizer(
    api: &Api<ChangeFeedProcessor>,
    cfp: &ChangeFeedProcessor,
    present: bool,
) -> Result<(), kube::Error> {
    let mut finalizers: Vec<String> = cfp
        .finalizers()
        .iter()
        .filter(|f| *f != LEASE_FINALIZER)
        .cloned()
        .collect();
    if present {
        finalizers.push(LEASE_FINALIZER.into());
    }
    let patch = serde_json::json!({
        "metadata": { "finalizers": finalizers, "resourceVersion": cfp.resource_version() }
    });
    api.patch(&cfp.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Publishes one Event on the resource; a failure is logged, not retried.
pub(super) async fn publish(ctx: &Context, cfp: &ChangeFeedProcessor, note: Note) {
    let event = Event {
        type_: if note.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: note.reason,
        note: Some(bounded(note.note, MAX_EVENT_NOTE)),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(error) = ctx.recorder.publish(&event, &cfp.object_ref(&())).await {
        tracing::warn!(%error, "publishing an event failed");
    }
}

/// Writes `report`: its Events, then the status when it changed.
pub(super) async fn write_report(
    ctx: &Context,
    cfps: &Api<ChangeFeedProcessor>,
    cfp: &ChangeFeedProcessor,
    report: Report,
) -> Result<(), kube::Error> {
    for note in report.events {
        publish(ctx, cfp, note).await;
    }
    if cfp.status.as_ref() == Some(&report.status) {
        return Ok(());
    }
    let body = serde_json::json!({
        "apiVersion": "changefeed.io/v1alpha1",
        "kind": "ChangeFeedProcessor",
        "status": report.status,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    cfps.patch_status(&cfp.name_any(), &params, &Patch::Apply(&body))
        .await?;
    Ok(())
}
