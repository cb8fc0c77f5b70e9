//! Single-request jobs end to end: real `iop-edge`, `iop-node` and a
//! scripted `iop-mock-provider` (its turns are chosen by the
//! `iop-mock-script:<name>` marker in the client's message), a temp
//! workspace on disk, and the client APIs as clients call them.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use iop_e2e::harness::wait_until;
use iop_proto::config::{
    Limits, WorkspaceCommand, WorkspaceEntry, WorkspaceLimits, WorkspaceOperation as Op, WorkspaceStages,
};
use serde_json::{Value, json};

const SCRIPTS: &str = r#"
scripts:
  job:
    - tool_calls: [{name: workspace_list, arguments: {}}]
    - text: "1. read README.md 2. write NOTES.md"
    - tool_calls: [{name: workspace_read, arguments: {path: README.md}}]
    - tool_calls: [{name: workspace_write, arguments: {path: NOTES.md, content: draft}}]
    - tool_calls: [{name: workspace_command, arguments: {command: test}}]
    - text: "wrote NOTES.md"
    - text: '{"verdict":"repair","notes":"NOTES.md must say final"}'
    - text: "rewrite NOTES.md"
    - tool_calls: [{name: workspace_write, arguments: {path: NOTES.md, content: final}}]
    - text: "fixed"
    - text: '{"verdict":"approve","notes":"good"}'
    - text: "Done: NOTES.md now says final."
  deny:
    - tool_calls: [{name: workspace_command, arguments: {command: deploy}}]
  malformed:
    - tool_calls: [{name: workspace_read, arguments: {path: README.md, follow: true}}]
  loop:
    - tool_calls: [{name: workspace_list, arguments: {}}]
  hang:
    - tool_calls: [{name: workspace_command, arguments: {command: hang}}]
  answer:
    - text: "worked"
    - text: "Answer."
  again:
    - text: "worked again"
    - text: "Answer again."
  plant:
    - tool_calls: [{name: workspace_command, arguments: {command: plant}}]
    - text: "planted"
    - text: "All done."
  gated:
    - tool_calls: [{name: workspace_command, arguments: {command: gate}}]
    - text: "the gate opened"
    - text: "The gated job is done."
  slow:
    - tool_calls: [{name: workspace_command, arguments: {command: slow}}]
    - text: "slow work done"
    - text: "The slow job is done."
"#;

fn command(id: &str, script: &str) -> WorkspaceCommand {
    WorkspaceCommand {
        id: id.into(),
        argv: vec!["sh".into(), "-c".into(), script.into()],
        timeout_ms: 60_000,
        limits: Default::default(),
    }
}

/// `site` runs every stage; `quick` only works and answers, with at most
/// three model turns per stage.
fn workspaces(root: &Path) -> Vec<WorkspaceEntry> {
    let entry = |reference: &str, stages: WorkspaceStages, limits: WorkspaceLimits| WorkspaceEntry {
        reference: reference.into(),
        node: NODE.into(),
        root: root.to_str().unwrap().into(),
        operations: vec![Op::Read, Op::List, Op::Write, Op::Delete, Op::Command],
        commands: vec![
            command("test", "echo all tests pass"),
            command("hang", "sleep 300 & echo $! > grandchild.pid; wait"),
            command("slow", "sleep 0.5"),
            // Says it runs, then runs until the test creates `release` in
            // the workspace.
            command("gate", "touch gate.running; while [ ! -e release ]; do sleep 0.05; done"),
            // Tries to plant a link to /etc in the job's own state directory
            // (the sandbox keeps `.iop` read-only), then waits until the
            // test has planted one from outside.
            command(
                "plant",
                "for d in .iop/job/*; do ln -s /etc \"$d/by-command\"; done; \
                 while [ ! -e planted.flag ]; do sleep 0.05; done",
            ),
        ],
        env_allowlist: vec!["PATH".into()],
        limits,
        network: false,
        stages,
    };
    let quick = WorkspaceStages { plan: false, review: false, ..Default::default() };
    vec![
        entry("site", WorkspaceStages::default(), WorkspaceLimits::default()),
        entry("quick", quick, WorkspaceLimits { max_iterations: 3, ..Default::default() }),
    ]
}

