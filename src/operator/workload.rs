//! Rendering the worker Deployment and metrics Service of a `ChangeFeedProcessor`. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, ObjectFieldSelector,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecretKeySelector,
    SecurityContext, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;

use crate::cosmos::AuthMethod;
use crate::operator::crd::{ChangeFeedProcessor, Connection, HandlerKind, SecretKeyRef};
use crate::processor::ProcessorOptions;
use crate::worker::options_args::{options_env, value_enum_text};

/// The label naming the processor resource a worker pod belongs to.
pub const PROCESSOR_LABEL: &str = "changefeed.io/processor";
const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// The field manager of everything the operator writes.
pub const FIELD_MANAGER: &str = "changefeed-operator";
/// The worker container's name.
pub const WORKER_CONTAINER: &str = "worker";

/// Labels selecting the worker pods of `cfp`.
pub fn selector_labels(cfp: &ChangeFeedProcessor) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            PROCESSOR_LABEL.to_owned(),
            cfp.metadata.name.clone().unwrap_or_default(),
        ),
        (COMPONENT_LABEL.to_owned(), "worker".to_owned()),
    ])
}

/// A label selector matching the worker pods of every processor the operator manages.
pub fn worker_pod_selector() -> String {
    format!("app.kubernetes.io/managed-by={FIELD_MANAGER},{COMPONENT_LABEL}=worker")
}

