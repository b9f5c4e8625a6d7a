//! `cfp bench`: the performance goals (DESIGN.md "Goals with numbers") measured side by side
//! with their baselines in one run, on the SDK's in-memory emulator (in-process, and `cfp
//! emulator` on loopback for the worker-process figures). Prints a table and writes JSON.
//! Ratios, not absolute times, are what compare across machines.
//!
//! - `figures`: one function per figure, each against its baseline; `world` (the in-process
//!   world they run in), `counting_store` (a lease store that counts what passes), `processes`
//!   (the processes some figures start), `restart` (a worker restarted in its pod),
//!   `work_balance` (balancing by work under Zipf-skewed work);
//! - `loopback`: `cfp worker` processes against `cfp emulator`; `java`: the Java v4 processor
//!   beside them;
//! - `scale`, `estimation_cost`, `operator_scale`: the `scale` group (many leases and instances,
//!   the operator's estimate, the operator at size); `budgets`: the request-unit budgets groups
//!   of the lease and monitored containers; `read_budget`: the fleet's read budget beside an
//!   application; `freshness_step`: the autoscaling policy on freshness against a step in load,
//!   run only when `--only` names it (its goals are not met yet: issue 55 §5b);
//! - `operator`, `resources`, [`control_plane`]: the operator's own figure on a throwaway
//!   control plane.

mod budgets;
pub mod control_plane;
mod counting_store;
mod estimation_cost;
mod figures;
mod freshness_step;
mod java;
mod loopback;
mod operator;
mod operator_scale;
mod processes;
mod read_budget;
mod resources;
mod restart;
mod scale;
mod work_balance;
mod world;

pub use control_plane::has_binaries as has_control_plane_binaries;
pub use counting_store::{CountingStore, LeaseWrites, StoreRequests};

use serde::Serialize;

/// What to run, and how big.
#[derive(Debug, Clone)]
pub struct BenchSettings {
    /// Backlog size for the throughput and CPU figures.
    pub documents: usize,
    /// Physical partitions of the throughput and latency containers.
    pub partitions: u32,
    /// Interleaved rounds of the throughput comparison (the median counts).
    pub rounds: u32,
    /// Steady writes per second for the latency figure.
    pub rate: u32,
    /// How long the latency figure writes.
    pub latency_seconds: u64,
    /// How long the idle lease-cost figure watches.
    pub idle_seconds: u64,
    /// Lease timings as a share of the defaults (0.1: ten times faster) for rebalance and
    /// failover, so that a run is short; those figures are also given in acquire intervals.
    pub timing_scale: f64,
    /// The Java v4 processor peer's jar (`bench/java-peer/build.sh`); without it the comparison
    /// with Java is skipped.
    pub java_peer: Option<std::path::PathBuf>,
    /// Where etcd and kube-apiserver are (`tools/k8s/build.sh`); without them the operator's
    /// memory is not measured.
    pub k8s_bin: Option<std::path::PathBuf>,
    /// Measure only the figures whose group name contains this (for example `latency`).
    pub only: Option<String>,
    /// Leases of the scale group's fleet.
    pub scale_leases: usize,
    /// Instances of the scale group's fleet.
    pub scale_instances: usize,
    /// Lease timings of the scale group's fleet as a share of the defaults: the defaults in the
    /// full run (50 instances listing 2,000 leases ten times faster than production saturate 2
    /// cores, and a handoff that waits on the machine outlasts a tenth of an expiration).
    pub scale_timing_scale: f64,
    /// Leases on the one instance of the scale group's renewal-gap figure.
    pub gap_leases: usize,
}

impl BenchSettings {
    /// The backlog of the worker-process figures over loopback (RSS, CPU, four processes against
    /// one): `cfp emulator` takes writes far slower than the in-process one (about 6 000/s), so a
    /// fifth of [`documents`](Self::documents), at least 2 000 — enough for per-100 000 figures.
    pub fn loopback_documents(&self) -> usize {
        (self.documents / 5).max(2_000.min(self.documents))
    }

