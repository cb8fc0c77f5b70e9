//! Gateway execution through real processes: fallback before the first
//! byte, no retry of client errors, 429 handling, capacity queues, lease
//! release on every path, cancellation reaching the provider, and no
//! head-of-line blocking between runs on one node.

mod common;

use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use iop_e2e::harness::{ProviderSpec, wait_until};
use iop_proto::config::{Adapter, Limits};
use serde_json::{Value, json};

fn p(id: &str, adapter: Adapter, target: &str, public: &str, priority: u32, capacity: u32) -> ProviderSpec {
    let mut spec = provider(id, adapter, target, public, "");
    spec.priority = priority;
    spec.capacity = capacity;
    spec
}

async fn stack(providers: Vec<ProviderSpec>, limits: Option<Limits>) -> Stack {
    Stack::start(StackOptions { extra_providers: providers, limits, ..Default::default() }).await
}

fn requests_total(stats: &Value) -> u64 {
    stats["requests_total"].as_u64().unwrap()
}

#[tokio::test]
async fn falls_back_to_the_next_group_before_the_first_byte() {
    let stack = stack(
        vec![
            p("flaky", Adapter::Ollama, "mock@status=503", "fb", 0, 4),
            p("good", Adapter::Openai, "mock@words=3", "fb", 1, 4),
        ],
        None,
    )
    .await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("fb", "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "mock@words=3", "the model names the target that answered");
    assert_eq!(body["choices"][0]["message"]["content"], "w1 w2 w3");
    assert_eq!(body["usage"]["completion_tokens"], 3, "usage of the answering attempt only");

    let events = sse_events(stack.post("/v1/chat/completions", &chat_body("fb", "hi", true)).await).await;
    assert_eq!(streamed_text(&events), "w1 w2 w3");
    stack.wait_metric_at_least("iop_edge_lease_releases_total{reason=\"retried\"}", 2.0).await;
}

#[tokio::test]
async fn client_errors_are_returned_and_never_retried() {
    let stack = stack(
        vec![
            p("strict", Adapter::Openai, "mock@status=400", "nr", 0, 4),
            p("spare", Adapter::Openai, "mock", "nr", 1, 4),
        ],
        None,
    )
    .await;
    let before = requests_total(&stack.mock_stats().await);
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("nr", "hi", false)).await).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(requests_total(&stack.mock_stats().await) - before, 1, "exactly one provider call");
}

#[tokio::test]
async fn a_429_moves_to_an_alternative_at_once_and_otherwise_passes_through() {
    let limits = Limits { request_timeout_ms: 5_000, ..Limits::default() };
    let stack = stack(
        vec![
            p("limited", Adapter::Ollama, "mock@status=429,retry_after=30", "rl", 0, 4),
            p("relief", Adapter::Ollama, "mock@words=2", "rl", 1, 4),
            p("lonely", Adapter::Ollama, "mock@status=429,retry_after=30", "rl-only", 0, 4),
        ],
        Some(limits),
    )
    .await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("rl", "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "w1 w2");

    // Retry-After (30 s) does not fit the 5 s budget: the client gets the 429
    // at once, with the provider's Retry-After, after a single provider call.
    let before = requests_total(&stack.mock_stats().await);
    let response = stack
        .post(
            "/v1/messages",
            &serde_json::json!({
                "model": "rl-only", "max_tokens": 10, "messages": [{ "role": "user", "content": "hi" }]
            }),
        )
        .await;
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "30");
    let (_, body) = json_body(response).await;
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert_eq!(requests_total(&stack.mock_stats().await) - before, 1, "no tight retry loop");
}

