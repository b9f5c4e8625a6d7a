//! Holding a resource's lease-set claim ([`crate::operator::claims`]): read the claim document
//! in the lease container, create it when nobody claims the lease set, take over a claim whose
//! resource no longer exists (with a Warning Event), and carry out handovers.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use super::apply::publish;
use super::publish::note;
use super::target::estimate_target;
use super::{Context, ReconcileError};
use crate::operator::claims::{Claim, Claimant, HAND_OVER_ANNOTATION, TAKE_OVER_ANNOTATION, Verdict, judge, refusal};
use crate::operator::crd::ChangeFeedProcessor;
use crate::operator::rewind_steps::{RESTORE_ANNOTATION, REWIND_ANNOTATION};
use crate::operator::scaling::estimates::ResourceKey;
use crate::operator::spec_values::ConfigProblem;
use crate::processor::{CosmosLeaseStore, LeaseStoreError};

/// The claim document's name under the lease prefix (`{prefix}.claim`).
pub(super) const CLAIM: &str = "claim";

/// Where a resource stands with its lease set (see [`crate::operator::claims`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// It holds the lease set: workers, admin actions and estimates as usual.
    Held,
    /// It has just taken the lease set from another resource: as held, but no admin action runs
    /// in this reconciliation (the requests made before were removed).
    Gained,
    /// It holds it and hands it over: its workers stop, nothing else runs.
    HandingOver(String),
    /// Another resource holds it (the status says which).
    Refused(String),
    /// The lease container could not be read: no new workers (those running stay), no admin
    /// action.
    Unknown(String),
    /// The lease container does not exist yet: there is no lease set to claim (the workers
    /// create it; it is claimed at the next read), no admin action.
    NoLeaseSet,
}

impl Standing {
    /// The status problem this standing puts on the resource, if any.
    pub fn problem(&self) -> Option<ConfigProblem> {
        match self {
            Standing::Refused(message) => Some(ConfigProblem {
                reason: "LeaseSetClaimed",
                message: message.clone(),
            }),
            Standing::HandingOver(to) => Some(ConfigProblem {
                reason: "LeaseSetHandingOver",
                message: format!(
                    "handing the lease set over to ChangeFeedProcessor {to} ({HAND_OVER_ANNOTATION}): the workers stop, then {to} takes it"
                ),
            }),
            Standing::Held | Standing::Gained | Standing::Unknown(_) | Standing::NoLeaseSet => None,
        }
    }
}

/// A resource's standing with its lease set as last read: when, for which target (its
/// settings), and what it was.
#[derive(Debug, Clone)]
pub struct RememberedStanding {
    /// When it was read.
    pub at: Instant,
    /// The settings (and handover request) it was read for.
    pub target: Option<String>,
    /// What it was.
    pub standing: Standing,
}

/// The status problem of a resource held back because its claim cannot be read (`why`).
pub(super) fn unknown_problem(why: &str) -> ConfigProblem {
    ConfigProblem {
        reason: "LeaseSetUnknown",
        message: format!(
            "whether this resource may run its lease set cannot be read ({why}): no worker starts until the claim can be read (workers already running stay)"
        ),
    }
}

/// This resource as a claimant in the operator's cluster.
fn claimant(ctx: &Context, cfp: &ChangeFeedProcessor) -> Claimant {
    Claimant {
        cluster: ctx.cluster.clone(),
        namespace: cfp.namespace().unwrap_or_default(),
        name: cfp.name_any(),
        uid: cfp.uid().unwrap_or_default(),
    }
}

/// Why a lease set whose prefix nests with another claimed one is refused (the other is not
/// named: its prefix is not this resource's to know).
const NESTED: &str = "the lease set's prefix nests with another claimed lease set in the same lease container (one processorName extends the other's lease prefix), so each would list the other's documents: give this resource another processorName or lease container";

/// The estimate's setup reason of a lease container that does not exist.
const LEASE_CONTAINER_MISSING: &str = "LeaseContainerMissing";

/// How long a resource's standing is trusted before its claim is read again (a handover, a
/// holder deleted): admin actions and deletions always read it.
const RECHECK: Duration = Duration::from_secs(30);

/// How long opening the lease container, or reading the claim, may take before the standing is
/// unknown this time.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);

