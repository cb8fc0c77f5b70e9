//! The runtime health overlay: what the Edge believes about each provider's
//! health, learned from the node (readiness, the node's own probes,
//! CAPABILITIES answers) and from runs (stall and unreachable evidence),
//! kept apart from config (config is never mutated) and fenced by
//! connection generation and health observation sequence.
//!
//! Rules (pure, in [`HealthOverlay::apply`]):
//! - evidence counts only from the provider's node's *current* generation;
//! - within a provider, evidence must be strictly newer than the last
//!   applied one, ordered by (generation, sequence); older or equal is stale.
//!   Readiness is observation 0 of its connection, so it always starts the
//!   new generation's history;
//! - evidence about a provider changes only that provider;
//! - readiness and the node's probe reports state the provider's health:
//!   they set it in both directions (`unknown` included);
//! - a run's stall evidence only lowers (a stalled request on a provider
//!   that is fine changes nothing);
//! - a CAPABILITIES answer only recovers: `available` raises a provider that
//!   is not available, every other answer is ignored (the spec's rule: an
//!   `unavailable` answer is a no-op).
//!
//! [`ProviderView`] combines config, the node's session and the overlay into
//! the one definition of a provider's effective health and of whether it may
//! receive runs, used by admission and by the admin snapshot alike.
//!
//! [`StallHandoff`] is the Edge's terminal handoff: it validates that a stall
//! terminal came from the run's current reception generation, annotates it
//! (`provider_id`, validated evidence, `recovery_handoff=confirmed`) and
//! applies it to the overlay.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use iop_proto::config::ProviderEntry;
use iop_proto::pb;

use crate::core::credential::CredentialState;
use crate::core::health::{
    self, Applied, Evidence, OverlayEntry, OverlayState, ProviderView, evidence_source, health_label,
};
use crate::core::lease::Lease;
use crate::credentials::CredentialHealth;
use crate::metrics::{EdgeMetrics, EvidenceLabels, TransitionLabels};
use crate::node::registry::NodeRegistry;

#[derive(Debug, Default)]
pub struct HealthOverlay {
    entries: Mutex<HashMap<String, OverlayEntry>>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl HealthOverlay {
    pub fn apply(&self, provider: &str, evidence: Evidence) -> Applied {
        let mut entries = self.entries.lock().unwrap();
        let (applied, next) = health::apply(entries.get(provider), evidence, now_ms());
        if let Some(next) = next {
            entries.insert(provider.to_string(), next);
        }
        applied
    }

    /// Providers whose last evidence lowered them.
    pub fn unavailable(&self) -> Vec<String> {
        let entries = self.entries.lock().unwrap();
        entries.iter().filter(|(_, e)| e.state == OverlayState::Unavailable).map(|(p, _)| p.clone()).collect()
    }

    pub fn get(&self, provider: &str) -> Option<OverlayEntry> {
        self.entries.lock().unwrap().get(provider).cloned()
    }
}

impl ProviderView {
    /// `provider` as the registry, the overlay and the credentials say now
    /// (each read under its own lock, one after the other).
    pub fn of(
        registry: &NodeRegistry,
        overlay: &HealthOverlay,
        credentials: &CredentialHealth,
        provider: &ProviderEntry,
    ) -> Self {
        let entry = registry
            .ready_generation(&provider.node)
            .and_then(|generation| overlay.get(&provider.id).filter(|e| e.generation == generation));
        Self::combine(entry, credentials.of_provider(provider))
    }
}

/// Publishes every provider of `providers` (the config's) with its
/// effective health, [`ProviderView::health`] (what `/admin/v1/providers`
/// and `/admin/v1/nodes` report), as `iop_edge_provider_health`. The
/// `/metrics` handler calls it with the Edge's current config, registry and
/// overlay before encoding.
///
/// At scrape time rather than on change because the effective health
/// combines three sources written from many places (the config on reloads,
/// the node's session in the registry on connect, readiness and disconnect,
/// the overlay on evidence): computed when scraped, the gauges say exactly
/// what the admin snapshot would say at that moment, no writer can forget
/// them, and the series of a provider a reload removed go at the next
/// scrape. It costs one `ProviderView` per configured provider.
pub fn publish_health(
    metrics: &EdgeMetrics,
    registry: &NodeRegistry,
    overlay: &HealthOverlay,
    credentials: &CredentialHealth,
    providers: &[ProviderEntry],
) {
    let views: Vec<(&str, ProviderView)> =
        providers.iter().map(|p| (p.id.as_str(), ProviderView::of(registry, overlay, credentials, p))).collect();
    let healths: Vec<(&str, OverlayState)> = views.iter().map(|(id, view)| (*id, view.health)).collect();
    metrics.set_provider_health(&healths);
    let credentials: Vec<(&str, CredentialState)> =
        views.iter().filter_map(|(id, view)| Some((*id, view.credential?))).collect();
    metrics.set_provider_credentials(&credentials);
}

/// Applies evidence with its metrics and the dedicated structured log
/// (closed values only: no provider, node or run identities).
pub fn record(overlay: &HealthOverlay, metrics: &EdgeMetrics, provider: &str, evidence: Evidence) -> Applied {
    let applied = overlay.apply(provider, evidence);
    let health = health_label(evidence.health);
    metrics
        .health_evidence
        .get_or_create(&EvidenceLabels { source: evidence.source.label(), health, result: applied.label() })
        .inc();
    let to = match applied {
        Applied::Lowered => Some(OverlayState::Unavailable.label()),
        Applied::Recovered => Some(OverlayState::Available.label()),
        Applied::Unsettled => Some(OverlayState::Unknown.label()),
        _ => None,
    };
    if let Some(to) = to {
        metrics.health_transitions.get_or_create(&TransitionLabels { to }).inc();
    }
    tracing::info!(
        target: "edge_provider_health_observation",
        provider = %provider,
        source = evidence.source.label(),
        health,
        result = applied.label(),
        "provider health evidence"
    );
    applied
}

/// The Edge's terminal handoff for stall evidence.
pub struct StallHandoff {
    pub registry: Arc<NodeRegistry>,
    pub overlay: Arc<HealthOverlay>,
    pub metrics: Arc<EdgeMetrics>,
}

impl StallHandoff {
    /// Validates and applies a terminal carrying health evidence (a stall, or
    /// an unreachable provider the node probed) received for `lease` (the
    /// frames already came through the run's attached stream, so reception
    /// node and generation are the lease's). Annotates the failure.
    pub fn apply(&self, lease: &Lease, failure: &mut pb::ExecutionFailure) {
        let Some(source) = evidence_source(failure) else { return };
        let (health, classification) =
            iop_proto::wire::evidence_pair(failure.provider_health, failure.liveness_classification);
        failure.provider_health = health.into();
        failure.liveness_classification = classification.into();
        failure.provider_id = lease.provider_id().to_string();
        let current = self.registry.current_generation(lease.node());
        if current != Some(lease.generation()) {
            return;
        }
        failure.recovery_handoff = pb::RecoveryHandoff::Confirmed.into();
        let evidence = Evidence {
            source,
            generation: lease.generation(),
            current_generation: current,
            sequence: failure.health_observation_seq,
            health,
        };
        record(&self.overlay, &self.metrics, lease.provider_id(), evidence);
    }
}

#[cfg(test)]
mod tests;
