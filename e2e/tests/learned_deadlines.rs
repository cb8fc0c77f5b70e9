//! Issue 46 item 3: deadlines learned per provider, through real processes.
//! The node learns each provider's pace from its finished runs (time to
//! the first token per prompt token, the longest gap between tokens) and
//! cuts what falls far behind it: a provider that sends its headers and
//! then nothing is left at the learned first-token deadline (its fallback
//! answers), a stream that stalls is cut at the learned inter-token
//! deadline (and continued), instead of the 300 s stall default. The node
//! runs with a test floor of 300 ms (`--test-pace-floor-ms`) so the tests
//! take well under a second per deadline.

mod common;

use common::*;
use iop_e2e::harness::{Proc, ProviderSpec, wait_until};
use iop_proto::config::Adapter;
use serde_json::{Value, json};

const MODEL: &str = "paced";

/// A stack whose model has a preferred provider on its own mock (returned)
/// and a fallback on the stack's, its node on the test pace floor.
async fn stack() -> (Stack, Proc, String) {
    let (primary_mock, primary_url) = spawn_mock("127.0.0.1:0").await;
    let primary = ProviderSpec { priority: 0, ..provider("primary", Adapter::Ollama, "mock", MODEL, &primary_url) };
    let fallback = ProviderSpec { priority: 1, ..provider("fallback", Adapter::Ollama, "mock@words=20", MODEL, "") };
    let stack = Stack::start(StackOptions {
        extra_providers: vec![primary, fallback],
        node_args: vec!["--test-pace-floor-ms", "300"],
        ..Default::default()
    })
    .await;
    (stack, primary_mock, primary_url)
}

/// Answers from the preferred provider until its pace is learned (three
/// runs on the test profile) and its node reported it.
async fn learn_the_pace(stack: &Stack) {
    for _ in 0..4 {
        let body = json!({ "model": MODEL, "stream": true, "messages": [{ "role": "user", "content": "hi" }] });
        let events = stack.post("/v1/chat/completions", &body).await.text().await.unwrap();
        assert!(events.contains("[DONE]"), "{events}");
    }
    wait_until("the learned pace reported", WAIT, || async {
        let primary = stack.provider_admin("primary").await;
        primary["prefill_ms_per_1k_tokens"].is_u64() && primary["learned_stall_ms"].is_u64()
    })
    .await;
    let primary = stack.provider_admin("primary").await;
    assert_eq!(primary["learned_stall_ms"], 300, "a fast stream: the floor: {primary}");
    assert!(stack.metric("iop_edge_provider_learned_seconds{provider=\"primary\",figure=\"stall\"}").await > 0.0);
}

/// Headers, then nothing: no token by the learned first-token deadline,
/// so the attempt is replayed on the fallback, which answers.
#[tokio::test]
async fn headers_then_nothing_is_left_at_the_learned_first_token_deadline() {
    let (stack, _primary_mock, primary_url) = stack().await;
    stack.set_mock_faults(&primary_url, "words=8,chunk_delay_ms=5").await;
    learn_the_pace(&stack).await;

    stack.set_mock_faults(&primary_url, "first_token_delay_ms=600000").await;
    let fallback_before = stack.mock_requests(&stack.mock_url, "/api/chat", None).await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body(MODEL, "hi", false)).await).await;
    assert_eq!(status, 200, "the fallback answers: {body}");
    assert_eq!(stack.mock_requests(&stack.mock_url, "/api/chat", None).await, fallback_before + 1);
    let retried = "iop_edge_attempts_total{provider=\"primary\",outcome=\"retried\"}";
    assert_eq!(stack.metric(retried).await, 1.0, "one attempt left at its deadline");
}

/// A stream that stops after three words is cut at the learned
/// inter-token deadline and continued on the fallback (Ollama servers
/// continue a prefill by default): the client gets the whole answer.
#[tokio::test]
async fn a_stall_is_cut_at_the_learned_inter_token_deadline() {
    let (stack, _primary_mock, primary_url) = stack().await;
    stack.set_mock_faults(&primary_url, "words=20,chunk_delay_ms=5").await;
    learn_the_pace(&stack).await;
    wait_until("the fallback's server detected", WAIT, || async {
        stack.provider_admin("fallback").await["residency"] != "unknown"
    })
    .await;

    stack.set_mock_faults(&primary_url, "words=20,stall_after=3").await;
    let body = json!({ "model": MODEL, "stream": true, "messages": [{ "role": "user", "content": "count" }] });
    let events = stack.post("/v1/chat/completions", &body).await.text().await.unwrap();
    let text: String = events
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str().map(String::from))
        .collect();
    assert!(events.contains("[DONE]"), "{events}");
    assert!(text.starts_with("w1 w2 w3"), "{text}");
    assert!(text.ends_with("w20"), "continued to the end: {text}");
    assert_eq!(stack.metric("iop_edge_continuations_total{result=\"continued\"}").await, 1.0);
}
