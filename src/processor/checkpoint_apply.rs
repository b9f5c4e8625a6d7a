//! Writing a checkpoint plan ([`super::checkpoints`]) so that no worker ever reads from half the
//! leases moved: **claim, move, release**.
//!
//! 1. Claim: every lease the plan writes gets this command as its owner (If-Match, a fresh
//!    timestamp) and the command sends a heartbeat with the liveness marker, refreshed while it
//!    works. A worker — also one starting in the middle — takes no lease of a live owner (it asks
//!    for a handoff, which this owner never grants within the operation), so from the first claim
//!    on nobody reads a claimed lease.
//! 2. Move: the claimed leases get their new positions (created and deleted ones for an import),
//!    still owned by the command.
//! 3. Release: the moved leases lose their owner and are taken by the workers.
//!
//! So a worker reads a lease either before anything moved, or after every lease moved. A failure
//! before the release writes every lease back as it was (positions, owners) and deletes what was
//! created: the processor stays where it was. A crash of the command itself in step 2 leaves the
//! claimed leases to expire (one lease expiration) with the moves made so far: run the command
//! again (a rewind or an import is idempotent).

use std::collections::BTreeMap;
use std::time::Duration;

use time::OffsetDateTime;

use super::checkpoints::{Export, Plan, PlanError, Selection, check_container, export, live_signs};
use super::lease::{Lease, LeaseStore, LeaseStoreError};
use crate::cosmos::{FeedMode, MonitoredContainer, StartFrom};

/// How often the command's heartbeat is sent while it holds leases.
const BEAT_EVERY: Duration = Duration::from_secs(3);
/// Writes of one lease that may meet another writer (412) before the command gives up.
const ATTEMPTS: u32 = 5;

/// Why checkpoints could not be moved.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    /// Instances of the processor run.
    #[error("the processor is running: {}; stop its workers first (or --force, which takes their leases)", .0.join("; "))]
    Live(Vec<String>),
    /// No plan can be made.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The processor has no leases.
    #[error("the processor has no leases in the lease container (not started yet, or another --processor name?)")]
    NoLeases,
    /// A lease store request failed; everything written was put back.
    #[error("{step} lease {lease}: {source}; nothing was changed")]
    Store {
        /// What was being done.
        step: &'static str,
        /// The lease.
        lease: String,
        /// The failure.
        source: LeaseStoreError,
    },
    /// A lease was taken while the command held it; everything written was put back.
    #[error("lease {lease} was taken by {owner} while the checkpoints were moved; nothing was changed")]
    Taken {
        /// The lease.
        lease: String,
        /// Its new owner.
        owner: String,
    },
    /// Reading the leases or the change feed failed before anything was written.
    #[error("{0}")]
    Read(String),
}

/// What was written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Leases moved in place.
    pub moved: usize,
    /// Leases created.
    pub created: usize,
    /// Leases deleted.
    pub deleted: usize,
    /// Leases that stay claimed because their release failed (they expire after one lease
    /// expiration, already moved).
    pub unreleased: Vec<String>,
}

impl Applied {
    /// In words: what was moved, created and deleted, and what stays held.
    pub fn describe(&self) -> String {
        let mut text = format!(
            "moved {} lease(s), created {}, deleted {}",
            self.moved, self.created, self.deleted
        );
        if !self.unreleased.is_empty() {
            text.push_str(&format!(
                "; {} stay held by this command until they expire (lease expiration): {}",
                self.unreleased.len(),
                self.unreleased.join(", ")
            ));
        }
        text
    }
}

/// What to put back when a later step fails, newest last.
enum Undo {
    /// Write this version (as read) back over the held one.
    Restore(Lease),
    /// Delete the held lease of this id (created by the command).
    Remove(String),
    /// Create this lease (as read) again: the command deleted it.
    Recreate(Lease),
}

/// One application of a plan by `holder`.
struct Session<'a> {
    store: &'a dyn LeaseStore,
    holder: &'a str,
    /// The leases the command holds now, by id (their current versions).
    held: BTreeMap<String, Lease>,
    undo: Vec<Undo>,
}

/// Writes `plan` as `holder` (claim, move, release); on a failure before the release, puts
/// everything back. The command's heartbeat runs meanwhile and is removed at the end.
pub async fn apply(store: &dyn LeaseStore, plan: &Plan, holder: &str) -> Result<Applied, MoveError> {
    let mut session = Session {
        store,
        holder,
        held: BTreeMap::new(),
        undo: Vec::new(),
    };
    let beat = async {
        loop {
            if let Err(error) = store.heartbeat(holder, true).await {
                tracing::warn!(%error, "the heartbeat of the checkpoint command failed");
            }
            tokio::time::sleep(BEAT_EVERY).await;
        }
    };
    let result = tokio::select! {
        result = session.run(plan) => result,
        () = beat => unreachable!("the heartbeat loop never ends"),
    };
    if let Err(error) = store.remove_heartbeat(holder).await {
        tracing::warn!(%error, "removing the heartbeat of the checkpoint command failed; it expires by itself");
    }
    result
}

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

