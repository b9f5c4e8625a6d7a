//! The `cfp` command line: argument definitions, the config-file merge, and one module per
//! subcommand.

pub mod args;
#[cfg(feature = "emulator")]
pub mod bench;
pub mod checkpoints;
pub mod config_file;
pub mod deadletter;
#[cfg(feature = "emulator")]
pub mod emulator;
pub mod estimate;
pub mod handler;
pub mod operator;
pub mod worker;
pub mod write;

pub use args::{Cli, Command};

#[cfg(test)]
#[path = "env_contract_tests.rs"]
mod env_contract_tests;
