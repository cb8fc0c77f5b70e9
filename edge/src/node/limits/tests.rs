use super::*;

const MIB: usize = 1024 * 1024;

/// Providers (node, capacity) and workspaces (node, max_concurrent_jobs).
fn config(providers: &[(&str, u32)], workspaces: &[(&str, u32)]) -> EdgeConfig {
    let mut yaml = String::from("nodes: [ { name: mac-1 }, { name: mac-2 } ]\nproviders:\n");
    for (i, (node, capacity)) in providers.iter().enumerate() {
        yaml += &format!(
            "  - {{ id: p{i}, node: {node}, adapter: ollama, capacity: {capacity}, target: {{ model: m, \
                 base_url: \"http://x\" }}, models: [ {{ name: chat{i} }} ] }}\n"
        );
    }
    yaml += "workspaces:\n";
    for (i, (node, jobs)) in workspaces.iter().enumerate() {
        yaml += &format!(
            "  - {{ ref: w{i}, node: {node}, root: /w{i}, operations: [read], limits: {{ max_concurrent_jobs: {jobs} }} }}\n"
        );
    }
    crate::testing::config(&yaml)
}

#[test]
fn limits_follow_the_nodes_providers_and_workspaces() {
    let config = config(&[("mac-1", 4), ("mac-1", 2), ("mac-2", 100)], &[("mac-1", 1), ("mac-1", 2)]);
    let mac1 = NodeLimits::of(&config, "mac-1");
    assert_eq!(mac1.streams, MAX_CONNECTIONS_PER_NODE + 2 * 6 + 3 + STREAM_HEADROOM);
    assert_eq!(mac1.in_transit_bytes, 4 * MIB + 32 * MIB + 3 * wire::MAX_WORKSPACE_MESSAGE_BYTES);
    let mac2 = NodeLimits::of(&config, "mac-2");
    assert_eq!(mac2.streams, MAX_CONNECTIONS_PER_NODE + 200 + STREAM_HEADROOM);
    assert_eq!(mac2.in_transit_bytes, 36 * MIB, "no workspaces: no workspace answer fits");
    let unlisted = NodeLimits::of(&config, "mac-9");
    assert_eq!(unlisted.streams, MAX_CONNECTIONS_PER_NODE + STREAM_HEADROOM);
}

#[test]
fn every_method_has_its_own_message_bound() {
    let path = |m: &str| format!("/iop.v1.NodeGateway/{m}");
    let cases = [
        ("Control", NodeMethod::Control, 4 * MIB),
        ("RunEvents", NodeMethod::RunEvents, 32 * MIB),
        ("TunnelFrames", NodeMethod::TunnelFrames, MIB),
        ("WorkspaceCalls", NodeMethod::WorkspaceCalls, wire::MAX_WORKSPACE_MESSAGE_BYTES),
        ("Other", NodeMethod::Unknown, 4 * MIB),
    ];
    for (name, method, bound) in cases {
        assert_eq!(NodeMethod::of_path(&path(name)), method, "{name}");
        assert_eq!(method.max_message_bytes(), bound, "{name}");
        assert!(bound <= MAX_NODE_MESSAGE_BYTES);
    }
    assert_eq!(NodeMethod::of_path("/other.Service/Control"), NodeMethod::Unknown);
    assert_eq!(NodeMethod::of_path("/iop.v1.NodeGatewayX/Control"), NodeMethod::Unknown);
}

#[test]
fn counts_refuse_past_the_limits_and_guards_give_back() {
    let metrics = EdgeMetrics::new();
    let load = NodeLoad::new(metrics.clone());
    let limits = NodeLimits { streams: 2, in_transit_bytes: 100 };
    let conn = load.open_connection("mac-1", 1).unwrap();
    assert_eq!(load.open_connection("mac-1", 1).err(), Some(LimitRefusal::Connections));
    assert!(load.open_connection("mac-2", 1).is_ok(), "per node");
    drop(conn);
    let _again = load.open_connection("mac-1", 1).unwrap();

    let a = load.open_stream("mac-1", &limits).unwrap();
    let b = load.open_stream("mac-1", &limits).unwrap();
    assert_eq!(load.open_stream("mac-1", &limits).err(), Some(LimitRefusal::Streams));
    a.reserve(60).unwrap();
    assert_eq!(b.reserve(41), Err(LimitRefusal::InTransit), "the budget is the node's, over its calls");
    b.reserve(40).unwrap();
    a.release(60);
    b.reserve(60).unwrap();
    drop(a);
    let _c = load.open_stream("mac-1", &limits).unwrap();
    let text = metrics.encode();
    assert!(text.contains(r#"iop_edge_node_in_transit_bytes{node="mac-1"} 100"#), "{text}");
    assert!(text.contains(r#"iop_edge_node_streams{node="mac-1"} 2"#), "{text}");
}
