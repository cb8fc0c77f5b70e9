//! `iop-dev`, the README's first command: it comes up, answers a streamed
//! chat completion (curl-equivalent and the official `openai` Python SDK),
//! and stops cleanly on SIGTERM.

mod common;

use std::path::Path;

use common::{chat_body, free_port, http_client, json_body, run_script, sse_events, streamed_text};
use iop_e2e::harness::{bin, spawn_logged_until_lines, spawn_until, spawn_until_lines};
use serde_json::{Value, json};

/// A chat completion request to `iop-dev` at `base` (no key).
async fn post_chat(base: &str, body: &serde_json::Value) -> reqwest::Response {
    let request = http_client().post(format!("{base}/chat/completions")).header("content-type", "application/json");
    request.body(serde_json::to_vec(body).unwrap()).send().await.unwrap()
}

async fn start_dev() -> (iop_e2e::harness::Proc, String) {
    start_dev_with(&[]).await
}

async fn start_dev_with(extra: &[&str]) -> (iop_e2e::harness::Proc, String) {
    let mut args = vec!["--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let (dev, line) = spawn_until("iop-dev", &bin("iop-dev"), &args, "IOP dev is up").await;
    let base = line.split_whitespace().find(|w| w.starts_with("http://")).expect("base URL printed").to_string();
    (dev, base)
}

/// `iop-dev` with `extra`, and everything it printed up to `Press Ctrl-C`.
async fn start_dev_printing(extra: &[&str]) -> (iop_e2e::harness::Proc, String, Vec<String>) {
    let mut args = vec!["--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let (dev, lines) = spawn_until_lines("iop-dev", &bin("iop-dev"), &args, "Press Ctrl-C").await;
    let up = lines.iter().find(|l| l.contains("IOP dev is up")).expect("ready line");
    let base = up.split_whitespace().find(|w| w.starts_with("http://")).expect("base URL printed").to_string();
    (dev, base, lines)
}

/// The line starting with `prefix`, if printed.
fn printed<'a>(lines: &'a [String], prefix: &str) -> Option<&'a str> {
    lines.iter().map(String::as_str).find(|l| l.starts_with(prefix))
}

/// The request paths the mock provider at `mock` received (its log).
async fn mock_paths(mock: &str) -> Vec<String> {
    let (status, log) = json_body(http_client().get(format!("{mock}/mock/requests")).send().await.unwrap()).await;
    assert_eq!(status, 200, "{log}");
    log.as_array().unwrap().iter().map(|r| r["path"].as_str().unwrap().to_string()).collect()
}

/// Issue 27 item 5: `iop-dev` prints the mock provider's address (its
/// request log answers there), and `--mock-adapter openai` puts the mock
/// behind the node's OpenAI-compatible adapter; the default stays Ollama.
#[tokio::test]
async fn iop_dev_prints_the_mock_address_and_puts_the_mock_behind_either_adapter() {
    for (extra, adapter, chat_path) in [
        (&[][..], "Ollama adapter", "/api/chat"),
        (&["--mock-adapter", "ollama"][..], "Ollama adapter", "/api/chat"),
        (&["--mock-adapter", "openai"][..], "OpenAI-compatible adapter", "/v1/chat/completions"),
    ] {
        let (_dev, base, lines) = start_dev_printing(extra).await;
        let mock_line = printed(&lines, "Mock provider: ").unwrap_or_else(|| panic!("{extra:?}: {lines:?}"));
        let mock = mock_line.split_whitespace().nth(2).unwrap().to_string();
        assert!(mock.starts_with("http://127.0.0.1:"), "{mock_line}");
        let provider = printed(&lines, "Provider: ").expect("provider line");
        assert!(provider.contains(adapter) && provider.contains(&mock), "{extra:?}: {provider}");

        let (status, body) = json_body(post_chat(&base, &chat_body("mock", "Hello!", false)).await).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["choices"][0]["message"]["content"], "Hello from the IOP mock provider. You said: Hello!");
        let paths = mock_paths(&mock).await;
        assert_eq!(paths.iter().filter(|p| p.ends_with("/chat") || p.ends_with("/chat/completions")).count(), 1);
        assert!(paths.iter().any(|p| p == chat_path), "{extra:?}: {paths:?}");
    }
}

