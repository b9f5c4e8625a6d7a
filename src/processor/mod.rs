//! The change feed processor: feed ranges divided among instances through lease documents,
//! each batch handed to a [`ChangeHandler`] and checkpointed after it succeeded.
//!
//! Rooms by role (each room's `mod.rs` says what it holds and what it may use):
//! - [`leases`]: the lease documents and their store, an owned lease, the heartbeat, sightings,
//!   the lag report a lease carries, bootstrap and adoption;
//! - [`budgets`]: the request units the processor spends, one pacing design for two budgets:
//!   the lease container's (every lease write) and the monitored container's read budget
//!   (every change feed read) — this instance's share of each, and how it spends it;
//! - [`policy`]: the pure decisions (balancer, acquire-cycle plan, listing schedule, stall state
//!   machine, checkpoint policy, validation of options), table and property tested;
//! - [`run`]: the running parts (runtime, coordinator, renewer, the per-lease reader, delivery,
//!   splits, store recovery, health, what a reader does about a stall, what the tasks share);
//! - [`handlers`]: where batches go (the handler trait and stdout, HTTP, manual checkpoints, dead
//!   letters);
//! - [`report`]: what the processor tells (telemetry, events, observer, the estimator, the error
//!   log);
//! - [`admin`]: the offline checkpoint tools (export, import, rewind, evict), which the running
//!   processor never calls;
//! - [`options`] and [`error`]: the public settings and errors.

pub mod admin;
pub mod budgets;
pub mod error;
pub mod handlers;
pub mod leases;
pub mod options;
pub mod policy;
pub mod report;
pub mod run;

pub use admin::evict::{evict_ended_process, evict_instance};
pub use error::{LeaseError, ProcessorError};
pub use handlers::change_handler::{Batch, ChangeHandler, HandlerError, StdoutHandler};
pub use handlers::dead_letters::{CosmosDeadLetters, DeadLetter, DeadLetterStore};
pub use handlers::http::{HttpFormat, HttpHandler, HttpHandlerConfig, HttpHandlerError};
pub use handlers::manual::{CheckpointError, CheckpointHandle, Handler, ManualCheckpointHandler};
pub use leases::adopt::{AdoptOptions, ForeignLayout};
pub use leases::cosmos_store::{CosmosLeaseStore, lease_prefix};
pub use leases::heartbeat::LeaseLiveness;
pub use leases::lease::{Beat, HeartbeatDoc, Lease, LeaseStore, LeaseStoreError, LockAttempt};
pub use leases::name_claim::NameError;
pub use options::{OnExhausted, ProcessorOptions, ReadBudget, RetryPolicy};
pub use policy::checkpoint_policy::CheckpointPolicy;
pub use policy::validation::{OptionField, OptionsError};
pub use report::estimator::{LeaseEstimate, ProcessorEstimate, estimate_leases};
pub use report::events::{CloseReason, LeaseEvent};
pub use report::observer::{NoopObserver, ProcessorObserver};
pub use run::runtime::{Processor, ProcessorHandle, ProcessorMonitor};
