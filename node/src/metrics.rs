//! Node metrics (Prometheus, served on `metrics.listen` when configured).
//! Label values come from closed sets only: closed enums, and provider ids
//! (the Edge's configured providers assigned to this node, bounded by its
//! config, never a value a client chose). No run ids, prompts or payload bytes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use iop_proto::pb;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::liveness::StallEvidence;

/// Which kind of execution an observation belongs to.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ExecutionKind {
    run,
    tunnel,
}

impl ExecutionKind {
    pub fn label(self) -> &'static str {
        match self {
            Self::run => "run",
            Self::tunnel => "tunnel",
        }
    }
}

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Classification {
    request_stalled,
    provider_unhealthy,
    health_unknown,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StallLabels {
    pub kind: ExecutionKind,
    pub classification: Classification,
    pub retryable: bool,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: ExecutionKind,
}

/// A closed reason (`pb::LeaseRefusal::label`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

/// A workspace operation (`open`, `read`, `list`, `write`, `delete`,
/// `command`) and its closed result (`ok` or a typed error's label).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkspaceOpLabels {
    pub op: &'static str,
    pub result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: &'static str,
}

/// A provider id assigned to this node: the Edge's config bounds the set.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabels {
    pub provider: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

/// A command limit (`CommandLimit::label`: processes, memory, cpu,
/// file_size, disk).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    pub limit: &'static str,
}

pub struct NodeMetrics {
    registry: Registry,
    workspace_ops: Family<WorkspaceOpLabels, Counter>,
    workspace_op_duration: Family<OpLabels, Histogram>,
    workspace_cleanups: Family<ResultLabels, Counter>,
    workspace_dropped: Family<ReasonLabels, Counter>,
    command_limits: Family<LimitLabels, Counter>,
    stalls: Family<StallLabels, Counter>,
    stall_duration: Family<KindLabels, Histogram>,
    fenced_output: Family<KindLabels, Counter>,
    first_byte_timeouts: Family<KindLabels, Counter>,
    lease_rejections: Family<ReasonLabels, Counter>,
    malformed_events: Family<ProviderLabels, Counter>,
    model_loads: Family<ProviderLabels, Counter>,
    model_load_seconds: Family<ProviderLabels, Histogram>,
    edge_dials: Family<OutcomeLabels, Counter>,
}

/// Buckets of `iop_node_model_load_seconds`: a small model loads in under a
/// second, a 70 GB one in minutes.
const MODEL_LOAD_BUCKETS: [f64; 10] = [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0];