#[tokio::test]
async fn capacity_queue_full_queue_timeout_and_release_on_disconnect() {
    let limits = Limits { queue_depth: 1, queue_timeout_ms: 300, ..Limits::default() };
    let stack = stack(vec![p("single", Adapter::Ollama, "mock@stall_after=1", "one", 0, 1)], Some(limits)).await;

    // The first request takes the only slot and holds it (the provider stalls).
    let holder = stack.post("/v1/chat/completions", &chat_body("one", "hi", true)).await;
    assert_eq!(holder.status(), 200);
    let mut holder = holder.bytes_stream();
    holder.next().await.expect("first chunk").unwrap();
    assert_eq!(stack.provider_admin("single").await["in_flight"], 1);

    // The second waits in the queue, the third finds the queue full.
    let queued = tokio::spawn({
        let (client, url) = (stack.client.clone(), stack.url("/v1/chat/completions"));
        async move {
            let body = serde_json::to_vec(&chat_body("one", "hi", false)).unwrap();
            let response = client.post(url).header("content-type", "application/json").body(body).send().await.unwrap();
            let retry_after = response.headers().get("retry-after").cloned();
            (json_body(response).await, retry_after)
        }
    });
    wait_until("one request queued", WAIT, || async {
        stack.get_json("/admin/v1/providers").await["queued"]["one"] == 1
    })
    .await;
    let full = stack.post("/v1/chat/completions", &chat_body("one", "hi", false)).await;
    assert_eq!(full.status(), 429);
    assert_eq!(full.headers()["retry-after"], "1");
    assert_eq!(json_body(full).await.1["error"]["code"], "queue_full");

    let ((status, body), retry_after) = queued.await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "queue_timeout");
    assert!(retry_after.is_some());

    // The holder goes away: its run is cancelled at the provider and its
    // slot released exactly once.
    let aborted = stack.mock_stats().await["aborted_streams"].as_u64().unwrap();
    drop(holder);
    wait_until("the provider saw the connection close", WAIT, || async {
        stack.mock_stats().await["aborted_streams"].as_u64().unwrap() > aborted
    })
    .await;
    wait_until("the slot is free", WAIT, || async { stack.provider_admin("single").await["in_flight"] == 0 }).await;
    let leases = &stack.get_json("/admin/v1/providers").await["leases"];
    assert_eq!(leases["acquired"], leases["released"], "{leases}");
    assert_eq!(leases["double_releases"], 0);
    assert!(stack.metric("iop_edge_lease_releases_total{reason=\"client_disconnected\"}").await >= 1.0);
}

#[tokio::test]
async fn cancelling_a_non_streaming_request_aborts_only_that_provider_request() {
    let stack = stack(vec![p("stuck", Adapter::Openai, "mock@stall_after=1", "stuck", 0, 4)], None).await;
    let before = stack.mock_stats().await;
    let request = tokio::spawn({
        let (client, url) = (stack.client.clone(), stack.url("/v1/chat/completions"));
        async move {
            let body = serde_json::to_vec(&chat_body("stuck", "hi", false)).unwrap();
            client.post(url).header("content-type", "application/json").body(body).send().await
        }
    });
    wait_until("the provider got the request", WAIT, || async {
        requests_total(&stack.mock_stats().await) > requests_total(&before)
    })
    .await;
    request.abort();
    // Meanwhile another run on the same node is unaffected.
    let (status, _) = json_body(stack.post("/v1/chat/completions", &chat_body("mock-ollama", "hi", false)).await).await;
    assert_eq!(status, 200);
    wait_until("the provider saw the connection close", WAIT, || async {
        stack.mock_stats().await["aborted_streams"].as_u64() > before["aborted_streams"].as_u64()
    })
    .await;
    wait_until("the slot is free", WAIT, || async { stack.provider_admin("stuck").await["in_flight"] == 0 }).await;
}

