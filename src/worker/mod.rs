//! What one worker process is made of, below the command line and the operator (both use it):
//! the worker settings contract (every processor option as a flag, a `CFP_*` variable and back:
//! [`options_args`]), how its settings open the containers and build the processor ([`setup`]),
//! and its metrics and health endpoints ([`metrics`]). Uses `processor` and `cosmos`.

pub mod metrics;
pub mod options_args;
pub mod setup;

pub use setup::{WorkerError, WorkerSettings, build_processor, open};
