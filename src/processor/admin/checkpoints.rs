//! Checkpoints as something to read, save and move: the export format of a processor's leases,
//! and the plans of `rewind` (every selected lease to one position) and `import` (the leases of
//! an export, mapped through splits since, as adoption maps foreign checkpoints). Pure: the
//! reads and the all-or-nothing writes are in [`crate::processor::admin::checkpoint_requests`] and
//! [`crate::processor::admin::checkpoint_apply`].
//!
//! A position is what a worker reads from: a continuation, or — while a lease has none — its
//! `startFrom` property (`beginning` or an RFC 3339 time), else the processor's start position.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::cosmos::{EpkRange, FeedMode, StartFrom, continuation_lsn};
use crate::processor::leases::adopt::{ForeignCheckpoint, Scope};
use crate::processor::leases::lag_report::LATEST_LSN_PROPERTY;
use crate::processor::leases::lease::{
    HANDLER_FAILING_PROPERTY, Lease, LeaseSnapshot, STALLED_PROPERTY, START_FROM_PROPERTY,
};

/// The version of the export format.
pub const EXPORT_FORMAT: u32 = 1;

/// A processor's checkpoints, as `cfp checkpoints export` writes them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Export {
    /// The format version ([`EXPORT_FORMAT`]).
    pub format: u32,
    /// The lease-id prefix of the processor (processor name, account, database and container).
    pub prefix: String,
    /// The monitored container, `database/container`.
    pub container: String,
    /// The monitored container's resource id: continuations apply to it only.
    pub container_rid: String,
    /// The processor's change feed mode (`latest-version` or `all-versions-and-deletes`): an
    /// import creates leases in it, and refuses a processor of the other mode. None in exports
    /// of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<FeedMode>,
    /// When the export was read.
    #[serde(with = "time::serde::rfc3339")]
    pub exported_at: OffsetDateTime,
    /// One entry per lease, in range order.
    pub leases: Vec<ExportedLease>,
}

/// One lease of an export.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExportedLease {
    /// The lease document's id.
    pub id: String,
    /// The feed range.
    pub range: EpkRange,
    /// The raw server continuation (none: the lease was never checkpointed).
    pub continuation: Option<String>,
    /// The LSN the continuation names, when it names one.
    #[serde(default)]
    pub lsn: Option<u64>,
    /// Where the lease starts while it has no continuation (`beginning` or a time), when not
    /// where the processor's options say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_from: Option<String>,
    /// The owner when exported.
    #[serde(default)]
    pub owner: Option<String>,
    /// The lease's last update.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub timestamp: Option<OffsetDateTime>,
    /// The lease's last checkpoint.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub checkpoint_time: Option<OffsetDateTime>,
}

/// The export of a processor's leases (`prefix` and container identify what they apply to, the
/// leases' mode the mode an import writes).
pub fn export(leases: &[Lease], prefix: &str, container: &str, container_rid: &str, now: OffsetDateTime) -> Export {
    let mode = lease_set_mode(leases);
    let mut leases: Vec<ExportedLease> = leases
        .iter()
        .filter_map(|lease| {
            Some(ExportedLease {
                id: lease.id.clone(),
                range: lease.range()?.clone(),
                continuation: lease.continuation.clone(),
                lsn: lease.continuation.as_deref().and_then(continuation_lsn),
                start_from: lease.properties.get(START_FROM_PROPERTY).cloned(),
                owner: lease.owner.clone().filter(|o| !o.is_empty()),
                timestamp: lease.timestamp,
                checkpoint_time: lease.checkpoint_time,
            })
        })
        .collect();
    leases.sort_by(|a, b| a.range.cmp(&b.range));
    Export {
        format: EXPORT_FORMAT,
        prefix: prefix.to_owned(),
        container: container.to_owned(),
        container_rid: container_rid.to_owned(),
        mode,
        exported_at: now,
        leases,
    }
}

/// Where a lease reads from: a continuation, else its `startFrom` property.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Position {
    /// The raw server continuation.
    pub continuation: Option<String>,
    /// The `startFrom` property (used while there is no continuation).
    pub start_from: Option<String>,
}

impl Position {
    /// The position a lease holds now.
    pub fn of(lease: &Lease) -> Self {
        Self {
            continuation: lease.continuation.clone(),
            start_from: lease.properties.get(START_FROM_PROPERTY).cloned(),
        }
    }