/// The selector as a string, for `status.selector` (the `/scale` subresource).
pub fn selector_string(cfp: &ChangeFeedProcessor) -> String {
    selector_labels(cfp)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The labels of the objects rendered for `cfp`.
pub(crate) fn workload_labels(cfp: &ChangeFeedProcessor) -> BTreeMap<String, String> {
    labels(cfp)
}

fn labels(cfp: &ChangeFeedProcessor) -> BTreeMap<String, String> {
    let mut labels = selector_labels(cfp);
    labels.insert("app.kubernetes.io/name".into(), "changefeed-worker".into());
    labels.insert(
        "app.kubernetes.io/instance".into(),
        cfp.metadata.name.clone().unwrap_or_default(),
    );
    labels.insert("app.kubernetes.io/managed-by".into(), FIELD_MANAGER.into());
    labels
}

/// `cfp` as the controlling owner of what is rendered for it.
pub(crate) fn owner(cfp: &ChangeFeedProcessor) -> Vec<OwnerReference> {
    cfp.controller_owner_ref(&()).into_iter().collect()
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

/// Variable `name` set from the pod's field `path` (the downward API).
fn pod_field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                // What the API server defaults it to: rendering it avoids a diff on every apply.
                api_version: Some("v1".into()),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The credential variables of one connection: `CFP_<prefix>AUTH`, and `CFP_<prefix>KEY` from
/// the Secret with auth `Key`.
fn auth_env(prefix: &str, connection: &Connection) -> Vec<EnvVar> {
    let mut vars = vec![env(&format!("CFP_{prefix}AUTH"), value_enum_text(connection.auth))];
    if let (AuthMethod::Key, Some(reference)) = (connection.auth, &connection.key_secret_ref) {
        vars.push(secret_key_env(&format!("CFP_{prefix}KEY"), reference));
    }
    vars
}

/// Whether the pods need the workload identity webhook (a connection uses Entra ID).
fn uses_workload_identity(cfp: &ChangeFeedProcessor) -> bool {
    std::iter::once(&cfp.spec.connection)
        .chain(cfp.spec.leases.connection.as_ref())
        .any(|c| c.auth == AuthMethod::WorkloadIdentity)
}

/// The label that makes the Azure workload identity webhook inject the federated token.
pub const WORKLOAD_IDENTITY_LABEL: &str = "azure.workload.identity/use";

fn secret_key_env(name: &str, reference: &SecretKeyRef) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: reference.name.clone(),
                key: reference.key.clone(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The worker container's environment: every `cfp worker` flag as `CFP_<NAME>`.
pub fn worker_env(cfp: &ChangeFeedProcessor) -> Vec<EnvVar> {
    let spec = &cfp.spec;
    let mut vars = vec![env("CFP_ENDPOINT", spec.connection.endpoint.clone())];
    vars.extend(auth_env("", &spec.connection));
    if !spec.preferred_regions.is_empty() {
        vars.push(env("CFP_PREFERRED_REGIONS", spec.preferred_regions.join(",")));
    }
    vars.extend([
        env("CFP_DATABASE", spec.monitored.database.clone()),
        env("CFP_CONTAINER", spec.monitored.container.clone()),
        env("CFP_LEASE_DATABASE", spec.lease_database()),
        env("CFP_LEASE_CONTAINER", spec.lease_container()),
    ]);
    if let Some(lease_connection) = &spec.leases.connection {
        vars.push(env("CFP_LEASE_ENDPOINT", lease_connection.endpoint.clone()));
        vars.extend(auth_env("LEASE_", lease_connection));
    }
    vars.extend([
        pod_field_env("CFP_INSTANCE", "metadata.name"),
        // A worker restarted in its pod takes over its predecessor's leases at once.
        pod_field_env("CFP_POD_UID", "metadata.uid"),
        env(
            "CFP_HANDLER",
            match spec.handler.kind {
                HandlerKind::Stdout => "stdout",
                HandlerKind::Http => "http",
            },
        ),
        env("CFP_METRICS_PORT", spec.worker.metrics_port.to_string()),
    ]);
    if !spec.create_leases() {
        vars.push(env("CFP_NO_CREATE_LEASES", "true".to_owned()));
    }
    vars.extend(options_vars(cfp));
    vars.extend(handler_env(cfp));
    vars.extend(emulator_host_env(cfp));
    vars.extend(tracing_env(cfp));
    vars
}

/// The processor options of `cfp`'s workers as their `CFP_*` variables, rendered by the worker
/// settings contract ([`options_env`]) from the one conversion of the resource into options. The
/// reconciler applies no workload for a resource whose fields do not convert (its configuration
/// check refuses it first); rendered anyway, such a resource carries no option variables.
fn options_vars(cfp: &ChangeFeedProcessor) -> Vec<EnvVar> {
    let Ok(options) = ProcessorOptions::try_from(cfp) else {
        return Vec::new();
    };
    options_env(&options)
        .into_iter()
        .map(|(name, value)| env(name, value))
        .collect()
}

/// `observability.tracing` as the OpenTelemetry SDK's standard variables.
fn tracing_env(cfp: &ChangeFeedProcessor) -> Vec<EnvVar> {
    let Some(tracing) = cfp.spec.observability.as_ref().and_then(|o| o.tracing.as_ref()) else {
        return Vec::new();
    };
    let service = tracing.service_name.clone().unwrap_or_else(|| cfp.processor_name());
    let mut vars = vec![
        env("OTEL_EXPORTER_OTLP_ENDPOINT", tracing.endpoint.clone()),
        env("OTEL_SERVICE_NAME", service),
    ];
    if let Some(ratio) = tracing.sample_ratio {
        vars.push(env("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"));
        vars.push(env("OTEL_TRACES_SAMPLER_ARG", ratio.to_string()));
    }
    vars
}

/// A plain `http://` endpoint other than localhost is an emulator in the cluster (the Cosmos
/// service is https only): the SDK uses plain http there only when told the host.
fn emulator_host_env(cfp: &ChangeFeedProcessor) -> Option<EnvVar> {
    let url = url::Url::parse(&cfp.spec.connection.endpoint).ok()?;
    let host = url.host_str()?;
    (url.scheme() == "http" && host != "localhost" && host != "127.0.0.1")
        .then(|| env("AZURE_COSMOS_EMULATOR_HOST", host))
}

/// The handler, retry and dead-letter settings as `CFP_*` variables; header values from Secrets
/// come through `secretKeyRef` as `CFP_HANDLER_HEADER_<NAME>`, never in the pod spec itself.
fn handler_env(cfp: &ChangeFeedProcessor) -> Vec<EnvVar> {
    let spec = &cfp.spec;
    let handler = &spec.handler;
    let mut vars = Vec::new();
    if let (HandlerKind::Http, Some(http)) = (handler.kind, &handler.http) {
        vars.push(env("CFP_HANDLER_URL", http.url.clone()));
        vars.push(env("CFP_HANDLER_FORMAT", value_enum_text(http.format)));
        vars.push(env("CFP_HANDLER_TIMEOUT", http.timeout.clone()));
        if let Some(path) = &http.readiness_path {
            vars.push(env("CFP_HANDLER_READINESS_PATH", path.clone()));
        }
        for header in &http.headers {
            let name = format!("CFP_HANDLER_HEADER_{}", header.name);
            match (&header.value, &header.value_from) {
                (Some(value), _) => vars.push(env(&name, value.clone())),
                (None, Some(source)) => vars.push(secret_key_env(&name, &source.secret_key_ref)),
                (None, None) => {}
            }
        }
    }
    if let Some(dead_letter) = &spec.dead_letter {
        if let Some(database) = &dead_letter.database {
            vars.push(env("CFP_DEAD_LETTER_DATABASE", database.clone()));
        }
        vars.push(env("CFP_DEAD_LETTER_CONTAINER", dead_letter.container.clone()));
    }
    vars
}

/// The restricted Pod Security Standard's container settings.
fn restricted() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..Default::default()
    }
}

/// Requests for a worker without `resources`, so that it is not BestEffort (first to be evicted).
fn default_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity("100m".into())),
            ("memory".to_owned(), Quantity("64Mi".into())),
        ])),
        ..Default::default()
    }
}

/// The worker container's environment: the operator's `CFP_*` variables, then the user's
/// `worker.env` except names the operator sets.
fn container_env(cfp: &ChangeFeedProcessor) -> Vec<EnvVar> {
    let mut vars = worker_env(cfp);
    let ours: Vec<String> = vars.iter().map(|v| v.name.clone()).collect();
    vars.extend(cfp.spec.worker.env.iter().filter(|v| !ours.contains(&v.name)).cloned());
    vars
}

/// A PodDisruptionBudget letting one worker pod at a time be evicted (node drains, upgrades):
/// never blocks a drain (unhealthy pods are always evictable), never takes several healthy
/// workers down together.
pub fn worker_disruption_budget(cfp: &ChangeFeedProcessor) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: cfp.metadata.name.clone(),
            namespace: cfp.metadata.namespace.clone(),
            labels: Some(labels(cfp)),
            owner_references: Some(owner(cfp)),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(cfp)),
                match_expressions: None,
            }),
            // A crash-looping or never-ready worker (its handler down) is evicted anyway: the
            // budget never blocks a node drain.
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
            ..Default::default()
        }),
        status: None,
    }
}

