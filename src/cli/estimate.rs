//! `cfp estimate`: the remaining work per lease of a processor, as a table or JSON.

use std::fmt::Write as _;

use super::args::{EstimateArgs, OutputFormat};
use crate::cosmos::CosmosAccount;
use crate::processor::leases::bootstrap::foreign_leases;
use crate::processor::report::estimator::with_partition_figures;
use crate::processor::report::keda_reading::KedaReading;
use crate::processor::{
    AdoptOptions, LeaseStore, ProcessorEstimate, ProcessorOptions, estimate_leases,
    report::estimator::DEFAULT_CONCURRENCY,
};
use crate::worker::{WorkerError, open};

/// Why `cfp estimate` failed.
#[derive(Debug, thiserror::Error)]
pub enum EstimateError {
    /// The containers could not be opened.
    #[error(transparent)]
    Open(#[from] WorkerError),
    /// The processor has no leases in the lease container.
    #[error("processor {processor:?} has no leases in {container} (not started yet, or another --processor name?)")]
    NoLeases {
        /// The processor name.
        processor: String,
        /// The lease container.
        container: String,
    },
    /// Reading leases or the change feed failed.
    #[error("{0}")]
    Failed(String),
}

/// Estimates a processor's leases.
pub async fn estimate(args: &EstimateArgs) -> Result<ProcessorEstimate, EstimateError> {
    let account = CosmosAccount::connect_preferring(
        &args.connection.endpoint,
        &args.connection.account_auth(),
        &args.connection.preferred_regions,
    )
    .await
    .map_err(|e| EstimateError::Failed(format!("cannot connect to {}: {e}", args.connection.endpoint)))?;
    let options = ProcessorOptions::new(args.leases.processor.clone(), "cfp-estimate");
    let settings = args.connection.settings(&args.leases, false, options);
    let lease_account = args
        .leases
        .account(&args.connection, &account)
        .await
        .map_err(|e| EstimateError::Failed(format!("cannot connect to the lease account: {e}")))?;
    let (monitored, store) = open(&account, &lease_account, &settings)
        .await
        .map_err(WorkerError::when_reading)?;
    if let Some((layout, prefix)) = args.adopt.zip(args.adopt_prefix.clone()) {
        let adopt = AdoptOptions {
            layout,
            prefix: prefix.clone(),
            force: true,
        };
        let (leases, _) = foreign_leases(&store, &monitored, &adopt, &prefix)
            .await
            .map_err(|e| EstimateError::Failed(e.to_string()))?;
        let estimated = estimate_leases(&monitored, &leases, args.start_from, DEFAULT_CONCURRENCY)
            .await
            .map_err(|e| EstimateError::Failed(format!("reading the change feed: {e}")))?;
        return Ok(ProcessorEstimate::new(
            format!("{} {prefix}", layout.as_str()),
            estimated,
        ));
    }
    let snapshot = store
        .snapshot()
        .await
        .map_err(|e| EstimateError::Failed(e.to_string()))?;
    if snapshot.leases.is_empty() && !snapshot.pk_range_leases.is_empty() {
        return Err(EstimateError::Failed(format!(
            "processor {:?} has only partition-key-range leases (.NET v2 / v3 version 0): estimate them with --adopt dotnet --adopt-prefix '{}..'",
            args.leases.processor,
            store.prefix()
        )));
    }
    if snapshot.leases.is_empty() {
        return Err(EstimateError::NoLeases {
            processor: args.leases.processor.clone(),
            container: format!("{}/{}", settings.lease_database, settings.lease_container),
        });
    }
    let leases = estimate_leases(&monitored, &snapshot.leases, args.start_from, DEFAULT_CONCURRENCY)
        .await
        .map_err(|e| EstimateError::Failed(format!("reading the change feed: {e}")))?;
    let estimate = ProcessorEstimate::new(args.leases.processor.clone(), leases);
    Ok(with_partition_figures(estimate, &snapshot, &monitored).await)
}

/// Prints the estimate; fails (after printing) when some leases could not be estimated.
pub async fn run(args: &EstimateArgs) -> Result<(), EstimateError> {
    let estimate = estimate(args).await?;
    match args.output {
        OutputFormat::Json => super::print_out(format_args!(
            "{}\n",
            serde_json::to_string_pretty(&estimate).unwrap_or_default()
        )),
        OutputFormat::Table => super::print_out(table(&estimate)),
    }
    if estimate.leases_failed > 0 {
        return Err(EstimateError::Failed(format!(
            "{} of {} leases could not be estimated (see their errors above)",
            estimate.leases_failed, estimate.lease_count
        )));
    }
    Ok(())
}

/// The estimate as a table for people.
pub fn table(estimate: &ProcessorEstimate) -> String {
    let unread_by_keda = |token: &str| {
        estimate
            .keda
            .as_ref()
            .is_some_and(|k| k.unreadable.iter().any(|t| t == token))
    };
    let rows: Vec<[String; 5]> = estimate
        .leases
        .iter()
        .map(|l| {
            [
                if unread_by_keda(&l.lease_token) {
                    format!("{} *", l.lease_token)
                } else {
                    l.lease_token.clone()
                },
                l.owner.clone().unwrap_or_else(|| "-".into()),
                match (&l.error, l.started) {
                    (Some(error), _) => format!("error: {error}"),
                    (None, true) => l.lag.to_string(),
                    (None, false) => format!("{} (not started)", l.lag),
                },
                l.checkpoint_age.map_or_else(|| "-".into(), |s| format!("{s}s")),
                l.oldest_pending_seconds.map_or_else(|| "-".into(), |s| format!("{s}s")),
            ]
        })
        .collect();
    let headers = ["LEASE", "OWNER", "LAG", "CHECKPOINT AGE", "OLDEST PENDING"];
    let mut widths = headers.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(headers.map(str::to_owned)).chain(rows) {
        let line: Vec<String> = row.iter().zip(widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    let _ = writeln!(
        out,
        "processor {}: {} leases, {} with lag, total lag {}{}{}",
        estimate.processor,
        estimate.lease_count,
        estimate.leases_with_lag,
        estimate.total_lag,
        estimate
            .oldest_pending_seconds
            .map_or_else(String::new, |s| format!(", oldest pending change {s}s old")),
        if estimate.leases_failed > 0 {
            format!(" ({} leases could not be estimated)", estimate.leases_failed)
        } else {
            String::new()
        }
    );
    if let Some(keda) = &estimate.keda {
        out.push_str(&keda_notes(keda));
    }
    out
}

/// What KEDA's scaler would miss of these leases, a line each (nothing when it reads them all).
fn keda_notes(keda: &KedaReading) -> String {
    let mut out = String::new();
    if !keda.unreadable.is_empty() {
        let _ = writeln!(
            out,
            "* KEDA's azure-cosmosdb scaler cannot read {} lease(s): their LeaseToken names no partition key range, so it counts none of their lag and reports the processor active whatever the backlog (docs/migration.md, KEDA)",
            keda.unreadable.len()
        );
    }
    if keda.beyond_first_page() {
        let _ = writeln!(
            out,
            "KEDA's azure-cosmosdb scaler reads {} of the {} documents under this processor's lease prefix (one query page): the lag of leases beyond them is not counted",
            keda.page, keda.documents
        );
    }
    out
}
