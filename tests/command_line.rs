//! The command line as a new user meets it: a closed pipe ends a printing command quietly, the
//! help of `checkpoints export` lists only what an export uses, advice names the flags of the
//! command in hand, and the checkpoint commands say at once that they watch for a running
//! instance.

use std::process::Stdio;
use std::time::Duration;

use crate::common::{self, CFP, DB, ITEMS, eventually};

/// Runs `cfp <args>` with standard output a pipe nobody reads (closed before it starts): (exit
/// code, standard error).
fn into_a_closed_pipe(args: &[&str]) -> (Option<i32>, String) {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let output = std::process::Command::new(CFP)
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run cfp");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_closed_pipe_ends_a_printing_command_quietly() {
    for args in [&["crd"][..], &["crd", "--markdown"], &["checkpoints", "--help"]] {
        let (code, stderr) = into_a_closed_pipe(args);
        println!("cfp {} | (closed): exit {code:?}, {:?}", args.join(" "), stderr.trim());
        assert_eq!(code, Some(0), "cfp {}: {stderr}", args.join(" "));
        assert!(!stderr.contains("panicked"), "cfp {}: {stderr}", args.join(" "));
    }
}

fn help(args: &[&str]) -> String {
    let output = std::process::Command::new(CFP)
        .args(args)
        .arg("--help")
        .output()
        .expect("run cfp --help");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn an_export_offers_no_flag_that_does_nothing_for_it() {
    let export = help(&["checkpoints", "export"]);
    assert!(export.contains("--processor"), "{export}");
    for useless in ["--force", "--dry-run", "--lease-renew-interval"] {
        assert!(
            !export.contains(useless),
            "checkpoints export --help lists {useless}:\n{export}"
        );
    }
    for command in ["import", "rewind"] {
        let moving = help(&["checkpoints", command]);
        assert!(moving.contains("--force") && moving.contains("--dry-run"), "{moving}");
        // Each switch names the one check it switches off.
        assert!(
            moving.contains("Switches off the running-instance check only"),
            "{moving}"
        );
    }
    let import = help(&["checkpoints", "import"]);
    assert!(
        import.contains("--other-container") && import.contains("Switches off the container check only"),
        "{import}"
    );
    let rewind = help(&["checkpoints", "rewind"]);
    assert!(!rewind.contains("--other-container"), "{rewind}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_lease_container_is_said_with_the_estimates_own_flags() {
    let (mut emulator, endpoint) = common::start_emulator(&format!("{DB}/{ITEMS}:/pk:2")).await;
    let output = common::cfp_estimate(&endpoint, &["--lease-container", "nosuch"]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("cfp estimate --lease-container nosuch: {}", stderr.trim());
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr.contains("nosuch") && stderr.contains("--lease-container"),
        "{stderr}"
    );
    for foreign in ["--no-create-leases", "createIfNotExists"] {
        assert!(!stderr.contains(foreign), "estimate has no {foreign}: {stderr}");
    }
    common::terminate(&mut emulator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_command_says_at_once_that_it_watches_for_a_running_instance() {
    let (mut emulator, endpoint) = common::start_emulator(&format!("{DB}/{ITEMS}:/pk:2")).await;
    let mut worker = common::cfp_worker(&endpoint)
        .args(["--lease-acquire-interval", "500ms"])
        .stdout(Stdio::null())
        .spawn()
        .expect("cfp worker");
    let leased = eventually(Duration::from_secs(30), || async {
        common::cfp_checkpoints(&endpoint, "export", &[]).await.0 == Some(0)
    })
    .await;
    assert!(leased, "the worker made no leases");
    common::terminate(&mut worker).await;
    // The default renew interval: a watch of 21 s, said at once.
    let mut rewind = tokio::process::Command::new(CFP)
        .args(["checkpoints", "rewind", "--to", "now", "--dry-run"])
        .args(["--endpoint", &endpoint, "--database", DB, "--container", ITEMS])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("cfp checkpoints rewind");
    let stderr = rewind.stderr.take().expect("stderr");
    let said = tokio::time::timeout(Duration::from_secs(10), async {
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("watching the lease container for 21 s for a running instance") {
                return Some(line);
            }
        }
        None
    })
    .await;
    println!("cfp checkpoints rewind --dry-run, within 10 s: {said:?}");
    assert!(
        matches!(said, Ok(Some(_))),
        "nothing said about the 21 s watch: {said:?}"
    );
    let _ = rewind.kill().await;
    common::terminate(&mut emulator).await;
}

/// SIGTERM to a `cfp worker` that delivered batches with `args` (its handler flags): how long
/// until it exited (at most 10 s).
async fn exit_after_sigterm(endpoint: &str, args: &[String], delivered: impl Fn() -> bool) -> Duration {
    let mut worker = common::cfp_worker(endpoint)
        .args(["--lease-acquire-interval", "500ms", "--poll-interval", "200ms"])
        .args(args)
        .stdout(Stdio::null())
        .spawn()
        .expect("cfp worker");
    let pid = worker.id().expect("the worker runs").to_string();
    common::cfp_write(endpoint, 0, 50).await;
    let handled = eventually(Duration::from_secs(30), || async { delivered() }).await;
    assert!(handled, "the worker delivered nothing");
    let signalled = std::time::Instant::now();
    let killed = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await;
    assert!(killed.is_ok_and(|s| s.success()));
    let exited = tokio::time::timeout(Duration::from_secs(10), worker.wait()).await;
    assert!(matches!(exited, Ok(Ok(_))), "no exit within 10 s of SIGTERM");
    signalled.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_the_http_handler_exits_at_once_on_sigterm() {
    let (mut emulator, endpoint) = common::start_emulator(&format!("{DB}/{ITEMS}:/pk:2")).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let port = listener.local_addr().expect("its address").port();
    let batches = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = batches.clone();
    common::receive_batches(listener, move |_, _| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    // localhost: the handler's address is resolved, as a user's usually is.
    let http = [
        "--handler".to_owned(),
        "http".to_owned(),
        "--handler-url".to_owned(),
        format!("http://localhost:{port}/changes"),
    ];
    let took = exit_after_sigterm(&endpoint, &http, || {
        batches.load(std::sync::atomic::Ordering::SeqCst) > 0
    })
    .await;
    println!("cfp worker --handler http: exited {took:?} after SIGTERM");
    assert!(took < Duration::from_secs(1), "{took:?}");
    common::terminate(&mut emulator).await;
}
