//! A client of the Edge admin API (plain HTTP inside the cluster, to one
//! replica's pod IP and admin port): `GET /admin/v1/providers` and
//! `GET /admin/v1/nodes`, each bounded by a timeout and a response size
//! limit. One client (one connection pool) serves every replica. Built on
//! the hyper client kube already uses, so it adds no HTTP stack of its own.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use iop_proto::admin::{NodesSnapshot, ProvidersSnapshot};
use serde::de::DeserializeOwned;

pub const PROVIDERS_PATH: &str = "/admin/v1/providers";
pub const NODES_PATH: &str = "/admin/v1/nodes";

/// Largest admin response read (a snapshot of every provider and node).
const MAX_BODY: usize = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("request failed: {0}")]
    Request(String),
    #[error("HTTP status {0}")]
    Status(u16),
    #[error("reading the body failed: {0}")]
    Body(String),
    #[error("unexpected JSON: {0}")]
    Decode(String),
}

impl AdminError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Timeout(_) => "timeout",
            Self::Request(_) => "request",
            Self::Status(_) => "status",
            Self::Body(_) => "body",
            Self::Decode(_) => "decode",
        }
    }
}

/// Where one replica's admin API is: `http://<authority>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeAdminUrl {
    /// `host:port` (an IPv6 host in brackets).
    pub authority: String,
}

impl EdgeAdminUrl {
    /// A replica's admin API at its pod IP.
    pub fn of(ip: std::net::IpAddr, port: u16) -> Self {
        Self { authority: std::net::SocketAddr::new(ip, port).to_string() }
    }

    /// `http://<authority><path>`.
    pub fn join(&self, path: &str) -> String {
        format!("http://{}{path}", self.authority)
    }
}

#[derive(Clone)]
pub struct AdminClient {
    client: Client<HttpConnector, Empty<Bytes>>,
    timeout: Duration,
}

impl Default for AdminClient {
    fn default() -> Self {
        Self::new()
    }
}

impl AdminClient {
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(2)
            .build(connector);
        Self { client, timeout: Duration::from_secs(3) }
    }

    /// The same client with another bound per request.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    async fn get<T: DeserializeOwned>(&self, edge: &EdgeAdminUrl, path: &str) -> Result<T, AdminError> {
        let fetch = async {
            let uri: http::Uri = edge.join(path).parse().map_err(|e| AdminError::Request(format!("{e}")))?;
            let request = http::Request::get(uri)
                .header(http::header::ACCEPT, "application/json")
                .body(Empty::new())
                .map_err(|e| AdminError::Request(e.to_string()))?;
            let response = self.client.request(request).await.map_err(|e| AdminError::Request(e.to_string()))?;
            if !response.status().is_success() {
                return Err(AdminError::Status(response.status().as_u16()));
            }
            let body = Limited::new(response.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| AdminError::Body(e.to_string()))?
                .to_bytes();
            serde_json::from_slice(&body).map_err(|e| AdminError::Decode(e.to_string()))
        };
        tokio::time::timeout(self.timeout, fetch).await.map_err(|_| AdminError::Timeout(self.timeout))?
    }

    pub async fn providers(&self, edge: &EdgeAdminUrl) -> Result<ProvidersSnapshot, AdminError> {
        self.get(edge, PROVIDERS_PATH).await
    }

    pub async fn nodes(&self, edge: &EdgeAdminUrl) -> Result<NodesSnapshot, AdminError> {
        self.get(edge, NODES_PATH).await
    }
}

#[cfg(test)]
mod tests;