#[tokio::test]
async fn a_slow_reader_does_not_block_other_streams_on_the_node() {
    let stack = stack(vec![p("big", Adapter::Ollama, "mock@words=200000", "big", 0, 4)], None).await;
    // Far more output than every buffer between provider and client holds.
    let slow = stack.post("/v1/chat/completions", &chat_body("big", "hi", true)).await;
    let mut slow = slow.bytes_stream();
    slow.next().await.expect("first chunk").unwrap();
    // The slow client stops reading. Wait until its backpressure has reached
    // the provider: every buffer on the way (client socket, Edge, the run's
    // HTTP/2 stream, Node) is full and the mock cannot write more.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let (mut last, mut unchanged) = (0, 0);
    while unchanged < 5 {
        assert!(tokio::time::Instant::now() < deadline, "the slow stream never reached the provider's backpressure");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let bytes = stack.mock_stats().await["stream_bytes"].as_u64().unwrap();
        unchanged = if bytes == last { unchanged + 1 } else { 0 };
        last = bytes;
    }
    // Another stream on the same node still runs to completion.
    for _ in 0..3 {
        let body = chat_body("mock-openai", "hi there", true);
        let events = tokio::time::timeout(Duration::from_secs(10), async {
            sse_events(stack.post("/v1/chat/completions", &body).await).await
        })
        .await
        .expect("a stream on the same node is not blocked by the slow one");
        assert_eq!(streamed_text(&events), "Hello from the IOP mock provider. You said: hi there");
    }
    let stats = stack.mock_stats().await;
    assert_eq!(stats["completed_streams"], 3, "the slow stream is still blocked: {stats}");
    drop(slow);
}

/// Malformed provider output that fails the run (three events in a row, or
/// the reply's end) never reaches the client: a non-streaming client gets
/// `502 provider_protocol`, a streaming one the error event, never `[DONE]`.
#[tokio::test]
async fn malformed_provider_output_never_reaches_the_client() {
    let limits = Limits { max_attempts: 1, ..Limits::default() };
    let stack = stack(
        vec![
            p("garbled-run", Adapter::Openai, "mock@malformed_at=2,malformed_run=3", "garbled-run", 0, 4),
            p("garbled-end", Adapter::Openai, "mock@malformed_end", "garbled-end", 0, 4),
            p("garbled-ollama", Adapter::Ollama, "mock@malformed_at=2,malformed_run=3", "garbled-ollama", 0, 4),
        ],
        Some(limits),
    )
    .await;
    for model in ["garbled-run", "garbled-end", "garbled-ollama"] {
        let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body(model, "hi", false)).await).await;
        assert_eq!(status, 502, "{model}: {body}");
        assert_eq!(body["error"]["code"], "provider_protocol", "{model}");

        let events = sse_events(stack.post("/v1/chat/completions", &chat_body(model, "hi", true)).await).await;
        assert!(!events.contains(&"[DONE]".to_string()), "{model}: never reported as a success: {events:?}");
        for event in &events {
            let value: Value = serde_json::from_str(event)
                .unwrap_or_else(|_| panic!("{model}: malformed event reached the client: {event}"));
            assert!(!event.contains("broken"), "{value}");
        }
        let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
        assert_eq!(last["error"]["code"], "provider_protocol", "{model}");
    }
}

