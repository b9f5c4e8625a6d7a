//! The emulator's HTTP face: serving the account on a listener, refusing what the service
//! refuses (credentials, metadata writes to Entra tokens), forwarding the rest to the SDK's
//! in-memory emulator; each region of the account on a listener of its own.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::*;

impl Emulator {
    /// Serves this account's first region over HTTP on `listener` until `shutdown` is cancelled.
    pub async fn serve(&self, listener: TcpListener, shutdown: CancellationToken) {
        self.serve_at(listener, self.gateway.clone(), shutdown).await;
    }

    /// Serves the region whose endpoint is `gateway` on `listener` until `shutdown` is cancelled.
    pub(super) async fn serve_at(&self, listener: TcpListener, gateway: Url, shutdown: CancellationToken) {
        let emulator = self.clone();
        let gateway = std::sync::Arc::new(gateway);
        crate::http_server::serve(listener, shutdown, move |req| {
            let emulator = emulator.clone();
            let gateway = gateway.clone();
            async move { emulator.handle(&gateway, req).await }
        })
        .await;
    }

    async fn handle(&self, gateway: &Url, req: hyper::Request<Incoming>) -> hyper::Response<Full<Bytes>> {
        let path = req.uri().path().to_owned();
        if let Some(control) = path.strip_prefix("/_emulator/") {
            let control = control.trim_end_matches('/').to_owned();
            let query = req.uri().query().unwrap_or_default().to_owned();
            return self.control(req.method().clone(), &control, &query).await;
        }
        if self.region_offline(gateway) {
            // The service withdraws an offline region's DNS record: nothing answers there.
            let mut response = crate::http_server::json(503, &serde_json::json!({}));
            response.extensions_mut().insert(crate::http_server::ResetConnection);
            return response;
        }
        let delay = self.faults.delay();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        // Reads: point and change feed reads (GET) and queries (a POST that says it is one).
        let read = req.method() == hyper::Method::GET || req.headers().contains_key("x-ms-documentdb-isquery");
        if let Some(fault) = self.faults.next(read) {
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
        let response = match self.forward(gateway, req, &resolved).await {
            Ok(response) => response,
            Err(error) => crate::http_server::json(
                503,
                &serde_json::json!({"code": "ServiceUnavailable", "message": error.to_string()}),
            ),
        };
        tracing::debug!(%method, path, status = response.status().as_u16(), "request");
        self.count(gateway, read, &resolved.path, response.status().as_u16());
        response
    }

    /// Counts a request the region served at `gateway` answered with `status`.
    fn count(&self, gateway: &Url, read: bool, path: &str, status: u16) {
        if let Some(region) = self.regions.iter().find(|r| &r.gateway == gateway) {
            self.traffic.record(&region.name, read, path, status);
        }
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
        gateway: &Url,
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
        let mut url = gateway.clone();
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
}
