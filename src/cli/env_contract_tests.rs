//! The contract between the operator and the worker: any valid processor options survive
//! options → `CFP_*` environment (what the operator renders) → the worker's command line →
//! options; every `CFP_*` variable the operator renders into a worker pod is one the worker's
//! command line reads, and every worker variable a ChangeFeedProcessor can set is rendered (the
//! others are listed here with why).

use std::collections::BTreeSet;

use clap::{CommandFactory, Parser};

use super::args::Cli;
use crate::operator::ChangeFeedProcessor;
use crate::operator::workload::worker_env;

/// Worker variables no ChangeFeedProcessor field sets, and why.
const NOT_FROM_THE_RESOURCE: &[(&str, &str)] = &[
    (
        "CFP_CONFIG",
        "the operator renders every setting as a variable, never a file",
    ),
    (
        "CFP_BALANCING",
        "steal-one exists for comparisons with the reference SDKs only",
    ),
];

/// The `env` of every `cfp worker` flag.
fn worker_variables() -> BTreeSet<String> {
    let command = Cli::command();
    let worker = command.find_subcommand("worker").expect("cfp worker exists");
    worker
        .get_arguments()
        .filter_map(|arg| arg.get_env())
        .map(|env| env.to_string_lossy().into_owned())
        .collect()
}

/// A resource that sets every optional field.
fn everything() -> ChangeFeedProcessor {
    let spec = serde_json::json!({
        "connection": {"endpoint": "https://acct.documents.azure.com:443/", "keySecretRef": {"name": "k"}},
        "preferredRegions": ["West Europe", "North Europe"],
        "monitored": {"database": "db", "container": "orders"},
        "leases": {
            "database": "leasedb",
            "container": "leases",
            "connection": {"endpoint": "https://other.documents.azure.com:443/", "keySecretRef": {"name": "l"}},
            "adoptFrom": {"layout": "Dotnet", "prefix": "orders", "force": true},
            "createIfNotExists": false,
        },
        "handler": {
            "type": "Http",
            "http": {
                "url": "http://handler:8080/changes",
                "readinessPath": "/ready",
                "headers": [{"name": "Authorization", "valueFrom": {"secretKeyRef": {"name": "h"}}}],
            },
            "onExhausted": "DeadLetter",
        },
        "deadLetter": {"database": "dl", "container": "letters"},
        "checkpoint": {"everyBatches": 3, "interval": "10s"},
        "readBudget": {"percentOfProvisioned": 25, "throughputBucket": 2},
        "startFrom": "Now",
    });
    ChangeFeedProcessor::new("orders", serde_json::from_value(spec).expect("a valid spec"))
}

#[test]
fn preferred_regions_reach_the_worker_as_one_comma_separated_variable() {
    let env = worker_env(&everything());
    let regions = env
        .iter()
        .find(|v| v.name == "CFP_PREFERRED_REGIONS")
        .and_then(|v| v.value.clone());
    assert_eq!(regions.as_deref(), Some("West Europe,North Europe"));
}

#[test]
fn every_variable_the_operator_renders_is_read_by_the_worker() {
    let read = worker_variables();
    let rendered: BTreeSet<String> = worker_env(&everything())
        .into_iter()
        .map(|var| var.name)
        .filter(|name| name.starts_with("CFP_"))
        .collect();
    let unread: Vec<&String> = rendered
        .iter()
        .filter(|name| !read.contains(*name) && !name.starts_with(super::handler::HEADER_ENV_PREFIX))
        .collect();
    assert!(unread.is_empty(), "rendered but no worker flag reads them: {unread:?}");
    let not_rendered: Vec<&String> = read
        .iter()
        .filter(|name| !rendered.contains(*name))
        .filter(|name| !NOT_FROM_THE_RESOURCE.iter().any(|(listed, _)| listed == name))
        .collect();
    let listed_but_rendered: Vec<&&str> = NOT_FROM_THE_RESOURCE
        .iter()
        .map(|(name, _)| name)
        .filter(|name| rendered.contains(**name) || !read.contains(**name))
        .collect();
    assert!(
        listed_but_rendered.is_empty(),
        "listed wrongly: {listed_but_rendered:?}"
    );
    assert!(
        not_rendered.is_empty(),
        "worker variables a ChangeFeedProcessor cannot set (render them, or list them with why): {not_rendered:?}"
    );
}

/// The `cfp worker` arguments that read the variables `vars`: each variable becomes the flag whose
/// `env` it is (clap reads a flag and its variable through the same parser).
fn worker_argv(vars: &[(&str, String)]) -> Vec<String> {
    let command = Cli::command();
    let worker = command.find_subcommand("worker").expect("cfp worker exists");
    let mut argv = vec![
        "cfp".to_owned(),
        "worker".to_owned(),
        "--instance".to_owned(),
        "i-0".to_owned(),
    ];
    argv.extend(["--endpoint", "https://acct.documents.azure.com:443/", "--key", "k"].map(str::to_owned));
    argv.extend(["--database", "db", "--container", "c"].map(str::to_owned));
    for (name, value) in vars {
        let arg = worker
            .get_arguments()
            .find(|arg| arg.get_env().is_some_and(|env| env == *name))
            .unwrap_or_else(|| panic!("no worker flag reads {name}"));
        let long = arg
            .get_long()
            .unwrap_or_else(|| panic!("{name}'s flag has no long name"));
        if arg.get_action().takes_values() {
            argv.push(format!("--{long}={value}"));
        } else if value == "true" {
            argv.push(format!("--{long}"));
        }
    }
    argv
}

