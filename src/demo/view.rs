//! What the demo shows while it runs: a live terminal view (indicatif) when stdout is a terminal,
//! plain progress lines otherwise; events as they happen either way.

use std::io::IsTerminal;
use std::io::Write as _;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// One line per worker: name, leases, documents handled, state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerLine {
    /// Instance name.
    pub name: String,
    /// Leases owned now.
    pub leases: usize,
    /// Documents handled.
    pub handled: u64,
    /// `running`, `killed -9` or `stopped`.
    pub state: &'static str,
}

/// The figures of one refresh.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// Seconds since the start.
    pub elapsed: Duration,
    /// Documents written.
    pub written: u64,
    /// Distinct documents delivered.
    pub delivered: usize,
    /// Estimated remaining operations (the processor's estimator).
    pub lag: Option<u64>,
    /// Writes per second over the last refresh.
    pub writes_per_second: f64,
    /// Deliveries per second over the last refresh.
    pub deliveries_per_second: f64,
    /// Leases of the processor.
    pub leases: usize,
    /// The workers.
    pub workers: Vec<WorkerLine>,
}

/// The live view or plain lines.
pub enum View {
    /// An interactive terminal.
    Live {
        /// The bars.
        multi: MultiProgress,
        /// The summary line.
        summary: ProgressBar,
        /// One line per worker.
        workers: Vec<ProgressBar>,
    },
    /// Not a terminal: a line every few seconds.
    Plain {
        /// When the last progress line was printed.
        last: Option<Instant>,
    },
}

impl View {
    /// A live view when stdout is a terminal, plain lines otherwise.
    pub fn new() -> Self {
        if std::io::stdout().is_terminal() {
            let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stdout());
            let summary = multi.add(ProgressBar::new_spinner());
            summary.set_style(
                ProgressStyle::with_template("{spinner} {msg}").unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            View::Live {
                multi,
                summary,
                workers: Vec::new(),
            }
        } else {
            View::Plain { last: None }
        }
    }

    /// Prints an event line (above the live view).
    pub fn event(&self, elapsed: Duration, text: &str) {
        let line = format!("[{:>5.1}s] {text}", elapsed.as_secs_f64());
        match self {
            View::Live { multi, .. } => {
                let _ = multi.println(line);
            }
            View::Plain { .. } => {
                // A closed pipe: the demo goes on without its lines.
                let _ = writeln!(std::io::stdout(), "{line}");
            }
        }
    }

    /// Shows a refresh.
    pub fn show(&mut self, frame: &Frame) {
        let summary = format!(
            "t={:>5.1}s  written {}  delivered {}  lag {}  leases {}  writes/s {:.0}  deliveries/s {:.0}",
            frame.elapsed.as_secs_f64(),
            frame.written,
            frame.delivered,
            frame.lag.map_or_else(|| "?".to_owned(), |l| l.to_string()),
            frame.leases,
            frame.writes_per_second,
            frame.deliveries_per_second
        );
        match self {
            View::Live {
                multi,
                summary: bar,
                workers,
            } => {
                bar.set_message(summary);
                bar.tick();
                while workers.len() < frame.workers.len() {
                    let line = multi.add(ProgressBar::new_spinner());
                    line.set_style(
                        ProgressStyle::with_template("  {msg}").unwrap_or_else(|_| ProgressStyle::default_spinner()),
                    );
                    workers.push(line);
                }
                for (line, worker) in workers.iter().zip(&frame.workers) {
                    line.set_message(worker_text(worker));
                    line.tick();
                }
            }
            View::Plain { last } => {
                if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
                    *last = Some(Instant::now());
                    let workers: Vec<String> = frame.workers.iter().map(worker_text).collect();
                    let _ = writeln!(std::io::stdout(), "{summary}\n    {}", workers.join("\n    "));
                }
            }
        }
    }

    /// Removes the live view (before the final table).
    pub fn finish(&self) {
        if let View::Live { summary, workers, .. } = self {
            summary.finish();
            for line in workers {
                line.finish();
            }
        }
    }
}

impl Default for View {
    fn default() -> Self {
        Self::new()
    }
}

fn worker_text(worker: &WorkerLine) -> String {
    format!(
        "{:<10} leases {:>2}  handled {:>7}  {}",
        worker.name, worker.leases, worker.handled, worker.state
    )
}
