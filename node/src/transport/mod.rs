//! The Node side of the Edge-Node wire: dialing over mTLS, the supervised
//! reconnect loop, and one control session per connection.

pub mod backoff;
mod connect;
mod error;
#[cfg(test)]
pub(crate) mod fake_edge;
pub mod refusal;
pub mod replicas;
pub mod sequence;
pub mod session;
pub mod tls;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use iop_proto::liveness::HeartbeatProfile;
use iop_proto::pb::node_gateway_client::NodeGatewayClient;
use rustls::pki_types::ServerName;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::config::NodeConfig;
use crate::metrics::NodeMetrics;
use backoff::{Dialed, Redial};
use connect::EdgeConnector;
pub use error::TransportError;
use refusal::Refusal;
use replicas::Replicas;
use session::SessionEnd;
use std::sync::Arc;

/// The pieces a session needs to dial the Edge; built once from config.
/// Its clones share one TLS client config.
#[derive(Clone)]
pub struct Dialer {
    endpoint: Endpoint,
    connector: EdgeConnector,
    /// notBefore of this node's certificate (Unix seconds): tells a refusal
    /// of a certificate not valid yet from one of an expired certificate.
    not_before: Option<i64>,
}

impl Dialer {
    pub fn new(config: &NodeConfig) -> Result<Self, TransportError> {
        let files = tls::TlsFiles::read(&config.tls)?;
        let name = config.server_name().ok_or_else(|| TransportError::Endpoint("no server name".into()))?;
        let server_name =
            ServerName::try_from(name).map_err(|e| TransportError::Endpoint(format!("edge.server_name: {e}")))?;
        let (host, port) = config.edge_host_port().ok_or_else(|| TransportError::Endpoint("no host".into()))?;
        let client = tls::client_config(&files)?;
        let not_before = tls::parse_certs(&files.cert).first().and_then(|leaf| {
            let (_, cert) = x509_parser::parse_x509_certificate(leaf).ok()?;
            Some(cert.validity().not_before.timestamp())
        });
        let url: Uri = config.edge.url.parse().map_err(|e| TransportError::Endpoint(format!("edge.url: {e}")))?;
        // The connector does the TLS (tonic would insist on its own for an
        // https:// endpoint); the requests name the configured URL.
        let authority = url.authority().ok_or_else(|| TransportError::Endpoint("edge.url: no host".into()))?;
        let endpoint = Endpoint::from_shared(format!("http://{authority}"))
            .map_err(|e| TransportError::Endpoint(e.to_string()))?
            .origin(url)
            // Covers the connector's TCP, TLS and the wait for the Edge's first bytes.
            .connect_timeout(Duration::from_secs(10))
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_while_idle(true);
        Ok(Self { endpoint, connector: EdgeConnector::new(host, port, server_name, client), not_before })
    }

    /// A fresh connection: every session is its own connection and therefore
    /// its own generation at the Edge. A handshake the Edge refused is
    /// [`TransportError::Refused`], with the reason its alert gave.
    pub async fn connect(&self) -> Result<NodeGatewayClient<Channel>, TransportError> {
        let channel = self.endpoint.connect_with_connector(self.connector.clone()).await.map_err(|e| {
            match (refusal::alert_in(&e), refusal::edge_distrust_in(&e)) {
                (Some(alert), _) => TransportError::Refused(Refusal::from_alert(alert, self.not_before, unix_now())),
                (None, Some(distrust)) => TransportError::EdgeDistrusted(distrust),
                (None, None) => TransportError::Connect(crate::adapter::error::error_chain(&e)),
            }
        })?;
        Ok(NodeGatewayClient::new(channel))
    }
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
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
            Err(TransportError::Refused(refusal)) => {
                tracing::warn!(refused = refusal.label(), "{refusal}");
                Dialed::Refused
            }
            Err(TransportError::EdgeDistrusted(distrust)) => {
                tracing::warn!(edge_certificate = distrust.label(), "{distrust}");
                Dialed::Failed
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
