//! The emulator's HTTP face: serving the account on a listener, refusing what the service
//! refuses (credentials, metadata writes to Entra tokens), forwarding the rest to the SDK's
//! in-memory emulator, and the `/_emulator/*` control endpoints (faults, splits, containers).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::*;

impl Emulator {
    /// Serves this account over HTTP on `listener` until `shutdown` is cancelled.
    pub async fn serve(&self, listener: TcpListener, shutdown: CancellationToken) {
        let emulator = self.clone();
        crate::http_server::serve(listener, shutdown, move |req| {
            let emulator = emulator.clone();
            async move { emulator.handle(req).await }
        })
        .await;
    }

    async fn handle(&self, req: hyper::Request<Incoming>) -> hyper::Response<Full<Bytes>> {
        let path = req.uri().path().to_owned();
        if let Some(control) = path.strip_prefix("/_emulator/") {
            let control = control.trim_end_matches('/').to_owned();
            let query = req.uri().query().unwrap_or_default().to_owned();
            return self.control(req.method().clone(), &control, &query).await;
        }
        let delay = self.faults.delay();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if let Some(fault) = self.faults.next() {
            return fault.response();
        }
        let resolved = self.resolve(&path).await;
        if req.headers().contains_key("a-im")
            && let Some(partition) = req
                .headers()
                .get("x-ms-documentdb-partitionkeyrangeid")
                .and_then(|v| v.to_str().ok())
        {
            self.hangs.wait(partition, &format!("/{}", resolved.path)).await;
        }
        if let Some(refusal) = self.refuse_unauthorized(&req, &resolved) {
            tracing::debug!(method = %req.method(), path, status = 401, "request refused");
            return refusal;
        }
        if let Some(refusal) = self.refuse_metadata_write(req.method().as_str(), &resolved) {
            tracing::debug!(method = %req.method(), path, status = 403, "metadata write refused");
            return refusal;
        }
        let method = req.method().clone();
        let response = match self.forward(req, &resolved).await {
            Ok(response) => response,
            Err(error) => crate::http_server::json(
                503,
                &serde_json::json!({"code": "ServiceUnavailable", "message": error.to_string()}),
            ),
        };
        tracing::debug!(%method, path, status = response.status().as_u16(), "request");
        response
    }

