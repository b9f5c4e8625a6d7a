//! The write that retries an acquisition of the cycle plan after a 412 (the lease changed since
//! the listing): the same request or takeover on the lease as it is now, while its reason holds.
//! Pure.

use time::OffsetDateTime;

use crate::processor::leases::lease::Lease;
use crate::processor::policy::cycle_plan::{AcquireStep, Acquisition};

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
