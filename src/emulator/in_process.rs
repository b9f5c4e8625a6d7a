//! In-process clients of the emulator: the SDK's transport replaced by one that hands each
//! request to the [`Edge`], so that in-process clients get the answers `cfp emulator` serves.

use std::sync::Arc;

use azure_core::http::Request;
use azure_data_cosmos_driver::CosmosDriverRuntimeBuilder;
use azure_data_cosmos_driver::diagnostics::RequestSentStatus;
use azure_data_cosmos_driver::test::{
    ConnectionPoolOptions, HttpClientConfig, HttpClientFactory, HttpRequest, HttpResponse, TransportClient,
    TransportError,
};

use super::edge::Edge;

/// A driver runtime whose every request is served by `edge`.
pub fn runtime_builder(edge: &Arc<Edge>) -> CosmosDriverRuntimeBuilder {
    CosmosDriverRuntimeBuilder::new().with_mock_http_client_factory(Arc::new(EdgeFactory { edge: edge.clone() }))
}

/// Hands out the one transport of the edge, whatever connection pool is asked for.
#[derive(Debug)]
struct EdgeFactory {
    edge: Arc<Edge>,
}

impl HttpClientFactory for EdgeFactory {
    fn build(
        &self,
        _connection_pool: &ConnectionPoolOptions,
        _config: HttpClientConfig,
    ) -> azure_data_cosmos_driver::error::Result<Arc<dyn TransportClient>> {
        Ok(Arc::new(EdgeTransport {
            edge: self.edge.clone(),
        }))
    }
}

#[derive(Debug)]
struct EdgeTransport {
    edge: Arc<Edge>,
}

#[async_trait::async_trait]
impl TransportClient for EdgeTransport {
    async fn send(&self, request: &HttpRequest) -> Result<HttpResponse, TransportError> {
        let mut core = Request::new(request.url.clone(), request.method);
        for (name, value) in request.headers.iter() {
            core.headers_mut().insert(name.clone(), value.clone());
        }
        if let Some(body) = &request.body {
            core.set_body(body.to_vec());
        }
        let reply = self
            .edge
            .execute(core)
            .await
            .map_err(|e| TransportError::new(e, RequestSentStatus::Unknown))?;
        Ok(HttpResponse {
            status: u16::from(reply.status),
            headers: reply.headers,
            body: reply.body.to_vec(),
        })
    }
}
