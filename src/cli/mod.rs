//! The `cfp` command line: argument definitions ([`args`], [`connection_args`]), the config-file
//! merge ([`config_file`]), the handler it builds ([`handler`]), and one module per subcommand:
//! [`worker`], [`operator`], [`estimate`], [`checkpoints`], [`deadletter`], [`write`], and with
//! the emulator [`emulator`] and [`bench`]. `env_contract_tests` holds the operator ↔ worker
//! settings contract's tests.

pub mod args;
#[cfg(feature = "emulator")]
pub mod bench;
pub mod checkpoints;
pub mod config_file;
pub mod connection_args;
pub mod deadletter;
#[cfg(feature = "emulator")]
pub mod emulator;
pub mod estimate;
pub mod handler;
pub mod operator;
pub mod worker;
pub mod write;

pub use args::{Cli, Command};

/// Writes `text` to standard output. When nobody reads it any more (`cfp crd | head -1`: the
/// pipe is closed) the process ends quietly with success, as Unix tools do, instead of a panic;
/// another write failure is logged.
pub fn print_out(text: impl std::fmt::Display) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let written = write!(out, "{text}").and_then(|()| out.flush());
    match written {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(error) => tracing::warn!(%error, "cannot write to standard output"),
        Ok(()) => {}
    }
}

#[cfg(test)]
#[path = "env_contract_tests.rs"]
mod env_contract_tests;
