//! The worker settings contract, in one place: every processor option as a `cfp worker` flag with
//! its `CFP_*` environment variable ([`ProcessorArgs`], read by clap from either), the options
//! those flags give ([`ProcessorArgs::options`]), and options written back as that environment
//! ([`options_env`], what the operator renders into worker pods). The operator converts a resource
//! into [`ProcessorOptions`] once (`operator::spec_options`) and renders them with
//! [`options_env`]; the worker parses them back with [`ProcessorArgs`]: a round trip (tested).

use std::time::Duration;

use clap::Args;
use time::format_description::well_known::Rfc3339;

use crate::cosmos::{FeedMode, StartFrom};
use crate::processor::options::defaults::{self, text};
use crate::processor::options::{MAX_IN_FLIGHT_BATCHES, MAX_LEASES_PER_PARTITION, MAX_THROUGHPUT_BUCKET};
use crate::processor::policy::balancer::Balancing;
use crate::processor::{
    AdoptOptions, CheckpointPolicy, ForeignLayout, OnExhausted, ProcessorOptions, ReadBudget, RetryPolicy,
};

/// Parses a duration flag (`500ms`, `2s`, `1m`).
pub fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (use forms like 500ms, 2s, 1m)"))
}

/// The processor options of `cfp worker`, each a flag and a `CFP_*` variable.
#[derive(Debug, Args, Clone)]
pub struct ProcessorArgs {
    /// Where leases without a checkpoint start: beginning, now, or an RFC 3339 time.
    #[arg(long, env = "CFP_START_FROM", default_value = "beginning")]
    pub start_from: StartFrom,
    /// Maximum documents per batch.
    #[arg(long, env = "CFP_MAX_ITEMS", default_value_t = defaults::MAX_ITEMS, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_items: u32,
    /// Attempts of a failing batch before --on-exhausted applies.
    #[arg(long, env = "CFP_MAX_ATTEMPTS", default_value_t = defaults::MAX_ATTEMPTS, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: u32,
    /// Wait before the first retry; doubles up to --max-backoff.
    #[arg(long, env = "CFP_INITIAL_BACKOFF", default_value = text(defaults::INITIAL_BACKOFF), value_parser = duration)]
    pub initial_backoff: Duration,
    /// Longest wait between attempts.
    #[arg(long, env = "CFP_MAX_BACKOFF", default_value = text(defaults::MAX_BACKOFF), value_parser = duration)]
    pub max_backoff: Duration,
    /// What happens after --max-attempts failures.
    #[arg(long, env = "CFP_ON_EXHAUSTED", value_enum, default_value_t)]
    pub on_exhausted: OnExhausted,
    /// Adopt the checkpoints of another processor when this one has no leases yet: dotnet (.NET
    /// v3/v2), java-pk or java-epk (Java v4). Its lease documents are left as they are.
    #[arg(long, env = "CFP_ADOPT", requires = "adopt_prefix")]
    pub adopt: Option<ForeignLayout>,
    /// The other processor's lease prefix (its processor name for .NET, its lease prefix for
    /// Java): only leases whose ids start with it, this account's host name, the database and the
    /// container (resource ids; names for java-pk) are taken. A whole id prefix, up to
    /// `_<database>_<container>`, is taken as it is (a processor that used another host name).
    #[arg(long, env = "CFP_ADOPT_PREFIX", requires = "adopt")]
    pub adopt_prefix: Option<String>,
    /// Adopt even while the other processor still renews its leases.
    #[arg(long, env = "CFP_ADOPT_FORCE")]
    pub adopt_force: bool,
    /// How leases are balanced: fair (every instance at its fair share within one cycle) or
    /// steal-one (the reference SDKs' strategy, one lease stolen per cycle; for comparisons).
    #[arg(long, env = "CFP_BALANCING", default_value = "fair")]
    pub balancing: Balancing,
    /// Which changes are read: latest-version (creates and replaces, latest image) or
    /// all-versions-and-deletes (every version and deletes, with the previous image and metadata;
    /// starts only from now).
    #[arg(long, env = "CFP_MODE", default_value = "latest-version")]
    pub mode: FeedMode,
    /// Batches of one lease handed to the handler at once: with more than 1 a slow batch does
    /// not stall its lease (no order across those batches; the checkpoint moves only past
    /// batches that all finished).
    #[arg(long, env = "CFP_MAX_IN_FLIGHT_BATCHES", default_value_t = defaults::MAX_IN_FLIGHT_BATCHES, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_IN_FLIGHT_BATCHES)))]
    pub max_in_flight_batches: u32,
    /// Leases per physical partition when the lease set is created (each an equal
    /// effective-partition-key share), so that more workers than partitions share the work; a
    /// lease set keeps the count it was created with.
    #[arg(long, env = "CFP_LEASES_PER_PARTITION", default_value_t = defaults::LEASES_PER_PARTITION, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_LEASES_PER_PARTITION)))]
    pub leases_per_partition: u32,
    /// Checkpoint after this many handled batches (1: after every batch). More saves lease writes
    /// and costs redelivery of up to that many batches per lease after a crash; a released lease
    /// is always checkpointed.
    #[arg(long, env = "CFP_CHECKPOINT_EVERY_BATCHES", default_value_t = defaults::CHECKPOINT_EVERY_BATCHES, value_parser = clap::value_parser!(u32).range(1..))]
    pub checkpoint_every_batches: u32,
    /// Checkpoint at the latest this long after the last checkpoint while batches are pending.
    #[arg(long, env = "CFP_CHECKPOINT_INTERVAL", value_parser = duration)]
    pub checkpoint_interval: Option<Duration>,
    /// A lease whose handled position has not advanced for this long while it may have lag is
    /// stalled: logged, counted (`cfp_lease_stalled`), its reader restarted from the checkpoint,
    /// and the lease released if it stays stalled. `0s` turns detection off.
    #[arg(long, env = "CFP_STALL_TIMEOUT", default_value = text(defaults::STALL_TIMEOUT), value_parser = duration)]
    pub stall_timeout: Duration,
    /// Wait after a read that returned no changes.
    #[arg(long, env = "CFP_POLL_INTERVAL", default_value = text(defaults::POLL_INTERVAL), value_parser = duration)]
    pub poll_interval: Duration,
    /// How often leases are listed and balanced among instances (an instance alone with every
    /// lease backs off up to the renew interval while nothing changes).
    #[arg(long, env = "CFP_LEASE_ACQUIRE_INTERVAL", default_value = text(defaults::ACQUIRE_INTERVAL), value_parser = duration)]
    pub lease_acquire_interval: Duration,
    /// How often this instance's heartbeat is written: it keeps all of the instance's leases
    /// alive (each lease is renewed on its own too while an older version runs beside it).
    #[arg(long, env = "CFP_LEASE_RENEW_INTERVAL", default_value = text(defaults::RENEW_INTERVAL), value_parser = duration)]
    pub lease_renew_interval: Duration,
    /// A lease whose owner showed no sign of life (a write of it, or its heartbeat) for this
    /// long is taken over by others.
    #[arg(long, env = "CFP_LEASE_EXPIRATION", default_value = text(defaults::EXPIRATION), value_parser = duration)]
    pub lease_expiration: Duration,
    /// Request units a second the whole fleet's change feed reads may spend — `300`, or `25%` of
    /// the monitored container's provisioned throughput — shared among the live instances by
    /// the leases each reads; pages and polls adapt to stay within it. Unset: reads are not
    /// paced (they still go at low priority).
    #[arg(long, env = "CFP_READ_BUDGET")]
    pub read_budget: Option<ReadBudget>,
    /// The throughput bucket (1–5) change feed reads are sent in: the account's bucket caps
    /// what they may spend of the container's throughput.
    #[arg(long, env = "CFP_READ_THROUGHPUT_BUCKET", value_parser = clap::value_parser!(u8).range(1..=i64::from(MAX_THROUGHPUT_BUCKET)))]
    pub read_throughput_bucket: Option<u8>,
}