/// Issue 28 item 3: one malformed chunk in the middle of a good stream is
/// skipped on the node (both adapters), the client's answer completes with
/// every other chunk's text (OpenAI Chat and Anthropic Messages, streaming
/// and not), and the node counts it for its provider.
#[tokio::test]
async fn one_malformed_chunk_does_not_end_the_answer() {
    // One attempt: a retry on another provider cannot hide a failure.
    let limits = Limits { max_attempts: 1, ..Limits::default() };
    let target = "mock@words=5,malformed_at=3";
    let stack = stack(
        vec![
            p("glitchy-ollama", Adapter::Ollama, target, "glitchy-ollama", 0, 4),
            p("glitchy-openai", Adapter::Openai, target, "glitchy-openai", 0, 4),
        ],
        Some(limits),
    )
    .await;
    // The third piece, ` w3`, is the malformed one.
    const EXPECTED: &str = "w1 w2 w4 w5";
    for model in ["glitchy-ollama", "glitchy-openai"] {
        let events = sse_events(stack.post("/v1/chat/completions", &chat_body(model, "hi", true)).await).await;
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{model}: {events:?}");
        assert_eq!(streamed_text(&events), EXPECTED, "{model}");
        let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body(model, "hi", false)).await).await;
        assert_eq!(status, 200, "{model}: {body}");
        assert_eq!(body["choices"][0]["message"]["content"], EXPECTED, "{model}");

        let messages = json!({ "model": model, "max_tokens": 64, "stream": true, "messages": [{ "role": "user", "content": "hi" }] });
        let text = stack.post("/v1/messages", &messages).await.text().await.unwrap();
        let names: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
        assert_eq!(names.last(), Some(&"message_stop"), "{model}: {text}");
        assert!(!names.contains(&"error"), "{model}: {text}");
        let streamed: String = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|data| serde_json::from_str::<Value>(data).ok())
            .filter(|event| event["type"] == "content_block_delta")
            .filter_map(|event| event["delta"]["text"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(streamed, EXPECTED, "{model}");
        let mut whole = messages.clone();
        whole["stream"] = json!(false);
        let (status, body) = json_body(stack.post("/v1/messages", &whole).await).await;
        assert_eq!(status, 200, "{model}: {body}");
        assert_eq!(
            (body["content"][0]["text"].as_str(), body["stop_reason"].as_str()),
            (Some(EXPECTED), Some("end_turn"))
        );

        let node_metrics = stack.node_metrics.clone().unwrap();
        let sample = format!("iop_node_provider_malformed_events_total{{provider=\"{model}\"}}");
        assert_eq!(stack.metric_at(&node_metrics, &sample).await, 4.0, "{model}: one per answer");
    }
}

fn tunnel(id: &str, target: &str, public: &str, priority: u32) -> ProviderSpec {
    let mut spec = p(id, Adapter::Openai, target, public, priority, 4);
    spec.mode = iop_proto::config::ProviderMode::Tunnel;
    spec
}

#[tokio::test]
async fn tunnel_mode_relays_the_providers_answer_as_sent() {
    let stack = stack(
        vec![
            tunnel("tun", "mock@words=3", "tun", 0),
            tunnel("tun-strict", "mock@status=400", "tun-strict", 0),
            tunnel("tun-down", "mock@status=503", "tun-fb", 0),
            p("tun-good", Adapter::Ollama, "mock@words=2", "tun-fb", 1, 4),
        ],
        None,
    )
    .await;
    // The mock's own ids and its echo of the target model prove the body was
    // relayed, not re-rendered by the Edge (whose ids are 32 hex digits).
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("tun", "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-mock-"), "{body}");
    assert_eq!(body["model"], "mock@words=3", "model rewritten to the target");
    assert_eq!(body["choices"][0]["message"]["content"], "w1 w2 w3");

    let events = sse_events(stack.post("/v1/chat/completions", &chat_body("tun", "hi", true)).await).await;
    assert_eq!(streamed_text(&events), "w1 w2 w3");
    assert_eq!(events.last().unwrap(), "[DONE]");
    assert!(events[0].contains("chatcmpl-mock-"), "{}", events[0]);

    // A client error is relayed in the provider's own (same-API) shape.
    let (status, body) =
        json_body(stack.post("/v1/chat/completions", &chat_body("tun-strict", "hi", false)).await).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], Value::Null, "the mock's error object, not the Edge's: {body}");

    // A retryable provider error before the first byte still falls back.
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("tun-fb", "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "w1 w2");

    // The Responses API is relayed the same way, to the provider's own
    // `/v1/responses`, with fields the Edge does not model left as sent.
    let responses = serde_json::json!({
        "model": "tun", "input": "hi", "store": false, "metadata": { "ticket": "42" },
    });
    let (status, body) = json_body(stack.post("/v1/responses", &responses).await).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["id"].as_str().unwrap().starts_with("resp_mock"), "the provider's own response: {body}");
    assert_eq!(body["model"], "mock@words=3");
    assert_eq!(body["output"][0]["content"][0]["text"], "w1 w2 w3");
    let relayed = stack.last_provider_request("/v1/responses").await;
    assert_eq!((&relayed["model"], &relayed["metadata"]), (&json!("mock@words=3"), &json!({ "ticket": "42" })));
    let mut streamed = responses.clone();
    streamed["stream"] = json!(true);
    let text = stack.post("/v1/responses", &streamed).await.text().await.unwrap();
    let completed = text.split("\n\n").find(|e| e.starts_with("event: response.completed")).expect(&text);
    let completed: Value = serde_json::from_str(completed.split_once("data: ").unwrap().1).unwrap();
    assert_eq!(completed["response"]["output"][0]["content"][0]["text"], "w1 w2 w3");
    assert!(completed["response"]["id"].as_str().unwrap().starts_with("resp_mock"), "{completed}");

    // APIs the provider does not serve itself are still normalized.
    let messages =
        serde_json::json!({ "model": "tun", "max_tokens": 10, "messages": [{ "role": "user", "content": "hi" }] });
    let (status, body) = json_body(stack.post("/v1/messages", &messages).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["content"][0]["text"], "w1 w2 w3");
    let leases = &stack.get_json("/admin/v1/providers").await["leases"];
    assert_eq!(leases["acquired"], leases["released"], "{leases}");
}