struct Job {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    stack: Stack,
}

async fn start(options: StackOptions) -> Job {
    let tmp = tempfile::tempdir().unwrap();
    let allowed = std::fs::canonicalize(tmp.path()).unwrap();
    let root = allowed.join("site");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("README.md"), "# site\n").unwrap();
    let stack = Stack::start(StackOptions {
        workspaces: workspaces(&root),
        allowed_roots: vec![allowed],
        mock_script: Some(SCRIPTS),
        ..options
    })
    .await;
    Job { _tmp: tmp, root, stack }
}

fn messages(script: &str, stream: bool) -> Value {
    json!({
        "model": "mock-ollama",
        "max_tokens": 256,
        "stream": stream,
        "messages": [{"role": "user", "content": format!("Please update NOTES.md. iop-mock-script:{script}")}],
    })
}

fn post(stack: &Stack, path: &str, workspace: &str, body: &Value) -> reqwest::RequestBuilder {
    stack
        .client
        .post(stack.url(path))
        .header("content-type", "application/json")
        .header("iop-workspace", workspace)
        .body(serde_json::to_vec(body).unwrap())
}

#[tokio::test]
async fn a_job_plans_works_is_reviewed_repairs_once_and_answers() {
    let job = start(StackOptions::default()).await;
    let stack = &job.stack;
    let response = post(stack, "/v1/messages", "site", &messages("job", false)).send().await.unwrap();
    let job_id = response.headers().get("iop-job-id").map(|v| v.to_str().unwrap().to_string());
    let (status, body) = json_body(response).await;
    assert_eq!(status, 200, "{body}");
    assert!(job_id.is_some_and(|id| id.len() == 32), "the answer names its job");
    assert_eq!(body["content"][0]["text"], "Done: NOTES.md now says final.");
    assert_eq!(body["stop_reason"], "end_turn");
    // Usage is the sum over the twelve model turns.
    assert!(body["usage"]["output_tokens"].as_u64().unwrap() >= 12, "{body}");
    let text = body.to_string();
    for private in ["workspace_", "README", job.root.to_str().unwrap()] {
        assert!(!text.contains(private), "`{private}` leaked into the answer: {text}");
    }

    // The workspace as the job's results need it, and nothing of the job's own.
    assert_eq!(std::fs::read_to_string(job.root.join("NOTES.md")).unwrap(), "final");
    assert!(job_dirs(&job.root).is_empty());

    let metric = |sample: &'static str| stack.metric(sample);
    assert_eq!(metric("iop_anthropic_single_request_ingress_total").await, 1.0);
    assert_eq!(metric("iop_edge_jobs_total{api=\"messages\"}").await, 1.0);
    assert_eq!(metric("iop_edge_job_terminals_total{state=\"completed\"}").await, 1.0);
    assert_eq!(metric("iop_edge_job_cleanups_total{result=\"cleaned\"}").await, 1.0);
    assert_eq!(metric("iop_edge_job_tool_calls_total{tool=\"workspace_write\",result=\"ok\"}").await, 2.0);
    assert_eq!(metric("iop_edge_job_tool_calls_total{tool=\"workspace_command\",result=\"ok\"}").await, 1.0);
    assert_eq!(metric("iop_edge_job_stage_seconds_count{stage=\"reviewing\"}").await, 2.0);
    assert_eq!(metric("iop_edge_job_stage_seconds_count{stage=\"repairing\"}").await, 1.0);
    assert_eq!(metric("iop_edge_job_stage_seconds_count{stage=\"finalizing\"}").await, 1.0);
}

