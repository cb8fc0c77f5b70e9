//! Issue 28 items 5 and 7 through real processes (Edge, node, mock
//! provider): a provider's own error code reaches the client in each API's
//! shape with the provider's status; a stream cut after its start is
//! `provider_stream_cut` and is not recorded as stall evidence; the Edge
//! logs a failed stream once, naming the provider, without the prompt; the
//! node logs the cut and the provider's 5xx with the provider id.

mod common;

use common::*;
use iop_proto::config::Adapter;
use serde_json::{Value, json};

/// Text only the client's prompt holds: it must appear in no log.
const PROMPT: &str = "the-secret-prompt-words-7f3a";

async fn stack() -> Stack {
    Stack::start(StackOptions {
        extra_providers: vec![
            provider(
                "openai-policy",
                Adapter::Openai,
                "mock@status=400,error_code=content_policy_violation",
                "mock-policy",
                "",
            ),
            // A code outside `[a-z0-9_.-]`: dropped, the gateway's code stays.
            provider("openai-odd-code", Adapter::Openai, "mock@status=400,error_code=Not.A.Code", "mock-odd-code", ""),
            provider("openai-cut", Adapter::Openai, "mock@cut_after=3,words=8", "mock-cut", ""),
            provider("ollama-cut", Adapter::Ollama, "mock@cut_after=3,words=8", "mock-ollama-cut", ""),
            provider("openai-503", Adapter::Openai, "mock@status=503", "mock-503", ""),
            tunnel(provider("openai-tunnel-cut", Adapter::Openai, "mock@cut_after=3,words=8", "mock-tunnel-cut", "")),
        ],
        capture_logs: true,
        ..Default::default()
    })
    .await
}

fn tunnel(mut spec: iop_e2e::harness::ProviderSpec) -> iop_e2e::harness::ProviderSpec {
    spec.mode = iop_proto::config::ProviderMode::Tunnel;
    spec
}

fn messages_body(model: &str, stream: bool) -> Value {
    json!({ "model": model, "max_tokens": 64, "stream": stream, "messages": [{ "role": "user", "content": PROMPT }] })
}

fn responses_body(model: &str, stream: bool) -> Value {
    json!({ "model": model, "stream": stream, "input": PROMPT })
}

/// Every `data:` payload of an SSE body, named events included, as JSON
/// (`[DONE]` and other non-JSON payloads left out).
async fn data_events(response: reqwest::Response) -> Vec<Value> {
    let text = response.text().await.unwrap();
    text.lines().filter_map(|l| l.strip_prefix("data: ")).filter_map(|d| serde_json::from_str(d).ok()).collect()
}

/// A `key=value` (or `key="value"`) field of a log line.
fn field(line: &str, key: &str) -> Option<String> {
    let rest = line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{key}=")))?;
    Some(rest.trim_matches('"').to_string())
}

async fn edge_metrics(stack: &Stack) -> String {
    stack.client.get(stack.admin_url("/metrics")).send().await.unwrap().text().await.unwrap()
}

/// Item 5a: OpenAI's `content_policy_violation` is the client's code, with
/// the provider's 400, in Chat (streaming or not), Responses and, as the
/// message's lead (Anthropic's `error.type` is a closed set), Messages. The
/// request metric's outcome stays the closed `provider_http_status`.
#[tokio::test]
async fn a_providers_own_error_code_reaches_the_client_in_each_api() {
    let stack = stack().await;
    for stream in [false, true] {
        let (status, body) =
            json_body(stack.post("/v1/chat/completions", &chat_body("mock-policy", PROMPT, stream)).await).await;
        assert_eq!(status, 400, "stream={stream}: {body}");
        assert_eq!(body["error"]["code"], "content_policy_violation", "stream={stream}: {body}");
        assert_eq!(body["error"]["type"], "invalid_request_error");

        let (status, body) = json_body(stack.post("/v1/responses", &responses_body("mock-policy", stream)).await).await;
        assert_eq!((status, &body["error"]["code"]), (400, &json!("content_policy_violation")), "{body}");

        let (status, body) = json_body(stack.post("/v1/messages", &messages_body("mock-policy", stream)).await).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("content_policy_violation: "), "{message}");
    }

    let (status, body) =
        json_body(stack.post("/v1/chat/completions", &chat_body("mock-odd-code", PROMPT, false)).await).await;
    assert_eq!((status, &body["error"]["code"]), (400, &json!("provider_http_status")), "{body}");

    let metrics = edge_metrics(&stack).await;
    assert!(!metrics.contains("content_policy_violation"), "a provider's code is never a metric label");
    assert!(
        metrics.lines().any(|l| l.starts_with("iop_edge_http_requests_total{")
            && l.contains("route=\"mock-policy\"")
            && l.contains("outcome=\"provider_http_status\"")),
        "the outcome label stays closed"
    );
}