    /// The full run the table of the performance page (`docs/performance.md`) comes from.
    pub fn full() -> Self {
        Self {
            documents: 100_000,
            partitions: 8,
            rounds: 3,
            rate: 500,
            latency_seconds: 30,
            idle_seconds: 60,
            timing_scale: 0.1,
            java_peer: None,
            k8s_bin: None,
            only: None,
            scale_leases: 2_000,
            scale_instances: 50,
            scale_timing_scale: 1.0,
            gap_leases: 500,
        }
    }

    /// A run of a few seconds per figure (the test that keeps the benchmark from rotting).
    pub fn small() -> Self {
        Self {
            documents: 2_000,
            partitions: 4,
            rounds: 1,
            rate: 100,
            latency_seconds: 2,
            idle_seconds: 3,
            timing_scale: 0.1,
            java_peer: None,
            k8s_bin: None,
            only: None,
            // 40 leases an instance, as in the full run: the per-instance costs weigh as there.
            scale_leases: 160,
            scale_instances: 4,
            scale_timing_scale: 0.1,
            gap_leases: 50,
        }
    }
}

/// One measured figure, with what it is compared with.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Figure {
    /// What was measured (and its unit).
    pub name: String,
    /// Our value.
    pub value: f64,
    /// What it is compared with.
    pub baseline: String,
    /// The baseline's value, when measured or computed in this run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_value: Option<f64>,
    /// `value / baseline_value`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// The goal (DESIGN.md).
    pub goal: String,
    /// Whether the goal is met (`null` for a figure without one).
    pub met: Option<bool>,
    /// The goal as checked (`null` for a figure without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<Check>,
    /// What kind of figure this is: a count holds its goal in any run, a measure of time, rate or
    /// memory depends on the machine and the run's size.
    #[serde(default = "FigureKind::measure")]
    pub kind: FigureKind,
}

/// Whether a figure counts or measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FigureKind {
    /// Requests, request units, writes, lease moves, acquire cycles, 429s, duplicates, errors:
    /// the suite's small run asserts its goal.
    Count,
    /// A time, rate, ratio of rates or memory size: the suite's small run asserts its goal with a
    /// wide margin.
    Measure,
}

impl FigureKind {
    fn measure() -> Self {
        FigureKind::Measure
    }
}

/// How a figure's goal is checked.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Check {
    /// The value is at most this.
    AtMost(f64),
    /// The value is below this.
    Below(f64),
    /// The value is at least this.
    AtLeast(f64),
    /// The value divided by the baseline's is at most this.
    RatioAtMost(f64),
    /// The value divided by the baseline's is at least this.
    RatioAtLeast(f64),
}

impl Check {
    /// Whether `value` (with `ratio` to its baseline) meets the goal; a ratio goal without a
    /// ratio (a zero baseline) is not met.
    pub fn met(self, value: f64, ratio: Option<f64>) -> bool {
        match self {
            Check::AtMost(limit) => value <= limit,
            Check::Below(limit) => value < limit,
            Check::AtLeast(limit) => value >= limit,
            Check::RatioAtMost(limit) => ratio.is_some_and(|r| r <= limit),
            Check::RatioAtLeast(limit) => ratio.is_some_and(|r| r >= limit),
        }
    }
}

impl Figure {
    /// A figure compared with a baseline measured (or computed) in the same run.
    pub fn ratio(name: &str, value: f64, baseline: &str, baseline_value: f64, goal: &str) -> Self {
        Self {
            name: name.to_owned(),
            value,
            baseline: baseline.to_owned(),
            baseline_value: Some(baseline_value),
            ratio: (baseline_value != 0.0).then(|| value / baseline_value),
            goal: goal.to_owned(),
            met: None,
            check: None,
            kind: FigureKind::Measure,
        }
    }

    /// Checks the figure against its goal.
    pub fn against(mut self, check: Check) -> Self {
        self.met = Some(check.met(self.value, self.ratio));
        self.check = Some(check);
        self
    }

    /// Marks the figure a count ([`FigureKind::Count`]).
    pub fn counted(mut self) -> Self {
        self.kind = FigureKind::Count;
        self
    }

