//! Argument definitions. Every worker flag can also come from `CFP_<NAME>` or a config file.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::processor::options::defaults::{self, text};
use crate::worker::options_args::{ProcessorArgs, duration};

pub use super::connection_args::{ConnectionArgs, LeaseArgs};

/// Azure Cosmos DB change feed processing, run as a scaled set of workers.
#[derive(Debug, Parser)]
#[command(name = "cfp", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve a local Cosmos DB (the Cosmos SDK's in-memory emulator) on loopback.
    #[cfg(feature = "emulator")]
    Emulator(EmulatorArgs),
    /// Run one change feed processor instance.
    Worker(Box<WorkerArgs>),
    /// The whole system in one command on the embedded emulator: writes, workers, a crash, a
    /// split, a new worker, a drain, and a verification table.
    #[cfg(feature = "emulator")]
    Demo(DemoArgs),
    /// Measure the performance goals against their baselines in one run (table and JSON).
    #[cfg(feature = "emulator")]
    Bench(BenchArgs),
    /// Write generated documents into a container (for trying things out and load tests).
    Write(WriteArgs),
    /// Print the remaining work per lease of a processor (the estimator).
    Estimate(EstimateArgs),
    /// Run the Kubernetes operator (reconciles ChangeFeedProcessor resources).
    Operator(OperatorArgs),
    /// Print the ChangeFeedProcessor CustomResourceDefinition (YAML), or its field reference.
    Crd(CrdArgs),
    /// List or replay the documents a processor dead-lettered.
    #[command(subcommand)]
    Deadletter(DeadLetterCommand),
    /// Export, import or rewind a processor's checkpoints (its leases' positions).
    #[command(subcommand)]
    Checkpoints(CheckpointsCommand),
}

/// `cfp crd`.
#[derive(Debug, Args)]
pub struct CrdArgs {
    /// Print the field reference in Markdown (path, type, default, validation, description from
    /// the schema; what `docs/reference/changefeedprocessor.md` holds) instead of the YAML.
    #[arg(long)]
    pub markdown: bool,
}

/// `cfp emulator`.
#[cfg(feature = "emulator")]
#[derive(Debug, Args)]
pub struct EmulatorArgs {
    /// Port to listen on.
    #[arg(long, default_value_t = 8081, env = "CFP_EMULATOR_PORT")]
    pub port: u16,
    /// Address to listen on (loopback by default).
    #[arg(long, default_value = "127.0.0.1", env = "CFP_EMULATOR_HOST")]
    pub host: std::net::IpAddr,
    /// The URL clients are told to use (default: `http://<host>:<port>/`), for example the URL of
    /// a Kubernetes Service in front of the emulator. Clients of a host other than localhost need
    /// `AZURE_COSMOS_EMULATOR_HOST=<that host>` to use plain http.
    #[arg(long, env = "CFP_EMULATOR_ADVERTISE_URL")]
    pub advertise_url: Option<String>,
    /// Disable key auth, as an account with local authorization disabled: serve only requests
    /// carrying the Microsoft Entra ID token written in this file (for testing `--auth
    /// workload-identity` against a token endpoint you run).
    #[arg(
        long,
        env = "CFP_EMULATOR_ENTRA_TOKEN_FILE",
        value_name = "PATH",
        conflicts_with = "key"
    )]
    pub entra_token_file: Option<std::path::PathBuf>,
    /// Refuse creating, replacing and deleting databases and containers with a key (403), as an
    /// account with `disableKeyBasedMetadataWriteAccess` does. Microsoft Entra ID tokens
    /// (`--entra-token-file`) are always refused them, as by the service; `--container` still
    /// creates containers at start.
    #[arg(long, env = "CFP_EMULATOR_DENY_METADATA_WRITES")]
    pub deny_metadata_writes: bool,
    /// Require requests signed with this account key, as the service does (401 otherwise). By
    /// default any signature is accepted, as in the SDK's emulator.
    #[arg(long, env = "CFP_EMULATOR_KEY", hide_env_values = true)]
    pub key: Option<String>,
    /// A container to create at start: `database/container[:/partitionKeyPath[:partitions]]`
    /// (default partition key `/id`, 4 partitions). Repeatable.
    #[arg(long = "container", value_name = "SPEC")]
    pub containers: Vec<crate::emulator::ContainerSpec>,
    /// Provisioned throughput of a `--container`: `database/container=RU` (RU/s, at least 400).
    /// Its writes are charged request units, each physical partition gets an equal share per
    /// second, and a write past it gets 429 with `x-ms-retry-after-ms`, as on the service.
    /// Repeatable.
    #[arg(long = "throughput", value_name = "DB/COLL=RU")]
    pub throughput: Vec<crate::emulator::ThroughputSpec>,
    /// A throughput bucket of a container given a `--throughput`: `database/container:bucket=percent`
    /// (bucket 1–5): requests sent in it (`x-ms-cosmos-throughput-bucket`) spend at most that
    /// percentage of the container's throughput a second, and past it are answered 429/3212.
    #[arg(long = "throughput-bucket", value_name = "DB/COLL:BUCKET=PERCENT")]
    pub throughput_bucket: Vec<crate::emulator::BucketSpec>,
    /// A region of the account (repeatable; the first takes writes; default: one region, `East
    /// US`). Each region is served on a port of its own: the next ports after `--port` (any free
    /// port when it is 0), and the account metadata names each region's endpoint.
    #[arg(long = "region", value_name = "NAME")]
    pub regions: Vec<String>,
    /// How long a write takes to reach the other regions, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub replication_delay_ms: u64,
}

