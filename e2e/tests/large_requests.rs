//! Large prompts through real processes: a body of exactly
//! `limits.max_body_bytes` runs on every API and in tunnel mode (the request
//! travels on the run's own call, never on the control stream, so it cannot
//! fail the node's session); one byte more is `413` in the API's own shape
//! and never reaches a provider; a configured 32 MiB prompt runs while other
//! requests on the same node keep flowing.

mod common;

use common::*;
use iop_e2e::harness::ProviderSpec;
use iop_proto::config::{Adapter, Limits, ProviderMode};
use serde_json::{Value, json};

const MIB: usize = 1024 * 1024;

/// The body `make(padding)` serializes to, with padding chosen so that it is
/// exactly `size` bytes.
fn exact(size: usize, make: impl Fn(&str) -> Value) -> Vec<u8> {
    let base = serde_json::to_vec(&make("")).unwrap().len();
    let body = serde_json::to_vec(&make(&"a".repeat(size - base))).unwrap();
    assert_eq!(body.len(), size);
    body
}

/// One API request shape: path and body builder.
struct Api {
    path: &'static str,
    model: &'static str,
    body: fn(&str, &str) -> Value,
}

const APIS: [Api; 4] = [
    Api {
        path: "/v1/chat/completions",
        model: "mock-ollama",
        body: |model, text| json!({ "model": model, "messages": [{ "role": "user", "content": text }] }),
    },
    Api { path: "/v1/responses", model: "mock-openai", body: |model, text| json!({ "model": model, "input": text }) },
    Api {
        path: "/v1/messages",
        model: "mock-ollama",
        body: |model, text| json!({ "model": model, "max_tokens": 20, "messages": [{ "role": "user", "content": text }] }),
    },
    // Tunnel mode: the body is relayed as-is.
    Api {
        path: "/v1/chat/completions",
        model: "big-tunnel",
        body: |model, text| json!({ "model": model, "messages": [{ "role": "user", "content": text }] }),
    },
];

fn tunnel() -> ProviderSpec {
    let mut spec = provider("tunnel", Adapter::Openai, "mock", "big-tunnel", "");
    spec.mode = ProviderMode::Tunnel;
    spec
}

async fn post_bytes(stack: &Stack, path: &str, body: Vec<u8>) -> (u16, Value) {
    let response = stack
        .client
        .post(stack.url(path))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("POST");
    json_body(response).await
}

#[tokio::test]
async fn a_body_of_exactly_the_limit_runs_on_every_api_and_one_byte_more_is_413() {
    let stack = Stack::start(StackOptions { extra_providers: vec![tunnel()], ..Default::default() }).await;
    let generation = stack.wait_node_ready(NODE).await;
    let limit = Limits::default().max_body_bytes;

    for api in &APIS {
        let body = exact(limit, |pad| (api.body)(api.model, pad));
        let (status, answer) = post_bytes(&stack, api.path, body).await;
        assert_eq!(status, 200, "{} {}: {answer}", api.path, api.model);
        assert!(answer.to_string().contains("You said: aaaa"), "{answer}");
    }
    assert_eq!(stack.mock_stats().await["requests_total"], 4, "one attempt each: no session failed under them");

    for api in &APIS {
        let (status, error) = post_bytes(&stack, api.path, exact(limit + 1, |pad| (api.body)(api.model, pad))).await;
        assert_eq!(status, 413, "{error}");
        if api.path == "/v1/messages" {
            assert_eq!(
                (error["type"].as_str(), error["error"]["type"].as_str()),
                (Some("error"), Some("request_too_large"))
            );
        } else {
            assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
            assert_eq!(error["error"]["code"], "payload_too_large", "{error}");
        }
    }
    assert_eq!(stack.mock_stats().await["requests_total"], 4, "over-limit bodies never reach a provider");
    assert_eq!(stack.node(NODE).await["generation"], generation, "the node's session was never replaced");
}

#[tokio::test]
async fn a_32_mib_prompt_runs_while_other_requests_on_the_node_keep_flowing() {
    let limits = Limits { max_body_bytes: 32 * MIB, ..Limits::default() };
    let stack =
        Stack::start(StackOptions { extra_providers: vec![tunnel()], limits: Some(limits), ..Default::default() })
            .await;
    let generation = stack.wait_node_ready(NODE).await;

    let big = exact(32 * MIB, |pad| (APIS[0].body)("mock-ollama", pad));
    let small = async {
        for n in 0..5 {
            let (status, body) = json_body(
                stack.post("/v1/chat/completions", &chat_body("mock-openai", &format!("small {n}"), false)).await,
            )
            .await;
            assert_eq!(status, 200, "{body}");
        }
    };
    let ((status, answer), ()) = tokio::join!(post_bytes(&stack, "/v1/chat/completions", big), small);
    assert_eq!(status, 200, "{answer}");
    assert!(answer["choices"][0]["message"]["content"].as_str().unwrap().contains("You said: aaaa"));

    let tunnelled = exact(32 * MIB, |pad| (APIS[3].body)("big-tunnel", pad));
    let (status, answer) = post_bytes(&stack, "/v1/chat/completions", tunnelled).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(stack.node(NODE).await["generation"], generation, "the node's session was never replaced");
}
