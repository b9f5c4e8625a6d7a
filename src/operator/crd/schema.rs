//! The CRD as YAML (and as the JSON value the Markdown reference walks), without the
//! descriptions inside embedded Kubernetes types, with a size limit on every string, list and map.

use super::ChangeFeedProcessor;

/// The fields of `spec.worker` that embed Kubernetes types.
const EMBEDDED_WORKER_FIELDS: [&str; 10] = [
    "resources",
    "sidecars",
    "tolerations",
    "env",
    "envFrom",
    "volumes",
    "volumeMounts",
    "imagePullSecrets",
    "affinity",
    "topologySpreadConstraints",
];

/// The CRD as YAML (what `cfp crd` prints and `crds/` holds). Descriptions inside embedded
/// Kubernetes types (containers, volumes, affinity, ...) are left out — `kubectl explain pod`
/// has them — so the CRD stays well under the 256 KiB that a client-side `kubectl apply` allows.
pub fn crd_yaml() -> String {
    serde_yaml::to_string(&crd_json()).unwrap_or_default()
}

/// The CRD as a JSON value: the object `crd_yaml` prints and the Markdown reference describes.
pub fn crd_json() -> serde_json::Value {
    use kube::CustomResourceExt;
    let mut crd = serde_json::to_value(ChangeFeedProcessor::crd()).unwrap_or_default();
    if let Some(versions) = crd.pointer_mut("/spec/versions").and_then(|v| v.as_array_mut()) {
        for version in versions {
            if let Some(spec) = version.pointer_mut("/schema/openAPIV3Schema/properties/spec") {
                super::size_limits::bound_sizes(spec);
            }
            let worker = version.pointer_mut("/schema/openAPIV3Schema/properties/spec/properties/worker/properties");
            if let Some(fields) = worker.and_then(|w| w.as_object_mut()) {
                for name in EMBEDDED_WORKER_FIELDS {
                    if let Some(field) = fields.get_mut(name) {
                        strip_nested_descriptions(field);
                    }
                }
            }
        }
    }
    crd
}

/// Removes the descriptions below `schema` (keeping its own).
fn strip_nested_descriptions(schema: &mut serde_json::Value) {
    fn strip(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                map.remove("description");
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    if let Some(map) = schema.as_object_mut() {
        for (key, value) in map.iter_mut() {
            if key != "description" {
                strip(value);
            }
        }
    }
}