/// Item 5b and 5c: a stream cut after it committed ends with the API's error
/// event saying `provider_stream_cut` (Chat and Responses carry the code;
/// Messages an `api_error`), never success, on both adapters; the cut is
/// health evidence of its own source, never `source="stall"`. Item 7: the
/// Edge logs each failed stream once, with provider, code and bytes sent,
/// and no prompt; the node logs the cut with the provider id.
#[tokio::test]
async fn a_cut_stream_is_provider_stream_cut_logged_once_and_no_stall() {
    let stack = stack().await;
    for model in ["mock-cut", "mock-ollama-cut"] {
        let events = data_events(stack.post("/v1/chat/completions", &chat_body(model, PROMPT, true)).await).await;
        let text: String =
            events.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect::<String>();
        assert!(text.starts_with("w1"), "{model}: the stream committed: {events:?}");
        let last = events.last().unwrap();
        assert_eq!(last["error"]["code"], "provider_stream_cut", "{model}: {last}");
    }

    let events = data_events(stack.post("/v1/responses", &responses_body("mock-cut", true)).await).await;
    let failed = events.iter().find(|e| e["type"] == "response.failed").expect("response.failed");
    assert_eq!(failed["response"]["error"]["code"], "provider_stream_cut", "{failed}");
    assert!(!events.iter().any(|e| e["type"] == "response.completed"), "{events:?}");

    let events = data_events(stack.post("/v1/messages", &messages_body("mock-cut", true)).await).await;
    let last = events.last().unwrap();
    assert_eq!((&last["type"], &last["error"]["type"]), (&json!("error"), &json!("api_error")), "{last}");
    assert!(!events.iter().any(|e| e["type"] == "message_stop"), "{events:?}");

    // Item 5c: recorded under its own source, never as a stall.
    let evidence = |metrics: &str, source: &str| {
        metrics.lines().any(|l| {
            l.starts_with("iop_edge_provider_health_evidence_total{") && l.contains(&format!("source=\"{source}\""))
        })
    };
    let metrics = edge_metrics(&stack).await;
    assert!(evidence(&metrics, "stream_cut"), "{metrics}");
    assert!(!evidence(&metrics, "stall"), "a cut is no stall: {metrics}");
    assert!(
        metrics.lines().any(|l| l.starts_with("iop_edge_http_requests_total{") && l.contains("provider_stream_cut")),
        "the outcome names the cut"
    );

    // Item 7: one Edge line per failed stream (four streams), each naming
    // the provider, the code and the bytes sent; the prompt in no log.
    let edge = stack.log("edge");
    let failed: Vec<&str> = edge.lines().filter(|l| l.contains("stream failed after it started")).collect();
    assert_eq!(failed.len(), 4, "{edge}");
    for line in &failed {
        let provider = field(line, "provider");
        assert!(matches!(provider.as_deref(), Some("openai-cut" | "ollama-cut")), "{line}");
        assert_eq!(field(line, "code").as_deref(), Some("provider_stream_cut"), "{line}");
        let bytes: u64 =
            field(line, "bytes_sent").and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no bytes_sent in {line}"));
        assert!(bytes > 0, "the client got the start of the answer: {line}");
    }
    let health: Vec<&str> = edge.lines().filter(|l| l.contains("provider health evidence")).collect();
    assert!(
        health.iter().any(|l| field(l, "provider").as_deref() == Some("openai-cut")
            && field(l, "source").as_deref() == Some("stream_cut")),
        "{health:?}"
    );
    let node = stack.log(&format!("node-{NODE}"));
    let cuts: Vec<&str> =
        node.lines().filter(|l| l.contains("provider call failed") && l.contains("PROVIDER_STREAM_CUT")).collect();
    for provider in ["openai-cut", "ollama-cut"] {
        assert!(cuts.iter().any(|l| field(l, "provider").as_deref() == Some(provider)), "{provider}: {node}");
    }
    for log in [&edge, &node] {
        assert!(!log.contains(PROMPT), "the prompt stays out of the logs");
    }
}

