//! The container image built without a Docker engine (`tools/image/build.sh`, umoci): an OCI
//! archive whose config runs `cfp` as a non-root numeric user with OCI labels, and whose single
//! layer is self-contained — `cfp` runs in a chroot of it.

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
        "image: OCI archive {} KiB (with the test binary), user 65532:65532, entrypoint /usr/local/bin/cfp, 1 layer; in a chroot of it: {version:?}",
        size / 1024
    );
}
