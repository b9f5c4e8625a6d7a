//! The lease-cleanup finalizer: when a resource that asked for it is deleted, scale the workers
//! to zero, wait for their pods to go, delete the lease documents, then let the resource go.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;

use super::apply::{Workload, apply_deployment, publish, set_finalizer};
use super::publish::note;
use super::target::{TargetError, estimate_target};
use super::{Context, ReconcileError};
use crate::operator::boundary::owned_objects::owned_by;
use crate::operator::config;
use crate::operator::crd::ChangeFeedProcessor;
use crate::operator::scaling::estimate_report::EstimateFailure;

/// Why the lease documents could not be deleted.
#[derive(Debug, thiserror::Error)]
pub enum LeaseCleanupError {
    /// What to reach is not known (a credential is gone).
    #[error("{0} to delete the leases")]
    Target(#[from] TargetError),
    /// An account could not be reached.
    #[error(transparent)]
    Account(#[from] EstimateFailure),
    /// The lease container could not be opened.
    #[error(transparent)]
    Open(#[from] crate::worker::WorkerError),
    /// Deleting the documents failed.
    #[error(transparent)]
    Delete(#[from] crate::processor::LeaseStoreError),
    /// The claim no longer names this resource: nothing is deleted.
    #[error("the lease set's claim does not name this resource (any more): nothing was deleted")]
    NotHeld,
}

/// The cleanup of one deleted resource.
struct Cleanup<'a> {
    ctx: &'a Context,
    cfp: &'a ChangeFeedProcessor,
    cfps: &'a Api<ChangeFeedProcessor>,
    timeout: Duration,
    /// How long ago the deletion began.
    since: Duration,
}

/// Deleting a resource whose leases must go: scale the workers to zero and wait until their pods
/// are gone (so nothing writes a lease back), delete the leases, then drop the finalizer. Failures
/// are retried until `leases.cleanupTimeout` after the deletion began; then the finalizer is
/// dropped anyway with a Warning Event naming what was left behind.
pub(super) async fn clean_up(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    cfps: &Api<ChangeFeedProcessor>,
    found: &BTreeMap<String, Secret>,
) -> Result<Action, ReconcileError> {
    let namespace = cfp.namespace().ok_or(ReconcileError::Unnamed)?;
    let cleanup = Cleanup::new(ctx, cfp, cfps);
    // 1. No worker may write a lease back: scale to zero and wait for the pods to go.
    cleanup.scale_to_zero(&namespace, found).await?;
    let running = super::observe::runnable_worker_pods(&ctx.client, &namespace, cfp).await?;
    if !running.is_empty() {
        if cleanup.since >= cleanup.timeout {
            let names = running.join(", ");
            return cleanup
                .give_up(
                    format!("{} worker pod(s) that can still run exist: {names}", running.len()),
                    false,
                )
                .await;
        }
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    // 2. Delete the leases. A credential whose Secret is gone cannot come back while the resource
    //    is deleted (a namespace deletion removes Secrets first): no waiting for it.
    if let Err(error) = estimate_target(cfp, found, &ctx.allowed_accounts) {
        return cleanup
            .give_up(format!("{error} to reach the leases and it is gone"), true)
            .await;
    }
    let deleted = delete_leases(ctx, cfp, found).await;
    cleanup.after_deleting(deleted).await
}

/// A deleted resource that does not hold its lease set: the leases are another resource's and
/// stay; the finalizer goes with a Warning Event that says so.
pub(super) async fn leave_leases(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    cfps: &Api<ChangeFeedProcessor>,
    why: String,
) -> Result<Action, ReconcileError> {
    let text = format!("left the lease documents as they are: {why}");
    publish(ctx, cfp, note(true, "LeaseCleanupRefused", text)).await;
    set_finalizer(cfps, cfp, false).await?;
    Ok(Action::await_change())
}

/// A deleted resource whose accounts cannot be reached at all (a credential gone with the
/// namespace, an account the admin does not allow): the finalizer goes at once, the leases stay.
pub(super) async fn unreachable(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    cfps: &Api<ChangeFeedProcessor>,
    error: TargetError,
) -> Result<Action, ReconcileError> {
    let what = format!("{error} to reach the leases and it is gone");
    Cleanup::new(ctx, cfp, cfps).give_up(what, true).await
}

/// A deleted resource that cannot tell whether it holds its lease set (the claim cannot be
/// read): nothing is deleted; read again later (less often the longer it lasts), until
/// `leases.cleanupTimeout`, then the finalizer goes and the leases stay.
pub(super) async fn wait_for_claim(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    cfps: &Api<ChangeFeedProcessor>,
    why: String,
) -> Result<Action, ReconcileError> {
    let cleanup = Cleanup::new(ctx, cfp, cfps);
    let what = format!("cannot tell whether this resource holds its lease set ({why}); nothing was deleted");
    if cleanup.since >= cleanup.timeout {
        return cleanup.give_up(what, false).await;
    }
    cleanup
        .publish(true, "LeaseCleanupWaiting", format!("{what}; reading the claim again"))
        .await;
    let backoff = (cleanup.since / 4).clamp(Duration::from_secs(2), Duration::from_secs(60));
    Ok(Action::requeue(
        backoff.min(cleanup.timeout.saturating_sub(cleanup.since)),
    ))
}

impl<'a> Cleanup<'a> {
    /// The cleanup of `cfp`, deleted `since` ago.
    fn new(ctx: &'a Context, cfp: &'a ChangeFeedProcessor, cfps: &'a Api<ChangeFeedProcessor>) -> Self {
        Cleanup {
            ctx,
            cfp,
            cfps,
            timeout: humantime::parse_duration(&cfp.spec.leases.cleanup_timeout).unwrap_or(Duration::from_secs(300)),
            since: cfp
                .metadata
                .deletion_timestamp
                .as_ref()
                .map(|t| k8s_openapi::jiff::Timestamp::now().duration_since(t.0))
                .and_then(|d| Duration::try_from(d).ok())
                .unwrap_or_default(),
        }
    }
}

impl Cleanup<'_> {
    async fn publish(&self, warning: bool, reason: &str, text: String) {
        publish(self.ctx, self.cfp, note(warning, reason, text)).await;
    }

    /// Scales the worker Deployment, if any, to zero.
    async fn scale_to_zero(&self, namespace: &str, found: &BTreeMap<String, Secret>) -> Result<(), ReconcileError> {
        let deployments: Api<Deployment> = Api::namespaced(self.ctx.client.clone(), namespace);
        let uid = self.cfp.uid().unwrap_or_default();
        if let Some(deployment) = deployments.get_opt(&self.cfp.name_any()).await?
            && owned_by(&deployment.metadata, &uid)
            && deployment.spec.as_ref().and_then(|s| s.replicas) != Some(0)
        {
            let workload = Workload {
                cfp: self.cfp,
                image: &self.ctx.worker_image,
                secrets_digest: config::secrets_digest(self.cfp, found, &self.ctx.digest_key),
            };
            apply_deployment(&deployments, workload, 0).await?;
            let note = "scaled the workers to 0 before deleting the leases".into();
            self.publish(false, "ScaledDown", note).await;
        }
        Ok(())
    }

    /// Drops the finalizer after the leases were deleted, or retries until the timeout.
    async fn after_deleting(&self, deleted: Result<usize, LeaseCleanupError>) -> Result<Action, ReconcileError> {
        match deleted {
            Ok(count) => {
                let note = format!("deleted {count} lease documents");
                self.publish(false, "LeasesDeleted", note).await;
                set_finalizer(self.cfps, self.cfp, false).await?;
                Ok(Action::await_change())
            }
            Err(error) if self.since >= self.timeout => {
                self.give_up(format!("deleting the leases failed: {error}"), false)
                    .await
            }
            Err(error) => {
                self.publish(true, "LeaseCleanupFailed", format!("{error}; retrying"))
                    .await;
                Ok(Action::requeue(
                    Duration::from_secs(5)
                        .min(self.timeout.saturating_sub(self.since))
                        .max(Duration::from_secs(1)),
                ))
            }
        }
    }

    /// Drops the finalizer with a Warning Event naming what was left behind.
    async fn give_up(&self, what: String, at_once: bool) -> Result<Action, ReconcileError> {
        let when = if at_once {
            "at once".to_owned()
        } else {
            format!(
                "after {} (leases.cleanupTimeout)",
                humantime::format_duration(self.timeout)
            )
        };
        let note = format!(
            "gave up {when}: {what}; the lease documents of processor {:?} may be left in the lease container",
            self.cfp.processor_name()
        );
        self.publish(true, "LeaseCleanupAbandoned", note).await;
        set_finalizer(self.cfps, self.cfp, false).await?;
        Ok(Action::await_change())
    }
}

/// Deletes every document of the processor in its lease container; returns how many.
async fn delete_leases(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    found: &BTreeMap<String, Secret>,
) -> Result<usize, LeaseCleanupError> {
    let target = estimate_target(cfp, found, &ctx.allowed_accounts)?;
    let accounts = ctx.estimators.accounts();
    let account = accounts.get(&target.account).await?;
    let lease_account = match &target.lease_account {
        Some(lease_account) => accounts.get(lease_account).await?,
        None => account.clone(),
    };
    let settings = crate::worker::WorkerSettings {
        create_leases: false,
        ..target.settings()
    };
    match crate::worker::open(&account, &lease_account, &settings).await {
        Ok((_, store)) => {
            // Confirmed held just before, and the claim deleted last at that very version: a
            // claim that changed meanwhile (another resource's now) stays.
            let Some(version) = super::claim::held_version(&store, ctx, cfp).await? else {
                return Err(LeaseCleanupError::NotHeld);
            };
            let deleted = store.delete_all_but_claim().await?;
            store.delete_marker(super::claim::CLAIM, &version).await?;
            Ok(deleted + 1)
        }
        // Nothing to clean up when the containers are gone.
        Err(crate::worker::WorkerError::LeasesMissing { .. } | crate::worker::WorkerError::MonitoredMissing(_)) => {
            Ok(0)
        }
        Err(error) => Err(error.into()),
    }
}