impl Session<'_> {
    async fn run(&mut self, plan: &Plan) -> Result<Applied, MoveError> {
        if let Err(error) = self.claim_and_move(plan).await {
            self.roll_back().await;
            return Err(error);
        }
        let mut applied = Applied {
            moved: plan.moves.len(),
            created: plan.creates.len(),
            deleted: plan.deletes.len(),
            unreleased: Vec::new(),
        };
        let ids: Vec<String> = self.held.keys().cloned().collect();
        for id in ids {
            let released = self
                .write(&id, |lease| {
                    lease.owner = None;
                })
                .await;
            if let Err(error) = released {
                tracing::warn!(lease = id, %error, "releasing a moved lease failed; it expires after the lease expiration");
                applied.unreleased.push(id);
            }
        }
        Ok(applied)
    }

    async fn claim_and_move(&mut self, plan: &Plan) -> Result<(), MoveError> {
        for lease in plan.touched() {
            self.claim(lease).await?;
        }
        for change in &plan.moves {
            let to = change.to.clone();
            self.write(&change.lease.id, move |lease| *lease = to.apply_to(lease))
                .await?;
        }
        for lease in &plan.creates {
            self.create(lease).await?;
        }
        for lease in &plan.deletes {
            self.delete(&lease.id).await?;
        }
        Ok(())
    }

    /// Takes `lease` (as read) for the command, re-reading it when another writer came first.
    async fn claim(&mut self, lease: &Lease) -> Result<(), MoveError> {
        let store_error = |source| MoveError::Store {
            step: "claiming",
            lease: lease.lease_token.clone(),
            source,
        };
        let mut current = lease.clone();
        for _ in 0..ATTEMPTS {
            let mut claimed = current.clone();
            claimed.owner = Some(self.holder.to_owned());
            claimed.timestamp = Some(now());
            claimed.clear_handoff();
            match self.store.replace(&claimed).await {
                Ok(written) => {
                    self.undo.push(Undo::Restore(current));
                    self.held.insert(written.id.clone(), written);
                    return Ok(());
                }
                Err(LeaseStoreError::Changed(_)) => {
                    current = self
                        .store
                        .read(&lease.id)
                        .await
                        .map_err(store_error)?
                        .ok_or_else(|| store_error(LeaseStoreError::Gone(lease.id.clone())))?;
                }
                Err(error) => return Err(store_error(error)),
            }
        }
        Err(store_error(LeaseStoreError::Changed(lease.id.clone())))
    }

    /// Changes the held lease `id` with `change` (owner stays the command's until the release);
    /// after a 412 (a handoff request written into it) re-reads it and changes that version.
    async fn write(&mut self, id: &str, change: impl Fn(&mut Lease)) -> Result<(), MoveError> {
        let store_error = |source| MoveError::Store {
            step: "moving",
            lease: id.to_owned(),
            source,
        };
        let Some(mut current) = self.held.get(id).cloned() else {
            return Err(store_error(LeaseStoreError::Gone(id.to_owned())));
        };
        for _ in 0..ATTEMPTS {
            let mut next = current.clone();
            next.clear_handoff();
            next.timestamp = Some(now());
            change(&mut next);
            match self.store.replace(&next).await {
                Ok(written) => {
                    self.held.insert(id.to_owned(), written);
                    return Ok(());
                }
                Err(LeaseStoreError::Changed(_)) => {
                    let read = self.store.read(id).await.map_err(store_error)?;
                    current = read.ok_or_else(|| store_error(LeaseStoreError::Gone(id.to_owned())))?;
                    if current.owner.as_deref() != Some(self.holder) {
                        let owner = current.owner.clone().unwrap_or_else(|| "nobody".into());
                        return Err(MoveError::Taken {
                            lease: id.to_owned(),
                            owner,
                        });
                    }
                }
                Err(error) => return Err(store_error(error)),
            }
        }
        Err(store_error(LeaseStoreError::Changed(id.to_owned())))
    }

    async fn create(&mut self, lease: &Lease) -> Result<(), MoveError> {
        let mut lease = lease.clone();
        lease.owner = Some(self.holder.to_owned());
        lease.timestamp = Some(now());
        let store_error = |source| MoveError::Store {
            step: "creating",
            lease: lease.lease_token.clone(),
            source,
        };
        match self.store.create(&lease).await {
            Ok(Some(created)) => {
                self.undo.push(Undo::Remove(created.id.clone()));
                self.held.insert(created.id.clone(), created);
                Ok(())
            }
            // A lease of that range appeared meanwhile (a worker's bootstrap): start over.
            Ok(None) => Err(store_error(LeaseStoreError::Changed(lease.id.clone()))),
            Err(error) => Err(store_error(error)),
        }
    }

    async fn delete(&mut self, id: &str) -> Result<(), MoveError> {
        let Some(held) = self.held.remove(id) else {
            return Ok(());
        };
        match self.store.delete(&held).await {
            Ok(()) => {
                let original = self.undo.iter().find_map(|u| match u {
                    Undo::Restore(original) if original.id == id => Some(original.clone()),
                    _ => None,
                });
                self.undo.extend(original.map(Undo::Recreate));
                Ok(())
            }
            Err(source) => {
                self.held.insert(id.to_owned(), held);
                Err(MoveError::Store {
                    step: "deleting",
                    lease: id.to_owned(),
                    source,
                })
            }
        }
    }

    /// Puts back everything written, newest first; what cannot be put back is logged.
    async fn roll_back(&mut self) {
        while let Some(step) = self.undo.pop() {
            let result = match step {
                Undo::Restore(original) => match self.held.get(&original.id) {
                    Some(held) => {
                        let back = Lease {
                            etag: held.etag.clone(),
                            ..original
                        };
                        self.store.replace(&back).await.map(|written| {
                            self.held.insert(written.id.clone(), written);
                        })
                    }
                    None => Ok(()),
                },
                Undo::Remove(id) => match self.held.remove(&id) {
                    Some(held) => self.store.delete(&held).await,
                    None => Ok(()),
                },
                Undo::Recreate(original) => self.store.create(&original).await.map(|created| {
                    self.held.extend(created.map(|c| (c.id.clone(), c)));
                }),
            };
            if let Err(error) = result {
                tracing::error!(%error, "putting a lease back failed; it expires after the lease expiration");
            }
        }
    }
}

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
    /// Go on although instances seem to run (their leases are taken), or an export is of
    /// another container.
    pub force: bool,
    /// Plan only: write nothing.
    pub dry_run: bool,
    /// The processor's lease expiration: heartbeats and lease writes younger than that are
    /// signs of a running instance.
    pub expiration: Duration,
}