/// `cfp bench`.
#[cfg(feature = "emulator")]
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A short run (small backlog, a few seconds per figure) instead of the full one.
    #[arg(long)]
    pub small: bool,
    /// Backlog size (default: 100 000; 2 000 with --small).
    #[arg(long)]
    pub documents: Option<usize>,
    /// Leases of the scale and budgets groups' fleet (default: 2 000; 160 with --small): measure
    /// at your own size.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub leases: Option<u32>,
    /// Instances of the scale and budgets groups' fleet (default: 50; 4 with --small; at least 2).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(2..=1_000))]
    pub instances: Option<u32>,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// The Java v4 change feed processor peer to compare with (default:
    /// `bench/java-peer/target/java-peer-0.1.0.jar` when it exists; `bench/java-peer/build.sh`
    /// builds it). Needs `java` (17+).
    #[arg(long, env = "CFP_BENCH_JAVA_PEER")]
    pub java_peer: Option<std::path::PathBuf>,
    /// The directory with `etcd` and `kube-apiserver` for the operator's memory figure (default:
    /// what `tools/k8s/build.sh --print` names, when run from the checkout and built).
    #[arg(long, env = "CFP_K8S_BIN")]
    pub k8s_bin: Option<std::path::PathBuf>,
    /// Measure only the figure group of this name (throughput, busy handler, rebalance,
    /// failover, latency, resources, worker processes, operator, lease-store cost, scale, scale:
    /// operator estimate, budgets: lease container, budgets: monitored container, scale:
    /// operator at size, java v4 peer), or, when no group has this name, every group whose name
    /// contains it; several separated by commas.
    #[arg(long)]
    pub only: Option<String>,
    /// What was run, printed under the table and kept in the JSON (for example the commit and
    /// the build profile of a published run).
    #[arg(long)]
    pub label: Option<String>,
    /// Measure nothing: print the table of a run's JSON (`--json` of an earlier run).
    #[arg(long, value_name = "JSON", conflicts_with_all = ["small", "only", "json", "label"])]
    pub render: Option<std::path::PathBuf>,
}

/// `cfp demo`.
#[cfg(feature = "emulator")]
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How long documents are written (the drain and the verification come after).
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub duration: Duration,
    /// Worker processes at the start (one more joins later).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=32))]
    pub workers: u32,
    /// Physical partitions of the demo container.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub partitions: u32,
    /// Documents written per second.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub rate: u32,
}

/// The built-in handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HandlerKind {
    /// One JSON line per changed document on standard output.
    Stdout,
    /// POST every batch to --handler-url.
    Http,
}