impl NodeMetrics {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("iop_node");
        let stalls = Family::<StallLabels, Counter>::default();
        registry.register("response_stalls", "Provider responses that stalled, by evidence", stalls.clone());
        let stall_duration =
            Family::<KindLabels, Histogram>::new_with_constructor(|| Histogram::new(exponential_buckets(0.5, 2.0, 14)));
        registry.register(
            "response_stall_duration_seconds",
            "Provider silence when a stall was claimed",
            stall_duration.clone(),
        );
        let fenced_output = Family::<KindLabels, Counter>::default();
        registry.register("stall_fenced_output", "Provider output dropped after a stall claim", fenced_output.clone());
        let first_byte_timeouts = Family::<KindLabels, Counter>::default();
        registry.register(
            "first_byte_timeouts",
            "Provider requests that sent nothing at all (headers included) within their first-byte timeout",
            first_byte_timeouts.clone(),
        );
        let lease_rejections = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "credential_lease_rejections",
            "Credential leases refused before the provider call, by reason",
            lease_rejections.clone(),
        );
        let workspace_ops = Family::<WorkspaceOpLabels, Counter>::default();
        registry.register("workspace_ops", "Workspace operations, by operation and result", workspace_ops.clone());
        let workspace_op_duration = Family::<OpLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 4.0, 12))
        });
        registry.register(
            "workspace_op_duration_seconds",
            "Time a workspace operation took on the node",
            workspace_op_duration.clone(),
        );
        let workspace_cleanups = Family::<ResultLabels, Counter>::default();
        registry.register("workspace_cleanups", "Request cleanups, by outcome", workspace_cleanups.clone());
        let workspace_dropped = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "workspace_frames_dropped",
            "Workspace messages dropped (repeated request, malformed), by reason",
            workspace_dropped.clone(),
        );
        let command_limits = Family::<LimitLabels, Counter>::default();
        registry.register(
            "workspace_command_limit_exceeded",
            "Workspace commands a limit of their template ended, by limit",
            command_limits.clone(),
        );
        let malformed_events = Family::<ProviderLabels, Counter>::default();
        registry.register(
            "provider_malformed_events",
            "Undecodable events a provider's stream carried that the run skipped, by provider",
            malformed_events.clone(),
        );
        let model_loads = Family::<ProviderLabels, Counter>::default();
        registry.register(
            "model_loads",
            "Runs and tunnels that found their model not loaded and got its first byte, by provider",
            model_loads.clone(),
        );
        let model_load_seconds = Family::<ProviderLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(MODEL_LOAD_BUCKETS.iter().copied())
        });
        registry.register(
            "model_load_seconds",
            "Time from the provider request to its first byte of a run that loaded the model, by provider",
            model_load_seconds.clone(),
        );
        let edge_dials = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "edge_dials",
            "Dials of the Edge URL, by outcome (held: a new replica; duplicate: one held already; refused: at the handshake; failed)",
            edge_dials.clone(),
        );
        Arc::new(Self {
            edge_dials,
            model_loads,
            model_load_seconds,
            registry,
            malformed_events,
            workspace_ops,
            workspace_op_duration,
            workspace_cleanups,
            workspace_dropped,
            command_limits,
            stalls,
            stall_duration,
            fenced_output,
            first_byte_timeouts,
            lease_rejections,
        })
    }

    pub fn observe_stall(&self, kind: ExecutionKind, evidence: &StallEvidence, silent_for: Duration) {
        let classification = match evidence.classification {
            pb::LivenessClassification::RequestStalled => Classification::request_stalled,
            pb::LivenessClassification::ProviderUnhealthy => Classification::provider_unhealthy,
            pb::LivenessClassification::HealthUnknown | pb::LivenessClassification::Unspecified => {
                Classification::health_unknown
            }
        };
        self.stalls.get_or_create(&StallLabels { kind, classification, retryable: evidence.retryable }).inc();
        self.stall_duration.get_or_create(&KindLabels { kind }).observe(silent_for.as_secs_f64());
    }

    /// A stall claimed at the first-byte deadline (stage `first_byte`).
    pub fn first_byte_timeout(&self, kind: ExecutionKind) {
        self.first_byte_timeouts.get_or_create(&KindLabels { kind }).inc();
    }

    pub fn fenced(&self, kind: ExecutionKind) {
        self.fenced_output.get_or_create(&KindLabels { kind }).inc();
    }

    /// `count` undecodable events skipped in a stream of `provider`
    /// (`crate::adapter`'s malformed-event rule).
    pub fn provider_malformed_events(&self, provider: &str, count: u64) {
        self.malformed_events.get_or_create(&ProviderLabels { provider: provider.to_owned() }).inc_by(count);
    }

    /// A run or tunnel on `provider` loaded its model in `took`.
    pub fn model_loaded(&self, provider: &str, took: Duration) {
        let labels = ProviderLabels { provider: provider.to_owned() };
        self.model_loads.get_or_create(&labels).inc();
        self.model_load_seconds.get_or_create(&labels).observe(took.as_secs_f64());
    }

    /// A dial of the Edge came to `outcome` (`crate::transport::backoff::Dialed::label`).
    pub fn edge_dial(&self, outcome: &'static str) {
        self.edge_dials.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    pub fn lease_refused(&self, reason: &'static str) {
        self.lease_rejections.get_or_create(&ReasonLabels { reason }).inc();
    }

    pub fn workspace_op(&self, op: &'static str, result: &'static str, took: Duration) {
        self.workspace_ops.get_or_create(&WorkspaceOpLabels { op, result }).inc();
        self.workspace_op_duration.get_or_create(&OpLabels { op }).observe(took.as_secs_f64());
    }

    pub fn workspace_cleanup(&self, result: &'static str) {
        self.workspace_cleanups.get_or_create(&ResultLabels { result }).inc();
    }

    pub fn command_limit_exceeded(&self, limit: iop_proto::pb::CommandLimit) {
        if let Some(limit) = limit.label() {
            self.command_limits.get_or_create(&LimitLabels { limit }).inc();
        }
    }

    pub fn workspace_frame_dropped(&self, reason: &'static str) {
        self.workspace_dropped.get_or_create(&ReasonLabels { reason }).inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// Serves `GET /metrics` on `addr` until the process ends.
pub async fn serve(addr: SocketAddr, metrics: Arc<NodeMetrics>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = metrics.clone();
            async move { metrics.encode() }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(bound)
}
