//! Reconciling a `ChangeFeedProcessor`: check its configuration, apply the worker Deployment and
//! metrics Service with server-side apply, report status and Events, and clean up leases on
//! deletion when asked.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};

use super::autoscale::{Decision, Observed, ScaleHistory, ScalingReason};
use super::config::{self, ConfigProblem};
use super::crd::{ChangeFeedProcessor, ChangeFeedProcessorStatus, Connection};
use super::estimation::{AccountRef, EstimateReport, EstimateTarget, Estimators, ResourceKey};
use super::external::{ExternalAutoscaler, external_plan};
use super::metrics::OperatorMetrics;
use super::status::{
    DEGRADED, EstimateProblem, MAX_EVENT_NOTE, Observation, Rollout, SCALING, ScalingState, bounded, conditions,
    ready_problem_event,
};
use super::workload::{
    FIELD_MANAGER, metrics_service, selector_string, with_secrets_digest, worker_deployment, worker_disruption_budget,
};
use crate::cosmos::AccountAuth;
use crate::cosmos::AuthMethod;

/// The finalizer that deletes a processor's lease documents before the resource goes away.
pub const LEASE_FINALIZER: &str = "changefeed.io/lease-cleanup";

/// What reconciliations share (one leadership term).
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// Publishes Events.
    pub recorder: Recorder,
    /// The default worker image.
    pub worker_image: String,
    /// Reconcile and processor metrics.
    pub metrics: Arc<OperatorMetrics>,
    /// The remaining-work estimates, one task per resource.
    pub estimators: Estimators,
    /// The autoscaler's memory per resource (recent recommendations, last decision).
    pub scaling: Mutex<HashMap<ResourceKey, ScaleState>>,
    /// Whether this replica may act now (it leads, with a renewal inside the deadline).
    pub leading: Arc<dyn Fn() -> bool + Send + Sync>,
}

/// The autoscaler's memory of one resource.
#[derive(Default)]
pub struct ScaleState {
    history: ScaleHistory,
    decided_seq: u64,
    decision: Option<Decision>,
    /// When this operator last changed the replicas (the cached status may not show it yet).
    last_scale_time: Option<Time>,
}

/// Why a reconciliation failed (it is retried).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
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
            ReconcileError::Unnamed => "unnamed",
        }
    }
}

