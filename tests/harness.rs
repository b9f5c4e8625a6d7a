//! The harness cleans up after itself: every process a test starts dies with the test — when
//! the test drops it, fails or panics — and a clock-skewed worker is the process a signal reaches
//! (no wrapper in between).

use std::time::Duration;

use crate::common::processes::alive;
use crate::common::{CFP, DiesWithTest, eventually};

/// Starts `cfp emulator` (a process that runs until stopped) the way the tests start theirs.
fn long_running(skew: Option<&str>) -> tokio::process::Child {
    let mut command = tokio::process::Command::new(CFP);
    command
        .args(["emulator", "--port", "0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .dies_with_test();
    if let Some(skew) = skew {
        command.with_skewed_clock(skew);
    }
    command.spawn().expect("spawn cfp emulator")
}

#[test]
fn a_process_started_by_a_test_that_panics_dies_with_it() {
    let (pid_tx, pid_rx) = std::sync::mpsc::channel();
    // A test thread of its own, as libtest runs each test: it starts a process, then panics
    // without stopping it (its runtime is leaked, so no destructor runs: only the kernel's
    // parent-death signal is left to end the process).
    let failed = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let child = runtime.block_on(async { long_running(None) });
        pid_tx.send(child.id().expect("a pid")).expect("send");
        std::mem::forget(child);
        std::mem::forget(runtime);
        panic!("the test fails with its process running");
    })
    .join();
    assert!(failed.is_err(), "the thread panicked");
    let pid = pid_rx.recv().expect("the pid");
    let gone = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        !alive(pid)
    });
    assert!(gone, "process {pid} outlived the test that started it");
}

#[tokio::test]
async fn a_dropped_process_and_a_skewed_one_are_the_processes_signals_reach() {
    for skew in [None, Some("-1h")] {
        let child = long_running(skew);
        let pid = child.id().expect("a pid");
        let command_line = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let program = command_line.split(|b| *b == 0).next().unwrap_or_default();
        assert!(
            String::from_utf8_lossy(program).ends_with("cfp"),
            "the child is cfp itself, not a wrapper: {:?}",
            String::from_utf8_lossy(&command_line)
        );
        drop(child);
        let gone = eventually(Duration::from_secs(5), || async { !alive(pid) }).await;
        assert!(gone, "process {pid} (skew {skew:?}) outlived its dropped handle");
    }
}
