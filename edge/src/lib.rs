//! IOP Edge: the in-cluster gateway. Clients speak OpenAI (and later
//! Anthropic) HTTP to it; it routes each request to a provider running on a
//! node that dialed in over mTLS gRPC.
//!
//! Request path: `http` (ingress) -> `ingress::*` (parse/normalize) ->
//! `route` (model -> candidates) -> `dispatch` (run table, events) ->
//! `node` (sessions, gRPC) -> back through `ingress::*` renderers.

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

use crate::admission::AdmissionPool;
use crate::config::ConfigHandle;
use crate::dispatch::RunTable;
use crate::metrics::EdgeMetrics;
use crate::node::commands::CommandTable;
use crate::node::limits::NodeLoad;
use crate::node::registry::{GenerationSource, NodeRegistry};
use crate::node::tls::{AcceptPolicy, HandshakeProfile, TlsSetupError};
use crate::overlay::{HealthOverlay, StallHandoff};

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

/// How a replica starts and stops (`iop-edge --startup-grace-ms
/// --drain-delay-ms --drain-timeout-ms`), so a rolling update drops nothing.
///
/// Starting, `/readyz` waits until a node is ready (or the config lists
/// none, or `startup_grace` passed): a load balancer then sends requests
/// only once there is someone to run them. On the shutdown signal the
/// replica drains: `/readyz` fails and its nodes are told (they reach the
/// other replicas for new work), it keeps serving for `drain_delay` (the
/// time a load balancer takes to see `/readyz`), then stops taking
/// connections and lets the requests in flight finish, all within
/// `drain_timeout`; only then are node sessions closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifecycle {
    pub startup_grace: Duration,
    pub drain_delay: Duration,
    pub drain_timeout: Duration,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self {
            startup_grace: Duration::from_secs(30),
            drain_delay: Duration::ZERO,
            drain_timeout: Duration::from_secs(25),
        }
    }
}

/// Shared state of one Edge process.
pub struct EdgeState {
    pub config: ConfigHandle,
    pub registry: Arc<NodeRegistry>,
    pub admission: Arc<AdmissionPool>,
    pub overlay: Arc<HealthOverlay>,
    /// Model residency as the nodes report it ([`residency`]).
    pub residency: Arc<residency::ResidencyTable>,
    pub handoff: Arc<StallHandoff>,
    /// Wakes the CAPABILITIES recovery loop (a node became ready, a provider
    /// was lowered).
    pub recovery: Arc<tokio::sync::Notify>,
    pub runs: Arc<RunTable<pb::RunEvent>>,
    pub tunnels: Arc<RunTable<pb::ProviderTunnelFrame>>,
    pub workspace_calls: Arc<workspace::WorkspaceCalls>,
    /// Jobs running now, per workspace and per principal.
    pub job_slots: Arc<job::slots::JobSlots>,
    /// Per-principal request and token limits ([`ratelimit`]).
    pub rate_limits: Arc<ratelimit::RateLimits>,
    /// Per-principal usage since start ([`usage`]).
    pub usage: Arc<usage::UsageLedger>,
    pub commands: CommandTable,
    pub generations: GenerationSource,
    pub metrics: Arc<EdgeMetrics>,
    pub heartbeat: HeartbeatProfile,
    pub shutting_down: CancellationToken,
    /// Cancelled when the shutdown signal arrives: the replica drains
    /// ([`Lifecycle`]) before `shutting_down`.
    pub draining: CancellationToken,
    pub lifecycle: Lifecycle,
    pub started: std::time::Instant,
    /// Test-only: make every credential lease bad in this way.
    pub lease_fault: Option<credentials::LeaseFault>,
    /// `POST /admin/v1/workspaces/{ref}/calls` is served (`iop-edge
    /// --admin-workspace-calls`); off by default.
    pub admin_workspace_calls: bool,
    /// The lease a `Replay` fault repeats.
    pub first_lease: std::sync::OnceLock<pb::SealedLease>,
    /// This replica's id (`iop-edge --replica-id`), told to every node.
    pub replica_id: String,
    /// Where spans go ([`trace`]); off unless `telemetry.otlp_endpoint`
    /// was set at start (a reload does not change it).
    pub tracer: iop_telemetry::Tracer,
}

