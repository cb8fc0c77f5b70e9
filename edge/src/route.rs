//! Route: public model name -> ordered candidate providers. Pure; which
//! candidate runs the request is admission's choice
//! ([`crate::core::selection::choose`]), and where a failed attempt goes
//! next is the gate's ([`crate::retry`]).

use iop_proto::config::{EdgeConfig, ProviderEntry};

/// Providers serving `model`, lowest priority value first (config order breaks
/// ties). `None` when no provider serves the model at all.
pub fn candidates<'a>(config: &'a EdgeConfig, model: &str) -> Option<Vec<&'a ProviderEntry>> {
    let mut found: Vec<(u32, usize, &ProviderEntry)> = config
        .providers
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.models.iter().find(|m| m.name == model).map(|m| (m.priority, i, p)))
        .collect();
    if found.is_empty() {
        return None;
    }
    found.sort_by_key(|(priority, index, _)| (*priority, *index));
    Some(found.into_iter().map(|(_, _, p)| p).collect())
}

/// Every public model name, sorted and deduplicated.
pub fn public_models(config: &EdgeConfig) -> Vec<&str> {
    let mut names: Vec<&str> = config.providers.iter().flat_map(|p| p.models.iter().map(|m| m.name.as_str())).collect();
    names.sort_unstable();
    names.dedup();
    names
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
auth: { mode: disabled }
nodes: [ { name: n1 }, { name: n2 } ]
providers:
  - { id: backup, node: n2, adapter: openai, target: { model: m, base_url: "http://x" }, models: [ { name: chat, priority: 1 } ] }
  - { id: main, node: n1, adapter: ollama, target: { model: m, base_url: "http://x" }, models: [ { name: chat, priority: 0 }, { name: other } ] }
"#,
        )
        .unwrap()
    }

    #[test]
    fn candidates_are_ordered_by_priority() {
        let c = config();
        let ids: Vec<_> = candidates(&c, "chat").unwrap().iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["main", "backup"]);
        assert!(candidates(&c, "nope").is_none());
    }

    #[test]
    fn public_models_are_unique() {
        assert_eq!(public_models(&config()), ["chat", "other"]);
    }
}
