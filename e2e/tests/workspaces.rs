//! Workspace consent end to end: the Edge config declares workspaces on a
//! node, the `iop-node` process accepts only real directories inside its
//! owner's `allowed_roots`, and `/admin/v1/nodes` shows each verdict; a bad
//! entry never stops the node's providers, and a reload that changes a
//! node's workspaces reaches it.

mod common;

use std::path::Path;

use common::*;
use iop_e2e::harness::wait_until;
use iop_proto::config::{WorkspaceEntry, WorkspaceOperation};
use serde_json::{Value, json};

fn workspace(reference: &str, root: &Path) -> WorkspaceEntry {
    WorkspaceEntry {
        reference: reference.into(),
        node: NODE.into(),
        root: root.to_str().unwrap().into(),
        operations: vec![WorkspaceOperation::Read, WorkspaceOperation::List],
        commands: Vec::new(),
        env_allowlist: Vec::new(),
        limits: Default::default(),
        network: false,
        stages: Default::default(),
    }
}

#[tokio::test]
async fn a_node_accepts_only_real_directories_inside_its_allowed_roots() {
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(tmp.path()).unwrap();
    let allowed = base.join("allowed");
    std::fs::create_dir_all(allowed.join("site")).unwrap();
    std::fs::write(allowed.join("notes.txt"), "x").unwrap();
    std::fs::create_dir(base.join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(base.join("elsewhere"), allowed.join("link")).unwrap();
    let stack = Stack::start(StackOptions {
        workspaces: vec![
            workspace("site", &allowed.join("site")),
            workspace("outside", &base.join("elsewhere")),
            workspace("missing", &allowed.join("nope")),
            workspace("file", &allowed.join("notes.txt")),
            workspace("link", &allowed.join("link")),
        ],
        allowed_roots: vec![allowed.clone()],
        // No jobs here; a reload below replaces every ref.
        anonymous_workspaces: Some(Vec::new()),
        ..Default::default()
    })
    .await;
    let expected = json!({
        "site": "accepted",
        "outside": "outside_allowed_roots",
        "missing": "not_found",
        "file": "not_a_directory",
        "link": "symlink",
    });
    assert_eq!(stack.node(NODE).await["workspaces"], expected);
    // The refused entries do not stop the node's providers.
    let response = stack.post("/v1/chat/completions", &chat_body("mock-ollama", "hi", false)).await;
    assert_eq!(response.status(), 200);

    // A reload that changes the node's workspaces reaches it (the node
    // reconnects and checks them again).
    let generation = stack.node(NODE).await["generation"].as_u64().unwrap();
    std::fs::create_dir(allowed.join("site2")).unwrap();
    let text = std::fs::read_to_string(&stack.edge_config).unwrap();
    let mut config = iop_proto::config::EdgeConfig::from_yaml(&text).unwrap();
    config.workspaces = vec![workspace("site2", &allowed.join("site2"))];
    std::fs::write(&stack.edge_config, config.to_yaml()).unwrap();
    stack.wait_node_ready_after(NODE, generation).await;
    wait_until("the new workspace verdicts", WAIT, || async {
        stack.node(NODE).await["workspaces"] == json!({ "site2": "accepted" })
    })
    .await;
    let node: Value = stack.node(NODE).await;
    assert!(!node.to_string().contains(allowed.to_str().unwrap()), "admin output names no path: {node}");
}
