//! The chart's ValidatingAdmissionPolicy (`admissionPolicy.enabled`), on the real API server:
//! a `ChangeFeedProcessor` that names a worker or sidecar image outside the allowed prefixes, or
//! another service account, is refused with the policy's message; one within them is accepted.

use crate::operator_support::{FAKE_ENDPOINT, Scene, apply, resource, wait};

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/changefeed-operator");

/// The chart's policy rendered with `admissionPolicy.enabled` and the values `sets`, bound to
/// `ns` alone (the control plane is shared), and applied; returns its YAML.
fn installed_policy(plane: &crate::control_plane::ControlPlane, ns: &str, release: &str, sets: &[&str]) -> String {
    let bound = format!("watchNamespaces={{{ns}}}");
    let mut args = vec![
        "template",
        release,
        CHART,
        "--show-only",
        "templates/admissionpolicy.yaml",
    ];
    for set in ["admissionPolicy.enabled=true", &bound].iter().chain(sets) {
        args.extend(["--set", set]);
    }
    let (ok, policy, err) = crate::control_plane::helm(&plane.bin, None, &args);
    assert!(ok, "helm template: {err}");
    let (ok, _, err) = plane.kubectl_run(&["apply", "-f", "-"], Some(&policy));
    assert!(ok, "kubectl apply of the policy: {err}");
    policy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admission_policy_limits_images_and_service_accounts() {
    let Scene { plane, ns, .. } = Scene::new("admission-policy").await;
    let policy = installed_policy(
        plane,
        &ns,
        "vap-test",
        &[
            "admissionPolicy.allowedImagePrefixes={registry.example.com/team/}",
            "admissionPolicy.allowedServiceAccounts={cfp-workers}",
        ],
    );

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

/// Applies `yaml` in `ns` as user `alice` (group `tenants`), whom a Role lets write
/// `ChangeFeedProcessor`s there.
fn apply_as_tenant(plane: &crate::control_plane::ControlPlane, ns: &str, yaml: &str) -> (bool, String, String) {
    plane.kubectl_run(
        &["apply", "-n", ns, "--as", "alice", "--as-group", "tenants", "-f", "-"],
        Some(yaml),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admission_policy_with_its_defaults_installs_and_refuses_what_a_tenant_should_not_name() {
    let Scene { plane, ns, .. } = Scene::new("admission-defaults").await;
    let policy = installed_policy(
        plane,
        &ns,
        "vap-defaults",
        &["admissionPolicy.allowedImagePrefixes={myacr.azurecr.io}"],
    );
    let role = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: tenant, namespace: {ns}}}\nrules:\n- apiGroups: [changefeed.io]\n  resources: [changefeedprocessors]\n  verbs: [get, list, create, update, patch]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: tenant, namespace: {ns}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: tenant}}\nsubjects:\n- {{kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}}\n"
    );
    assert!(plane.kubectl_run(&["apply", "-f", "-"], Some(&role)).0);
    let with = |name: &str, extra: &str| resource(name, FAKE_ENDPOINT, extra);
    let image = |image: &str| format!("  worker:\n    image: {image}\n");
    // The policy takes effect once the API server has loaded it.
    let refused_boundary = wait("the policy refuses a look-alike registry", || async {
        let (ok, _, err) = apply_as_tenant(plane, &ns, &with("look-alike", &image("myacr.azurecr.io.evil/miner:1")));
        if ok {
            plane.kubectl_run(&["delete", "-n", &ns, "cfp/look-alike", "--wait=false"], None);
        }
        (!ok && err.contains("must start with one of myacr.azurecr.io")).then_some(err)
    })
    .await;
    let cases = [
        (
            "privileged",
            "  worker:\n    image: myacr.azurecr.io/cfp:1\n    sidecars:\n      - name: s\n        image: myacr.azurecr.io/s:1\n        securityContext: {privileged: true}\n",
            "may not run privileged",
        ),
        (
            "host-path",
            "  worker:\n    image: myacr.azurecr.io/cfp:1\n    volumes:\n      - name: root\n        hostPath: {path: /}\n",
            "hostPath",
        ),
    ];
    let mut refused = vec![refused_boundary.lines().last().unwrap_or_default().to_owned()];
    for (name, extra, message) in cases {
        let (ok, _, err) = apply_as_tenant(plane, &ns, &with(name, extra));
        assert!(!ok && err.contains(message), "{name}: {err}");
        refused.push(name.to_owned());
    }
    let plain = resource(
        "plain-http",
        "http://cosmos.tenant-a.svc:8081/",
        &image("myacr.azurecr.io/cfp:1"),
    );
    let (ok, _, err) = apply_as_tenant(plane, &ns, &plain);
    assert!(!ok && err.contains("must use https"), "plain http: {err}");
    let annotated = with("take-over", &image("myacr.azurecr.io/cfp:1")).replace(
        "  name: take-over\n",
        "  name: take-over\n  annotations:\n    changefeed.io/take-over-lease-set-from: other/orders\n",
    );
    let (ok, _, err) = apply_as_tenant(plane, &ns, &annotated);
    assert!(
        !ok && err.contains("may be set only by members of system:masters"),
        "take-over: {err}"
    );
    let (ok, _, err) = plane.kubectl_run(&["apply", "-n", &ns, "-f", "-"], Some(&annotated));
    assert!(ok, "a cluster admin may set it: {err}");
    let (ok, _, err) = apply_as_tenant(plane, &ns, &with("fine", &image("myacr.azurecr.io/team/cfp:1")));
    assert!(ok, "an allowed resource is refused: {err}");
    println!(
        "admission policy with its defaults: refused {refused:?}, plain http, the take-over annotation (tenant); accepted the admin's annotation and an allowed image"
    );
    let (ok, _, err) = plane.kubectl_run(&["delete", "-f", "-"], Some(&policy));
    assert!(ok, "kubectl delete of the policy: {err}");
}
