//! Leases: the documents (the .NET v3 layout), the grammar of their ids, and their store, the lag
//! report a lease carries, a lease this instance owns, the instance heartbeat and the hold on the
//! instance name, what this instance has seen of the lease container, bootstrap and adoption. Uses
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
pub(crate) mod write_budget;
