//! Provider health as users see it, through real processes: several
//! providers on one node, faults on one of them in sequence (a reset, a
//! stall, a dead server, a restart), idle probing without traffic, and a
//! provider that starts after its node. Evidence about one provider never
//! changes another, and a provider returns by itself (no node restart).

mod common;

use common::*;
use iop_e2e::harness::{ProviderSpec, wait_until};
use iop_proto::config::Adapter;
use serde_json::Value;

fn p(id: &str, adapter: Adapter, target: &str, public: &str, priority: u32, base_url: &str) -> ProviderSpec {
    let mut spec = provider(id, adapter, target, public, base_url);
    spec.priority = priority;
    spec.stall_timeout_ms = 1_000;
    spec
}

/// Effective health and dispatchability of every provider, as the admin
/// snapshot shows them.
async fn health(stack: &Stack) -> Vec<(String, String, bool)> {
    let providers = stack.get_json("/admin/v1/providers").await;
    let mut rows: Vec<_> = providers["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert_eq!(
                p["dispatchable"].as_bool(),
                Some(p["health"] == "available"),
                "on a ready node, dispatchable is exactly `available`: {p}"
            );
            (
                p["id"].as_str().unwrap().to_string(),
                p["health"].as_str().unwrap().to_string(),
                p["dispatchable"] == true,
            )
        })
        .collect();
    rows.sort();
    rows
}

async fn wait_health(stack: &Stack, id: &str, want: &str) {
    wait_until(&format!("{id} is {want}"), WAIT, || async { stack.provider_admin(id).await["health"] == want }).await;
}

/// The siblings on the main mock: all available.
async fn assert_siblings_available(stack: &Stack, why: &str) {
    for (id, health, dispatchable) in health(stack).await {
        if id != "lone" {
            assert_eq!((health.as_str(), dispatchable), ("available", true), "{id} after {why}");
        }
    }
    let node = stack.node(NODE).await;
    for id in ["ollama-mock", "openai-mock", "unlisted"] {
        assert_eq!(node["providers"][id], "available", "the node view agrees after {why}: {node}");
    }
}

async fn set(url: &str, what: &str, body: &str) {
    let response = http_client().post(format!("{url}/mock/{what}")).body(body.to_string()).send().await.unwrap();
    assert!(response.status().is_success(), "mock /{what}: {}", response.status());
}

fn answer(body: &Value) -> &str {
    body["choices"][0]["message"]["content"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn faults_on_one_provider_in_sequence_never_lower_its_siblings_and_it_returns_by_itself() {
    // `lone` has a server of its own; `unlisted` is an OpenAI-compatible
    // target the server's /v1/models does not list (like llama.cpp's).
    let (lone_mock, lone_url) = spawn_mock("127.0.0.1:0").await;
    let stack = Stack::start(StackOptions {
        extra_providers: vec![
            p("lone", Adapter::Openai, "lone-model", "pair", 0, &lone_url),
            p("unlisted", Adapter::Openai, "unlisted-model@words=2", "pair", 1, ""),
        ],
        ..Default::default()
    })
    .await;
    let generation = stack.wait_node_ready(NODE).await;
    assert!(health(&stack).await.iter().all(|(_, h, d)| h == "available" && *d), "{:?}", health(&stack).await);

    // 1. A reset mid-answer: the next provider answers; the probe finds the
    //    server healthy, so nothing is lowered (the old exact-target probe
    //    lowered `lone`, and CAPABILITIES then lowered every sibling).
    set(&lone_url, "faults", "cut_after=1").await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("pair", "hi", false)).await).await;
    assert_eq!((status, answer(&body)), (200, "w1 w2"), "{body}");
    assert_siblings_available(&stack, "a reset").await;
    wait_health(&stack, "lone", "available").await;

    // 2. A stall before the first byte: answered by the next provider; the
    //    stalled request is not the provider's health.
    set(&lone_url, "faults", "first_token_delay_ms=30000").await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("pair", "hi", false)).await).await;
    assert_eq!((status, answer(&body)), (200, "w1 w2"), "{body}");
    assert_siblings_available(&stack, "a stall").await;
    assert_eq!(stack.provider_admin("lone").await["health"], "available");

    // 3. The server dies: `lone` leaves rotation, its siblings stay.
    let status = lone_mock.terminate().await;
    assert!(status.success());
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("pair", "hi", false)).await).await;
    assert_eq!((status, answer(&body)), (200, "w1 w2"), "{body}");
    wait_health(&stack, "lone", "unavailable").await;
    assert_eq!(stack.provider_admin("lone").await["dispatchable"], false);
    assert_siblings_available(&stack, "a dead server").await;
    let lone_attempts = "iop_edge_attempts_total{provider=\"lone\",outcome=\"retried\"}";
    let before = stack.metric(lone_attempts).await;
    let (status, _) = json_body(stack.post("/v1/chat/completions", &chat_body("pair", "hi", false)).await).await;
    assert_eq!(status, 200);
    assert_eq!(stack.metric(lone_attempts).await, before, "admission skips what the snapshot calls undispatchable");

    // 4. The server restarts on the same address without traffic: the
    //    node's re-probe returns `lone` by itself, on the same connection.
    let (_lone_mock, _) = spawn_mock(lone_url.trim_start_matches("http://")).await;
    wait_health(&stack, "lone", "available").await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("pair", "back", false)).await).await;
    assert_eq!((status, answer(&body)), (200, "Hello from the IOP mock provider. You said: back"), "{body}");
    assert_siblings_available(&stack, "a restart").await;
    assert_eq!(stack.node(NODE).await["generation"], generation, "no reconnect was needed");
}