impl EdgeState {
    /// `/readyz`: not draining, and a node is ready, or the config lists
    /// none, or the startup grace passed ([`Lifecycle`]).
    pub fn ready(&self) -> bool {
        !self.draining.is_cancelled()
            && (self.registry.ready_count() > 0
                || self.config.current().nodes.is_empty()
                || self.started.elapsed() >= self.lifecycle.startup_grace)
    }

    /// The effective health of the configured provider `id` (the one
    /// definition, [`core::health::ProviderView`]); `None` when no provider has
    /// that id.
    pub fn provider_health(&self, id: &str) -> Option<core::health::OverlayState> {
        let config = self.config.current();
        let provider = config.providers.iter().find(|p| p.id == id)?;
        Some(
            core::health::ProviderView::of(&self.registry, &self.overlay, self.config.credential_health(), provider)
                .health,
        )
    }

    /// Every replica of the Edge as nodes are told it: the config's
    /// `replicas`, or this one alone when the config lists none.
    pub fn replica_set(&self, config: &EdgeConfig) -> Vec<String> {
        if config.replicas.is_empty() { vec![self.replica_id.clone()] } else { config.replicas.clone() }
    }

    /// At start and on each reload: nodes keep dialing for the listed
    /// replicas while holding one that is not listed, a deployment mistake
    /// worth a loud line.
    pub fn warn_if_unlisted(&self, config: &EdgeConfig) {
        if !config.replicas.is_empty() && !config.replicas.contains(&self.replica_id) {
            tracing::warn!(replica_id = %self.replica_id, "this replica is not in the config's `replicas`");
        }
    }
}

/// The replica id when `--replica-id` is not given: the host name (in a
/// pod, the pod name), else `iop-edge`.
pub fn default_replica_id() -> String {
    let from_file = |path| std::fs::read_to_string(path).ok().map(|s: String| s.trim().to_string());
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| from_file("/proc/sys/kernel/hostname"))
        .or_else(|| from_file("/etc/hostname"))
        .filter(|id| iop_proto::config::is_replica_id(id))
        .unwrap_or_else(|| "iop-edge".to_string())
}

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

impl Edge {
    pub async fn bind(config: EdgeConfig, heartbeat: HeartbeatProfile) -> Result<Self, EdgeError> {
        let tls = node::tls::server_config(&config.tls.ca_file, &config.tls.cert_file, &config.tls.key_file)?;
        let bind = |what, addr| async move {
            TcpListener::bind(addr).await.map_err(|source| EdgeError::Bind { what, addr, source })
        };
        let secrets = config::Secrets::load(&config).map_err(EdgeError::Secrets)?;
        auth::log_mode(&config.auth);
        let http = bind("http", config.listen.http).await?;
        let grpc = bind("grpc", config.listen.grpc).await?;
        let admin = bind("admin", config.listen.admin).await?;
        let policy = Arc::new(AcceptPolicy::new(reload::rules(&config, tls)));
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
        let state = Arc::new(EdgeState {
            config,
            registry,
            admission,
            overlay,
            residency,
            handoff,
            recovery: Arc::new(tokio::sync::Notify::new()),
            runs: Arc::new(RunTable::default()),
            tunnels: Arc::new(RunTable::default()),
            workspace_calls: Default::default(),
            job_slots: Default::default(),
            rate_limits: Default::default(),
            usage: Default::default(),
            commands: CommandTable::default(),
            generations: GenerationSource::default(),
            metrics,
            heartbeat,
            shutting_down: CancellationToken::new(),
            draining: CancellationToken::new(),
            lifecycle: Lifecycle::default(),
            started: std::time::Instant::now(),
            lease_fault: None,
            admin_workspace_calls: false,
            first_lease: std::sync::OnceLock::new(),
            replica_id: default_replica_id(),
            tracer,
        });
        metrics_revision(&state);
        let handshakes = HandshakeProfile::default();
        Ok(Self { state, http, grpc, admin, policy, reload: None, handshakes, exporter })
    }

