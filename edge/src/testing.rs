//! The Edge's unit-test fixtures, one definition each: configs under one
//! header, a node made ready, a lease on a real pool.

use std::collections::HashMap;
use std::sync::Arc;

use iop_proto::config::EdgeConfig;
use iop_proto::pb::ProviderHealth;

use crate::admission::{AdmissionPool, AdmitRequest, LeaseGuard};
use crate::core::health::{Applied, Evidence, Source};
use crate::core::selection::Candidate;
use crate::metrics::EdgeMetrics;
use crate::node::registry::{NodeRegistry, Session};
use crate::overlay::HealthOverlay;

/// What every test config shares: listeners on port 0, TLS files that unit
/// tests never read, trust domain `t`.
const HEADER: &str = r#"listen: { http: "127.0.0.1:0", grpc: "127.0.0.1:0" }
tls: { ca_file: a, cert_file: b, key_file: c }
trust_domain: t
"#;

/// The config of `body` (its nodes, providers and anything else) under the
/// shared header, with `auth: { mode: disabled }` unless `body` sets `auth`.
pub fn config(body: &str) -> EdgeConfig {
    let auth = if body.lines().any(|line| line.starts_with("auth:")) { "" } else { "auth: { mode: disabled }\n" };
    EdgeConfig::from_yaml(&format!("{HEADER}{auth}{body}")).unwrap()
}

/// One ollama provider `p` (public model `chat`) on `node`.
pub fn one_provider_config(node: &str) -> EdgeConfig {
    config(&format!(
        r#"
nodes: [ {{ name: {node} }} ]
providers:
  - {{ id: p, node: {node}, adapter: ollama, target: {{ model: m, base_url: "http://x" }}, models: [ {{ name: chat }} ] }}
"#
    ))
}

/// Two nodes with one provider each (`a` on n1, `b` on n2), one model.
pub fn two_nodes() -> EdgeConfig {
    config(
        r#"
nodes: [ { name: n1 }, { name: n2 } ]
providers:
  - { id: a, node: n1, adapter: ollama, target: { model: m1, base_url: "http://x" }, models: [ { name: chat } ] }
  - { id: b, node: n2, adapter: openai, target: { model: m2, base_url: "http://y" }, models: [ { name: chat } ] }
"#,
    )
}

/// Makes `node`'s registered session on `generation` Ready with
/// `providers` available, as a NodeReady does.
pub fn ready(registry: &NodeRegistry, overlay: &HealthOverlay, node: &str, generation: u64, providers: &[&str]) {
    for provider in providers {
        let evidence = Evidence {
            source: Source::Readiness,
            generation,
            current_generation: registry.current_generation(node),
            sequence: Some(0),
            health: ProviderHealth::Available,
        };
        assert_eq!(overlay.apply(provider, evidence), Applied::Recovered);
    }
    assert!(registry.mark_ready(node, generation));
}

/// A real lease on a one-provider pool whose node `node` is ready on `generation`.
pub fn lease(run_id: &str, node: &str, generation: u64) -> LeaseGuard {
    let config = one_provider_config(node);
    let registry = Arc::new(NodeRegistry::default());
    let (control, _rx) = tokio::sync::mpsc::channel(1);
    registry.register(node, Session::registered(generation, control));
    let overlay = Arc::new(HealthOverlay::default());
    ready(&registry, &overlay, node, generation, &["p"]);
    let pool =
        AdmissionPool::new(&config, registry, overlay, Default::default(), Default::default(), EdgeMetrics::new());
    let candidates: Arc<[Candidate]> =
        Arc::from(vec![Candidate { priority: 0, provider: config.providers[0].clone() }]);
    let request = AdmitRequest { route: "chat".into(), run_id: run_id.into(), candidates, avoid: HashMap::new() };
    pool.try_admit_now(&request).expect("test pool admits")
}
