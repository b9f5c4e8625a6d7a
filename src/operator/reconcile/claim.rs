//! Holding a resource's lease-set claim ([`crate::operator::claims`]): read the claim document
//! in the lease container, create it when nobody claims the lease set, take over a claim whose
//! resource no longer exists (with a Warning Event), and carry out handovers.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;

use super::apply::publish;
use super::publish::note;
use super::target::estimate_target;
use super::{Context, ReconcileError};
use crate::operator::claims::{Claim, Claimant, HAND_OVER_ANNOTATION, Verdict, judge, refusal};
use crate::operator::crd::ChangeFeedProcessor;
use crate::operator::spec_values::ConfigProblem;
use crate::processor::{CosmosLeaseStore, LeaseStoreError};

/// The claim document's name under the lease prefix (`{prefix}.claim`).
const CLAIM: &str = "claim";

/// Where a resource stands with its lease set (see [`crate::operator::claims`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// It holds the lease set: workers, admin actions and estimates as usual.
    Held,
    /// It holds it and hands it over: its workers stop, nothing else runs.
    HandingOver(String),
    /// Another resource holds it (the status says which).
    Refused(String),
    /// The lease container could not be read: workers as before, no admin action.
    Unknown(String),
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
            Standing::Held | Standing::Unknown(_) => None,
        }
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

/// How long a resource's standing is trusted before its claim is read again (a handover, a
/// holder deleted): admin actions and deletions always read it.
const RECHECK: Duration = Duration::from_secs(30);

/// How long opening the lease container may take before the standing is unknown this time.
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
    let key = (cfp.namespace().unwrap_or_default(), cfp.name_any());
    let target = estimate_target(cfp, found).ok().map(|t| format!("{:?}", t.settings()));
    if !fresh
        && let Some((at, seen, was)) = ctx.standings.lock().ok().and_then(|m| m.get(&key).cloned())
        && at.elapsed() < RECHECK
        && seen == target
    {
        return Ok(was);
    }
    let now = read_standing(ctx, cfp, found).await?;
    let mut standings = ctx.standings.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let kept = match (&now, standings.get(&key)) {
        (Standing::Unknown(_), Some((_, seen, was))) if *seen == target && !matches!(was, Standing::Unknown(_)) => {
            was.clone()
        }
        _ => now,
    };
    standings.insert(key, (Instant::now(), target, kept.clone()));
    Ok(kept)
}

/// Reads, creates or takes the claim of `cfp`'s lease set.
async fn read_standing(
    ctx: &Context,
    cfp: &ChangeFeedProcessor,
    found: &BTreeMap<String, Secret>,
) -> Result<Standing, ReconcileError> {
    let store = match tokio::time::timeout(OPEN_TIMEOUT, open(ctx, cfp, found)).await {
        Ok(Ok(store)) => store,
        Ok(Err(why)) => return Ok(Standing::Unknown(why)),
        Err(_) => return Ok(Standing::Unknown("opening the lease container timed out".into())),
    };
    let me = claimant(ctx, cfp);
    for _ in 0..3 {
        let (claim, etag) = match read(&store).await {
            Ok(read) => read,
            Err(error) => return Ok(Standing::Unknown(error.to_string())),
        };
        let written = match judge(claim.as_ref(), &me) {
            Verdict::Held => return hand_over_if_asked(ctx, cfp, &store, claim, etag.as_deref()).await,
            Verdict::Refused(holder) => return Ok(Standing::Refused(refusal(&holder, false))),
            Verdict::Create => write(&store, &me, None).await,
            Verdict::TakeHandover(holder) => {
                if holder_still_runs(ctx, &holder).await? {
                    let message = format!(
                        "{} hands the lease set over; waiting for its workers to stop",
                        holder.path()
                    );
                    return Ok(Standing::Refused(message));
                }
                write(&store, &me, etag.as_deref()).await
            }
            Verdict::CheckHolder(holder) => {
                if holder_exists(ctx, &holder).await? {
                    return Ok(Standing::Refused(refusal(&holder, true)));
                }
                let text = format!(
                    "took over the lease-set claim of ChangeFeedProcessor {} (uid {}), which no longer exists",
                    holder.path(),
                    holder.uid
                );
                tracing::warn!(namespace = %me.namespace, processor = %me.name, "{text}");
                publish(ctx, cfp, note(true, "LeaseSetClaimTakenOver", text)).await;
                write(&store, &me, etag.as_deref()).await
            }
        };
        match written {
            Ok(()) => return Ok(Standing::Held),
            // Another resource wrote it first: judge again.
            Err(LeaseStoreError::Changed(_) | LeaseStoreError::Gone(_)) => continue,
            Err(error) => return Ok(Standing::Unknown(error.to_string())),
        }
    }
    Ok(Standing::Unknown("the claim kept changing".into()))
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

/// Whether `holder` exists and still has worker pods that can run (or cannot be checked).
async fn holder_still_runs(ctx: &Context, holder: &Claimant) -> Result<bool, ReconcileError> {
    let cfp = match holder_now(ctx, holder).await? {
        Some(Some(cfp)) => cfp,
        Some(None) => return Ok(false),
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
) -> Result<std::sync::Arc<CosmosLeaseStore>, String> {
    let mut target = estimate_target(cfp, found).map_err(|e| e.to_string())?;
    target.create_leases = false;
    let opened = ctx
        .estimators
        .accounts()
        .open(&target)
        .await
        .map_err(|e| e.to_string())?;
    Ok(opened.store)
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
