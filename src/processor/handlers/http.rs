//! The HTTP handler: every batch is POSTed to the user's endpoint (usually a sidecar on
//! `localhost`), as plain JSON or as a CloudEvents 1.0 batch. 2xx means handled; anything else, a
//! timeout or a connection error is a failure that the retry policy deals with; `429` and `503`
//! honour `Retry-After`. One pooled keep-alive client (HTTP/1.1, and HTTP/2 over TLS by ALPN).
//!
//! The contract (also in the book: `docs/http-handler.md`):
//! - JSON body: `{"processor", "lease", "feedRange": {"min", "max"}, "batch", "documents": [...]}`,
//!   and in the all-versions-and-deletes mode `"changes": [...]` (same order: `operationType`,
//!   `lsn`, `timestamp`, `previous`, `timeToLiveExpired`).
//! - CloudEvents (`application/cloudevents-batch+json`): one event per document with `id` =
//!   document id + `@` + its `_etag` (stable across redelivery), `source` =
//!   `cosmosdb://{account}/dbs/{database}/colls/{container}`, `type` = [`UPSERT_EVENT_TYPE`],
//!   `subject` = the document id, `time` from `_ts`, `data` = the document, and the extensions
//!   `cfpprocessor`, `cfplease`, `cfpbatch`. In the all-versions-and-deletes mode `type` names the
//!   operation (`io.changefeed.document.created`, `.replaced`, `.deleted`), `id` = document id +
//!   `@` + the change's LSN, `data` = the change (`operationType`, `lsn`, `timestamp`,
//!   `previous`, and `document`), with the extensions `cfpoperation` and `cfplsn`.
//! - Headers: `X-Cfp-Processor`, `X-Cfp-Lease`, `X-Cfp-Batch`, `X-Cfp-Attempt`, plus the
//!   configured ones (their values are never logged); with traces exported, W3C `traceparent`
//!   (the delivery's span: the handler's spans join the batch's trace), also as the
//!   `traceparent` extension of each CloudEvent.

use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use serde_json::{Value, json};
use time::OffsetDateTime;

use crate::cosmos::{Change, Operation};
use crate::processor::handlers::change_handler::{Batch, ChangeHandler, HandlerError};

/// The CloudEvents `type` of a document created or replaced (the latest-version change feed does
/// not tell the two apart).
pub const UPSERT_EVENT_TYPE: &str = "io.changefeed.document.upserted";

/// The CloudEvents `type` prefix of a change in the all-versions-and-deletes mode (`created`,
/// `replaced`, `deleted` follow).
pub const CHANGE_EVENT_TYPE_PREFIX: &str = "io.changefeed.document.";

/// How batches are encoded (`--handler-format json | cloudevents`, `handler.http.format: Json |
/// CloudEvents`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
pub enum HttpFormat {
    /// `{"processor", "lease", "feedRange", "batch", "documents"}` as `application/json`.
    #[default]
    Json,
    /// A CloudEvents 1.0 JSON batch (`application/cloudevents-batch+json`), one event per document.
    #[value(name = "cloudevents")]
    CloudEvents,
}

/// Why an HTTP handler cannot be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum HttpHandlerError {
    /// The URL is not an http(s) URL with a host.
    #[error("handler URL {0} must be an http:// or https:// URL with a host")]
    Url(String),
    /// A header name is not valid in HTTP.
    #[error("{0:?} is not a valid header name")]
    HeaderName(String),
    /// A header value is not valid in HTTP (the value itself is never shown).
    #[error("the value of header {0} is not valid in HTTP")]
    HeaderValue(String),
    /// The readiness path does not make a URL with the handler's.
    #[error("handler readiness path {0:?}: {1}")]
    ReadinessPath(String, url::ParseError),
    /// The HTTP client could not be built.
    #[error("building the HTTP client: {0}")]
    Client(reqwest::Error),
}

/// Where and how the HTTP handler delivers.
#[derive(Clone)]
pub struct HttpHandlerConfig {
    /// The endpoint batches are POSTed to.
    pub url: url::Url,
    /// The body format.
    pub format: HttpFormat,
    /// A request taking longer fails.
    pub timeout: Duration,
    /// Extra headers (for example `Authorization`); values are never logged.
    pub headers: Vec<(String, String)>,
    /// A path on the same host answering 2xx when the handler is ready; without it, the handler is
    /// ready when its host and port accept connections.
    pub readiness_path: Option<String>,
    /// The CloudEvents `source`: `cosmosdb://{account}/dbs/{database}/colls/{container}`.
    pub source: String,
}

