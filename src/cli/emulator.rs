//! `cfp emulator`: the SDK's in-memory emulator on loopback until SIGINT/SIGTERM.

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;

use super::args::EmulatorArgs;
use crate::emulator::{EmulatorError, bind_advertised};

/// Serves the emulator until a termination signal.
pub async fn run(args: &EmulatorArgs) -> Result<(), EmulatorError> {
    let (emulator, listener) = bind_advertised(
        SocketAddr::new(args.host, args.port),
        args.advertise_url.as_deref(),
        &args.containers,
    )
    .await?;
    println!("Cosmos DB emulator listening");
    println!("  endpoint: {}", emulator.endpoint());
    println!("  key:      {}", crate::cosmos::EMULATOR_KEY);
    for spec in &args.containers {
        println!(
            "  container {}/{} (partition key {}, {} partitions)",
            spec.database, spec.container, spec.partition_key, spec.partitions
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
    println!("emulator stopped");
    Ok(())
}
