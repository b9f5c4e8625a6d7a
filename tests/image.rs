//! The container image built without a Docker engine (`tools/image/build.sh`, umoci): an OCI
//! archive whose config runs `cfp` as a non-root numeric user with OCI labels, and whose single
//! layer is self-contained — `cfp` runs in a chroot of it. Beside it, its CycloneDX SBOM (by the
//! pinned cargo-cyclonedx), named with its digest by the image manifest's annotations, lists
//! every crate the binary ships at its Cargo.lock version.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::common::CFP;

fn blob(layout: &Path, digest: &str) -> Vec<u8> {
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    std::fs::read(layout.join("blobs/sha256").join(hex)).expect("blob")
}

fn json_blob(layout: &Path, digest: &str) -> Value {
    serde_json::from_slice(&blob(layout, digest)).expect("JSON blob")
}

#[test]
fn the_image_archive_runs_cfp_as_a_non_root_user_from_one_self_contained_layer() {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("cfp.oci.tar");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/image/build.sh");
    let output = Command::new("bash")
        .args([script, "--binary", CFP, "--out"])
        .arg(&archive)
        .output()
        .expect("run tools/image/build.sh");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let size = std::fs::metadata(&archive).unwrap().len();

    let layout = dir.path().join("layout");
    std::fs::create_dir(&layout).unwrap();
    assert!(
        Command::new("tar")
            .arg("-xf")
            .arg(&archive)
            .arg("-C")
            .arg(&layout)
            .status()
            .unwrap()
            .success()
    );
    let oci_layout: Value = serde_json::from_slice(&std::fs::read(layout.join("oci-layout")).unwrap()).unwrap();
    assert_eq!(oci_layout["imageLayoutVersion"], "1.0.0");
    let index: Value = serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "one tagged image");
    assert_eq!(
        manifests[0]["annotations"]["org.opencontainers.image.ref.name"],
        env!("CARGO_PKG_VERSION")
    );
    let manifest = json_blob(&layout, manifests[0]["digest"].as_str().unwrap());
    let config = json_blob(&layout, manifest["config"]["digest"].as_str().unwrap());
    assert_eq!(config["os"], "linux");
    assert_eq!(config["config"]["User"], "65532:65532", "numeric non-root user");
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/usr/local/bin/cfp"])
    );
    let labels = &config["config"]["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(labels["org.opencontainers.image.licenses"], "MIT");
    assert!(labels["org.opencontainers.image.revision"].is_string());
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    let sbom = check_sbom(dir.path(), &manifest["annotations"]);

    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir(&rootfs).unwrap();
    let layer = layout
        .join("blobs/sha256")
        .join(layers[0]["digest"].as_str().unwrap().trim_start_matches("sha256:"));
    assert!(
        Command::new("tar")
            .arg("-xzf")
            .arg(&layer)
            .arg("-C")
            .arg(&rootfs)
            .status()
            .unwrap()
            .success()
    );
    for path in ["usr/local/bin/cfp", "etc/ssl/certs/ca-certificates.crt", "etc/passwd"] {
        assert!(rootfs.join(path).exists(), "{path} missing from the image");
    }
    // Nothing but the binary's own files: no shell, no package manager.
    assert!(!rootfs.join("bin/sh").exists());
    // Self-contained: cfp runs with only the image's files (a chroot of the layer).
    let run = |args: &[&str]| {
        let mut command = if unsafe { libc::geteuid() } == 0 {
            Command::new("chroot")
        } else {
            let mut c = Command::new("unshare");
            c.args(["--user", "--map-root-user", "chroot"]);
            c
        };
        command
            .arg(&rootfs)
            .arg("/usr/local/bin/cfp")
            .args(args)
            .output()
            .expect("chroot")
    };
    let version = run(&["--version"]);
    assert!(version.status.success(), "{}", String::from_utf8_lossy(&version.stderr));
    let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
    assert_eq!(version, format!("cfp {}", env!("CARGO_PKG_VERSION")));
    let crd = run(&["crd"]);
    assert!(String::from_utf8_lossy(&crd.stdout).contains("kind: CustomResourceDefinition"));
    println!(
        "image: OCI archive {} KiB (with the test binary), user 65532:65532, entrypoint /usr/local/bin/cfp, 1 layer; in a chroot of it: {version:?}; {sbom}",
        size / 1024
    );
}

