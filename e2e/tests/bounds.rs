//! Bounds a client cannot break (issue 8 items 5 and 6): slow or idle
//! HTTP clients are cut and cannot starve others, and streaming clients
//! hear keepalives while the gate has not committed yet.

mod common;

use common::*;
use iop_e2e::harness::wait_until;
use iop_proto::config::Limits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Waits until the server closes `socket` (EOF or reset), discarding what
/// it sends (e.g. a 408).
async fn closed_by_server(socket: &mut TcpStream) {
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(WAIT, async {
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the Edge kept a slow connection open");
}

/// Issue 8 item 5: clients that send their headers or body too slowly, or
/// nothing at all, are disconnected after `limits.http_idle_timeout_ms`;
/// with `limits.max_http_connections` of them open, a normal client is
/// still served (as soon as they are cut).
#[tokio::test]
async fn slow_clients_are_cut_and_cannot_starve_others() {
    let limits = Limits { max_http_connections: 3, http_idle_timeout_ms: 1_000, ..Limits::default() };
    let stack = Stack::start(StackOptions { limits: Some(limits), ..Default::default() }).await;

    let mut silent = TcpStream::connect(stack.http).await.unwrap();
    let mut slow_headers = TcpStream::connect(stack.http).await.unwrap();
    slow_headers.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n").await.unwrap();
    let mut slow_body = TcpStream::connect(stack.http).await.unwrap();
    slow_body
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"model\":")
        .await
        .unwrap();

    // A fresh client (no pooled connection) gets its answer once a slot frees.
    let fresh = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let response = tokio::time::timeout(WAIT, fresh.get(stack.url("/healthz")).send()).await;
    assert_eq!(response.expect("served within the wait").unwrap().status(), 200);

    closed_by_server(&mut silent).await;
    closed_by_server(&mut slow_headers).await;
    closed_by_server(&mut slow_body).await;

    // And the API works as usual afterwards.
    let request = fresh
        .post(stack.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&chat_body("mock-ollama", "hi", false)).unwrap());
    let (status, body) = json_body(request.send().await.unwrap()).await;
    assert_eq!(status, 200, "{body}");
    wait_until("connections are counted down", WAIT, || async {
        stack.metric("iop_edge_http_connections").await <= 1.0
    })
    .await;
}

/// Reads `response`'s body until `text` has appeared; returns all read so far.
async fn read_until(response: &mut reqwest::Response, seen: &mut String, text: &str) {
    tokio::time::timeout(WAIT, async {
        while !seen.contains(text) {
            let chunk =
                response.chunk().await.unwrap().unwrap_or_else(|| panic!("stream ended before `{text}`: {seen}"));
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no `{text}` in: {seen}"));
}

async fn release(stack: &Stack, name: &str) {
    let response = stack.client.post(format!("{}/mock/release/{name}", stack.mock_url)).send().await.unwrap();
    assert_eq!(response.status(), 204);
}

/// Issue 8 item 6: a streaming request that has not committed after
/// `limits.stream_keepalive_ms` gets its response head and keepalives in
/// its API's form; a pre-first-content retry on another provider still
/// happens behind them, and a later failure is the API's error event. The
/// providers hold each request until the test releases it, so nothing here
/// depends on timing.
#[tokio::test]
async fn streaming_clients_get_keepalives_before_the_first_content() {
    use iop_proto::config::Adapter;
    let held = |id: &str, target: &str, public: &str, priority: u32| {
        let mut spec = provider(id, Adapter::Ollama, target, public, "");
        spec.priority = priority;
        spec
    };
    let providers = vec![
        held("fails-first", "mock@hold=k1,status=503", "ka", 0),
        held("answers-second", "mock@hold=k2,words=3", "ka", 1),
        held("refuses", "mock@hold=k3,status=400", "ka-refused", 0),
        held("answers", "mock@hold=k4,words=2", "ka-responses", 0),
    ];
    let limits = Limits { stream_keepalive_ms: 100, ..Limits::default() };
    let stack =
        Stack::start(StackOptions { extra_providers: providers, limits: Some(limits), ..Default::default() }).await;

    // OpenAI Chat: `: keepalive` comments, then a retry on the second
    // provider behind them, then the answer.
    let mut response = stack.post("/v1/chat/completions", &chat_body("ka", "hi", true)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut seen = String::new();
    read_until(&mut response, &mut seen, ": keepalive\n\n").await;
    release(&stack, "k1").await; // the first provider fails: retried
    read_until(&mut response, &mut seen, ": keepalive\n\n: keepalive\n\n").await;
    release(&stack, "k2").await;
    read_until(&mut response, &mut seen, "data: [DONE]").await;
    let events: Vec<String> = seen.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(str::to_string).collect();
    assert_eq!(streamed_text(&events), "w1 w2 w3", "{seen}");
    assert!(!seen.contains("error"), "{seen}");

    // Anthropic Messages: `ping` events, then a client error (never
    // retried) as the stream's `error` event.
    let body = serde_json::json!({
        "model": "ka-refused", "max_tokens": 64, "stream": true,
        "messages": [ { "role": "user", "content": "hi" } ]
    });
    let mut response = stack.post("/v1/messages", &body).await;
    assert_eq!(response.status(), 200);
    let mut seen = String::new();
    read_until(&mut response, &mut seen, "event: ping\ndata: {\"type\": \"ping\"}\n\n").await;
    release(&stack, "k3").await;
    read_until(&mut response, &mut seen, "event: error\n").await;
    assert!(response.chunk().await.unwrap().is_none(), "the stream ends after its error");
    let error = seen.split("event: error\ndata: ").nth(1).unwrap().trim();
    let error: serde_json::Value = serde_json::from_str(error).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
    assert!(!seen.contains("message_start"), "{seen}");

    // OpenAI Responses: keepalive comments, then the usual event sequence.
    let body = serde_json::json!({ "model": "ka-responses", "input": "hi", "stream": true });
    let mut response = stack.post("/v1/responses", &body).await;
    assert_eq!(response.status(), 200);
    let mut seen = String::new();
    read_until(&mut response, &mut seen, ": keepalive\n\n").await;
    release(&stack, "k4").await;
    read_until(&mut response, &mut seen, "event: response.completed").await;
    assert!(seen.contains("\"delta\":\"w1\""), "{seen}");

    stack.wait_metric_at_least("iop_edge_lease_releases_total{reason=\"retried\"}", 1.0).await;
    stack.wait_metric_at_least("iop_edge_lease_releases_total{reason=\"completed\"}", 2.0).await;
}