/// A handler sidecar as a native sidecar (an init container that keeps running): it starts, and
/// is ready, before the worker, and is stopped only after the worker has exited, so a batch in
/// flight at a stop still reaches it. Without its own security context it gets the worker's.
fn native_sidecar(mut sidecar: Container) -> Container {
    sidecar.security_context.get_or_insert_with(restricted);
    sidecar.restart_policy = Some("Always".into());
    sidecar
}

/// Time to checkpoint and release the leases after the last batch settled.
const RELEASE_SECONDS: i64 = 30;

/// How long a stopping worker may take: `worker.terminationGracePeriodSeconds`, else the HTTP
/// handler's timeout (a batch in flight finishes or times out) plus the time to release leases.
pub fn termination_grace_period(cfp: &ChangeFeedProcessor) -> i64 {
    let spec = &cfp.spec;
    if let Some(seconds) = spec.worker.termination_grace_period_seconds {
        return seconds;
    }
    let handler = match (&spec.handler.kind, &spec.handler.http) {
        (HandlerKind::Http, Some(http)) => humantime::parse_duration(&http.timeout)
            .map(|t| i64::try_from(t.as_secs().saturating_add(u64::from(t.subsec_nanos() > 0))).unwrap_or(i64::MAX))
            .unwrap_or(60),
        _ => 0,
    };
    handler.saturating_add(RELEASE_SECONDS)
}

fn probe(path: &str, period: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("metrics".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(3),
        ..Default::default()
    }
}

/// Pod-template annotation: a digest of the Secret values the workers read (see
/// [`crate::operator::config::secrets_digest`]); a rotated key changes it and rolls the workers.
pub const SECRETS_DIGEST_ANNOTATION: &str = "changefeed.io/secrets-digest";

/// Stamps the digest of the referenced Secret values on the worker pod template (nothing when
/// the resource references no Secret).
pub fn with_secrets_digest(mut deployment: Deployment, digest: Option<String>) -> Deployment {
    if let Some(digest) = digest
        && let Some(metadata) = deployment
            .spec
            .as_mut()
            .map(|s| s.template.metadata.get_or_insert_with(Default::default))
    {
        metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(SECRETS_DIGEST_ANNOTATION.to_owned(), digest);
    }
    deployment
}

/// The worker Deployment with `replicas` pods running `image` unless the resource overrides it.
pub fn worker_deployment(cfp: &ChangeFeedProcessor, image: &str, replicas: i32) -> Deployment {
    let spec = &cfp.spec;
    let name = cfp.metadata.name.clone().unwrap_or_default();
    Deployment {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: cfp.metadata.namespace.clone(),
            labels: Some(labels(cfp)),
            owner_references: Some(owner(cfp)),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector_labels(cfp)),
                match_expressions: None,
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels(cfp)),
                    annotations: Some(spec.worker.annotations.clone()).filter(|a| !a.is_empty()),
                    ..Default::default()
                }),
                spec: Some(worker_pod(cfp, image)),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// The worker container: the image, `cfp worker` with its environment, the metrics port and the
