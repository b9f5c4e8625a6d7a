//! Reconciling a `ChangeFeedProcessor`: check its configuration, apply the worker Deployment and
//! metrics Service with server-side apply, report status and Events, and clean up leases on
//! deletion when asked.
//!
//! One reconciliation is observe (`observe`: Secrets, Deployment, HPAs, estimates, pods) → plan
//! (`plan`, pure: the replicas) → apply (`apply`: server-side apply, `/scale`) → publish
//! (`publish`, pure: status and Events; then one thin write). `pace` (pure) keeps its cost
//! growing with change, not with the number of resources; [`claim`] holds the resource's
//! lease-set claim; `cleanup` runs the lease-cleanup finalizer; `rewind_actions` carries out the
//! rewind annotations' steps; `target` (pure) says which accounts and containers to read;
//! [`memory`] holds what is remembered of each resource between reconciliations (forgotten in
//! one place).

mod apply;
pub mod claim;
mod cleanup;
pub mod memory;
mod observe;
mod pace;
mod plan;
mod publish;
mod rewind_actions;
mod target;

pub use cleanup::LeaseCleanupError;
pub use pace::semantic_hash;
pub use plan::ScaleState;
pub use target::{CredentialError, TargetError};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};

use crate::operator::boundary::accounts::AllowListFile;
use crate::operator::boundary::owned_objects::owned_by;
use crate::operator::config;
use crate::operator::crd::ChangeFeedProcessor;
use crate::operator::digest_key::DigestKey;
use crate::operator::metrics::OperatorMetrics;
use crate::operator::scaling::estimate_report::EstimateReport;
use crate::operator::scaling::estimates::{Estimators, ResourceKey};
use crate::operator::scaling::external::ExternalAutoscaler;
use crate::operator::scaling::pause::Pause;
use apply::{Workload, apply_workload, hold_replicas, render, set_finalizer, write_report};
use memory::Memories;
use pace::{Applied, ApplyNeed};
use plan::{Autoscaling, ReplicaPlan};
use publish::Outcome;

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
    /// What it remembers of each resource between reconciliations.
    pub memory: Memories,
    /// Whether this replica may act now (it leads, with a renewal inside the deadline).
    pub leading: Arc<dyn Fn() -> bool + Send + Sync>,
    /// The worker Deployments, as the watch sees them.
    pub deployments: Store<Deployment>,
    /// Secrets are not watched: each resource is reconciled at least this often, so that a
    /// rotated key is read (`None`: a Secret's change reconciles the resources that name it).
    pub secrets_recheck: Option<Duration>,
    /// This cluster's identity in lease-set claims (the UID of its `kube-system` namespace).
    pub cluster: String,
    /// The installation's key of the pod template's Secret digest.
    pub digest_key: DigestKey,
    /// The accounts the operator may reach for each namespace (the cluster admin's allow-list).
    pub allowed_accounts: Arc<AllowListFile>,
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
    if result.is_ok() {
        ctx.memory.with(&key_of(&cfp), |m| m.failures = 0);
    }
    result
}

fn key_of(cfp: &ChangeFeedProcessor) -> ResourceKey {
    ResourceKey::new(cfp.namespace().unwrap_or_default(), cfp.name_any())
}

/// After a failure: retry, later after each failure in a row ([`pace::retry_after`]).
pub fn error_policy(cfp: Arc<ChangeFeedProcessor>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    let failures = ctx.memory.with(&key_of(&cfp), |m| {
        m.failures = m.failures.saturating_add(1);
        m.failures
    });
    let wait = pace::retry_after(failures);
    tracing::warn!(processor = %cfp.name_any(), namespace = ?cfp.namespace(), %error, failures, retry_in = ?wait, "reconcile failed");
    Action::requeue(wait)
}