#[tokio::test]
async fn entry_errors_are_typed_and_say_nothing_of_nodes_or_paths() {
    let job = start(StackOptions::default()).await;
    let stack = &job.stack;
    let mut with_tools = messages("job", false);
    with_tools["tools"] = json!([{"name": "x", "input_schema": {"type": "object"}}]);
    let (status, body) = json_body(post(stack, "/v1/messages", "site", &with_tools).send().await.unwrap()).await;
    assert_eq!(status, 400, "{body}");
    let (status, body) =
        json_body(post(stack, "/v1/messages", "nope", &messages("job", false)).send().await.unwrap()).await;
    assert_eq!((status, body["error"]["type"].as_str()), (404, Some("not_found_error")), "{body}");
    let chat = chat_body("mock-ollama", "hi iop-mock-script:job", false);
    let (status, body) = json_body(post(stack, "/v1/chat/completions", "nope", &chat).send().await.unwrap()).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("workspace_not_found")));
    assert!(!body.to_string().contains(NODE));
    let unknown_model = json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]});
    let response = post(stack, "/v1/chat/completions", "site", &unknown_model).send().await.unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(stack.metric("iop_edge_jobs_total{api=\"messages\"}").await, 0.0, "none of these started a job");
}

/// Workspace grants (issue 24): a key may drive only the workspaces its
/// principal names. A key allowed the model but no workspace gets the very
/// answer an unknown ref gets, and nothing happens on disk or in the job
/// metrics; once its entry lists `si*` the same key runs the job. Without
/// keys, only the refs the config opens to anonymous callers take jobs.
#[tokio::test]
async fn a_key_drives_only_the_workspaces_its_principal_names() {
    const KEY: &str = "sk-site-bot-0123456789";
    let hash = iop_edge::auth::to_hex(&iop_edge::auth::sha256(KEY.as_bytes()));
    let entry = |workspaces: &str| {
        format!("principals:\n  - {{ name: site-bot, key_sha256: {hash}, models: [mock-ollama]{workspaces} }}\n")
    };
    let job = start(StackOptions { keys: Some(entry("")), ..Default::default() }).await;
    let stack = &job.stack;
    let send = |reference: &'static str| {
        let chat = chat_body("mock-ollama", "Please update NOTES.md. iop-mock-script:job", false);
        async move {
            json_body(post(stack, "/v1/chat/completions", reference, &chat).bearer_auth(KEY).send().await.unwrap())
                .await
        }
    };
    let (status, forbidden) = send("site").await;
    assert_eq!((status, forbidden["error"]["code"].as_str()), (404, Some("workspace_not_found")), "{forbidden}");
    let (_, unknown) = send("nope").await;
    assert_eq!(
        forbidden.to_string().replace("`site`", "`nope`"),
        unknown.to_string(),
        "a forbidden ref reads exactly as an unknown one"
    );
    assert!(!job.root.join("NOTES.md").exists() && job_dirs(&job.root).is_empty(), "nothing written");
    assert_eq!(stack.metric("iop_edge_jobs_total{api=\"chat_completions\"}").await, 0.0, "no job started");
    assert_eq!(stack.metric("iop_edge_job_terminals_total{state=\"failed\"}").await, 0.0);
    // The plain chat still works: the grant is about workspaces only.
    let (status, _) = json_body(
        stack
            .client
            .post(stack.url("/v1/chat/completions"))
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .body(chat_body("mock-ollama", "hi", false).to_string())
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);

    std::fs::write(stack.dir.path().join("keys.yaml"), entry(", workspaces: [\"si*\"]")).unwrap();
    wait_until("the keys reload", WAIT, || async {
        stack.get_json("/admin/v1/config").await["config"]["revision"] == 2
    })
    .await;
    let (status, body) = send("site").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(std::fs::read_to_string(job.root.join("NOTES.md")).unwrap(), "final");
    let (status, _) = send("quick").await;
    assert_eq!(status, 404, "`si*` does not name `quick`");

    // Auth disabled and no `auth.anonymous_workspaces`: no ref takes jobs.
    let closed = start(StackOptions { anonymous_workspaces: Some(Vec::new()), ..Default::default() }).await;
    let chat = chat_body("mock-ollama", "iop-mock-script:answer", false);
    let (status, body) =
        json_body(post(&closed.stack, "/v1/chat/completions", "quick", &chat).send().await.unwrap()).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("workspace_not_found")), "{body}");
    assert_eq!(closed.stack.metric("iop_edge_jobs_total{api=\"chat_completions\"}").await, 0.0);
}