    /// The position of `start` (`Now` needs the range's current continuation: `anchored`).
    pub fn at(start: StartFrom, anchored: Option<&str>) -> Self {
        match start {
            StartFrom::Beginning => Self::start("beginning".into()),
            StartFrom::Time(at) => Self::start(at.format(&Rfc3339).unwrap_or_default()),
            StartFrom::Now => Self {
                continuation: anchored.map(str::to_owned),
                start_from: None,
            },
        }
    }

    fn start(start_from: String) -> Self {
        Self {
            continuation: None,
            start_from: Some(start_from),
        }
    }

    /// For people: the LSN of the continuation, the start property, or "start position".
    pub fn describe(&self) -> String {
        match (&self.continuation, &self.start_from) {
            (Some(c), _) => continuation_lsn(c).map_or_else(|| "a checkpoint".into(), |lsn| format!("LSN {lsn}")),
            (None, Some(start)) => format!("from {start}"),
            (None, None) => "the processor's start position".into(),
        }
    }

    /// `lease` moved here: no handoff request, no stale handler failure or stall, and no lag
    /// report (a report belongs to the checkpoint beside it: [`crate::processor::leases::lag_report`]).
    pub fn apply_to(&self, lease: &Lease) -> Lease {
        let mut moved = lease.clone();
        moved.continuation = self.continuation.clone();
        match &self.start_from {
            Some(start) => moved.properties.insert(START_FROM_PROPERTY.into(), start.clone()),
            None => moved.properties.remove(START_FROM_PROPERTY),
        };
        for stale in [HANDLER_FAILING_PROPERTY, STALLED_PROPERTY, LATEST_LSN_PROPERTY] {
            moved.properties.remove(stale);
        }
        moved.clear_handoff();
        moved
    }
}

/// One lease changed in place.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    /// The lease as read.
    pub lease: Lease,
    /// Where it goes.
    pub to: Position,
}

/// What a rewind or an import writes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// Leases moved in place.
    pub moves: Vec<Move>,
    /// Leases created (an import of ranges split since the export: the parent range again).
    pub creates: Vec<Lease>,
    /// Leases deleted (the children of those ranges), as read.
    pub deletes: Vec<Lease>,
    /// What the plan leaves out and why, for people.
    pub notes: Vec<String>,
}

impl Plan {
    /// Whether nothing would be written.
    pub fn is_empty(&self) -> bool {
        self.moves.is_empty() && self.creates.is_empty() && self.deletes.is_empty()
    }

    /// The leases as read that the plan writes (moved or deleted): the ones to claim.
    pub fn touched(&self) -> impl Iterator<Item = &Lease> {
        self.moves.iter().map(|m| &m.lease).chain(&self.deletes)
    }

    /// One line per change, for `--dry-run` and the log.
    pub fn lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .moves
            .iter()
            .map(|m| {
                let from = Position::of(&m.lease).describe();
                format!("move {}: {from} -> {}", m.lease.lease_token, m.to.describe())
            })
            .collect();
        lines.extend(
            self.creates
                .iter()
                .map(|l| format!("create {}: {}", l.lease_token, Position::of(l).describe())),
        );
        lines.extend(
            self.deletes
                .iter()
                .map(|l| format!("delete {} (its range is restored as a whole)", l.lease_token)),
        );
        lines.extend(self.notes.iter().map(|n| format!("note: {n}")));
        lines
    }
}

/// Which leases a rewind moves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Lease ids or lease tokens (`min-max`); empty: no selection by lease.
    pub leases: Vec<String>,
    /// Ranges: every lease sharing a key with one is moved (short hex bounds read as padded
    /// with zeros: `20-30` is `20…0-30…0`); empty: no selection by range.
    pub ranges: Vec<EpkRange>,
}

impl Selection {
    /// Whether `lease` is selected (everything when nothing is named).
    pub fn selects(&self, lease: &Lease) -> bool {
        if self.leases.is_empty() && self.ranges.is_empty() {
            return true;
        }
        let named = self.leases.iter().any(|n| *n == lease.id || *n == lease.lease_token);
        named
            || lease
                .range()
                .is_some_and(|r| self.ranges.iter().any(|s| s.overlaps_as_keys(r)))
    }
}

