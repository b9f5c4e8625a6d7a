//! Leases: the documents (the .NET v3 layout) and their store ([`lease`], [`cosmos_store`]), the
//! grammar of their ids ([`lease_ids`]), the lag, work and capacity reports a lease carries ([`lag_report`], [`work_report`], [`capacity_report`], [`worker_capacity`]), a lease
//! this instance owns ([`owned`]), the instance heartbeat ([`heartbeat`]) and the hold on the
//! instance name ([`name_claim`]), what this instance has seen of the lease container
//! ([`sightings`]) and of other processes' clocks ([`writer_clocks`]), bootstrap ([`bootstrap`], its lock: `bootstrap_lock`, what no lease covers yet: `coverage`)
//! and adoption ([`adopt`]); for unit tests, a store that answers at once (`answering_store`). Every lease write passes the lease container's budget
//! ([`crate::processor::budgets`]). Uses `cosmos`, the budgets and the processor's options and
//! errors only.

pub mod adopt;
#[cfg(test)]
pub(crate) mod answering_store;
pub mod bootstrap;
mod bootstrap_lock;
pub mod capacity_report;
pub mod cosmos_store;
mod coverage;
pub mod heartbeat;
pub mod lag_report;
pub mod lease;
pub mod lease_ids;
pub mod name_claim;
pub mod owned;
pub mod sightings;
pub mod work_report;
pub mod worker_capacity;
pub mod writer_clocks;
