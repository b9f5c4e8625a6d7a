//! The rewind steps ([`crate::operator::rewind_steps`]) carried out: status writes (merge patches of
//! `status.rewind`, `status.lastRewind` and the `Rewound` condition), the workers scaled to 0,
//! the checkpoints moved, the annotation removed, and an Event for each turn.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;

use super::apply::{Workload, apply_deployment, publish};
use super::publish::note;
use super::target::estimate_target;
use super::{Context, ReconcileError};
use crate::operator::boundary::owned_objects::{self, owned_by};
use crate::operator::config;
use crate::operator::crd::{ChangeFeedProcessor, LastRewind, RewindProgress};
use crate::operator::rewind_steps::{
    DONE, Observed, RESTORE_ANNOTATION, REWIND_ANNOTATION, RewindRequest, STOPPING, Step, next_step, request_of,
};
use crate::operator::status::{REWOUND, condition};
use crate::processor::admin::checkpoint_apply::MoveError;
use crate::processor::admin::checkpoint_requests::{MoveOptions, Request, move_checkpoints};
use crate::processor::admin::checkpoints::{Export, PlanError, Selection};

/// The name the operator holds leases under while it moves them.
const HOLDER: &str = "changefeed-operator";
/// How soon a rewind in progress is looked at again.
const SOON: Duration = Duration::from_secs(2);
/// The `Rewound` condition's reason when moving the checkpoints failed.
const FAILED: &str = "RewindFailed";
/// The `Rewound` condition's reason when the export is of another container.
const FOREIGN_EXPORT: &str = "ForeignExport";

/// Why the checkpoints were not moved: the `Rewound` condition's reason, and in words.
struct NotMoved {
    reason: &'static str,
    message: String,
}

impl From<String> for NotMoved {
    fn from(message: String) -> Self {
        Self {
            reason: FAILED,
            message,
        }
    }
}

impl From<MoveError> for NotMoved {
    /// An export of another container gets a reason of its own: the operator never applies it.
    fn from(error: MoveError) -> Self {
        match error {
            // Named without resource ids: a container's rid is part of its lease prefix, and
            // whoever may write a resource must not learn another's this way.
            MoveError::Plan(PlanError::OtherContainer { exported, current, .. }) => Self {
                reason: FOREIGN_EXPORT,
                message: format!(
                    "the export is of container {exported}, not of {current} as it is now: its checkpoints do not apply here; the operator never restores an export of another container, or of this one before it was deleted and created again (its positions are not this container's): restore an export of this container, or apply that one with `cfp checkpoints import --other-container` if you mean it"
                ),
            },
            error => error.to_string().into(),
        }
    }
}

/// Whether a rewind or restore is asked for or under way on `cfp`.
pub(super) fn requested(cfp: &ChangeFeedProcessor) -> bool {
    request_of(cfp.annotations()).is_some() || cfp.status.as_ref().is_some_and(|s| s.rewind.is_some())
}

/// One step of a rewind, when one is asked for or under way (`None`: reconcile as usual).
pub(super) async fn step(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    cfps: &Api<ChangeFeedProcessor>,
    found: &BTreeMap<String, Secret>,
) -> Result<Option<Action>, ReconcileError> {
    let request = request_of(cfp.annotations());
    let progress = cfp.status.as_ref().and_then(|s| s.rewind.as_ref());
    if request.is_none() && progress.is_none() {
        return Ok(None);
    }
    let namespace = cfp.namespace().ok_or(ReconcileError::Unnamed)?;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    let deployment = deployments.get_opt(&cfp.name_any()).await?;
    let rewind = Rewind { ctx, cfp, cfps };
    // Another's Deployment of this name is never scaled, nor its workers waited for.
    if let Some(other) = deployment
        .as_ref()
        .filter(|d| !owned_by(&d.metadata, &cfp.uid().unwrap_or_default()))
    {
        let conflict = owned_objects::name_conflict("Deployment", &other.name_any());
        return rewind.reject(conflict.message).await.map(Some);
    }
    let pods = super::observe::runnable_worker_pods(&ctx.client, &namespace, cfp)
        .await?
        .len();
    let observed = Observed {
        request: request.as_ref(),
        progress,
        replicas: deployment.and_then(|d| d.spec.and_then(|s| s.replicas)),
        pods,
    };
    match next_step(observed) {
        Step::Idle => Ok(None),
        Step::Reject(reason) => rewind.reject(reason).await.map(Some),
        Step::Stop(request) => rewind.stop(request, &deployments, found).await.map(Some),
        Step::Wait(_) => Ok(Some(Action::requeue(SOON))),
        Step::Move(request) => rewind.carry_out(request, found).await.map(Some),
        Step::RemoveAnnotation => rewind.remove_annotation().await.map(Some),
        Step::Finish => rewind.finish().await.map(Some),
        Step::Cancel => rewind.cancel().await.map(Some),
    }
}