    /// A figure with a baseline that is only described.
    pub fn plain(name: &str, value: f64, baseline: &str, goal: &str) -> Self {
        Self {
            name: name.to_owned(),
            value,
            baseline: baseline.to_owned(),
            baseline_value: None,
            ratio: None,
            goal: goal.to_owned(),
            met: None,
            check: None,
            kind: FigureKind::Measure,
        }
    }
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BenchReport {
    /// What was run (`--label`: the commit and build profile of a published run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The figures, in the order of DESIGN.md.
    pub figures: Vec<Figure>,
    /// Figures that could not be measured, with why.
    pub failed: Vec<String>,
    /// Comparisons not run, with why (the Java peer without its jar).
    pub skipped: Vec<String>,
    /// The machine: CPU count and kernel.
    pub machine: String,
}

/// Why a figure could not be measured (the others still are).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A Cosmos request failed.
    #[error(transparent)]
    Cosmos(#[from] crate::cosmos::CosmosError),
    /// A process, file or socket failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The containers could not be opened as a worker opens them.
    #[error(transparent)]
    Open(#[from] crate::worker::WorkerError),
    /// The in-process emulator could not start.
    #[error(transparent)]
    Emulator(#[from] crate::emulator::EmulatorError),
    /// A measuring task failed.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
    /// A document or resource is not the JSON expected.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The lease store failed.
    #[error(transparent)]
    LeaseStore(#[from] crate::processor::LeaseStoreError),
    /// A processor could not start.
    #[error(transparent)]
    Processor(#[from] crate::processor::ProcessorError),
    /// What was measured did not come about (a wait ran out, a peer misbehaved): what.
    #[error("{0}")]
    NotReached(String),
}

impl From<String> for BenchError {
    fn from(what: String) -> Self {
        BenchError::NotReached(what)
    }
}

impl From<&str> for BenchError {
    fn from(what: &str) -> Self {
        BenchError::NotReached(what.to_owned())
    }
}

/// The figure groups, in the order they run.
const GROUPS: [&str; 19] = [
    "throughput",
    "busy handler",
    "rebalance",
    "balance by work",
    "failover",
    "failover: in-place restart",
    "latency",
    "resources",
    "worker processes",
    "operator",
    "lease-store cost",
    "scale",
    "scale: operator estimate",
    "budgets: lease container",
    "budgets: monitored container",
    "budgets: read budget",
    "autoscaling: freshness step",
    "scale: operator at size",
    "java v4 peer",
];

/// Whether `--only only` selects group `name`: for each of its comma-separated parts, the group
/// of that exact name if there is one (`scale` is the scale group alone, not also `scale:
/// operator …`), else every group whose name contains it.
fn selects(only: &str, name: &str) -> bool {
    only.split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .any(|part| {
            if GROUPS.contains(&part) {
                name == part
            } else {
                name.contains(part)
            }
        })
}

/// Runs every figure; a figure that fails is reported, the others still run.
pub async fn run(settings: &BenchSettings, progress: impl Fn(&str)) -> BenchReport {
    let mut figures = Vec::new();
    let mut failed = Vec::new();
    let wanted = |name: &str| settings.only.as_deref().is_none_or(|only| selects(only, name));
    macro_rules! measure {
        ($name:expr, $call:expr) => {{
            if wanted($name) {
                progress($name);
                match $call.await {
                    Ok(found) => figures.extend(found),
                    Err(error) => failed.push(format!("{}: {error}", $name)),
                }
            }
        }};
    }
    measure!("throughput", figures::throughput(settings));
    measure!("busy handler", figures::busy_handler(settings));
    measure!("rebalance", figures::rebalance(settings));
    measure!("balance by work", work_balance::by_work(settings));
    measure!("failover", figures::failover(settings));
    measure!("failover: in-place restart", restart::in_place_restart(settings));
    measure!("latency", figures::latency(settings));
    measure!("resources", resources::worker_process(settings));
    measure!("worker processes", loopback::scale(settings));
    let mut skipped = Vec::new();
    match &settings.k8s_bin {
        Some(bin) => measure!("operator", operator::operator_memory(bin)),
        None if !wanted("operator") => {}
        None => skipped.push(
            "the operator's memory: no etcd and kube-apiserver (tools/k8s/build.sh builds them; --k8s-bin)".to_owned(),
        ),
    }
    measure!("lease-store cost", figures::lease_cost(settings));
    measure!("scale", scale::scale(settings));
    measure!("scale: operator estimate", estimation_cost::estimation_cost(settings));
    measure!("budgets: lease container", budgets::lease_container(settings));
    measure!("budgets: monitored container", budgets::monitored_container(settings));
    measure!("budgets: read budget", read_budget::read_budget(settings));
    // Named only: its goals are not met yet, and a run of every group would carry that.
    if settings
        .only
        .as_deref()
        .is_some_and(|only| selects(only, "autoscaling: freshness step"))
    {
        measure!("autoscaling: freshness step", freshness_step::freshness_step(settings));
    }
    match &settings.k8s_bin {
        Some(bin) => measure!(
            "scale: operator at size",
            operator_scale::operator_at_scale(bin, settings)
        ),
        None if !wanted("scale: operator at size") => {}
        None => skipped.push("the operator at size: no etcd and kube-apiserver (--k8s-bin)".to_owned()),
    }
    match &settings.java_peer {
        Some(jar) => measure!("java v4 peer", java::against_java(settings, jar)),
        None if !wanted("java v4 peer") => {}
        None => skipped.push(
            "the Java v4 processor comparison: no peer jar (bench/java-peer/build.sh builds it; --java-peer)"
                .to_owned(),
        ),
    }
    BenchReport {
        label: None,
        figures,
        failed,
        skipped,
        machine: machine(),
    }
}

/// CPU count and kernel release.
fn machine() -> String {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpus} CPUs, Linux {}", kernel.trim())
}

/// The report as a Markdown table.
pub fn table(report: &BenchReport) -> String {
    let mut out = String::from(
        "| figure | ours | compared with | baseline | ratio | goal | met |\n|---|---|---|---|---|---|---|\n",
    );
    let number = |v: f64| {
        if v.abs() >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.2}")
        }
    };
    for figure in &report.figures {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            figure.name,
            number(figure.value),
            figure.baseline,
            figure.baseline_value.map(number).unwrap_or_else(|| "–".into()),
            figure.ratio.map(|r| format!("{r:.2}")).unwrap_or_else(|| "–".into()),
            figure.goal,
            match figure.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "–",
            }
        ));
    }
    for failure in &report.failed {
        out.push_str(&format!("\nnot measured: {failure}\n"));
    }
    for skipped in &report.skipped {
        out.push_str(&format!("\nnot run: {skipped}\n"));
    }
    out.push_str(&format!("\nmachine: {}\n", report.machine));
    if let Some(label) = &report.label {
        out.push_str(&format!("\nrun: {label}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_selects_the_group_of_that_name_or_every_group_containing_it() {
        let selected = |only: &str| GROUPS.iter().filter(|g| selects(only, g)).copied().collect::<Vec<_>>();
        assert_eq!(selected("scale"), ["scale"]);
        assert_eq!(selected("operator"), ["operator"]);
        assert_eq!(
            selected("scale: operator"),
            ["scale: operator estimate", "scale: operator at size"]
        );
        assert_eq!(selected("busy"), ["busy handler"]);
        assert!(selected("nothing").is_empty());
        assert_eq!(selected("throughput, busy"), ["throughput", "busy handler"]);
    }

    #[test]
    fn goals_are_checked_on_the_value_or_the_ratio() {
        let cases = [
            (Check::AtMost(2.0), 2.0, None, true),
            (Check::AtMost(2.0), 2.1, None, false),
            (Check::Below(0.5), 0.5, None, false),
            (Check::AtLeast(3.0), 3.0, None, true),
            (Check::RatioAtMost(1.0), 9.0, Some(0.9), true),
            (Check::RatioAtMost(1.0), 9.0, None, false),
            (Check::RatioAtLeast(2.0), 1.0, Some(1.5), false),
        ];
        for (check, value, ratio, met) in cases {
            assert_eq!(check.met(value, ratio), met, "{check:?} {value} {ratio:?}");
        }
        let figure = Figure::ratio("f", 1.0, "b", 2.0, "≤ reference").against(Check::RatioAtMost(1.0));
        assert_eq!(figure.met, Some(true));
        assert_eq!(Figure::plain("g", 1.0, "b", "–").met, None);
        assert!(
            table(&BenchReport {
                label: None,
                figures: vec![figure],
                failed: vec![],
                skipped: vec![],
                machine: "m".into()
            })
            .contains("| ≤ reference | yes |")
        );
    }
}
