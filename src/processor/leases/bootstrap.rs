//! Creating one lease per feed range exactly once, even when many instances start together:
//! `.info` marks a finished bootstrap, `.lock` lets one instance do it.

use std::time::Duration;

use crate::cosmos::{EpkRange, FeedMode, MonitoredContainer, StartFrom};
use crate::processor::budgets::writes::{Late, Turn, WriteBudget};
use crate::processor::error::ProcessorError;
use crate::processor::leases::adopt::AdoptOptions;
use crate::processor::leases::bootstrap_lock::{
    Held, LEAST_LOCK_RENEWAL, LOCK_RENEWAL, LiveAttempt, LockWatch, holding_lock,
};
use crate::processor::leases::coverage::missing_pieces;
use crate::processor::leases::lease::{Lease, LeaseSnapshot, LeaseStore, LeaseStoreError};
use crate::processor::leases::lease_ids::IdKind;
use crate::processor::options::ProcessorOptions;
use crate::processor::policy::start_retry::retrying;

/// How long a lease creation waits for the lease container's budget before it is sent anyway.
const CREATE_PATIENCE: Duration = Duration::from_secs(60);

/// Waits until the lease store is initialized, initializing it when this instance gets the lock.
/// Transient failures are retried with backoff ([`retrying`]).
pub async fn bootstrap(
    store: &dyn LeaseStore,
    monitored: &MonitoredContainer,
    options: &ProcessorOptions,
) -> Result<(), ProcessorError> {
    bootstrap_paced(store, &WriteBudget::default(), monitored, options).await
}

/// Like [`bootstrap`], the leases created as `budget` admits them (thousands of creations at
/// once would spend every window of a lease container's budget, other processors' heartbeats
/// among them).
pub(crate) async fn bootstrap_paced(
    store: &dyn LeaseStore,
    budget: &WriteBudget,
    monitored: &MonitoredContainer,
    options: &ProcessorOptions,
) -> Result<(), ProcessorError> {
    retrying("bootstrapping the leases", ProcessorError::is_transient, || {
        bootstrap_once((store, budget), monitored, options)
    })
    .await
}

/// Creates `lease` when `budget` admits it; `None` when a lease with that id exists already.
async fn create_paced(
    store: &dyn LeaseStore,
    budget: &WriteBudget,
    lease: &Lease,
) -> Result<Option<Lease>, LeaseStoreError> {
    budget
        .paced((CREATE_PATIENCE, Late::Ahead), Turn::InOrder, |_| store.create(lease))
        .await
}

async fn bootstrap_once(
    (store, budget): (&dyn LeaseStore, &WriteBudget),
    monitored: &MonitoredContainer,
    options: &ProcessorOptions,
) -> Result<(), ProcessorError> {
    let mut lock = LockWatch::default();
    let _attempt = LiveAttempt::wait(store.prefix(), options.expiration).await;
    loop {
        let snapshot = store.snapshot().await?;
        check_no_other_processor(&snapshot, options)?;
        check_compatible(&snapshot, options)?;
        let ranges = monitored.feed_ranges(true).await?;
        let covered: Vec<&EpkRange> = snapshot.leases.iter().filter_map(Lease::range).collect();
        let missing = missing_pieces(&ranges, &covered, options.leases_per_partition);
        if snapshot.initialized && missing.is_empty() {
            return Ok(());
        }
        // Leases are about to be created: not over the range of one that cannot be read.
        check_readable(&snapshot, store.prefix())?;
        let renewal = options.renew_interval.clamp(LEAST_LOCK_RENEWAL, LOCK_RENEWAL);
        let Some(etag) = lock.take(store, &options.instance, renewal, options.expiration).await? else {
            tokio::time::sleep(Duration::from_millis(250 + fastrand::u64(0..250))).await;
            continue;
        };
        let work = async {
            let initialized = initialize((store, budget), monitored, options, &snapshot, &missing).await;
            let marked = match &initialized {
                Ok(_) => store
                    .mark_initialized(monitored.name(), options.leases_per_partition)
                    .await
                    .map_err(ProcessorError::from),
                Err(_) => Ok(()),
            };
            (initialized, marked)
        };
        let Held { done, etag } = holding_lock(store, &options.instance, renewal, etag, work).await;
        // Given back whatever happened: another instance would wait for it to look abandoned.
        let unlocked = store.unlock(&etag).await;
        let Some((initialized, marked)) = done else {
            tracing::warn!("another instance took the bootstrap lock over; looking at the lease set again");
            continue;
        };
        let created = initialized?;
        marked?;
        unlocked?;
        // Another instance may have bootstrapped beside this one (it took the lock for a dead
        // holder's): refused if its layout is the one marked.
        check_compatible(&store.snapshot().await?, options)?;
        tracing::info!(leases = created, ranges = ranges.len(), "lease store initialized");
        return Ok(());
    }
}

