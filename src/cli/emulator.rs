//! `cfp emulator`: the SDK's in-memory emulator on loopback until SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::args::EmulatorArgs;
use crate::emulator::{AccountOptions, EmulatorError, bind_account};

/// A line to standard output; a server keeps serving when nobody reads it (a closed pipe).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Serves the emulator until a termination signal.
pub async fn run(args: &EmulatorArgs) -> Result<(), EmulatorError> {
    let mut options = AccountOptions::new(SocketAddr::new(args.host, args.port));
    options.advertise = args.advertise_url.clone();
    options.regions = args.regions.clone();
    options.replication_delay = Duration::from_millis(args.replication_delay_ms);
    options.containers = args.containers.clone();
    options.throughput = args.throughput.clone();
    options.buckets = args.throughput_bucket.clone();
    let (mut emulator, listeners) = bind_account(&options).await?;
    if let Some(path) = &args.entra_token_file {
        let token = std::fs::read_to_string(path).map_err(|source| EmulatorError::TokenFile {
            path: path.clone(),
            source,
        })?;
        emulator = emulator.require_entra_token(&token);
    }
    say!("Cosmos DB emulator listening");
    say!("  endpoint: {}", emulator.endpoint());
    if let Some(key) = &args.key {
        emulator = emulator.require_key(key);
    }
    if args.deny_metadata_writes {
        emulator = emulator.deny_metadata_writes();
    }
    if args.entra_token_file.is_some() {
        say!("  auth:     Entra ID token only (key auth disabled; no database or container writes)");
    } else if args.key.is_some() {
        say!("  key:      the one given with --key (signatures checked)");
    } else {
        say!("  key:      {}", crate::cosmos::EMULATOR_KEY);
    }
    if args.deny_metadata_writes {
        say!("  metadata: database and container writes refused (disableKeyBasedMetadataWriteAccess)");
    }
    if !args.regions.is_empty() {
        for (index, (name, endpoint)) in emulator.region_endpoints().into_iter().enumerate() {
            let role = if index == 0 { "write region" } else { "read region" };
            say!("  region {name} ({role}): {endpoint}");
        }
        say!("  replication delay: {} ms", args.replication_delay_ms);
    }
    for spec in &args.containers {
        let throughput = args
            .throughput
            .iter()
            .find(|t| t.database == spec.database && t.container == spec.container)
            .map(|t| format!(", {} RU/s", t.ru_per_second))
            .unwrap_or_default();
        say!(
            "  container {}/{} (partition key {}, {} partitions{throughput})",
            spec.database,
            spec.container,
            spec.partition_key,
            spec.partitions
        );
    }
    let shutdown = CancellationToken::new();
    let server = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { emulator.serve_regions(listeners, shutdown).await }
    });
    crate::signals::terminated().await;
    shutdown.cancel();
    let _ = server.await;
    say!("emulator stopped");
    Ok(())
}
