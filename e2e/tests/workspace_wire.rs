//! The workspace wire end to end: real `iop-edge` and `iop-node` processes,
//! a temp workspace on disk, and the Edge's admin diagnostic
//! (`POST /admin/v1/workspaces/{ref}/calls`, enabled with
//! `--admin-workspace-calls`) driving Open, tools and Cleanup over mTLS.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use iop_e2e::harness::wait_until;
use iop_proto::config::{WorkspaceCommand, WorkspaceEntry, WorkspaceOperation as Op};
use serde_json::{Value, json};

/// A workspace `site` with all five operations and two commands:
/// `test` prints to both streams and fails with 3; `hang` starts a
/// grandchild, records its pid in `grandchild.pid`, and waits.
fn site(root: &Path) -> WorkspaceEntry {
    let command = |id: &str, script: &str| WorkspaceCommand {
        id: id.into(),
        argv: vec!["sh".into(), "-c".into(), script.into()],
        timeout_ms: 60_000,
        limits: Default::default(),
    };
    WorkspaceEntry {
        reference: "site".into(),
        node: NODE.into(),
        root: root.to_str().unwrap().into(),
        operations: vec![Op::Read, Op::List, Op::Write, Op::Delete, Op::Command],
        commands: vec![
            command("test", "echo out; echo err >&2; exit 3"),
            command("hang", "sleep 300 & echo $! > grandchild.pid; wait"),
        ],
        env_allowlist: vec!["PATH".into()],
        limits: Default::default(),
        network: false,
        stages: Default::default(),
    }
}

struct Workspace {
    _tmp: tempfile::TempDir,
    allowed: PathBuf,
    root: PathBuf,
    outside: PathBuf,
}

fn workspace() -> Workspace {
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(tmp.path()).unwrap();
    let allowed = base.join("allowed");
    let root = allowed.join("site");
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join("README.md"), "# site\n").unwrap();
    std::fs::write(root.join("src/lib.rs"), "pub fn f() {}\n").unwrap();
    let outside = base.join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "secret").unwrap();
    std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();
    Workspace { _tmp: tmp, allowed, root, outside }
}

async fn start(ws: &Workspace) -> Stack {
    Stack::start(StackOptions {
        workspaces: vec![site(&ws.root)],
        allowed_roots: vec![ws.allowed.clone()],
        edge_args: vec!["--admin-workspace-calls"],
        ..Default::default()
    })
    .await
}

/// POSTs `{"calls": calls}` to the admin diagnostic of `reference`.
async fn post_calls(client: &reqwest::Client, admin: String, calls: Value) -> reqwest::Result<reqwest::Response> {
    let body = serde_json::to_vec(&json!({ "calls": calls })).unwrap();
    client.post(admin).header("content-type", "application/json").body(body).send().await
}

async fn calls(stack: &Stack, reference: &str, calls: Value) -> (u16, Value) {
    let url = stack.admin_url(&format!("/admin/v1/workspaces/{reference}/calls"));
    json_body(post_calls(&stack.client, url, calls).await.unwrap()).await
}

/// Starts a `hang` command in the background; the task ends with its answer.
fn hang(stack: &Stack) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
    let (client, url) = (stack.client.clone(), stack.admin_url("/admin/v1/workspaces/site/calls"));
    tokio::spawn(async move { post_calls(&client, url, json!([{"op": "command", "command": "hang"}])).await })
}

