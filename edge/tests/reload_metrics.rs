//! A config reload through `reload::apply` on a bound Edge keeps the
//! metrics about configured things in step with the config: the series of a
//! removed node, provider and route go, and the server certificate's expiry
//! is the reloaded file's. Real certificates (rcgen) in a temporary directory.

use std::path::{Path, PathBuf};

use iop_edge::metrics::{EdgeMetrics, NodeLabels};
use iop_edge::node::tls::AcceptPolicy;
use iop_edge::reload::{self, Loaded};
use iop_proto::config::EdgeConfig;
use iop_proto::liveness::HeartbeatProfile;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
    SanType, date_time_ymd,
};

/// Writes `ca.pem`, and `edge.pem` / `edge.key` valid until January 1st of
/// `until`, into `dir`.
fn write_pki(dir: &Path, ca: &CertifiedIssuer<'static, KeyPair>, until: i32) {
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    let mut params = CertificateParams::default();
    params.subject_alt_names = vec![SanType::DnsName("localhost".try_into().unwrap())];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.not_before = date_time_ymd(2020, 1, 1);
    params.not_after = date_time_ymd(until, 1, 1);
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, ca).unwrap();
    std::fs::write(dir.join("edge.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("edge.key"), key.serialize_pem()).unwrap();
}

fn ca() -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// Nodes n1 and n2; provider a on n1 serves `chat`, b on n2 serves `code`.
fn config(dir: &Path) -> EdgeConfig {
    let file = |name: &str| -> PathBuf { dir.join(name) };
    EdgeConfig::from_yaml(&format!(
        r#"
listen: {{ http: "127.0.0.1:0", grpc: "127.0.0.1:0", admin: "127.0.0.1:0" }}
tls: {{ ca_file: "{}", cert_file: "{}", key_file: "{}" }}
trust_domain: iop.local
auth: {{ mode: disabled }}
nodes: [ {{ name: n1 }}, {{ name: n2 }} ]
providers:
  - {{ id: a, node: n1, adapter: ollama, target: {{ model: m, base_url: "http://x" }}, models: [ {{ name: chat }} ] }}
  - {{ id: b, node: n2, adapter: ollama, target: {{ model: m, base_url: "http://x" }}, models: [ {{ name: code }} ] }}
"#,
        file("ca.pem").display(),
        file("edge.pem").display(),
        file("edge.key").display(),
    ))
    .unwrap()
}

fn loaded(config: EdgeConfig) -> Loaded {
    let rules = reload::rules(&config).unwrap();
    let secrets = iop_edge::config::Secrets::load(&config).unwrap();
    Loaded { config, rules, secrets }
}

/// The exposed lines of the metrics that name a configured thing.
fn lines(metrics: &EdgeMetrics) -> Vec<String> {
    let names = [
        "iop_edge_in_flight",
        "iop_edge_provider_health",
        "iop_edge_node_certificate_expiry_timestamp_seconds",
        "iop_edge_server_certificate_expiry_timestamp_seconds",
    ];
    let text = metrics.encode();
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| names.iter().any(|n| l.strip_prefix(n).is_some_and(|rest| rest.starts_with(['{', ' ']))))
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

#[tokio::test]
async fn a_reload_removes_the_series_of_what_it_removed_and_records_the_new_server_certificate() {
    iop_edge::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let ca = ca();
    write_pki(dir.path(), &ca, 2091);
    let edge = iop_edge::Edge::bind(config(dir.path()), HeartbeatProfile::default()).await.unwrap();
    let state = edge.state();
    let metrics = state.metrics.clone();
    let policy = AcceptPolicy::new(loaded(config(dir.path())).rules);
    // What `/metrics` does before encoding.
    let scrape = || {
        let config = state.config.current();
        iop_edge::overlay::publish_health(
            &state.metrics,
            &state.registry,
            &state.overlay,
            state.config.credential_health(),
            &config.providers,
        );
        lines(&metrics)
    };
    // Both nodes connected once (the accept loop records this; see
    // node::tls's handshake test).
    for (node, until) in [("n1", 4_000_000_000), ("n2", 4_100_000_000)] {
        metrics.node_certificate_expiry.get_or_create(&NodeLabels { node: node.into() }).set(until);
    }
    // The certificate the Edge started with (2091), recorded by `bind`.
    let at_start =
        format!("iop_edge_server_certificate_expiry_timestamp_seconds {}", date_time_ymd(2091, 1, 1).unix_timestamp());
    assert!(scrape().contains(&at_start), "{:?}", scrape());

    write_pki(dir.path(), &ca, 2092);
    reload::apply(&state, &policy, loaded(config(dir.path())));
    let renewed = date_time_ymd(2092, 1, 1).unix_timestamp();
    assert_eq!(
        scrape(),
        [
            r#"iop_edge_in_flight{provider="a"} 0"#.to_string(),
            r#"iop_edge_in_flight{provider="b"} 0"#.to_string(),
            r#"iop_edge_node_certificate_expiry_timestamp_seconds{node="n1"} 4000000000"#.to_string(),
            r#"iop_edge_node_certificate_expiry_timestamp_seconds{node="n2"} 4100000000"#.to_string(),
            r#"iop_edge_provider_health{provider="a",health="available"} 0"#.to_string(),
            r#"iop_edge_provider_health{provider="a",health="unavailable"} 0"#.to_string(),
            r#"iop_edge_provider_health{provider="a",health="unknown"} 1"#.to_string(),
            r#"iop_edge_provider_health{provider="b",health="available"} 0"#.to_string(),
            r#"iop_edge_provider_health{provider="b",health="unavailable"} 0"#.to_string(),
            r#"iop_edge_provider_health{provider="b",health="unknown"} 1"#.to_string(),
            format!("iop_edge_server_certificate_expiry_timestamp_seconds {renewed}"),
        ]
    );

    // Node n2 and its provider b (the only one serving `code`) go.
    let mut next = config(dir.path());
    next.nodes.retain(|n| n.name == "n1");
    next.providers.retain(|p| p.id == "a");
    write_pki(dir.path(), &ca, 2093);
    reload::apply(&state, &policy, loaded(next));
    let renewed = date_time_ymd(2093, 1, 1).unix_timestamp();
    assert_eq!(
        scrape(),
        [
            r#"iop_edge_in_flight{provider="a"} 0"#.to_string(),
            r#"iop_edge_node_certificate_expiry_timestamp_seconds{node="n1"} 4000000000"#.to_string(),
            r#"iop_edge_provider_health{provider="a",health="available"} 0"#.to_string(),
            r#"iop_edge_provider_health{provider="a",health="unavailable"} 0"#.to_string(),
            r#"iop_edge_provider_health{provider="a",health="unknown"} 1"#.to_string(),
            format!("iop_edge_server_certificate_expiry_timestamp_seconds {renewed}"),
        ]
    );
    drop(edge);
}
