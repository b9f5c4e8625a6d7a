//! `cfp bench`: runs the benchmark, prints the table, writes the JSON.

use super::args::BenchArgs;
use crate::bench::{BenchSettings, has_control_plane_binaries, run as run_bench, table};

/// Where `bench/java-peer/build.sh` puts the Java peer, relative to the checkout.
const DEFAULT_JAVA_PEER: &str = "bench/java-peer/target/java-peer-0.1.0.jar";

/// The script that builds (and with `--print` names the directory of) etcd and kube-apiserver.
const K8S_BUILD_SCRIPT: &str = "tools/k8s/build.sh";

/// Why `cfp bench` failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchCommandError {
    /// `--java-peer` names no file.
    #[error("--java-peer {0}: no such file")]
    NoJavaPeer(std::path::PathBuf),
    /// `--k8s-bin` has no etcd and kube-apiserver.
    #[error("--k8s-bin {0}: no etcd and kube-apiserver there")]
    NoControlPlane(std::path::PathBuf),
    /// The JSON report could not be written.
    #[error("writing {0}: {1}")]
    Json(std::path::PathBuf, std::io::Error),
    /// Figures could not be measured (the others were printed).
    #[error("{0} figure(s) could not be measured")]
    Failed(usize),
    /// `--render` names a file that is not a run's JSON.
    #[error("--render {0}: {1} (give the file an earlier run wrote with --json)")]
    Render(std::path::PathBuf, String),
}

/// Runs the figures; fails when one could not be measured (after printing the others). With
/// `--render`, prints the table of an earlier run instead.
pub async fn run(args: &BenchArgs) -> Result<(), BenchCommandError> {
    if let Some(path) = &args.render {
        let failed = |e: String| BenchCommandError::Render(path.clone(), e);
        let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
        let report: crate::bench::BenchReport = serde_json::from_str(&text).map_err(|e| failed(e.to_string()))?;
        super::print_out(table(&report));
        return Ok(());
    }
    let mut settings = if args.small {
        BenchSettings::small()
    } else {
        BenchSettings::full()
    };
    if let Some(documents) = args.documents {
        settings.documents = documents.max(1);
    }
    if let Some(leases) = args.leases {
        settings.scale_leases = leases as usize;
    }
    if let Some(instances) = args.instances {
        settings.scale_instances = instances as usize;
    }
    settings.only = args.only.clone();
    settings.java_peer = match &args.java_peer {
        Some(jar) if !jar.is_file() => return Err(BenchCommandError::NoJavaPeer(jar.clone())),
        Some(jar) => Some(jar.clone()),
        None => Some(std::path::PathBuf::from(DEFAULT_JAVA_PEER)).filter(|jar| jar.is_file()),
    };
    settings.k8s_bin = match &args.k8s_bin {
        Some(dir) if !has_control_plane_binaries(dir) => {
            return Err(BenchCommandError::NoControlPlane(dir.clone()));
        }
        Some(dir) => Some(dir.clone()),
        None => built_k8s_bin().await,
    };
    let mut report = run_bench(&settings, |figure| eprintln!("measuring {figure}…")).await;
    report.label = args.label.clone();
    super::print_out(table(&report));
    if let Some(path) = &args.json {
        let json =
            serde_json::to_string_pretty(&report).map_err(|e| BenchCommandError::Json(path.clone(), e.into()))?;
        std::fs::write(path, json).map_err(|e| BenchCommandError::Json(path.clone(), e))?;
    }
    if report.failed.is_empty() {
        Ok(())
    } else {
        Err(BenchCommandError::Failed(report.failed.len()))
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
