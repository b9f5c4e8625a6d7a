//! A small HTTP/1.1 + cleartext HTTP/2 server loop shared by the emulator and the metrics
//! endpoints.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// How long a client may take to send its request headers.
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A response with a fully buffered body.
pub type Response = hyper::Response<Full<Bytes>>;

/// Serves `handler` on `listener` until `shutdown` is cancelled, then waits for open connections.
pub async fn serve<H, F>(listener: TcpListener, shutdown: CancellationToken, handler: H)
where
    H: Fn(hyper::Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response> + Send + 'static,
{
    let handler = Arc::new(handler);
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, _) = match accepted {
            Ok(conn) => conn,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                continue;
            }
        };
        // An answer written in pieces (HTTP/2 frames: headers, then data) must not wait for the
        // client's delayed acknowledgement of the first piece (Nagle's algorithm: 40 ms a time).
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "TCP_NODELAY not set");
        }
        let handler = handler.clone();
        let stop = shutdown.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let response = handler(req);
                async move {
                    let response = response.await;
                    if response.extensions().get::<ResetConnection>().is_some() {
                        // No answer: the connection (HTTP/1.1) or stream (HTTP/2) is reset.
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::ConnectionReset,
                            "reset on purpose",
                        ));
                    }
                    Ok(response)
                }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            // A client that never finishes its request headers (slowloris) is dropped.
            builder
                .http1()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                _ = stop.cancelled() => {}
            }
        });
    }
    connections.close();
    connections.wait().await;
}

/// Marks a response that must not be sent: the server resets the connection instead (fault
/// injection).
#[derive(Debug, Clone, Copy)]
pub struct ResetConnection;

/// A response with `status`, a content type and a body.
pub fn response(status: u16, content_type: &'static str, body: impl Into<Bytes>) -> Response {
    let mut response = hyper::Response::new(Full::new(body.into()));
    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

/// A JSON response.
pub fn json(status: u16, body: &serde_json::Value) -> Response {
    response(status, "application/json", body.to_string())
}
