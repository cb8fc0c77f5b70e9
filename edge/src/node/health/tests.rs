use super::*;
use crate::testing::two_nodes as config;

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

/// Property tests: whatever statuses a node reports, only exact,
/// unambiguous evidence about that node's own providers counts.
mod fuzz {
    use proptest::prelude::*;

    use super::*;

    /// Ids, adapters, targets, healths and sequences near and far from the
    /// config's: another node's provider, unknown and empty ids, zero and
    /// unknown enum values.
    fn status() -> impl Strategy<Value = pb::ProviderStatus> {
        let id = prop::sample::select(vec!["a", "b", "c", "zz", ""]).prop_map(str::to_string);
        let enum_value = prop_oneof![4 => 0..4i32, 1 => any::<i32>()];
        let target = prop::sample::select(vec!["m1", "m2", "m3", "", "M1"]).prop_map(str::to_string);
        (id, enum_value.clone(), target, enum_value, prop::option::of(any::<u64>())).prop_map(
            |(provider_id, adapter, target_model, health, health_observation_seq)| pb::ProviderStatus {
                provider_id,
                health,
                adapter,
                target_model,
                health_observation_seq,
            },
        )
    }

    fn source() -> impl Strategy<Value = Source> {
        prop::sample::select(vec![
            Source::Readiness,
            Source::Probe,
            Source::Stall,
            Source::Unreachable,
            Source::StreamCut,
            Source::Capabilities,
        ])
    }

    fn three_providers() -> EdgeConfig {
        crate::testing::config(
            r#"
nodes: [ { name: n1 }, { name: n2 } ]
providers:
  - { id: a, node: n1, adapter: ollama, target: { model: m1, base_url: "http://x" }, models: [ { name: chat } ] }
  - { id: b, node: n2, adapter: openai, target: { model: m2, base_url: "http://y" }, models: [ { name: chat } ] }
  - { id: c, node: n1, adapter: openai, target: { model: m3, base_url: "http://z" }, models: [ { name: chat } ] }
"#,
        )
    }

    proptest! {
        #[test]
        fn fuzz_check_statuses_keeps_exactly_the_nodes_own_exact_evidence(
            node in prop::sample::select(vec!["n1", "n2", "n3"]),
            source in source(),
            statuses in prop::collection::vec(status(), 0..6),
        ) {
            let config = three_providers();
            let checked = check_statuses(&config, node, source, &statuses);

            // Sound: only this node's providers, once each, with a known health.
            for c in &checked {
                let provider = config.providers.iter().find(|p| p.id == c.provider_id);
                prop_assert!(provider.is_some_and(|p| p.node == node), "{c:?} is not a provider of {node}");
                prop_assert!(c.health != pb::ProviderHealth::Unspecified);
                prop_assert_eq!(checked.iter().filter(|o| o.provider_id == c.provider_id).count(), 1);
            }
            // Complete: a status named once that matches its provider
            // exactly, with a known health (and a sequence, unless
            // readiness), is kept as sent.
            for s in &statuses {
                let named_once = statuses.iter().filter(|o| o.provider_id == s.provider_id).count() == 1;
                let exact = config.providers.iter().any(|p| {
                    p.id == s.provider_id
                        && p.node == node
                        && s.adapter == i32::from(pb::AdapterKind::from(p.adapter))
                        && s.target_model == p.target.model
                });
                let health = pb::ProviderHealth::try_from(s.health).ok().filter(|h| *h != pb::ProviderHealth::Unspecified);
                let sequence = if source == Source::Readiness { Some(0) } else { s.health_observation_seq };
                let kept = checked.iter().find(|c| c.provider_id == s.provider_id);
                match (named_once && exact, health, sequence) {
                    (true, Some(health), Some(sequence)) => prop_assert_eq!(
                        kept,
                        Some(&Checked { provider_id: s.provider_id.clone(), health, sequence })
                    ),
                    _ if named_once => prop_assert!(kept.is_none(), "{s:?} was kept as {kept:?}"),
                    _ => {}
                }
            }
        }
    }
}