/// Reconciles one resource.
pub async fn reconcile(cfp: Arc<ChangeFeedProcessor>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    if !(ctx.leading)() {
        // Not (or no longer) the leader: the controller is being stopped; touch nothing.
        return Ok(Action::await_change());
    }
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

    let mut found: BTreeMap<String, Secret> = BTreeMap::new();
    for secret in config::referenced_secrets(cfp) {
        if let Some(found_secret) = secrets.get_opt(&secret).await? {
            found.insert(secret, found_secret);
        }
    }

    let key: ResourceKey = (namespace.clone(), name.clone());
    if cfp.metadata.deletion_timestamp.is_some() {
        ctx.estimators.stop(&key);
        if let Ok(mut scaling) = ctx.scaling.lock() {
            scaling.remove(&key);
        }
        if cfp.finalizers().iter().any(|f| f == LEASE_FINALIZER) {
            return clean_up(ctx, cfp, &cfps, &found).await;
        }
        return Ok(Action::await_change());
    }
    let wants_finalizer = cfp.spec.leases.delete_on_resource_deletion;
    if wants_finalizer != cfp.finalizers().iter().any(|f| f == LEASE_FINALIZER) {
        set_finalizer(&cfps, cfp, wants_finalizer).await?;
    }

    let pause = super::pause::pause_of(cfp.annotations());
    let problem = config::check(cfp, |name| found.get(name).cloned()).err().or_else(|| {
        let message = pause.as_ref().err()?.clone();
        Some(ConfigProblem {
            reason: "InvalidAnnotation",
            message,
        })
    });
    let paused = pause.ok().flatten();
    let existing = deployments.get_opt(&name).await?;
    let before = existing.as_ref().and_then(|d| d.spec.as_ref()).and_then(|s| s.replicas);
    let previous = cfp.status.clone().unwrap_or_default();
    let mut report = None;
    let plan = match &problem {
        Some(_) => {
            // Nothing to estimate with; the existing workload (if any) stays as it is.
            ctx.estimators.stop(&key);
            None
        }
        None => {
            match estimate_target(cfp, &found) {
                Ok(target) => ctx.estimators.ensure(&key, target),
                Err(message) => tracing::warn!(namespace, processor = name, %message, "cannot estimate"),
            }
            report = ctx.estimators.report(&key);
            match paused {
                // Nothing is applied while paused: the plan names no replicas.
                Some(pause) => Some(paused_plan(pause, before)),
                None => Some(plan_replicas(ctx, cfp, &key, before, report.as_ref()).await),
            }
        }
    };
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let desired = plan.as_ref().and_then(|p| p.replicas);
    let mut apply_failure = None;
    let deployment = match (&problem, desired) {
        (None, Some(desired)) => {
            let digest = config::secrets_digest(cfp, &found);
            match apply_workload(&client, &namespace, cfp, &ctx.worker_image, desired, digest).await {
                Ok(applied) => {
                    let event = plan.as_ref().and_then(|p| p.event.clone());
                    if before.is_none() {
                        let note = format!("deployed {desired} worker pod(s)");
                        publish(ctx, cfp, EventType::Normal, "Deployed", note).await;
                    }
                    match (before, event) {
                        (_, Some((reason, note))) => publish(ctx, cfp, EventType::Normal, reason, note).await,
                        (Some(before), None) if before != desired => {
                            let note = format!("scaled workers from {before} to {desired}");
                            publish(ctx, cfp, EventType::Normal, "Scaled", note).await
                        }
                        _ => {}
                    }
                    Some(applied)
                }
                // The API server refused what was rendered (admission, validation, permissions):
                // say so on the resource instead of only in the operator's log.
                Err(kube::Error::Api(status)) if !status.is_conflict() => {
                    let message = format!("{} ({})", status.message, status.reason);
                    publish(ctx, cfp, EventType::Warning, "ApplyFailed", message.clone()).await;
                    apply_failure = Some(message);
                    existing
                }
                Err(error) => return Err(error.into()),
            }
        }
        // Autoscaling waits for its first estimate before it creates the workers.
        (None, None) => existing,
        (Some(ConfigProblem { reason, message }), _) => {
            publish(ctx, cfp, EventType::Warning, reason, message.clone()).await;
            existing
        }
    };
    let mut deployment = deployment;
    if let (Some(super::pause::Pause { replicas: Some(held) }), Some(current)) = (paused, before)
        && held != current
    {
        deployment = Some(hold_replicas(&deployments, &name, held).await?);
        publish(
            ctx,
            cfp,
            EventType::Normal,
            "Scaled",
            format!("scaled workers from {current} to {held} (paused at {held} replicas)"),
        )
        .await;
    }
    let scaling = plan.map(|p| p.scaling);
    let previous_scaling = previous.conditions.iter().find(|c| c.type_ == SCALING);
    match (&scaling, previous_scaling) {
        (Some(now), before) if now.reason == "Paused" && before.is_none_or(|c| c.reason != "Paused") => {
            publish(ctx, cfp, EventType::Normal, "Paused", now.message.clone()).await;
        }
        (Some(now), Some(before)) if now.reason != "Paused" && before.reason == "Paused" => {
            let note = "resumed: the operator scales and applies the workload again".to_owned();
            publish(ctx, cfp, EventType::Normal, "Resumed", note).await;
        }
        _ => {}
    }
    let mut estimate_failed_published = false;
    if let Some(state) = &scaling
        && state.reason == ScalingReason::EstimateFailed.as_str()
        && previous_scaling.is_none_or(|c| c.reason != state.reason)
    {
        publish(ctx, cfp, EventType::Warning, "EstimateFailed", state.message.clone()).await;
        estimate_failed_published = true;
    }

    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut rollout = rollout_of(deployment.as_ref());
    rollout.apply_failure = apply_failure;
    let deployed = deployment.is_some();
    let applied_replicas = deployment
        .as_ref()
        .and_then(|d| d.spec.as_ref())
        .and_then(|s| s.replicas);
    let deployment_status = deployment.and_then(|d| d.status);
    // While paused, the workers asked for are the ones held.
    if let Some(replicas) = desired.or_else(|| paused.and(applied_replicas)) {
        ctx.metrics.desired_replicas(&namespace, &name, replicas);
    }
    ctx.metrics.paused(&namespace, &name, paused.is_some());
    let observation = Observation {
        problem: problem.clone(),
        deployed,
        desired: desired.or(applied_replicas).unwrap_or(1),
        ready: deployment_status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0),
        scaling,
        rollout,
        estimate_failure: report
            .as_ref()
            .and_then(|r| r.outcome.as_ref().err())
            .map(|failure| EstimateProblem {
                setup: failure.setup,
                message: failure.message.clone(),
            }),
        failing_leases: report.as_ref().and_then(|r| r.outcome.as_ref().ok()).map(|estimate| {
            estimate
                .leases
                .iter()
                .filter_map(|l| Some((l.lease_token.clone(), l.handler_failing.clone()?)))
                .collect()
        }),
    };
    let mut observation = observation;
    if observation.deployed && observation.ready < observation.desired {
        observation.rollout.pod_problem = pod_problem(&client, &namespace, cfp).await;
    }
    let failing_now = observation.failing_leases.as_ref().is_some_and(|f| !f.is_empty());
    let failing_before = previous
        .conditions
        .iter()
        .any(|c| c.type_ == DEGRADED && c.reason == "HandlerFailing");
    let mut status = ChangeFeedProcessorStatus {
        observed_generation: cfp.metadata.generation,
        replicas: deployment_status.as_ref().and_then(|s| s.replicas).unwrap_or(0),
        ready_replicas: observation.ready,
        selector: selector_string(cfp),
        desired_replicas: desired.or(applied_replicas),
        last_scale_time: last_scale_time(ctx, &key, before, desired, &now).or_else(|| previous.last_scale_time.clone()),
        conditions: conditions(&observation, &previous.conditions, cfp.metadata.generation, now),
        ..previous.clone()
    };
    if let Some(EstimateReport {
        time,
        outcome: Ok(estimate),
        ..
    }) = &report
    {
        status.leases = Some(i32::try_from(estimate.lease_count).unwrap_or(i32::MAX));
        status.leases_with_lag = Some(i32::try_from(estimate.leases_with_lag).unwrap_or(i32::MAX));
        status.estimated_lag = Some(i64::try_from(estimate.total_lag).unwrap_or(i64::MAX));
        status.last_estimate_time = Some(time.clone());
        status.instances = instances(estimate);
    }
    if let Some((reason, note)) = ready_problem_event(&previous.conditions, &status.conditions)
        && !(reason == "EstimateFailed" && estimate_failed_published)
    {
        publish(ctx, cfp, EventType::Warning, &reason, note).await;
    }
    if failing_now
        && !failing_before
        && let Some(condition) = status.conditions.iter().find(|c| c.type_ == DEGRADED)
    {
        publish(
            ctx,
            cfp,
            EventType::Warning,
            "HandlerFailing",
            condition.message.clone(),
        )
        .await;
    }
    let ready = status
        .conditions
        .iter()
        .any(|c| c.type_ == super::status::READY && c.status == "True");
    ctx.metrics.ready(&namespace, &name, ready);
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

