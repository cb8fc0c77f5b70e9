//! The state of one Edge process: the owners of its tables, grouped by the
//! stage that uses them, built once by [`crate::Edge`]'s builder and shared
//! as `Arc<EdgeState>` by the request path, the node transport and the
//! admin API. Each owner keeps its own lock; nothing here holds one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use iop_proto::config::{EdgeConfig, ProviderEntry};
use iop_proto::liveness::HeartbeatProfile;
use iop_proto::pb;
use tokio_util::sync::CancellationToken;

use crate::admission::AdmissionPool;
use crate::config::ConfigHandle;
use crate::core::health::{OverlayState, ProviderView};
use crate::core::lease::Lease;
use crate::core::readiness::{Inputs, Readiness, Ready};
use crate::credentials::{LeaseFaults, LeaseScope, Sealed, Sealer};
use crate::dispatch::RunTable;
use crate::http::body::BodyBudget;
use crate::job::slots::JobSlots;
use crate::metrics::EdgeMetrics;
use crate::node::commands::CommandTable;
use crate::node::registry::{GenerationSource, NodeRegistry};
use crate::overlay::{HealthOverlay, StallHandoff};
use crate::ratelimit::RateLimits;
use crate::residency::ResidencyTable;
use crate::usage::Accounting;
use crate::workspace::calls::WorkspaceCalls;

/// How a replica starts and stops (`iop-edge --startup-grace-ms
/// --drain-delay-ms --drain-timeout-ms`), so a rolling update or a
/// scale-up drops nothing.
///
/// Starting, `/readyz` waits until every node of the config holds a Ready
/// session with this replica (or the config lists none, or `startup_grace`
/// passed): a load balancer then sends requests only once this replica can
/// run each model the others run ([`crate::core::readiness`], which also
/// says why a replica once ready stays so until it drains). On the
/// shutdown signal the replica drains: `/readyz` fails and its nodes are
/// told (they reach the other replicas for new work), it keeps serving for
/// `drain_delay` (the time a load balancer takes to see `/readyz`), then
/// stops taking connections and lets the requests in flight finish, all
/// within `drain_timeout`; only then are node sessions closed.
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
    /// Each node's current session (generation, phase).
    pub registry: Arc<NodeRegistry>,
    /// The runtime health overlay ([`crate::overlay`]).
    pub overlay: Arc<HealthOverlay>,
    pub metrics: Arc<EdgeMetrics>,
    /// Where spans go ([`crate::trace`]); off unless
    /// `telemetry.otlp_endpoint` was set at start (a reload does not
    /// change it).
    pub tracer: iop_telemetry::Tracer,
    pub routing: Routing,
    pub link: NodeLink,
    pub replica: Replica,
    /// Test-only: the fault every credential lease gets
    /// (`iop-edge --test-lease-fault`); none in production.
    pub lease_faults: LeaseFaults,
}

/// What chooses, admits and charges a request.
pub struct Routing {
    pub admission: Arc<AdmissionPool>,
    /// Model residency as the nodes report it ([`crate::residency`]).
    pub residency: Arc<ResidencyTable>,
    pub handoff: Arc<StallHandoff>,
    /// Wakes the CAPABILITIES recovery loop (a node became ready, a provider
    /// was lowered).
    pub recovery: Arc<tokio::sync::Notify>,
    /// Per-principal request and token limits ([`crate::ratelimit`]).
    pub rate_limits: Arc<RateLimits>,
    /// Per-principal requests and tokens ([`crate::usage`]).
    pub usage: Arc<Accounting>,
    /// The request body bytes held across the Edge ([`crate::http::body`]).
    pub body_budget: Arc<BodyBudget>,
}

/// What is in flight on the nodes' connections.
pub struct NodeLink {
    pub runs: Arc<RunTable<pb::RunEvent>>,
    pub tunnels: Arc<RunTable<pb::ProviderTunnelFrame>>,
    pub workspace_calls: Arc<WorkspaceCalls>,
    /// Jobs running now, per workspace and per principal.
    pub job_slots: Arc<JobSlots>,
    pub commands: CommandTable,
    pub generations: GenerationSource,
    pub heartbeat: HeartbeatProfile,
}