/// Concurrency limits (issue 24 item 5): while a job runs in `quick`
/// (default `max_concurrent_jobs: 1`), a second job there is `429
/// too_many_jobs` with `Retry-After`, and so is a second job of a principal
/// allowed one at a time in another workspace; neither reaches the node or
/// the provider. Once the first job ends, its slots are free again.
#[tokio::test]
async fn concurrent_jobs_are_bounded_per_workspace_and_per_principal() {
    const ONE: &str = "sk-one-at-a-time-0123456789";
    const OTHER: &str = "sk-other-0123456789";
    let hash = |key: &str| iop_edge::auth::to_hex(&iop_edge::auth::sha256(key.as_bytes()));
    let keys = format!(
        "principals:\n  - {{ name: one, key_sha256: {}, models: ['*'], workspaces: ['*'], max_concurrent_jobs: 1 }}\n  - {{ name: other, key_sha256: {}, models: ['*'], workspaces: ['*'] }}\n",
        hash(ONE),
        hash(OTHER)
    );
    let job = start(StackOptions { keys: Some(keys), ..Default::default() }).await;
    let stack = &job.stack;
    let send = |key: &'static str, reference: &'static str, script: &str| {
        let request =
            post(stack, "/v1/chat/completions", reference, &chat_body("mock-ollama", script, false)).bearer_auth(key);
        async move { request.send().await.unwrap() }
    };
    let first = tokio::spawn(send(ONE, "quick", "iop-mock-script:gated"));
    // The command runs: the job's model call that asked for it is made,
    // and the next waits for the command (the job's directory appears
    // before the first model call, so waiting for it raced that call).
    wait_until("the first job's command runs", WAIT, || async { job.root.join("gate.running").exists() }).await;
    let provider_calls = stack.mock_stats().await["requests_total"].clone();

    for (key, reference, busy) in [(OTHER, "quick", "the workspace"), (ONE, "site", "this caller")] {
        let response = send(key, reference, "iop-mock-script:answer").await;
        assert_eq!(response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string()), Some("5".into()));
        let (status, body) = json_body(response).await;
        assert_eq!((status, body["error"]["code"].as_str()), (429, Some("too_many_jobs")), "{body}");
        assert!(body["error"]["message"].as_str().unwrap().starts_with(busy), "{body}");
    }
    assert_eq!(job_dirs(&job.root).len(), 1, "no second job opened the workspace");
    assert_eq!(stack.mock_stats().await["requests_total"], provider_calls, "no model call for a refused job");
    assert_eq!(stack.metric("iop_edge_jobs_total{api=\"chat_completions\"}").await, 1.0);

    std::fs::write(job.root.join("release"), "").unwrap();
    let (status, body) = json_body(first.await.unwrap()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "The gated job is done.");
    let (status, body) = json_body(send(OTHER, "quick", "iop-mock-script:answer").await).await;
    assert_eq!(status, 200, "the workspace's slot is free again: {body}");
    let (status, body) = json_body(send(ONE, "quick", "iop-mock-script:again").await).await;
    assert_eq!(status, 200, "the principal's slot is free again: {body}");
}