/// Issue 27 item 5: a user's real server (here a separately started mock
/// provider, as `--ollama` / `--openai-base` would name it) is probed on the
/// README's idle interval (60 s, re-probe from 1 s to 30 s), not on the
/// tests' one-second profile; no mock address is printed then.
#[tokio::test]
async fn iop_dev_probes_a_real_server_on_the_documented_intervals() {
    let (_server, line) =
        spawn_until("iop-mock-provider", &bin("iop-mock-provider"), &["--listen", "127.0.0.1:0"], "listening on").await;
    let server = line.split_whitespace().last().unwrap().to_string();
    for (flag, adapter) in [("--ollama", "Ollama adapter"), ("--openai-base", "OpenAI-compatible adapter")] {
        let (_dev, base, lines) = start_dev_printing(&[flag, &server, "--model", "mock"]).await;
        let provider = printed(&lines, "Provider: ").expect("provider line");
        assert!(provider.contains(adapter) && provider.contains(&server), "{provider}");
        assert!(provider.contains("health probe every 60 s; when down, re-probed from 1 s up to 30 s"), "{provider}");
        assert_eq!(printed(&lines, "Mock provider: "), None, "{lines:?}");
        assert_eq!(post_chat(&base, &chat_body("mock", "Hello!", false)).await.status(), 200);
    }
}

/// Issue 27 item 5: the mock's `call tool` answer fills the arguments from
/// the tool's schema (required properties with values of their types), on
/// both adapters and through Chat Completions and Anthropic Messages.
#[tokio::test]
async fn iop_dev_mock_tool_calls_fit_the_tool_schema() {
    let schema = json!({ "type": "object", "required": ["command", "workdir", "timeout_ms", "mode", "env"],
        "properties": {
            "command": { "type": "array", "items": { "type": "string" } },
            "workdir": { "type": ["string", "null"] },
            "timeout_ms": { "type": "integer", "minimum": 1000 },
            "mode": { "type": "string", "enum": ["read", "write"] },
            "env": { "type": "object", "properties": { "DEBUG": { "type": "boolean" } } },
            "justification": { "type": "string" },
        } });
    let want = json!({ "command": ["mock"], "workdir": "mock", "timeout_ms": 1000, "mode": "read",
        "env": { "DEBUG": true } });
    for adapter in ["ollama", "openai"] {
        let (_dev, base, _) = start_dev_printing(&["--mock-adapter", adapter]).await;
        let mut chat = chat_body("mock", "please call tool", false);
        chat["tools"] = json!([{ "type": "function", "function": { "name": "shell", "parameters": schema } }]);
        let (status, body) = json_body(post_chat(&base, &chat).await).await;
        assert_eq!(status, 200, "{adapter}: {body}");
        let call = &body["choices"][0]["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "shell", "{adapter}: {body}");
        let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(arguments, want, "{adapter}");

        let messages = json!({ "model": "mock", "max_tokens": 100,
            "tools": [{ "name": "shell", "input_schema": schema }],
            "messages": [{ "role": "user", "content": "please call tool" }] });
        let (status, body) = json_body(
            http_client()
                .post(format!("{}/messages", base))
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&messages).unwrap())
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, 200, "{adapter}: {body}");
        let tool_use = body["content"].as_array().unwrap().iter().find(|b| b["type"] == "tool_use").cloned();
        assert_eq!(tool_use.map(|b| b["input"].clone()), Some(want.clone()), "{adapter}: {body}");
    }
}

#[tokio::test]
async fn iop_dev_with_a_keys_file_requires_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.yaml");
    // SHA-256 of `k-dev`.
    let hash = "3cf1c335da535bb3932af07cc27ab534d423d5b8bed857e0458e4e476b85a542";
    std::fs::write(&keys, format!("principals: [ {{ name: dev, key_sha256: {hash}, models: ['*'] }} ]\n")).unwrap();
    let (_dev, base) = start_dev_with(&["--keys-file", keys.to_str().unwrap()]).await;
    let body = serde_json::to_vec(&chat_body("mock", "Hello!", false)).unwrap();
    let send = |key: Option<&str>| {
        let mut request = http_client()
            .post(format!("{base}/chat/completions"))
            .header("content-type", "application/json")
            .body(body.clone());
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(send(None).await, 401);
    assert_eq!(send(Some("k-other")).await, 401);
    assert_eq!(send(Some("k-dev")).await, 200);
}

/// A streamed answer, then SIGTERM: exit 0, and the node's session ends
/// as an INFO line (a normal stop is not a warning).
#[tokio::test]
async fn iop_dev_streams_an_answer_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("iop-dev.log");
    let args = ["--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"];
    let (dev, lines) = spawn_logged_until_lines("iop-dev", &bin("iop-dev"), &args, "IOP dev is up", Some(&log)).await;
    let base = lines.last().unwrap().split_whitespace().find(|w| w.starts_with("http://")).unwrap().to_string();
    let response = post_chat(&base, &chat_body("mock", "Hello!", true)).await;
    assert_eq!(response.status(), 200);
    let events = sse_events(response).await;
    assert_eq!(streamed_text(&events), "Hello from the IOP mock provider. You said: Hello!");
    assert_eq!(events.last().unwrap(), "[DONE]");
    let status = dev.terminate().await;
    assert!(status.success(), "iop-dev exits 0 on SIGTERM: {status:?}");
    let log = std::fs::read_to_string(&log).unwrap();
    let fenced: Vec<&str> = log.lines().filter(|l| l.contains("generation fenced")).collect();
    assert!(!fenced.is_empty(), "the session's end is logged: {log}");
    assert!(fenced.iter().all(|l| l.contains(" INFO ")), "a normal stop logs at INFO: {fenced:?}");
}