/// Refuses to start beside a lease of this processor that cannot be read: its range would be
/// bootstrapped again from the start position, skipping what came after its checkpoint.
fn check_readable(snapshot: &LeaseSnapshot, prefix: &str) -> Result<(), ProcessorError> {
    let unreadable = snapshot.invalid.iter().find(|(id, _)| {
        matches!(
            crate::processor::leases::lease_ids::classify(prefix, id),
            IdKind::Lease(_)
        )
    });
    match unreadable {
        Some((id, reason)) => Err(ProcessorError::Config(format!(
            "lease document {id:?} cannot be read ({reason}): fix or delete it, then start again (starting without it would read its range from the start position and skip what came after its checkpoint)"
        ))),
        None => Ok(()),
    }
}

/// Refuses to start while another processor runs under this processor's lease prefix: a .NET
/// v3 processor of the same name writes this very layout, so its leases would be taken for ours.
/// Its owner is no instance of ours — no heartbeat here, and none of the leases it owns carries
/// a mark only we write (`ownerEpoch`, `checkpointTime`: an earlier version of ours that beats no
/// heartbeat while it owns leases has checkpointed with one) — and it renewed a lease within the
/// expiration (by the time it wrote, as the adoption of foreign leases judges it): once it is
/// stopped and its leases expire, this processor goes on from their checkpoints. A lease set our
/// bootstrap wrote (its `.info` says how many leases per partition) is ours: an earlier version
/// of ours upgraded in place is never refused.
fn check_no_other_processor(snapshot: &LeaseSnapshot, options: &ProcessorOptions) -> Result<(), ProcessorError> {
    if snapshot.leases_per_partition.is_some() {
        return Ok(());
    }
    let now = time::OffsetDateTime::now_utc();
    let expiration = time::Duration::try_from(options.expiration).unwrap_or(time::Duration::MAX);
    let marked_ours = |owner: &str| {
        snapshot
            .leases
            .iter()
            .filter(|l| l.owner.as_deref() == Some(owner))
            .any(|l| l.owner_epoch.is_some() || l.checkpoint_time.is_some())
    };
    let ours = |owner: &str| {
        owner == options.instance || snapshot.instances.iter().any(|(name, _)| name == owner) || marked_ours(owner)
    };
    let live = snapshot.leases.iter().find(|lease| {
        lease
            .owner
            .as_deref()
            .is_some_and(|owner| !owner.is_empty() && !ours(owner))
            && lease.timestamp.is_some_and(|at| now - at < expiration)
    });
    match live {
        Some(lease) => Err(ProcessorError::Config(format!(
            "another processor runs under this processor's lease prefix: lease {} is owned by {:?}, which is no instance of this processor, and was renewed {} s ago; stop it first (its leases then expire and this processor goes on from their checkpoints)",
            lease.id,
            lease.owner.as_deref().unwrap_or_default(),
            lease.timestamp.map(|at| (now - at).whole_seconds()).unwrap_or_default()
        ))),
        None => Ok(()),
    }
}