/// The rewind of one resource.
struct Rewind<'a> {
    ctx: &'a Context,
    cfp: &'a ChangeFeedProcessor,
    cfps: &'a Api<ChangeFeedProcessor>,
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

impl Rewind<'_> {
    async fn publish(&self, warning: bool, reason: &str, text: String) {
        publish(self.ctx, self.cfp, note(warning, reason, text)).await;
    }

    /// Merge-patches `status` with `fields`.
    async fn patch_status(&self, fields: serde_json::Value) -> Result<(), ReconcileError> {
        let patch = serde_json::json!({ "status": fields });
        self.cfps
            .patch_status(&self.cfp.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// The conditions with `Rewound` set to (`ok`, `reason`, `message`).
    fn conditions_with(&self, ok: bool, reason: &str, message: String) -> Vec<Condition> {
        let generation = self.cfp.metadata.generation;
        let previous = self
            .cfp
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let mut rewound = condition(REWOUND, ok, reason, message, generation, &now());
        let mut conditions: Vec<Condition> = previous.into_iter().filter(|c| c.type_ != REWOUND).collect();
        if let Some(old) = self
            .cfp
            .status
            .iter()
            .flat_map(|s| &s.conditions)
            .find(|c| c.type_ == REWOUND && c.status == rewound.status)
        {
            rewound.last_transition_time = old.last_transition_time.clone();
        }
        conditions.push(rewound);
        conditions
    }

    async fn reject(&self, reason: String) -> Result<Action, ReconcileError> {
        let message = format!("{reason}; the checkpoints were not moved");
        let conditions = self.conditions_with(false, "InvalidRewind", message.clone());
        self.patch_status(serde_json::json!({"rewind": null, "conditions": conditions}))
            .await?;
        self.publish(true, "InvalidRewind", message).await;
        self.remove_annotation().await
    }

    /// Records the request (when new) and scales the workers to 0.
    async fn stop(
        &self,
        request: String,
        deployments: &Api<Deployment>,
        found: &BTreeMap<String, Secret>,
    ) -> Result<Action, ReconcileError> {
        if self.cfp.status.as_ref().and_then(|s| s.rewind.as_ref()).is_none() {
            let progress = RewindProgress {
                request: request.clone(),
                phase: STOPPING.into(),
                started_at: now(),
                succeeded: None,
                message: None,
                reason: None,
            };
            self.patch_status(serde_json::json!({ "rewind": progress })).await?;
            let note = format!("scaling the workers to 0 to move the checkpoints to {request}");
            self.publish(false, "RewindStarted", note).await;
        }
        if deployments.get_opt(&self.cfp.name_any()).await?.is_some() {
            let workload = Workload {
                cfp: self.cfp,
                image: &self.ctx.worker_image,
                secrets_digest: config::secrets_digest(self.cfp, found, &self.ctx.digest_key),
            };
            apply_deployment(deployments, workload, 0).await?;
        }
        Ok(Action::requeue(SOON))
    }

    /// No worker runs: moves the checkpoints and records how it ended.
    async fn carry_out(
        &self,
        request: RewindRequest,
        found: &BTreeMap<String, Secret>,
    ) -> Result<Action, ReconcileError> {
        let result = self.move_checkpoints(&request, found).await;
        if let Err(error) = &result {
            tracing::warn!(processor = %self.cfp.name_any(), error = error.message, "moving the checkpoints failed");
        }
        let reason = result.as_ref().err().map(|e| e.reason.to_owned());
        let progress = RewindProgress {
            request: request.describe(),
            phase: DONE.into(),
            started_at: self
                .cfp
                .status
                .as_ref()
                .and_then(|s| s.rewind.as_ref())
                .map_or_else(now, |p| p.started_at.clone()),
            succeeded: Some(result.is_ok()),
            message: Some(result.unwrap_or_else(|error| error.message)),
            reason,
        };
        self.patch_status(serde_json::json!({ "rewind": progress })).await?;
        Ok(Action::requeue(Duration::from_secs(1)))
    }

    /// Moves the checkpoints: `Ok` with what was moved, `Err` with why nothing was.
    async fn move_checkpoints(
        &self,
        request: &RewindRequest,
        found: &BTreeMap<String, Secret>,
    ) -> Result<String, NotMoved> {
        let request = match request {
            RewindRequest::To(to) => Request::Rewind {
                to: *to,
                selection: Selection::default(),
            },
            RewindRequest::Restore { config_map, key } => {
                Request::Import(Box::new(self.export_in(config_map, key.as_deref()).await?))
            }
        };
        let target = estimate_target(self.cfp, found, &self.ctx.allowed_accounts)
            .map_err(|e| format!("{e} to reach the leases"))?;
        let accounts = self.ctx.estimators.accounts();
        let account = accounts.get(&target.account).await.map_err(|e| e.to_string())?;
        let lease_account = match &target.lease_account {
            Some(lease_account) => accounts.get(lease_account).await.map_err(|e| e.to_string())?,
            None => account.clone(),
        };
        let settings = crate::worker::WorkerSettings {
            create_leases: false,
            ..target.settings()
        };
        let (monitored, store) = crate::worker::open(&account, &lease_account, &settings)
            .await
            .map_err(|e| e.to_string())?;
        // The worker pods are gone (Kubernetes says so): heartbeats they left are no instances.
        // Another container's export is never applied.
        let options = MoveOptions {
            holder: HOLDER.into(),
            take_leases: true,
            other_container: false,
            mode: Some(settings.options.mode),
            dry_run: false,
            expiration: settings.options.expiration,
            watch: std::time::Duration::ZERO,
            on_watch: None,
        };
        let moved = move_checkpoints(&store, &monitored, &request, &options).await?;
        Ok(moved.applied.unwrap_or_default().describe())
    }

    /// The export held in ConfigMap `name` (under `key`, or its only key).
    async fn export_in(&self, name: &str, key: Option<&str>) -> Result<Export, String> {
        let namespace = self.cfp.namespace().unwrap_or_default();
        let config_maps: Api<ConfigMap> = Api::namespaced(self.ctx.client.clone(), &namespace);
        let config_map = config_maps
            .get_opt(name)
            .await
            .map_err(|e| format!("reading ConfigMap {name}: {e}"))?
            .ok_or_else(|| format!("ConfigMap {name} does not exist in namespace {namespace}"))?;
        let data = config_map.data.unwrap_or_default();
        let text = match (key, data.len()) {
            (Some(key), _) => data
                .get(key)
                .ok_or_else(|| format!("ConfigMap {name} has no key {key}"))?,
            (None, 1) => data
                .values()
                .next()
                .ok_or_else(|| format!("ConfigMap {name} is empty"))?,
            (None, keys) => {
                return Err(format!(
                    "ConfigMap {name} has {keys} keys: name the one holding the export ({RESTORE_ANNOTATION}: {name}/<key>)"
                ));
            }
        };
        serde_json::from_str(text)
            .map_err(|e| format!("ConfigMap {name} does not hold an export of `cfp checkpoints export`: {e}"))
    }

    async fn remove_annotation(&self) -> Result<Action, ReconcileError> {
        let patch = serde_json::json!({
            "metadata": {"annotations": {REWIND_ANNOTATION: null, RESTORE_ANNOTATION: null}}
        });
        self.cfps
            .patch(&self.cfp.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(Action::requeue(Duration::from_secs(1)))
    }

    /// Records how the rewind ended; the next reconciliation restores the workers.
    async fn finish(&self) -> Result<Action, ReconcileError> {
        let Some(progress) = self.cfp.status.as_ref().and_then(|s| s.rewind.clone()) else {
            return Ok(Action::requeue(Duration::from_secs(1)));
        };
        let message = progress.message.clone().unwrap_or_default();
        let (request, time) = (progress.request.clone(), now());
        if progress.succeeded == Some(true) {
            let text = format!("moved the checkpoints to {request}: {message}");
            let last = LastRewind { request, time, message };
            let conditions = self.conditions_with(true, "Rewound", text.clone());
            self.patch_status(serde_json::json!({"rewind": null, "lastRewind": last, "conditions": conditions}))
                .await?;
            self.publish(false, "Rewound", text).await;
        } else {
            let text = format!(
                "the checkpoints were not moved to {request}: {message}; the processor goes on from where it was"
            );
            let reason = progress.reason.as_deref().unwrap_or(FAILED);
            let conditions = self.conditions_with(false, reason, text.clone());
            self.patch_status(serde_json::json!({"rewind": null, "conditions": conditions}))
                .await?;
            self.publish(true, reason, text).await;
        }
        Ok(Action::requeue(Duration::from_secs(1)))
    }

    async fn cancel(&self) -> Result<Action, ReconcileError> {
        self.patch_status(serde_json::json!({ "rewind": null })).await?;
        let note = "the rewind annotation was removed before the checkpoints moved; nothing was changed".into();
        self.publish(false, "RewindCancelled", note).await;
        Ok(Action::requeue(Duration::from_secs(1)))
    }
}
