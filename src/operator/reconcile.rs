//! Reconciling a `ChangeFeedProcessor`: check its configuration, apply the worker Deployment and
//! metrics Service with server-side apply, report status and Events, and clean up leases on
//! deletion when asked.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};

use super::config::{self, ConfigProblem};
use super::crd::{ChangeFeedProcessor, ChangeFeedProcessorStatus, Connection};
use super::metrics::OperatorMetrics;
use super::status::{Observation, conditions};
use super::workload::{FIELD_MANAGER, metrics_service, selector_string, worker_deployment};

/// The finalizer that deletes a processor's lease documents before the resource goes away.
pub const LEASE_FINALIZER: &str = "changefeed.io/lease-cleanup";

/// What reconciliations share.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// Publishes Events.
    pub recorder: Recorder,
    /// The default worker image.
    pub worker_image: String,
    /// Reconcile metrics.
    pub metrics: Arc<OperatorMetrics>,
}

/// Why a reconciliation failed (it is retried).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Deleting the lease documents failed.
    #[error("deleting lease documents: {0}")]
    LeaseCleanup(String),
    /// The resource has no namespace or name.
    #[error("the resource has no namespace or name")]
    Unnamed,
}

impl ReconcileError {
    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ReconcileError::Kube(kube::Error::Api(status)) if status.is_conflict() => "conflict",
            ReconcileError::Kube(_) => "kubernetes_api",
            ReconcileError::LeaseCleanup(_) => "lease_cleanup",
            ReconcileError::Unnamed => "unnamed",
        }
    }
}

/// Reconciles one resource.
pub async fn reconcile(cfp: Arc<ChangeFeedProcessor>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    let result = reconcile_inner(&cfp, &ctx).await;
    ctx.metrics
        .observe(started.elapsed(), result.as_ref().err().map(ReconcileError::reason));
    result
}

/// After a failure: retry soon.
pub fn error_policy(cfp: Arc<ChangeFeedProcessor>, error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(processor = %cfp.name_any(), namespace = ?cfp.namespace(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(10))
}

async fn reconcile_inner(cfp: &ChangeFeedProcessor, ctx: &Context) -> Result<Action, ReconcileError> {
    let namespace = cfp.namespace().ok_or(ReconcileError::Unnamed)?;
    let name = cfp.metadata.name.clone().ok_or(ReconcileError::Unnamed)?;
    let client = ctx.client.clone();
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);

    let mut found: BTreeMap<String, Secret> = BTreeMap::new();
    for secret in config::referenced_secrets(cfp) {
        if let Some(found_secret) = secrets.get_opt(&secret).await? {
            found.insert(secret, found_secret);
        }
    }

    if cfp.metadata.deletion_timestamp.is_some() {
        if cfp.finalizers().iter().any(|f| f == LEASE_FINALIZER) {
            let deleted = delete_leases(cfp, &found).await;
            match deleted {
                Ok(count) => {
                    publish(
                        ctx,
                        cfp,
                        EventType::Normal,
                        "LeasesDeleted",
                        format!("deleted {count} lease documents"),
                    )
                    .await;
                    set_finalizer(&cfps, cfp, false).await?;
                }
                Err(message) => {
                    publish(ctx, cfp, EventType::Warning, "LeaseCleanupFailed", message.clone()).await;
                    return Err(ReconcileError::LeaseCleanup(message));
                }
            }
        }
        return Ok(Action::await_change());
    }
    let wants_finalizer = cfp.spec.leases.delete_on_resource_deletion;
    if wants_finalizer != cfp.finalizers().iter().any(|f| f == LEASE_FINALIZER) {
        set_finalizer(&cfps, cfp, wants_finalizer).await?;
    }

    let problem = config::check(cfp, |name| found.get(name).cloned()).err();
    let existing = deployments.get_opt(&name).await?;
    let desired = cfp.spec.replicas;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let deployment = match &problem {
        None => {
            let rendered = worker_deployment(cfp, &ctx.worker_image, desired);
            let applied = deployments.patch(&name, &params, &Patch::Apply(&rendered)).await?;
            let service = metrics_service(cfp);
            let service_name = service.metadata.name.clone().unwrap_or_default();
            services.patch(&service_name, &params, &Patch::Apply(&service)).await?;
            let before = existing.as_ref().and_then(|d| d.spec.as_ref()).and_then(|s| s.replicas);
            match before {
                None => {
                    publish(
                        ctx,
                        cfp,
                        EventType::Normal,
                        "Deployed",
                        format!("deployed {desired} worker pod(s)"),
                    )
                    .await
                }
                Some(before) if before != desired => {
                    publish(
                        ctx,
                        cfp,
                        EventType::Normal,
                        "Scaled",
                        format!("scaled workers from {before} to {desired}"),
                    )
                    .await
                }
                Some(_) => {}
            }
            Some(applied)
        }
        Some(ConfigProblem { reason, message }) => {
            publish(ctx, cfp, EventType::Warning, reason, message.clone()).await;
            existing
        }
    };

    let deployed = deployment.is_some();
    let deployment_status = deployment.and_then(|d| d.status);
    let observation = Observation {
        problem: problem.clone(),
        deployed,
        desired,
        ready: deployment_status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0),
    };
    let previous = cfp.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let status = ChangeFeedProcessorStatus {
        observed_generation: cfp.metadata.generation,
        replicas: deployment_status.as_ref().and_then(|s| s.replicas).unwrap_or(0),
        ready_replicas: observation.ready,
        selector: selector_string(cfp),
        conditions: conditions(
            &observation,
            &previous,
            cfp.metadata.generation,
            Time(k8s_openapi::jiff::Timestamp::now()),
        ),
    };
    if cfp.status.as_ref() != Some(&status) {
        let body = serde_json::json!({
            "apiVersion": "changefeed.io/v1alpha1",
            "kind": "ChangeFeedProcessor",
            "status": status,
        });
        cfps.patch_status(&name, &params, &Patch::Apply(&body)).await?;
    }
    Ok(match problem {
        Some(_) => Action::requeue(Duration::from_secs(60)),
        None => Action::requeue(Duration::from_secs(300)),
    })
}

