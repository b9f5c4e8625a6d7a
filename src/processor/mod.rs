//! The change feed processor: feed ranges divided among instances through lease documents,
//! each batch handed to a [`ChangeHandler`] and checkpointed after it succeeded.
//!
//! One module per job:
//! - leases: [`lease`] (documents and store), [`owned`] (renew/checkpoint/release of an owned
//!   lease), [`bootstrap`] and [`adopt`] (creating leases, adopting .NET/Java ones), [`evict`],
//!   [`checkpoints`] (export, rewind and import plans, pure) and [`checkpoint_apply`] (writing them);
//! - deciding (pure, table and property tested): [`balancer`], [`cycle_plan`] (one acquire
//!   cycle), [`sightings`] (expiry on this instance's own clock), [`liveness`] (heartbeats keep leases alive), [`listing_schedule`], [`checkpoint_policy`];
//! - doing: [`coordinator`] (performs the cycle plans, starts and settles lease tasks),
//!   [`renewer`], [`lease_reader`] (the per-lease loop), [`split`], [`delivery`] (retries, dead
//!   letters), [`store_recovery`] (deleted leases, a deleted lease container);
//! - state and reports: [`shared`] (what the tasks share), [`crash_gate`] (an abort writes nothing), [`health`], [`telemetry`],
//!   [`error`], [`error_log`], [`events`], [`observer`], [`monitored_watch`];
//! - the public face: [`runtime`] (start, stop, monitor), [`options`] and [`validation`], [`handler`],
//!   [`http_handler`], [`manual`], [`deadletter`], [`estimator`].

pub mod adopt;
pub mod balancer;
pub mod bootstrap;
pub mod checkpoint_apply;
pub mod checkpoint_policy;
pub mod checkpoints;
pub(crate) mod coordinator;
pub(crate) mod crash_gate;
pub mod cycle_plan;
pub mod deadletter;
pub mod delivery;
pub mod error;
pub mod error_log;
pub mod estimator;
pub mod events;
pub mod evict;
pub mod handler;
pub(crate) mod health;
pub mod http_handler;
pub mod lag_report;
pub mod lease;
pub mod lease_reader;
pub mod listing_schedule;
pub mod liveness;
pub mod manual;
pub mod monitored_watch;
pub mod observer;
pub mod options;
pub mod owned;
pub(crate) mod renewer;
pub mod runtime;
pub(crate) mod shared;
pub mod sightings;
pub mod split;
pub mod stall;
pub(crate) mod stall_report;
pub(crate) mod store_recovery;
pub(crate) mod telemetry;
pub mod validation;

pub use adopt::{AdoptOptions, ForeignLayout};
pub use checkpoint_policy::CheckpointPolicy;
pub use deadletter::{CosmosDeadLetters, DeadLetter, DeadLetterStore};
pub use error::{LeaseError, ProcessorError};
pub use estimator::{LeaseEstimate, ProcessorEstimate, estimate_leases};
pub use events::{CloseReason, LeaseEvent};
pub use evict::evict_instance;
pub use handler::{Batch, ChangeHandler, HandlerError, StdoutHandler};
pub use http_handler::{HttpFormat, HttpHandler, HttpHandlerConfig, HttpHandlerError};
pub use lease::{CosmosLeaseStore, Lease, LeaseStore, LeaseStoreError, LockAttempt, lease_prefix};
pub use liveness::LeaseLiveness;
pub use manual::{CheckpointError, CheckpointHandle, Handler, ManualCheckpointHandler};
pub use observer::{NoopObserver, ProcessorObserver};
pub use options::{OnExhausted, ProcessorOptions, RetryPolicy};
pub use runtime::{ChangeFeedProcessor, ProcessorHandle, ProcessorMonitor};
pub use validation::{OptionField, OptionsError};
