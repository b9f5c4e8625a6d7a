//! `cfp operator` on a cluster without the CRD ends with one clear line (a control plane of its
//! own, where no test installs the CRD).

use std::time::Duration;

use crate::common;
use crate::control_plane::ControlPlane;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_says_when_the_crd_is_missing() {
    let plane = tokio::task::spawn_blocking(ControlPlane::own)
        .await
        .expect("control plane");
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(common::CFP)
            .args(["operator", "--namespace", "default", "--no-leader-election"])
            .env("KUBECONFIG", &plane.kubeconfig)
            .env("RUST_LOG", "off")
            .output(),
    )
    .await
    .expect("the operator exits by itself")
    .expect("run cfp operator");
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    println!("operator without the CRD: exit {:?}: {stderr}", output.status.code());
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("CRD (changefeedprocessors.changefeed.io) is not installed"),
        "{stderr}"
    );
}
