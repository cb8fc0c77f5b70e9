//! The Node side of the Edge-Node wire: dialing over mTLS, the supervised
//! reconnect loop, and one control session per connection.

pub mod backoff;
#[cfg(test)]
pub(crate) mod fake_edge;
pub mod sequence;
pub mod session;

use std::time::Duration;

use iop_proto::liveness::HeartbeatProfile;
use iop_proto::pb::node_gateway_client::NodeGatewayClient;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::config::NodeConfig;
use crate::metrics::NodeMetrics;
use backoff::Backoff;
use session::SessionEnd;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("{field}: cannot read {path}: {source}")]
    ReadTls { field: &'static str, path: String, source: std::io::Error },
    #[error("edge endpoint: {0}")]
    Endpoint(String),
    #[error("cannot connect to the edge: {0}")]
    Connect(String),
}

/// The pieces a session needs to dial the Edge; built once from config.
#[derive(Clone)]
pub struct Dialer {
    endpoint: Endpoint,
}

impl Dialer {
    pub fn new(config: &NodeConfig) -> Result<Self, TransportError> {
        let read = |field, path: &std::path::Path| {
            std::fs::read(path).map_err(|source| TransportError::ReadTls {
                field,
                path: path.display().to_string(),
                source,
            })
        };
        let ca = read("tls.ca_file", &config.tls.ca_file)?;
        let cert = read("tls.cert_file", &config.tls.cert_file)?;
        let key = read("tls.key_file", &config.tls.key_file)?;
        let server_name = config.server_name().ok_or_else(|| TransportError::Endpoint("no server name".into()))?;
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .identity(Identity::from_pem(cert, key))
            .domain_name(server_name);
        let endpoint = Endpoint::from_shared(config.edge.url.clone())
            .map_err(|e| TransportError::Endpoint(e.to_string()))?
            .tls_config(tls)
            .map_err(|e| TransportError::Endpoint(e.to_string()))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(10))
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_while_idle(true);
        Ok(Self { endpoint })
    }

    /// A fresh connection: every session is its own connection and therefore
    /// its own generation at the Edge.
    pub async fn connect(&self) -> Result<NodeGatewayClient<Channel>, TransportError> {
        let channel = self.endpoint.connect().await.map_err(|e| TransportError::Connect(error_chain(&e)))?;
        Ok(NodeGatewayClient::new(channel))
    }
}

/// Full error chain in one line (tonic's top-level message alone says little).
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// Keeps a session with the Edge alive until `shutdown`: dial, run the
/// session, and on any loss reconnect with capped exponential backoff.
pub async fn supervise(
    config: NodeConfig,
    heartbeat: HeartbeatProfile,
    metrics: Arc<NodeMetrics>,
    shutdown: CancellationToken,
) -> Result<(), TransportError> {
    let dialer = Dialer::new(&config)?;
    let http = crate::adapter::http_client();
    let mut backoff = Backoff::new(config.reconnect.initial(), config.reconnect.max());
    // Spent lease ids and credential revisions outlive each connection.
    let ledger = Arc::new(crate::lease::LeaseLedger::default());
    loop {
        let end = match dialer.connect().await {
            Ok(client) => {
                let metrics = metrics.clone();
                session::run(client, http.clone(), metrics, heartbeat, &config, shutdown.clone(), ledger.clone()).await
            }
            Err(e) => SessionEnd::ConnectFailed(e.to_string()),
        };
        match &end {
            SessionEnd::Shutdown => return Ok(()),
            SessionEnd::Closed { was_ready, reason } => {
                tracing::warn!(reason, "edge session ended; reconnecting");
                if *was_ready {
                    backoff.reset();
                }
            }
            SessionEnd::ConnectFailed(reason) => tracing::warn!(%reason, "cannot reach the edge"),
        }
        let delay = backoff.next_delay(fastrand::f64());
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.cancelled() => return Ok(()),
        }
    }
}
