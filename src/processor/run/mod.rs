//! The running processor: start and stop ([`runtime`]), the acquire cycles ([`coordinator`]),
//! renewals, the crash gate (an abort writes nothing), the per-lease reader and its checkpointer,
//! delivery with retries, splits, store recovery, health and what a reader does about a stall.
//! Uses every other room.

pub(crate) mod acquisition_writes;
pub(crate) mod awaited_handoffs;
pub(crate) mod coordinator;
pub(crate) mod crash_gate;
pub mod delivery;
pub(crate) mod health;
pub(crate) mod lease_checkpointer;
pub mod lease_reader;
pub mod monitored_watch;
pub(crate) mod renewer;
pub mod runtime;
pub(crate) mod shared;
pub mod split;
pub(crate) mod stall_report;
pub(crate) mod store_recovery;
