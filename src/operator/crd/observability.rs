//! What the workers report beyond their metrics: OpenTelemetry traces.

use kube::KubeSchema;
use serde::Deserialize;
use serde::Serialize;

/// What the workers report beyond their metrics.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Observability {
    /// OpenTelemetry traces of the workers: a span per acquire cycle and change feed read, and
    /// per batch with its delivery and checkpoint as children; an HTTP handler receives the
    /// delivery's W3C `traceparent` (also in each CloudEvent), so its own spans join the batch's
    /// trace. Off without this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracing: Option<TracingSpec>,
}

/// Where and how the workers export traces.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TracingSpec {
    /// The OTLP/HTTP (protobuf) endpoint of a collector, for example
    /// `http://otel-collector.monitoring:4318` (the workers' `OTEL_EXPORTER_OTLP_ENDPOINT`;
    /// spans go to `<endpoint>/v1/traces`). More `OTEL_*` variables go in `worker.env`.
    #[x_kube(validation = kube::core::Rule::new("self.matches('^https?://[^/]+')").message("endpoint must be an http(s) URL such as http://otel-collector.monitoring:4318"))]
    #[schemars(length(max = 2048))]
    pub endpoint: String,
    /// The spans' `service.name` (default: the processor name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub service_name: Option<String>,
    /// The share of traces recorded, 0 to 1 (default: every one); a handler's trace follows the
    /// decision made for its batch (parent-based sampling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub sample_ratio: Option<f64>,
}
