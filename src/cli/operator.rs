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
    let own_namespace = std::env::var("POD_NAMESPACE").unwrap_or_else(|_| election_namespace.clone());
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
        cluster_identity: args.cluster_identity.clone().filter(|c| !c.is_empty()),
        secrets_recheck: (!args.secrets.watch_secrets).then_some(args.secrets.secrets_recheck_interval),
        digest_key_secret: (own_namespace, args.digest_key_secret.clone()),
        allowed_accounts: args.allowed_accounts.clone(),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::settings;
    use crate::cli::args::{Cli, Command};

    fn operator_settings(args: &[&str]) -> crate::operator::run::OperatorSettings {
        let cli = Cli::try_parse_from([&["cfp", "operator"][..], args].concat()).expect("parse");
        match cli.command {
            Command::Operator(args) => settings(&args),
            _ => panic!("not the operator"),
        }
    }

    #[test]
    fn secrets_are_watched_unless_told_and_then_rechecked_at_the_interval() {
        // (arguments, the recheck interval: None while Secrets are watched)
        let cases: [(&[&str], Option<Duration>); 4] = [
            (&[], None),
            (&["--watch-secrets=true"], None),
            (&["--watch-secrets=false"], Some(Duration::from_secs(60))),
            (
                &["--watch-secrets", "false", "--secrets-recheck-interval", "2s"],
                Some(Duration::from_secs(2)),
            ),
        ];
        for (args, recheck) in cases {
            assert_eq!(operator_settings(args).secrets_recheck, recheck, "{args:?}");
        }
    }
}
