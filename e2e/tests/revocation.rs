//! Revocation stops work (issue 38 item 6), end to end: real `iop-edge`,
//! `iop-node` and a scripted `iop-mock-provider`. A job's workspace
//! command keeps appending to a file; while it runs, the key is disabled
//! or expires, its principal loses the workspace grant, or the workspace
//! leaves the Edge config. Each time the job ends within that reload (or at
//! the expiry): the client gets the typed error in its API's shape (in the
//! stream when the head already went out), the command's processes are
//! gone, the request was cleaned, and nothing more is written in the
//! workspace: not by the command, not by the job's next step.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::*;
use iop_e2e::harness::wait_until;
use iop_edge::auth::{sha256, to_hex};
use iop_proto::config::{Limits, WorkspaceCommand, WorkspaceEntry, WorkspaceOperation as Op, WorkspaceStages};
use serde_json::{Value, json};

const KEY: &str = "sk-revoke-bot-0123456789";

/// The job runs the ticking command, then (if it is still allowed to)
/// writes `after.txt` and answers.
const SCRIPTS: &str = r#"
scripts:
  tick:
    - tool_calls: [{name: workspace_command, arguments: {command: tick}}]
    - tool_calls: [{name: workspace_write, arguments: {path: after.txt, content: "the job went on"}}]
    - text: "ticked"
    - text: "Done ticking."
"#;

/// Records its pid, then appends a line to `ticks` every 50 ms for about
/// ten seconds (long enough for any test to revoke it; short enough that
/// the code before this feature answered within [`WAIT`]).
const TICK: &str = "echo $$ > tick.pid; for i in $(seq 200); do echo $i >> ticks; sleep 0.05; done";

/// How the keys file names the test's one principal, `bot`.
struct Grant {
    disabled: bool,
    workspaces: &'static str,
    /// The key's own `expires_at` (RFC 3339).
    expires_at: Option<String>,
}

impl Default for Grant {
    fn default() -> Self {
        Self { disabled: false, workspaces: "[site]", expires_at: None }
    }
}

fn keys_file(grant: &Grant) -> String {
    let expiry = grant.expires_at.as_ref().map(|at| format!(", expires_at: '{at}'")).unwrap_or_default();
    format!(
        "principals:\n  - {{ name: bot, keys: [ {{ sha256: {}{expiry} }} ], models: ['*'], workspaces: {}, disabled: {} }}\n",
        to_hex(&sha256(KEY.as_bytes())),
        grant.workspaces,
        grant.disabled,
    )
}

/// `site`: work then answer (no plan, no review), with the ticking command.
fn site(root: &Path) -> WorkspaceEntry {
    WorkspaceEntry {
        reference: "site".into(),
        node: NODE.into(),
        root: root.to_str().unwrap().into(),
        operations: vec![Op::Read, Op::List, Op::Write, Op::Command],
        commands: vec![WorkspaceCommand::new("tick", vec!["bash".into(), "-c".into(), TICK.into()])],
        env_allowlist: vec!["PATH".into()],
        limits: Default::default(),
        network: false,
        stages: WorkspaceStages { plan: false, review: false, ..Default::default() },
    }
}

struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    stack: Stack,
}

/// A stack whose keys file grants `bot` the workspace `site`; streaming
/// clients get their response head (then keepalives) after 100 ms.
async fn start() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(tmp.path()).unwrap();
    let allowed = base.join("allowed");
    let root = allowed.join("site");
    std::fs::create_dir_all(&root).unwrap();
    // Commands may run as another user than the node's (`nobody` when the
    // node runs as root): the root is theirs to write, its parents to cross.
    for (dir, mode) in [(&base, 0o755), (&allowed, 0o755), (&root, 0o777)] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let stack = Stack::start(StackOptions {
        keys: Some(keys_file(&Grant::default())),
        workspaces: vec![site(&root)],
        allowed_roots: vec![allowed],
        mock_script: Some(SCRIPTS),
        limits: Some(Limits { stream_keepalive_ms: 100, ..Default::default() }),
        ..Default::default()
    })
    .await;
    Fixture { _tmp: tmp, root, stack }
}

