//! Overrides for the worker pods (image, resources, scheduling, sidecars, volumes).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Affinity;
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::api::core::v1::EnvFromSource;
use k8s_openapi::api::core::v1::EnvVar;
use k8s_openapi::api::core::v1::LocalObjectReference;
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::api::core::v1::TopologySpreadConstraint;
use k8s_openapi::api::core::v1::Volume;
use k8s_openapi::api::core::v1::VolumeMount;
use k8s_openapi::api::networking::v1::{NetworkPolicyEgressRule, NetworkPolicyPeer};
use kube::KubeSchema;
use serde::Deserialize;
use serde::Serialize;

/// Overrides for the worker pods.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkerTemplate {
    /// The worker image (default: the operator's `--worker-image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub image: Option<String>,
    /// The image pull policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub image_pull_policy: Option<String>,
    /// Compute resources of the worker container (default: requests of 100m CPU and 64Mi memory,
    /// so that workers are not BestEffort).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Extra containers in each worker pod, for example the user's handler service. They run as
    /// native sidecars (init containers with `restartPolicy: Always`, Kubernetes 1.29+): started
    /// and ready before the worker, stopped only after it exited, so a batch in flight during a
    /// stop still reaches its handler. Those without a securityContext get the worker's
    /// restricted one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub sidecars: Vec<Container>,
    /// Node labels the worker pods must run on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 32))]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the worker pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub tolerations: Vec<Toleration>,
    /// Annotations added to the worker pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub annotations: BTreeMap<String, String>,
    /// Labels added to the worker pods (for example `azure.workload.identity/use: "true"`); the
    /// operator's own selector labels win.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub labels: BTreeMap<String, String>,
    /// Service account of the worker pods, for example one federated for workload identity (its
    /// API token is not mounted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub service_account_name: Option<String>,
    /// Extra environment variables of the worker container (the operator's `CFP_*` win).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub env: Vec<EnvVar>,
    /// Environment variables of the worker container from ConfigMaps or Secrets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub env_from: Vec<EnvFromSource>,
    /// Volumes of the worker pods (for the worker's `volumeMounts` and the sidecars').
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub volumes: Vec<Volume>,
    /// Volume mounts of the worker container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub volume_mounts: Vec<VolumeMount>,
    /// Secrets to pull the worker and sidecar images.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Affinity of the worker pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// How the worker pods spread over zones and nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// Priority class of the worker pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub priority_class_name: Option<String>,
    /// How long a stopping worker pod may take (default: the HTTP handler's `timeout` plus 30 s
    /// to checkpoint and release its leases; 30 s with the stdout handler): a stop never cuts
    /// off a batch the handler is still working on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub termination_grace_period_seconds: Option<i64>,
    /// Port of the worker's /metrics, /healthz and /readyz.
    #[serde(default = "default_metrics_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub metrics_port: i32,
    /// A NetworkPolicy for the worker pods, rendered by the operator (off by default; needs a
    /// network plugin that enforces NetworkPolicies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<WorkerNetworkPolicy>,
}

/// The worker pods' NetworkPolicy: ingress to the metrics port; egress to DNS, to Cosmos DB on the
/// ports of the account endpoints (`connection.endpoint`, `leases.connection.endpoint`) and to the
/// HTTP handler on the port of `handler.http.url` (none for a handler on localhost: a sidecar).
/// Every other connection of the worker pods is refused.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct WorkerNetworkPolicy {
    /// Render the NetworkPolicy (`false`: none; one rendered before is deleted).
    #[serde(default)]
    pub enabled: bool,
    /// Where Cosmos DB may be reached: CIDRs (default: anywhere, on the endpoints' ports only).
    /// With workload identity, Microsoft Entra ID is reached through the same CIDRs on 443.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub cosmos_cidrs: Vec<String>,
    /// Where the HTTP handler may be reached: CIDRs (default: anywhere, on its URL's port only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub handler_cidrs: Vec<String>,
    /// Who may reach the metrics port (NetworkPolicy peers; default: anyone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub metrics_from: Vec<NetworkPolicyPeer>,
    /// More egress of the worker pods, for example what a handler sidecar calls: the policy
    /// covers every container of the pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub extra_egress: Vec<NetworkPolicyEgressRule>,
}

fn default_metrics_port() -> i32 {
    9090
}

impl Default for WorkerTemplate {
    fn default() -> Self {
        Self {
            image: None,
            image_pull_policy: None,
            resources: None,
            sidecars: Vec::new(),
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            annotations: BTreeMap::new(),
            labels: BTreeMap::new(),
            service_account_name: None,
            env: Vec::new(),
            env_from: Vec::new(),
            volumes: Vec::new(),
            volume_mounts: Vec::new(),
            image_pull_secrets: Vec::new(),
            affinity: None,
            topology_spread_constraints: Vec::new(),
            priority_class_name: None,
            termination_grace_period_seconds: None,
            metrics_port: default_metrics_port(),
            network_policy: None,
        }
    }
}