#[tokio::test]
async fn tools_work_inside_the_workspace_and_nowhere_else() {
    let ws = workspace();
    let stack = start(&ws).await;
    let (status, answer) = calls(
        &stack,
        "site",
        json!([
            {"op": "list"},
            {"op": "read", "path": "README.md"},
            {"op": "write", "path": "src/out.txt", "content": "result"},
            {"op": "read", "path": "src/out.txt", "max_bytes": 3},
            {"op": "write", "path": "src/out.txt", "content": "again", "create_only": true},
            {"op": "read", "path": "escape/secret.txt"},
            {"op": "write", "path": "escape/planted.txt", "content": "x"},
            {"op": "read", "path": "../outside/secret.txt"},
            {"op": "read", "path": "/etc/hostname"},
            {"op": "list", "path": ".iop"},
            {"op": "delete", "path": "src"},
            {"op": "delete", "path": "README.md"},
            {"op": "command", "command": "test"},
            {"op": "command", "command": "deploy"},
        ]),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let results = answer["results"].as_array().unwrap();
    let labels: Vec<&str> = results.iter().map(|r| r["result"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        [
            "ok",
            "ok",
            "ok",
            "ok",
            "exists",
            "symlink",
            "symlink",
            "invalid_path",
            "invalid_path",
            "reserved",
            "not_empty",
            "ok",
            "exit_nonzero",
            "denied"
        ],
        "{answer}"
    );
    let names: Vec<&str> =
        results[0]["entries"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["README.md", "escape", "src"], "sorted, and `.iop` is never listed");
    assert_eq!(results[0]["entries"][1]["kind"], "symlink");
    assert_eq!(results[1]["content"], "# site\n");
    assert_eq!((&results[3]["content"], &results[3]["truncated"]), (&json!("res"), &json!(true)));
    let command = &results[12];
    assert_eq!(command["exit_code"], 3);
    let output = command["output"].as_str().unwrap();
    assert!(output.contains("out") && output.contains("err"), "stdout and stderr share the output: {output}");
    assert_eq!(answer["cleanup"]["status"], "cleaned", "{answer}");
    assert_eq!(answer["effective"]["command_ids"], json!(["hang", "test"]));

    // The disk: what the tools did, and nothing outside the workspace.
    assert_eq!(std::fs::read_to_string(ws.root.join("src/out.txt")).unwrap(), "result");
    assert!(!ws.root.join("README.md").exists());
    assert_eq!(std::fs::read_to_string(ws.outside.join("secret.txt")).unwrap(), "secret");
    assert!(!ws.outside.join("planted.txt").exists());
    assert!(job_dirs(&ws.root).is_empty(), "the request's state was removed");
    let text = answer.to_string();
    assert!(!text.contains(ws.root.to_str().unwrap()), "no path in the answer: {text}");

    // The node counted every operation by closed labels.
    let node_metrics = stack.node_metrics.clone().unwrap();
    let sample = |s: &'static str| stack.metric_at(&node_metrics, s);
    assert_eq!(sample("iop_node_workspace_ops_total{op=\"read\",result=\"ok\"}").await, 2.0);
    assert_eq!(sample("iop_node_workspace_ops_total{op=\"read\",result=\"symlink\"}").await, 1.0);
    assert_eq!(sample("iop_node_workspace_ops_total{op=\"command\",result=\"exit_nonzero\"}").await, 1.0);
    assert_eq!(sample("iop_node_workspace_ops_total{op=\"open\",result=\"ok\"}").await, 1.0);
    assert_eq!(sample("iop_node_workspace_cleanups_total{result=\"cleaned\"}").await, 1.0);

    // Unknown refs and refused workspaces look the same: not found.
    let (status, answer) = calls(&stack, "nope", json!([])).await;
    assert_eq!((status, answer["error"]["code"].as_str()), (404, Some("unknown_workspace")));
    let (status, _) = calls(&stack, "site", json!([{"op": "read", "path": "a", "follow": true}])).await;
    assert_eq!(status, 400, "calls are decoded strictly");
}

/// A long command does not hold up provider runs on the same connection;
/// the caller going away kills the command's whole process group and
/// cleans the request.
#[tokio::test]
async fn a_running_command_never_delays_runs_and_dies_with_its_caller() {
    let ws = workspace();
    let stack = start(&ws).await;
    let pending = hang(&stack);
    let pid = grandchild(&ws.root).await;
    assert_eq!(job_dirs(&ws.root).len(), 1, "the open request has its state directory");
    for stream in [false, true] {
        let response = stack.post("/v1/chat/completions", &chat_body("mock-ollama", "hi", stream)).await;
        assert_eq!(response.status(), 200);
        response.bytes().await.unwrap();
    }
    assert!(!pending.is_finished(), "the command is still running while runs complete");
    assert!(alive(pid));

    pending.abort();
    wait_until("the grandchild was killed", WAIT, || async { !alive(pid) }).await;
    wait_until("the request was cleaned", WAIT, || async { job_dirs(&ws.root).is_empty() }).await;
    let node_metrics = stack.node_metrics.clone().unwrap();
    let cancelled = "iop_node_workspace_ops_total{op=\"command\",result=\"cancelled\"}";
    wait_until("the cancel was counted", WAIT, || async { stack.metric_at(&node_metrics, cancelled).await == 1.0 })
        .await;
}

/// When the node's connection ends, the node cancels and cleans every open
/// request of that generation by itself.
#[tokio::test]
async fn a_lost_session_cancels_and_cleans_its_requests() {
    let ws = workspace();
    let mut stack = start(&ws).await;
    let pending = hang(&stack);
    let pid = grandchild(&ws.root).await;
    drop(stack.edge.take());
    wait_until("the grandchild was killed", WAIT, || async { !alive(pid) }).await;
    wait_until("the request was cleaned", WAIT, || async { job_dirs(&ws.root).is_empty() }).await;
    assert!(pending.await.unwrap().is_err(), "the caller saw its Edge go");
    // The directory goes before the cleanup is counted: wait for the count.
    let node_metrics = stack.node_metrics.clone().unwrap();
    let cleaned = "iop_node_workspace_cleanups_total{result=\"cleaned\"}";
    wait_until("the cleanup was counted", WAIT, || async { stack.metric_at(&node_metrics, cleaned).await == 1.0 })
        .await;
}