/// With its provider down, `iop-dev` does not say it is up: it says what is
/// wrong and how to fix it, keeps waiting, and is up once the provider
/// (started after it) answers the node's probe.
#[tokio::test]
async fn iop_dev_is_up_only_once_its_provider_answers() {
    use tokio::io::AsyncBufReadExt;
    let provider = free_port();
    let base_url = format!("http://{provider}");
    // iop-dev's own PKI goes here, removed after it is killed (as the harness does).
    let tmp = tempfile::tempdir().unwrap();
    let mut dev = tokio::process::Command::new(bin("iop-dev"))
        .args(["--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .args(["--openai-base", &base_url, "--model", "mock"])
        .env("TMPDIR", tmp.path())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(dev.stdout.take().unwrap()).lines();
    let mut next_line = async || {
        tokio::time::timeout(std::time::Duration::from_secs(60), lines.next_line())
            .await
            .expect("iop-dev prints within 60 s")
            .unwrap()
            .expect("iop-dev is still running")
    };
    let waiting = next_line().await;
    assert!(waiting.starts_with("iop-dev: not up yet"), "{waiting}");
    assert!(waiting.contains("did not answer the node's health probe"), "{waiting}");
    assert!(waiting.contains(&format!("is the OpenAI-compatible server running at {base_url}")), "{waiting}");
    assert!(waiting.contains("Still waiting"), "{waiting}");

    let (_mock, _) = spawn_until(
        "iop-mock-provider",
        &bin("iop-mock-provider"),
        &["--listen", &provider.to_string()],
        "listening on",
    )
    .await;
    let up = loop {
        let line = next_line().await;
        if line.contains("IOP dev is up") {
            break line;
        }
        assert!(line.starts_with("iop-dev: not up yet"), "only waiting lines come before `up`: {line}");
    };
    let base = up.split_whitespace().find(|w| w.starts_with("http://")).unwrap().to_string();
    assert_eq!(post_chat(&base, &chat_body("mock", "Hello!", false)).await.status(), 200);
}

/// Runs an SDK script against a fresh `iop-dev`.
async fn run_sdk_script(script: &str, base_suffix: &str) {
    let (_dev, base) = start_dev().await;
    let base = format!("{}{base_suffix}", base.trim_end_matches("/v1"));
    run_script(script, &[&base, "mock"]).await;
}

#[tokio::test]
#[cfg_attr(iop_absent_python_sdks, ignore = "needs the Python SDKs: scripts/test-deps")]
async fn official_openai_python_sdk_chat_completions() {
    run_sdk_script("openai_chat.py", "/v1").await;
}

#[tokio::test]
#[cfg_attr(iop_absent_python_sdks, ignore = "needs the Python SDKs: scripts/test-deps")]
async fn official_openai_python_sdk_responses() {
    run_sdk_script("openai_responses.py", "/v1").await;
}

#[tokio::test]
#[cfg_attr(iop_absent_python_sdks, ignore = "needs the Python SDKs: scripts/test-deps")]
async fn official_anthropic_python_sdk_messages() {
    run_sdk_script("anthropic_messages.py", "").await;
}

/// Both SDKs against `iop-dev --keys-file`: their own key headers work, and
/// IOP's 401/403 become their typed errors.
#[tokio::test]
#[cfg_attr(iop_absent_python_sdks, ignore = "needs the Python SDKs: scripts/test-deps")]
async fn official_sdks_send_keys_and_type_401_and_403() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.yaml");
    // SHA-256 of `k-dev`; the principal may use `mock` only.
    let hash = "3cf1c335da535bb3932af07cc27ab534d423d5b8bed857e0458e4e476b85a542";
    std::fs::write(&keys, format!("principals: [ {{ name: dev, key_sha256: {hash}, models: [mock] }} ]\n")).unwrap();
    let (_dev, base) = start_dev_with(&["--keys-file", keys.to_str().unwrap()]).await;
    run_script("auth.py", &[base.trim_end_matches("/v1"), "k-dev", "mock", "other"]).await;
}

/// A workspace job through both official SDKs against `iop-dev --workspace`
/// with the example mock script: the whole job (one repair), streaming,
/// budgets, entry errors, and a client giving up mid-command (the command's
/// process group dies, the job's state is removed).
#[tokio::test]
#[cfg_attr(iop_absent_python_sdks, ignore = "needs the Python SDKs: scripts/test-deps")]
async fn official_sdks_run_workspace_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::write(workspace.join("README.md"), "# A project\n").unwrap();
    std::fs::write(workspace.join("hang.sh"), "sleep 300 & echo $! > grandchild.pid\nwait\n").unwrap();
    common::let_commands_use(&workspace);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mock-script.yaml");
    let args = [
        "--workspace",
        workspace.to_str().unwrap(),
        "--workspace-command",
        "test=echo all tests pass",
        "--workspace-command",
        "hang=sh hang.sh",
        "--mock-script-file",
        script.to_str().unwrap(),
    ];
    let (_dev, base) = start_dev_with(&args).await;
    run_script("jobs.py", &[base.trim_end_matches("/v1"), "mock", workspace.to_str().unwrap()]).await;
}

