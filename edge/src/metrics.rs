//! Prometheus metrics of the Edge. Every label value comes from a closed enum
//! so cardinality is bounded: no ids, model names, paths or prompts.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::core::credential::CredentialState;
use crate::core::health::OverlayState;
use crate::core::residency::Residency;

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Api {
    chat_completions,
    responses,
    messages,
    embeddings,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub api: Api,
    /// A public model name from the config, or "unknown": never a name a
    /// client made up.
    pub route: String,
    /// "ok" or an `ApiError::code()`, a closed set.
    pub outcome: &'static str,
}

/// A provider id or route name: both come from the config, so the label
/// set is bounded by it.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabels {
    pub provider: String,
}

/// A provider's managed credential as a state set: one series per state.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderCredentialLabels {
    /// A configured provider id.
    pub provider: String,
    /// ok | disabled | invalid | rejected (`CredentialState::label`)
    pub state: &'static str,
}

/// A provider's effective health as a state set: one series per health.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderHealthLabels {
    /// A configured provider id.
    pub provider: String,
    /// available | unavailable | unknown (`OverlayState::label`)
    pub health: &'static str,
}

/// A configured provider and one figure of its learned pace
/// (`prefill_per_1k_tokens` | `stall`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderPaceLabels {
    pub provider: String,
    pub figure: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderResidencyLabels {
    /// A configured provider id.
    pub provider: String,
    /// loaded | not_loaded | unknown (`Residency::label`)
    pub state: &'static str,
}

/// A configured node's name (the identity check admits no other).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub node: String,
}