impl Fixture {
    /// Starts the ticking job on `path` with `body`; returns once its
    /// command runs, with the pending response and the command's pid.
    async fn tick(&self, path: &str, body: Value) -> (tokio::task::JoinHandle<reqwest::Response>, i32) {
        let request = self
            .stack
            .client
            .post(self.stack.url(path))
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .header("iop-workspace", "site")
            .body(serde_json::to_vec(&body).unwrap());
        let pending = tokio::spawn(async move { request.send().await.unwrap() });
        let (pid_file, ticks) = (self.root.join("tick.pid"), self.root.join("ticks"));
        wait_until("the command ticks", WAIT, || async {
            std::fs::read_to_string(&pid_file).is_ok_and(|s| s.ends_with('\n'))
                && std::fs::read_to_string(&ticks).is_ok_and(|t| t.lines().count() >= 2)
        })
        .await;
        (pending, std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap())
    }

    fn ticks(&self) -> u64 {
        std::fs::metadata(self.root.join("ticks")).unwrap().len()
    }

    async fn revision(&self) -> u64 {
        self.stack.get_json("/admin/v1/config").await["config"]["revision"].as_u64().unwrap()
    }

    /// Rewrites the keys file and waits until the Edge applied it.
    async fn reload_keys(&self, grant: &Grant) {
        let revision = self.revision().await;
        std::fs::write(self.stack.dir.path().join("keys.yaml"), keys_file(grant)).unwrap();
        wait_until("the keys reload", WAIT, || async { self.revision().await > revision }).await;
    }

    /// What the job answered (bounded: a job that went on answers anyway
    /// once its command ends).
    async fn answer(&self, pending: tokio::task::JoinHandle<reqwest::Response>) -> reqwest::Response {
        tokio::time::timeout(WAIT, pending).await.expect("the job answered").unwrap()
    }

    /// Everything revocation promises after the answer: the command's
    /// processes are gone, the job counted as revoked for `reason` and
    /// cancelled, its next step never ran, and once a later reload (an
    /// observable point well after the answer) is applied, the command's
    /// file has not grown.
    async fn assert_stopped(&self, pid: i32, reason: &str) {
        wait_until("the command's processes are gone", WAIT, || async { !alive(pid) }).await;
        let stack = &self.stack;
        let revoked = format!("iop_edge_job_revoked_total{{reason=\"{reason}\"}}");
        assert_eq!(stack.metric(&revoked).await, 1.0, "{revoked}");
        assert_eq!(stack.metric("iop_edge_job_terminals_total{state=\"cancelled\"}").await, 1.0);
        assert_eq!(stack.metric("iop_edge_job_terminals_total{state=\"completed\"}").await, 0.0);
        assert!(!self.root.join("after.txt").exists(), "the job's next step ran after the revocation");
        let size = self.ticks();
        self.reload_keys(&Grant { workspaces: "[other]", ..Default::default() }).await;
        assert_eq!(self.ticks(), size, "the command's file grew after the job answered");
        assert!(!self.root.join("after.txt").exists());
    }
}

fn chat(stream: bool) -> Value {
    chat_body("mock-ollama", "Keep ticking. iop-mock-script:tick", stream)
}

/// The abuse case of the issue: a key is disabled while its job's command
/// runs. The job ends at that reload with `401 api_key_disabled` (OpenAI
/// Chat's shape), its command dies, the request is cleaned before the
/// answer leaves, and nothing more is written.
#[tokio::test]
async fn disabling_a_key_ends_its_running_job() {
    let f = start().await;
    let (pending, pid) = f.tick("/v1/chat/completions", chat(false)).await;
    f.reload_keys(&Grant { disabled: true, ..Default::default() }).await;
    let (status, body) = json_body(f.answer(pending).await).await;
    assert_eq!((status, body["error"]["code"].as_str()), (401, Some("api_key_disabled")), "{body}");
    assert_eq!(body["error"]["type"], "authentication_error");
    assert!(job_dirs(&f.root).is_empty(), "the request was cleaned before the answer left");
    assert_eq!(f.stack.metric("iop_edge_job_cleanups_total{result=\"cleaned\"}").await, 1.0);
    f.assert_stopped(pid, "api_key_disabled").await;
}

