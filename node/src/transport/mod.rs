//! The Node side of the Edge-Node wire: dialing over mTLS, the supervised
//! reconnect loop, and one control session per connection.

pub mod backoff;
mod error;
#[cfg(test)]
pub(crate) mod fake_edge;
pub mod replicas;
pub mod sequence;
pub mod session;
pub mod tls;

use std::time::Duration;

use iop_proto::liveness::HeartbeatProfile;
use iop_proto::pb::node_gateway_client::NodeGatewayClient;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::config::NodeConfig;
use crate::metrics::NodeMetrics;
use backoff::{Dialed, Redial};
pub use error::TransportError;
use replicas::Replicas;
use session::SessionEnd;
use std::sync::Arc;

/// The pieces a session needs to dial the Edge; built once from config.
#[derive(Clone)]
pub struct Dialer {
    endpoint: Endpoint,
}

impl Dialer {
    pub fn new(config: &NodeConfig) -> Result<Self, TransportError> {
        let files = tls::TlsFiles::read(&config.tls)?;
        let server_name = config.server_name().ok_or_else(|| TransportError::Endpoint("no server name".into()))?;
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(files.ca))
            .identity(Identity::from_pem(files.cert, files.key.expose()))
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
        let channel = self
            .endpoint
            .connect()
            .await
            .map_err(|e| TransportError::Connect(crate::adapter::error::error_chain(&e)))?;
        Ok(NodeGatewayClient::new(channel))
    }
}

/// Keeps one session with every Edge replica until `shutdown`. It dials
/// the Edge URL (a new connection each time, so a load balancer may bring
/// it to any replica) while [`Replicas::wants_dial`] says a replica is
/// missing, one dial at a time, pausing between dials as [`Redial`] says:
/// a session that registers with a replica already held is closed and the
/// next dial follows after a short pause (bounded: see [`backoff`]); a
/// failed dial or a refused session waits the capped exponential backoff;
/// a dial that reaches a new replica resets both.
pub async fn supervise(
    config: NodeConfig,
    heartbeat: HeartbeatProfile,
    metrics: Arc<NodeMetrics>,
    commands: crate::workspace::sandbox::CommandEnvironment,
    shutdown: CancellationToken,
) -> Result<(), TransportError> {
    let dialer = Dialer::new(&config)?;
    let config = Arc::new(config);
    let http = crate::adapter::http_client();
    let endpoint = config.telemetry.otlp_endpoint.as_deref();
    let (tracer, exporter) = iop_telemetry::Exporter::for_endpoint(endpoint, "iop-node", env!("CARGO_PKG_VERSION"));
    let mut redial = Redial::new(config.reconnect.initial(), config.reconnect.max());
    let shared = session::Shared {
        // Spent lease ids and credential revisions outlive each connection.
        ledger: Arc::new(crate::lease::LeaseLedger::default()),
        replicas: Replicas::default(),
        admission: Default::default(),
        commands: Arc::new(commands),
        tracer,
    };
    let mut sessions = tokio::task::JoinSet::new();
    let mut next_session = 0u64;
    while !shutdown.is_cancelled() {
        if !shared.replicas.wants_dial() {
            redial.settled();
            tokio::select! {
                _ = shared.replicas.changed() => continue,
                _ = shutdown.cancelled() => break,
            }
        }
        let (registered, verdict) = tokio::sync::oneshot::channel();
        let dialed = match dialer.connect().await {
            Ok(client) => {
                next_session += 1;
                let (config, http, metrics, shared) = (config.clone(), http.clone(), metrics.clone(), shared.clone());
                let ours = session::Ours { id: next_session, registered, shared };
                let shutdown = shutdown.clone();
                sessions.spawn(async move {
                    match session::run(client, http, metrics, heartbeat, &config, shutdown, ours).await {
                        SessionEnd::Shutdown => {}
                        SessionEnd::Closed { reason, .. } => tracing::warn!(reason, "edge session ended"),
                        SessionEnd::ConnectFailed(reason) => tracing::warn!(%reason, "edge session refused"),
                        SessionEnd::Duplicate => {}
                    }
                });
                match verdict.await {
                    Ok(replicas::ReplicaClaim::Held) => Dialed::Held,
                    Ok(replicas::ReplicaClaim::Duplicate) => {
                        tracing::debug!("reached a replica already held; dialing again");
                        Dialed::Duplicate
                    }
                    // The session ended before registering (refused).
                    Err(_) => Dialed::Failed,
                }
            }
            Err(e) => {
                tracing::warn!(reason = %e, "cannot reach the edge");
                Dialed::Failed
            }
        };
        metrics.edge_dial(dialed.label());
        let delay = redial.next_delay(dialed, fastrand::f64());
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.cancelled() => break,
        }
    }
    // Each session ends on `shutdown` itself (cancelling its work).
    while sessions.join_next().await.is_some() {}
    drop(shared);
    // The spans of the executions that ended: sent before the node exits.
    if let Some(exporter) = exporter {
        exporter.shutdown(Duration::from_secs(5)).await;
    }
    Ok(())
}
