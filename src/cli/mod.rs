//! The `cfp` command line: argument definitions, the config-file merge, and one module per
//! subcommand.

pub mod args;
pub mod config_file;
#[cfg(feature = "emulator")]
pub mod emulator;
pub mod estimate;
pub mod operator;
pub mod worker;
pub mod write;

pub use args::{Cli, Command};