/// The principal's `workspaces` no longer name the workspace: the job ends
/// at that reload. The Responses client streams and already has its head
/// (keepalives went out), so the error is the stream's `error` event,
/// `workspace_revoked`, and the stream does not complete.
#[tokio::test]
async fn removing_the_workspace_grant_ends_the_running_job_in_the_stream() {
    let f = start().await;
    let body = json!({"model": "mock-ollama", "input": "Keep ticking. iop-mock-script:tick", "stream": true});
    let (pending, pid) = f.tick("/v1/responses", body).await;
    f.reload_keys(&Grant { workspaces: "['other*']", ..Default::default() }).await;
    let response = f.answer(pending).await;
    assert_eq!(response.status(), 200, "the head went out before the revocation");
    let text = tokio::time::timeout(WAIT, response.text()).await.expect("the stream ended").unwrap();
    assert!(text.contains(": keepalive"), "{text}");
    let error = text
        .split("\n\n")
        .find_map(|event| event.strip_prefix("event: error\ndata: "))
        .unwrap_or_else(|| panic!("no error event: {text}"));
    let error: Value = serde_json::from_str(error).unwrap();
    assert_eq!(error["code"], "workspace_revoked", "{error}");
    assert!(!text.contains("response.completed"), "{text}");
    assert!(job_dirs(&f.root).is_empty(), "the request was cleaned before the error left");
    f.assert_stopped(pid, "workspace_grant_removed").await;
}

/// The workspace leaves the Edge config: the job ends at that reload with
/// `403` in Anthropic's shape (`permission_error`), even though the same
/// reload also closed the node's session (its workspaces changed); the
/// node kills the command and cleans the request by itself.
#[tokio::test]
async fn removing_the_workspace_ends_the_running_job() {
    let f = start().await;
    let stack = &f.stack;
    let body = json!({
        "model": "mock-ollama",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "Keep ticking. iop-mock-script:tick"}],
    });
    let (pending, pid) = f.tick("/v1/messages", body).await;
    let generation = stack.node(NODE).await["generation"].as_u64().unwrap();
    let revision = f.revision().await;
    let mut config =
        iop_proto::config::EdgeConfig::from_yaml(&std::fs::read_to_string(&stack.edge_config).unwrap()).unwrap();
    config.workspaces.clear();
    std::fs::write(&stack.edge_config, config.to_yaml()).unwrap();
    let (status, body) = json_body(f.answer(pending).await).await;
    assert_eq!((status, body["error"]["type"].as_str()), (403, Some("permission_error")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("`site`"), "{body}");
    assert!(f.revision().await > revision, "answered because of the reload");
    wait_until("the node cleaned the request", WAIT, || async { job_dirs(&f.root).is_empty() }).await;
    stack.wait_node_ready_after(NODE, generation).await;
    f.assert_stopped(pid, "workspace_removed").await;
}

/// A key whose `expires_at` passes while its job runs: no reload happens,
/// the job ends at the expiry with `api_key_expired`, in the Chat stream
/// (its head went out before).
#[tokio::test]
async fn a_key_that_expires_ends_its_running_job() {
    let f = start().await;
    // Far enough ahead that the job starts first (it must: the key is
    // refused at the door from then on), near enough to keep the test short.
    let at = time::OffsetDateTime::now_utc() + time::Duration::seconds(8);
    let at = at.replace_nanosecond(0).unwrap().format(&time::format_description::well_known::Rfc3339).unwrap();
    f.reload_keys(&Grant { expires_at: Some(at), ..Default::default() }).await;
    let revision = f.revision().await;
    let (pending, pid) = f.tick("/v1/chat/completions", chat(true)).await;
    let response = f.answer(pending).await;
    assert_eq!(response.status(), 200, "the head went out before the expiry");
    let events = tokio::time::timeout(WAIT, sse_events(response)).await.expect("the stream ended");
    let error = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .find(|e| e.get("error").is_some())
        .unwrap_or_else(|| panic!("no error in the stream: {events:?}"));
    assert_eq!(error["error"]["code"], "api_key_expired", "{events:?}");
    assert!(!streamed_text(&events).contains("Done ticking."), "{events:?}");
    assert_eq!(f.revision().await, revision, "no reload ended it");
    assert!(job_dirs(&f.root).is_empty());
    f.assert_stopped(pid, "api_key_expired").await;
}
