//! The runtime health overlay: provider health learned from stall evidence
//! and CAPABILITIES answers, kept apart from config (config health is never
//! mutated) and fenced by connection generation and health observation
//! sequence.
//!
//! Rules (pure, in [`HealthOverlay::apply`]):
//! - evidence counts only from the provider's node's *current* generation;
//! - within a provider, evidence must be strictly newer than the last
//!   applied one, ordered by (generation, sequence); older or equal is stale;
//! - only `unavailable` evidence lowers a provider; an `available` stall
//!   (the request stalled, the provider is fine) changes nothing;
//! - only a CAPABILITIES `available` answer recovers a lowered provider.
//!
//! [`StallHandoff`] is the Edge's terminal handoff: it validates that a stall
//! terminal came from the run's current reception generation, annotates it
//! (`provider_id`, validated evidence, `recovery_handoff=confirmed`) and
//! applies it to the overlay.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use iop_proto::pb::{self, FailureKind, ProviderHealth};
use serde::Serialize;

use crate::admission::Lease;
use crate::metrics::{EdgeMetrics, EvidenceLabels, TransitionLabels};
use crate::node::registry::NodeRegistry;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OverlayState {
    Available,
    Unavailable,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OverlayEntry {
    pub state: OverlayState,
    /// Generation and sequence of the last applied evidence.
    pub generation: u64,
    pub sequence: u64,
    pub since_ms: u64,
}

/// Where evidence came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A run's terminal evidence (stall or unreachable provider).
    Stall,
    Capabilities,
}

impl Source {
    pub fn label(self) -> &'static str {
        match self {
            Self::Stall => "stall",
            Self::Capabilities => "capabilities",
        }
    }
}

/// One piece of evidence about one provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evidence {
    pub source: Source,
    /// Generation of the connection the evidence arrived on.
    pub generation: u64,
    /// The node's current generation when it is applied.
    pub current_generation: Option<u64>,
    pub sequence: Option<u64>,
    pub health: ProviderHealth,
}

/// What applying evidence did (the metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Lowered,
    Recovered,
    /// Fresh, recorded, no state change.
    Recorded,
    StaleGeneration,
    StaleSequence,
    Unsequenced,
}

impl Applied {
    pub fn label(self) -> &'static str {
        match self {
            Self::Lowered => "lowered",
            Self::Recovered => "recovered",
            Self::Recorded => "recorded",
            Self::StaleGeneration => "stale_generation",
            Self::StaleSequence => "stale_sequence",
            Self::Unsequenced => "unsequenced",
        }
    }
}

#[derive(Debug, Default)]
pub struct HealthOverlay {
    entries: Mutex<HashMap<String, OverlayEntry>>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl HealthOverlay {
    pub fn apply(&self, provider: &str, evidence: Evidence) -> Applied {
        if evidence.current_generation != Some(evidence.generation) {
            return Applied::StaleGeneration;
        }
        let Some(sequence) = evidence.sequence else { return Applied::Unsequenced };
        let mut entries = self.entries.lock().unwrap();
        if let Some(entry) = entries.get(provider)
            && (evidence.generation, sequence) <= (entry.generation, entry.sequence)
        {
            return Applied::StaleSequence;
        }
        let previous = entries.get(provider).map(|e| e.state);
        let next = match (evidence.source, evidence.health, previous) {
            (_, ProviderHealth::Unavailable, _) => OverlayState::Unavailable,
            (Source::Capabilities, ProviderHealth::Available, Some(OverlayState::Unavailable)) => {
                OverlayState::Available
            }
            (_, _, previous) => previous.unwrap_or(OverlayState::Available),
        };
        let since_ms = match previous {
            Some(state) if state == next => entries[provider].since_ms,
            _ => now_ms(),
        };
        entries.insert(
            provider.to_string(),
            OverlayEntry { state: next, generation: evidence.generation, sequence, since_ms },
        );
        match (previous, next) {
            (Some(OverlayState::Unavailable), OverlayState::Available) => Applied::Recovered,
            (Some(OverlayState::Unavailable), OverlayState::Unavailable) => Applied::Recorded,
            (_, OverlayState::Unavailable) => Applied::Lowered,
            _ => Applied::Recorded,
        }
    }

    pub fn is_unavailable(&self, provider: &str) -> bool {
        self.entries.lock().unwrap().get(provider).is_some_and(|e| e.state == OverlayState::Unavailable)
    }

    /// Providers currently lowered.
    pub fn unavailable(&self) -> Vec<String> {
        let entries = self.entries.lock().unwrap();
        entries.iter().filter(|(_, e)| e.state == OverlayState::Unavailable).map(|(p, _)| p.clone()).collect()
    }

    pub fn get(&self, provider: &str) -> Option<OverlayEntry> {
        self.entries.lock().unwrap().get(provider).cloned()
    }
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
        Applied::Lowered => Some("unavailable"),
        Applied::Recovered => Some("available"),
        _ => None,
    };
    if let Some(to) = to {
        metrics.health_transitions.get_or_create(&TransitionLabels { to }).inc();
    }
    tracing::info!(
        target: "edge_provider_health_observation",
        source = evidence.source.label(),
        health,
        result = applied.label(),
        "provider health evidence"
    );
    applied
}

