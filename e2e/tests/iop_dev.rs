//! `iop-dev`, the README's first command: it comes up, answers a streamed
//! chat completion (curl-equivalent and the official `openai` Python SDK),
//! and stops cleanly on SIGTERM.

mod common;

use std::path::Path;

use common::{chat_body, http_client, sse_events, streamed_text};
use iop_e2e::harness::{bin, spawn_until};

async fn start_dev() -> (iop_e2e::harness::Proc, String) {
    let (dev, line) = spawn_until("iop-dev", &bin("iop-dev"), &["--http-addr", "127.0.0.1:0"], "IOP dev is up").await;
    let base = line.split_whitespace().find(|w| w.starts_with("http://")).expect("base URL printed").to_string();
    (dev, base)
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

/// Runs only where the `openai` package is installed; CI installs it and
/// sets IOP_REQUIRE_SDK=1 so a missing SDK fails instead of skipping.
#[tokio::test]
async fn official_openai_python_sdk_works_unmodified() {
    let has_sdk =
        std::process::Command::new("python3").args(["-c", "import openai"]).status().is_ok_and(|s| s.success());
    if !has_sdk {
        assert!(std::env::var_os("IOP_REQUIRE_SDK").is_none(), "IOP_REQUIRE_SDK is set but `import openai` fails");
        eprintln!("skipping: python3 `openai` package not installed (pip install openai)");
        return;
    }
    let (_dev, base) = start_dev().await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk/openai_chat.py");
    let output = tokio::process::Command::new("python3").arg(script).arg(&base).arg("mock").output().await.unwrap();
    assert!(
        output.status.success(),
        "sdk script failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
