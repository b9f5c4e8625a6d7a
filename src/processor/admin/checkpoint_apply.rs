//! Writing a checkpoint plan ([`crate::processor::admin::checkpoints`]) so that no worker ever
//! reads from half the leases moved: **claim, move, release**.
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
//! A worker takes a claimed lease at the earliest one lease expiration after the claim (its
//! handoff request unanswered that long), so every move is made within half an expiration of the
//! first claim, or none is (the lease container answered too slowly: everything is put back).
//! So a worker reads a lease either before anything moved, or after every lease moved. A failure
//! before the release writes every lease back as it was (positions, owners) and deletes what was
//! created: the processor stays where it was. A crash of the command itself in step 2 leaves the
//! claimed leases to expire (one lease expiration) with the moves made so far: run the command
//! again (a rewind or an import is idempotent).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use time::OffsetDateTime;
use tokio::time::Instant;

use super::checkpoints::{Plan, PlanError};
use crate::processor::leases::lease::{Lease, LeaseStore, LeaseStoreError};
use crate::processor::leases::name_claim::NameClaim;

/// How often the command's heartbeat is sent while it holds leases.
const BEAT_EVERY: Duration = Duration::from_secs(3);
/// Writes of one lease that may meet another writer (412) before the command gives up.
const ATTEMPTS: u32 = 5;
/// Lease writes in flight at once.
const CONCURRENCY: usize = 16;

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
    /// The lease container answered too slowly to move every lease while no worker can take one.
    #[error("the lease container answered too slowly to move {leases} leases within half of the lease expiration of {}: a worker could have taken a moved lease before all had moved; nothing was changed — try again (throttled?), and give the processor's --lease-expiration if it is longer", humantime::format_duration(*.expiration))]
    TooSlow {
        /// The leases to write.
        leases: usize,
        /// The lease expiration.
        expiration: Duration,
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
    /// The processor's lease expiration.
    expiration: Duration,
    /// No lease is moved after this (half an expiration after the first claim): until a lease
    /// expiration after its claim no worker takes a claimed lease, so every move is made while
    /// no worker can have read a moved lease.
    deadline: Instant,
    /// The leases the command holds now, by id (their current versions).
    held: BTreeMap<String, Lease>,
    undo: Vec<Undo>,
}

/// Writes `plan` as `holder` (claim, move, release) for a processor whose lease expiration is
/// `expiration`; on a failure before the release, puts everything back. The command's heartbeat
/// runs meanwhile (every quarter expiration at most) and is removed at the end.
pub async fn apply(
    store: &dyn LeaseStore,
    plan: &Plan,
    holder: &str,
    expiration: Duration,
) -> Result<Applied, MoveError> {
    let mut session = Session {
        store,
        holder,
        expiration,
        deadline: Instant::now() + expiration / 2,
        held: BTreeMap::new(),
        undo: Vec::new(),
    };
    let name = NameClaim::new(holder, &format!("{:016x}", fastrand::u64(..)), None);
    let beat = async {
        loop {
            if let Err(error) = name.beat(store, true).await {
                tracing::warn!(%error, "the heartbeat of the checkpoint command failed");
            }
            tokio::time::sleep(BEAT_EVERY.min(expiration / 4)).await;
        }
    };
    let result = tokio::select! {
        result = session.run(plan) => result,
        () = beat => unreachable!("the heartbeat loop never ends"),
    };
    if let Err(error) = name.remove(store).await {
        tracing::warn!(%error, "removing the heartbeat of the checkpoint command failed; it expires by itself");
    }
    result
}

pub(super) fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

/// Runs `writes` at most [`CONCURRENCY`] at a time; every result, in no particular order.
async fn all<'a, T>(writes: Vec<futures::future::BoxFuture<'a, T>>) -> Vec<T> {
    futures::stream::iter(writes)
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await
}