/// Deleting a resource whose leases must go: scale the workers to zero and wait until their pods
/// are gone (so nothing writes a lease back), delete the leases, then drop the finalizer. Failures
/// are retried until `leases.cleanupTimeout` after the deletion began; then the finalizer is
/// dropped anyway with a Warning Event naming what was left behind.
async fn clean_up(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    cfps: &Api<ChangeFeedProcessor>,
    found: &BTreeMap<String, Secret>,
) -> Result<Action, ReconcileError> {
    let namespace = cfp.namespace().ok_or(ReconcileError::Unnamed)?;
    let name = cfp.name_any();
    let timeout = humantime::parse_duration(&cfp.spec.leases.cleanup_timeout).unwrap_or(Duration::from_secs(300));
    let since = cfp
        .metadata
        .deletion_timestamp
        .as_ref()
        .map(|t| k8s_openapi::jiff::Timestamp::now().duration_since(t.0))
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default();
    let give_up = |what: String, at_once: bool| async move {
        let when = if at_once {
            "at once".to_owned()
        } else {
            format!("after {} (leases.cleanupTimeout)", humantime::format_duration(timeout))
        };
        let note = format!(
            "gave up {when}: {what}; the lease documents of processor {:?} may be left in the lease container",
            cfp.processor_name()
        );
        publish(ctx, cfp, EventType::Warning, "LeaseCleanupAbandoned", note).await;
        set_finalizer(cfps, cfp, false).await?;
        Ok(Action::await_change())
    };
    // 1. No worker may write a lease back: scale to zero and wait for the pods to go.
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    if let Some(deployment) = deployments.get_opt(&name).await?
        && deployment.spec.as_ref().and_then(|s| s.replicas) != Some(0)
    {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        deployments
            .patch(
                &name,
                &params,
                &Patch::Apply(&with_secrets_digest(
                    worker_deployment(cfp, &ctx.worker_image, 0),
                    config::secrets_digest(cfp, found),
                )),
            )
            .await?;
        publish(
            ctx,
            cfp,
            EventType::Normal,
            "ScaledDown",
            "scaled the workers to 0 before deleting the leases".into(),
        )
        .await;
    }
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let running = pods
        .list(&ListParams::default().labels(&selector_string(cfp)))
        .await?
        .items
        .len();
    if running > 0 {
        if since >= timeout {
            return give_up(format!("{running} worker pod(s) still exist"), false).await;
        }
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    // 2. Delete the leases. A credential whose Secret is gone cannot come back while the resource
    //    is deleted (a namespace deletion removes Secrets first): no waiting for it.
    if let Err(message) = estimate_target(cfp, found) {
        return give_up(format!("{message} to reach the leases and it is gone"), true).await;
    }
    match delete_leases(ctx, cfp, found).await {
        Ok(count) => {
            publish(
                ctx,
                cfp,
                EventType::Normal,
                "LeasesDeleted",
                format!("deleted {count} lease documents"),
            )
            .await;
            set_finalizer(cfps, cfp, false).await?;
            Ok(Action::await_change())
        }
        Err(message) if since >= timeout => give_up(format!("deleting the leases failed: {message}"), false).await,
        Err(message) => {
            publish(
                ctx,
                cfp,
                EventType::Warning,
                "LeaseCleanupFailed",
                format!("{message}; retrying"),
            )
            .await;
            Ok(Action::requeue(
                Duration::from_secs(5)
                    .min(timeout.saturating_sub(since))
                    .max(Duration::from_secs(1)),
            ))
        }
    }
}

/// Applies the worker Deployment, metrics Service and PodDisruptionBudget; returns the Deployment.
async fn apply_workload(
    client: &Client,
    namespace: &str,
    cfp: &ChangeFeedProcessor,
    image: &str,
    replicas: i32,
    secrets_digest: Option<String>,
) -> Result<Deployment, kube::Error> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let name = cfp.name_any();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let deployment = with_secrets_digest(worker_deployment(cfp, image, replicas), secrets_digest);
    let applied = deployments.patch(&name, &params, &Patch::Apply(&deployment)).await?;
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let service = metrics_service(cfp);
    let service_name = service.metadata.name.clone().unwrap_or_default();
    services.patch(&service_name, &params, &Patch::Apply(&service)).await?;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
    budgets
        .patch(&name, &params, &Patch::Apply(&worker_disruption_budget(cfp)))
        .await?;
    Ok(applied)
}

