//! `cfp operator`: runs the operator until SIGINT/SIGTERM.

use tokio_util::sync::CancellationToken;

use super::args::OperatorArgs;
use crate::operator::leader::Election;
use crate::operator::run::{OperatorError, OperatorSettings, run as run_operator};

/// The operator settings from its arguments.
pub fn settings(args: &OperatorArgs) -> OperatorSettings {
    let identity = args
        .identity
        .clone()
        .unwrap_or_else(|| gethostname::gethostname().to_string_lossy().into_owned());
    let election_namespace = args
        .leader_election_namespace
        .clone()
        .or_else(|| (args.namespace.len() == 1).then(|| args.namespace[0].clone()))
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .unwrap_or_else(|| "default".into());
    OperatorSettings {
        namespaces: if args.all_namespaces {
            Vec::new()
        } else {
            args.namespace.clone()
        },
        worker_image: args.worker_image.clone(),
        election: (!args.no_leader_election).then(|| {
            (
                election_namespace,
                Election {
                    name: args.leader_election_name.clone(),
                    identity,
                    lease_duration: args.leader_lease_duration,
                    renew_deadline: args.leader_renew_deadline,
                    renew_interval: args.leader_renew_interval,
                },
            )
        }),
        metrics_port: args.metrics_port,
    }
}

/// Runs the operator until a termination signal.
pub async fn run(args: &OperatorArgs) -> Result<(), OperatorError> {
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        crate::signals::terminated().await;
        tracing::info!("stopping the operator");
        signal.cancel();
    });
    run_operator(settings(args), shutdown).await
}