/// Where batches go (`cfp worker`, `cfp deadletter replay`).
#[derive(Debug, Args, Clone)]
pub struct HandlerArgs {
    /// Where batches go.
    #[arg(long, env = "CFP_HANDLER", value_enum, default_value = "stdout")]
    pub handler: HandlerKind,
    /// The URL the HTTP handler POSTs batches to, for example `http://localhost:8080/changes`.
    #[arg(long, env = "CFP_HANDLER_URL")]
    pub handler_url: Option<String>,
    /// The HTTP body format.
    #[arg(long, env = "CFP_HANDLER_FORMAT", value_enum, default_value_t)]
    pub handler_format: crate::processor::HttpFormat,
    /// An HTTP request taking longer fails (and is retried).
    #[arg(long, env = "CFP_HANDLER_TIMEOUT", default_value = text(defaults::HANDLER_TIMEOUT), value_parser = duration)]
    pub handler_timeout: Duration,
    /// An extra HTTP header `NAME=VALUE` (repeatable). Also every environment variable
    /// `CFP_HANDLER_HEADER_<NAME>`; values are never logged.
    #[arg(long = "handler-header", value_name = "NAME=VALUE")]
    pub handler_headers: Vec<String>,
    /// A path on the handler's host that answers 2xx when it is ready (default: its port accepts connections).
    #[arg(long, env = "CFP_HANDLER_READINESS_PATH")]
    pub handler_readiness_path: Option<String>,
}

/// Where `cfp worker` moves the documents of batches that exhausted their attempts.
#[derive(Debug, Args, Clone)]
pub struct DeadLetterContainerArgs {
    /// Database of the dead-letter container (default: the lease database).
    #[arg(long, env = "CFP_DEAD_LETTER_DATABASE")]
    pub dead_letter_database: Option<String>,
    /// The dead-letter container (created with partition key `/id` when missing, unless
    /// --no-create-leases).
    #[arg(long, env = "CFP_DEAD_LETTER_CONTAINER")]
    pub dead_letter_container: Option<String>,
}

/// `cfp worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// A YAML file whose keys are these flags' names (for example `lease-expiration: 30s`);
    /// flags and environment variables take precedence over it.
    #[arg(long, env = "CFP_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub connection: ConnectionArgs,
    #[command(flatten)]
    pub leases: LeaseArgs,
    /// Do not create the lease and dead-letter containers when they are missing (an existing
    /// container is always used as it is). Accounts that refuse metadata writes (Microsoft
    /// Entra ID identities, keys with `disableKeyBasedMetadataWriteAccess`) need them created
    /// beforehand.
    #[arg(long, env = "CFP_NO_CREATE_LEASES")]
    pub no_create_leases: bool,
    /// This instance's name, unique within the processor (default: the host name).
    #[arg(long, env = "CFP_INSTANCE")]
    pub instance: Option<String>,
    /// The UID of the Kubernetes pod the worker runs in (the operator sets it from the downward
    /// API): a worker restarted in its pod takes over its predecessor's name and leases at once
    /// instead of waiting a lease expiration.
    #[arg(long, env = "CFP_POD_UID")]
    pub pod_uid: Option<String>,
    #[command(flatten)]
    pub handler: HandlerArgs,
    #[command(flatten)]
    pub dead_letters: DeadLetterContainerArgs,
    #[command(flatten)]
    pub processor: ProcessorArgs,
    /// Port for /metrics, /healthz and /readyz (off when not given).
    #[arg(long, env = "CFP_METRICS_PORT")]
    pub metrics_port: Option<u16>,
}

/// `cfp write`.
#[derive(Debug, Args)]
pub struct WriteArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// How many documents to write.
    #[arg(long, default_value_t = 100)]
    pub count: u64,
    /// Id of the first document (`doc-<n>`); later ones count up.
    #[arg(long, default_value_t = 0)]
    pub first: u64,
    /// Documents written concurrently.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// A table for people.
    Table,
    /// JSON for machines.
    Json,
}

