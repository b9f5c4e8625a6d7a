//! The commands of `docs/getting-started.md` and the local pair of `docs/http-handler.md`, run
//! as written: each ```sh block is one bash script, with the documented binary paths
//! (`./target/release/cfp`, `cargo run --release --`) standing for the `cfp` under test. What a
//! block says will happen is checked (the demo's verification, the documents that appear on the
//! worker's or the handler's standard output). Not run: `cargo build` (the binary under test is
//! built) and `cargo test` (this suite itself). A command line that is none of these fails the
//! test, so a new command in these pages gets run here too.
//!
//! Every process a block starts is in the script's own process group, killed when the test ends
//! — also when it fails.

use std::path::Path;
use std::time::Duration;

use crate::common::{CFP, eventually};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The pages' commands use the documented ports (8081, 8080): one test at a time.
static DOCUMENTED_PORTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The ```sh blocks of a Markdown text.
fn sh_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match (&mut current, line.trim_start()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

/// What a documented command line becomes here.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// Run, with the binary under test for the documented path.
    Run(String),
    /// Not run, and why.
    Skip(&'static str),
}

/// The documented command line `line` as it runs here; `None` for a command this test does not
/// know (a new one in the docs: add it here).
fn translate(line: &str) -> Option<Line> {
    let command = line.trim();
    if command.is_empty() || command.starts_with('#') {
        return Some(Line::Skip("blank or comment"));
    }
    if command.starts_with("cargo build") {
        return Some(Line::Skip("the binary under test is built"));
    }
    if command == "cargo test" {
        return Some(Line::Skip("the test suite itself"));
    }
    let cfp = format!("'{CFP}'");
    for documented in ["./target/release/cfp", "cargo run --release --"] {
        if let Some(rest) = command.strip_prefix(documented) {
            return Some(Line::Run(format!("{cfp}{rest}")));
        }
    }
    if command.starts_with("python3 tests/python/") {
        return Some(Line::Run(command.to_owned()));
    }
    None
}

/// A bash script of `block`, or the lines this test does not know.
fn script(block: &str) -> Result<String, Vec<String>> {
    let mut lines = vec!["set -e".to_owned()];
    let mut unknown = Vec::new();
    for line in block.lines() {
        match translate(line) {
            Some(Line::Run(command)) => lines.push(command),
            Some(Line::Skip(_)) => {}
            None => unknown.push(line.to_owned()),
        }
    }
    if unknown.is_empty() {
        Ok(lines.join("\n"))
    } else {
        Err(unknown)
    }
}

/// A script running in its own process group, with standard output and error in files; the
/// group is killed on drop.
struct Running {
    child: std::process::Child,
    stdout: std::path::PathBuf,
    stderr: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Running {
    fn start(name: &str, script: &str) -> Self {
        use std::os::unix::process::CommandExt as _;
        let dir = tempfile::Builder::new()
            .prefix(&format!("cfp-docs-{name}-"))
            .tempdir()
            .expect("a scratch directory");
        let (stdout, stderr) = (dir.path().join("stdout"), dir.path().join("stderr"));
        let child = std::process::Command::new("bash")
            .arg("-c")
            .arg(script)
            .current_dir(ROOT)
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .process_group(0)
            .spawn()
            .expect("run bash");
        Self {
            child,
            stdout,
            stderr,
            _dir: dir,
        }
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The script's exit code, once it ended within `timeout`.
    async fn exited(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let group = i32::try_from(self.child.id()).unwrap_or_default();
        // SAFETY: kill(2) with the negative id of the group this test started.
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// Lines of `text` that are JSON objects with an `id`.
fn documents(text: &str) -> usize {
    text.lines()
        .filter(|l| serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| v.get("id").is_some()))
        .count()
}

fn page(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).expect("read the page")
}

#[test]
fn every_command_of_these_pages_is_one_this_test_runs() {
    // Every block of the getting-started page; of the HTTP handler page its local pair (the
    // first block: the others are syntax with placeholders, `<url>`).
    let getting_started = sh_blocks(&page("docs/getting-started.md"));
    let local_pair = sh_blocks(&page("docs/http-handler.md")).into_iter().take(1);
    for block in getting_started.into_iter().chain(local_pair) {
        if let Err(unknown) = script(&block) {
            panic!("commands this test does not run: {unknown:?}");
        }
    }
    assert_eq!(translate("cargo test"), Some(Line::Skip("the test suite itself")));
    assert_eq!(translate("rm -rf /"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn getting_started_runs_as_written() {
    // Not one of the heavy tests (a 20 s demo, then one worker): holding their lock would keep a
    // test thread waiting for the benchmark's minutes.
    let _ports = DOCUMENTED_PORTS.lock().await;
    let blocks = sh_blocks(&page("docs/getting-started.md"));
    assert_eq!(
        blocks.len(),
        3,
        "the demo, the same pieces by hand, the test suite: {blocks:?}"
    );
    // The demo, shortened to 20 s with its own --duration (as written: about a minute).
    let demo = format!("{} --duration 20s", script(&blocks[0]).expect("known commands"));
    let mut running = Running::start("demo", &demo);
    let code = running.exited(Duration::from_secs(120)).await;
    let out = running.stdout();
    println!(
        "{}",
        out.lines()
            .rev()
            .take(12)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(code, Some(0), "cfp demo: {out}\n{}", running.stderr());
    assert!(out.contains("result: OK, nothing lost"), "{out}");
    drop(running);
    // By hand: the emulator and the worker stay in the background; the 1000 documents written
    // appear on the worker's standard output.
    let by_hand = script(&blocks[1]).expect("known commands");
    let (_running, appeared) = documents_appear("by-hand", &by_hand, 1000).await;
    println!("by hand: {appeared} documents on the worker's standard output");
    assert!(script(&blocks[2]).is_ok_and(|s| s == "set -e"), "only `cargo test`");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_handler_runs_locally_as_written() {
    let _ports = DOCUMENTED_PORTS.lock().await;
    let blocks = sh_blocks(&page("docs/http-handler.md"));
    let local = script(&blocks[0]).expect("known commands");
    assert!(
        local.contains("example_handler.py 8080") && local.contains("--handler http"),
        "{local}"
    );
    let (_running, appeared) = documents_appear("http", &local, 100).await;
    println!("the local HTTP example: {appeared} documents printed by the handler");
}

/// Runs `script` to its end (its background processes go on) and waits until `count` documents
/// appeared on its standard output: the script's processes (killed when dropped) and how many.
async fn documents_appear(name: &str, script: &str, count: usize) -> (Running, usize) {
    let mut running = Running::start(name, script);
    let code = running.exited(Duration::from_secs(60)).await;
    assert_eq!(code, Some(0), "{}", running.stderr());
    let appeared = eventually(Duration::from_secs(60), || async {
        documents(&running.stdout()) >= count
    })
    .await;
    assert!(appeared, "{}\n{}", running.stdout(), running.stderr());
    let found = documents(&running.stdout());
    (running, found)
}