/// Item 7: the node logs a provider's 5xx with the provider id and status,
/// never the provider's error text.
#[tokio::test]
async fn the_node_logs_a_providers_5xx_with_its_id() {
    let stack = stack().await;
    let (status, body) =
        json_body(stack.post("/v1/chat/completions", &chat_body("mock-503", PROMPT, false)).await).await;
    assert_eq!(status, 502, "{body}");
    let node = stack.log(&format!("node-{NODE}"));
    let line = node
        .lines()
        .find(|l| l.contains("provider call failed") && field(l, "provider").as_deref() == Some("openai-503"))
        .unwrap_or_else(|| panic!("{node}"));
    assert_eq!(field(line, "status").as_deref(), Some("503"), "{line}");
    assert!(!line.contains("mock fault"), "not the provider's words: {line}");
    assert!(!node.contains(PROMPT));
}

/// Item 7, tunnels: a relayed stream cut after its head breaks the client's
/// body (never a clean end) and the Edge logs it once, naming the provider
/// and `provider_stream_cut`.
#[tokio::test]
async fn a_cut_tunnel_is_logged_once_with_its_provider() {
    let stack = stack().await;
    let body = serde_json::to_vec(&chat_body("mock-tunnel-cut", PROMPT, true)).unwrap();
    let sent =
        stack.client.post(stack.url("/v1/chat/completions")).header("content-type", "application/json").body(body);
    // A cut right after the commit can abort the connection before the
    // client read the head (as in the soak): an error either way.
    if let Ok(response) = sent.send().await {
        assert_eq!(response.status(), 200);
        let body = response.bytes().await;
        assert!(body.is_err() || !String::from_utf8_lossy(&body.unwrap()).contains("[DONE]"), "never a clean end");
    }
    let edge = stack.log("edge");
    let failed: Vec<&str> = edge.lines().filter(|l| l.contains("stream failed after it started")).collect();
    assert_eq!(failed.len(), 1, "{edge}");
    assert_eq!(field(failed[0], "provider").as_deref(), Some("openai-tunnel-cut"), "{}", failed[0]);
    assert_eq!(field(failed[0], "code").as_deref(), Some("provider_stream_cut"), "{}", failed[0]);
    assert!(!edge.contains(PROMPT));
}

/// Item 5 through the official SDKs: `openai` raises `BadRequestError` with
/// `code == "content_policy_violation"` and an `APIError` with
/// `code == "provider_stream_cut"` mid-stream; `anthropic` a
/// `BadRequestError` whose message leads with the code (`e2e/sdk/honest_errors.py`).
#[tokio::test]
#[cfg_attr(iop_absent_python_sdks, ignore = "needs the Python SDKs: scripts/test-deps")]
async fn official_sdks_see_the_providers_code_and_the_cut() {
    let stack = stack().await;
    run_script("honest_errors.py", &[stack.url("").trim_end_matches('/'), "mock-policy", "mock-cut"]).await;
}