/// The standing of `cfp` with its lease set: remembered for [`RECHECK`] (`fresh` reads it now).
/// An unknown standing keeps what was known before: a refused resource stays refused while its
/// lease container cannot be read.
pub(super) async fn standing(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    found: &BTreeMap<String, Secret>,
    fresh: bool,
) -> Result<Standing, ReconcileError> {
    let key = ResourceKey::new(cfp.namespace().unwrap_or_default(), cfp.name_any());
    // Remembered for these settings and this handover request only: a cancelled handover is
    // disarmed at once.
    let handover = cfp.annotations().get(HAND_OVER_ANNOTATION);
    let target = estimate_target(cfp, found, &ctx.allowed_accounts)
        .ok()
        .map(|t| format!("{:?} {handover:?}", t.settings()));
    let remembered = ctx.memory.with(&key, |m| m.standing.clone());
    if !fresh
        && let Some(was) = &remembered
        && was.at.elapsed() < RECHECK
        && was.target == target
    {
        return Ok(was.standing.clone());
    }
    let now = read_standing(ctx, cfp, found).await?;
    let kept = match (&now, remembered) {
        (Standing::Unknown(_), Some(was)) if was.target == target && !matches!(was.standing, Standing::Unknown(_)) => {
            was.standing
        }
        _ => now,
    };
    let standing = if kept == Standing::Gained {
        Standing::Held
    } else {
        kept.clone()
    };
    let at = Instant::now();
    ctx.memory
        .with(&key, |m| m.standing = Some(RememberedStanding { at, target, standing }));
    Ok(kept)
}

/// The standing of `cfp` as its claim says now, never as remembered: what a deletion of the
/// lease set decides on.
pub(super) async fn standing_now(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    found: &BTreeMap<String, Secret>,
) -> Result<Standing, ReconcileError> {
    read_standing(ctx, cfp, found).await
}

/// The claim's version when `cfp` holds it now (read just before the lease set is deleted);
/// `None` when another resource does or nobody does.
pub(super) async fn held_version(
    store: &CosmosLeaseStore,
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
) -> Result<Option<String>, LeaseStoreError> {
    let (claim, etag) = read(store).await?;
    Ok(match judge(claim.as_ref(), &claimant(ctx, cfp)) {
        Verdict::Held => etag,
        _ => None,
    })
}

/// Reads, creates or takes the claim of `cfp`'s lease set.
async fn read_standing(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    found: &BTreeMap<String, Secret>,
) -> Result<Standing, ReconcileError> {
    let store = match tokio::time::timeout(OPEN_TIMEOUT, open(ctx, cfp, found)).await {
        Ok(Ok(store)) => store,
        Ok(Err(standing)) => return Ok(standing),
        Err(_) => return Ok(Standing::Unknown("opening the lease container timed out".into())),
    };
    let me = claimant(ctx, cfp);
    for _ in 0..3 {
        let (claim, etag) = match tokio::time::timeout(OPEN_TIMEOUT, read(&store)).await {
            Ok(Ok(read)) => read,
            Ok(Err(error)) => return Ok(Standing::Unknown(error.to_string())),
            Err(_) => return Ok(Standing::Unknown("reading the claim timed out".into())),
        };
        let (written, gained) = match judged(ctx, cfp, &store, &me, claim, etag).await? {
            Judged::Decided(standing) => return Ok(standing),
            Judged::Wrote { written, gained } => (written, gained),
        };
        match written {
            Ok(()) if gained => {
                drop_earlier_requests(ctx, cfp).await?;
                return Ok(Standing::Gained);
            }
            Ok(()) => return Ok(Standing::Held),
            // Another resource wrote it first: judge again.
            Err(LeaseStoreError::Changed(_) | LeaseStoreError::Gone(_)) => continue,
            Err(error) => return Ok(Standing::Unknown(error.to_string())),
        }
    }
    Ok(Standing::Unknown("the claim kept changing".into()))
}

/// What the claim as read led to: a standing, or a write of this resource as the holder.
enum Judged {
    /// The standing, nothing written.
    Decided(Standing),
    /// The claim was written; `gained`: taken from another resource.
    Wrote {
        /// The write's outcome.
        written: Result<(), LeaseStoreError>,
        /// Whether another resource held it before.
        gained: bool,
    },
}