pub fn health_label(health: ProviderHealth) -> &'static str {
    match health {
        ProviderHealth::Available => "available",
        ProviderHealth::Unavailable => "unavailable",
        ProviderHealth::Unknown | ProviderHealth::Unspecified => "unknown",
    }
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
        let carries_evidence = match failure.kind() {
            FailureKind::ResponseStalled => true,
            FailureKind::ProviderUnreachable => failure.provider_health != 0,
            _ => false,
        };
        if !carries_evidence {
            return;
        }
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
            source: Source::Stall,
            generation: lease.generation(),
            current_generation: current,
            sequence: failure.health_observation_seq,
            health,
        };
        record(&self.overlay, &self.metrics, lease.provider_id(), evidence);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(source: Source, generation: u64, current: u64, sequence: u64, health: ProviderHealth) -> Evidence {
        Evidence { source, generation, current_generation: Some(current), sequence: Some(sequence), health }
    }

    #[test]
    fn only_fresh_unavailable_evidence_lowers_and_only_capabilities_recovers() {
        let o = HealthOverlay::default();
        assert_eq!(o.apply("p", ev(Source::Stall, 1, 1, 1, ProviderHealth::Available)), Applied::Recorded);
        assert!(!o.is_unavailable("p"), "a stalled request on a healthy provider does not lower it");
        assert_eq!(o.apply("p", ev(Source::Stall, 1, 1, 2, ProviderHealth::Unknown)), Applied::Recorded);
        assert!(!o.is_unavailable("p"));
        assert_eq!(o.apply("p", ev(Source::Stall, 1, 1, 3, ProviderHealth::Unavailable)), Applied::Lowered);
        assert!(o.is_unavailable("p"));
        assert_eq!(o.apply("p", ev(Source::Stall, 1, 1, 4, ProviderHealth::Available)), Applied::Recorded);
        assert!(o.is_unavailable("p"), "stall evidence never recovers");
        assert_eq!(o.apply("p", ev(Source::Capabilities, 1, 1, 5, ProviderHealth::Unknown)), Applied::Recorded);
        assert!(o.is_unavailable("p"));
        assert_eq!(o.apply("p", ev(Source::Capabilities, 1, 1, 6, ProviderHealth::Available)), Applied::Recovered);
        assert!(!o.is_unavailable("p"));
        assert_eq!(o.unavailable(), Vec::<String>::new());
    }

    #[test]
    fn stale_generations_and_sequences_are_ignored() {
        let o = HealthOverlay::default();
        assert_eq!(o.apply("p", ev(Source::Stall, 1, 2, 9, ProviderHealth::Unavailable)), Applied::StaleGeneration);
        assert!(!o.is_unavailable("p"));
        let mut unbound = ev(Source::Stall, 2, 2, 0, ProviderHealth::Unavailable);
        unbound.sequence = None;
        assert_eq!(o.apply("p", unbound), Applied::Unsequenced);
        assert_eq!(o.apply("p", ev(Source::Stall, 2, 2, 5, ProviderHealth::Unavailable)), Applied::Lowered);
        assert_eq!(o.apply("p", ev(Source::Capabilities, 2, 2, 5, ProviderHealth::Available)), Applied::StaleSequence);
        assert_eq!(o.apply("p", ev(Source::Capabilities, 2, 2, 4, ProviderHealth::Available)), Applied::StaleSequence);
        assert!(o.is_unavailable("p"), "equal or older sequences change nothing");
        // A newer connection restarts its sequence at 1, and is still newer.
        assert_eq!(o.apply("p", ev(Source::Capabilities, 3, 3, 1, ProviderHealth::Available)), Applied::Recovered);
        let entry = o.get("p").unwrap();
        assert_eq!((entry.generation, entry.sequence, entry.state), (3, 1, OverlayState::Available));
    }

    #[test]
    fn concurrent_evidence_applies_each_sequence_once() {
        let o = Arc::new(HealthOverlay::default());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let o = o.clone();
                std::thread::spawn(move || {
                    (1..=500u64)
                        .filter(|seq| {
                            o.apply("p", ev(Source::Stall, 1, 1, seq * 4 + t, ProviderHealth::Unavailable))
                                != Applied::StaleSequence
                        })
                        .count()
                })
            })
            .collect();
        let applied: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(applied >= 500, "the newest sequence of each round is applied");
        assert_eq!(o.get("p").unwrap().sequence, 2003, "the overlay ends at the highest sequence");
    }
}