    /// Reloads the config from `path` when its content changes (checked
    /// every `interval`, and at once on SIGHUP).
    pub fn watch_config(mut self, path: std::path::PathBuf, interval: Duration) -> Self {
        self.reload = Some((path, interval));
        self
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http.local_addr().expect("bound listener has an address")
    }

    /// Test-only: every credential lease this Edge seals is bad in the way
    /// `fault` says (`iop-edge --test-lease-fault`).
    pub fn with_test_lease_fault(mut self, fault: credentials::LeaseFault) -> Self {
        Arc::get_mut(&mut self.state).expect("set before serving").lease_fault = Some(fault);
        self
    }

    /// How the node listener bounds connections before they are
    /// identified (tests shorten the deadlines).
    pub fn with_handshake_profile(mut self, profile: HandshakeProfile) -> Self {
        self.handshakes = profile;
        self
    }

    pub fn with_lifecycle(mut self, lifecycle: Lifecycle) -> Self {
        Arc::get_mut(&mut self.state).expect("set before serving").lifecycle = lifecycle;
        self
    }

    /// This process's replica id (`iop-edge --replica-id`).
    pub fn with_replica_id(mut self, id: String) -> Self {
        Arc::get_mut(&mut self.state).expect("set before serving").replica_id = id;
        self
    }

    /// Serves the admin API's workspace diagnostic
    /// (`POST /admin/v1/workspaces/{ref}/calls`).
    pub fn with_admin_workspace_calls(mut self) -> Self {
        Arc::get_mut(&mut self.state).expect("set before serving").admin_workspace_calls = true;
        self
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
        let draining = state.draining.clone();
        tokio::spawn(async move {
            shutdown.await;
            draining.cancel();
        });

        let load = NodeLoad::new(state.metrics.clone());
        let (incoming, accept_task) =
            node::tls::accept_loop(grpc, policy.clone(), state.metrics.clone(), load.clone(), handshakes);
        let grpc_stop = state.shutting_down.clone();
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
        let open = state.metrics.http_connections.clone();
        // Client connections stop before node sessions: the answers in
        // flight need their nodes.
        let http_stop = CancellationToken::new();
        let http_router = http::router(state.clone());
        let http_task = tokio::spawn(http::listener::serve(http, http_router, limits, open, http_stop.clone()));
        // Admin connections are not client connections: their own (unexported) count.
        let stop = state.shutting_down.clone();
        let admin_server =
            http::listener::serve(admin, http::admin_router(state.clone()), limits, Default::default(), stop);
        let admin_task = tokio::spawn(admin_server);
        tracing::info!(%http_addr, %admin_addr, "edge serving");

        state.warn_if_unlisted(&state.config.current());
        state.draining.cancelled().await;
        let started = tokio::time::Instant::now();
        let drain = state.lifecycle;
        tracing::info!(delay_ms = drain.drain_delay.as_millis() as u64, "edge draining: not ready, telling nodes");
        for control in state.registry.controls() {
            node::session::send_now(&control, pb::edge_to_node::Msg::Draining(pb::Draining {}));
        }
        tokio::time::sleep(drain.drain_delay).await;
        http_stop.cancel();
        let in_flight = tokio::time::timeout(drain.drain_timeout.saturating_sub(started.elapsed()), http_task).await;
        tracing::info!(finished = in_flight.is_ok(), "client connections closed; edge shutting down");
        state.shutting_down.cancel();
        state.runs.begin_shutdown();
        state.tunnels.begin_shutdown();
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

fn metrics_revision(state: &EdgeState) {
    state.metrics.config_revision.set(state.config.status().revision as i64);
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
