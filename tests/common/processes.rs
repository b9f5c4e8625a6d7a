//! Processes a test starts die with the test: killed when their handle is dropped (the test
//! ended, failed or panicked), and by the kernel when the thread that started them ends (the
//! parent-death signal: libtest runs each test on its own thread) or the test process dies. A
//! clock skew is applied with libfaketime preloaded into the process itself rather than the
//! `faketime` wrapper, which forks: a signal to the wrapper (`kill -9`, `SIGSTOP`) would not
//! reach the worker.

use std::path::PathBuf;

/// Makes a command's process die with the test that starts it.
pub trait DiesWithTest {
    /// Kill on drop, and the parent-death signal `SIGKILL`.
    fn dies_with_test(&mut self) -> &mut Self;
    /// Runs the process with its wall clock skewed by `skew` (libfaketime's format, e.g. `-1h`,
    /// `+30s`); its monotonic clock is left alone.
    fn with_skewed_clock(&mut self, skew: &str) -> &mut Self;
}

impl DiesWithTest for tokio::process::Command {
    fn dies_with_test(&mut self) -> &mut Self {
        self.kill_on_drop(true);
        // SAFETY: the closure runs in the forked child before exec and calls only prctl, which is
        // async-signal-safe.
        unsafe {
            self.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        self
    }

    fn with_skewed_clock(&mut self, skew: &str) -> &mut Self {
        self.env("LD_PRELOAD", libfaketime())
            .env("FAKETIME", skew)
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
    }
}

/// Debian's libfaketime (package `libfaketime`, installed with `faketime`).
pub fn libfaketime() -> PathBuf {
    let candidates = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
        "/usr/local/lib",
    ];
    candidates
        .iter()
        .map(|dir| PathBuf::from(dir).join("faketime/libfaketime.so.1"))
        .find(|path| path.exists())
        .expect("libfaketime.so.1 (Debian's package faketime) is installed")
}

/// Whether process `pid` still exists (a zombie that was not reaped counts as gone).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}