/// probes.
fn worker_container(cfp: &ChangeFeedProcessor, image: &str) -> Container {
    let spec = &cfp.spec;
    Container {
        name: WORKER_CONTAINER.into(),
        image: Some(spec.worker.image.clone().unwrap_or_else(|| image.to_owned())),
        image_pull_policy: spec.worker.image_pull_policy.clone(),
        args: Some(vec!["worker".into()]),
        env: Some(container_env(cfp)),
        ports: Some(vec![ContainerPort {
            name: Some("metrics".into()),
            container_port: spec.worker.metrics_port,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        liveness_probe: Some(probe("/healthz", 10)),
        readiness_probe: Some(probe("/readyz", 5)),
        resources: Some(spec.worker.resources.clone().unwrap_or_else(default_resources)),
        security_context: Some(restricted()),
        env_from: Some(spec.worker.env_from.clone()).filter(|e| !e.is_empty()),
        volume_mounts: Some(spec.worker.volume_mounts.clone()).filter(|m| !m.is_empty()),
        ..Default::default()
    }
}

/// The worker pods' labels: the user's, ours, the selector's, and workload identity's.
fn pod_labels(cfp: &ChangeFeedProcessor) -> BTreeMap<String, String> {
    let mut pod_labels = cfp.spec.worker.labels.clone();
    pod_labels.extend(labels(cfp));
    pod_labels.extend(selector_labels(cfp));
    if uses_workload_identity(cfp) {
        pod_labels.insert(WORKLOAD_IDENTITY_LABEL.into(), "true".into());
    }
    pod_labels
}

/// The worker pod: its containers, the scheduling the spec asks for, and a restricted security
/// context.
fn worker_pod(cfp: &ChangeFeedProcessor, image: &str) -> PodSpec {
    let worker = &cfp.spec.worker;
    let sidecars: Vec<Container> = worker.sidecars.iter().cloned().map(native_sidecar).collect();
    PodSpec {
        containers: vec![worker_container(cfp, image)],
        init_containers: Some(sidecars).filter(|s| !s.is_empty()),
        automount_service_account_token: Some(false),
        service_account_name: worker.service_account_name.clone(),
        node_selector: Some(worker.node_selector.clone()).filter(|n| !n.is_empty()),
        tolerations: Some(worker.tolerations.clone()).filter(|t| !t.is_empty()),
        volumes: Some(worker.volumes.clone()).filter(|v| !v.is_empty()),
        image_pull_secrets: Some(worker.image_pull_secrets.clone()).filter(|s| !s.is_empty()),
        affinity: worker.affinity.clone(),
        topology_spread_constraints: Some(worker.topology_spread_constraints.clone()).filter(|t| !t.is_empty()),
        priority_class_name: worker.priority_class_name.clone(),
        termination_grace_period_seconds: Some(termination_grace_period(cfp)),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65532),
            run_as_group: Some(65532),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The Service exposing the workers' metrics port (for Prometheus scraping).
pub fn metrics_service(cfp: &ChangeFeedProcessor) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(format!("{}-metrics", cfp.metadata.name.clone().unwrap_or_default())),
            namespace: cfp.metadata.namespace.clone(),
            labels: Some(labels(cfp)),
            owner_references: Some(owner(cfp)),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(selector_labels(cfp)),
            ports: Some(vec![ServicePort {
                name: Some("metrics".into()),
                port: cfp.spec.worker.metrics_port,
                target_port: Some(IntOrString::String("metrics".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            type_: Some("ClusterIP".into()),
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::operator::crd::ChangeFeedProcessorSpec;

    /// A resource `orders` in `shop` with `extra` spec fields (the network policy's tests too).
    pub(crate) fn resource(extra: serde_json::Value) -> ChangeFeedProcessor {
        let mut spec = serde_json::json!({
            "connection": {"endpoint": "https://acct.documents.azure.com:443/", "keySecretRef": {"name": "cosmos"}},
            "monitored": {"database": "db", "container": "orders"},
        });
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        let spec: ChangeFeedProcessorSpec = serde_json::from_value(spec).unwrap();
        let mut cfp = ChangeFeedProcessor::new("orders", spec);
        cfp.metadata.namespace = Some("shop".into());
        cfp.metadata.uid = Some("uid-1".into());
        cfp
    }

    fn env_of(deployment: &Deployment) -> BTreeMap<String, EnvVar> {
        let pod = deployment.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        pod.containers[0]
            .env
            .clone()
            .unwrap()
            .into_iter()
            .map(|e| (e.name.clone(), e))
            .collect()
    }

    fn value(env: &BTreeMap<String, EnvVar>, name: &str) -> Option<String> {
        env.get(name).and_then(|e| e.value.clone())
    }

    #[test]
    fn the_grace_period_follows_the_handler_timeout() {
        let cases = [
            ("stdout", serde_json::json!({}), 30),
            (
                "http default timeout",
                serde_json::json!({"handler": {"type": "Http", "http": {"url": "http://localhost:8080/"}}}),
                90,
            ),
            (
                "http 2m30s",
                serde_json::json!({"handler": {"type": "Http", "http": {"url": "http://localhost:8080/", "timeout": "2m30s"}}}),
                180,
            ),
            (
                "http 1500ms rounds up",
                serde_json::json!({"handler": {"type": "Http", "http": {"url": "http://localhost:8080/", "timeout": "1500ms"}}}),
                32,
            ),
            (
                "overridden",
                serde_json::json!({"worker": {"terminationGracePeriodSeconds": 600}}),
                600,
            ),
        ];
        for (name, spec, want) in cases {
            let deployment = worker_deployment(&resource(spec), "cfp:1", 1);
            let pod = deployment.spec.unwrap().template.spec.unwrap();
            assert_eq!(pod.termination_grace_period_seconds, Some(want), "{name}");
        }
        let budget = worker_disruption_budget(&resource(serde_json::json!({})));
        assert_eq!(
            budget.spec.unwrap().unhealthy_pod_eviction_policy.as_deref(),
            Some("AlwaysAllow"),
            "a crash-looping fleet never blocks a drain"
        );
    }

    #[test]
    fn worker_env_table() {
        struct Case {
            name: &'static str,
            spec: serde_json::Value,
            want: &'static [(&'static str, Option<&'static str>)],
        }
        let cases = [
            Case {
                name: "defaults",
                spec: serde_json::json!({}),
                want: &[
                    ("CFP_ENDPOINT", Some("https://acct.documents.azure.com:443/")),
                    ("CFP_DATABASE", Some("db")),
                    ("CFP_CONTAINER", Some("orders")),
                    ("CFP_LEASE_DATABASE", Some("db")),
                    ("CFP_LEASE_CONTAINER", Some("leases")),
                    ("CFP_PROCESSOR", Some("orders")),
                    ("CFP_START_FROM", Some("beginning")),
                    ("CFP_HANDLER", Some("stdout")),
                    ("CFP_MAX_ITEMS", Some("100")),
                    ("CFP_CHECKPOINT_EVERY_BATCHES", Some("1")),
                    ("CFP_CHECKPOINT_INTERVAL", None),
                    ("CFP_POLL_INTERVAL", Some("5s")),
                    ("CFP_LEASE_ACQUIRE_INTERVAL", Some("13s")),
                    ("CFP_LEASE_RENEW_INTERVAL", Some("17s")),
                    ("CFP_LEASE_EXPIRATION", Some("60s")),
                    ("CFP_METRICS_PORT", Some("9090")),
                    ("CFP_LEASE_ENDPOINT", None),
                    ("AZURE_COSMOS_EMULATOR_HOST", None),
                    ("CFP_NO_CREATE_LEASES", None),
                ],
            },
            Case {
                name: "workload identity: the lease container is not created by default",
                spec: serde_json::json!({"connection": {"endpoint": "https://acct.documents.azure.com:443/", "auth": "WorkloadIdentity"},
                                         "worker": {"serviceAccountName": "orders"}}),
                want: &[("CFP_NO_CREATE_LEASES", Some("true"))],
            },
            Case {
                name: "workload identity allowed to create",
                spec: serde_json::json!({"connection": {"endpoint": "https://acct.documents.azure.com:443/", "auth": "WorkloadIdentity"},
                                         "leases": {"createIfNotExists": true}, "worker": {"serviceAccountName": "orders"}}),
                want: &[("CFP_NO_CREATE_LEASES", None)],
            },
            Case {
                name: "key without metadata writes",
                spec: serde_json::json!({"leases": {"createIfNotExists": false}}),
                want: &[("CFP_NO_CREATE_LEASES", Some("true"))],
            },
            Case {
                name: "key on the monitored account, workload identity on the lease account",
                spec: serde_json::json!({"leases": {"connection": {"endpoint": "https://other.documents.azure.com/", "auth": "WorkloadIdentity"}},
                                         "worker": {"serviceAccountName": "orders"}}),
                want: &[("CFP_NO_CREATE_LEASES", Some("true"))],
            },
            Case {
                name: "overrides",
                spec: serde_json::json!({
                    "processorName": "orders-v2", "startFrom": "Now", "maxItems": 7, "pollInterval": "250ms",
                    "maxInFlightBatches": 8, "mode": "AllVersionsAndDeletes",
                    "leases": {"database": "meta", "container": "cfp-leases", "perPartition": 4,
                               "adoptFrom": {"layout": "JavaPk", "prefix": "orders-java"},
                               "connection": {"endpoint": "https://other.documents.azure.com/", "keySecretRef": {"name": "other", "key": "primary"}}},
                    "leaseTimings": {"acquireInterval": "5s", "renewInterval": "4s", "expiration": "20s"},
                    "checkpoint": {"everyBatches": 20, "interval": "10s"},
                }),
                want: &[
                    ("CFP_CHECKPOINT_EVERY_BATCHES", Some("20")),
                    ("CFP_CHECKPOINT_INTERVAL", Some("10s")),
                    ("CFP_LEASES_PER_PARTITION", Some("4")),
                    ("CFP_MAX_IN_FLIGHT_BATCHES", Some("8")),
                    ("CFP_MODE", Some("all-versions-and-deletes")),
                    ("CFP_ADOPT", Some("java-pk")),
                    ("CFP_ADOPT_PREFIX", Some("orders-java")),
                    ("CFP_ADOPT_FORCE", None),
                    ("CFP_PROCESSOR", Some("orders-v2")),
                    ("CFP_START_FROM", Some("now")),
                    ("CFP_MAX_ITEMS", Some("7")),
                    ("CFP_POLL_INTERVAL", Some("250ms")),
                    ("CFP_LEASE_DATABASE", Some("meta")),
                    ("CFP_LEASE_CONTAINER", Some("cfp-leases")),
                    ("CFP_LEASE_ENDPOINT", Some("https://other.documents.azure.com/")),
                    ("CFP_LEASE_ACQUIRE_INTERVAL", Some("5s")),
                    ("CFP_LEASE_RENEW_INTERVAL", Some("4s")),
                    ("CFP_LEASE_EXPIRATION", Some("20s")),
                ],
            },
            Case {
                name: "no tracing",
                spec: serde_json::json!({}),
                want: &[("OTEL_EXPORTER_OTLP_ENDPOINT", None), ("OTEL_TRACES_SAMPLER", None)],
            },
            Case {
                name: "tracing, sampled",
                spec: serde_json::json!({"observability": {"tracing": {"endpoint": "http://otel.monitoring:4318", "sampleRatio": 0.25}}}),
                want: &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", Some("http://otel.monitoring:4318")),
                    ("OTEL_SERVICE_NAME", Some("orders")),
                    ("OTEL_TRACES_SAMPLER", Some("parentbased_traceidratio")),
                    ("OTEL_TRACES_SAMPLER_ARG", Some("0.25")),
                ],
            },
            Case {
                name: "http handler with dead-lettering",
                spec: serde_json::json!({
                    "handler": {"type": "Http", "onExhausted": "DeadLetter",
                                "http": {"url": "http://localhost:8080/changes", "format": "CloudEvents",
                                         "timeout": "10s", "readinessPath": "/ready",
                                         "headers": [{"name": "X-Tenant", "value": "t1"}]},
                                "retry": {"maxAttempts": 3, "initialBackoff": "200ms", "maxBackoff": "5s"}},
                    "deadLetter": {"container": "poison"},
                }),
                want: &[
                    ("CFP_HANDLER", Some("http")),
                    ("CFP_HANDLER_URL", Some("http://localhost:8080/changes")),
                    ("CFP_HANDLER_FORMAT", Some("cloudevents")),
                    ("CFP_HANDLER_TIMEOUT", Some("10s")),
                    ("CFP_HANDLER_READINESS_PATH", Some("/ready")),
                    ("CFP_HANDLER_HEADER_X-Tenant", Some("t1")),
                    ("CFP_MAX_ATTEMPTS", Some("3")),
                    ("CFP_INITIAL_BACKOFF", Some("200ms")),
                    ("CFP_MAX_BACKOFF", Some("5s")),
                    ("CFP_ON_EXHAUSTED", Some("dead-letter")),
                    ("CFP_DEAD_LETTER_CONTAINER", Some("poison")),
                    ("CFP_DEAD_LETTER_DATABASE", None),
                ],
            },
            Case {
                name: "in-cluster emulator",
                spec: serde_json::json!({"connection": {"endpoint": "http://cosmos-emulator.dev.svc:8081/", "keySecretRef": {"name": "cosmos"}}}),
                want: &[("AZURE_COSMOS_EMULATOR_HOST", Some("cosmos-emulator.dev.svc"))],
            },
            Case {
                name: "stdout handler defaults",
                spec: serde_json::json!({}),
                want: &[
                    ("CFP_HANDLER_URL", None),
                    ("CFP_MAX_ATTEMPTS", Some("5")),
                    ("CFP_INITIAL_BACKOFF", Some("1s")),
                    ("CFP_MAX_BACKOFF", Some("30s")),
                    ("CFP_ON_EXHAUSTED", Some("halt")),
                    ("CFP_DEAD_LETTER_CONTAINER", None),
                ],
            },
        ];
        for case in cases {
            let env = env_of(&worker_deployment(&resource(case.spec), "img:1", 2));
            for (name, want) in case.want {
                assert_eq!(value(&env, name).as_deref(), *want, "{}: {name}", case.name);
            }
        }
    }

    #[test]
    fn secrets_and_instance_come_from_references() {
        let env = env_of(&worker_deployment(&resource(serde_json::json!({})), "img:1", 1));
        let key = env["CFP_KEY"]
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!((key.name.as_str(), key.key.as_str()), ("cosmos", "key"));
        assert!(env["CFP_KEY"].value.is_none(), "never a literal key");
        let field = |name: &str| {
            let source = env[name].value_from.as_ref().and_then(|v| v.field_ref.as_ref());
            source.map(|f| f.field_path.clone())
        };
        assert_eq!(field("CFP_INSTANCE").as_deref(), Some("metadata.name"));
        assert_eq!(
            field("CFP_POD_UID").as_deref(),
            Some("metadata.uid"),
            "a worker restarted in its pod resumes at once"
        );
    }

    #[test]
    fn auth_modes_table() {
        struct Case {
            name: &'static str,
            spec: serde_json::Value,
            /// (CFP_AUTH, CFP_KEY from a Secret, CFP_LEASE_AUTH, CFP_LEASE_KEY from a Secret)
            want: (Option<&'static str>, bool, Option<&'static str>, bool),
            workload_identity_label: bool,
        }
        let identity =
            serde_json::json!({"endpoint": "https://acct.documents.azure.com:443/", "auth": "WorkloadIdentity"});
        let keyed = serde_json::json!({"endpoint": "https://leases.documents.azure.com:443/", "keySecretRef": {"name": "leases"}});
        let cases = [
            Case {
                name: "key (default)",
                spec: serde_json::json!({}),
                want: (Some("key"), true, None, false),
                workload_identity_label: false,
            },
            Case {
                name: "workload identity",
                spec: serde_json::json!({"connection": identity, "worker": {"serviceAccountName": "orders-identity"}}),
                want: (Some("workload-identity"), false, None, false),
                workload_identity_label: true,
            },
            Case {
                name: "workload identity, lease account with a key",
                spec: serde_json::json!({"connection": identity, "leases": {"connection": keyed}}),
                want: (Some("workload-identity"), false, Some("key"), true),
                workload_identity_label: true,
            },
            Case {
                name: "key, lease account with workload identity",
                spec: serde_json::json!({"leases": {"connection": identity}}),
                want: (Some("key"), true, Some("workload-identity"), false),
                workload_identity_label: true,
            },
        ];
        for case in cases {
            let deployment = worker_deployment(&resource(case.spec), "img:1", 1);
            let env = env_of(&deployment);
            let from_secret = |name: &str| {
                env.get(name)
                    .is_some_and(|e| e.value_from.is_some() && e.value.is_none())
            };
            let got = (
                value(&env, "CFP_AUTH").as_deref().map(str::to_owned),
                from_secret("CFP_KEY"),
                value(&env, "CFP_LEASE_AUTH").as_deref().map(str::to_owned),
                from_secret("CFP_LEASE_KEY"),
            );
            let want = (
                case.want.0.map(str::to_owned),
                case.want.1,
                case.want.2.map(str::to_owned),
                case.want.3,
            );
            assert_eq!(got, want, "{}", case.name);
            assert!(
                !env.contains_key("CFP_KEY") || case.want.1,
                "{}: no key variable",
                case.name
            );
            let template = deployment.spec.unwrap().template;
            let labels = template.metadata.unwrap().labels.unwrap();
            assert_eq!(
                labels.get(WORKLOAD_IDENTITY_LABEL).map(String::as_str),
                case.workload_identity_label.then_some("true"),
                "{}",
                case.name
            );
        }
    }

    #[test]
    fn header_secrets_come_through_secret_key_refs() {
        let spec = serde_json::json!({"handler": {"type": "Http", "http": {"url": "http://localhost:8080/",
            "headers": [{"name": "Authorization", "valueFrom": {"secretKeyRef": {"name": "handler", "key": "token"}}}]}}});
        let env = env_of(&worker_deployment(&resource(spec), "img:1", 1));
        let header = &env["CFP_HANDLER_HEADER_Authorization"];
        assert!(header.value.is_none(), "never a literal secret");
        let reference = header.value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
        assert_eq!((reference.name.as_str(), reference.key.as_str()), ("handler", "token"));
    }

    #[test]
    fn the_pod_template_carries_what_users_need() {
        let spec = serde_json::json!({"worker": {
            "env": [{"name": "APP_MODE", "value": "fast"}, {"name": "CFP_MAX_ITEMS", "value": "1"}],
            "envFrom": [{"configMapRef": {"name": "app"}}],
            "volumes": [{"name": "certs", "secret": {"secretName": "certs"}}],
            "volumeMounts": [{"name": "certs", "mountPath": "/certs", "readOnly": true}],
            "imagePullSecrets": [{"name": "registry"}],
            "labels": {"azure.workload.identity/use": "true", "changefeed.io/processor": "spoofed"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["workers"]}]}]}}},
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"changefeed.io/processor": "orders"}}}],
            "priorityClassName": "changefeed",
            "serviceAccountName": "orders-identity",
            "sidecars": [
                {"name": "handler", "image": "handler:1"},
                {"name": "own", "image": "own:1", "securityContext": {"runAsUser": 1000}}
            ]
        }});
        let deployment = worker_deployment(&resource(spec), "img:1", 2);
        let template = deployment.spec.as_ref().unwrap().template.clone();
        let pod = template.spec.unwrap();
        let worker = &pod.containers[0];
        let env = env_of(&deployment);
        assert_eq!(value(&env, "APP_MODE").as_deref(), Some("fast"));
        assert_eq!(
            value(&env, "CFP_MAX_ITEMS").as_deref(),
            Some("100"),
            "the operator's settings win"
        );
        assert_eq!(
            worker.env_from.as_ref().unwrap()[0]
                .config_map_ref
                .as_ref()
                .unwrap()
                .name,
            "app"
        );
        assert_eq!(worker.volume_mounts.as_ref().unwrap()[0].mount_path, "/certs");
        assert_eq!(pod.volumes.as_ref().unwrap()[0].name, "certs");
        assert_eq!(pod.image_pull_secrets.as_ref().unwrap()[0].name, "registry");
        assert!(pod.affinity.as_ref().unwrap().node_affinity.is_some());
        assert_eq!(pod.topology_spread_constraints.as_ref().unwrap().len(), 1);
        assert_eq!(pod.priority_class_name.as_deref(), Some("changefeed"));
        assert_eq!(pod.service_account_name.as_deref(), Some("orders-identity"));
        let labels = template.metadata.unwrap().labels.unwrap();
        assert_eq!(labels["azure.workload.identity/use"], "true");
        assert_eq!(labels["changefeed.io/processor"], "orders", "the selector labels win");
        let requests = worker.resources.as_ref().unwrap().requests.as_ref().unwrap();
        assert_eq!(
            (requests["cpu"].0.as_str(), requests["memory"].0.as_str()),
            ("100m", "64Mi")
        );
        let handler = pod.init_containers.as_ref().unwrap()[0]
            .security_context
            .as_ref()
            .unwrap();
        assert_eq!(
            handler.run_as_non_root,
            Some(true),
            "sidecars are restricted by default"
        );
        assert_eq!(handler.allow_privilege_escalation, Some(false));
        let own = pod.init_containers.as_ref().unwrap()[1]
            .security_context
            .as_ref()
            .unwrap();
        assert_eq!(
            (own.run_as_user, own.run_as_non_root),
            (Some(1000), None),
            "a sidecar's own context stays"
        );
    }

    #[test]
    fn one_worker_at_a_time_may_be_disrupted() {
        let pdb = worker_disruption_budget(&resource(serde_json::json!({})));
        let spec = pdb.spec.unwrap();
        assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)));
        assert_eq!(spec.min_available, None);
        assert_eq!(
            spec.selector.unwrap().match_labels.unwrap()["changefeed.io/processor"],
            "orders"
        );
        assert_eq!(pdb.metadata.owner_references.unwrap().len(), 1);
    }

    #[test]
    fn pods_are_restricted_and_probed() {
        let deployment = worker_deployment(&resource(serde_json::json!({})), "img:1", 3);
        let spec = deployment.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(3));
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.automount_service_account_token, Some(false));
        let worker = &pod.containers[0];
        assert_eq!(worker.image.as_deref(), Some("img:1"));
        assert_eq!(worker.args.as_deref(), Some(&["worker".to_owned()][..]));
        let sc = worker.security_context.as_ref().unwrap();
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_owned()][..])
        );
        assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
        assert_eq!(
            worker
                .liveness_probe
                .as_ref()
                .unwrap()
                .http_get
                .as_ref()
                .unwrap()
                .path
                .as_deref(),
            Some("/healthz")
        );
        assert_eq!(
            worker
                .readiness_probe
                .as_ref()
                .unwrap()
                .http_get
                .as_ref()
                .unwrap()
                .path
                .as_deref(),
            Some("/readyz")
        );
        let owner = &deployment.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("ChangeFeedProcessor", Some(true))
        );
        let selector = spec.selector.match_labels.as_ref().unwrap();
        let pod_labels = spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        assert!(selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
    }

    #[test]
    fn worker_overrides_apply() {
        let cfp = resource(serde_json::json!({"worker": {
            "image": "mine:2", "nodeSelector": {"pool": "cfp"}, "annotations": {"a": "b"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            "resources": {"limits": {"memory": "64Mi"}},
            "sidecars": [{"name": "handler", "image": "handler:1"}],
            "metricsPort": 9100,
        }}));
        let deployment = worker_deployment(&cfp, "img:1", 1);
        let template = &deployment.spec.as_ref().unwrap().template;
        let pod = template.spec.as_ref().unwrap();
        assert_eq!(pod.containers.len(), 1);
        assert_eq!(pod.containers[0].image.as_deref(), Some("mine:2"));
        let sidecars = pod.init_containers.as_ref().unwrap();
        assert_eq!(sidecars[0].name, "handler");
        assert_eq!(
            sidecars[0].restart_policy.as_deref(),
            Some("Always"),
            "a native sidecar: up before the worker, stopped after it"
        );
        assert_eq!(pod.node_selector.as_ref().unwrap()["pool"], "cfp");
        assert_eq!(pod.tolerations.as_ref().unwrap()[0].key.as_deref(), Some("dedicated"));
        assert_eq!(
            template.metadata.as_ref().unwrap().annotations.as_ref().unwrap()["a"],
            "b"
        );
        // The Secret digest joins the user's annotations (and is absent without one).
        let stamped = with_secrets_digest(deployment.clone(), Some("0123abcd".into()));
        let annotations = stamped
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .unwrap()
            .annotations
            .clone()
            .unwrap();
        assert_eq!(annotations[SECRETS_DIGEST_ANNOTATION], "0123abcd");
        assert_eq!(annotations["a"], "b");
        assert_eq!(with_secrets_digest(deployment.clone(), None), deployment);
        assert!(pod.containers[0].resources.as_ref().unwrap().limits.is_some());
        assert_eq!(pod.containers[0].ports.as_ref().unwrap()[0].container_port, 9100);
        let service = metrics_service(&cfp);
        assert_eq!(service.metadata.name.as_deref(), Some("orders-metrics"));
        assert_eq!(service.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port, 9100);
    }

    proptest::proptest! {
        /// Whatever the spec, the rendered Deployment selects its own pods, runs every container
        /// restricted (non-root, read-only root, no capabilities, no privilege escalation) with
        /// resource requests, takes keys only from Secrets, and runs the replicas asked for.
        #[test]
        fn any_spec_renders_a_restricted_keyless_deployment(
            replicas in 0i32..50,
            max_items in 1i32..10000,
            http in proptest::bool::ANY,
            identity in proptest::bool::ANY,
            lease_account in proptest::bool::ANY,
            sidecars in 0usize..3,
            labels in proptest::collection::btree_map("[a-z]{1,8}", "[a-z0-9]{0,8}", 0..4),
        ) {
            let mut spec = serde_json::json!({"maxItems": max_items, "worker": {"labels": labels}});
            if http {
                spec["handler"] = serde_json::json!({"type": "Http", "http": {"url": "http://localhost:8080/"}});
            }
            if identity {
                spec["connection"] = serde_json::json!({"endpoint": "https://a.documents.azure.com:443/", "auth": "WorkloadIdentity"});
                spec["worker"]["serviceAccountName"] = serde_json::json!("identity");
            }
            if lease_account {
                spec["leases"] = serde_json::json!({"connection": {"endpoint": "https://l.documents.azure.com:443/", "keySecretRef": {"name": "l"}}});
            }
            spec["worker"]["sidecars"] = serde_json::json!((0..sidecars).map(|i| serde_json::json!({"name": format!("side{i}"), "image": "side:1"})).collect::<Vec<_>>());
            let cfp = resource(spec);
            let deployment = worker_deployment(&cfp, "img:1", replicas);
            let deployment_spec = deployment.spec.clone().unwrap();
            proptest::prop_assert_eq!(deployment_spec.replicas, Some(replicas));
            let template = deployment_spec.template;
            let pod_labels = template.metadata.unwrap().labels.unwrap();
            for (key, value) in deployment_spec.selector.match_labels.unwrap() {
                proptest::prop_assert_eq!(pod_labels.get(&key), Some(&value), "selector label {} overridden", key);
            }
            let pod = template.spec.unwrap();
            proptest::prop_assert_eq!(pod.containers.len(), 1);
            let native = pod.init_containers.clone().unwrap_or_default();
            proptest::prop_assert_eq!(native.len(), sidecars);
            proptest::prop_assert!(native.iter().all(|c| c.restart_policy.as_deref() == Some("Always")));
            for container in pod.containers.iter().chain(&native) {
                let security = container.security_context.clone().unwrap_or_default();
                proptest::prop_assert_eq!(security.run_as_non_root, Some(true));
                proptest::prop_assert_eq!(security.read_only_root_filesystem, Some(true));
                proptest::prop_assert_eq!(security.allow_privilege_escalation, Some(false));
                let dropped = security.capabilities.and_then(|c| c.drop).unwrap_or_default();
                proptest::prop_assert!(dropped.contains(&"ALL".to_owned()), "{} keeps capabilities", container.name);
                if container.name == "worker" {
                    proptest::prop_assert!(container.resources.as_ref().and_then(|r| r.requests.as_ref()).is_some());
                }
                for var in container.env.iter().flatten() {
                    if var.name.ends_with("KEY") {
                        proptest::prop_assert!(var.value.is_none(), "{} is a literal", var.name);
                    }
                }
            }
        }
    }
}