/// A configured node and the limit that refused it
/// (`node::limits::LimitRefusal::label`, a closed set).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLimitLabels {
    pub node: String,
    pub limit: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvidenceLabels {
    /// stall | capabilities
    pub source: &'static str,
    /// available | unavailable | unknown
    pub health: &'static str,
    /// `overlay::Applied::label()`
    pub result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    /// available | unavailable
    pub to: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RecoveryLabels {
    /// A closed set per metric (see `gate`).
    pub result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryPathLabels {
    /// equal_provider | same_provider | lower_priority | no_alternative |
    /// none (`retry::RetryPlan::label`)
    pub path: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    pub provider: String,
    /// committed | retried | failed | relayed_error
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabels {
    pub api: Api,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiRouteLabels {
    pub api: Api,
    /// A configured public model name or "unknown".
    pub route: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

/// A principal's name: bounded by the keys file, never a raw key.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PrincipalLabels {
    pub principal: String,
}

/// A principal, a configured public model, a token kind (`input`,
/// `output`, `reasoning`) and how the count was obtained
/// (`usage::Source::label`: provider | counted | estimated): every value
/// is configured or closed.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    pub principal: String,
    pub model: String,
    pub kind: &'static str,
    pub source: &'static str,
}

/// A principal and the per-key limit that refused it
/// (`ratelimit::Limit::label`: requests | tokens | concurrency).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RateLimitedLabels {
    pub principal: String,
    pub limit: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

/// A job stage (`job::state::Stage::label`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub stage: &'static str,
}

/// A job's tool (`workspace_read`, ...) and the call's closed result.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolLabels {
    pub tool: &'static str,
    pub result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: &'static str,
}

pub struct EdgeMetrics {
    registry: Registry,
    pub http_requests: Family<RequestLabels, Counter>,
    pub http_request_duration: Family<ApiRouteLabels, Histogram>,
    pub time_to_first_byte: Family<ApiLabels, Histogram>,
    pub handshake_rejections: Family<ReasonLabels, Counter>,
    pub sessions_closed: Family<ReasonLabels, Counter>,
    pub ready_nodes: Gauge,
    pub fenced_frames: Family<ReasonLabels, Counter>,
    pub runs: Family<OutcomeLabels, Counter>,
    pub lease_releases: Family<ReasonLabels, Counter>,
    pub leases_acquired: Counter,
    pub attempts: Family<AttemptLabels, Counter>,
    pub in_flight: Family<ProviderLabels, Gauge>,
    /// `iop_edge_provider_ejections_total`: outlier ejections per provider.
    pub provider_ejections: Family<ProviderLabels, Counter>,
    /// `iop_edge_provider_ejected`: 1 while the provider is ejected.
    pub provider_ejected: Family<ProviderLabels, Gauge>,
    pub queue_depth: Family<RouteLabels, Gauge>,
    pub health_evidence: Family<EvidenceLabels, Counter>,
    pub health_transitions: Family<TransitionLabels, Counter>,
    /// Set through [`EdgeMetrics::set_provider_health`] only.
    provider_health: Family<ProviderHealthLabels, Gauge>,
    /// The providers `provider_health` has series of; held for a whole
    /// refresh, so concurrent refreshes do not interleave.
    provider_health_series: Mutex<BTreeSet<String>>,
    /// Set through [`EdgeMetrics::set_provider_credentials`] only.
    provider_credential: Family<ProviderCredentialLabels, Gauge>,
    provider_credential_series: Mutex<BTreeSet<String>>,
    /// Set through [`EdgeMetrics::set_provider_residency`] only.
    provider_residency: Family<ProviderResidencyLabels, Gauge>,
    provider_residency_series: Mutex<BTreeSet<String>>,
    /// Set through [`EdgeMetrics::set_provider_pace`] only.
    provider_pace: Family<ProviderPaceLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// notAfter (Unix seconds) of the certificate each node presented at its
    /// last accepted handshake.
    pub node_certificate_expiry: Family<NodeLabels, Gauge>,
    /// notAfter (Unix seconds) of the Edge's serving certificate as loaded.
    pub server_certificate_expiry: Gauge,
    pub recovery_eligibility: Family<RecoveryLabels, Counter>,
    pub recovery_results: Family<RecoveryLabels, Counter>,
    /// Where each failed attempt before the commit point went next.
    pub retry_paths: Family<RetryPathLabels, Counter>,
    /// Breaks after text and what became of them (`crate::continuation`).
    pub continuations: Family<RecoveryLabels, Counter>,
    pub config_revision: Gauge,
    pub config_reloads: Family<RecoveryLabels, Counter>,
    pub node_handshakes_in_progress: Gauge,
    /// Calls, connections and message bytes a node was refused past its
    /// limits (`node::limits`).
    pub node_limit_refusals: Family<NodeLimitLabels, Counter>,
    pub node_connections: Family<NodeLabels, Gauge>,
    pub node_streams: Family<NodeLabels, Gauge>,
    pub node_in_transit_bytes: Family<NodeLabels, Gauge>,
    pub http_connections: Gauge,
    pub http_connections_refused: Family<ReasonLabels, Counter>,
    pub http_body_bytes_in_flight: Gauge,
    pub auth_rejections: Family<ReasonLabels, Counter>,
    pub http_refusals: Family<ReasonLabels, Counter>,
    pub principal_requests: Family<PrincipalLabels, Counter>,
    pub principal_errors: Family<PrincipalLabels, Counter>,
    pub tokens: Family<TokenLabels, Counter>,
    pub node_usage_rejected: Family<NodeLabels, Counter>,
    pub leases_sealed: Counter,
    pub lease_refusals: Family<ReasonLabels, Counter>,
    /// Requests refused by a principal's per-key limits (`ratelimit`).
    pub rate_limited: Family<RateLimitedLabels, Counter>,
    pub workspace_dropped: Family<ReasonLabels, Counter>,
    /// `iop_anthropic_single_request_ingress_total`: Messages jobs, no labels.
    pub anthropic_job_ingress: Counter,
    pub jobs: Family<ApiLabels, Counter>,
    pub job_stage_seconds: Family<StageLabels, Histogram>,
    pub job_tool_calls: Family<ToolLabels, Counter>,
    pub job_cleanups: Family<ResultLabels, Counter>,
    pub job_terminals: Family<StateLabels, Counter>,
    /// Jobs ended because their caller may no longer run them
    /// (`job::standing::Revocation::label`).
    pub job_revoked: Family<ReasonLabels, Counter>,
}

impl EdgeMetrics {
    pub fn new() -> Arc<Self> {
        // Everything is `iop_edge_*` but the one metric the spec names.
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("iop_edge");
        let http_requests = Family::<RequestLabels, Counter>::default();
        registry.register("http_requests", "Client HTTP requests by API and outcome", http_requests.clone());
        let http_request_duration = Family::<ApiRouteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.005, 2.0, 14))
        });
        registry.register(
            "http_request_duration_seconds",
            "Client HTTP request duration until the last byte",
            http_request_duration.clone(),
        );
        let time_to_first_byte = Family::<ApiLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.005, 2.0, 14))
        });
        registry.register(
            "time_to_first_byte_seconds",
            "Client HTTP request arrival until the first response byte",
            time_to_first_byte.clone(),
        );
        let handshake_rejections = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "node_handshake_rejections",
            "Node connections refused during the mTLS handshake or identity check",
            handshake_rejections.clone(),
        );
        let sessions_closed = Family::<ReasonLabels, Counter>::default();
        registry.register("node_sessions_closed", "Node sessions closed, by reason", sessions_closed.clone());
        let ready_nodes = Gauge::default();
        registry.register("ready_nodes", "Nodes whose current connection completed readiness", ready_nodes.clone());
        let fenced_frames = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "fenced_frames",
            "Run, tunnel and workspace frames dropped because their connection generation was fenced or the execution was unknown",
            fenced_frames.clone(),
        );
        let runs = Family::<OutcomeLabels, Counter>::default();
        registry.register("runs", "Runs dispatched to nodes, by terminal outcome", runs.clone());
        let lease_releases = Family::<ReasonLabels, Counter>::default();
        registry.register("lease_releases", "Provider slot leases released, by terminal path", lease_releases.clone());
        let leases_acquired = Counter::default();
        registry.register(
            "leases_acquired",
            "Provider slot leases acquired (each released once: lease_releases)",
            leases_acquired.clone(),
        );
        let attempts = Family::<AttemptLabels, Counter>::default();
        registry.register("attempts", "Provider attempts by outcome", attempts.clone());
        let in_flight = Family::<ProviderLabels, Gauge>::default();
        registry.register("in_flight", "Runs holding a provider slot", in_flight.clone());
        let provider_ejections = Family::<ProviderLabels, Counter>::default();
        registry.register(
            "provider_ejections",
            "Outlier ejections of a provider after generation failures in a row",
            provider_ejections.clone(),
        );
        let provider_ejected = Family::<ProviderLabels, Gauge>::default();
        registry.register(
            "provider_ejected",
            "1 while the provider is ejected from selection as an outlier, else 0",
            provider_ejected.clone(),
        );
        let queue_depth = Family::<RouteLabels, Gauge>::default();
        registry.register("queue_depth", "Requests waiting for capacity, per route", queue_depth.clone());
        let health_evidence = Family::<EvidenceLabels, Counter>::default();
        registry.register(
            "provider_health_evidence",
            "Provider health evidence received, by result",
            health_evidence.clone(),
        );
        let health_transitions = Family::<TransitionLabels, Counter>::default();
        registry.register("provider_health_transitions", "Runtime overlay transitions", health_transitions.clone());
        let provider_health = Family::<ProviderHealthLabels, Gauge>::default();
        registry.register(
            "provider_health",
            "Effective health of each configured provider, as /admin/v1/providers reports it: 1 on its health, 0 on the others",
            provider_health.clone(),
        );
        let provider_credential = Family::<ProviderCredentialLabels, Gauge>::default();
        registry.register(
            "provider_credential",
            "State of each configured provider's managed credential (ok, disabled, invalid, rejected), as /admin/v1/providers reports it: 1 on its state, 0 on the others",
            provider_credential.clone(),
        );
        let provider_pace = Family::<ProviderPaceLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "provider_learned_seconds",
            "What each provider's node learned of its pace: the p95 time to read 1,000 prompt tokens (figure prefill_per_1k_tokens) and the inter-token deadline that follows (figure stall); absent while not learned",
            provider_pace.clone(),
        );
        let provider_residency = Family::<ProviderResidencyLabels, Gauge>::default();
        registry.register(
            "provider_residency",
            "Whether each configured provider's model is in its server's memory (loaded, not_loaded, unknown), as /admin/v1/providers reports it: 1 on its state, 0 on the others",
            provider_residency.clone(),
        );
        let node_certificate_expiry = Family::<NodeLabels, Gauge>::default();
        registry.register(
            "node_certificate_expiry_timestamp_seconds",
            "notAfter (Unix seconds) of the client certificate a node presented at its last accepted handshake",
            node_certificate_expiry.clone(),
        );
        let server_certificate_expiry = Gauge::default();
        registry.register(
            "server_certificate_expiry_timestamp_seconds",
            "notAfter (Unix seconds) of the Edge's serving certificate as loaded (at start and on every applied reload)",
            server_certificate_expiry.clone(),
        );
        let recovery_eligibility = Family::<RecoveryLabels, Counter>::default();
        registry.register(
            "liveness_recovery_eligibility",
            "Stalls seen by the stream gate, by whether they could be replayed",
            recovery_eligibility.clone(),
        );
        let recovery_results = Family::<RecoveryLabels, Counter>::default();
        registry.register("liveness_recovery_results", "Outcomes of stall replays", recovery_results.clone());
        let retry_paths = Family::<RetryPathLabels, Counter>::default();
        registry.register(
            "retry_paths",
            "Failed attempts before the first byte, by where the request went next",
            retry_paths.clone(),
        );
        let continuations = Family::<RecoveryLabels, Counter>::default();
        registry.register(
            "continuations",
            "Committed streams that broke: continued, or why not (continuation)",
            continuations.clone(),
        );
        let config_revision = Gauge::default();
        registry.register(
            "config_revision",
            "Revision of the loaded config (1 at start, +1 per reload)",
            config_revision.clone(),
        );
        let config_reloads = Family::<RecoveryLabels, Counter>::default();
        registry.register("config_reloads", "Config reload attempts: applied or rejected", config_reloads.clone());
        let node_handshakes_in_progress = Gauge::default();
        registry.register(
            "node_handshakes_in_progress",
            "Node TLS handshakes under way (bounded: past it the oldest stranger's unfinished handshake is evicted)",
            node_handshakes_in_progress.clone(),
        );
        let node_limit_refusals = Family::<NodeLimitLabels, Counter>::default();
        registry.register(
            "node_limit_refusals",
            "Node connections, calls and messages refused past the node's limits: connections, streams, message_size, in_transit, compressed",
            node_limit_refusals.clone(),
        );
        let node_connections = Family::<NodeLabels, Gauge>::default();
        registry.register("node_connections", "Open connections per node", node_connections.clone());
        let node_streams = Family::<NodeLabels, Gauge>::default();
        registry.register("node_streams", "Open gRPC calls per node, over its connections", node_streams.clone());
        let node_in_transit_bytes = Family::<NodeLabels, Gauge>::default();
        registry.register(
            "node_in_transit_bytes",
            "Bytes of messages a node announced that have not all reached the Edge's decoder yet",
            node_in_transit_bytes.clone(),
        );
        let http_connections = Gauge::default();
        registry.register(
            "http_connections",
            "Open client HTTP connections (bounded by limits.max_http_connections)",
            http_connections.clone(),
        );
        let http_connections_refused = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "http_connections_refused",
            "HTTP connections closed for others: source_limit (its source's share is full), shed_idle (idle the longest)",
            http_connections_refused.clone(),
        );
        let http_body_bytes_in_flight = Gauge::default();
        registry.register(
            "http_body_bytes_in_flight",
            "Request body bytes held now, read or being answered (bounded by limits.max_body_bytes_in_flight)",
            http_body_bytes_in_flight.clone(),
        );
        let auth_rejections = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "auth_rejections",
            "Client requests refused before parsing: missing_api_key, invalid_api_key, api_key_disabled, api_key_expired",
            auth_rejections.clone(),
        );
        let http_refusals = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "http_refusals",
            "Requests refused by cross-site protection before their handler: not_json, browser_origin, foreign_host",
            http_refusals.clone(),
        );
        let principal_requests = Family::<PrincipalLabels, Counter>::default();
        registry.register(
            "principal_requests",
            "Authenticated client requests per principal",
            principal_requests.clone(),
        );
        let principal_errors = Family::<PrincipalLabels, Counter>::default();
        registry.register(
            "principal_errors",
            "Model requests per principal that ended in an error (any outcome but ok and client_disconnected)",
            principal_errors.clone(),
        );
        let tokens = Family::<TokenLabels, Counter>::default();
        registry.register(
            "tokens",
            "Tokens charged per principal and public model, every attempt however it ended: input, output (reasoning included), reasoning; source provider, counted (the node's count) or estimated",
            tokens.clone(),
        );
        let node_usage_rejected = Family::<NodeLabels, Counter>::default();
        registry.register(
            "node_usage_rejected",
            "Usage reports a node sent beyond what their run could have used, charged at the bound instead",
            node_usage_rejected.clone(),
        );
        let leases_sealed = Counter::default();
        registry.register(
            "credential_leases_sealed",
            "Credential leases sealed for node executions",
            leases_sealed.clone(),
        );
        let lease_refusals = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "credential_lease_refusals",
            "Executions refused before dispatch because no lease could be sealed, by reason",
            lease_refusals.clone(),
        );
        let rate_limited = Family::<RateLimitedLabels, Counter>::default();
        registry.register(
            "rate_limited",
            "Client requests refused by their principal's per-key limits on this replica, by limit",
            rate_limited.clone(),
        );
        let workspace_dropped = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "workspace_frames_dropped",
            "Workspace answers dropped (stale or repeated identity, malformed), by reason",
            workspace_dropped.clone(),
        );
        let jobs = Family::<ApiLabels, Counter>::default();
        registry.register("jobs", "Single-request workspace jobs started, by API", jobs.clone());
        let job_stage_seconds = Family::<StageLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.01, 3.0, 12))
        });
        registry.register("job_stage_seconds", "Time a job spent in one visit of a stage", job_stage_seconds.clone());
        let job_tool_calls = Family::<ToolLabels, Counter>::default();
        registry.register("job_tool_calls", "Workspace tool calls of jobs, by tool and result", job_tool_calls.clone());
        let job_cleanups = Family::<ResultLabels, Counter>::default();
        registry.register("job_cleanups", "Workspace cleanups at the end of jobs, by result", job_cleanups.clone());
        let job_terminals = Family::<StateLabels, Counter>::default();
        registry.register("job_terminals", "Jobs ended, by terminal state", job_terminals.clone());
        let job_revoked = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "job_revoked",
            "Running jobs ended because their caller may no longer run them (key disabled, expired or removed; workspace grant or workspace removed), by reason",
            job_revoked.clone(),
        );
        let anthropic_job_ingress = Counter::default();
        root.register(
            "iop_anthropic_single_request_ingress",
            "Anthropic Messages requests that started a single-request job",
            anthropic_job_ingress.clone(),
        );
        let registry = root;
        Arc::new(Self {
            registry,
            http_requests,
            http_request_duration,
            time_to_first_byte,
            handshake_rejections,
            sessions_closed,
            ready_nodes,
            fenced_frames,
            runs,
            lease_releases,
            leases_acquired,
            attempts,
            in_flight,
            provider_ejections,
            provider_ejected,
            queue_depth,
            health_evidence,
            health_transitions,
            provider_health,
            provider_health_series: Mutex::default(),
            provider_credential,
            provider_credential_series: Mutex::default(),
            provider_residency,
            provider_residency_series: Mutex::default(),
            provider_pace,
            node_certificate_expiry,
            server_certificate_expiry,
            recovery_eligibility,
            recovery_results,
            retry_paths,
            continuations,
            config_revision,
            config_reloads,
            node_handshakes_in_progress,
            node_limit_refusals,
            node_connections,
            node_streams,
            node_in_transit_bytes,
            http_connections,
            http_connections_refused,
            http_body_bytes_in_flight,
            auth_rejections,
            http_refusals,
            principal_requests,
            principal_errors,
            tokens,
            node_usage_rejected,
            leases_sealed,
            lease_refusals,
            rate_limited,
            workspace_dropped,
            anthropic_job_ingress,
            jobs,
            job_stage_seconds,
            job_tool_calls,
            job_cleanups,
            job_terminals,
            job_revoked,
        })
    }

    pub fn reason(&self, family: &Family<ReasonLabels, Counter>, reason: &'static str) {
        family.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// Makes `iop_edge_provider_health` the state set of `providers` (every
    /// configured provider with its effective health): 1 on the provider's
    /// health, 0 on the others; the series of providers not listed (a
    /// reload removed them) are removed.
    pub fn set_provider_health(&self, providers: &[(&str, OverlayState)]) {
        let states: Vec<(&str, &'static str)> = providers.iter().map(|(p, h)| (*p, h.label())).collect();
        let all = OverlayState::ALL.map(OverlayState::label);
        set_state_set(&self.provider_health, &self.provider_health_series, &states, &all, |provider, health| {
            ProviderHealthLabels { provider, health }
        });
    }

    /// Makes `iop_edge_provider_credential` the state set of `providers`
    /// (those with a managed credential), as [`Self::set_provider_health`].
    pub fn set_provider_credentials(&self, providers: &[(&str, CredentialState)]) {
        let states: Vec<(&str, &'static str)> = providers.iter().map(|(p, c)| (*p, c.label())).collect();
        let all = CredentialState::ALL.map(CredentialState::label);
        set_state_set(&self.provider_credential, &self.provider_credential_series, &states, &all, |provider, state| {
            ProviderCredentialLabels { provider, state }
        });
    }

    /// Makes `iop_edge_provider_residency` the state set of `providers`
    /// (every configured provider), as [`Self::set_provider_health`].
    pub fn set_provider_residency(&self, providers: &[(&str, Residency)]) {
        let states: Vec<(&str, &'static str)> = providers.iter().map(|(p, r)| (*p, r.label())).collect();
        let all = Residency::ALL.map(Residency::label);
        set_state_set(&self.provider_residency, &self.provider_residency_series, &states, &all, |provider, state| {
            ProviderResidencyLabels { provider, state }
        });
    }

    /// Makes `iop_edge_provider_learned_seconds` the learned pace of
    /// `providers` (id, ms per 1k prompt tokens, stall ms; 0: not learned,
    /// no series), dropping every other series.
    pub fn set_provider_pace(&self, providers: &[(&str, u64, u64)]) {
        self.provider_pace.clear();
        for &(provider, prefill_ms, stall_ms) in providers {
            for (figure, ms) in [("prefill_per_1k_tokens", prefill_ms), ("stall", stall_ms)] {
                if ms > 0 {
                    let labels = ProviderPaceLabels { provider: provider.to_string(), figure };
                    self.provider_pace.get_or_create(&labels).set(ms as f64 / 1000.0);
                }
            }
        }
    }

    /// Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// Makes `family` the state set of `providers`: for each, 1 on its state
/// and 0 on the other states of `all`; the series of providers no longer
/// listed (a reload removed them) are removed. `series` (the providers the
/// family has series of) is held for the whole refresh, so concurrent
/// refreshes do not interleave.
fn set_state_set<L>(
    family: &Family<L, Gauge>,
    series: &Mutex<BTreeSet<String>>,
    providers: &[(&str, &'static str)],
    all: &[&'static str],
    labels: impl Fn(String, &'static str) -> L,
) where
    L: Clone + std::hash::Hash + Eq,
{
    let mut series = series.lock().unwrap();
    let listed: BTreeSet<String> = providers.iter().map(|(provider, _)| provider.to_string()).collect();
    for gone in series.difference(&listed) {
        for &state in all {
            family.remove(&labels(gone.clone(), state));
        }
    }
    for &(provider, current) in providers {
        for &state in all {
            family.get_or_create(&labels(provider.to_string(), state)).set(i64::from(state == current));
        }
    }
    *series = listed;
}