/// What the Deployment's status says about the rollout.
fn rollout_of(deployment: Option<&Deployment>) -> Rollout {
    let Some(deployment) = deployment else {
        return Rollout::default();
    };
    let status = deployment.status.clone().unwrap_or_default();
    let conditions = status.conditions.unwrap_or_default();
    let find = |kind: &str, value: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == kind && c.status == value)
            .map(|c| {
                c.message
                    .clone()
                    .unwrap_or_else(|| c.reason.clone().unwrap_or_default())
            })
    };
    Rollout {
        observed: status
            .observed_generation
            .is_some_and(|o| Some(o) >= deployment.metadata.generation),
        updated: status.updated_replicas.unwrap_or(0),
        replica_failure: find("ReplicaFailure", "True"),
        stalled: find("Progressing", "False"),
        pod_problem: None,
        apply_failure: None,
    }
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

/// The first worker pod whose container cannot run: (pod, container, reason, message).
async fn pod_problem(
    client: &Client,
    namespace: &str,
    cfp: &ChangeFeedProcessor,
) -> Option<(String, String, String, String)> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
    let list = match pods.list(&ListParams::default().labels(&selector_string(cfp))).await {
        Ok(list) => list,
        Err(error) => {
            tracing::debug!(%error, "listing worker pods failed");
            return None;
        }
    };
    for pod in list.items {
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
    }
    None
}

/// When the replicas were last changed: now when `before` differs from `desired`, else what this
/// operator remembers.
fn last_scale_time(
    ctx: &Context,
    key: &ResourceKey,
    before: Option<i32>,
    desired: Option<i32>,
    now: &Time,
) -> Option<Time> {
    let mut states = ctx.scaling.lock().ok()?;
    let state = states.entry(key.clone()).or_default();
    if desired.is_some() && before != desired {
        state.last_scale_time = Some(now.clone());
    }
    state.last_scale_time.clone()
}

/// The most instances `status.instances` lists.
const MAX_STATUS_INSTANCES: usize = 100;

