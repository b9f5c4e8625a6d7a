//! The running processor: start and stop ([`runtime`]), the acquire cycles (`coordinator`, their
//! writes `acquisition_writes`, the handoffs awaited `awaited_handoffs`, and the owner's side of
//! a handoff `handoff_drain`), renewals (`renewer`), the crash gate (`crash_gate`: an abort writes
//! nothing), the per-lease reader ([`lease_reader`]) and its checkpointer (`lease_checkpointer`),
//! delivery with retries ([`delivery`]), splits ([`split`]), the monitored container's existence
//! ([`monitored_watch`]), store recovery (`store_recovery`), health (`health`), what a reader does
//! about a stall (`stall_report`), and what the tasks share (`shared`). Uses every other room.

pub(crate) mod acquisition_writes;
pub(crate) mod awaited_handoffs;
pub(crate) mod coordinator;
pub(crate) mod crash_gate;
pub mod delivery;
pub(crate) mod handoff_drain;
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