impl ProcessorArgs {
    /// The options these flags give, for the processor `processor_name` and `instance`.
    pub fn options(&self, processor_name: String, instance: String) -> ProcessorOptions {
        let mut options = ProcessorOptions::new(processor_name, instance);
        options.start_from = self.start_from;
        options.max_items = self.max_items;
        options.poll_interval = self.poll_interval;
        options.stall_timeout = self.stall_timeout;
        options.acquire_interval = self.lease_acquire_interval;
        options.renew_interval = self.lease_renew_interval;
        options.expiration = self.lease_expiration;
        options.leases_per_partition = self.leases_per_partition;
        options.max_in_flight_batches = self.max_in_flight_batches;
        options.mode = self.mode;
        options.balancing = self.balancing;
        options.read_budget = self.read_budget;
        options.read_throughput_bucket = self.read_throughput_bucket;
        options.adopt = self
            .adopt
            .zip(self.adopt_prefix.clone())
            .map(|(layout, prefix)| AdoptOptions {
                layout,
                prefix,
                force: self.adopt_force,
            });
        options.checkpoint = CheckpointPolicy {
            every_batches: self.checkpoint_every_batches,
            interval: self.checkpoint_interval,
        };
        options.retry = RetryPolicy {
            max_attempts: self.max_attempts,
            initial_backoff: self.initial_backoff,
            max_backoff: self.max_backoff,
            on_exhausted: self.on_exhausted,
        };
        options
    }
}

