use super::*;

const VALID: &str =
    "edge: { url: \"https://edge.example:7443\" }\ntls: { ca_file: ca.pem, cert_file: n.pem, key_file: n-key.pem }\n";

#[test]
fn defaults_and_server_name_from_url() {
    let c = NodeConfig::from_yaml(VALID).unwrap();
    assert_eq!(c.server_name().as_deref(), Some("edge.example"));
    assert_eq!(c.edge_host_port(), Some(("edge.example".to_string(), 7443)));
    let default_port = NodeConfig::from_yaml(&VALID.replace(":7443", "")).unwrap();
    assert_eq!(default_port.edge_host_port(), Some(("edge.example".to_string(), 443)));
    let v6 = NodeConfig::from_yaml(&VALID.replace("edge.example", "[::1]")).unwrap();
    assert_eq!(v6.edge_host_port(), Some(("::1".to_string(), 7443)));
    assert_eq!(c.reconnect, ReconnectConfig::default());
    assert_eq!(c.health, HealthConfig::default());
}

#[test]
fn keep_warm_is_off_unless_the_owner_allows_it() {
    assert!(!NodeConfig::from_yaml(VALID).unwrap().models.allow_keep_warm);
    let on = NodeConfig::from_yaml(&format!("{VALID}models: {{ allow_keep_warm: true }}\n")).unwrap();
    assert!(on.models.allow_keep_warm);
    let typo = format!("{VALID}models: {{ keep_warm: true }}\n");
    assert!(matches!(NodeConfig::from_yaml(&typo), Err(NodeConfigError::Parse { .. })), "unknown keys are refused");
}

#[test]
fn errors_name_the_field() {
    let plain = VALID.replace("https://", "http://");
    assert!(matches!(NodeConfig::from_yaml(&plain), Err(NodeConfigError::Invalid { field: "edge.url", .. })));
    let backoff = format!("{VALID}reconnect: {{ initial_backoff_ms: 10, max_backoff_ms: 5 }}\n");
    assert!(matches!(
        NodeConfig::from_yaml(&backoff),
        Err(NodeConfigError::Invalid { field: "reconnect.max_backoff_ms", .. })
    ));
    assert!(matches!(NodeConfig::from_yaml("edge: {}"), Err(NodeConfigError::Parse { .. })));
    let health = format!("{VALID}health: {{ retry_initial_ms: 2000, retry_max_ms: 1000 }}\n");
    assert!(matches!(
        NodeConfig::from_yaml(&health),
        Err(NodeConfigError::Invalid { field: "health.retry_max_ms", .. })
    ));
    let idle = format!("{VALID}health: {{ idle_interval_ms: 0 }}\n");
    assert!(matches!(
        NodeConfig::from_yaml(&idle),
        Err(NodeConfigError::Invalid { field: "health.idle_interval_ms", .. })
    ));
}