#[tokio::test]
async fn denied_malformed_and_over_budget_calls_fail_the_job_and_it_still_cleans_up() {
    let job = start(StackOptions::default()).await;
    let stack = &job.stack;
    for (script, code) in
        [("deny", "tool_denied"), ("malformed", "malformed_tool_call"), ("loop", "iteration_budget_exhausted")]
    {
        let chat = chat_body("mock-ollama", &format!("go iop-mock-script:{script}"), false);
        let (status, body) = json_body(post(stack, "/v1/chat/completions", "quick", &chat).send().await.unwrap()).await;
        assert_eq!((status, body["error"]["code"].as_str()), (502, Some(code)), "{body}");
    }
    assert_eq!(stack.metric("iop_edge_job_terminals_total{state=\"failed\"}").await, 3.0);
    assert_eq!(stack.metric("iop_edge_job_cleanups_total{result=\"cleaned\"}").await, 3.0);
    assert_eq!(
        stack.metric("iop_edge_job_tool_calls_total{tool=\"workspace_command\",result=\"tool_denied\"}").await,
        1.0
    );
    assert_eq!(stack.metric("iop_edge_job_tool_calls_total{tool=\"workspace_list\",result=\"ok\"}").await, 3.0);
    assert!(job_dirs(&job.root).is_empty());
}

/// Streaming clients get keepalives while the job runs, then the answer.
#[tokio::test]
async fn a_streaming_job_keeps_the_client_alive_until_the_answer() {
    let limits = Limits { stream_keepalive_ms: 100, ..Default::default() };
    let job = start(StackOptions { limits: Some(limits), ..Default::default() }).await;
    let response = post(&job.stack, "/v1/messages", "quick", &messages("slow", true)).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    assert!(text.contains("event: ping"), "keepalives while the command runs: {text}");
    assert!(text.contains("The slow job is done."), "{text}");
    assert!(text.contains("event: message_stop"), "{text}");
}

/// A client that goes away cancels the job: the running command's whole
/// process group dies, then the request is cleaned.
#[tokio::test]
async fn a_client_disconnect_kills_the_running_command_and_cleans_up() {
    let job = start(StackOptions::default()).await;
    let request =
        post(&job.stack, "/v1/chat/completions", "quick", &chat_body("mock-ollama", "iop-mock-script:hang", true));
    let pending = tokio::spawn(async move { request.send().await.unwrap().text().await });
    let pid = grandchild(&job.root).await;
    pending.abort();
    wait_until("the grandchild was killed", WAIT, || async { !alive(pid) }).await;
    wait_until("the job's state was cleaned", WAIT, || async { job_dirs(&job.root).is_empty() }).await;
    let stack = &job.stack;
    wait_until("the job ended cancelled", WAIT, || async {
        stack.metric("iop_edge_job_terminals_total{state=\"cancelled\"}").await == 1.0
    })
    .await;
    assert_eq!(stack.metric("iop_edge_job_cleanups_total{result=\"cleaned\"}").await, 1.0);
}

/// The node's connection dies mid-job: the job fails closed (no other node
/// is tried), and the node, once it notices, kills the command and cleans.
#[tokio::test]
async fn losing_the_node_mid_job_fails_it_and_the_node_cleans_up() {
    let job = start(StackOptions { heartbeat: Some("50,300"), ..Default::default() }).await;
    let stack = &job.stack;
    let request =
        post(stack, "/v1/chat/completions", "quick", &chat_body("mock-ollama", "iop-mock-script:hang", false));
    let pending = tokio::spawn(async move { json_body(request.send().await.unwrap()).await });
    let pid = grandchild(&job.root).await;
    stack.nodes[0].pause();
    let (status, body) = pending.await.unwrap();
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("workspace_lost")), "{body}");
    assert_eq!(stack.metric("iop_edge_job_terminals_total{state=\"failed\"}").await, 1.0);
    stack.nodes[0].resume();
    wait_until("the node killed the command", WAIT, || async { !alive(pid) }).await;
    wait_until("the node cleaned the request", WAIT, || async { job_dirs(&job.root).is_empty() }).await;
}