/// The variable that names the processor (`--processor`).
pub const PROCESSOR_VAR: &str = "CFP_PROCESSOR";

/// `options` as the `CFP_*` environment of a worker that runs with them: [`ProcessorArgs`] (and
/// `--processor`) read them back as the same options. The instance is not among them: each worker
/// pod names itself.
pub fn options_env(options: &ProcessorOptions) -> Vec<(&'static str, String)> {
    let mut vars = vec![
        (PROCESSOR_VAR, options.processor_name.clone()),
        ("CFP_START_FROM", start_from_text(options.start_from)),
        ("CFP_MAX_ITEMS", options.max_items.to_string()),
        ("CFP_MAX_ATTEMPTS", options.retry.max_attempts.to_string()),
        ("CFP_INITIAL_BACKOFF", text(options.retry.initial_backoff)),
        ("CFP_MAX_BACKOFF", text(options.retry.max_backoff)),
        ("CFP_ON_EXHAUSTED", value_enum_text(options.retry.on_exhausted)),
        ("CFP_MODE", options.mode.as_str().to_owned()),
        ("CFP_MAX_IN_FLIGHT_BATCHES", options.max_in_flight_batches.to_string()),
        ("CFP_LEASES_PER_PARTITION", options.leases_per_partition.to_string()),
        (
            "CFP_CHECKPOINT_EVERY_BATCHES",
            options.checkpoint.every_batches.to_string(),
        ),
        ("CFP_STALL_TIMEOUT", text(options.stall_timeout)),
        ("CFP_POLL_INTERVAL", text(options.poll_interval)),
        ("CFP_LEASE_ACQUIRE_INTERVAL", text(options.acquire_interval)),
        ("CFP_LEASE_RENEW_INTERVAL", text(options.renew_interval)),
        ("CFP_LEASE_EXPIRATION", text(options.expiration)),
    ];
    if options.balancing != Balancing::default() {
        vars.push(("CFP_BALANCING", balancing_text(options.balancing).to_owned()));
    }
    if let Some(budget) = options.read_budget {
        vars.push(("CFP_READ_BUDGET", budget.to_string()));
    }
    if let Some(bucket) = options.read_throughput_bucket {
        vars.push(("CFP_READ_THROUGHPUT_BUCKET", bucket.to_string()));
    }
    if let Some(interval) = options.checkpoint.interval {
        vars.push(("CFP_CHECKPOINT_INTERVAL", text(interval)));
    }
    if let Some(adopt) = &options.adopt {
        vars.push(("CFP_ADOPT", adopt.layout.as_str().to_owned()));
        vars.push(("CFP_ADOPT_PREFIX", adopt.prefix.clone()));
        if adopt.force {
            vars.push(("CFP_ADOPT_FORCE", "true".to_owned()));
        }
    }
    vars
}

/// `--start-from`'s spelling of `start`.
fn start_from_text(start: StartFrom) -> String {
    match start {
        StartFrom::Beginning => "beginning".to_owned(),
        StartFrom::Now => "now".to_owned(),
        // Formatting a valid time as RFC 3339 fails only for years beyond 9999.
        StartFrom::Time(at) => at.format(&Rfc3339).unwrap_or_else(|_| at.to_string()),
    }
}

/// `--balancing`'s spelling of `balancing`.
fn balancing_text(balancing: Balancing) -> &'static str {
    match balancing {
        Balancing::Fair => "fair",
        Balancing::StealOne => "steal-one",
        Balancing::Work => "work",
    }
}

/// The command-line spelling of a value of a flag with a fixed set of values.
pub fn value_enum_text(value: impl clap::ValueEnum) -> String {
    value
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}