impl std::fmt::Debug for HttpHandlerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let header_names: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("HttpHandlerConfig")
            .field("url", &self.url.as_str())
            .field("format", &self.format)
            .field("timeout", &self.timeout)
            .field("headers", &header_names)
            .field("readiness_path", &self.readiness_path)
            .finish()
    }
}

/// POSTs every batch to an HTTP endpoint.
pub struct HttpHandler {
    client: reqwest::Client,
    config: HttpHandlerConfig,
    readiness_url: Option<url::Url>,
}

impl HttpHandler {
    /// A handler for `config`; fails on an unusable URL or header.
    pub fn new(config: HttpHandlerConfig) -> Result<Self, HttpHandlerError> {
        if !matches!(config.url.scheme(), "http" | "https") || config.url.host_str().is_none() {
            return Err(HttpHandlerError::Url(config.url.to_string()));
        }
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let header =
                HeaderName::from_bytes(name.as_bytes()).map_err(|_| HttpHandlerError::HeaderName(name.clone()))?;
            let mut value = HeaderValue::from_str(value).map_err(|_| HttpHandlerError::HeaderValue(name.clone()))?;
            value.set_sensitive(true);
            headers.insert(header, value);
        }
        let readiness_url = match &config.readiness_path {
            Some(path) => Some(
                config
                    .url
                    .join(path)
                    .map_err(|e| HttpHandlerError::ReadinessPath(path.clone(), e))?,
            ),
            None => None,
        };
        let client = reqwest::Client::builder()
            // A 3xx has not handled the batch: followed, a 302 would turn the POST into a GET
            // without the documents, whose 2xx would checkpoint them unseen.
            .redirect(reqwest::redirect::Policy::none())
            .default_headers(headers)
            .timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(10)))
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .map_err(HttpHandlerError::Client)?;
        Ok(Self {
            client,
            config,
            readiness_url,
        })
    }

    fn body(&self, batch: &Batch<'_>, traceparent: Option<&str>) -> (Vec<u8>, &'static str) {
        let body = match self.config.format {
            HttpFormat::Json => json!({
                "processor": batch.processor,
                "lease": batch.lease_token,
                "feedRange": {"min": batch.feed_range.min, "max": batch.feed_range.max},
                "batch": batch.batch_id,
                "documents": batch.documents,
            }),
            HttpFormat::CloudEvents => Value::Array(
                batch
                    .documents
                    .iter()
                    .enumerate()
                    .map(|(i, document)| {
                        let mut event = cloud_event(document, batch.changes.get(i), &self.config.source, batch);
                        // The CloudEvents distributed-tracing extension.
                        if let (Some(map), Some(traceparent)) = (event.as_object_mut(), traceparent) {
                            map.insert("traceparent".into(), Value::String(traceparent.to_owned()));
                        }
                        event
                    })
                    .collect(),
            ),
        };
        let body = match body {
            Value::Object(mut map) if !batch.changes.is_empty() => {
                map.insert("changes".into(), json!(batch.changes));
                Value::Object(map)
            }
            other => other,
        };
        let content_type = match self.config.format {
            HttpFormat::Json => "application/json",
            HttpFormat::CloudEvents => "application/cloudevents-batch+json",
        };
        (serde_json::to_vec(&body).unwrap_or_default(), content_type)
    }
}

/// One document as a CloudEvent (with its `change` in the all-versions-and-deletes mode).
pub fn cloud_event(document: &Value, change: Option<&Change>, source: &str, batch: &Batch<'_>) -> Value {
    let id = document.get("id").and_then(Value::as_str).unwrap_or_default();
    let version = change
        .and_then(|c| c.lsn)
        .map(|lsn| format!("lsn{lsn}"))
        .or_else(|| {
            document
                .get("_etag")
                .and_then(Value::as_str)
                .map(|etag| etag.trim_matches('"').to_owned())
        })
        .or_else(|| document.get("_lsn").map(|lsn| lsn.to_string()))
        .or_else(|| document.get("_ts").map(|ts| ts.to_string()))
        .unwrap_or_default();
    let (kind, data) = match change {
        Some(change) => (
            format!("{CHANGE_EVENT_TYPE_PREFIX}{}", past_tense(change)),
            change.with_document(document),
        ),
        None => (UPSERT_EVENT_TYPE.to_owned(), document.clone()),
    };
    let mut event = json!({
        "specversion": "1.0",
        "id": format!("{id}@{version}"),
        "source": source,
        "type": kind,
        "subject": id,
        "datacontenttype": "application/json",
        "cfpprocessor": batch.processor,
        "cfplease": batch.lease_token,
        "cfpbatch": batch.batch_id,
        "data": data,
    });
    let seconds = change
        .and_then(|c| c.timestamp)
        .and_then(|t| i64::try_from(t).ok())
        .or_else(|| document.get("_ts").and_then(Value::as_i64));
    let time = seconds
        .and_then(|ts| OffsetDateTime::from_unix_timestamp(ts).ok())
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok());
    if let Some(map) = event.as_object_mut() {
        if let Some(time) = time {
            map.insert("time".into(), Value::String(time));
        }
        if let Some(change) = change {
            map.insert("cfpoperation".into(), Value::String(change.operation_name().into()));
            if let Some(lsn) = change.lsn {
                map.insert("cfplsn".into(), Value::String(lsn.to_string()));
            }
        }
    }
    event
}

