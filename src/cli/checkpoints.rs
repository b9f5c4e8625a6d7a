//! `cfp checkpoints export|import|rewind`: a processor's checkpoints as JSON, restored from such
//! an export, or moved to a position — refused while the processor runs (unless `--force`) and,
//! for an import, when the export is of another container (unless `--other-container`),
//! written all or nothing as workers see it, and only planned with `--dry-run`.

use std::io::Read as _;
use std::time::Duration;

use super::args::{CheckpointsArgs, CheckpointsCommand, CheckpointsLeaveArgs, CheckpointsTarget};
use crate::cosmos::{CosmosAccount, MonitoredContainer};
use crate::processor::admin::checkpoint_apply::MoveError;
use crate::processor::admin::checkpoint_requests::{
    MoveOptions, Moved, Request, move_checkpoints, read_export, refuse_running,
};
use crate::processor::admin::checkpoints::{Export, PlanError, Selection};
use crate::processor::{CosmosLeaseStore, LeaseStore as _, ProcessorOptions};
use crate::worker::{WorkerError, open};

/// Why `cfp checkpoints` failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointsError {
    /// The account could not be reached.
    #[error("cannot connect to {endpoint}: {source}")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// The failure.
        source: crate::cosmos::CosmosError,
    },
    /// The containers could not be opened.
    #[error(transparent)]
    Open(#[from] WorkerError),
    /// The export file could not be read.
    #[error("cannot read {path}: {source}")]
    File {
        /// The file.
        path: String,
        /// The failure.
        source: std::io::Error,
    },
    /// The export file is not an export.
    #[error("{path} is not an export of `cfp checkpoints export`: {source}")]
    NotAnExport {
        /// The file.
        path: String,
        /// What is wrong.
        source: serde_json::Error,
    },
    /// The export is of another container (or of this one before it was created again).
    #[error("{0} (--other-container imports it anyway, if you mean to apply these positions to this container)")]
    OtherContainer(PlanError),
    /// Reading or moving the checkpoints failed.
    #[error(transparent)]
    Move(#[from] MoveError),
    /// Writing the checkpoints as another processor's leases failed.
    #[error(transparent)]
    Leave(#[from] crate::processor::admin::leave::LeaveError),
}

/// Runs `cfp checkpoints ...`.
pub async fn run(command: &CheckpointsCommand) -> Result<(), CheckpointsError> {
    match command {
        CheckpointsCommand::Export(args) => {
            let (monitored, store) = connect(args).await?;
            let export = read_export(&store, &monitored).await?;
            super::print_out(format_args!(
                "{}\n",
                serde_json::to_string_pretty(&export).unwrap_or_default()
            ));
            Ok(())
        }
        CheckpointsCommand::Import(args) => {
            let export = read_file(&args.file)?;
            let request = Request::Import(Box::new(export));
            let moved = carry_out(&args.common, request, args.other_container).await?;
            super::print_out(summary(&moved));
            Ok(())
        }
        CheckpointsCommand::Leave(args) => leave(args).await,
        CheckpointsCommand::Rewind(args) => {
            let selection = Selection {
                leases: args.lease.clone(),
                ranges: args.range.clone(),
            };
            let request = Request::Rewind { to: args.to, selection };
            let moved = carry_out(&args.common, request, false).await?;
            super::print_out(summary(&moved));
            Ok(())
        }
    }
}

/// `cfp checkpoints leave`: refused while an instance runs; the documents, then a summary.
async fn leave(args: &CheckpointsLeaveArgs) -> Result<(), CheckpointsError> {
    let (monitored, store) = connect(&args.target).await?;
    let snapshot = store.snapshot().await.map_err(|e| MoveError::Read(e.to_string()))?;
    let options = MoveOptions {
        holder: holder(),
        take_leases: false,
        other_container: false,
        mode: None,
        dry_run: true,
        expiration: args.lease_expiration,
        watch: Duration::ZERO,
        on_watch: None,
    };
    let snapshot = refuse_running(&store, snapshot, &options).await?;
    // The account host as the Java SDK names it in its prefix (`URI.getHost()`).
    let host = azure_core::http::Url::parse(&args.target.connection.endpoint)
        .ok()
        .and_then(|url| url.host_str().map(str::to_owned))
        .unwrap_or_default();
    let layout = (args.layout, args.to_prefix.as_str(), host.as_str());
    let left =
        crate::processor::admin::leave::leave(&store, &monitored, &snapshot.leases, layout, args.dry_run).await?;
    let verb = if args.dry_run { "would write" } else { "wrote" };
    super::print_out(format_args!(
        "{verb} {} lease(s) under {:?} ({} without a checkpoint: the other processor starts those as it is configured to){}\n",
        left.documents.len(),
        left.prefix,
        left.without_checkpoint,
        if args.dry_run { "; nothing was written" } else { "" }
    ));
    Ok(())
}

async fn connect(args: &CheckpointsTarget) -> Result<(MonitoredContainer, CosmosLeaseStore), CheckpointsError> {
    let connection = &args.connection;
    let connect_error = |endpoint: &str| {
        let endpoint = endpoint.to_owned();
        move |source| CheckpointsError::Connect { endpoint, source }
    };
    let account = CosmosAccount::connect_preferring(
        &connection.endpoint,
        &connection.account_auth(),
        &connection.preferred_regions,
    )
    .await
    .map_err(connect_error(&connection.endpoint))?;
    let lease_endpoint = args.leases.lease_endpoint.as_deref().unwrap_or(&connection.endpoint);
    let lease_account = args
        .leases
        .account(connection, &account)
        .await
        .map_err(connect_error(lease_endpoint))?;
    let options = ProcessorOptions::new(args.leases.processor.clone(), holder());
    // Never creates a container: no lease container means no checkpoints.
    let settings = connection.settings(&args.leases, false, options);
    Ok(open(&account, &lease_account, &settings)
        .await
        .map_err(WorkerError::when_reading)?)
}

/// Carries out `request`; `other_container`: `--other-container` of an import.
async fn carry_out(args: &CheckpointsArgs, request: Request, other_container: bool) -> Result<Moved, CheckpointsError> {
    let (monitored, store) = connect(&args.target).await?;
    let options = MoveOptions {
        holder: holder(),
        take_leases: args.force,
        other_container,
        // The lease set's mode, else the export's.
        mode: None,
        dry_run: args.dry_run,
        expiration: args.lease_expiration,
        watch: args.lease_renew_interval.mul_f64(1.25),
        on_watch: Some(show_watch),
    };
    match move_checkpoints(&store, &monitored, &request, &options).await {
        Err(MoveError::Plan(error @ PlanError::OtherContainer { .. })) => Err(CheckpointsError::OtherContainer(error)),
        moved => Ok(moved?),
    }
}

/// Says at once that the command watches the lease container, and how long: a countdown on a
/// terminal, one line otherwise.
fn show_watch(watch: Duration) {
    use std::io::IsTerminal as _;
    let seconds = watch.as_secs_f64().round();
    let message = format!("watching the lease container for {seconds} s for a running instance of the processor");
    let runtime = tokio::runtime::Handle::try_current();
    let Some(runtime) = runtime.ok().filter(|_| std::io::stderr().is_terminal()) else {
        eprintln!("{message}…");
        return;
    };
    let bar = indicatif::ProgressBar::new(watch.as_millis().try_into().unwrap_or(u64::MAX));
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} [{bar:20}] {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    bar.set_message(message);
    bar.enable_steady_tick(Duration::from_millis(100));
    runtime.spawn(async move {
        let started = tokio::time::Instant::now();
        while started.elapsed() < watch {
            bar.set_position(started.elapsed().as_millis().try_into().unwrap_or(u64::MAX));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bar.finish_and_clear();
    });
}

/// The name this command holds leases under while it moves them.
fn holder() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    format!("cfp-checkpoints-{host}-{}", std::process::id())
}

fn read_file(path: &std::path::Path) -> Result<Export, CheckpointsError> {
    let name = path.display().to_string();
    let mut text = String::new();
    let read = if name == "-" {
        std::io::stdin().read_to_string(&mut text).map(drop)
    } else {
        std::fs::read_to_string(path).map(|t| text = t)
    };
    read.map_err(|source| CheckpointsError::File {
        path: name.clone(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| CheckpointsError::NotAnExport { path: name, source })
}

/// What changed (or would), one line each, and a total.
pub fn summary(moved: &Moved) -> String {
    let mut out: String = moved.plan.lines().iter().map(|l| format!("{l}\n")).collect();
    out.push_str(&match &moved.applied {
        None => format!(
            "dry run: {} lease(s) would move, {} be created, {} be deleted; nothing was written\n",
            moved.plan.moves.len(),
            moved.plan.creates.len(),
            moved.plan.deletes.len()
        ),
        Some(applied) => format!("{}\n", applied.describe()),
    });
    out
}
