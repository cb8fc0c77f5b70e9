//! Provider health statuses a node reports (at readiness, in its own probe
//! reports, in CAPABILITIES answers): validation against config (pure) and
//! their application to the runtime overlay. Evidence about one provider is
//! only ever applied to that provider.

use std::collections::HashMap;

use iop_proto::config::EdgeConfig;
use iop_proto::pb;
use iop_proto::wire::closed_enum;

use crate::EdgeState;
use crate::overlay::{self, Applied, Evidence, Source};

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
        recovered |= overlay::record(&state.overlay, &state.metrics, &c.provider_id, evidence) == Applied::Recovered;
    }
    recovered
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> EdgeConfig {
        EdgeConfig::from_yaml(
            r#"
listen: { http: "127.0.0.1:0", grpc: "127.0.0.1:0" }
tls: { ca_file: a, cert_file: b, key_file: c }
trust_domain: t
nodes: [ { name: n1 }, { name: n2 } ]
providers:
  - { id: a, node: n1, adapter: ollama, target: { model: m1, base_url: "http://x" }, models: [ { name: chat } ] }
  - { id: b, node: n2, adapter: openai, target: { model: m2, base_url: "http://y" }, models: [ { name: chat } ] }
"#,
        )
        .unwrap()
    }

    fn status(id: &str, adapter: pb::AdapterKind, target: &str, health: i32, seq: Option<u64>) -> pb::ProviderStatus {
        pb::ProviderStatus {
            provider_id: id.into(),
            health,
            adapter: adapter.into(),
            target_model: target.into(),
            health_observation_seq: seq,
        }
    }

    #[test]
    fn only_exact_unambiguous_sequenced_statuses_count() {
        let available = pb::ProviderHealth::Available.into();
        let ok = status("a", pb::AdapterKind::Ollama, "m1", available, Some(4));
        let check = |statuses: &[pb::ProviderStatus]| check_statuses(&config(), "n1", Source::Probe, statuses);
        assert_eq!(
            check(std::slice::from_ref(&ok)),
            vec![Checked { provider_id: "a".into(), health: pb::ProviderHealth::Available, sequence: 4 }]
        );
        let rejected = [
            status("b", pb::AdapterKind::Openai, "m2", available, Some(4)), // another node's provider
            status("zz", pb::AdapterKind::Ollama, "m1", available, Some(4)), // unknown
            status("a", pb::AdapterKind::Openai, "m1", available, Some(4)), // wrong adapter
            status("a", pb::AdapterKind::Ollama, "other", available, Some(4)), // wrong target
            status("a", pb::AdapterKind::Ollama, "m1", 77, Some(4)),        // malformed health
            status("a", pb::AdapterKind::Ollama, "m1", 0, Some(4)),         // unspecified health
            status("a", pb::AdapterKind::Ollama, "m1", available, None),    // unsequenced
        ];
        for s in rejected {
            assert!(check(std::slice::from_ref(&s)).is_empty(), "{s:?}");
        }
        let ambiguous = [ok.clone(), status("a", pb::AdapterKind::Ollama, "m1", available, Some(5))];
        assert!(check(&ambiguous).is_empty(), "a provider named twice is ambiguous");
    }

    #[test]
    fn readiness_is_observation_zero() {
        let unsequenced = status("a", pb::AdapterKind::Ollama, "m1", pb::ProviderHealth::Unknown.into(), None);
        assert_eq!(
            check_statuses(&config(), "n1", Source::Readiness, &[unsequenced]),
            vec![Checked { provider_id: "a".into(), health: pb::ProviderHealth::Unknown, sequence: 0 }]
        );
    }
}
