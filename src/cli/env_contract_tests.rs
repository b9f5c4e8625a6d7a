//! The contract between the operator and the worker: every `CFP_*` variable the operator renders
//! into a worker pod is one the worker's command line reads, and every worker variable a
//! ChangeFeedProcessor can set is rendered (the others are listed here with why).

use std::collections::BTreeSet;

use clap::CommandFactory;

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
        "startFrom": "Now",
    });
    ChangeFeedProcessor::new("orders", serde_json::from_value(spec).expect("a valid spec"))
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