/// Judges the claim read (`claim` at `etag`) for `me` and writes it where `me` may take it.
async fn judged(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    store: &CosmosLeaseStore,
    me: &Claimant,
    claim: Option<Claim>,
    etag: Option<String>,
) -> Result<Judged, ReconcileError> {
    let taken = |written| Judged::Wrote { written, gained: true };
    Ok(match judge(claim.as_ref(), me) {
        Verdict::Held => Judged::Decided(hand_over_if_asked(ctx, cfp, store, claim, etag.as_deref()).await?),
        Verdict::Refused(holder) => Judged::Decided(Standing::Refused(refusal(&holder, false))),
        Verdict::Create => match store.claim_nests().await {
            Ok(true) => Judged::Decided(Standing::Refused(NESTED.to_owned())),
            Ok(false) => Judged::Wrote {
                written: write(store, me, None).await,
                gained: false,
            },
            Err(error) => Judged::Decided(Standing::Unknown(error.to_string())),
        },
        Verdict::TakeHandover(holder) if holder_still_runs(ctx, &holder).await? => {
            let message = format!(
                "{} hands the lease set over; waiting for its workers to stop",
                holder.path()
            );
            Judged::Decided(Standing::Refused(message))
        }
        Verdict::TakeHandover(_) => taken(write(store, me, etag.as_deref()).await),
        Verdict::CheckHolder(holder) if holder_exists(ctx, &holder).await? => {
            Judged::Decided(Standing::Refused(refusal(&holder, true)))
        }
        Verdict::CheckHolder(holder) if !may_take_over(cfp, me, &holder) => {
            Judged::Decided(Standing::Refused(left_behind(&holder)))
        }
        Verdict::CheckHolder(holder) => {
            let text = format!(
                "took over the lease-set claim of ChangeFeedProcessor {} (uid {}), which no longer exists",
                holder.path(),
                holder.uid
            );
            tracing::warn!(namespace = %me.namespace, processor = %me.name, "{text}");
            publish(ctx, cfp, note(true, "LeaseSetClaimTakenOver", text)).await;
            taken(write(store, me, etag.as_deref()).await)
        }
    })
}

