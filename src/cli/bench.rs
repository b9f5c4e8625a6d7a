//! `cfp bench`: runs the benchmark, prints the table, writes the JSON.

use super::args::BenchArgs;
use crate::bench::{BenchSettings, has_control_plane_binaries, run as run_bench, table};

/// Where `bench/java-peer/build.sh` puts the Java peer, relative to the checkout.
const DEFAULT_JAVA_PEER: &str = "bench/java-peer/target/java-peer-0.1.0.jar";

/// The script that builds (and with `--print` names the directory of) etcd and kube-apiserver.
const K8S_BUILD_SCRIPT: &str = "tools/k8s/build.sh";

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
    settings.k8s_bin = match &args.k8s_bin {
        Some(dir) if !has_control_plane_binaries(dir) => {
            return Err(format!("--k8s-bin {}: no etcd and kube-apiserver there", dir.display()));
        }
        Some(dir) => Some(dir.clone()),
        None => built_k8s_bin().await,
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

/// The directory `tools/k8s/build.sh --print` names, when the script is here and has built
/// etcd and kube-apiserver into it.
async fn built_k8s_bin() -> Option<std::path::PathBuf> {
    if !std::path::Path::new(K8S_BUILD_SCRIPT).is_file() {
        return None;
    }
    let output = tokio::process::Command::new("bash")
        .args([K8S_BUILD_SCRIPT, "--print"])
        .output()
        .await
        .ok()?;
    let dir = std::path::PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    (output.status.success() && has_control_plane_binaries(&dir)).then_some(dir)
}
