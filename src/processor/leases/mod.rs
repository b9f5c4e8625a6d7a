//! Leases: the documents (the .NET v3 layout) and their store ([`lease`], [`cosmos_store`]), the
//! grammar of their ids ([`lease_ids`]), the lag and work reports a lease carries ([`lag_report`], [`work_report`]), a lease
//! this instance owns ([`owned`]), the instance heartbeat ([`heartbeat`]) and the hold on the
//! instance name ([`name_claim`]), what this instance has seen of the lease container
//! ([`sightings`]) and of other processes' clocks ([`writer_clocks`]), bootstrap ([`bootstrap`]) and adoption ([`adopt`]), and the lease
//! container's request units every lease write spends: this instance's share of them
//! (`throughput_share`) and how it spends them when they run short (`write_budget`). Uses
//! `cosmos` and the processor's options and errors only.

pub mod adopt;
pub mod bootstrap;
pub mod cosmos_store;
pub mod heartbeat;
pub mod lag_report;
pub mod lease;
pub mod lease_ids;
pub mod name_claim;
pub mod owned;
pub mod sightings;
pub(crate) mod throughput_share;
pub mod work_report;
pub(crate) mod write_budget;
pub mod writer_clocks;
