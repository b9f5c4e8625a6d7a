//! What an owner measures of a lease while it holds it, to be written with every write of it:
//! the partition's write rate ([`crate::processor::leases::work_report`]), the documents it
//! handled of the lease and what a document cost to read
//! ([`crate::processor::leases::capacity_report`]), and what the whole worker handles a second
//! while it has work ([`crate::processor::leases::worker_capacity`]).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::processor::budgets::reads::ReadAllowance;
use crate::processor::leases::capacity_report::CapacityReport;
use crate::processor::leases::lease::Lease;
use crate::processor::leases::work_report::{DecayedRate, WorkTimings, record_rate, reported_rate};
use crate::processor::leases::worker_capacity::WorkerCapacity;

/// The measures of one owned lease.
pub(crate) struct Measures {
    /// The operations a second written into the lease's partition, once counted here (from
    /// the first page read, or going on from what its previous owner reported).
    write_rate: Mutex<Option<DecayedRate>>,
    /// The documents a second this instance handled of the lease, counted from when it took
    /// the lease, once it handled any.
    handled: Mutex<Option<DecayedRate>>,
    /// When this instance took the lease.
    taken: Instant,
    /// What this instance's change feed reads cost.
    reads: Arc<ReadAllowance>,
    /// What this worker handles a second while it has work.
    worker: Arc<WorkerCapacity>,
    /// How the rates are measured.
    timings: WorkTimings,
}

/// A rate's slot, locked (a poisoned lock is used as it is: the value is written whole).
fn slot<T>(rate: &Mutex<T>) -> MutexGuard<'_, T> {
    rate.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Measures {
    /// The measures of `lease` as this instance takes it.
    pub(crate) fn new(
        lease: &Lease,
        timings: WorkTimings,
        reads: Arc<ReadAllowance>,
        worker: Arc<WorkerCapacity>,
    ) -> Self {
        let now = Instant::now();
        Self {
            write_rate: Mutex::new(reported_rate(lease).map(|rate| DecayedRate::starting_at(rate, now, timings))),
            handled: Mutex::new(None),
            taken: now,
            reads,
            worker,
            timings,
        }
    }

    /// Counts `writes` more into the lease's partition over the last `over`.
    pub(crate) fn count_writes(&self, writes: u64, over: Duration) {
        let now = Instant::now();
        let timings = self.timings;
        slot(&self.write_rate)
            .get_or_insert_with(|| DecayedRate::counted_from(now, timings))
            .add_over(writes, over, now);
    }

    /// Counts `documents` more handled of the lease, now.
    pub(crate) fn count_handled(&self, documents: usize) {
        let (taken, timings) = (self.taken, self.timings);
        slot(&self.handled)
            .get_or_insert_with(|| DecayedRate::counted_from(taken, timings))
            .add(documents as u64, Instant::now());
    }

    /// Writes the measures into `lease` (a copy about to be written, or a split's child).
    pub(crate) fn record(&self, lease: &mut Lease) {
        let now = Instant::now();
        if let Some(rate) = *slot(&self.write_rate) {
            record_rate(lease, rate.per_second(now));
        }
        let handled = *slot(&self.handled);
        CapacityReport::of(handled.as_ref(), now, self.reads.per_document()).record(lease);
        self.worker.record(lease, now);
    }
}