/// Refuses options that do not match the leases this processor wrote before (another change
/// feed mode, another number of leases per partition).
fn check_compatible(snapshot: &LeaseSnapshot, options: &ProcessorOptions) -> Result<(), ProcessorError> {
    let wanted = options.mode;
    if let Some(other) = snapshot
        .leases
        .iter()
        .map(|l| FeedMode::of_lease(l.mode.as_deref()))
        .find(|m| *m != wanted)
    {
        return Err(ProcessorError::Config(format!(
            "this processor's leases were written in the {} mode, not {}: keep --mode {}, or start over under a new processor name",
            other.as_str(),
            wanted.as_str(),
            other.as_str()
        )));
    }
    let per_partition = options.leases_per_partition;
    let created_with = snapshot.leases_per_partition.unwrap_or(1);
    if snapshot.initialized && created_with != per_partition {
        return Err(ProcessorError::Config(format!(
            "this processor's leases were created with {created_with} lease(s) per partition, not {per_partition}: keep --leases-per-partition {created_with}, or start over under a new processor name (or delete its lease documents)"
        )));
    }
    Ok(())
}

/// Creates the leases of the `missing` pieces (adopting foreign checkpoints first, when asked or
/// found under our prefix), holding the bootstrap lock; returns how many were created.
async fn initialize(
    (store, budget): (&dyn LeaseStore, &WriteBudget),
    monitored: &MonitoredContainer,
    options: &ProcessorOptions,
    snapshot: &LeaseSnapshot,
    missing: &[EpkRange],
) -> Result<usize, ProcessorError> {
    let recreated = is_recreated(store, monitored, options, snapshot).await?;
    if snapshot.initialized {
        tracing::warn!(
            pieces = missing.len(),
            "the lease store is initialized but parts of the feed have no lease (lease documents deleted?); creating them from the start position"
        );
    }
    let (mut created, adopted) = adopt_existing((store, budget), monitored, options, snapshot).await?;
    let adopted: Vec<&EpkRange> = adopted.iter().collect();
    let pieces: Vec<EpkRange> = missing.iter().flat_map(|piece| piece.minus(&adopted)).collect();
    // A lease over a whole physical partition is written as the .NET bootstrap writes it: named
    // by its partition key range id (version 0), which the other readers of lease documents read.
    let partitions = if pieces.is_empty() {
        Vec::new()
    } else {
        monitored.partition_key_ranges().await?
    };
    let mut leases = Vec::with_capacity(pieces.len());
    for chunk in pieces.chunks(AT_ONCE) {
        let made = chunk
            .iter()
            .map(|range| new_lease((store, monitored, options), &partitions, range, recreated));
        leases.extend(futures::future::try_join_all(made).await?);
    }
    created += create_all((store, budget), &leases).await?;
    Ok(created)
}

/// The new lease over `range` (anchored at the feed's end now when the processor starts from
/// now, unless the monitored container was created again).
async fn new_lease(
    (store, monitored, options): (&dyn LeaseStore, &MonitoredContainer, &ProcessorOptions),
    partitions: &[(String, EpkRange)],
    range: &EpkRange,
    recreated: bool,
) -> Result<Lease, ProcessorError> {
    let continuation = match options.start_from {
        StartFrom::Now if !recreated => Some(anchor_now(monitored, range, options.mode).await?),
        StartFrom::Now | StartFrom::Beginning | StartFrom::Time(_) => None,
    };
    let mut lease = match partition_id(partitions, range) {
        Some(id) => Lease::for_partition(store.prefix(), id, range, continuation),
        None => Lease::new(store.prefix(), range, continuation),
    };
    lease.mode = Some(options.mode.lease_mode().to_owned());
    if recreated {
        lease = lease.start_from_beginning();
    }
    Ok(lease)
}

/// Bootstrap requests sent at once (anchors, creations): a container of many partitions is
/// ready in a few round trips rather than one per lease.
const AT_ONCE: usize = 8;