/// `created`, `replaced`, `deleted` (or `changed`).
fn past_tense(change: &Change) -> &'static str {
    match change.operation_type {
        Operation::Create => "created",
        Operation::Replace => "replaced",
        Operation::Delete => "deleted",
        Operation::Unknown => "changed",
    }
}

/// The delay a `Retry-After` header asks for: seconds, or an HTTP date.
pub fn retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = OffsetDateTime::parse(value, &time::format_description::well_known::Rfc2822).ok()?;
    let wait = at - OffsetDateTime::now_utc();
    Some(Duration::try_from(wait).unwrap_or(Duration::ZERO))
}

#[async_trait]
impl ChangeHandler for HttpHandler {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        let traceparent = crate::traces::current_traceparent();
        let (body, content_type) = self.body(&batch, traceparent.as_deref());
        let mut request = self.client.post(self.config.url.clone());
        if let Some(traceparent) = &traceparent {
            request = request.header("traceparent", traceparent);
        }
        let response = request
            .header(CONTENT_TYPE, content_type)
            .header("x-cfp-processor", batch.processor)
            .header("x-cfp-lease", batch.lease_token)
            .header("x-cfp-batch", batch.batch_id)
            .header("x-cfp-attempt", batch.attempt.to_string())
            .body(body)
            .send()
            .await
            .map_err(|e| {
                if e.is_timeout() {
                    HandlerError::new(format!(
                        "POST {} timed out after {:?}",
                        self.config.url, self.config.timeout
                    ))
                } else {
                    HandlerError::new(format!("POST {}: {}", self.config.url, error_chain(&e)))
                }
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let wait = (status.as_u16() == 429 || status.as_u16() == 503)
            .then(|| response.headers().get(RETRY_AFTER)?.to_str().ok().and_then(retry_after))
            .flatten();
        let snippet = body_prefix(response).await;
        let message = format!("POST {} answered {status}: {}", self.config.url, snippet.trim());
        Err(match wait {
            Some(delay) => HandlerError::retry_after(message, delay),
            None => HandlerError::new(message),
        })
    }

    fn time_limit(&self) -> Option<Duration> {
        Some(self.config.timeout)
    }

    async fn ready(&self) -> bool {
        match &self.readiness_url {
            Some(url) => self
                .client
                .get(url.clone())
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success()),
            None => {
                let Ok(addresses) = self.config.url.socket_addrs(|| None) else {
                    return false;
                };
                let connect = async {
                    for address in addresses {
                        if tokio::net::TcpStream::connect(address).await.is_ok() {
                            return true;
                        }
                    }
                    false
                };
                tokio::time::timeout(Duration::from_secs(2), connect)
                    .await
                    .unwrap_or(false)
            }
        }
    }
}

/// How much of an error reply's body is read (for the log line): the rest is never read.
pub const ERROR_BODY_PREFIX: usize = 1024;

/// The first characters of an error reply's body (at most [`ERROR_BODY_PREFIX`] bytes read, 200
/// characters kept). The response is dropped with the rest unread, which closes its connection:
/// a handler answering with a huge body costs the worker a kilobyte, not the body.
async fn body_prefix(mut response: reqwest::Response) -> String {
    let mut read: Vec<u8> = Vec::new();
    while read.len() < ERROR_BODY_PREFIX {
        match response.chunk().await {
            Ok(Some(chunk)) => read.extend_from_slice(&chunk[..chunk.len().min(ERROR_BODY_PREFIX - read.len())]),
            Ok(None) | Err(_) => break,
        }
    }
    drop(response);
    String::from_utf8_lossy(&read).chars().take(200).collect()
}

