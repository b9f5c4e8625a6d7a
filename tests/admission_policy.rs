//! The chart's ValidatingAdmissionPolicy (`admissionPolicy.enabled`), on the real API server:
//! a `ChangeFeedProcessor` that names a worker or sidecar image outside the allowed prefixes, or
//! another service account, is refused with the policy's message; one within them is accepted.
//! Endpoints the operator's own identity would reach must be listed in `allowedAccounts` for the
//! namespace, compared by scheme, host and port as the operator compares them.

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
    tenant_role(plane, &ns);
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

/// A Role in `ns` for user `alice`, group `tenants`: she may write resources there.
fn tenant_role(plane: &crate::control_plane::ControlPlane, ns: &str) {
    let role = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: tenant, namespace: {ns}}}\nrules:\n- apiGroups: [changefeed.io]\n  resources: [changefeedprocessors]\n  verbs: [get, list, create, update, patch]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: tenant, namespace: {ns}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: tenant}}\nsubjects:\n- {{kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}}\n"
    );
    assert!(plane.kubectl_run(&["apply", "-f", "-"], Some(&role)).0);
}

/// A resource whose monitored account (and, when given, lease account) is reached with
/// workload identity: the operator's own identity.
fn with_identity(name: &str, endpoint: &str, lease_endpoint: Option<&str>) -> String {
    let leases = lease_endpoint
        .map(|lease| format!("  leases:\n    connection:\n      endpoint: {lease}\n      auth: WorkloadIdentity\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: changefeed.io/v1alpha1\nkind: ChangeFeedProcessor\nmetadata:\n  name: {name}\nspec:\n  connection:\n    endpoint: {endpoint}\n    auth: WorkloadIdentity\n  monitored:\n    database: db\n    container: items\n{leases}  worker:\n    serviceAccountName: cfp-workers\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admission_policy_lets_the_operators_identity_reach_only_accounts_listed_for_the_namespace() {
    let Scene { plane, ns, .. } = Scene::new("admission-accounts").await;
    let listed_here = format!("allowedAccounts[0].namespaces[0]={ns}");
    let policy = installed_policy(
        plane,
        &ns,
        "vap-accounts",
        &[
            "allowedAccounts[0].endpoint=https://Orders.documents.azure.com/",
            &listed_here,
            "allowedAccounts[1].endpoint=https://shared.documents.azure.com:443/",
            "allowedAccounts[1].namespaces[0]=*",
            "allowedAccounts[2].endpoint=http://cosmos.dev.svc:8081/",
            "allowedAccounts[2].namespaces[0]=another-team",
        ],
    );
    tenant_role(plane, &ns);
    let unlisted = with_identity("unlisted", "https://other.documents.azure.com/", None);
    let first = wait("the policy refuses an unlisted account", || async {
        let (ok, _, err) = apply_as_tenant(plane, &ns, &unlisted);
        if ok {
            plane.kubectl_run(&["delete", "-n", &ns, "cfp/unlisted", "--wait=false"], None);
        }
        (!ok && err.contains(&format!(
            "must be accounts listed for namespace {ns} in allowedAccounts"
        )))
        .then_some(err)
    })
    .await;
    let refused = [
        (
            "other-port",
            with_identity("other-port", "https://orders.documents.azure.com:8443/", None),
        ),
        (
            "unlisted-lease-account",
            with_identity(
                "unlisted-lease-account",
                "https://orders.documents.azure.com/",
                Some("https://leases.documents.azure.com/"),
            ),
        ),
        (
            "plain-http-elsewhere",
            resource("plain-http-elsewhere", "http://cosmos.dev.svc:8081/", ""),
        ),
    ];
    for (name, yaml) in &refused {
        let (ok, _, err) = apply_as_tenant(plane, &ns, yaml);
        assert!(!ok, "{name} was admitted");
        assert!(err.contains("allowedAccounts"), "{name}: {err}");
    }
    let accepted = [
        (
            "listed-other-form",
            with_identity("listed-other-form", "https://ORDERS.documents.azure.com:443/", None),
        ),
        (
            "listed-for-every-namespace",
            with_identity(
                "listed-for-every-namespace",
                "https://orders.documents.azure.com/",
                Some("https://shared.documents.azure.com/"),
            ),
        ),
        ("own-key", resource("own-key", "https://other.documents.azure.com/", "")),
    ];
    for (name, yaml) in &accepted {
        let (ok, _, err) = apply_as_tenant(plane, &ns, yaml);
        assert!(ok, "{name} was refused: {err}");
    }
    println!(
        "admission policy, accounts: refused unlisted ({}), {:?}; accepted {:?}",
        first.lines().last().unwrap_or_default(),
        refused.map(|(name, _)| name),
        accepted.map(|(name, _)| name)
    );
    let (ok, _, err) = plane.kubectl_run(&["delete", "-f", "-"], Some(&policy));
    assert!(ok, "kubectl delete of the policy: {err}");
}