async fn publish(ctx: &Context, cfp: &ChangeFeedProcessor, kind: EventType, reason: &str, note: String) {
    let event = Event {
        type_: kind,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(error) = ctx.recorder.publish(&event, &cfp.object_ref(&())).await {
        tracing::warn!(%error, "publishing an event failed");
    }
}

async fn set_finalizer(
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

fn secret_value(found: &BTreeMap<String, Secret>, connection: &Connection) -> Result<String, String> {
    let reference = &connection.key_secret_ref;
    found
        .get(&reference.name)
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get(&reference.key))
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        .ok_or_else(|| {
            format!(
                "Secret {:?} key {:?} is needed to delete the leases",
                reference.name, reference.key
            )
        })
}

/// Deletes every document of the processor in its lease container; returns how many.
async fn delete_leases(cfp: &ChangeFeedProcessor, found: &BTreeMap<String, Secret>) -> Result<usize, String> {
    use crate::cosmos::CosmosAccount;
    let spec = &cfp.spec;
    let key = secret_value(found, &spec.connection)?;
    let account = CosmosAccount::connect(&spec.connection.endpoint, &key)
        .await
        .map_err(|e| e.to_string())?;
    let lease_account = match &spec.leases.connection {
        Some(connection) => {
            let key = secret_value(found, connection)?;
            CosmosAccount::connect(&connection.endpoint, &key)
                .await
                .map_err(|e| e.to_string())?
        }
        None => account.clone(),
    };
    let settings = crate::worker::WorkerSettings {
        database: spec.monitored.database.clone(),
        container: spec.monitored.container.clone(),
        lease_database: spec.lease_database(),
        lease_container: spec.lease_container(),
        create_leases: false,
        options: crate::processor::ProcessorOptions::new(cfp.processor_name(), "changefeed-operator"),
    };
    match crate::worker::open(&account, &lease_account, &settings).await {
        Ok((_, store)) => store.delete_all().await.map_err(|e| e.to_string()),
        // Nothing to clean up when the containers are gone.
        Err(crate::worker::WorkerError::LeasesMissing(_) | crate::worker::WorkerError::MonitoredMissing(_)) => Ok(0),
        Err(error) => Err(error.to_string()),
    }
}