/// What a request did (or, with `dry_run`, would do).
#[derive(Debug, Clone)]
pub struct Moved {
    /// The plan.
    pub plan: Plan,
    /// What was written; `None` with `dry_run`.
    pub applied: Option<Applied>,
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

/// Carries out `request`: reads the leases, refuses while instances run (unless forced), plans,
/// and writes the plan all or nothing (unless `dry_run`).
pub async fn move_checkpoints(
    store: &dyn LeaseStore,
    monitored: &MonitoredContainer,
    request: &Request,
    options: &MoveOptions,
) -> Result<Moved, MoveError> {
    let snapshot = store.snapshot().await.map_err(|e| MoveError::Read(e.to_string()))?;
    if snapshot.leases.is_empty() {
        return Err(MoveError::NoLeases);
    }
    let live = live_signs(&snapshot, now(), options.expiration, &options.holder);
    if !live.is_empty() && !options.force {
        return Err(MoveError::Live(live));
    }
    let plan = match request {
        Request::Rewind { to, selection } => {
            let anchored = anchor(monitored, &snapshot.leases, *to, selection).await?;
            super::checkpoints::plan_rewind(&snapshot.leases, *to, selection, &anchored)?
        }
        Request::Import(export) => {
            check_container(export, monitored.name(), monitored.rid(), options.force)?;
            super::checkpoints::plan_import(&snapshot.leases, export, store.prefix())?
        }
    };
    for line in plan.lines() {
        tracing::info!(dry_run = options.dry_run, "{line}");
    }
    if options.dry_run || plan.is_empty() {
        let applied = (!options.dry_run).then(Applied::default);
        return Ok(Moved { plan, applied });
    }
    let applied = apply(store, &plan, &options.holder).await?;
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
        let continuation = super::bootstrap::anchor_now(monitored, range, mode)
            .await
            .map_err(|e| MoveError::Read(format!("reading where range {range} stands now: {e}")))?;
        anchored.insert(lease.id.clone(), continuation);
    }
    Ok(anchored)
}
