//! A request to move a processor's checkpoints carried out, for `cfp checkpoints` and the
//! operator's rewind: refuse an export of another container, read the leases, refuse while the
//! processor runs, plan ([`super::checkpoints`]) and write the plan all or nothing
//! ([`super::checkpoint_apply`]). Each refusal has a switch of its own ([`MoveOptions`]).

use std::collections::BTreeMap;
use std::time::Duration;

use super::checkpoint_apply::{Applied, MoveError, apply, now};
use super::checkpoints::{Export, Plan, Selection, changed_signs, check_container, export, import_mode, live_signs};
use crate::cosmos::{FeedMode, MonitoredContainer, StartFrom};
use crate::processor::leases::lease::{Lease, LeaseSnapshot, LeaseStore};

/// What to do with a processor's checkpoints.
#[derive(Debug, Clone)]
pub enum Request {
    /// Move the selected leases to a position.
    Rewind {
        /// Where to.
        to: StartFrom,
        /// Which leases.
        selection: Selection,
    },
    /// Restore the leases of an export.
    Import(Box<Export>),
}

/// How a request is carried out.
#[derive(Debug, Clone)]
pub struct MoveOptions {
    /// The name the command holds the leases under (its heartbeat's instance name).
    pub holder: String,
    /// Go on although instances seem to run: their leases are taken from them (they stop those
    /// leases at their next write). The operator sets it once Kubernetes saw the worker pods
    /// go (the heartbeats they left are no instances); `--force` of `cfp checkpoints`.
    /// Switches off the running-instance check only.
    pub take_leases: bool,
    /// Import an export of another container, or of this one before it was deleted and created
    /// again (another resource id), although its positions are not this container's: a
    /// continuation beyond the container's delivers nothing until the container catches up.
    /// Only a person who means it sets it (`--other-container`); the operator never does.
    pub other_container: bool,
    /// The processor's change feed mode when the caller knows it (the operator: the resource's
    /// `spec.mode`); `None`: the lease set's, else the export's. An import creates leases in it
    /// and refuses an export of the other mode.
    pub mode: Option<FeedMode>,
    /// Plan only: write nothing.
    pub dry_run: bool,
    /// The processor's lease expiration: heartbeats and lease writes younger than that are
    /// signs of a running instance.
    pub expiration: Duration,
    /// How long to watch the lease container for a heartbeat or lease that changes when the
    /// timestamps show no running instance (another machine's clock may be behind): a renew
    /// interval and a quarter; zero watches nothing (the operator: Kubernetes saw the pods go).
    pub watch: Duration,
    /// Told at once when that watch starts, with its length (the command line shows it).
    pub on_watch: Option<fn(Duration)>,
}

/// What a request did (or, with `dry_run`, would do).
#[derive(Debug, Clone)]
pub struct Moved {
    /// The plan.
    pub plan: Plan,
    /// What was written; `None` with `dry_run`.
    pub applied: Option<Applied>,
}

/// Refuses (unless `take_leases`) when an instance of the processor runs: its heartbeat or lease
/// written within an expiration, or — the timestamps showing none — a heartbeat or lease that
/// changes while watched. The newest listing.
pub async fn refuse_running(
    store: &dyn LeaseStore,
    snapshot: LeaseSnapshot,
    options: &MoveOptions,
) -> Result<LeaseSnapshot, MoveError> {
    if options.take_leases {
        return Ok(snapshot);
    }
    let live = live_signs(&snapshot, now(), options.expiration, &options.holder);
    if !live.is_empty() {
        return Err(MoveError::Live(live));
    }
    if options.watch.is_zero() {
        return Ok(snapshot);
    }
    tracing::debug!(watch = ?options.watch, "watching the lease container for running instances");
    if let Some(told) = options.on_watch {
        told(options.watch);
    }
    tokio::time::sleep(options.watch).await;
    let later = store.snapshot().await.map_err(|e| MoveError::Read(e.to_string()))?;
    let live = changed_signs(&snapshot, &later, options.watch, &options.holder);
    if live.is_empty() {
        Ok(later)
    } else {
        Err(MoveError::Live(live))
    }
}

/// Reads the processor's leases as an export.
pub async fn read_export(store: &dyn LeaseStore, monitored: &MonitoredContainer) -> Result<Export, MoveError> {
    let snapshot = store.snapshot().await.map_err(|e| MoveError::Read(e.to_string()))?;
    if snapshot.leases.is_empty() {
        return Err(MoveError::NoLeases);
    }
    Ok(export(
        &snapshot.leases,
        store.prefix(),
        monitored.name(),
        monitored.rid(),
        now(),
    ))
}

/// Carries out `request`: refuses an export of another container (unless `other_container`),
/// reads the leases, refuses while instances run (unless `take_leases`), plans,
/// and writes the plan all or nothing (unless `dry_run`).
pub async fn move_checkpoints(
    store: &dyn LeaseStore,
    monitored: &MonitoredContainer,
    request: &Request,
    options: &MoveOptions,
) -> Result<Moved, MoveError> {
    // Another container's export is refused before anything is read or watched.
    if let Request::Import(export) = request {
        check_container(export, monitored.name(), monitored.rid(), options.other_container)?;
    }
    let snapshot = store.snapshot().await.map_err(|e| MoveError::Read(e.to_string()))?;
    // An import may fill an empty lease set (a new lease container, another processor name).
    if snapshot.leases.is_empty() && matches!(request, Request::Rewind { .. }) {
        return Err(MoveError::NoLeases);
    }
    let snapshot = refuse_running(store, snapshot, options).await?;
    let plan = match request {
        Request::Rewind { to, selection } => {
            let anchored = anchor(monitored, &snapshot.leases, *to, selection).await?;
            super::checkpoints::plan_rewind(&snapshot.leases, *to, selection, &anchored)?
        }
        Request::Import(export) => {
            let mode = import_mode(&snapshot.leases, export, options.mode)?;
            super::checkpoints::plan_import(&snapshot.leases, export, store.prefix(), mode)?
        }
    };
    let lines = plan.lines();
    tracing::info!(
        changes = lines.len(),
        dry_run = options.dry_run,
        "planned the checkpoint moves"
    );
    for line in lines {
        tracing::debug!(dry_run = options.dry_run, "{line}");
    }
    if options.dry_run || plan.is_empty() {
        let applied = (!options.dry_run).then(Applied::default);
        return Ok(Moved { plan, applied });
    }
    let applied = apply(store, &plan, &options.holder, options.expiration).await?;
    Ok(Moved {
        plan,
        applied: Some(applied),
    })
}

/// For `now`: the current continuation of every selected lease's range, by lease id.
async fn anchor(
    monitored: &MonitoredContainer,
    leases: &[Lease],
    to: StartFrom,
    selection: &Selection,
) -> Result<BTreeMap<String, String>, MoveError> {
    let mut anchored = BTreeMap::new();
    if to != StartFrom::Now {
        return Ok(anchored);
    }
    for lease in leases.iter().filter(|l| selection.selects(l)) {
        let Some(range) = lease.range() else { continue };
        let mode = FeedMode::of_lease(lease.mode.as_deref());
        let continuation = crate::processor::leases::bootstrap::anchor_now(monitored, range, mode)
            .await
            .map_err(|e| MoveError::Read(format!("reading where range {range} stands now: {e}")))?;
        anchored.insert(lease.id.clone(), continuation);
    }
    Ok(anchored)
}