    /// The 401 the service answers for a request its authorization does not cover.
    fn refuse_unauthorized(
        &self,
        req: &hyper::Request<Incoming>,
        resolved: &addressing::ResolvedPath,
    ) -> Option<hyper::Response<Full<Bytes>>> {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
        };
        let auth = self.auth.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        auth.refuse(&auth::SignedRequest {
            method: req.method().as_str(),
            path: req.uri().path(),
            signed_rid: resolved.signed_rid.as_deref(),
            authorization: header("authorization"),
            date: header("x-ms-date"),
        })
    }

    /// Resolves a request path addressed by resource id to names, listing the databases or
    /// containers first when an id is not known yet.
    async fn resolve(&self, path: &str) -> addressing::ResolvedPath {
        // At most two listings: the databases, then the containers of one.
        for _ in 0..2 {
            let Some(missing) = self.ids.missing(path) else { break };
            let learned = match missing {
                None => self.get("dbs").await.map(|(_, body)| {
                    self.ids.learn_databases(addressing::rid_pairs(&body, "Databases"));
                }),
                Some(database) => self.get(&format!("dbs/{database}/colls")).await.map(|(_, body)| {
                    self.ids
                        .learn_containers(&database, addressing::rid_pairs(&body, "DocumentCollections"));
                }),
            };
            if let Err(error) = learned {
                tracing::debug!(%error, path, "cannot list resources to resolve an id");
                break;
            }
        }
        self.ids.resolve(path)
    }

    /// Passes a Cosmos REST request to the in-memory store.
    async fn forward(
        &self,
        req: hyper::Request<Incoming>,
        resolved: &addressing::ResolvedPath,
    ) -> Result<hyper::Response<Full<Bytes>>, CosmosError> {
        let (parts, body) = req.into_parts();
        // Cosmos DB refuses requests over a few MiB; never buffer an unbounded body.
        let body = match http_body_util::Limited::new(body, MAX_REQUEST_BODY).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return Ok(crate::http_server::json(
                    413,
                    &serde_json::json!({
                        "code": "RequestEntityTooLarge",
                        "message": format!("request body larger than {} MiB", MAX_REQUEST_BODY / (1024 * 1024)),
                    }),
                ));
            }
            Err(e) => {
                return Err(CosmosError::local(
                    ErrorKind::Transient,
                    format!("reading request body: {e}"),
                ));
            }
        };
        let mut url = self.gateway.clone();
        // Names, without the trailing slash the Python SDK sends (the store expects none).
        url.set_path(&format!("/{}", resolved.path));
        url.set_query(parts.uri.query());
        let method: Method =
            parts.method.as_str().parse().map_err(|_| {
                CosmosError::local(ErrorKind::BadRequest, format!("unsupported method {}", parts.method))
            })?;
        let mut request = Request::new(url, method);
        for (name, value) in &parts.headers {
            // The Java SDK sends an empty continuation on a query's first page; the service
            // treats it as none.
            if name.as_str() == "x-ms-continuation" && value.is_empty() {
                continue;
            }
            if let Ok(value) = value.to_str() {
                request.insert_header(name.as_str().to_owned(), value.to_owned());
            }
        }
        request.set_body(body.to_vec());
        let reply = self.edge.execute(request).await?;
        let mut builder = hyper::Response::builder().status(u16::from(reply.status));
        for (name, value) in reply.headers.iter() {
            builder = builder.header(name.as_str(), value.as_str());
        }
        if let Some(owner) = &resolved.owner {
            builder = builder.header("x-ms-alt-content-path", owner.as_str());
        }
        builder
            .body(Full::new(reply.body))
            .map_err(|e| CosmosError::local(ErrorKind::Other, format!("building response: {e}")))
    }

    /// The fault-injection endpoints; `None` for other actions.
    fn fault_control(
        &self,
        method: &hyper::Method,
        action: &str,
        params: &std::collections::HashMap<String, String>,
    ) -> Option<hyper::Response<Full<Bytes>>> {
        let bad = |message: String| crate::http_server::json(400, &serde_json::json!({ "message": message }));
        match (method, action) {
            (&hyper::Method::POST, "faults") => {
                let rate = params.get("rate").map_or(Ok(0.1), |r| r.parse::<f64>());
                let kinds: Option<Vec<Fault>> = params
                    .get("kinds")
                    .map_or("429,503,408", String::as_str)
                    .split(',')
                    .map(Fault::parse)
                    .collect();
                let latency = params.get("latencyMs").map_or(Ok(0), |ms| ms.parse::<u64>());
                match (rate, kinds, latency) {
                    (Ok(rate), Some(kinds), Ok(latency)) if (0.0..=1.0).contains(&rate) => {
                        self.faults.configure(rate, kinds);
                        self.faults.slow_down(Duration::from_millis(latency));
                    }
                    _ => {
                        return Some(bad(
                            "rate must be 0..1, kinds a list of 429, 503, 408, reset and latencyMs a number of milliseconds"
                                .into(),
                        ));
                    }
                }
            }
            (&hyper::Method::POST, "outage") => match params.get("ms").and_then(|ms| ms.parse::<u64>().ok()) {
                Some(ms) => self.faults.outage(Duration::from_millis(ms)),
                None => return Some(bad("ms (the outage's length in milliseconds) is required".into())),
            },
            (&hyper::Method::DELETE, "faults") => self.faults.clear(),
            (&hyper::Method::GET, "faults") => {}
            _ => return None,
        }
        Some(crate::http_server::json(200, &self.faults.report()))
    }

    /// `/_emulator/hang`: change feed reads of a partition that never return.
    fn hang_control(
        &self,
        method: &hyper::Method,
        action: &str,
        params: &std::collections::HashMap<String, String>,
    ) -> Option<hyper::Response<Full<Bytes>>> {
        match (method, action) {
            (&hyper::Method::POST, "hang") => match params.get("partition") {
                Some(partition) => self.hangs.hang(partition, params.get("container").map(String::as_str)),
                None => {
                    let message = "partition (a physical partition id, see /_emulator/ranges) is required";
                    return Some(crate::http_server::json(
                        400,
                        &serde_json::json!({ "message": message }),
                    ));
                }
            },
            (&hyper::Method::DELETE, "hang") => self.hangs.lift(),
            (&hyper::Method::GET, "hang") => {}
            _ => return None,
        }
        Some(crate::http_server::json(200, &self.hangs.report()))
    }

    async fn control(&self, method: hyper::Method, action: &str, query: &str) -> hyper::Response<Full<Bytes>> {
        let params: std::collections::HashMap<String, String> =
            url::form_urlencoded::parse(query.as_bytes()).into_owned().collect();
        if let Some(response) = self.fault_control(&method, action, &params) {
            return response;
        }
        if let Some(response) = self.hang_control(&method, action, &params) {
            return response;
        }
        if (&method, action) == (&hyper::Method::POST, "key") {
            let value = params.get("value").map(String::as_str).unwrap_or_default();
            return match self.regenerate_key(value) {
                Ok(()) => {
                    tracing::info!("account key regenerated");
                    crate::http_server::json(200, &serde_json::json!({"message": "key regenerated"}))
                }
                Err(error) => crate::http_server::json(409, &serde_json::json!({ "message": error.to_string() })),
            };
        }
        let (Some(database), Some(container)) = (params.get("database"), params.get("container")) else {
            return crate::http_server::json(
                400,
                &serde_json::json!({"message": "database and container are required"}),
            );
        };
        let result = match (method, action) {
            (hyper::Method::GET, "ranges") => self.partitions(database, container).await,
            (hyper::Method::POST, "containers") => {
                let partition_key = params.get("partitionKey").map_or("/id", String::as_str);
                let partitions = params.get("partitions").map_or("1", String::as_str);
                match format!("{database}/{container}:{partition_key}:{partitions}").parse::<ContainerSpec>() {
                    Ok(spec) => match self.create_container(&spec).await {
                        Ok(()) => self.partitions(database, container).await,
                        Err(error) => Err(error),
                    },
                    Err(error) => Err(error),
                }
            }
            (hyper::Method::POST, "split") => {
                let lock_ms = params.get("lockMs").and_then(|v| v.parse().ok()).unwrap_or(100);
                let partition = params.get("partition").map(String::as_str);
                self.split(database, container, partition, Duration::from_millis(lock_ms))
                    .await
            }
            _ => return crate::http_server::json(404, &serde_json::json!({"message": "unknown control endpoint"})),
        };
        match result {
            Ok(partitions) => crate::http_server::json(200, &serde_json::json!({ "partitions": partitions })),
            Err(EmulatorError::NoSuchContainer(name)) => crate::http_server::json(
                404,
                &serde_json::json!({"message": format!("container {name} does not exist")}),
            ),
            Err(error @ EmulatorError::InvalidSpec { .. }) => {
                crate::http_server::json(400, &serde_json::json!({"message": error.to_string()}))
            }
            Err(error) => crate::http_server::json(409, &serde_json::json!({"message": error.to_string()})),
        }
    }
}
