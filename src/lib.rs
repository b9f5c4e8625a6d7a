//! changefeed-operator: Azure Cosmos DB change feed processing as a scaled set of workers.
//!
//! - [`cosmos`]: the only module that talks to the Cosmos SDK.
//! - [`processor`]: the change feed processor (leases, balancing, checkpoints, splits).
//! - [`worker`]: one worker process: its settings, opening the containers, metrics and health.
//! - [`operator`]: the Kubernetes operator.
//! - [`cli`]: the `cfp` command line.
//! - [`emulator`]: the SDK's in-memory emulator served over loopback HTTP (`cfp emulator`).
//! - [`demo`]: `cfp demo`, the whole system in one command on the emulator.
//! - [`bench`]: `cfp bench`, the performance goals beside their baselines.
//! - [`http_server`], [`signals`], [`traces`]: the HTTP server loop, shutdown signals, traces.

#[cfg(feature = "emulator")]
pub mod bench;
pub mod cli;
pub mod cosmos;
#[cfg(feature = "emulator")]
pub mod demo;
#[cfg(feature = "emulator")]
pub mod emulator;
pub mod http_server;
pub mod operator;
pub mod processor;
pub mod signals;
pub mod traces;
pub mod worker;