/// Why a plan cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The selection names leases that do not exist.
    #[error("no lease matches {0}: see `cfp checkpoints export` for the leases and their ranges")]
    NoMatch(String),
    /// The export is not one this version reads.
    #[error("the export has format {0}; this cfp reads format {EXPORT_FORMAT}")]
    Format(u32),
    /// The export is of another container.
    #[error(
        "the export is of container {exported} (resource id {exported_rid}), not of {current} ({current_rid}): its checkpoints do not apply here"
    )]
    OtherContainer {
        /// The exported container's name.
        exported: String,
        /// Its resource id.
        exported_rid: String,
        /// The container now.
        current: String,
        /// Its resource id.
        current_rid: String,
    },
    /// The export is of a processor of another change feed mode.
    #[error(
        "the export is of a processor in the {} mode, this one reads the {} mode: its leases would be refused by the workers; export and import within one mode", .exported.as_str(), .current.as_str()
    )]
    OtherMode {
        /// The export's mode.
        exported: FeedMode,
        /// The processor's mode.
        current: FeedMode,
    },
    /// Two exported leases overlap.
    #[error("the export's leases {0} and {1} overlap: the file was edited or is not an export")]
    Overlap(String, String),
    /// The export holds no lease.
    #[error("the export holds no lease")]
    Empty,
}

/// Moves every selected lease to `start`; `anchored` holds, for `now`, each selected lease's
/// current continuation by lease id.
pub fn plan_rewind(
    leases: &[Lease],
    start: StartFrom,
    selection: &Selection,
    anchored: &BTreeMap<String, String>,
) -> Result<Plan, PlanError> {
    for name in &selection.leases {
        if !leases.iter().any(|l| l.id == *name || l.lease_token == *name) {
            return Err(PlanError::NoMatch(format!("lease {name:?}")));
        }
    }
    for range in &selection.ranges {
        if !leases
            .iter()
            .any(|l| l.range().is_some_and(|r| r.overlaps_as_keys(range)))
        {
            return Err(PlanError::NoMatch(format!("range {range}")));
        }
    }
    let moves = leases
        .iter()
        .filter(|lease| selection.selects(lease))
        .map(|lease| Move {
            lease: lease.clone(),
            to: Position::at(start, anchored.get(&lease.id).map(String::as_str)),
        })
        .collect();
    Ok(Plan {
        moves,
        ..Plan::default()
    })
}

/// The leases of `export` over the current ones: a range leased now as then is moved in place;
/// an exported range split since is leased whole again (the current leases inside it deleted —
/// the worker reads it across the children and splits the lease as it does after any split);
/// a current lease outside every exported range is left as it is.
/// The leases created are written in `mode`, the processor's ([`import_mode`]).
pub fn plan_import(current: &[Lease], export: &Export, prefix: &str, mode: FeedMode) -> Result<Plan, PlanError> {
    let wanted = exported_ranges(export)?;
    let mut plan = Plan::default();
    for (range, to) in &wanted {
        match current.iter().find(|l| l.range() == Some(range)) {
            Some(lease) => plan.moves.push(Move {
                lease: lease.clone(),
                to: to.clone(),
            }),
            None => {
                let mut created = Lease::new(prefix, range, None);
                created.mode = Some(mode.lease_mode().to_owned());
                plan.creates.push(to.apply_to(&created));
            }
        }
    }
    for lease in current {
        let Some(range) = lease.range() else { continue };
        let inside = wanted.iter().any(|(w, _)| w.overlaps(range));
        let kept = wanted.iter().any(|(w, _)| w == range);
        if inside && !kept {
            plan.deletes.push(lease.clone());
        } else if !inside {
            plan.notes.push(format!(
                "lease {} is not in the export (its range was never leased then); left as it is",
                lease.lease_token
            ));
        }
    }
    Ok(plan)
}

/// The mode of a lease set (its leases share one: the workers' bootstrap refuses others); `None`
/// without leases.
fn lease_set_mode(leases: &[Lease]) -> Option<FeedMode> {
    leases.first().map(|l| FeedMode::of_lease(l.mode.as_deref()))
}

/// The processor's mode for an import of `export` over `current`: `known` when the caller knows
/// it (the operator: the resource's spec), else the lease set's, else the export's, else the
/// latest version. An export recorded in another mode is refused.
pub fn import_mode(current: &[Lease], export: &Export, known: Option<FeedMode>) -> Result<FeedMode, PlanError> {
    let mode = known
        .or_else(|| lease_set_mode(current))
        .or(export.mode)
        .unwrap_or_default();
    match export.mode {
        Some(exported) if exported != mode => Err(PlanError::OtherMode {
            exported,
            current: mode,
        }),
        _ => Ok(mode),
    }
}