/// A rewind or restore asked for before this resource gained the lease set was not its to ask:
/// the annotations are removed (a Warning Event says so) and ask again to run it.
async fn drop_earlier_requests(ctx: &Context, cfp: &ChangeFeedProcessor) -> Result<(), ReconcileError> {
    let earlier: Vec<&str> = [REWIND_ANNOTATION, RESTORE_ANNOTATION]
        .into_iter()
        .filter(|a| cfp.annotations().contains_key(*a))
        .collect();
    if earlier.is_empty() {
        return Ok(());
    }
    let removed: serde_json::Map<String, serde_json::Value> = earlier
        .iter()
        .map(|a| ((*a).to_owned(), serde_json::Value::Null))
        .collect();
    let patch = serde_json::json!({"metadata": {"annotations": removed}});
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(ctx.client.clone(), &cfp.namespace().unwrap_or_default());
    cfps.patch(&cfp.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let text = format!(
        "removed {} set before this resource held the lease set: annotate again to run it on the leases it now holds",
        earlier.join(" and ")
    );
    publish(ctx, cfp, note(true, "RequestBeforeClaimDropped", text)).await;
    Ok(())
}

/// A held claim: handed over when the resource's annotation asks and its workers are gone.
async fn hand_over_if_asked(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    store: &CosmosLeaseStore,
    claim: Option<Claim>,
    etag: Option<&str>,
) -> Result<Standing, ReconcileError> {
    let Some(to) = cfp
        .annotations()
        .get(HAND_OVER_ANNOTATION)
        .map(|to| to.trim().to_owned())
    else {
        disarm(store, claim, etag).await;
        return Ok(Standing::Held);
    };
    let namespace = cfp.namespace().unwrap_or_default();
    let running = super::observe::runnable_worker_pods(&ctx.client, &namespace, cfp).await?;
    let written = claim.as_ref().and_then(|c| c.hand_over_to.as_deref()) == Some(to.as_str());
    if running.is_empty()
        && !written
        && let (Some(mut claim), Some(etag)) = (claim, etag)
    {
        claim.hand_over_to = Some(to.clone());
        if let Err(error) = store.write_marker(CLAIM, to_json(&claim), Some(etag)).await {
            tracing::debug!(%error, "writing the handover into the claim failed; trying again");
        }
    }
    Ok(Standing::HandingOver(to))
}

/// Whether `me` may take the claim `holder` left when it was deleted: a resource of the same
/// namespace may (that namespace could have run the lease set itself); another namespace's only
/// when it names that holder in [`TAKE_OVER_ANNOTATION`].
fn may_take_over(cfp: &ChangeFeedProcessor, me: &Claimant, holder: &Claimant) -> bool {
    holder.namespace == me.namespace
        || cfp.annotations().get(TAKE_OVER_ANNOTATION).map(|a| a.trim()) == Some(holder.path().as_str())
}

/// Why a claim left by a deleted resource of another namespace is not taken unasked.
fn left_behind(holder: &Claimant) -> String {
    format!(
        "the lease set's claim was left by ChangeFeedProcessor {} (deleted); another namespace takes it only when asked: annotate this resource {TAKE_OVER_ANNOTATION}: {} (the admission policy lets only cluster admins set it)",
        holder.path(),
        holder.path()
    )
}

/// A handover written into the claim whose annotation was removed since: cancelled, so the
/// claim no longer names anyone to take it (the next read tries again when this write fails).
async fn disarm(store: &CosmosLeaseStore, claim: Option<Claim>, etag: Option<&str>) {
    let (Some(mut claim), Some(etag)) = (claim, etag) else {
        return;
    };
    if claim.hand_over_to.take().is_none() {
        return;
    }
    if let Err(error) = store.write_marker(CLAIM, to_json(&claim), Some(etag)).await {
        tracing::debug!(%error, "removing a cancelled handover from the claim failed; trying again");
    }
}

/// The resource `holder` as it is now, if it exists; a namespace this operator may not read
/// (it does not watch it) counts as holding it: nothing is taken over unchecked.
async fn holder_now(ctx: &Context, holder: &Claimant) -> Result<Option<Option<ChangeFeedProcessor>>, ReconcileError> {
    let api: Api<ChangeFeedProcessor> = Api::namespaced(ctx.client.clone(), &holder.namespace);
    match api.get_opt(&holder.name).await {
        Ok(found) => Ok(Some(found)),
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// Whether the resource `holder` (that very uid) exists (or cannot be checked).
async fn holder_exists(ctx: &Context, holder: &Claimant) -> Result<bool, ReconcileError> {
    Ok(match holder_now(ctx, holder).await? {
        Some(found) => found.is_some_and(|cfp| cfp.uid().as_deref() == Some(holder.uid.as_str())),
        None => true,
    })
}

/// Whether `holder` (that very uid) exists and still has worker pods that can run (or cannot be
/// checked). A resource of its name with another uid is not it: a claim document names whatever
/// its writer likes, and what the operator finds of another namespace's resources must not
/// depend on it.
async fn holder_still_runs(ctx: &Context, holder: &Claimant) -> Result<bool, ReconcileError> {
    let cfp = match holder_now(ctx, holder).await? {
        Some(Some(cfp)) if cfp.uid().as_deref() == Some(holder.uid.as_str()) => cfp,
        Some(_) => return Ok(false),
        None => return Ok(true),
    };
    let running = super::observe::runnable_worker_pods(&ctx.client, &holder.namespace, &cfp).await?;
    Ok(!running.is_empty())
}

/// The lease store of `cfp`'s processor, or why it cannot be opened.
async fn open(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    found: &BTreeMap<String, Secret>,
) -> Result<std::sync::Arc<CosmosLeaseStore>, Standing> {
    let mut target =
        estimate_target(cfp, found, &ctx.allowed_accounts).map_err(|e| Standing::Unknown(e.to_string()))?;
    target.create_leases = false;
    match ctx.estimators.accounts().open(&target).await {
        Ok(opened) => Ok(opened.store),
        Err(failure) if failure.setup == Some(LEASE_CONTAINER_MISSING) => Err(Standing::NoLeaseSet),
        Err(failure) => Err(Standing::Unknown(failure.to_string())),
    }
}

/// The claim document (none when unclaimed or unreadable as a claim) and its version.
async fn read(store: &CosmosLeaseStore) -> Result<(Option<Claim>, Option<String>), LeaseStoreError> {
    Ok(match store.read_marker(CLAIM).await? {
        Some((body, etag)) => (serde_json::from_value(body).ok(), Some(etag)),
        None => (None, None),
    })
}

/// Writes `me` as the holder: created (`etag` none) or replacing that version.
async fn write(store: &CosmosLeaseStore, me: &Claimant, etag: Option<&str>) -> Result<(), LeaseStoreError> {
    let claim = Claim {
        claimant: me.clone(),
        hand_over_to: None,
    };
    store.write_marker(CLAIM, to_json(&claim), etag).await
}

fn to_json(claim: &Claim) -> serde_json::Value {
    // A plain struct of strings always serializes.
    serde_json::to_value(claim).unwrap_or_default()
}
