//! How an instance gets the leases its acquire-cycle plan wants: the write of each (a take or a
//! handoff request), and the write that retries one after a 412 (the lease changed since the
//! listing): the same request or takeover on the lease as it is now, while its reason holds.
//! Pure.

use std::collections::HashSet;
use std::time::Duration;

use time::OffsetDateTime;

use crate::processor::leases::lease::Lease;
use crate::processor::leases::sightings::Seen;
use crate::processor::leases::work_report::fade_report;
use crate::processor::policy::cycle_inputs::{CycleOptions, Observations};
use crate::processor::policy::range_overlaps::{LeaseRange, within};

/// What an acquire cycle does with a lease it wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireStep {
    /// Write this instance as the owner (a free or expired lease, or an owner that ignored a
    /// handoff request).
    Take,
    /// Ask the live owner to hand it over.
    AskHandoff,
}

/// One write of the cycle: the lease as it is to be written (If-Match its listed ETag).
#[derive(Debug, Clone, PartialEq)]
pub struct Acquisition {
    /// The new version of the lease.
    pub write: Lease,
    /// The live owner it is taken from or asked of (never this instance).
    pub previous_owner: Option<String>,
    /// Taken or asked for.
    pub step: AcquireStep,
}

/// How `me` gets each lease it wants, but for those processed here, left here as stalled, or
/// lying within a range processed or taken here (a split's child while the parent's task still
/// reads it). Each write carries the lease's write rate faded as of the listing's newest write
/// (`newest_ts`): it refreshes the lease's `_ts`, from which readers fade the rate anew.
pub(crate) fn acquisitions(
    wanted: &[String],
    balanced: &[&Lease],
    ranges: &[LeaseRange],
    observations: &Observations,
    (me, now, newest_ts): (&str, OffsetDateTime, Option<i64>),
    options: CycleOptions,
) -> Vec<Acquisition> {
    let candidates: Vec<&Lease> = wanted
        .iter()
        .filter_map(|id| balanced.iter().find(|l| &l.id == id).copied())
        .filter(|l| !observations.owned.contains(&l.id) && !observations.left_stalled.contains(&l.id))
        .collect();
    let processed: Vec<LeaseRange> = ranges
        .iter()
        .filter(|r| observations.owned.contains(&r.id))
        .cloned()
        .collect();
    let candidate_ranges: Vec<LeaseRange> = candidates
        .iter()
        .filter_map(|l| Some(LeaseRange::new(l.id.clone(), l.range()?.clone())))
        .collect();
    // Nor one within another it takes in this cycle: a parent and the child its partial split
    // wrote, both left under this name by a restart, are one task (the parent's).
    let mut outer = processed;
    outer.extend(candidate_ranges.iter().cloned());
    let nested: HashSet<String> = within(&candidate_ranges, &outer).into_iter().collect();
    candidates
        .into_iter()
        .filter(|l| !nested.contains(&l.id))
        .filter_map(|lease| acquisition(lease, me, now, observations, options.expiration))
        .map(|mut acquisition| {
            fade_report(&mut acquisition.write, newest_ts, options.into());
            acquisition
        })
        .collect()
}

/// How `me` gets `lease`: taken when it is free, expired, or its owner ignored this instance's
/// request for a lease expiration; asked of a live owner otherwise (it hands it over after the
/// batch it is in, so nothing is delivered twice); nothing while a request is pending.
fn acquisition(
    lease: &Lease,
    me: &str,
    now: OffsetDateTime,
    observations: &Observations,
    expiration: Duration,
) -> Option<Acquisition> {
    let previous_owner = if observations.sightings.is_expired(lease, observations.at, expiration) {
        None
    } else {
        lease.owner.clone()
    }
    .filter(|o| o != me);
    // A slow batch is not taken from under a live owner: only one that has not handed over within
    // a lease expiration (an older version that ignores requests, a handler stuck that long) loses it.
    let patience = expiration;
    // A request, this instance's own or another's, is timed by how long it is seen here (on this
    // instance's monotonic clock: a wall clock stepped back or forth changes nothing).
    let asked_for = observations
        .sightings
        .unchanged_for(&Seen::Request(lease.id.clone()), observations.at);
    let mut write = lease.clone();
    let step = match (&previous_owner, lease.handoff_request()) {
        (Some(_), Some((to, _))) if to == me && asked_for < patience => return None,
        (Some(_), Some((to, _))) if to != me && asked_for < expiration => return None,
        (Some(_), Some((to, _))) if to == me => AcquireStep::Take,
        (Some(_), _) => {
            write.request_handoff(me, now);
            AcquireStep::AskHandoff
        }
        (None, _) => AcquireStep::Take,
    };
    if step == AcquireStep::Take {
        write.owner = Some(me.to_owned());
        write.clear_handoff();
        write.timestamp = Some(now);
    }
    Some(Acquisition {
        write,
        previous_owner,
        step,
    })
}

/// The write that retries `acquisition` after a 412, on `current` (the lease as it is now): while
/// it still has the live owner the acquisition was planned against and no other instance's
/// handoff request, the same request is written again, or the lease taken (at `now`). `None`
/// when the reason is gone (another owner, another requester), or for a free or expired lease
/// (a write to it means someone renewed or took it).
pub fn retry_acquisition(acquisition: &Acquisition, mut current: Lease, now: OffsetDateTime) -> Option<Lease> {
    let me = match acquisition.step {
        AcquireStep::Take => acquisition.write.owner.clone()?,
        AcquireStep::AskHandoff => acquisition.write.handoff_request()?.0.to_owned(),
    };
    let other_request = current.handoff_request().is_some_and(|(to, _)| to != me);
    if acquisition.previous_owner.is_none() || current.owner != acquisition.previous_owner || other_request {
        return None;
    }
    match acquisition.step {
        AcquireStep::AskHandoff => {
            let (_, at) = acquisition.write.handoff_request()?;
            current.request_handoff(&me, at);
        }
        AcquireStep::Take => {
            current.owner = Some(me);
            current.owner_epoch = acquisition.write.owner_epoch.clone();
            current.clear_handoff();
            current.timestamp = Some(now);
        }
    }
    Some(current)
}
