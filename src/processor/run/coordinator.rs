//! The coordinator: runs the acquire cycles (planned by [`plan_cycle`], performed here), takes up
//! handed-over leases, starts one task per owned lease and settles each task's end (release,
//! recreation of a deleted lease, a split's children), and stops them all on shutdown.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use time::OffsetDateTime;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::processor::budgets::share::holding_in;
use crate::processor::budgets::writes::{Late, Turn};
use crate::processor::error::LeaseError;
use crate::processor::leases::lease::{Lease, LeaseSnapshot, LeaseStoreError};
use crate::processor::leases::name_claim::NameError;
use crate::processor::leases::owned::{Acquired, Keeping, OwnedLease, UpdateError};
use crate::processor::leases::sightings::Sightings;
use crate::processor::leases::work_report::WorkTimings;
use crate::processor::policy::acquisitions::{AcquireStep, Acquisition};
use crate::processor::policy::cycle_inputs::{CycleOptions, Observations};
use crate::processor::policy::cycle_plan::{CyclePlan, plan_cycle};
use crate::processor::policy::listing_schedule::confirms_moves;
use crate::processor::report::events::{CloseReason, LeaseEvent, LeaseExit};
use crate::processor::run::acquisition_writes::{Handed, write_acquisition};
use crate::processor::run::awaited_handoffs::{AwaitedHandoffs, AwaitedLease};
use crate::processor::run::handoff_drain::acknowledge_while_draining;
use crate::processor::run::lease_reader;
use crate::processor::run::shared::Shared;
use crate::processor::run::store_recovery::StoreRecovery;

/// How long after an unrenewed lease's expiry the extra acquire cycle runs.
const TAKEOVER_MARGIN: Duration = Duration::from_millis(20);

/// Sleeps until `at` (forever without one; the caller only polls it with one).
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The task that owns the acquire cycles and the lease tasks of one processor.
pub(crate) struct Coordinator {
    shared: Arc<Shared>,
    /// Cancelled to stop every lease task (shutdown).
    leases: CancellationToken,
    tasks: JoinSet<(Arc<OwnedLease>, LeaseExit)>,
    /// Invalid lease documents already reported (each is logged and counted once).
    reported_invalid: HashSet<String>,
    /// Leases this instance asked their owners for, taken up as soon as the owner hands them over.
    awaiting: AwaitedHandoffs,
    /// The lease container's disappearance and return.
    recovery: StoreRecovery,
    /// When another instance's unrenewed lease expires before the next cycle: an extra acquire
    /// cycle then.
    takeover_at: Option<tokio::time::Instant>,
    /// The wait from one regular acquire cycle to the next: the acquire interval, longer while
    /// listings are quiet.
    listing_interval: Duration,
    /// When the next regular acquire cycle runs.
    next_listing: tokio::time::Instant,
    /// The lease ids the previous listing showed, sorted.
    listed_ids: Vec<String>,
    /// When the previous plan that would have moved leases here by work was judged.
    moves_planned_at: Option<tokio::time::Instant>,
    /// What the listings showed change, and when, on this instance's clock (expiry).
    sightings: Sightings,
    /// Leases released as stalled: not taken again for a lease expiration.
    left_stalled: Vec<StalledRelease>,
}

/// A lease this instance released as stalled.
struct StalledRelease {
    /// The lease document's id.
    id: String,
    /// When it was released.
    at: tokio::time::Instant,
}

/// Marks the processor dead if the coordinator ends (or unwinds) without a shutdown request.
struct DeathWatch(Arc<Shared>, CancellationToken);

impl Drop for DeathWatch {
    fn drop(&mut self) {
        let health = &self.0.health;
        if !self.1.is_cancelled() && !health.halt().is_cancelled() && !health.is_aborted() {
            health.mark_died();
            tracing::error!("the lease coordinator stopped unexpectedly");
        }
    }
}

impl Coordinator {
    /// A coordinator whose lease tasks stop when `leases` is cancelled.
    pub(crate) fn new(shared: Arc<Shared>, leases: CancellationToken) -> Self {
        let interval = shared.options.acquire_interval;
        Self {
            shared,
            leases,
            tasks: JoinSet::new(),
            reported_invalid: HashSet::new(),
            awaiting: AwaitedHandoffs::default(),
            recovery: StoreRecovery::default(),
            takeover_at: None,
            listing_interval: interval,
            next_listing: tokio::time::Instant::now(),
            listed_ids: Vec::new(),
            moves_planned_at: None,
            sightings: Sightings::default(),
            left_stalled: Vec::new(),
        }
    }