/// A cleanup that cannot finish (the job's own state holds a link it will
/// not follow or remove) turns a success into a typed failure.
#[tokio::test]
async fn a_failed_cleanup_turns_success_into_a_failure() {
    let job = start(StackOptions::default()).await;
    let stack = &job.stack;
    let chat = chat_body("mock-ollama", "iop-mock-script:plant", false);
    let request = post(stack, "/v1/chat/completions", "quick", &chat);
    let pending = tokio::spawn(async move { json_body(request.send().await.unwrap()).await });
    // Another party than the command (the command cannot write there)
    // plants the link while the job runs.
    wait_until("the job's state directory", WAIT, || async { !job_dirs(&job.root).is_empty() }).await;
    let state = job.root.join(".iop/job").join(&job_dirs(&job.root)[0]);
    std::os::unix::fs::symlink("/etc", state.join("escape")).unwrap();
    std::fs::write(job.root.join("planted.flag"), "").unwrap();
    let (status, body) = pending.await.unwrap();
    assert_eq!((status, body["error"]["code"].as_str()), (500, Some("cleanup_failed")), "{body}");
    assert!(!state.join("by-command").exists(), "the sandboxed command wrote into .iop");
    assert_eq!(stack.metric("iop_edge_job_cleanups_total{result=\"partial\"}").await, 1.0);
    assert_eq!(stack.metric("iop_edge_job_terminals_total{state=\"failed\"}").await, 1.0);
    assert!(Path::new("/etc/hostname").exists() || Path::new("/etc/passwd").exists(), "the link's target is untouched");
    let left = job_dirs(&job.root);
    assert_eq!(left.len(), 1, "the refused entry stays, with its directory");
}

/// The same through the official `openai` SDK, against separate processes:
/// the SDK sees a typed, retryable 503.
#[tokio::test]
#[cfg_attr(iop_absent_python_sdks, ignore = "needs the Python SDKs: scripts/test-deps")]
async fn official_openai_sdk_sees_a_lost_node_as_a_typed_503() {
    let job = start(StackOptions { heartbeat: Some("50,300"), ..Default::default() }).await;
    let stack = &job.stack;
    let base = stack.url("");
    let client = tokio::spawn(async move { run_script("job_node_loss.py", &[&base, "mock-ollama"]).await });
    let pid = grandchild(&job.root).await;
    stack.nodes[0].pause();
    client.await.unwrap();
    stack.nodes[0].resume();
    wait_until("the node killed the command", WAIT, || async { !alive(pid) }).await;
    wait_until("the node cleaned the request", WAIT, || async { job_dirs(&job.root).is_empty() }).await;
}

/// Every API answers a job in its own shape, streamed or not.
#[tokio::test]
async fn every_api_answers_a_job_in_its_own_shape() {
    let job = start(StackOptions::default()).await;
    let stack = &job.stack;
    let input = "iop-mock-script:answer";
    let responses = json!({"model": "mock-ollama", "input": input});
    let (status, body) = json_body(post(stack, "/v1/responses", "quick", &responses).send().await.unwrap()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["output"][0]["content"][0]["text"], "Answer.", "{body}");
    let streamed = json!({"model": "mock-ollama", "input": input, "stream": true});
    let text = post(stack, "/v1/responses", "quick", &streamed).send().await.unwrap().text().await.unwrap();
    assert!(text.contains("response.completed") && text.contains("Answer."), "{text}");

    let chat = chat_body("mock-ollama", input, false);
    let (status, body) = json_body(post(stack, "/v1/chat/completions", "quick", &chat).send().await.unwrap()).await;
    assert_eq!((status, body["choices"][0]["message"]["content"].as_str()), (200, Some("Answer.")), "{body}");
    let response =
        post(stack, "/v1/chat/completions", "quick", &chat_body("mock-ollama", input, true)).send().await.unwrap();
    let events = sse_events(response).await;
    assert_eq!(streamed_text(&events), "Answer.");
    assert_eq!(events.last().unwrap(), "[DONE]");
    assert_eq!(stack.metric("iop_edge_jobs_total{api=\"responses\"}").await, 2.0);
    assert_eq!(stack.metric("iop_edge_jobs_total{api=\"chat_completions\"}").await, 2.0);
    assert_eq!(stack.metric("iop_anthropic_single_request_ingress_total").await, 0.0, "counts Messages jobs only");
}
