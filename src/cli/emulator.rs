//! `cfp emulator`: the SDK's in-memory emulator on loopback until SIGINT/SIGTERM.

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;

use super::args::EmulatorArgs;
use crate::emulator::{EmulatorError, bind_advertised};

/// A line to standard output; a server keeps serving when nobody reads it (a closed pipe).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Serves the emulator until a termination signal.
pub async fn run(args: &EmulatorArgs) -> Result<(), EmulatorError> {
    let (mut emulator, listener) = bind_advertised(
        SocketAddr::new(args.host, args.port),
        args.advertise_url.as_deref(),
        &args.containers,
    )
    .await?;
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
    for spec in &args.containers {
        say!(
            "  container {}/{} (partition key {}, {} partitions)",
            spec.database,
            spec.container,
            spec.partition_key,
            spec.partitions
        );
    }
    let shutdown = CancellationToken::new();
    let server = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { emulator.serve(listener, shutdown).await }
    });
    crate::signals::terminated().await;
    shutdown.cancel();
    let _ = server.await;
    say!("emulator stopped");
    Ok(())
}
