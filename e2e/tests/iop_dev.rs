//! `iop-dev`, the README's first command: it comes up, answers a streamed
//! chat completion (curl-equivalent and the official `openai` Python SDK),
//! and stops cleanly on SIGTERM.

mod common;

use std::path::Path;

use common::{chat_body, http_client, run_script, sdk_installed, sse_events, streamed_text};
use iop_e2e::harness::{bin, spawn_until};

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

#[tokio::test]
async fn iop_dev_streams_an_answer_and_stops_cleanly() {
    let (dev, base) = start_dev().await;
    let response = http_client()
        .post(format!("{base}/chat/completions"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&chat_body("mock", "Hello!", true)).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let events = sse_events(response).await;
    assert_eq!(streamed_text(&events), "Hello from the IOP mock provider. You said: Hello!");
    assert_eq!(events.last().unwrap(), "[DONE]");
    let status = dev.terminate().await;
    assert!(status.success(), "iop-dev exits 0 on SIGTERM: {status:?}");
}

/// Runs an SDK script against a fresh `iop-dev`. Runs only where the Python
/// package is installed; CI installs the SDKs and sets IOP_REQUIRE_SDK=1 so a
/// missing SDK fails instead of skipping.
async fn run_sdk_script(package: &str, script: &str, base_suffix: &str) {
    if !sdk_installed(package) {
        return;
    }
    let (_dev, base) = start_dev().await;
    let base = format!("{}{base_suffix}", base.trim_end_matches("/v1"));
    run_script(script, &[&base, "mock"]).await;
}

#[tokio::test]
async fn official_openai_python_sdk_chat_completions() {
    run_sdk_script("openai", "openai_chat.py", "/v1").await;
}

#[tokio::test]
async fn official_openai_python_sdk_responses() {
    run_sdk_script("openai", "openai_responses.py", "/v1").await;
}

#[tokio::test]
async fn official_anthropic_python_sdk_messages() {
    run_sdk_script("anthropic", "anthropic_messages.py", "").await;
}

/// Both SDKs against `iop-dev --keys-file`: their own key headers work, and
/// IOP's 401/403 become their typed errors.
#[tokio::test]
async fn official_sdks_send_keys_and_type_401_and_403() {
    if !(sdk_installed("openai") && sdk_installed("anthropic")) {
        return;
    }
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
async fn official_sdks_run_workspace_jobs() {
    if !(sdk_installed("openai") && sdk_installed("anthropic")) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let workspace = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::write(workspace.join("README.md"), "# A project\n").unwrap();
    std::fs::write(workspace.join("hang.sh"), "sleep 300 & echo $! > grandchild.pid\nwait\n").unwrap();
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