/// This replica: who it is and where it is in its life.
pub struct Replica {
    /// This replica's id (`iop-edge --replica-id`), told to every node.
    pub id: String,
    pub lifecycle: Lifecycle,
    pub started: std::time::Instant,
    /// Set the first time `/readyz` found this replica ready: it stays
    /// ready until it drains ([`crate::core::readiness`]).
    pub was_ready: AtomicBool,
    /// Cancelled when the shutdown signal arrives: the replica drains
    /// ([`Lifecycle`]) before `shutting_down`.
    pub draining: CancellationToken,
    pub shutting_down: CancellationToken,
    /// `POST /admin/v1/workspaces/{ref}/calls` is served (`iop-edge
    /// --admin-workspace-calls`); off by default.
    pub admin_workspace_calls: bool,
}

impl EdgeState {
    /// `/readyz`: whether this replica can serve, and why
    /// ([`Readiness::of`]), with how many of the config's nodes hold a
    /// Ready session with it and how many it lists. The first answer that
    /// is ready sticks until draining, and is logged. Asked at start, by
    /// each `/readyz` and whenever a node turns ready (so a node lost
    /// between two probes cannot undo a readiness no probe saw yet).
    pub fn readiness(&self) -> (Readiness, usize, usize) {
        let config = self.config.current();
        let held = self.registry.ready_among(config.nodes.iter().map(|n| n.name.as_str()));
        let (ready_nodes, nodes) = (held.iter().filter(|h| **h).count(), held.len());
        let readiness = Readiness::of(Inputs {
            draining: self.replica.draining.is_cancelled(),
            was_ready: self.replica.was_ready.load(Ordering::Relaxed),
            nodes,
            ready_nodes,
            since_start: self.replica.started.elapsed(),
            startup_grace: self.replica.lifecycle.startup_grace,
        });
        if let Readiness::Ready(why) = readiness
            && !self.replica.was_ready.swap(true, Ordering::Relaxed)
        {
            let reason = readiness.reason(ready_nodes, nodes);
            if why == Ready::StartupGrace {
                let missing: Vec<&str> =
                    config.nodes.iter().zip(&held).filter(|(_, h)| !**h).map(|(n, _)| n.name.as_str()).collect();
                tracing::warn!(%reason, ?missing, "ready: their models answer 503 here until they connect");
            } else {
                tracing::info!(%reason, "ready");
            }
        }
        (readiness, ready_nodes, nodes)
    }

    /// The effective health of the configured provider `id` (the one
    /// definition, [`ProviderView`]); `None` when no provider has
    /// that id.
    pub fn provider_health(&self, id: &str) -> Option<OverlayState> {
        let config = self.config.current();
        let provider = config.providers.iter().find(|p| p.id == id)?;
        Some(ProviderView::of(&self.registry, &self.overlay, self.config.credential_health(), provider).health)
    }

    /// Seals the credential lease of the run `lease` on `provider` with
    /// the current credentials ([`Sealer::lease_for`]).
    pub fn seal(
        &self,
        scope: &LeaseScope<'_>,
        provider: Option<&ProviderEntry>,
        lease: &Lease,
    ) -> Result<Option<Sealed>, pb::ExecutionFailure> {
        let (secrets, config) = (self.config.secrets(), self.config.current());
        let sealer = Sealer {
            credentials: &secrets.credentials,
            trust_domain: &config.trust_domain,
            registry: &self.registry,
            metrics: &self.metrics,
            faults: &self.lease_faults,
        };
        sealer.lease_for(scope, provider, lease)
    }

    /// `iop_edge_config_revision`: the revision of the config in force.
    pub fn record_config_revision(&self) {
        self.metrics.config_revision.set(self.config.status().revision as i64);
    }

    /// Every replica of the Edge as nodes are told it: the config's
    /// `replicas`, or this one alone when the config lists none.
    pub fn replica_set(&self, config: &EdgeConfig) -> Vec<String> {
        if config.replicas.is_empty() { vec![self.replica.id.clone()] } else { config.replicas.clone() }
    }

    /// At start and on each reload: nodes keep dialing for the listed
    /// replicas while holding one that is not listed, a deployment mistake
    /// worth a loud line.
    pub fn warn_if_unlisted(&self, config: &EdgeConfig) {
        if !config.replicas.is_empty() && !config.replicas.contains(&self.replica.id) {
            tracing::warn!(replica_id = %self.replica.id, "this replica is not in the config's `replicas`");
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