/// `cfp estimate`.
#[derive(Debug, Args)]
pub struct EstimateArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    #[command(flatten)]
    pub leases: LeaseArgs,
    /// The processor's start position (`beginning`, `now` or an RFC 3339 time): leases without a
    /// checkpoint count the changes from there.
    #[arg(long, env = "CFP_START_FROM", default_value = "beginning")]
    pub start_from: crate::cosmos::StartFrom,
    /// Estimate another processor's leases instead (read only): dotnet, java-pk or java-epk —
    /// to compare the lag before switching with `cfp worker --adopt`.
    #[arg(long, requires = "adopt_prefix")]
    pub adopt: Option<crate::processor::ForeignLayout>,
    /// The other processor's lease prefix (its processor name for .NET, its lease prefix for
    /// Java): only leases whose ids start with it, this account's host name, the database and the
    /// container (resource ids; names for java-pk) are taken. A whole id prefix, up to
    /// `_<database>_<container>`, is taken as it is (a processor that used another host name).
    #[arg(long, requires = "adopt")]
    pub adopt_prefix: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: OutputFormat,
}

/// `cfp operator`.
#[derive(Debug, Args)]
pub struct OperatorArgs {
    /// Watch only this namespace (repeatable, or comma-separated).
    #[arg(
        long,
        env = "CFP_NAMESPACE",
        conflicts_with = "all_namespaces",
        value_delimiter = ','
    )]
    pub namespace: Vec<String>,
    /// Watch every namespace (the default when --namespace is not given).
    #[arg(long)]
    pub all_namespaces: bool,
    /// The worker image for resources that do not set `spec.worker.image`.
    #[arg(long, env = "CFP_WORKER_IMAGE", default_value = concat!("ghcr.io/changefeed-operator/cfp:", env!("CARGO_PKG_VERSION")))]
    pub worker_image: String,
    /// Port of /metrics and /healthz (off when not given).
    #[arg(long, env = "CFP_METRICS_PORT")]
    pub metrics_port: Option<u16>,
    /// Run without leader election (only with a single replica).
    #[arg(long)]
    pub no_leader_election: bool,
    /// This cluster's identity in lease-set claims (default: the UID of the `kube-system`
    /// namespace, read at start; set it where the operator may not read that namespace).
    #[arg(long, env = "CFP_CLUSTER_IDENTITY")]
    pub cluster_identity: Option<String>,
    /// Namespace of the leader-election Lease (default: --namespace, else `POD_NAMESPACE`, else `default`).
    #[arg(long, env = "CFP_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "changefeed-operator")]
    pub leader_election_name: String,
    /// This replica's identity in the election (default: the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// A leader that has not renewed for this long is replaced.
    #[arg(long, default_value = "15s", value_parser = duration)]
    pub leader_lease_duration: Duration,
    /// A leader that could not renew for this long stops reconciling (shorter than the lease duration).
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub leader_renew_deadline: Duration,
    /// How often the leader renews its lease and candidates retry.
    #[arg(long, default_value = "2s", value_parser = duration)]
    pub leader_renew_interval: Duration,
    /// How the operator reads the Secrets resources name.
    #[command(flatten)]
    pub secrets: SecretsArgs,
    /// The Secret holding the operator's random key of the workers' Secret digest (the pod
    /// template's `changefeed.io/secrets-digest`, keyed so that it cannot be checked against
    /// guessed values), in the operator's namespace (`POD_NAMESPACE`, else the leader-election
    /// namespace); created at the first start, read at every start after (RBAC: get and create).
    #[arg(long, env = "CFP_DIGEST_KEY_SECRET", default_value = crate::operator::digest_key::DEFAULT_SECRET)]
    pub digest_key_secret: String,
    /// A YAML file listing the accounts the operator may reach with its own identity (workload
    /// or managed identity), and the plain-http endpoints (development emulators) it may reach at
    /// all, each with the namespaces whose resources may use it: `- endpoint:
    /// https://acct.documents.azure.com:443/` / `namespaces: [team-a]` (`"*"`: every
    /// namespace). Read again whenever it changes. Without it, only the resources' own keys over
    /// https are used.
    #[arg(long, env = "CFP_ALLOWED_ACCOUNTS")]
    pub allowed_accounts: Option<std::path::PathBuf>,
}