/// Creates `leases`, [`AT_ONCE`] at a time, each when `budget` admits it; how many were created
/// (those that existed already are not).
async fn create_all(
    (store, budget): (&dyn LeaseStore, &WriteBudget),
    leases: &[Lease],
) -> Result<usize, LeaseStoreError> {
    let mut created = 0;
    for chunk in leases.chunks(AT_ONCE) {
        let sent = chunk.iter().map(|lease| create_paced(store, budget, lease));
        let answers = futures::future::try_join_all(sent).await?;
        created += answers.iter().filter(|lease| lease.is_some()).count();
    }
    Ok(created)
}

/// The id of the partition key range that is exactly `range`, if one is.
pub(crate) fn partition_id<'a>(partitions: &'a [(String, EpkRange)], range: &EpkRange) -> Option<&'a str> {
    partitions.iter().find(|(_, r)| r == range).map(|(id, _)| id.as_str())
}

/// Whether the monitored container was created again under a name this processor followed
/// before: everything in it is new to the processor, so "now" would skip what was written since
/// it was created — its leases start from the beginning.
async fn is_recreated(
    store: &dyn LeaseStore,
    monitored: &MonitoredContainer,
    options: &ProcessorOptions,
    snapshot: &LeaseSnapshot,
) -> Result<bool, ProcessorError> {
    let recreated = options.start_from == StartFrom::Now
        && options.mode == FeedMode::LatestVersion
        && !snapshot.initialized
        && snapshot.leases.is_empty()
        && store.earlier_incarnation(monitored.name()).await?;
    if recreated {
        tracing::info!(
            container = monitored.name(),
            "the monitored container was created again since this processor last ran; reading the new one from its start"
        );
    }
    Ok(recreated)
}

/// Adopts foreign checkpoints when asked to (or partition-key-range leases found under our own
/// prefix, before any lease of ours: a .NET v2 / v3 version-0 processor of the same name) until
/// a bootstrap of ours has marked the lease set — an adoption killed partway is taken up again,
/// the leases it created kept; returns the leases created and the ranges the adopted ones cover.
async fn adopt_existing(
    (store, budget): (&dyn LeaseStore, &WriteBudget),
    monitored: &MonitoredContainer,
    options: &ProcessorOptions,
    snapshot: &LeaseSnapshot,
) -> Result<(usize, Vec<EpkRange>), ProcessorError> {
    let in_place = (snapshot.leases.is_empty() && !snapshot.pk_range_leases.is_empty()).then(|| AdoptOptions {
        layout: crate::processor::leases::adopt::ForeignLayout::Dotnet,
        prefix: format!("{}..", store.prefix()),
        force: options.adopt.as_ref().is_some_and(|a| a.force),
    });
    let explicit = options.adopt.clone().filter(|_| !snapshot.initialized);
    let Some(adopt) = in_place.or(explicit) else {
        return Ok((0, Vec::new()));
    };
    let mut leases = match adopt_foreign(store, monitored, options, &adopt).await {
        Ok(leases) => leases,
        // Leases of ours exist without a mark (an adoption killed partway, or leases written back
        // into a lease container created again, where the foreign set is gone): they stand.
        Err(error) if !snapshot.leases.is_empty() && !error.is_transient() => {
            tracing::warn!(%error, "not adopting again beside the leases of this processor");
            return Ok((0, Vec::new()));
        }
        Err(error) => return Err(error),
    };
    // Never beside a lease of ours over the same keys (one of the same id is kept as it is).
    leases.retain(|lease| {
        !snapshot.leases.iter().any(|ours| {
            ours.id != lease.id
                && ours
                    .range()
                    .zip(lease.range())
                    .is_some_and(|(a, b)| a.overlaps_as_keys(b))
        })
    });
    let adopted = leases.iter().filter_map(|lease| lease.range().cloned()).collect();
    let created = create_all((store, budget), &leases).await?;
    Ok((created, adopted))
}