/// The exported ranges and positions, through adoption's mapping (EPK scopes map to themselves;
/// overlapping entries are refused).
fn exported_ranges(export: &Export) -> Result<Vec<(EpkRange, Position)>, PlanError> {
    if export.format != EXPORT_FORMAT {
        return Err(PlanError::Format(export.format));
    }
    if export.leases.is_empty() {
        return Err(PlanError::Empty);
    }
    for (i, a) in export.leases.iter().enumerate() {
        if let Some(b) = export.leases[i + 1..].iter().find(|b| b.range.overlaps(&a.range)) {
            return Err(PlanError::Overlap(a.range.lease_token(), b.range.lease_token()));
        }
    }
    let checkpoints: Vec<ForeignCheckpoint> = export
        .leases
        .iter()
        .map(|l| ForeignCheckpoint {
            id: l.id.clone(),
            scope: Scope::Epk(l.range.clone()),
            continuation: l.continuation.clone(),
            owner: None,
            timestamp: l.timestamp,
        })
        .collect();
    let (adopted, _) = crate::processor::leases::adopt::plan(&checkpoints, &[]);
    Ok(adopted
        .into_iter()
        .map(|a| {
            let start_from = export
                .leases
                .iter()
                .find(|l| l.range == a.range)
                .and_then(|l| l.start_from.clone());
            let position = Position {
                start_from: start_from.filter(|_| a.continuation.is_none()),
                continuation: a.continuation,
            };
            (a.range, position)
        })
        .collect())
}

/// Refuses an export of another container unless `other_container`: the database, the
/// container's name and its resource id must all match (a container deleted and created again
/// under its name gets another resource id; an emulator restarted may hand out the same ones,
/// names differ). The one check of every import: `cfp checkpoints import` and the operator's
/// restore (which never passes `other_container`).
pub fn check_container(
    export: &Export,
    current: &str,
    current_rid: &str,
    other_container: bool,
) -> Result<(), PlanError> {
    if other_container || (export.container == current && export.container_rid == current_rid) {
        return Ok(());
    }
    Err(PlanError::OtherContainer {
        exported: export.container.clone(),
        exported_rid: export.container_rid.clone(),
        current: current.to_owned(),
        current_rid: current_rid.to_owned(),
    })
}

/// Signs that instances of the processor run, other than `me`: heartbeats and owned leases
/// written within `expiration` of `now` (or ahead of it), one line each.
pub fn live_signs(snapshot: &LeaseSnapshot, now: OffsetDateTime, expiration: Duration, me: &str) -> Vec<String> {
    let recent = |at: OffsetDateTime| (now - at) < time::Duration::try_from(expiration).unwrap_or(time::Duration::MAX);
    let ago = |at: OffsetDateTime| (now - at).whole_seconds().max(0);
    let mut signs: Vec<String> = snapshot
        .instances
        .iter()
        .filter(|(name, beat)| name != me && recent(*beat))
        .map(|(name, beat)| format!("instance {name} sent a heartbeat {} s ago", ago(*beat)))
        .collect();
    signs.extend(
        snapshot
            .leases
            .iter()
            .filter(|l| l.owner.as_deref().is_some_and(|o| o != me))
            .filter_map(|l| Some((l, l.renewed_at()?)))
            .filter(|(_, at)| recent(*at))
            .map(|(l, at)| {
                let owner = l.owner.as_deref().unwrap_or_default();
                format!("lease {} is owned by {owner}, written {} s ago", l.lease_token, ago(at))
            }),
    );
    signs
}

/// The signs of a running instance between two listings `watched` apart: a heartbeat that
/// beat (or appeared), a lease another instance wrote. Judged by change, not by the timestamps
/// other machines' clocks wrote: an instance whose clock is behind writes times that look old,
/// and with instance liveness its idle leases are not written at all.
pub fn changed_signs(before: &LeaseSnapshot, after: &LeaseSnapshot, watched: Duration, me: &str) -> Vec<String> {
    let seconds = watched.as_secs_f64();
    let mut signs: Vec<String> = after
        .instances
        .iter()
        .filter(|(name, beat)| name != me && !before.instances.iter().any(|(n, b)| n == name && b == beat))
        .map(|(name, _)| format!("instance {name} sent a heartbeat within the {seconds:.0} s watched"))
        .collect();
    signs.extend(
        after
            .leases
            .iter()
            .filter(|l| l.owner.as_deref().is_some_and(|o| !o.is_empty() && o != me))
            .filter(|l| !before.leases.iter().any(|b| b.id == l.id && b.etag == l.etag))
            .map(|l| {
                let owner = l.owner.as_deref().unwrap_or_default();
                format!(
                    "lease {} of {owner} was written within the {seconds:.0} s watched",
                    l.lease_token
                )
            }),
    );
    signs
}

#[cfg(test)]
#[path = "checkpoints_tests.rs"]
mod tests;