async fn reconcile_inner(cfp: &ChangeFeedProcessor, ctx: &Context) -> Result<Action, ReconcileError> {
    let namespace = cfp.namespace().ok_or(ReconcileError::Unnamed)?;
    let name = cfp.metadata.name.clone().ok_or(ReconcileError::Unnamed)?;
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(ctx.client.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let found = observe::found_secrets(&secrets, cfp).await?;
    let key = ResourceKey::new(namespace.clone(), name.clone());
    if cfp.metadata.deletion_timestamp.is_some() {
        return finalize(ctx, cfp, &cfps, &key, &found).await;
    }
    let wants_finalizer = cfp.spec.leases.delete_on_resource_deletion;
    if wants_finalizer != cfp.finalizers().iter().any(|f| f == LEASE_FINALIZER) {
        set_finalizer(&cfps, cfp, wants_finalizer).await?;
    }
    // Only the resource that holds the lease set acts on it (`crate::operator::claims`).
    let rewinding = rewind_actions::requested(cfp);
    let standing = claim::standing(ctx, cfp, &found, rewinding).await?;
    if let claim::Standing::Unknown(why) = &standing {
        tracing::debug!(namespace, processor = name, %why, "the lease-set claim could not be checked");
    }
    // A rewind of the checkpoints holds the workers at 0 until it is done (`rewind_actions`).
    if standing == claim::Standing::Held
        && let Some(action) = rewind_actions::step(ctx, cfp, &cfps, &found).await?
    {
        return Ok(action);
    }
    let mut outcome = observe_and_plan(ctx, cfp, &key, &found).await?;
    if let Some(problem) = standing.problem() {
        refuse(ctx, cfp, &key, &mut outcome, problem).await?;
    }
    let held_back = match (&standing, outcome.plan.as_mut()) {
        // Whether this resource may run the lease set is not known: no worker starts.
        (claim::Standing::Unknown(why), Some(plan)) => plan::no_new_workers(plan, outcome.before).then(|| why.clone()),
        _ => None,
    };
    apply(ctx, cfp, &key, &found, &mut outcome).await?;
    if let Some(why) = held_back {
        outcome.problem.get_or_insert(claim::unknown_problem(&why));
    }
    let now = crate::operator::status::now();
    outcome.remembered_scale_time = remember_scale(ctx, &key, outcome.before, outcome.desired(), &now);
    if outcome.needs_pod_check() {
        outcome.pod_problem = observe::pod_problem(&ctx.client, &namespace, cfp).await;
    }
    let report = publish::report(cfp, &outcome, now);
    if let Some(replicas) = report.desired_replicas {
        ctx.metrics.desired_replicas(&namespace, &name, replicas);
    }
    ctx.metrics.paused(&namespace, &name, outcome.paused.is_some());
    ctx.metrics.ready(&namespace, &name, report.ready);
    let requeue = pace::requeue_within(report.requeue, ctx.secrets_recheck);
    write_report(ctx, &cfps, cfp, report).await?;
    Ok(Action::requeue(requeue))
}

/// A resource that may not run its lease set: no estimate, no plan, its workers (if any) at 0.
async fn refuse(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    key: &ResourceKey,
    outcome: &mut Outcome,
    problem: crate::operator::spec_values::ConfigProblem,
) -> Result<(), ReconcileError> {
    ctx.estimators.stop(key);
    outcome.estimate = None;
    outcome.plan = None;
    if outcome.problem.is_none() {
        outcome.problem = Some(problem);
    }
    if outcome.before.is_some_and(|replicas| replicas > 0) && owns_deployment(cfp, outcome) {
        let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &key.namespace);
        outcome.deployment = Some(hold_replicas(&deployments, &key.name, 0).await?);
        outcome.held = outcome.before.map(|before| (before, 0));
    }
    Ok(())
}

/// A deleted resource: stop estimating and forget its scaling; clean up the leases when the
/// finalizer asks for it.
async fn finalize(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    cfps: &Api<ChangeFeedProcessor>,
    key: &ResourceKey,
    found: &BTreeMap<String, Secret>,
) -> Result<Action, ReconcileError> {
    ctx.estimators.stop(key);
    ctx.memory.forget(key);
    if cfp.finalizers().iter().any(|f| f == LEASE_FINALIZER) {
        // Only the holder of the lease set deletes it, and only while it can tell that it holds
        // it: another namespace's resource naming the same lease set must not
        // (`crate::operator::claims`), and an unreadable claim deletes nothing.
        if let Err(error) = target::estimate_target(cfp, found, &ctx.allowed_accounts) {
            return cleanup::unreachable(ctx, cfp, cfps, error).await;
        }
        return match claim::standing_now(ctx, cfp, found).await? {
            claim::Standing::Held | claim::Standing::Gained | claim::Standing::NoLeaseSet => {
                cleanup::clean_up(ctx, cfp, cfps, found).await
            }
            claim::Standing::Refused(why) => cleanup::leave_leases(ctx, cfp, cfps, why).await,
            claim::Standing::HandingOver(to) => {
                let why = format!("they are being handed over to ChangeFeedProcessor {to}");
                cleanup::leave_leases(ctx, cfp, cfps, why).await
            }
            claim::Standing::Unknown(why) => cleanup::wait_for_claim(ctx, cfp, cfps, why).await,
        };
    }
    Ok(Action::await_change())
}