/// Our leases for the checkpoints of the processor being adopted (its documents stay as they are).
async fn adopt_foreign(
    store: &dyn LeaseStore,
    monitored: &MonitoredContainer,
    options: &ProcessorOptions,
    adopt: &AdoptOptions,
) -> Result<Vec<Lease>, ProcessorError> {
    let layout = adopt.layout.as_str();
    let (leases, checkpoints) = foreign_leases(store, monitored, adopt, store.prefix()).await?;
    let now = time::OffsetDateTime::now_utc();
    if !adopt.force
        && let Some(live) = crate::processor::leases::adopt::live_owner(&checkpoints, now, options.expiration)
    {
        let age = live.timestamp.map(|t| (now - t).whole_seconds()).unwrap_or_default();
        return Err(ProcessorError::Config(format!(
            "the {layout} processor still runs: its lease {} is owned by {:?} and was renewed {age} s ago; stop it first (its leases then expire), or adopt anyway with --adopt-force",
            live.id,
            live.owner.as_deref().unwrap_or_default()
        )));
    }
    tracing::info!(
        layout,
        foreign = checkpoints.len(),
        leases = leases.len(),
        "adopting the checkpoints of the {layout} processor; its lease documents are left as they are"
    );
    Ok(leases
        .into_iter()
        .map(|mut lease| {
            lease.owner = None;
            lease.mode = Some(options.mode.lease_mode().to_owned());
            lease
        })
        .collect())
}

/// The names of `monitored` that lease prefixes are built from.
fn monitored_ids(monitored: &MonitoredContainer) -> crate::processor::leases::adopt::MonitoredIds<'_> {
    crate::processor::leases::adopt::MonitoredIds {
        host: monitored.account_host(),
        database_rid: monitored.database_rid(),
        container_rid: monitored.rid(),
        names: monitored.name(),
    }
}

/// The error when no lease has the `exact` id prefix: it names the prefixes of the leases whose
/// ids start with the given name, if any (another host name, another container).
async fn nothing_to_adopt(store: &dyn LeaseStore, adopt: &AdoptOptions, exact: &str) -> ProcessorError {
    let layout = adopt.layout.as_str();
    let mut near: Vec<String> = store
        .foreign_documents(&adopt.prefix)
        .await
        .unwrap_or_default()
        .iter()
        .filter_map(|body| {
            body.get("id")?
                .as_str()?
                .split_once("..")
                .map(|(prefix, _)| format!("{prefix}.."))
        })
        .collect();
    near.sort();
    near.dedup();
    let hint = match near.as_slice() {
        [] => String::new(),
        found => format!(
            "; leases under other prefixes start with {:?}: give --adopt-prefix the whole prefix (without its `..`) if one of them is the processor's",
            &found[..found.len().min(3)]
        ),
    };
    ProcessorError::Config(format!(
        "no {layout} leases with ids starting {exact:?} (the lease prefix {:?}, this account's host name, database and container) in the lease container{hint}",
        adopt.prefix
    ))
}

