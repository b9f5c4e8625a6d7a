//! The chart's ValidatingAdmissionPolicy (`admissionPolicy.enabled`), on the real API server:
//! a `ChangeFeedProcessor` that names a worker or sidecar image outside the allowed prefixes, or
//! another service account, is refused with the policy's message; one within them is accepted.

use crate::operator_support::{FAKE_ENDPOINT, Scene, apply, resource, wait};

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/changefeed-operator");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admission_policy_limits_images_and_service_accounts() {
    let Scene { plane, ns, .. } = Scene::new("admission-policy").await;
    let (ok, policy, err) = crate::control_plane::helm(
        &plane.bin,
        None,
        &[
            "template",
            "vap-test",
            CHART,
            "--show-only",
            "templates/admissionpolicy.yaml",
            "--set",
            "admissionPolicy.enabled=true",
            "--set",
            "admissionPolicy.allowedImagePrefixes={registry.example.com/team/}",
            "--set",
            "admissionPolicy.allowedServiceAccounts={cfp-workers}",
            // Bound to this test's namespace only: the control plane is shared.
            "--set",
            &format!("watchNamespaces={{{ns}}}"),
        ],
    );
    assert!(ok, "helm template: {err}");
    let (ok, _, err) = plane.kubectl_run(&["apply", "-f", "-"], Some(&policy));
    assert!(ok, "kubectl apply of the policy: {err}");

    let with = |name: &str, worker: &str| resource(name, FAKE_ENDPOINT, &format!("  worker:\n{worker}"));
    let foreign_image = with("foreign-image", "    image: docker.io/someone/miner:1\n");
    // The policy takes effect once the API server has loaded it: bounded wait for the refusal. A
    // resource created before that is deleted again (applying it unchanged sends no request, so
    // the policy would never see it).
    let refused = wait("the policy refuses a foreign image", || async {
        let (ok, _, err) = apply(plane, &ns, &foreign_image);
        if ok {
            plane.kubectl_run(&["delete", "-n", &ns, "cfp/foreign-image", "--wait=false"], None);
        }
        (!ok && err.contains("must start with one of registry.example.com/team/")).then_some(err)
    })
    .await;
    let foreign_sidecar = with(
        "foreign-sidecar",
        "    image: registry.example.com/team/cfp:1\n    sidecars:\n      - name: s\n        image: docker.io/someone/tool:1\n",
    );
    let (ok, _, sidecar_err) = apply(plane, &ns, &foreign_sidecar);
    assert!(!ok && sidecar_err.contains("must start with one of"), "{sidecar_err}");
    let other_account = with(
        "other-account",
        "    image: registry.example.com/team/cfp:1\n    serviceAccountName: cluster-admin-sa\n",
    );
    let (ok, _, account_err) = apply(plane, &ns, &other_account);
    assert!(
        !ok && account_err.contains("serviceAccountName must be one of cfp-workers"),
        "{account_err}"
    );
    let allowed = with(
        "allowed",
        "    image: registry.example.com/team/cfp:1\n    serviceAccountName: cfp-workers\n",
    );
    let (ok, _, allowed_err) = apply(plane, &ns, &allowed);
    assert!(ok, "an allowed resource is refused: {allowed_err}");
    let (ok, _, default_err) = apply(plane, &ns, &resource("default-image", FAKE_ENDPOINT, ""));
    assert!(ok, "the operator's default image is allowed: {default_err}");
    println!(
        "admission policy: foreign image refused ({}), foreign sidecar refused, other service account refused, allowed and default accepted",
        refused.lines().last().unwrap_or_default()
    );
    let (ok, _, err) = plane.kubectl_run(&["delete", "-f", "-"], Some(&policy));
    assert!(ok, "kubectl delete of the policy: {err}");
}
