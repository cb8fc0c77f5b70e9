//! IOP Edge: the in-cluster gateway. Clients speak OpenAI Chat Completions,
//! OpenAI Responses or Anthropic Messages over HTTP; the Edge routes each
//! request to a provider running on a node that dialed in over mTLS gRPC.
//!
//! The layers, bottom up, are in `docs/architecture.md` ("Layers"): the
//! pure [`core`], the owners of state, [`state::EdgeState`], the node
//! transport ([`node`]) and the request path (`http` -> [`ingress`] ->
//! [`gate`] (admission, retries) -> [`dispatch`] -> the node, and back
//! through the [`ingress`] renderers), with [`Edge`] (bind and serve) on top.

pub mod admission;
pub mod auth;
pub mod config;
pub mod continuation;
pub mod core;
pub mod credentials;
pub mod dispatch;
pub mod gate;
pub mod http;
pub mod ids;
pub mod ingress;
pub mod job;
pub mod metrics;
pub mod node;
pub mod overlay;
pub mod pki;
pub mod ratelimit;
pub mod recovery;
pub mod reload;
pub mod residency;
pub mod retry;
pub mod route;
pub mod state;
#[cfg(test)]
pub(crate) mod testing;
pub mod trace;
pub mod usage;
pub mod workspace;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use iop_proto::config::EdgeConfig;
use iop_proto::liveness::HeartbeatProfile;
use iop_proto::pb::{self, node_gateway_server::NodeGatewayServer};
use tokio::net::TcpListener;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

pub use crate::state::{EdgeState, Lifecycle};

use crate::admission::AdmissionPool;
use crate::config::ConfigHandle;
use crate::dispatch::RunTable;
use crate::metrics::EdgeMetrics;
use crate::node::commands::CommandTable;
use crate::node::limits::NodeLoad;
use crate::node::registry::{GenerationSource, NodeRegistry};
use crate::node::tls::{AcceptPolicy, HandshakeProfile, TlsSetupError};
use crate::overlay::{HealthOverlay, StallHandoff};
use crate::state::{NodeLink, Replica, Routing};

/// HTTP/2 receive window per run stream from a node.
const RUN_STREAM_WINDOW: u32 = 256 * 1024;
/// HTTP/2 receive window per node connection: 256 stalled runs' worth.
const NODE_CONNECTION_WINDOW: u32 = 64 * 1024 * 1024;

/// Calls one node connection may carry at once, as HTTP/2 tells the node.
/// The node's own limit over all its connections, derived from its
/// providers and workspaces (`node::limits::NodeLimits`), is the one that
/// counts; this only keeps a single connection's bookkeeping bounded.
const MAX_STREAMS_PER_CONNECTION: u32 = 4096;