/// The leases (ids under `prefix`, not written) that carry the checkpoints of another processor's
/// lease documents, with the checkpoints read from them; fails when there are none. A range not
/// read by that processor yet (or not attributable after splits) starts from the beginning.
pub async fn foreign_leases(
    store: &dyn LeaseStore,
    monitored: &MonitoredContainer,
    adopt: &AdoptOptions,
    prefix: &str,
) -> Result<(Vec<Lease>, Vec<crate::processor::leases::adopt::ForeignCheckpoint>), ProcessorError> {
    let layout = adopt.layout.as_str();
    let exact =
        crate::processor::leases::adopt::lease_id_prefix(adopt.layout, &adopt.prefix, &monitored_ids(monitored));
    let mut checkpoints = Vec::new();
    for body in store.foreign_documents(&exact).await? {
        let id = body.get("id").and_then(serde_json::Value::as_str).unwrap_or_default();
        if !crate::processor::leases::adopt::is_lease_id(id, &exact) {
            continue;
        }
        // A checkpoint that cannot be read is never replaced by a start from the start position.
        let found = crate::processor::leases::adopt::parse(adopt.layout, &body).map_err(|reason| {
            ProcessorError::Config(format!(
                "document {id:?} of the {layout} processor's leases cannot be read ({reason}): fix or delete it, then start again"
            ))
        })?;
        checkpoints.extend(found);
    }
    if checkpoints.is_empty() {
        return Err(nothing_to_adopt(store, adopt, &exact).await);
    }
    let by_range_id = checkpoints
        .iter()
        .any(|c| matches!(c.scope, crate::processor::leases::adopt::Scope::PkRange(_)));
    let current = if by_range_id {
        monitored.partition_key_ranges().await?
    } else {
        Vec::new()
    };
    let (planned, notes) = crate::processor::leases::adopt::plan(&checkpoints, &current);
    for note in notes {
        tracing::warn!("{note}");
    }
    let leases = planned
        .into_iter()
        .map(|adopted| {
            let mut lease = Lease::new(prefix, &adopted.range, adopted.continuation.clone());
            lease.owner = checkpoints
                .iter()
                .find(|c| adopted.from.contains(&c.id))
                .and_then(|c| c.owner.clone());
            if adopted.continuation.is_none() {
                lease = lease.start_from_beginning();
            }
            lease
        })
        .collect();
    Ok((leases, checkpoints))
}

/// The current position of a range, so that "now" means the moment the processor first started
/// rather than whenever a lease is first read.
pub(crate) async fn anchor_now(
    monitored: &MonitoredContainer,
    range: &crate::cosmos::EpkRange,
    mode: crate::cosmos::FeedMode,
) -> Result<String, ProcessorError> {
    let mut reader = monitored.reader_in(mode, range, None, StartFrom::Now, 1).await?;
    let page = reader.next_page(Duration::from_secs(65)).await?;
    match page.continuations.as_slice() {
        [only] => Ok(only.continuation.clone()),
        _ => Err(ProcessorError::Config(format!(
            "range {range} changed while anchoring the start position; restart"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_another_processors_live_owner_refuses_the_start_never_an_earlier_version_of_ours() {
        let now = time::OffsetDateTime::now_utc();
        let options = ProcessorOptions::new("orders", "new-pod");
        let listing = |renewed: time::Duration, checkpointed: bool| {
            let mut lease = Lease::new("p", &EpkRange::full(), Some("\"7\"".into()));
            lease.owner = Some("host-1".into());
            lease.timestamp = Some(now - renewed);
            lease.checkpoint_time = checkpointed.then_some(now);
            LeaseSnapshot {
                leases: vec![lease],
                initialized: true,
                ..LeaseSnapshot::default()
            }
        };
        // A .NET processor renewing its lease under our prefix.
        assert!(check_no_other_processor(&listing(time::Duration::ZERO, false), &options).is_err());
        // Stopped: its lease expired.
        assert!(check_no_other_processor(&listing(time::Duration::hours(1), false), &options).is_ok());
        // An earlier version of ours (no heartbeat while it owns leases): it checkpointed as we do,
        let ours = listing(time::Duration::ZERO, true);
        assert!(check_no_other_processor(&ours, &options).is_ok());
        // or our bootstrap wrote the lease set (the `.info` counts leases per partition),
        let mut bootstrapped = listing(time::Duration::ZERO, false);
        bootstrapped.leases_per_partition = Some(1);
        assert!(check_no_other_processor(&bootstrapped, &options).is_ok());
        // or it beats a heartbeat.
        let mut beating = listing(time::Duration::ZERO, false);
        beating.instances = vec![("host-1".to_owned(), now)];
        assert!(check_no_other_processor(&beating, &options).is_ok());
    }
}