/// An error with its causes, on one line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cosmos::EpkRange;

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        assert_eq!(retry_after("1"), Some(Duration::from_secs(1)));
        assert_eq!(retry_after(" 120 "), Some(Duration::from_secs(120)));
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(Duration::ZERO),
            "in the past: at once"
        );
        assert_eq!(retry_after("soon"), None);
    }

    #[test]
    fn cloud_events_are_stable_per_document_version() {
        let range = EpkRange::full();
        let batch = Batch {
            processor: "orders",
            lease_token: "-FF",
            feed_range: &range,
            batch_id: "b1",
            attempt: 1,
            documents: &[],
            changes: &[],
        };
        let doc = json!({"id": "o-1", "_etag": "\"0a00\"", "_ts": 1_700_000_000, "total": 5});
        let event = cloud_event(&doc, None, "cosmosdb://acct/dbs/shop/colls/orders", &batch);
        assert_eq!(event["id"], "o-1@0a00");
        assert_eq!(event["specversion"], "1.0");
        assert_eq!(event["type"], UPSERT_EVENT_TYPE);
        assert_eq!(event["subject"], "o-1");
        assert_eq!(event["time"], "2023-11-14T22:13:20Z");
        assert_eq!(event["data"]["total"], 5);
        let again = Batch {
            attempt: 3,
            batch_id: "b1",
            ..batch
        };
        assert_eq!(cloud_event(&doc, None, "s", &again)["id"], event["id"]);
        // All versions and deletes: the event names the operation and carries the change.
        let deleted = Change {
            operation_type: Operation::Delete,
            lsn: Some(42),
            timestamp: Some(1_700_000_100),
            previous: Some(doc.clone()),
            time_to_live_expired: false,
        };
        let identity = json!({"id": "o-1", "_partitionKey": ["shop"]});
        let event = cloud_event(&identity, Some(&deleted), "s", &batch);
        assert_eq!(event["type"], "io.changefeed.document.deleted");
        assert_eq!(event["id"], "o-1@lsn42");
        assert_eq!(event["cfpoperation"], "delete");
        assert_eq!(event["cfplsn"], "42");
        assert_eq!(event["time"], "2023-11-14T22:15:00Z");
        assert_eq!(event["data"]["previous"]["total"], 5);
        assert_eq!(event["data"]["document"], identity);
    }

    #[test]
    fn header_values_are_checked_and_never_shown() {
        let config = HttpHandlerConfig {
            url: "http://localhost:8080/changes".parse().unwrap(),
            format: HttpFormat::Json,
            timeout: Duration::from_secs(1),
            headers: vec![("Authorization".into(), "Bearer s3cret".into())],
            readiness_path: Some("/healthz".into()),
            source: "s".into(),
        };
        assert!(!format!("{config:?}").contains("s3cret"));
        let handler = HttpHandler::new(config.clone()).unwrap();
        assert_eq!(handler.readiness_url.unwrap().as_str(), "http://localhost:8080/healthz");
        let bad = HttpHandlerConfig {
            headers: vec![("Bad Name".into(), "x".into())],
            ..config.clone()
        };
        assert!(
            HttpHandler::new(bad)
                .err()
                .is_some_and(|e| e.to_string().contains("not a valid header name"))
        );
        let ftp = HttpHandlerConfig {
            url: "ftp://host/x".parse().unwrap(),
            ..config
        };
        assert!(HttpHandler::new(ftp).is_err());
    }

    #[test]
    fn the_json_body_carries_changes_only_in_the_all_versions_mode() {
        let config = HttpHandlerConfig {
            url: "http://localhost:8080/changes".parse().unwrap(),
            format: HttpFormat::Json,
            timeout: Duration::from_secs(1),
            headers: Vec::new(),
            readiness_path: None,
            source: "s".into(),
        };
        let handler = HttpHandler::new(config).unwrap();
        let range = EpkRange::full();
        let documents = [json!({"id": "a", "v": 2})];
        let changes = [Change {
            operation_type: Operation::Replace,
            lsn: Some(8),
            timestamp: Some(1_700_000_001),
            previous: Some(json!({"id": "a", "v": 1})),
            time_to_live_expired: false,
        }];
        let latest = Batch {
            processor: "p",
            lease_token: "-FF",
            feed_range: &range,
            batch_id: "b",
            attempt: 1,
            documents: &documents,
            changes: &[],
        };
        let body = |batch: &Batch<'_>| serde_json::from_slice::<Value>(&handler.body(batch, None).0).unwrap();
        assert!(body(&latest).get("changes").is_none());
        let all = Batch {
            changes: &changes,
            ..latest
        };
        let json = body(&all);
        assert_eq!(json["changes"][0]["operationType"], "replace");
        assert_eq!(json["changes"][0]["previous"]["v"], 1);
        assert_eq!(json["documents"][0]["v"], 2);
    }
}