/// The attack of issue 24 item 4: a web page the developer visits posts
/// `text/plain` to `iop-dev`'s admin workspace diagnostic to write files.
/// `--workspace` alone no longer serves the diagnostic; with
/// `--admin-workspace-calls` it takes only JSON, from no web page, addressed
/// to this machine; the client API refuses non-JSON bodies and foreign
/// `Host`s (auth is disabled) too. Nothing is written until a real call.
#[tokio::test]
async fn iop_dev_refuses_cross_site_requests_and_the_diagnostic_is_opt_in() {
    let dir = tempfile::tempdir().unwrap();
    let workspace = std::fs::canonicalize(dir.path()).unwrap();
    let target = workspace.join("pwned.txt");
    let calls = r#"{"calls": [{"op": "write", "path": "pwned.txt", "content": "x"}]}"#;
    let start = |extra: &'static [&'static str]| {
        let workspace = workspace.clone();
        async move {
            let (http, admin) = (free_port().to_string(), free_port().to_string());
            let mut args =
                vec!["--http-addr", &http, "--admin-addr", &admin, "--workspace", workspace.to_str().unwrap()];
            args.extend_from_slice(extra);
            let (dev, _) = spawn_until("iop-dev", &bin("iop-dev"), &args, "IOP dev is up").await;
            (dev, http, admin)
        }
    };
    let post =
        |url: String, content_type: &'static str, extra: Option<(&'static str, &'static str)>, body: &'static str| {
            let mut request = http_client().post(url).header("content-type", content_type).body(body);
            if let Some((name, value)) = extra {
                request = request.header(name, value);
            }
            async move { json_body(request.send().await.unwrap()).await }
        };

    let (dev, _, admin) = start(&[]).await;
    let diagnostic = format!("http://{admin}/admin/v1/workspaces/dev/calls");
    let (status, body) = post(diagnostic.clone(), "application/json", None, calls).await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("workspace_calls_disabled")), "{body}");
    drop(dev);

    let (_dev, http, admin) = start(&["--admin-workspace-calls"]).await;
    let diagnostic = format!("http://{admin}/admin/v1/workspaces/dev/calls");
    let (status, body) = post(diagnostic.clone(), "text/plain", None, calls).await;
    assert_eq!((status, body["error"]["code"].as_str()), (415, Some("unsupported_media_type")), "{body}");
    let (status, body) =
        post(diagnostic.clone(), "application/json", Some(("origin", "https://evil.example")), calls).await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("origin_not_allowed")), "{body}");
    let (status, body) = post(diagnostic.clone(), "application/json", Some(("host", "evil.example:8081")), calls).await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("host_not_allowed")), "{body}");
    let chat = r#"{"model":"mock","messages":[{"role":"user","content":"hi"}]}"#;
    let client_api = format!("http://{http}/v1/chat/completions");
    let (status, body) = post(client_api.clone(), "text/plain", None, chat).await;
    assert_eq!((status, body["error"]["code"].as_str()), (415, Some("unsupported_media_type")), "{body}");
    let (status, body) = post(client_api.clone(), "application/json", Some(("host", "rebound.example")), chat).await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("host_not_allowed")), "{body}");
    assert!(!target.exists(), "nothing was written by a refused request");

    let (status, body) = post(client_api.clone(), "application/json", Some(("host", "localhost")), chat).await;
    assert_eq!(status, 200, "{body}");
    // Without --keys-file the `dev` workspace is open to anonymous callers.
    let (status, body) = post(client_api, "application/json", Some(("iop-workspace", "dev")), chat).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(diagnostic, "application/json; charset=utf-8", None, calls).await;
    assert_eq!(status, 200, "{body}");
    assert!(target.exists(), "the real call wrote");
}
