use super::*;

fn config() -> EdgeConfig {
    crate::testing::config(
        r#"
nodes: [ { name: n1 }, { name: n2 } ]
providers:
  - { id: backup, node: n2, adapter: openai, target: { model: m, base_url: "http://x" }, models: [ { name: chat, priority: 1 } ] }
  - { id: main, node: n1, adapter: ollama, target: { model: m, base_url: "http://x" }, models: [ { name: chat, priority: 0 }, { name: other } ] }
"#,
    )
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