/// Issue 25 item 8: a tunnel relays only the headers a provider API reads,
/// in both directions.
#[tokio::test]
async fn a_tunnel_relays_only_allowlisted_headers_both_ways() {
    let stack = stack(vec![tunnel("tun-headers", "mock@set_cookie", "tun-headers", 0)], None).await;
    let mut request = stack
        .client
        .post(stack.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("openai-beta", "assistants=v2");
    for (name, value) in [
        ("x-forwarded-for", "169.254.169.254"),
        ("forwarded", "for=10.0.0.1"),
        ("x-real-ip", "10.0.0.1"),
        ("x-http-method-override", "DELETE"),
        ("metadata-flavor", "Google"),
        ("x-aws-ec2-metadata-token", "client-token"),
        ("x-mock-faults", "status=500"),
        ("cookie", "session=client"),
    ] {
        request = request.header(name, value);
    }
    let response =
        request.body(serde_json::to_vec(&chat_body("tun-headers", "hi", false)).unwrap()).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    assert_eq!(headers.get("set-cookie"), None, "the provider's cookie reached the client: {headers:?}");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "99", "rate-limit headers are relayed: {headers:?}");
    let (_, body) = json_body(response).await;
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-mock-"), "relayed, not normalized: {body}");

    let seen = stack.last_provider_entry("/v1/chat/completions").await;
    let names: Vec<&str> = seen["headers"].as_array().unwrap().iter().map(|h| h[0].as_str().unwrap()).collect();
    for refused in [
        "x-forwarded-for",
        "forwarded",
        "x-real-ip",
        "x-http-method-override",
        "metadata-flavor",
        "x-aws-ec2-metadata-token",
        "x-mock-faults",
        "cookie",
    ] {
        assert!(!names.contains(&refused), "{refused} reached the provider: {names:?}");
    }
    assert!(names.contains(&"openai-beta") && names.contains(&"content-type"), "{names:?}");
}

#[tokio::test]
async fn ollama_api_command_runs_only_the_read_only_allowlist() {
    let stack = stack(vec![], None).await;
    for (call, check) in [("tags", "models"), ("ps", "models"), ("version", "version")] {
        let body = stack.get_json(&format!("/admin/v1/providers/ollama-mock/ollama/{call}")).await;
        assert_eq!(body["status"], 200, "{call}: {body}");
        assert!(body["body"][check].is_array() || body["body"][check].is_string(), "{call}: {body}");
    }
    let show = stack.get_json("/admin/v1/providers/ollama-mock/ollama/show").await;
    assert_eq!(show["body"]["model"], "mock", "show asks about the provider's own target: {show}");

    let refused =
        stack.client.get(stack.admin_url("/admin/v1/providers/ollama-mock/ollama/pull")).send().await.unwrap();
    assert_eq!(refused.status(), 400);
    assert_eq!(json_body(refused).await.1["error"]["code"], "unsupported_call");
    let wrong = stack.client.get(stack.admin_url("/admin/v1/providers/openai-mock/ollama/tags")).send().await.unwrap();
    assert_eq!(wrong.status(), 400);
    assert_eq!(json_body(wrong).await.1["error"]["code"], "invalid_target");
    let unknown = stack.client.get(stack.admin_url("/admin/v1/providers/nope/ollama/tags")).send().await.unwrap();
    assert_eq!(unknown.status(), 404);
}

