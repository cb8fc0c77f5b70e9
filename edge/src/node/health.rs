//! Provider health statuses a node reports (at readiness, in its own probe
//! reports, in CAPABILITIES answers): validation against config (pure) and
//! their application to the runtime overlay. Evidence about one provider is
//! only ever applied to that provider.

use std::collections::HashMap;

use iop_proto::config::EdgeConfig;
use iop_proto::pb;
use iop_proto::wire::closed_enum;

use crate::core::health::{Applied, Evidence, Source};
use crate::overlay;
use crate::state::EdgeState;

/// One provider's evidence from a node's status list, after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub provider_id: String,
    pub health: pb::ProviderHealth,
    pub sequence: u64,
}

/// Validates statuses from `node` (pure): every status must name a provider
/// of that node with its exact adapter and target and a known health; a
/// provider named more than once is ambiguous. Readiness is observation 0
/// of its connection; every other source must carry a sequence. Invalid
/// statuses are dropped (they change nothing).
pub fn check_statuses(
    config: &EdgeConfig,
    node: &str,
    source: Source,
    statuses: &[pb::ProviderStatus],
) -> Vec<Checked> {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for status in statuses {
        *counts.entry(status.provider_id.as_str()).or_default() += 1;
    }
    statuses
        .iter()
        .filter(|s| counts[s.provider_id.as_str()] == 1)
        .filter_map(|s| {
            let provider = config.providers.iter().find(|p| p.id == s.provider_id && p.node == node)?;
            let exact = s.adapter == i32::from(pb::AdapterKind::from(provider.adapter))
                && s.target_model == provider.target.model;
            let health = closed_enum::<pb::ProviderHealth>("provider_status.health", s.health).ok()?;
            let sequence = match source {
                Source::Readiness => 0,
                _ => s.health_observation_seq?,
            };
            (exact && health != pb::ProviderHealth::Unspecified).then_some(Checked {
                provider_id: s.provider_id.clone(),
                health,
                sequence,
            })
        })
        .collect()
}

/// Applies `node`'s statuses received on `generation` to the overlay. At
/// readiness, a provider of the node without a valid status is unavailable
/// on this connection (the node does not run it). Returns whether any
/// provider became available (queued requests may now be admitted).
pub fn apply_statuses(
    state: &EdgeState,
    node: &str,
    generation: u64,
    source: Source,
    statuses: &[pb::ProviderStatus],
) -> bool {
    let config = state.config.current();
    let mut checked = check_statuses(&config, node, source, statuses);
    if source == Source::Readiness {
        for provider in config.providers.iter().filter(|p| p.node == node) {
            if !checked.iter().any(|c| c.provider_id == provider.id) {
                checked.push(Checked {
                    provider_id: provider.id.clone(),
                    health: pb::ProviderHealth::Unavailable,
                    sequence: 0,
                });
            }
        }
    }
    let mut recovered = false;
    for c in checked {
        let evidence = Evidence {
            source,
            generation,
            // Evidence counts only while its connection is still current.
            current_generation: state.registry.current_generation(node),
            sequence: Some(c.sequence),
            health: c.health,
        };
        let applied = overlay::record(&state.overlay, &state.metrics, &c.provider_id, evidence);
        if applied == Applied::Recovered {
            // Seen down and up again: its outlier history is stale.
            state.routing.admission.forgive(&c.provider_id);
        }
        recovered |= applied == Applied::Recovered;
    }
    recovered
}

#[cfg(test)]
mod tests;