    /// Runs until `shutdown` (or a halt), then stops every lease task, releasing its lease, and
    /// removes this instance's heartbeat. `renewing` is cancelled when this ends, however it ends.
    pub(crate) async fn run(mut self, shutdown: CancellationToken, renewing: CancellationToken) {
        let _renewing = renewing.drop_guard();
        let _watch = DeathWatch(self.shared.clone(), shutdown.clone());
        let delay = self.join_delay().await;
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::time::sleep(delay) => {}
        }
        self.next_listing = tokio::time::Instant::now();
        // Handed-over leases are looked for several times per cycle (point reads of the few
        // leases asked for), so that a handoff completes within the cycle that asked for it.
        let poll = (self.shared.options.acquire_interval / 8).clamp(Duration::from_millis(50), Duration::from_secs(2));
        // At a random phase: newcomers started together would take up their leases together.
        let first = tokio::time::Instant::now() + poll.mul_f64(fastrand::f64());
        let mut handoff_poll = tokio::time::interval_at(first, poll);
        handoff_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.shared.health.set_ready(true);
        loop {
            // In this order: a task that ended is settled (closed, counted out) before another
            // cycle starts — when cycles run back to back (a slow lease container), a random pick
            // settled one ended task per cycle.
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = self.shared.health.halt().cancelled() => break,
                Some(joined) = self.tasks.join_next() => self.on_exit(joined).await,
                _ = tokio::time::sleep_until(self.next_listing) => {
                    let started = tokio::time::Instant::now();
                    self.shared.cycles.fetch_add(1, Ordering::SeqCst);
                    self.acquire_cycle().await;
                    self.next_listing = started + self.listing_interval;
                }
                _ = sleep_until(self.takeover_at), if self.takeover_at.is_some() => {
                    self.takeover_at = None;
                    self.acquire_cycle().await;
                }
                _ = handoff_poll.tick(), if !self.awaiting.is_empty() => self.adopt_handed_over(Handed::TakeUp).await,
                // An owned lease carries a handoff request: judge it now, not at the next listing.
                _ = self.shared.requested.notified() => {
                    self.listing_changed();
                    self.acquire_cycle().await;
                }
            }
        }
        // Halted, the name is another process's: what is handed to it is that process's.
        if !shutdown.is_cancelled() {
            self.awaiting.clear();
        }
        self.stop(poll).await;
    }

    /// Stops every lease task (each releases its lease); the renewer then removes the heartbeat.
    /// A lease asked for that its owner hands over meanwhile is freed, every `poll` until the
    /// last task ended and once more then: owned by this name while its heartbeat still beats,
    /// nobody else would take it up before the stop ended.
    async fn stop(&mut self, poll: Duration) {
        self.shared.health.set_ready(false);
        self.leases.cancel();
        let mut handoff_poll = tokio::time::interval(poll);
        loop {
            tokio::select! {
                joined = self.tasks.join_next() => match joined {
                    Some(joined) => self.on_exit(joined).await,
                    None => break,
                },
                _ = handoff_poll.tick(), if !self.awaiting.is_empty() => self.adopt_handed_over(Handed::Free).await,
            }
        }
        self.adopt_handed_over(Handed::Free).await;
        self.shared.liveness.all_released();
        tracing::info!("processor stopped");
    }

    /// When this instance (announced by its first heartbeat as it started) joins a processor that
    /// others may be running (another instance's heartbeat or lease is there: whether it is alive
    /// is not judged by the timestamps other machines' clocks wrote), it waits half to one cycle
    /// before its first acquire so that instances starting together all count each other; a
    /// processor nobody ran yet is started at once.
    async fn join_delay(&self) -> Duration {
        let me = &self.shared.options.instance;
        let others = match self.shared.store.snapshot().await {
            Ok(snapshot) => {
                let other = |name: &str| !name.is_empty() && name != me;
                snapshot.leases.iter().any(|l| l.owner.as_deref().is_some_and(other))
                    || snapshot.instances.iter().any(|(name, _)| other(name))
            }
            // Unknown: wait as if others ran, rather than race them for leases.
            Err(_) => true,
        };
        if others {
            self.shared
                .options
                .acquire_interval
                .mul_f64(0.5 + fastrand::f64() * 0.5)
        } else {
            Duration::ZERO
        }
    }

    /// One acquire cycle in a span of its own (a trace's root).
    async fn acquire_cycle(&mut self) {
        let options = &self.shared.options;
        let span = tracing::info_span!(parent: None, "acquire_cycle", processor = %options.processor_name, instance = %options.instance, cycle = self.shared.cycle());
        self.list_plan_and_perform().instrument(span).await;
    }

    /// Lists the leases, plans the cycle and performs the plan.
    async fn list_plan_and_perform(&mut self) {
        let me = self.shared.options.instance.clone();
        // Back to the acquire interval unless this listing turns out quiet.
        let previous_interval = std::mem::replace(&mut self.listing_interval, self.shared.options.acquire_interval);
        // With instance liveness the renewer beats every renew interval. Otherwise an instance
        // that owns leases is counted through them; only one that owns none needs a heartbeat
        // for the others to count it (a write per cycle saved on a busy instance).
        if !self.shared.liveness.beats() && self.shared.owned.count() == 0 {
            match self.shared.name.beat(self.shared.store.as_ref(), false).await {
                Ok(()) => {}
                Err(NameError::Taken { .. }) => {
                    let taken = NameError::Taken { instance: me.clone() };
                    self.shared.health.halt_for(taken.to_string());
                    return;
                }
                Err(NameError::Store(error)) => self.shared.telemetry.error(None, LeaseError::Heartbeat(error)),
            }
        }
        let sent = tokio::time::Instant::now();
        let snapshot = match self.shared.store.snapshot().await {
            Ok(snapshot) => snapshot,
            Err(error) if error.is_container_missing() => {
                self.recovery.missing(&self.shared, &error);
                return;
            }
            Err(error) => {
                self.shared.telemetry.error(None, LeaseError::Listing(error));
                return;
            }
        };
        if self.recovery.back(&self.shared).await {
            return;
        }
        self.recovery.reconsider_undecided(&self.shared).await;
        let plan = self.plan(&snapshot, sent, &me, previous_interval);
        // This instance's part of the container's budget, among itself and the others listed.
        let others = self
            .shared
            .others
            .lock()
            .map_or_else(|e| e.into_inner().len(), |o| o.len());
        let (mine, listed) = holding_in(&snapshot.leases, &me, self.shared.owned.count());
        self.shared.share_budgets(mine, listed, others + 1).await;
        self.perform(plan).await;
    }

    /// Plans the cycle from `snapshot`, a listing sent at `sent` (the previous listing waited
    /// `previous_interval`), and records the plan's schedule.
    fn plan(
        &mut self,
        snapshot: &LeaseSnapshot,
        sent: tokio::time::Instant,
        me: &str,
        previous_interval: Duration,
    ) -> CyclePlan {
        let returned = tokio::time::Instant::now();
        let mut sightings = std::mem::take(&mut self.sightings);
        let at = sightings.observe_listing(snapshot, sent, returned);
        let expiration = self.shared.options.expiration;
        self.left_stalled
            .retain(|stalled| at.duration_since(stalled.at) < expiration);
        let observations = Observations {
            at,
            sightings,
            owned: self.shared.owned.ids(),
            awaiting_handoff: !self.awaiting.is_empty(),
            listed_ids: std::mem::take(&mut self.listed_ids),
            listing_interval: previous_interval,
            left_stalled: self.left_stalled.iter().map(|stalled| stalled.id.clone()).collect(),
            moves_called: self
                .moves_planned_at
                .take()
                .is_some_and(|then| confirms_moves(at - then, self.shared.options.acquire_interval)),
        };
        let options = CycleOptions::from(&self.shared.options);
        let mut plan = plan_cycle(snapshot, &observations, me, OffsetDateTime::now_utc(), options);
        self.sightings = observations.sightings;
        // Counted from the moment the plan judged (the listing was sent); the margin covers the
        // clocks' rounding.
        self.takeover_at = plan.takeover_in.map(|wait| at + wait + TAKEOVER_MARGIN);
        if plan.next_interval != previous_interval {
            tracing::debug!(interval = ?plan.next_interval, "next lease listing");
        }
        self.listing_interval = plan.next_interval;
        self.shared.liveness.set_renew_each_lease(plan.renew_each_lease);
        *self
            .shared
            .others
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = std::mem::take(&mut plan.others);
        self.listed_ids = std::mem::take(&mut plan.listed_ids);
        self.moves_planned_at = plan.moves_planned.then_some(at);
        plan
    }

    /// Performs a plan's writes: lost and requested leases first, then deletions and
    /// heartbeats, then all acquisitions of the cycle together (others see its result at once).
    async fn perform(&mut self, plan: CyclePlan) {
        self.report_invalid(&plan);
        for owned in self.shared.owned.all() {
            if plan.lost.iter().any(|id| id == owned.id()) && !owned.cancelled().is_cancelled() {
                tracing::info!(
                    lease = owned.token(),
                    "lease taken by another instance (or kept by another lease over its range)"
                );
                owned.mark_lost();
            } else if let Some((_, to)) = plan.hand_over.iter().find(|(id, _)| id == owned.id()) {
                owned.hand_over_to(to);
            }
        }
        self.clear_requests(&plan.clear_requests).await;
        for lease in &plan.delete {
            if let Err(error) = self.shared.store.delete(lease).await {
                tracing::debug!(lease = %lease.lease_token, %error, "deleting a superseded lease failed");
            }
        }
        for name in &plan.remove_heartbeats {
            if let Err(error) = self.shared.store.remove_heartbeat(name, None).await {
                tracing::debug!(instance = %name, %error, "removing a stale heartbeat failed");
            }
        }
        // Paced by the budget, never urgent: a newcomer's requests and acquisitions can wait
        // their turn behind the heartbeats; those the budget did not admit within the acquire
        // interval are not sent, but left for the next cycle (a newcomer planning hundreds at
        // once would otherwise send them all past its share).
        let patience = self.shared.options.acquire_interval;
        let writes = plan.acquire.into_iter().map(|mut acquisition| {
            if acquisition.step == AcquireStep::Take {
                acquisition.write.owner_epoch = Some(self.shared.next_epoch());
            }
            let (store, budget) = (self.shared.store.clone(), self.shared.budget.clone());
            async move {
                let mut sent = tokio::time::Instant::now();
                let written = budget
                    .paced((patience, Late::GiveUp), Turn::InOrder, |_| {
                        sent = tokio::time::Instant::now();
                        write_acquisition(store.as_ref(), &acquisition)
                    })
                    .await;
                (written.map(|lease| Acquired { lease, sent }), acquisition)
            }
        });
        for (result, acquisition) in futures::future::join_all(writes).await {
            self.acquire_written(result, acquisition);
        }
    }

    /// Clears the handoff requests of instances that left from the leases processed here.
    async fn clear_requests(&self, ids: &[String]) {
        for owned in self.shared.owned.all() {
            if !ids.iter().any(|id| id == owned.id()) {
                continue;
            }
            // Written whatever this instance's copy shows: an idle lease is not written here
            // between listings, so the copy may predate the request (the write meets a 412 and
            // clears the request on the lease as it is).
            let cleared = owned.update(Lease::clear_handoff).await;
            match cleared {
                Ok(_) => tracing::info!(
                    lease = owned.token(),
                    "cleared a handoff request of an instance that left"
                ),
                Err(error) => tracing::debug!(lease = owned.token(), %error, "clearing a stale handoff request failed"),
            }
        }
    }

    /// Logs and counts each invalid or overlapping lease document once.
    fn report_invalid(&mut self, plan: &CyclePlan) {
        for (id, reason) in &plan.invalid {
            if self.reported_invalid.insert(id.clone()) {
                tracing::warn!(document = %id, %reason, "skipping a document under the lease prefix that is not a valid lease; fix or delete it");
                self.shared.telemetry.observer().lease_error("invalid_document");
            }
        }
        for id in &plan.overlapping {
            if self.reported_invalid.insert(id.clone()) {
                tracing::warn!(lease = %id, "a lease's range overlaps another lease's (edited by hand or another tool?); both are processed, so changes in the overlap arrive twice: delete the lease that should not exist");
                self.shared.telemetry.observer().lease_error("overlapping_range");
            }
        }
    }

    /// Acts on the result of one acquisition write.
    fn acquire_written(&mut self, result: Result<Acquired, LeaseStoreError>, acquisition: Acquisition) {
        let Acquisition {
            write,
            previous_owner,
            step,
        } = acquisition;
        match (step, result) {
            (AcquireStep::AskHandoff, Ok(Acquired { lease: asked, .. })) => {
                tracing::debug!(lease = %asked.lease_token, owner = ?previous_owner, "asked the owner to hand the lease over");
                self.awaiting.ask(AwaitedLease {
                    id: asked.id,
                    owner_asked: previous_owner,
                    asked_in: self.shared.cycle(),
                });
            }
            (AcquireStep::AskHandoff, Err(error)) => {
                tracing::debug!(lease = %write.lease_token, %error, "asking for a handoff failed")
            }
            (AcquireStep::Take, Ok(acquired)) => {
                // A lease handed over here that a listing showed before the adoption poll read
                // it: taken as asked for by the cycle that asked.
                let (previous_owner, cycle) = match self.awaiting.take(&acquired.lease.id) {
                    Some(awaited) => (awaited.owner_asked.or(previous_owner), awaited.asked_in),
                    None => (previous_owner, self.shared.cycle()),
                };
                self.acquired(acquired, previous_owner, cycle)
            }
            (AcquireStep::Take, Err(LeaseStoreError::Changed(_) | LeaseStoreError::Gone(_))) => {
                tracing::debug!(lease = %write.lease_token, "another instance moved first");
            }
            (AcquireStep::Take, Err(error)) if error.is_throttled() => {
                tracing::debug!(lease = %write.lease_token, %error, "the lease container's budget is spent; the lease is left for the next cycle");
            }
            (AcquireStep::Take, Err(error)) => self
                .shared
                .telemetry
                .error(Some(&write.lease_token), LeaseError::Acquire(error)),
        }
    }

    /// Takes up the leases asked for that their owners have handed to this instance; while
    /// stopping (`handed` [`Handed::Free`]), a lease handed over is freed instead.
    async fn adopt_handed_over(&mut self, handed: Handed) {
        let shared = self.shared.clone();
        for taken in self.awaiting.adopt(&shared, handed).await {
            self.acquired(taken.lease, taken.previous_owner, taken.asked_in);
        }
    }

    /// Starts processing a lease this instance just wrote itself into, taken by acquire cycle
    /// `cycle` (the one that asked for it, when its owner handed it over).
    fn acquired(&mut self, acquired: Acquired, previous_owner: Option<String>, cycle: u64) {
        let token = &acquired.lease.lease_token;
        // The write may have gone out long before its answer came (a frozen process): readers
        // of the log order acquisitions by when they were sent.
        let sent_ms_ago = acquired.sent.elapsed().as_millis();
        tracing::info!(lease = %token, previous_owner = ?previous_owner, cycle, sent_ms_ago, "lease acquired");
        self.shared.telemetry.emit(LeaseEvent::Acquired {
            lease: token.clone(),
            previous_owner,
            cycle,
        });
        self.start_lease(acquired);
    }

    /// Starts the task that processes `lease` (once: a split's children can be seen as ours by
    /// an acquire cycle and be started by the split's own exit path too).
    fn start_lease(&mut self, acquired: Acquired) {
        let owned = OwnedLease::new(
            acquired,
            &self.shared.options.instance,
            self.shared.store.clone(),
            &self.leases,
            self.shared.requested.clone(),
            Keeping {
                liveness: self.shared.liveness.clone(),
                budget: self.shared.budget.clone(),
                timings: WorkTimings::new(self.shared.options.acquire_interval, self.shared.options.expiration),
                reads: self.shared.reads.clone(),
                worker: self.shared.worker_capacity.clone(),
            },
        );
        if !self.shared.owned.insert(owned.clone()) {
            tracing::debug!(lease = owned.token(), "lease already processed here");
            return;
        }
        self.shared.telemetry.observer().leases_owned(self.shared.owned.count());
        let span = tracing::info_span!("lease", lease = %owned.token());
        let task = lease_task(self.shared.clone(), owned);
        self.tasks.spawn(task.instrument(span));
    }

    /// Settles the end of a lease task (which released the lease when it was given up):
    /// recreates it when its document was deleted, and starts a split's children.
    async fn on_exit(&mut self, joined: Result<(Arc<OwnedLease>, LeaseExit), tokio::task::JoinError>) {
        let Ok((owned, exit)) = joined else {
            // Only an aborted task gets here (panics are caught inside the task).
            tracing::error!("a lease task ended without a result");
            return;
        };
        self.shared.owned.remove(owned.id());
        if exit.reason == CloseReason::LeaseGone && !self.leases.is_cancelled() {
            self.recovery.recreate(&self.shared, &owned).await;
        }
        if exit.reason == CloseReason::Stalled {
            self.left_stalled.push(StalledRelease {
                id: owned.id().to_owned(),
                at: tokio::time::Instant::now(),
            });
        }
        owned.end_renewals();
        tracing::info!(lease = owned.token(), reason = exit.reason.as_str(), "lease closed");
        self.shared.telemetry.emit(LeaseEvent::Closed {
            lease: owned.token().to_owned(),
            reason: exit.reason,
        });
        self.listing_changed();
        let me = self.shared.options.instance.clone();
        for child in exit.children {
            if child.lease.owner.as_deref() == Some(me.as_str()) && !self.leases.is_cancelled() {
                self.shared.telemetry.emit(LeaseEvent::Acquired {
                    lease: child.lease.lease_token.clone(),
                    previous_owner: None,
                    cycle: self.shared.cycle(),
                });
                self.start_lease(child);
            }
        }
        self.shared.telemetry.observer().leases_owned(self.shared.owned.count());
    }

    /// Something changed that a listing may show more of: the next one comes within the acquire
    /// interval again.
    fn listing_changed(&mut self) {
        let base = self.shared.options.acquire_interval;
        self.listing_interval = base;
        self.next_listing = self.next_listing.min(tokio::time::Instant::now() + base);
    }
}