/// (name, version) of every package in Cargo.lock.
fn lock_packages() -> BTreeSet<(String, String)> {
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock")).expect("Cargo.lock");
    let mut packages = BTreeSet::new();
    for block in lock.split("[[package]]").skip(1) {
        let field = |key: &str| {
            block.lines().find_map(|line| {
                let value = line.strip_prefix(key)?.trim_start().strip_prefix('=')?.trim();
                Some(value.trim_matches('"').to_owned())
            })
        };
        if let (Some(name), Some(version)) = (field("name"), field("version")) {
            packages.insert((name, version));
        }
    }
    packages
}

/// (name, version) of the crates the binary links: the package's normal dependencies, and
/// theirs, for the host (`cargo metadata`'s resolve; no dev or build-only crates).
fn shipped_crates() -> BTreeSet<(String, String)> {
    let host = Command::new("rustc").arg("-vV").output().expect("rustc -vV");
    let host = String::from_utf8_lossy(&host.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .expect("host triple");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--offline",
            "--filter-platform",
            &host,
        ])
        .arg("--manifest-path")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .output()
        .expect("cargo metadata");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let metadata: Value = serde_json::from_slice(&output.stdout).unwrap();
    let packages: BTreeMap<&str, (String, String)> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let id = p["id"].as_str().unwrap();
            (
                id,
                (
                    p["name"].as_str().unwrap().to_owned(),
                    p["version"].as_str().unwrap().to_owned(),
                ),
            )
        })
        .collect();
    let nodes: BTreeMap<&str, &Value> = metadata["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let root = metadata["resolve"]["root"].as_str().unwrap();
    let (mut seen, mut pending) = (BTreeSet::new(), vec![root]);
    while let Some(id) = pending.pop() {
        for dep in nodes[id]["deps"].as_array().unwrap() {
            let normal = dep["dep_kinds"].as_array().unwrap().iter().any(|k| k["kind"].is_null());
            let pkg = dep["pkg"].as_str().unwrap();
            if normal && seen.insert(pkg) {
                pending.push(pkg);
            }
        }
    }
    seen.into_iter().map(|id| packages[id].clone()).collect()
}

/// Checks the SBOM beside the archive against the manifest's `annotations` and Cargo.lock;
/// returns what the test prints about it.
fn check_sbom(dir: &Path, annotations: &Value) -> String {
    assert_eq!(
        annotations["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(
        annotations["io.changefeed.sbom.mediaType"],
        "application/vnd.cyclonedx+json"
    );
    let name = annotations["io.changefeed.sbom.name"]
        .as_str()
        .expect("the manifest names the SBOM");
    assert_eq!(name, "cfp.cdx.json", "the SBOM is beside the archive, named after it");
    let bytes = std::fs::read(dir.join(name)).expect("the SBOM beside the archive");
    let digest = Command::new("sha256sum")
        .arg(dir.join(name))
        .output()
        .expect("sha256sum");
    let hex = String::from_utf8_lossy(&digest.stdout)
        .split(' ')
        .next()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        annotations["io.changefeed.sbom.digest"],
        format!("sha256:{hex}"),
        "the annotation's digest is the file's"
    );
    let sbom: Value = serde_json::from_slice(&bytes).expect("SBOM JSON");
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(sbom["specVersion"], "1.5");
    assert_eq!(sbom["metadata"]["component"]["name"], "changefeed-operator");
    assert_eq!(sbom["metadata"]["component"]["version"], env!("CARGO_PKG_VERSION"));
    let listed: BTreeSet<(String, String)> = sbom["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["version"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let (lock, shipped) = (lock_packages(), shipped_crates());
    let missing: Vec<_> = shipped.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "shipped crates missing from the SBOM (or at another version): {missing:?}"
    );
    let not_locked: Vec<_> = listed.difference(&lock).collect();
    assert!(
        not_locked.is_empty(),
        "SBOM entries not in Cargo.lock at that version: {not_locked:?}"
    );
    let names: BTreeSet<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
    for name in [
        "kube",
        "tokio",
        "azure_data_cosmos",
        "serde",
        "k8s-openapi",
        "azure_identity",
    ] {
        assert!(names.contains(name), "{name} missing from the SBOM");
    }
    // Crates only the tests use are not shipped.
    for name in ["proptest", "tempfile"] {
        assert!(!names.contains(name), "{name} (a dev-dependency) is in the SBOM");
    }
    format!(
        "SBOM {name} ({} KiB, {}): {} components, every one of the {} shipped crates at its Cargo.lock version ({} packages in the lock)",
        bytes.len() / 1024,
        &hex[..12],
        listed.len(),
        shipped.len(),
        lock.len()
    )
}