/// Leases per owning instance, the owners with the most leases first when there are too many.
fn instances(estimate: &crate::processor::ProcessorEstimate) -> BTreeMap<String, i32> {
    let mut counts: BTreeMap<String, i32> = BTreeMap::new();
    for owner in estimate.leases.iter().filter_map(|l| l.owner.clone()) {
        *counts.entry(owner).or_default() += 1;
    }
    if counts.len() > MAX_STATUS_INSTANCES {
        let mut ranked: Vec<(String, i32)> = counts.into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked.truncate(MAX_STATUS_INSTANCES);
        counts = ranked.into_iter().collect();
    }
    counts
}

/// What the reconciler does with the replicas.
struct ReplicaPlan {
    /// The replicas to apply; `None` while autoscaling waits for its first estimate.
    replicas: Option<i32>,
    /// The `Scaling` condition.
    scaling: ScalingState,
    /// The Event of a fresh scaling decision.
    event: Option<(&'static str, String)>,
}

fn scaling_state(active: bool, reason: &str, message: String) -> ScalingState {
    ScalingState {
        active,
        reason: reason.into(),
        message,
    }
}

/// The plan of a paused workload: no replicas to apply; the `Scaling` condition says why.
fn paused_plan(pause: super::pause::Pause, current: Option<i32>) -> ReplicaPlan {
    use super::pause::{PAUSED_ANNOTATION, PAUSED_REPLICAS_ANNOTATION};
    let message = match (pause.replicas, current) {
        (Some(held), _) => format!(
            "paused by the {PAUSED_REPLICAS_ANNOTATION} annotation: held at {held} replica(s), no scaling and no changes applied to the workload until it is removed"
        ),
        (None, Some(current)) => format!(
            "paused by the {PAUSED_ANNOTATION} annotation: the workload stays as it is ({current} replica(s)), no scaling and no changes applied until it is removed"
        ),
        (None, None) => {
            format!("paused by the {PAUSED_ANNOTATION} annotation: no workload is created until it is removed")
        }
    };
    ReplicaPlan {
        replicas: None,
        scaling: scaling_state(false, "Paused", message),
        event: None,
    }
}

/// Sets the worker Deployment's replicas through its `/scale` subresource (nothing else of it).
async fn hold_replicas(deployments: &Api<Deployment>, name: &str, replicas: i32) -> Result<Deployment, kube::Error> {
    let patch = serde_json::json!({"spec": {"replicas": replicas}});
    deployments
        .patch_scale(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    deployments.get(name).await
}

/// The replicas from `spec.replicas` (autoscaling off, or an external autoscaler), or from the
/// autoscaling policy applied to the newest estimate.
async fn plan_replicas(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    key: &ResourceKey,
    current: Option<i32>,
    report: Option<&EstimateReport>,
) -> ReplicaPlan {
    let spec_replicas = cfp.spec.replicas;
    let Some(policy) = config::scaling_policy(cfp) else {
        return ReplicaPlan {
            replicas: Some(spec_replicas),
            scaling: scaling_state(
                false,
                "ScalingDisabled",
                format!(
                    "built-in autoscaling is off: spec.replicas ({spec_replicas}) sets the workers (kubectl scale, or an HPA or KEDA through /scale)"
                ),
            ),
            event: None,
        };
    };
    let found = external_autoscaler(&ctx.client, &key.0, &key.1)
        .await
        .map_err(|e| e.to_string());
    if let Some((replicas, reason, message)) = external_plan(found, current, spec_replicas) {
        return ReplicaPlan {
            replicas,
            scaling: scaling_state(false, reason, message),
            event: None,
        };
    }
    let Ok(mut states) = ctx.scaling.lock() else {
        return ReplicaPlan {
            replicas: current,
            scaling: scaling_state(
                false,
                "WaitingForEstimate",
                "the autoscaler state is unavailable".into(),
            ),
            event: None,
        };
    };
    let state = states.entry(key.clone()).or_default();
    let mut event = None;
    if let Some(report) = report.filter(|r| r.seq > state.decided_seq) {
        let observed = match &report.outcome {
            // A partial estimate could hide work: it never scales down, like a failed one.
            Ok(estimate) if estimate.leases_failed > 0 => Observed::Failed(format!(
                "{} of {} leases could not be estimated; first: {}",
                estimate.leases_failed,
                estimate.lease_count,
                estimate.leases.iter().find_map(|l| l.error.clone()).unwrap_or_default()
            )),
            Ok(estimate) => Observed::Estimate {
                total_lag: estimate.total_lag,
                leases: estimate.lease_count,
            },
            Err(failure) => Observed::Failed(failure.message.clone()),
        };
        let decision = state.history.decide(&policy, current, &observed, report.at);
        event = decision.event.clone();
        state.decided_seq = report.seq;
        state.decision = Some(decision);
    }
    match &state.decision {
        Some(decision) => ReplicaPlan {
            replicas: Some(decision.replicas),
            scaling: scaling_state(
                decision.reason == ScalingReason::Active,
                decision.reason.as_str(),
                decision.message.clone(),
            ),
            event,
        },
        None => ReplicaPlan {
            replicas: current,
            scaling: scaling_state(
                false,
                "WaitingForEstimate",
                "waiting for the first estimate of the remaining work".into(),
            ),
            event: None,
        },
    }
}

/// The HorizontalPodAutoscaler that targets the resource's `/scale`, if any; an error when they
/// cannot be listed.
async fn external_autoscaler(
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

/// What the operator estimates for `cfp`, with the keys from its Secrets.
fn estimate_target(cfp: &ChangeFeedProcessor, found: &BTreeMap<String, Secret>) -> Result<EstimateTarget, String> {
    let spec = &cfp.spec;
    let account = AccountRef {
        endpoint: spec.connection.endpoint.clone(),
        auth: account_auth(found, &spec.connection)?,
    };
    let lease_account = match &spec.leases.connection {
        Some(connection) => Some(AccountRef {
            endpoint: connection.endpoint.clone(),
            auth: account_auth(found, connection)?,
        }),
        None => None,
    };
    let mut options = crate::processor::ProcessorOptions::try_from(cfp).map_err(|problem| problem.message)?;
    options.instance = super::estimation::OPERATOR_INSTANCE.to_owned();
    Ok(EstimateTarget {
        account,
        lease_account,
        database: spec.monitored.database.clone(),
        container: spec.monitored.container.clone(),
        lease_database: spec.lease_database(),
        lease_container: spec.lease_container(),
        options,
        create_leases: spec.create_leases(),
        interval: config::estimate_interval(cfp),
    })
}

async fn publish(ctx: &Context, cfp: &ChangeFeedProcessor, kind: EventType, reason: &str, note: String) {
    let event = Event {
        type_: kind,
        reason: reason.into(),
        note: Some(bounded(note, MAX_EVENT_NOTE)),
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

/// How the operator itself authenticates to a connection's account: the key from the Secret, or
/// its own workload identity.
fn account_auth(found: &BTreeMap<String, Secret>, connection: &Connection) -> Result<AccountAuth, String> {
    let reference = match (connection.auth, &connection.key_secret_ref) {
        (AuthMethod::WorkloadIdentity, _) => return Ok(AccountAuth::WorkloadIdentity),
        (AuthMethod::ManagedIdentity, _) => return Ok(AccountAuth::ManagedIdentity),
        (AuthMethod::Key, Some(reference)) => reference,
        (AuthMethod::Key, None) => return Err("connection.keySecretRef is needed with auth Key".to_owned()),
    };
    found
        .get(&reference.name)
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get(&reference.key))
        .map(|v| AccountAuth::Key(String::from_utf8_lossy(&v.0).into_owned()))
        .ok_or_else(|| format!("Secret {:?} key {:?} is needed", reference.name, reference.key))
}

/// Deletes every document of the processor in its lease container; returns how many.
async fn delete_leases(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    found: &BTreeMap<String, Secret>,
) -> Result<usize, String> {
    let target = estimate_target(cfp, found).map_err(|e| format!("{e} to delete the leases"))?;
    let accounts = ctx.estimators.accounts();
    let account = accounts.get(&target.account).await.map_err(|e| e.to_string())?;
    let lease_account = match &target.lease_account {
        Some(lease_account) => accounts.get(lease_account).await.map_err(|e| e.to_string())?,
        None => account.clone(),
    };
    let settings = crate::worker::WorkerSettings {
        create_leases: false,
        ..target.settings()
    };
    match crate::worker::open(&account, &lease_account, &settings).await {
        Ok((_, store)) => store.delete_all().await.map_err(|e| e.to_string()),
        // Nothing to clean up when the containers are gone.
        Err(crate::worker::WorkerError::LeasesMissing { .. } | crate::worker::WorkerError::MonitoredMissing(_)) => {
            Ok(0)
        }
        Err(error) => Err(error.to_string()),
    }
}
