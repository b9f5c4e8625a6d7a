//! Traces across the handoff to user code: a `cfp worker` with the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` exports its spans over OTLP/HTTP, decoded here by a client
//! nobody here wrote (the OpenTelemetry project's `opentelemetry-proto` Python package): each
//! batch is a child of the read that brought it, its delivery and checkpoint are the batch's
//! children, and the handler receives the delivery's W3C `traceparent` (as a header, and as the
//! CloudEvents distributed-tracing extension of every event) — one trace from the change to the
//! user's code.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::common::{self, eventually};

/// One request a recorder received: path, headers, body.
type Recorded = (String, BTreeMap<String, String>, bytes::Bytes);

/// An HTTP endpoint that answers 200 to everything and records what it got; its URL.
async fn recorder(content_type: &'static str) -> (String, Arc<Mutex<Vec<Recorded>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen: Arc<Mutex<Vec<Recorded>>> = Arc::default();
    let sink = seen.clone();
    tokio::spawn(changefeed_operator::http_server::serve(
        listener,
        tokio_util::sync::CancellationToken::new(),
        move |req: hyper::Request<hyper::body::Incoming>| {
            let sink = sink.clone();
            async move {
                let path = req.uri().path().to_owned();
                let headers = req
                    .headers()
                    .iter()
                    .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or_default().to_owned()))
                    .collect();
                let body = common::body_of(req).await;
                sink.lock().unwrap().push((path, headers, body));
                changefeed_operator::http_server::response(200, content_type, bytes::Bytes::new())
            }
        },
    ));
    (url, seen)
}

/// The spans of the recorded OTLP requests, decoded by `tests/python/decode_otlp.py`.
fn decoded(requests: &[Recorded]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<String> = requests
        .iter()
        .enumerate()
        .filter(|(_, (path, ..))| path == "/v1/traces")
        .map(|(i, (_, _, body))| {
            let file = dir.path().join(format!("{i}.pb"));
            std::fs::write(&file, body).unwrap();
            file.display().to_string()
        })
        .collect();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/decode_otlp.py");
    let output = std::process::Command::new("python3")
        .arg(script)
        .args(&files)
        .output()
        .expect("run python3 (pip install opentelemetry-proto)");
    assert!(
        output.status.success(),
        "decode_otlp.py: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice::<Vec<Value>>(&output.stdout).unwrap()
}

/// `cfp worker` of `processor` delivering over HTTP to `handler`, with `extra` flags.
fn http_worker(endpoint: &str, processor: &str, handler: &str, extra: &[&str]) -> tokio::process::Command {
    let mut command = common::cfp_worker(endpoint);
    command
        .args([
            "--processor",
            processor,
            "--handler",
            "http",
            "--poll-interval",
            "100ms",
        ])
        .args(["--handler-url", &format!("{handler}/changes")])
        .args(extra)
        .args(common::FAST_LEASES);
    command
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_its_delivery_and_the_handler_share_one_trace_decoded_by_the_otlp_reference_package() {
    let (mut emulator, endpoint) = common::start_emulator("db/items:/pk:1").await;
    let (collector, exported) = recorder("application/x-protobuf").await;
    let (handler, handled) = recorder("application/json").await;
    let mut worker = http_worker(&endpoint, "traced", &handler, &["--handler-format", "cloudevents"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector)
        .env("OTEL_SERVICE_NAME", "cfp-traced")
        .env("OTEL_BSP_SCHEDULE_DELAY", "200")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    common::cfp_write(&endpoint, 0, 20).await;
    let delivered = eventually(Duration::from_secs(30), || async {
        let handled = handled.lock().unwrap();
        let events: usize = handled
            .iter()
            .filter_map(|(_, _, body)| serde_json::from_slice::<Vec<Value>>(body).ok())
            .map(|events| events.len())
            .sum();
        events >= 20
    })
    .await;
    assert!(delivered, "the handler did not receive 20 events");
    // A graceful stop flushes the exporter.
    common::terminate(&mut worker).await;
    let spans = decoded(&exported.lock().unwrap());
    let (posts, _) = (handled.lock().unwrap().clone(), ());
    let (_, headers, body) = &posts[0];
    let traceparent = headers.get("traceparent").cloned().unwrap_or_default();
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "traceparent {traceparent:?}");
    let (trace, parent) = (parts[1], parts[2]);
    let deliver = spans
        .iter()
        .find(|s| s["name"] == "deliver" && s["spanId"] == parent)
        .unwrap_or_else(|| panic!("no deliver span {parent} among {} spans", spans.len()));
    let batch = spans
        .iter()
        .find(|s| s["spanId"] == deliver["parentSpanId"])
        .expect("the delivery's parent");
    let read = spans
        .iter()
        .find(|s| s["spanId"] == batch["parentSpanId"])
        .expect("the batch's parent");
    println!(
        "{} spans exported ({} reads, {} batches, {} deliveries, {} checkpoints, {} acquire cycles); the handler's traceparent {traceparent}",
        spans.len(),
        named(&spans, "read").len(),
        named(&spans, "batch").len(),
        named(&spans, "deliver").len(),
        named(&spans, "checkpoint").len(),
        named(&spans, "acquire_cycle").len()
    );
    assert_eq!(
        (batch["name"].as_str(), read["name"].as_str()),
        (Some("batch"), Some("read"))
    );
    for span in [deliver, batch, read] {
        assert_eq!(span["traceId"], trace, "one trace: {span}");
        assert_eq!(span["service"], "cfp-traced");
    }
    assert_eq!(batch["attributes"]["processor"], "traced");
    assert_eq!(batch["attributes"]["lease"], read["attributes"]["lease"]);
    assert_eq!(batch["attributes"]["batch"], headers["x-cfp-batch"].as_str());
    assert_eq!(deliver["attributes"]["attempt"], 1);
    let documents = batch["attributes"]["documents"].as_i64().unwrap_or_default();
    assert_eq!(deliver["attributes"]["documents"].as_i64(), Some(documents));
    let events: Vec<Value> = serde_json::from_slice(body).unwrap();
    assert_eq!(events.len() as i64, documents);
    assert!(
        events.iter().all(|e| e["traceparent"] == traceparent.as_str()),
        "CloudEvents traceparent"
    );
    let checkpoint = named(&spans, "checkpoint")
        .into_iter()
        .find(|s| s["parentSpanId"] == batch["spanId"]);
    assert!(checkpoint.is_some(), "no checkpoint span under the batch");
    assert!(!named(&spans, "acquire_cycle").is_empty());
    common::terminate(&mut emulator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_otlp_variables_nothing_is_exported_and_no_traceparent_is_sent() {
    let (mut emulator, endpoint) = common::start_emulator("db/items:/pk:1").await;
    let (handler, handled) = recorder("application/json").await;
    let mut worker = http_worker(&endpoint, "untraced", &handler, &[])
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    common::cfp_write(&endpoint, 0, 5).await;
    let delivered = eventually(Duration::from_secs(30), || async {
        !handled.lock().unwrap().is_empty()
    })
    .await;
    assert!(delivered, "nothing delivered");
    let posts = handled.lock().unwrap().clone();
    assert!(posts.iter().all(|(_, headers, _)| !headers.contains_key("traceparent")));
    common::terminate(&mut worker).await;
    common::terminate(&mut emulator).await;
}