/// Processes one lease; a panic (for example in the handler) must not leak the lease: it ends
/// the task as [`CloseReason::Panicked`] and the lease is released.
async fn lease_task(shared: Arc<Shared>, owned: Arc<OwnedLease>) -> (Arc<OwnedLease>, LeaseExit) {
    let exit = tokio::select! {
        exit = process_and_release(shared.clone(), owned.clone()) => exit,
        never = acknowledge_while_draining(&shared, &owned) => match never {},
    };
    (owned, exit)
}

/// Processes the lease until its task ends, then releases it when it was given up.
async fn process_and_release(shared: Arc<Shared>, owned: Arc<OwnedLease>) -> LeaseExit {
    use futures::FutureExt;
    let exit = std::panic::AssertUnwindSafe(lease_reader::run(shared, owned.clone()))
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            let message = panic
                .downcast_ref::<&str>()
                .map(|m| (*m).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            tracing::error!(panic = %message, "the lease's task panicked; releasing the lease");
            LeaseExit::closed(CloseReason::Panicked)
        });
    // Released here, by each lease's own task (still kept alive until then), not one after
    // another by the coordinator: in turn, an owner of many leases releases them slower than the
    // requesters' patience, and they take the leases outright.
    if matches!(
        exit.reason,
        CloseReason::Shutdown | CloseReason::Panicked | CloseReason::HandedOver | CloseReason::Stalled
    ) {
        match owned.release().await {
            Ok(_) => {}
            // Taken meanwhile (a requester whose patience ran out while the lease container's
            // budget held the release back): nothing to free.
            Err(UpdateError::Lost(owner)) => {
                tracing::info!(new_owner = ?owner, "the lease was taken by another instance before its release")
            }
            // Held back past its patience by the lease container's budget: the requester takes
            // the lease after its own patience, anyone else on expiry. Throttling, not a failure.
            Err(UpdateError::Store(error)) if error.is_throttled() => {
                tracing::info!(%error, "the lease container's budget held the release back; the lease frees itself on expiry")
            }
            Err(error) => tracing::warn!(%error, "releasing the lease failed; it frees itself on expiry"),
        }
    }
    exit
}