#[tokio::test]
async fn a_provider_silent_past_its_stall_timeout_is_retried_elsewhere() {
    let mut silent = p("silent", Adapter::Openai, "mock@headers_delay_ms=60000", "quiet", 0, 4);
    silent.stall_timeout_ms = 1_000;
    let stack = stack(vec![silent, p("chatty", Adapter::Openai, "mock@words=2", "quiet", 1, 4)], None).await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("quiet", "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "w1 w2");
    assert!(stack.metric("iop_edge_attempts_total{provider=\"silent\",outcome=\"retried\"}").await >= 1.0);
}

/// Issue 8 item 5: an answer the Edge would have to hold past
/// `limits.max_response_bytes` ends as a typed `response_too_large` (502 in
/// each API's shape, `response.failed` in a Responses stream), never
/// retried, and its slot is released.
#[tokio::test]
async fn an_answer_past_max_response_bytes_is_a_typed_error_and_frees_its_slot() {
    let limits = Limits { max_response_bytes: 1024, ..Limits::default() };
    let stack = stack(vec![p("big", Adapter::Ollama, "mock@words=1000", "big", 0, 1)], Some(limits)).await;
    let before = requests_total(&stack.mock_stats().await);

    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("big", "hi", false)).await).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["error"]["code"], "response_too_large");
    assert!(body["error"]["message"].as_str().unwrap().contains("1024 bytes"), "{body}");

    let messages = serde_json::json!({
        "model": "big", "max_tokens": 4096, "messages": [ { "role": "user", "content": "hi" } ]
    });
    let (status, body) = json_body(stack.post("/v1/messages", &messages).await).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "api_error");

    let responses = serde_json::json!({ "model": "big", "input": "hi", "stream": true });
    let response = stack.post("/v1/responses", &responses).await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    assert!(text.contains("event: response.failed"), "{text}");
    assert!(text.contains("response_too_large"), "{text}");
    assert!(!text.contains("response.completed"), "{text}");

    assert_eq!(requests_total(&stack.mock_stats().await) - before, 3, "never retried");
    stack.wait_metric_at_least("iop_edge_lease_releases_total{reason=\"provider_error\"}", 3.0).await;
    wait_until("the slot is free", WAIT, || async { stack.provider_admin("big").await["in_flight"] == 0 }).await;
}

/// Issue 8 item 7: the final failed attempt releases its slot with the
/// real reason; only attempts the request moved on from count as `retried`.
#[tokio::test]
async fn the_last_failed_attempt_is_released_with_its_real_reason() {
    let limits = Limits { max_attempts: 2, ..Limits::default() };
    let stack = stack(
        vec![
            p("down", Adapter::Ollama, "mock@status=503", "down", 0, 4),
            p("picky", Adapter::Ollama, "mock@status=400", "picky", 0, 4),
        ],
        Some(limits),
    )
    .await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("down", "hi", false)).await).await;
    assert_eq!(status, 502, "{body}");
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("picky", "hi", false)).await).await;
    assert_eq!(status, 400, "{body}");
    stack.wait_metric_at_least("iop_edge_lease_releases_total{reason=\"provider_error\"}", 2.0).await;
    assert_eq!(stack.metric("iop_edge_lease_releases_total{reason=\"retried\"}").await, 1.0, "only the first 503");
    assert_eq!(stack.metric("iop_edge_lease_releases_total{reason=\"provider_error\"}").await, 2.0);
}