fn duration_ms(range: std::ops::Range<u64>) -> impl proptest::strategy::Strategy<Value = std::time::Duration> {
    use proptest::prelude::*;
    prop_oneof![
        (range.start / 1000 + 1..range.end / 1000 + 2).prop_map(std::time::Duration::from_secs),
        range.prop_map(std::time::Duration::from_millis),
    ]
}

fn arbitrary_options() -> impl proptest::strategy::Strategy<Value = crate::processor::ProcessorOptions> {
    use crate::cosmos::{FeedMode, StartFrom};
    use crate::processor::policy::balancer::Balancing;
    use crate::processor::{AdoptOptions, ForeignLayout, OnExhausted, ProcessorOptions, ReadBudget};
    use proptest::prelude::*;
    let start = prop_oneof![
        Just(StartFrom::Beginning),
        Just(StartFrom::Now),
        (0i64..4_000_000_000, 0u32..1_000_000_000).prop_map(|(s, n)| StartFrom::Time(
            time::OffsetDateTime::from_unix_timestamp(s).expect("in range") + time::Duration::nanoseconds(i64::from(n))
        )),
    ];
    let adopt = proptest::option::of((
        prop_oneof![
            Just(ForeignLayout::Dotnet),
            Just(ForeignLayout::JavaPk),
            Just(ForeignLayout::JavaEpk)
        ],
        "[a-z][a-z0-9._-]{0,12}",
        any::<bool>(),
    ));
    let counts = (
        1u32..100_000,
        1u32..=crate::processor::options::MAX_IN_FLIGHT_BATCHES,
        1u32..=crate::processor::options::MAX_LEASES_PER_PARTITION,
        1u32..1000,
        1u32..50,
    );
    let times = (
        duration_ms(1..60_000),
        duration_ms(1..30_000),
        duration_ms(1..120_000),
        duration_ms(0..600_000),
        duration_ms(0..10_000),
    );
    let retry = (
        duration_ms(0..60_000),
        duration_ms(0..120_000),
        prop_oneof![Just(OnExhausted::Halt), Just(OnExhausted::DeadLetter)],
    );
    let kinds = (
        prop_oneof![Just(FeedMode::LatestVersion), Just(FeedMode::AllVersionsAndDeletes)],
        prop_oneof![Just(Balancing::Fair), Just(Balancing::StealOne), Just(Balancing::Work)],
        proptest::option::of(duration_ms(1..600_000)),
    );
    let reads = (
        proptest::option::of(prop_oneof![
            (1u32..100_000).prop_map(ReadBudget::RequestUnits),
            (1u8..=100).prop_map(ReadBudget::PercentOfProvisioned),
        ]),
        proptest::option::of(1u8..=5),
    );
    (
        "[a-z][a-z0-9-]{0,12}",
        start,
        adopt,
        counts,
        times,
        retry,
        (kinds, reads),
    )
        .prop_map(|(name, start_from, adopt, counts, times, retry, (kinds, reads))| {
            let mut o = ProcessorOptions::new(name, "i-0");
            o.start_from = start_from;
            o.adopt = adopt.map(|(layout, prefix, force)| AdoptOptions { layout, prefix, force });
            (
                o.max_items,
                o.max_in_flight_batches,
                o.leases_per_partition,
                o.retry.max_attempts,
                o.checkpoint.every_batches,
            ) = counts;
            (
                o.acquire_interval,
                o.renew_interval,
                o.expiration,
                o.stall_timeout,
                o.poll_interval,
            ) = times;
            o.expiration += o.renew_interval;
            (o.retry.initial_backoff, o.retry.max_backoff, o.retry.on_exhausted) = retry;
            o.retry.max_backoff += o.retry.initial_backoff;
            (o.mode, o.balancing, o.checkpoint.interval) = kinds;
            (o.read_budget, o.read_throughput_bucket) = reads;
            o
        })
}

proptest::proptest! {
    /// Any valid options survive options → environment (the operator's rendering) → `cfp worker`'s
    /// flags and variables → options (the worker's parsing): the two sides are one contract.
    #[test]
    fn any_valid_options_survive_the_worker_environment(options in arbitrary_options()) {
        proptest::prop_assume!(options.validate().is_ok());
        let vars = crate::worker::options_args::options_env(&options);
        let argv = worker_argv(&vars);
        let cli = Cli::try_parse_from(&argv).map_err(|e| proptest::test_runner::TestCaseError::fail(format!("{argv:?}: {e}")))?;
        let super::args::Command::Worker(args) = cli.command else { panic!("parsed as cfp worker") };
        let parsed = super::worker::settings(&args).options;
        proptest::prop_assert_eq!(format!("{parsed:?}"), format!("{options:?}"), "through {:?}", vars);
    }
}
