//! CAPABILITIES recovery: while the runtime overlay holds lowered providers,
//! ask their nodes for CAPABILITIES (periodically with backoff, and at once
//! when a node becomes ready) and recover a provider only from an exact,
//! current, strictly newer `available` answer.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use iop_proto::config::EdgeConfig;
use iop_proto::pb;
use iop_proto::wire::closed_enum;

use crate::EdgeState;
use crate::overlay::{self, Evidence, Source};

const FIRST_DELAY: Duration = Duration::from_secs(1);
const MAX_DELAY: Duration = Duration::from_secs(30);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// One provider's evidence from a CAPABILITIES answer, after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub provider_id: String,
    pub health: pb::ProviderHealth,
    pub sequence: u64,
}

/// Validates a CAPABILITIES answer from `node` (pure): every status must
/// name a provider of that node with its exact adapter and target, a known
/// health and a sequence; a provider named more than once is ambiguous.
/// Invalid statuses are dropped (they change nothing).
pub fn check_answer(config: &EdgeConfig, node: &str, answer: &pb::Capabilities) -> Vec<Checked> {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for status in &answer.providers {
        *counts.entry(status.provider_id.as_str()).or_default() += 1;
    }
    answer
        .providers
        .iter()
        .filter(|s| counts[s.provider_id.as_str()] == 1)
        .filter_map(|s| {
            let provider = config.providers.iter().find(|p| p.id == s.provider_id && p.node == node)?;
            let exact = s.adapter == i32::from(pb::AdapterKind::from(provider.adapter))
                && s.target_model == provider.target.model;
            let health = closed_enum::<pb::ProviderHealth>("provider_status.health", s.health).ok()?;
            (exact && health != pb::ProviderHealth::Unspecified).then_some(Checked {
                provider_id: s.provider_id.clone(),
                health,
                sequence: s.health_observation_seq?,
            })
        })
        .collect()
}

pub async fn run(state: Arc<EdgeState>) {
    let mut delay = FIRST_DELAY;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = state.recovery.notified() => delay = FIRST_DELAY,
        }
        let lowered = state.overlay.unavailable();
        if lowered.is_empty() {
            delay = FIRST_DELAY;
            continue;
        }
        let config = state.config.current();
        let mut nodes: Vec<&str> =
            config.providers.iter().filter(|p| lowered.contains(&p.id)).map(|p| p.node.as_str()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        for node in nodes {
            probe_node(&state, node).await;
        }
        delay = (delay * 2).min(MAX_DELAY);
    }
}

async fn probe_node(state: &EdgeState, node: &str) {
    let (Some(control), Some(generation)) = (state.registry.control_of(node), state.registry.current_generation(node))
    else {
        return;
    };
    let command = pb::NodeCommand { kind: pb::CommandKind::Capabilities.into(), ..Default::default() };
    let Ok(result) = state.commands.send(&control, command, COMMAND_TIMEOUT).await else { return };
    let Some(pb::node_command_result::Result::Capabilities(answer)) = result.result else { return };
    for checked in check_answer(&state.config.current(), node, &answer) {
        let evidence = Evidence {
            source: Source::Capabilities,
            generation,
            // The answer counts only if that connection is still current.
            current_generation: state.registry.current_generation(node),
            sequence: Some(checked.sequence),
            health: checked.health,
        };
        if overlay::record(&state.overlay, &state.metrics, &checked.provider_id, evidence)
            == overlay::Applied::Recovered
        {
            state.admission.drain_queues();
        }
    }
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
    fn only_exact_unambiguous_sequenced_answers_count() {
        let available = pb::ProviderHealth::Available.into();
        let ok = status("a", pb::AdapterKind::Ollama, "m1", available, Some(4));
        let answer = |providers| pb::Capabilities { providers };
        assert_eq!(
            check_answer(&config(), "n1", &answer(vec![ok.clone()])),
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
            assert!(check_answer(&config(), "n1", &answer(vec![s.clone()])).is_empty(), "{s:?}");
        }
        let ambiguous = answer(vec![ok.clone(), status("a", pb::AdapterKind::Ollama, "m1", available, Some(5))]);
        assert!(check_answer(&config(), "n1", &ambiguous).is_empty(), "a provider named twice is ambiguous");
    }
}