/// How the operator reads the Secrets resources name.
#[derive(Debug, Args, Clone)]
pub struct SecretsArgs {
    /// Watch Secrets' metadata (never their data), so that a created or rotated Secret is acted
    /// on at once (RBAC: get, list and watch on Secrets). With `false` the operator never lists
    /// or watches Secrets: it reads only those resources name, with get, at every
    /// reconciliation (RBAC: get alone), and notices a rotated key at the next one.
    #[arg(long, env = "CFP_WATCH_SECRETS", default_value_t = true, action = clap::ArgAction::Set)]
    pub watch_secrets: bool,
    /// With `--watch-secrets=false`: each resource is reconciled at least this often, so that a
    /// rotated key reaches the workers within it.
    #[arg(long, env = "CFP_SECRETS_RECHECK_INTERVAL", default_value = "60s", value_parser = duration)]
    pub secrets_recheck_interval: Duration,
}

/// `cfp deadletter`.
#[derive(Debug, Subcommand)]
pub enum DeadLetterCommand {
    /// List a processor's dead-lettered documents.
    List(DeadLetterArgs),
    /// Send a processor's dead-lettered documents to the handler again; each one it accepts is removed.
    Replay(DeadLetterReplayArgs),
}

/// Where a processor's dead letters are.
#[derive(Debug, Args, Clone)]
pub struct DeadLetterArgs {
    /// Account endpoint of the dead-letter container.
    #[arg(long, env = "CFP_ENDPOINT", default_value = "http://127.0.0.1:8081/")]
    pub endpoint: String,
    /// Account key (defaults to the emulator's well-known key).
    #[arg(long, env = "CFP_KEY", hide_env_values = true, default_value = crate::cosmos::EMULATOR_KEY, hide_default_value = true)]
    pub key: String,
    /// How to authenticate: the account key (--key), or a Microsoft Entra ID token from the
    /// pod's workload identity (`AZURE_CLIENT_ID`, `AZURE_TENANT_ID`, `AZURE_FEDERATED_TOKEN_FILE`)
    /// or the host's managed identity (user-assigned when `AZURE_CLIENT_ID` is set).
    #[arg(long, env = "CFP_AUTH", value_enum, default_value_t)]
    pub auth: crate::cosmos::AuthMethod,
    /// Database of the dead-letter container.
    #[arg(long, env = "CFP_DEAD_LETTER_DATABASE")]
    pub dead_letter_database: String,
    /// The dead-letter container.
    #[arg(long, env = "CFP_DEAD_LETTER_CONTAINER")]
    pub dead_letter_container: String,
    /// The processor whose dead letters these are.
    #[arg(long, env = "CFP_PROCESSOR", default_value = "changefeed")]
    pub processor: String,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: OutputFormat,
}

/// `cfp deadletter replay`.
#[derive(Debug, Args, Clone)]
pub struct DeadLetterReplayArgs {
    #[command(flatten)]
    pub letters: DeadLetterArgs,
    #[command(flatten)]
    pub handler: HandlerArgs,
}

/// `cfp checkpoints`.
#[derive(Debug, Subcommand)]
pub enum CheckpointsCommand {
    /// Print the processor's leases as JSON: range, continuation, LSN, owner, time.
    Export(CheckpointsTarget),
    /// Restore the leases of an export (ranges split since are leased whole again).
    Import(CheckpointsImportArgs),
    /// Move every lease (or the --lease / --range ones) to a position.
    Rewind(CheckpointsRewindArgs),
    /// Write the checkpoints as another processor's leases, for it to start where this one
    /// stopped (stop this processor's workers first).
    Leave(CheckpointsLeaveArgs),
}

