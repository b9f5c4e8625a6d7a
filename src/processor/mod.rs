//! The change feed processor: feed ranges divided among instances through lease documents,
//! each batch handed to a [`ChangeHandler`] and checkpointed after it succeeded.
//!
//! One module per job: [`lease`] (documents and store), [`bootstrap`], [`balancer`] (pure
//! policy), [`listing_schedule`] (the idle back-off of the listing, pure), [`owned`] (renew/checkpoint/release of an owned lease), [`partition`] (the per-lease
//! loop and splits), [`runtime`] (acquire cycle, renewer, shutdown), [`handler`], [`events`].

pub mod adopt;
pub mod balancer;
pub mod bootstrap;
pub mod checkpoint_policy;
pub mod deadletter;
pub mod delivery;
pub mod error_log;
pub mod estimator;
pub mod events;
pub mod evict;
pub mod handler;
pub mod http_handler;
pub mod lease;
pub mod listing_schedule;
pub mod manual;
pub mod monitored_watch;
pub mod observer;
pub mod options;
pub mod owned;
pub mod partition;
pub mod runtime;

pub use adopt::{AdoptOptions, ForeignLayout};
pub use checkpoint_policy::CheckpointPolicy;
pub use deadletter::{CosmosDeadLetters, DeadLetter, DeadLetterStore};
pub use estimator::{LeaseEstimate, ProcessorEstimate, estimate_leases};
pub use events::{CloseReason, LeaseEvent};
pub use evict::evict_instance;
pub use handler::{Batch, ChangeHandler, HandlerError, StdoutHandler};
pub use http_handler::{HttpFormat, HttpHandler, HttpHandlerConfig};
pub use lease::{CosmosLeaseStore, Lease, LeaseStore, LeaseStoreError, lease_prefix};
pub use manual::{CheckpointError, CheckpointHandle, Handler, ManualCheckpointHandler};
pub use observer::{NoopObserver, ProcessorObserver};
pub use options::{OnExhausted, ProcessorOptions, RetryPolicy};
pub use runtime::{ChangeFeedProcessor, ProcessorError, ProcessorHandle, ProcessorMonitor};