/// Observes the configuration, the Deployment and the estimate, and plans the replicas.
async fn observe_and_plan(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    key: &ResourceKey,
    found: &BTreeMap<String, Secret>,
) -> Result<Outcome, ReconcileError> {
    let (problem, paused) = observe::configuration(cfp, found, &ctx.allowed_accounts);
    let existing = observe::deployment(&ctx.deployments, &ctx.client, key).await?;
    let before = existing.as_ref().and_then(|d| d.spec.as_ref()).and_then(|s| s.replicas);
    let mut outcome = Outcome {
        problem,
        paused,
        before,
        deployment: existing,
        ..Outcome::default()
    };
    if outcome.problem.is_some() {
        // Nothing to estimate with; the existing workload (if any) stays as it is.
        ctx.estimators.stop(key);
        return Ok(outcome);
    }
    match target::estimate_target(cfp, found, &ctx.allowed_accounts) {
        Ok(target) => ctx.estimators.ensure(key, target),
        Err(error) => tracing::warn!(namespace = key.namespace, processor = key.name, %error, "cannot estimate"),
    }
    outcome.estimate = ctx.estimators.report(key);
    outcome.plan = Some(match paused {
        // Nothing is applied while paused: the plan names no replicas.
        Some(pause) => plan::paused_plan(pause, before),
        None => {
            let external = observe::external_autoscaler(&ctx.client, &key.namespace, &key.name).await;
            outcome.autoscalers_seen = external.is_ok();
            outcome.keda_hpa = external
                .as_ref()
                .ok()
                .and_then(Option::as_ref)
                .filter(|hpa| hpa.keda)
                .map(|hpa| hpa.name.clone());
            plan_replicas(ctx, cfp, key, before, (outcome.estimate.as_ref(), external))
        }
    });
    Ok(outcome)
}

/// The replicas from `spec.replicas` (autoscaling off, or an external autoscaler), or from the
/// autoscaling policy applied to the newest estimate.
fn plan_replicas(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    key: &ResourceKey,
    current: Option<i32>,
    (report, external): (Option<&EstimateReport>, Result<Option<ExternalAutoscaler>, kube::Error>),
) -> ReplicaPlan {
    let Some(policy) = crate::operator::scaling::spec_policy::scaling_policy(cfp) else {
        return plan::fixed_plan(cfp);
    };
    let seen = Autoscaling {
        policy,
        external,
        report,
    };
    ctx.memory
        .with(key, |m| plan::autoscaled_plan(cfp, seen, current, Some(&mut m.scaling)))
}

/// Applies the planned workload (none with a configuration problem, or none planned yet) and the
/// replicas a pause holds; records what became of them in `outcome`.
async fn apply(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    key: &ResourceKey,
    found: &BTreeMap<String, Secret>,
    outcome: &mut Outcome,
) -> Result<(), ReconcileError> {
    if let (None, Some(desired)) = (&outcome.problem, outcome.desired()) {
        let rendered = render(
            Workload {
                cfp,
                image: &ctx.worker_image,
                secrets_digest: config::secrets_digest(cfp, found, &ctx.digest_key),
            },
            desired,
        );
        let observed = outcome.deployment.as_ref().and_then(|d| d.metadata.generation);
        let remembered = ctx.memory.with(key, |m| m.applied.clone());
        match pace::needs_apply(&rendered.digest, observed, remembered.as_ref()) {
            ApplyNeed::Apply => {
                let uid = cfp.uid().unwrap_or_default();
                if let Some(conflict) = apply::name_conflict(&ctx.client, &key.namespace, &rendered, &uid).await? {
                    outcome.problem = Some(conflict);
                    return Ok(());
                }
                let (apply, applied) = apply_workload(&ctx.client, &key.namespace, &rendered).await?;
                let now_applied = applied.as_ref().map(|deployment| Applied {
                    digest: rendered.digest.clone(),
                    generation: deployment.metadata.generation,
                });
                ctx.memory.with(key, |m| m.applied = now_applied);
                outcome.apply = apply;
                if applied.is_some() {
                    outcome.deployment = applied;
                }
            }
            ApplyNeed::UpToDate => outcome.apply = publish::Apply::Applied,
            ApplyNeed::CacheBehind => {
                // The last apply (of these very replicas) is not in the cache yet.
                outcome.apply = publish::Apply::Applied;
                outcome.before = Some(desired);
            }
        }
    }
    if let (Some(Pause { replicas: Some(held) }), Some(current)) = (outcome.paused, outcome.before)
        && held != current
        && owns_deployment(cfp, outcome)
    {
        let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &key.namespace);
        outcome.deployment = Some(hold_replicas(&deployments, &key.name, held).await?);
        outcome.held = Some((current, held));
    }
    Ok(())
}

/// Whether the worker Deployment observed is `cfp`'s own (its replicas are held only then).
fn owns_deployment(cfp: &ChangeFeedProcessor, outcome: &Outcome) -> bool {
    let uid = cfp.uid().unwrap_or_default();
    outcome
        .deployment
        .as_ref()
        .is_some_and(|deployment| owned_by(&deployment.metadata, &uid))
}

/// When the replicas were last changed: now when `before` differs from `desired`, else what this
/// operator remembers.
fn remember_scale(
    ctx: &Context,
    key: &ResourceKey,
    before: Option<i32>,
    desired: Option<i32>,
    now: &Time,
) -> Option<Time> {
    ctx.memory.with(key, |m| {
        if desired.is_some() && before != desired {
            m.scaling.last_scale_time = Some(now.clone());
        }
        m.scaling.last_scale_time.clone()
    })
}