/// `cfp checkpoints leave`.
#[derive(Debug, Args)]
pub struct CheckpointsLeaveArgs {
    #[command(flatten)]
    pub target: CheckpointsTarget,
    /// The other processor's lease layout.
    #[arg(long = "to", value_enum)]
    pub layout: crate::processor::admin::leave::LeaveLayout,
    /// The other processor's lease prefix (Java: `ChangeFeedProcessorOptions.setLeasePrefix`).
    #[arg(long = "to-prefix", default_value = "")]
    pub to_prefix: String,
    /// This processor's lease expiration: a heartbeat or lease write younger than this is a
    /// running instance, and the command refuses.
    #[arg(long, env = "CFP_LEASE_EXPIRATION", default_value = text(defaults::EXPIRATION), value_parser = duration)]
    pub lease_expiration: Duration,
    /// Print what would be written; write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// The processor whose checkpoints are read.
#[derive(Debug, Args, Clone)]
pub struct CheckpointsTarget {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    #[command(flatten)]
    pub leases: LeaseArgs,
}

/// The processor whose checkpoints are moved, and how carefully.
#[derive(Debug, Args, Clone)]
pub struct CheckpointsArgs {
    #[command(flatten)]
    pub target: CheckpointsTarget,
    /// The processor's lease expiration: a heartbeat or lease write younger than this is a
    /// running instance.
    #[arg(long, env = "CFP_LEASE_EXPIRATION", default_value = text(defaults::EXPIRATION), value_parser = duration)]
    pub lease_expiration: Duration,
    /// The processor's renew interval: when no timestamp shows a running instance, the command
    /// first watches the lease container for a renew interval and a quarter for a heartbeat or
    /// lease that changes (a running instance whose clock is behind writes times that look old).
    #[arg(long, env = "CFP_LEASE_RENEW_INTERVAL", default_value = text(defaults::RENEW_INTERVAL), value_parser = duration)]
    pub lease_renew_interval: Duration,
    /// Move the checkpoints although instances of the processor run: their leases are taken
    /// from them (they stop those leases at their next write and take them again, moved).
    /// Switches off the running-instance check only.
    #[arg(long)]
    pub force: bool,
    /// Print what would change; write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// `cfp checkpoints import`.
#[derive(Debug, Args)]
pub struct CheckpointsImportArgs {
    #[command(flatten)]
    pub common: CheckpointsArgs,
    /// Import an export of another container, or of this one before it was deleted and created
    /// again (another resource id): its positions are not this container's, and one beyond the
    /// container's delivers nothing until the container catches up. Switches off the container
    /// check only (`--force` does not).
    #[arg(long)]
    pub other_container: bool,
    /// The export (`cfp checkpoints export > FILE`); `-` reads standard input.
    pub file: std::path::PathBuf,
}

/// `cfp checkpoints rewind`.
#[derive(Debug, Args)]
pub struct CheckpointsRewindArgs {
    #[command(flatten)]
    pub common: CheckpointsArgs,
    /// Where to: beginning, now, or an RFC 3339 time.
    #[arg(long)]
    pub to: crate::cosmos::StartFrom,
    /// Only this lease (its id or its token `min-max`); repeatable.
    #[arg(long = "lease", allow_hyphen_values = true)]
    pub lease: Vec<String>,
    /// Only the leases sharing keys with this range (`min-max`, hex EPKs; short ones read as
    /// padded with zeros: `20-30` is `20…0-30…0`); repeatable.
    #[arg(long = "range", value_parser = epk_range, allow_hyphen_values = true)]
    pub range: Vec<crate::cosmos::EpkRange>,
}

/// A `--range` value: `min-max`, hex EPKs.
fn epk_range(s: &str) -> Result<crate::cosmos::EpkRange, String> {
    let (min, max) = s
        .split_once('-')
        .ok_or_else(|| format!("expected min-max (hex EPKs, as in a lease token such as 3F-7F), got {s:?}"))?;
    let hex = |b: &str| b.bytes().all(|c| c.is_ascii_hexdigit());
    if !hex(min) || !hex(max) || max.is_empty() {
        return Err(format!("expected min-max (hex EPKs such as -3F or 3F-7F), got {s:?}"));
    }
    Ok(crate::cosmos::EpkRange::new(min, max))
}
