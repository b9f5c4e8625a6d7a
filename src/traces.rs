//! Traces over OpenTelemetry: when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) variable is set, the process's `tracing` spans — acquire
//! cycles, change feed reads, batches, their deliveries and checkpoints — are exported over
//! OTLP/HTTP (protobuf) by a batch exporter on its own thread, and W3C trace context is the
//! propagation format (the HTTP handler's `traceparent`). Without it nothing is set up: no
//! exporter, no thread, no extra work per span.
//!
//! The SDK reads the other standard variables itself: `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`,
//! `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_BSP_SCHEDULE_DELAY`. `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none` turn export off.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// The service name when `OTEL_SERVICE_NAME` is not set.
pub const DEFAULT_SERVICE_NAME: &str = "cfp";

/// Why traces cannot be exported.
#[derive(Debug, thiserror::Error)]
#[error("cannot export traces over OTLP: {0}")]
pub struct TracesError(String);

/// Whether the environment `var` asks for trace export (pure: tested with a table).
pub fn export_wanted(var: impl Fn(&str) -> Option<String>) -> bool {
    let set = |name: &str| var(name).is_some_and(|v| !v.trim().is_empty());
    let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let none = var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
    (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) && !disabled && !none
}

/// The layer that hands a subscriber's spans to the exporter.
pub type OtlpLayer<S> = tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>;

/// The exporter of a process: flushes what is left when dropped or shut down.
pub struct TraceExport {
    provider: SdkTracerProvider,
}

impl TraceExport {
    /// Sets up export from the environment when it asks for it; the layer to add to the
    /// subscriber, and the exporter to shut down at exit.
    pub fn from_env<S>() -> Result<Option<(OtlpLayer<S>, Self)>, TracesError>
    where
        S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    {
        if !export_wanted(|name| std::env::var(name).ok()) {
            return Ok(None);
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
            .map_err(|e| TracesError(e.to_string()))?;
        let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| DEFAULT_SERVICE_NAME.into());
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(service)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        opentelemetry::global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());
        let tracer = provider.tracer("changefeed-operator");
        let layer = tracing_opentelemetry::layer().with_tracer(tracer);
        Ok(Some((layer, Self { provider })))
    }

    /// Exports the spans not sent yet and stops the exporter (blocking; call outside the async
    /// runtime, at exit).
    pub fn shutdown(self) {
        if let Err(error) = self.provider.shutdown() {
            eprintln!("warning: exporting the last traces failed: {error}");
        }
    }
}

/// Which spans are exported: this product's, at `info` (the SDK's own stay out of the trace).
pub fn span_filter() -> tracing_subscriber::filter::Targets {
    tracing_subscriber::filter::Targets::new().with_target("changefeed_operator", tracing::Level::INFO)
}

/// The W3C `traceparent` of the current span, when traces are exported and it is sampled.
pub fn current_traceparent() -> Option<String> {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let context = tracing::Span::current().context();
    let mut carrier = std::collections::HashMap::new();
    opentelemetry::global::get_text_map_propagator(|propagator| propagator.inject_context(&context, &mut carrier));
    carrier.remove("traceparent")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_follows_the_standard_variables() {
        let cases: [(&[(&str, &str)], bool); 7] = [
            (&[], false),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")], true),
            (
                &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:4318/v1/traces")],
                true,
            ),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")], false),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    ("OTEL_SDK_DISABLED", "TRUE"),
                ],
                false,
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    ("OTEL_TRACES_EXPORTER", "none"),
                ],
                false,
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    ("OTEL_TRACES_EXPORTER", "otlp"),
                ],
                true,
            ),
        ];
        for (vars, wanted) in cases {
            let var = |name: &str| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned());
            assert_eq!(export_wanted(var), wanted, "{vars:?}");
        }
    }

    #[test]
    fn without_export_there_is_no_traceparent() {
        assert_eq!(current_traceparent(), None);
    }
}