/// Takes `lease` (as read) for `holder`, re-reading it when another writer came first: the
/// version taken over and the version written.
async fn claim(store: &dyn LeaseStore, holder: &str, lease: &Lease) -> Result<(Lease, Lease), MoveError> {
    let store_error = |source| MoveError::Store {
        step: "claiming",
        lease: lease.lease_token.clone(),
        source,
    };
    let mut current = lease.clone();
    for _ in 0..ATTEMPTS {
        let mut claimed = current.clone();
        claimed.take_for(holder, format!("{holder}.{:016x}", fastrand::u64(..)));
        claimed.timestamp = Some(now());
        claimed.clear_handoff();
        match store.replace(&claimed).await {
            Ok(written) => return Ok((current, written)),
            Err(LeaseStoreError::Changed(_)) => {
                current = store
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

/// Changes `current`, held by `holder`, with `change` (no handoff request, a fresh timestamp);
/// after a 412 (a handoff request written into it) re-reads it and changes that version.
async fn change_held(
    store: &dyn LeaseStore,
    holder: &str,
    mut current: Lease,
    change: impl Fn(&mut Lease),
) -> Result<Lease, MoveError> {
    let id = current.id.clone();
    let store_error = |source| MoveError::Store {
        step: "moving",
        lease: id.clone(),
        source,
    };
    for _ in 0..ATTEMPTS {
        let mut next = current.clone();
        next.clear_handoff();
        next.timestamp = Some(now());
        change(&mut next);
        match store.replace(&next).await {
            Ok(written) => return Ok(written),
            Err(LeaseStoreError::Changed(_)) => {
                let read = store.read(&id).await.map_err(store_error)?;
                current = read.ok_or_else(|| store_error(LeaseStoreError::Gone(id.clone())))?;
                if current.owner.as_deref() != Some(holder) {
                    let owner = current.owner.clone().unwrap_or_else(|| "nobody".into());
                    return Err(MoveError::Taken {
                        lease: id.clone(),
                        owner,
                    });
                }
            }
            Err(error) => return Err(store_error(error)),
        }
    }
    Err(store_error(LeaseStoreError::Changed(id.clone())))
}

impl Session<'_> {
    async fn run(&mut self, plan: &Plan) -> Result<Applied, MoveError> {
        if let Err(error) = self.claim_and_move(plan).await {
            self.roll_back().await;
            return Err(error);
        }
        let (store, holder) = (self.store, self.holder);
        let releases = self.held.values().map(|lease| {
            let lease = lease.clone();
            async move {
                let released = change_held(store, holder, lease.clone(), |l| l.owner = None).await;
                (lease.id, released)
            }
            .boxed()
        });
        let releases = all(releases.collect()).await;
        let mut unreleased = Vec::new();
        for (id, released) in releases {
            if let Err(error) = released {
                tracing::warn!(lease = id, %error, "releasing a moved lease failed; it expires after the lease expiration");
                unreleased.push(id);
            }
        }
        unreleased.sort();
        Ok(Applied {
            moved: plan.moves.len(),
            created: plan.creates.len(),
            deleted: plan.deletes.len(),
            unreleased,
        })
    }

    async fn claim_and_move(&mut self, plan: &Plan) -> Result<(), MoveError> {
        self.deadline = Instant::now() + self.expiration / 2;
        let (store, holder) = (self.store, self.holder);
        let mut failed = None;
        let claims = plan
            .touched()
            .map(|lease| claim(store, holder, lease).boxed())
            .collect();
        for claimed in all(claims).await {
            match claimed {
                Ok((original, written)) => {
                    self.undo.push(Undo::Restore(original));
                    self.held.insert(written.id.clone(), written);
                }
                Err(error) => failed = failed.or(Some(error)),
            }
        }
        if let Some(error) = failed {
            return Err(error);
        }
        self.move_claimed(plan).await?;
        for lease in &plan.creates {
            self.in_time(plan)?;
            self.create(lease).await?;
        }
        for lease in &plan.deletes {
            self.in_time(plan)?;
            self.delete(&lease.id).await?;
        }
        Ok(())
    }

    /// Moves the claimed leases of `plan.moves`, all at once (as many as [`CONCURRENCY`]).
    async fn move_claimed(&mut self, plan: &Plan) -> Result<(), MoveError> {
        self.in_time(plan)?;
        let (store, holder, deadline) = (self.store, self.holder, self.deadline);
        let (leases, expiration) = (plan.touched().count() + plan.creates.len(), self.expiration);
        let held = &self.held;
        let moves = plan.moves.iter().map(|change| {
            let current = held.get(&change.lease.id).cloned();
            async move {
                let current = current.ok_or_else(|| MoveError::Store {
                    step: "moving",
                    lease: change.lease.id.clone(),
                    source: LeaseStoreError::Gone(change.lease.id.clone()),
                })?;
                if Instant::now() > deadline {
                    return Err(MoveError::TooSlow { leases, expiration });
                }
                change_held(store, holder, current, |l| *l = change.to.apply_to(l)).await
            }
            .boxed()
        });
        let moves = all(moves.collect()).await;
        let mut failed = None;
        for moved in moves {
            match moved {
                Ok(written) => {
                    self.held.insert(written.id.clone(), written);
                }
                Err(error) => failed = failed.or(Some(error)),
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Fails once the deadline for moves has passed.
    fn in_time(&self, plan: &Plan) -> Result<(), MoveError> {
        if Instant::now() > self.deadline {
            return Err(self.too_slow(plan));
        }
        Ok(())
    }

    fn too_slow(&self, plan: &Plan) -> MoveError {
        MoveError::TooSlow {
            leases: plan.touched().count() + plan.creates.len(),
            expiration: self.expiration,
        }
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
