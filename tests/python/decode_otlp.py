"""Decodes OTLP/HTTP trace export requests (protobuf `ExportTraceServiceRequest` bodies, one file
each, named on the command line) with the OpenTelemetry project's own `opentelemetry-proto`
package, and prints their spans as JSON: service, trace and span ids, parent, name, attributes."""
import json
import sys

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


def value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


spans = []
for path in sys.argv[1:]:
    request = ExportTraceServiceRequest()
    with open(path, "rb") as body:
        request.ParseFromString(body.read())
    for resource_spans in request.resource_spans:
        resource = {a.key: value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append({
                    "service": resource.get("service.name"),
                    "traceId": span.trace_id.hex(),
                    "spanId": span.span_id.hex(),
                    "parentSpanId": span.parent_span_id.hex(),
                    "name": span.name,
                    "attributes": {a.key: value(a.value) for a in span.attributes},
                })
print(json.dumps(spans))