#[tokio::test]
async fn idle_probes_keep_health_true_without_traffic_and_never_generate() {
    let (lone_mock, lone_url) = spawn_mock("127.0.0.1:0").await;
    let stack = Stack::start(StackOptions {
        extra_providers: vec![p("lone", Adapter::Ollama, "mock", "lone", 0, &lone_url)],
        ..Default::default()
    })
    .await;
    wait_health(&stack, "lone", "available").await;

    // Its metadata endpoints fail: the idle probe lowers it, nothing else.
    set(&lone_url, "health", r#"{"healthy":false}"#).await;
    wait_health(&stack, "lone", "unavailable").await;
    assert_siblings_available_except(&stack, "lone").await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("lone", "hi", false)).await).await;
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("no_provider_available")), "{body}");

    set(&lone_url, "health", r#"{"healthy":true}"#).await;
    wait_health(&stack, "lone", "available").await;
    let (_, stats) = json_body(http_client().get(format!("{lone_url}/mock/stats")).send().await.unwrap()).await;
    assert_eq!(stats["requests_total"], 0, "probes are metadata calls, never a generation");
    drop(lone_mock);
}

async fn assert_siblings_available_except(stack: &Stack, except: &str) {
    for (id, health, _) in health(stack).await {
        if id != except {
            assert_eq!(health, "available", "{id}");
        }
    }
}

#[tokio::test]
async fn a_provider_that_starts_after_its_node_returns_without_a_node_restart() {
    // A free port nothing listens on yet.
    let port = free_port().port();
    let late_url = format!("http://127.0.0.1:{port}");
    let stack = Stack::start(StackOptions {
        extra_providers: vec![p("late", Adapter::Ollama, "mock", "late", 0, &late_url)],
        ..Default::default()
    })
    .await;
    let generation = stack.wait_node_ready(NODE).await;
    wait_health(&stack, "late", "unavailable").await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("late", "hi", false)).await).await;
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("no_provider_available")), "{body}");

    let (_late, _) = spawn_mock(&format!("127.0.0.1:{port}")).await;
    wait_health(&stack, "late", "available").await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("late", "hi", false)).await).await;
    assert_eq!((status, answer(&body)), (200, "Hello from the IOP mock provider. You said: hi"), "{body}");
    assert_eq!(stack.node(NODE).await["generation"], generation, "the same connection");
}
