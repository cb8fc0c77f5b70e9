use super::*;

const BASE: &str = r#"
nodes: [ { name: n1 }, { name: n2 }, { name: n3 } ]
providers:
  - { id: a, node: n1, adapter: ollama, target: { model: m, base_url: "http://x" }, models: [ { name: chat } ] }
  - { id: b, node: n2, adapter: ollama, target: { model: m, base_url: "http://x" }, models: [ { name: chat } ] }
"#;

#[test]
fn only_removed_nodes_and_nodes_with_changed_providers_are_closed() {
    let previous = crate::testing::config(BASE);
    let mut next = previous.clone();
    next.nodes.retain(|n| n.name != "n3");
    next.providers[1].target.model = "m2".into();
    next.providers[0].models[0].name = "renamed".into(); // public names are Edge-only
    next.limits.queue_depth = 7;
    assert_eq!(nodes_to_close(&previous, &next), ["n2", "n3"]);
    assert!(nodes_to_close(&previous, &previous).is_empty());
    let closed = nodes_to_close(&previous, &next);
    assert!(capacity_changes(&previous, &next, &closed).is_empty(), "the changed nodes are closed instead");
}

#[test]
fn a_capacity_change_alone_keeps_the_session_and_tells_the_node() {
    let previous = crate::testing::config(BASE);
    let mut next = previous.clone();
    next.providers[0].capacity += 3;
    assert!(nodes_to_close(&previous, &next).is_empty());
    let changes = capacity_changes(&previous, &next, &[]);
    let node = &next.providers[0].node;
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(&changes[0].0, node);
    assert_eq!(changes[0].1.capacity[&next.providers[0].id], next.providers[0].capacity);
}
