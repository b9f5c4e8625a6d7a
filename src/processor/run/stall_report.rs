//! What a lease's reader does about a stall [`crate::processor::policy::stall`] judged: log it once
//! with what the reader was doing, count it (`cfp_lease_stalled`, `cfp_lease_stalls_total`), and
//! record it on the lease (the `stalled` property the operator turns into `Degraded=True`, reason
//! `LeaseStalled`), or clear that record when the lease goes on.

use time::OffsetDateTime;

use crate::processor::leases::lease::STALLED_PROPERTY;
use crate::processor::leases::owned::OwnedLease;
use crate::processor::policy::stall::StallAction;
use crate::processor::run::shared::Shared;

/// Reports `action` on `owned` (the reader then restarts, releases the lease, or goes on).
pub(crate) async fn report(shared: &Shared, owned: &OwnedLease, action: &StallAction) {
    let observer = shared.telemetry.observer();
    let token = owned.token();
    let note = match action {
        StallAction::Restart(note) => {
            tracing::warn!(%note, "the lease is stalled; restarting its reader from the last checkpoint");
            observer.lease_stalled(token, true);
            Some(note)
        }
        StallAction::Release(note) => {
            tracing::warn!(%note, "the lease is still stalled after its reader was restarted; releasing it for another instance");
            observer.stalled_lease_released(token);
            Some(note)
        }
        StallAction::Recovered => {
            tracing::info!("the stalled lease advances again");
            observer.lease_stalled(token, false);
            None
        }
    };
    let record = note.map(|note| record(&shared.options.instance, note));
    let written = owned
        .update_if(|lease| match &record {
            Some(record) => {
                lease.properties.insert(STALLED_PROPERTY.into(), record.clone());
                true
            }
            None => lease.properties.remove(STALLED_PROPERTY).is_some(),
        })
        .await;
    if let Err(error) = written {
        tracing::debug!(%error, "recording the stall in the lease failed");
    }
}

/// The lease property's text: which instance, since when, and what its reader was doing.
fn record(instance: &str, note: &str) -> String {
    let now = OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    format!("on {instance} at {now}: {note}")
}
