//! `cfp bench`: runs the benchmark, prints the table, writes the JSON.

use super::args::BenchArgs;
use crate::bench::{BenchSettings, run as run_bench, table};

/// Where `bench/java-peer/build.sh` puts the Java peer, relative to the checkout.
const DEFAULT_JAVA_PEER: &str = "bench/java-peer/target/java-peer-0.1.0.jar";

/// Runs the figures; fails when one could not be measured (after printing the others).
pub async fn run(args: &BenchArgs) -> Result<(), String> {
    let mut settings = if args.small {
        BenchSettings::small()
    } else {
        BenchSettings::full()
    };
    if let Some(documents) = args.documents {
        settings.documents = documents.max(1);
    }
    settings.only = args.only.clone();
    settings.java_peer = match &args.java_peer {
        Some(jar) if !jar.is_file() => return Err(format!("--java-peer {}: no such file", jar.display())),
        Some(jar) => Some(jar.clone()),
        None => Some(std::path::PathBuf::from(DEFAULT_JAVA_PEER)).filter(|jar| jar.is_file()),
    };
    let report = run_bench(&settings, |figure| eprintln!("measuring {figure}…")).await;
    print!("{}", table(&report));
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if report.failed.is_empty() {
        Ok(())
    } else {
        Err(format!("{} figure(s) could not be measured", report.failed.len()))
    }
}
