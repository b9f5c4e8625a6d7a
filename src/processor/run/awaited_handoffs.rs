//! The leases this instance asked their owners to hand over, awaited until each owner does: the
//! coordinator's handoff bookkeeping.

use futures::StreamExt;

use crate::processor::leases::owned::Acquired;
use crate::processor::run::acquisition_writes::{Adoption, Handed, adopt_one};
use crate::processor::run::shared::Shared;

/// Leases awaited from their owners that are read (and taken up) at once.
const ADOPT_CONCURRENCY: usize = 16;

/// A lease this instance asked its owner for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AwaitedLease {
    /// The lease document's id.
    pub(crate) id: String,
    /// The owner asked to hand it over.
    pub(crate) owner_asked: Option<String>,
    /// The acquire cycle that asked (reported with the acquisition).
    pub(crate) asked_in: u64,
}

/// A lease its owner handed over and this instance took up.
pub(crate) struct TakenUp {
    /// The lease as this instance wrote itself into it.
    pub(crate) lease: Acquired,
    /// The lease's owner before (the one asked).
    pub(crate) previous_owner: Option<String>,
    /// The acquire cycle that asked for it.
    pub(crate) asked_in: u64,
}

/// The leases asked for and not yet handed over, each once.
#[derive(Debug, Default)]
pub(crate) struct AwaitedHandoffs {
    leases: Vec<AwaitedLease>,
}

impl AwaitedHandoffs {
    /// Whether no lease is awaited.
    pub(crate) fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// Forgets every lease awaited (what is handed over later is not this process's).
    pub(crate) fn clear(&mut self) {
        self.leases.clear();
    }

    /// Awaits `asked` unless its lease is awaited already.
    pub(crate) fn ask(&mut self, asked: AwaitedLease) {
        if !self.leases.iter().any(|awaited| awaited.id == asked.id) {
            self.leases.push(asked);
        }
    }

    /// Stops awaiting lease `id` (taken up some other way) and returns what was awaited of it.
    pub(crate) fn take(&mut self, id: &str) -> Option<AwaitedLease> {
        let at = self.leases.iter().position(|awaited| awaited.id == id)?;
        Some(self.leases.remove(at))
    }

    /// Reads each awaited lease, [`ADOPT_CONCURRENCY`] at a time (one after another, a newcomer
    /// awaiting many leases kept its acquire cycles waiting behind the pass), and takes up or
    /// frees (as `handed` says) those handed over; the others stay awaited unless gone. Returns
    /// the leases taken up.
    pub(crate) async fn adopt(&mut self, shared: &Shared, handed: Handed) -> Vec<TakenUp> {
        let me = shared.options.instance.as_str();
        let outcomes: Vec<_> = futures::stream::iter(std::mem::take(&mut self.leases))
            .map(|awaited| async move { (adopt_one(shared, me, &awaited.id, handed).await, awaited) })
            .buffer_unordered(ADOPT_CONCURRENCY)
            .collect()
            .await;
        let mut taken_up = Vec::new();
        for (outcome, awaited) in outcomes {
            match outcome {
                Adoption::Taken(lease) if handed == Handed::TakeUp => taken_up.push(TakenUp {
                    lease: *lease,
                    previous_owner: awaited.owner_asked,
                    asked_in: awaited.asked_in,
                }),
                Adoption::Taken(freed) => {
                    tracing::info!(lease = %freed.lease.lease_token, "freed a lease handed over as this instance stopped")
                }
                Adoption::Waiting => self.leases.push(awaited),
                Adoption::Gone => {}
            }
        }
        taken_up
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn awaited(id: &str, asked_in: u64) -> AwaitedLease {
        AwaitedLease {
            id: id.to_owned(),
            owner_asked: Some("a".to_owned()),
            asked_in,
        }
    }

    #[test]
    fn a_lease_is_awaited_once_from_the_cycle_that_first_asked() {
        let mut handoffs = AwaitedHandoffs::default();
        handoffs.ask(awaited("l1", 3));
        handoffs.ask(awaited("l1", 4));
        assert_eq!(handoffs.take("l1"), Some(awaited("l1", 3)));
        assert_eq!(handoffs.take("l1"), None);
        assert!(handoffs.is_empty());
    }
}
