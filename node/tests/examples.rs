//! The shipped example config loads and validates. (Being an integration
//! test also makes `cargo test`/`nextest` build the `iop-node` binary that
//! the end-to-end tests run.)

use std::path::Path;

#[test]
fn example_node_config_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/node.yaml");
    let config = iop_node::NodeConfig::load(&path).expect("examples/node.yaml is valid");
    assert_eq!(config.server_name().as_deref(), Some("iop.example.com"));
    assert!(config.tls.cert_file.starts_with(path.parent().unwrap()));
    assert_eq!(config.reconnect.max_backoff_ms, 30_000);
    assert_eq!(config.metrics.unwrap().listen.port(), 9464);
}