/// How long the listeners may take to close once the drain is over.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    #[error(transparent)]
    Tls(#[from] TlsSetupError),
    /// A keys or credential file could not be loaded.
    #[error("{0}")]
    Secrets(String),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind { what: &'static str, addr: SocketAddr, source: std::io::Error },
    #[error("server error: {0}")]
    Serve(String),
}

/// An Edge with its listeners bound, ready to serve.
pub struct Edge {
    state: Arc<EdgeState>,
    http: TcpListener,
    grpc: TcpListener,
    admin: TcpListener,
    policy: Arc<AcceptPolicy>,
    reload: Option<(std::path::PathBuf, Duration)>,
    handshakes: HandshakeProfile,
    /// The span exporter, flushed when the Edge stops.
    exporter: Option<iop_telemetry::Exporter>,
}

/// How an Edge starts besides its config, fixed for the life of the
/// process: [`Edge::builder`], then [`EdgeBuilder::bind`].
pub struct EdgeBuilder {
    config: EdgeConfig,
    heartbeat: HeartbeatProfile,
    lifecycle: Lifecycle,
    replica_id: Option<String>,
    admin_workspace_calls: bool,
    lease_fault: Option<credentials::LeaseFault>,
    handshakes: HandshakeProfile,
    reload: Option<(std::path::PathBuf, Duration)>,
}

impl EdgeBuilder {
    /// The node transport's heartbeat (tests shorten it).
    pub fn heartbeat(mut self, heartbeat: HeartbeatProfile) -> Self {
        self.heartbeat = heartbeat;
        self
    }

    pub fn lifecycle(mut self, lifecycle: Lifecycle) -> Self {
        self.lifecycle = lifecycle;
        self
    }

    /// This process's replica id (`iop-edge --replica-id`); the host name
    /// when not given ([`state::default_replica_id`]).
    pub fn replica_id(mut self, id: String) -> Self {
        self.replica_id = Some(id);
        self
    }

    /// Serves the admin API's workspace diagnostic
    /// (`POST /admin/v1/workspaces/{ref}/calls`).
    pub fn admin_workspace_calls(mut self) -> Self {
        self.admin_workspace_calls = true;
        self
    }

    /// Test-only: every credential lease this Edge seals is bad in the way
    /// `fault` says (`iop-edge --test-lease-fault`).
    pub fn test_lease_fault(mut self, fault: credentials::LeaseFault) -> Self {
        self.lease_fault = Some(fault);
        self
    }

    /// How the node listener bounds connections before they are
    /// identified (tests shorten the deadlines).
    pub fn handshake_profile(mut self, profile: HandshakeProfile) -> Self {
        self.handshakes = profile;
        self
    }

    /// Reloads the config from `path` when its content changes (checked
    /// every `interval`, and at once on SIGHUP).
    pub fn watch_config(mut self, path: std::path::PathBuf, interval: Duration) -> Self {
        self.reload = Some((path, interval));
        self
    }

    /// Loads the secrets the config names, binds the listeners and builds
    /// the Edge's state.
    pub async fn bind(self) -> Result<Edge, EdgeError> {
        let EdgeBuilder {
            config,
            heartbeat,
            lifecycle,
            replica_id,
            admin_workspace_calls,
            lease_fault,
            handshakes,
            reload,
        } = self;
        let rules = reload::rules(&config)?;
        let bind = |what, addr| async move {
            TcpListener::bind(addr).await.map_err(|source| EdgeError::Bind { what, addr, source })
        };
        let secrets = config::Secrets::load(&config).map_err(EdgeError::Secrets)?;
        auth::log_mode(&config.auth);
        let http = bind("http", config.listen.http).await?;
        let grpc = bind("grpc", config.listen.grpc).await?;
        let admin = bind("admin", config.listen.admin).await?;
        let policy = Arc::new(AcceptPolicy::new(rules));
        let registry = Arc::new(NodeRegistry::default());
        let metrics = EdgeMetrics::new();
        node::tls::record_server_certificate(&metrics, &config.tls.cert_file);
        let overlay = Arc::new(HealthOverlay::default());
        let residency = Arc::new(residency::ResidencyTable::default());
        let endpoint = config.telemetry.otlp_endpoint.as_deref();
        let (tracer, exporter) = iop_telemetry::Exporter::for_endpoint(endpoint, "iop-edge", env!("CARGO_PKG_VERSION"));
        let config = ConfigHandle::new(config, secrets);
        let admission = AdmissionPool::new(
            &config.current(),
            registry.clone(),
            overlay.clone(),
            residency.clone(),
            config.credential_health().clone(),
            metrics.clone(),
        );
        let handoff =
            Arc::new(StallHandoff { registry: registry.clone(), overlay: overlay.clone(), metrics: metrics.clone() });
        let rate_limits = Arc::new(ratelimit::RateLimits::default());
        let routing = Routing {
            admission,
            residency,
            handoff,
            recovery: Arc::new(tokio::sync::Notify::new()),
            usage: usage::Accounting::new(rate_limits.clone(), metrics.clone()),
            rate_limits,
            body_budget: Default::default(),
        };
        let link = NodeLink {
            runs: Arc::new(RunTable::default()),
            tunnels: Arc::new(RunTable::default()),
            workspace_calls: Default::default(),
            job_slots: Default::default(),
            commands: CommandTable::default(),
            generations: GenerationSource::default(),
            heartbeat,
        };
        let replica = Replica {
            id: replica_id.unwrap_or_else(state::default_replica_id),
            lifecycle,
            started: std::time::Instant::now(),
            was_ready: Default::default(),
            draining: CancellationToken::new(),
            shutting_down: CancellationToken::new(),
            admin_workspace_calls,
        };
        let lease_faults = credentials::LeaseFaults { fault: lease_fault, first: Default::default() };
        let state =
            Arc::new(EdgeState { config, registry, overlay, metrics, tracer, routing, link, replica, lease_faults });
        state.record_config_revision();
        // A config without nodes is ready from the start.
        state.readiness();
        Ok(Edge { state, http, grpc, admin, policy, reload, handshakes, exporter })
    }
}

impl Edge {
    /// An Edge of `config` with every option at its default.
    pub fn builder(config: EdgeConfig) -> EdgeBuilder {
        EdgeBuilder {
            config,
            heartbeat: HeartbeatProfile::default(),
            lifecycle: Lifecycle::default(),
            replica_id: None,
            admin_workspace_calls: false,
            lease_fault: None,
            handshakes: HandshakeProfile::default(),
            reload: None,
        }
    }

    /// `Edge::builder(config).heartbeat(heartbeat).bind()`.
    pub async fn bind(config: EdgeConfig, heartbeat: HeartbeatProfile) -> Result<Self, EdgeError> {
        Self::builder(config).heartbeat(heartbeat).bind().await
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http.local_addr().expect("bound listener has an address")
    }

    pub fn state(&self) -> Arc<EdgeState> {
        self.state.clone()
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc.local_addr().expect("bound listener has an address")
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.local_addr().expect("bound listener has an address")
    }

    /// Serves until `shutdown` resolves, then drains ([`DrainPolicy`]) and
    /// closes node sessions.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), EdgeError> {
        let Edge { state, http, grpc, admin, policy, reload, handshakes, exporter } = self;
        let draining = state.replica.draining.clone();
        tokio::spawn(async move {
            shutdown.await;
            draining.cancel();
        });

        let load = NodeLoad::new(state.metrics.clone());
        let (incoming, accept_task) =
            node::tls::accept_loop(grpc, policy.clone(), state.metrics.clone(), load.clone(), handshakes);
        let grpc_stop = state.replica.shutting_down.clone();
        let grpc_server = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            // Each run is its own HTTP/2 stream; a client that stops reading
            // stalls only its run's stream window. The connection window is
            // far larger so that even many stalled runs cannot exhaust it and
            // block the node's other runs (no head-of-line blocking).
            .initial_stream_window_size(Some(RUN_STREAM_WINDOW))
            .initial_connection_window_size(Some(NODE_CONNECTION_WINDOW))
            // hyper's default (200) would silently cap concurrent runs per node.
            .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
            // Each node's calls, message sizes per method and bytes in
            // transit, within its limits (node::limits, node::meter).
            .layer(node::meter::NodeLimitLayer { load, state: state.clone() })
            .add_service(
                NodeGatewayServer::new(node::grpc::GatewayService { state: state.clone() })
                    // The largest any call accepts (workspace answers); the
                    // layer holds each call to its own, smaller or equal.
                    .max_decoding_message_size(node::limits::MAX_NODE_MESSAGE_BYTES)
                    // What the Edge sends: the largest a node accepts of
                    // a run or tunnel request, or of a workspace call.
                    .max_encoding_message_size(
                        iop_proto::wire::MAX_RUN_REQUEST_MESSAGE_BYTES
                            .max(iop_proto::wire::MAX_WORKSPACE_MESSAGE_BYTES),
                    ),
            )
            .serve_with_incoming_shutdown(ReceiverStream::new(incoming), async move { grpc_stop.cancelled().await });
        let grpc_task = tokio::spawn(grpc_server);
        let recovery_task = tokio::spawn(recovery::run(state.clone()));
        let reload_task =
            reload.map(|(path, interval)| tokio::spawn(reload::watch(state.clone(), policy.clone(), path, interval)));

        let http_addr = http.local_addr().map_err(|e| EdgeError::Serve(e.to_string()))?;
        let admin_addr = admin.local_addr().map_err(|e| EdgeError::Serve(e.to_string()))?;
        // The listeners' bounds are read once at start (a reload does not rebind them).
        let limits = http::listener::ListenLimits::of(&state.config.current().limits);
        let (open, refused) = (state.metrics.http_connections.clone(), state.metrics.http_connections_refused.clone());
        // Client connections stop before node sessions: the answers in
        // flight need their nodes.
        let http_stop = CancellationToken::new();
        let http_router = http::router(state.clone());
        let http_server = http::listener::serve(http, http_router, limits, open, refused, http_stop.clone());
        let http_task = tokio::spawn(http_server);
        // Admin connections are not client connections: their own (unexported) counts.
        let stop = state.replica.shutting_down.clone();
        let admin_router = http::admin_router(state.clone());
        let admin_server =
            http::listener::serve(admin, admin_router, limits, Default::default(), Default::default(), stop);
        let admin_task = tokio::spawn(admin_server);
        tracing::info!(%http_addr, %admin_addr, "edge serving");

        state.warn_if_unlisted(&state.config.current());
        state.replica.draining.cancelled().await;
        let started = tokio::time::Instant::now();
        let drain = state.replica.lifecycle;
        tracing::info!(delay_ms = drain.drain_delay.as_millis() as u64, "edge draining: not ready, telling nodes");
        for control in state.registry.controls() {
            node::session::send_now(&control, pb::edge_to_node::Msg::Draining(pb::Draining {}));
        }
        tokio::time::sleep(drain.drain_delay).await;
        http_stop.cancel();
        let in_flight = tokio::time::timeout(drain.drain_timeout.saturating_sub(started.elapsed()), http_task).await;
        tracing::info!(finished = in_flight.is_ok(), "client connections closed; edge shutting down");
        state.replica.shutting_down.cancel();
        state.link.runs.begin_shutdown();
        state.link.tunnels.begin_shutdown();
        state.registry.close_all();
        accept_task.abort();
        recovery_task.abort();
        if let Some(task) = reload_task {
            task.abort();
        }
        let _ = tokio::time::timeout(SHUTDOWN_DRAIN, admin_task).await;
        let _ = tokio::time::timeout(SHUTDOWN_DRAIN, grpc_task).await;
        // The last requests' spans ended with their responses: send them.
        if let Some(exporter) = exporter {
            exporter.shutdown(SHUTDOWN_DRAIN).await;
        }
        Ok(())
    }
}

/// rustls needs exactly one process-wide crypto provider; IOP uses ring.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Text logs to stderr (or JSON lines), filtered by `RUST_LOG` (default info).
pub fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing a SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
