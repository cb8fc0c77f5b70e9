//! Liveness and recovery through real processes: the node's stall watchdog
//! and evidence, the Edge's handoff, runtime overlay, CAPABILITIES recovery
//! and pre-commit replay; heartbeats that survive a long prefill; closed
//! label values on every metric.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use iop_e2e::harness::{ProviderSpec, wait_until};
use iop_proto::config::Adapter;
use serde_json::Value;

const STALL_MS: u64 = 1_000;

fn p(id: &str, adapter: Adapter, target: &str, public: &str, priority: u32, stall_ms: u64) -> ProviderSpec {
    let mut spec = provider(id, adapter, target, public, "");
    spec.priority = priority;
    spec.stall_timeout_ms = stall_ms;
    spec
}

async fn stack(providers: Vec<ProviderSpec>, heartbeat: Option<&'static str>) -> Stack {
    Stack::start(StackOptions { extra_providers: providers, heartbeat, ..Default::default() }).await
}

#[tokio::test]
async fn a_stall_before_the_first_byte_is_answered_by_the_next_provider() {
    let stack = stack(
        vec![
            // Headers, then nothing: the first token never comes in time.
            p("sleepy", Adapter::Ollama, "mock@first_token_delay_ms=30000", "replay", 0, STALL_MS),
            p("awake", Adapter::Openai, "mock@words=4", "replay", 1, 0),
        ],
        None,
    )
    .await;
    for stream in [false, true] {
        let response = stack.post("/v1/chat/completions", &chat_body("replay", "hi", stream)).await;
        assert_eq!(response.status(), 200);
        let text = if stream {
            let events = sse_events(response).await;
            assert_eq!(events.last().unwrap(), "[DONE]");
            streamed_text(&events)
        } else {
            json_body(response).await.1["choices"][0]["message"]["content"].as_str().unwrap().to_string()
        };
        assert_eq!(text, "w1 w2 w3 w4", "the complete answer of the second provider, nothing of the first");
    }
    let node_metrics = stack.node_metrics.clone().unwrap();
    let stalls = "iop_node_response_stalls_total{kind=\"run\",classification=\"request_stalled\",retryable=\"true\"}";
    assert!(stack.metric_at(&node_metrics, stalls).await >= 2.0);
    assert!(stack.metric("iop_edge_liveness_recovery_results_total{result=\"answered_by_alternate\"}").await >= 2.0);
    // The probe found the provider healthy: the request stalled, the
    // provider stays in rotation.
    let overlay = &stack.provider_admin("sleepy").await["overlay"];
    assert_eq!(overlay["state"], "available", "{overlay}");
    assert!(overlay["sequence"].as_u64().unwrap() >= 2, "sequenced evidence: {overlay}");
}

#[tokio::test]
async fn a_silent_provider_is_failed_over() {
    let stack = stack(
        vec![
            // Not even response headers.
            p("mute", Adapter::Openai, "mock@headers_delay_ms=60000", "silent", 0, STALL_MS),
            p("talker", Adapter::Ollama, "mock@words=2", "silent", 1, 0),
        ],
        None,
    )
    .await;
    let messages =
        serde_json::json!({ "model": "silent", "max_tokens": 20, "messages": [{ "role": "user", "content": "hi" }] });
    let (status, body) = json_body(stack.post("/v1/messages", &messages).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["content"][0]["text"], "w1 w2");
}

#[tokio::test]
async fn a_stall_after_the_first_byte_ends_the_stream_with_an_error() {
    let stack = stack(vec![p("halting", Adapter::Ollama, "mock@stall_after=2", "halting", 0, STALL_MS)], None).await;
    let events = sse_events(stack.post("/v1/chat/completions", &chat_body("halting", "hi", true)).await).await;
    assert!(!events.contains(&"[DONE]".to_string()), "never a normal finish: {events:?}");
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "response_stalled", "{last}");
    assert_eq!(streamed_text(&events), "Hello from", "what was committed before the stall");

    let messages = serde_json::json!({ "model": "halting", "max_tokens": 20, "stream": true,
        "messages": [{ "role": "user", "content": "hi" }] });
    let text = stack.post("/v1/messages", &messages).await.text().await.unwrap();
    assert!(text.contains("event: error"), "{text}");
    assert!(!text.contains("message_stop"), "{text}");
    wait_until("the slot is free", WAIT, || async { stack.provider_admin("halting").await["in_flight"] == 0 }).await;
}

#[tokio::test]
async fn an_unhealthy_provider_leaves_rotation_and_returns_when_healthy() {
    // A second mock process whose health endpoints we can take down.
    let (mock2, mock2_url) = spawn_mock("127.0.0.1:0").await;
    let mut flaky = p("flaky", Adapter::Ollama, "mock@first_token_delay_ms=30000", "rot", 0, STALL_MS);
    flaky.base_url = mock2_url.clone();
    let stack = stack(vec![p("steady", Adapter::Ollama, "mock@words=3", "rot", 1, 0), flaky], None).await;

    let client = http_client();
    client.post(format!("{mock2_url}/mock/health")).body(r#"{"healthy":false}"#).send().await.unwrap();
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("rot", "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "w1 w2 w3");
    let overlay = stack.provider_admin("flaky").await;
    assert_eq!(overlay["overlay"]["state"], "unavailable", "{overlay}");
    assert_eq!(overlay["health"], "unavailable", "the snapshot shows the effective health: {overlay}");
    assert_eq!(overlay["dispatchable"], false, "dispatchable agrees with admission: {overlay}");
    let node_metrics = stack.node_metrics.clone().unwrap();
    let unhealthy =
        "iop_node_response_stalls_total{kind=\"run\",classification=\"provider_unhealthy\",retryable=\"true\"}";
    assert_eq!(stack.metric_at(&node_metrics, unhealthy).await, 1.0);

    // Out of rotation: the next request goes straight to the other provider.
    let flaky_attempts = "iop_edge_attempts_total{provider=\"flaky\",outcome=\"retried\"}";
    let before = stack.metric(flaky_attempts).await;
    let (status, _) = json_body(stack.post("/v1/chat/completions", &chat_body("rot", "hi", false)).await).await;
    assert_eq!(status, 200);
    assert_eq!(stack.metric(flaky_attempts).await, before, "the lowered provider got no attempt");

    // Healthy again: the node's re-probe (or CAPABILITIES recovery) brings it back.
    client.post(format!("{mock2_url}/mock/health")).body(r#"{"healthy":true}"#).send().await.unwrap();
    wait_until("the provider recovers", WAIT, || async {
        let view = stack.provider_admin("flaky").await;
        view["overlay"]["state"] == "available" && view["health"] == "available" && view["dispatchable"] == true
    })
    .await;
    assert!(stack.metric("iop_edge_provider_health_transitions_total{to=\"available\"}").await >= 1.0);
    drop(mock2);
}

#[tokio::test]
async fn a_long_prefill_does_not_trip_the_heartbeat() {
    let stack = stack(
        vec![p("thinker", Adapter::Ollama, "mock@first_token_delay_ms=1500", "prefill", 0, 0)],
        Some(FAST_HEARTBEAT),
    )
    .await;
    let (status, body) =
        json_body(stack.post("/v1/chat/completions", &chat_body("prefill", "hi there", false)).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(stack.metric("iop_edge_node_sessions_closed_total{reason=\"heartbeat_timeout\"}").await, 0.0);
}

/// Every label value on both /metrics endpoints belongs to its closed set
/// (or, for provider and route, to the configured names).
#[tokio::test]
async fn metric_labels_are_closed_sets() {
    let stack = stack(
        vec![
            p("sleepy", Adapter::Ollama, "mock@first_token_delay_ms=30000", "replay", 0, STALL_MS),
            p("awake", Adapter::Openai, "mock@words=4", "replay", 1, 0),
        ],
        None,
    )
    .await;
    // Exercise many paths: success, replay after a stall, client errors,
    // an unknown model (must not become a label), each API.
    let _ = stack.post("/v1/chat/completions", &chat_body("replay", "secret prompt", false)).await.bytes().await;
    let _ = stack.post("/v1/chat/completions", &chat_body("made-up-model-name", "x", false)).await.bytes().await;
    let _ =
        stack.post("/v1/responses", &serde_json::json!({ "model": "mock-openai", "input": "hi" })).await.bytes().await;
    let _ = stack.post("/v1/messages", &serde_json::json!({ "model": "mock-ollama" })).await.bytes().await;

    let closed: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::from([
        ("api", BTreeSet::from(["chat_completions", "responses", "messages"])),
        ("route", BTreeSet::from(["replay", "mock-ollama", "mock-openai", "unknown"])),
        ("provider", BTreeSet::from(["sleepy", "awake", "ollama-mock", "openai-mock"])),
        // Configured node names.
        ("node", BTreeSet::from([NODE])),
        (
            "outcome",
            BTreeSet::from([
                "ok",
                "client_disconnected",
                "invalid_request",
                "payload_too_large",
                "model_not_found",
                "no_provider_available",
                "queue_full",
                "queue_timeout",
                "provider_unreachable",
                "provider_stream_cut",
                "provider_http_status",
                "context_length_exceeded",
                "unsupported_content",
                "provider_protocol",
                "transport_lost",
                "response_stalled",
                "request_timeout",
                "response_too_large",
                "request_body_timeout",
                "internal",
                "completed",
                "failed",
                "cancelled",
                "committed",
                "retried",
                "relayed_error",
                "rate_limit_exceeded",
                // iop_node_edge_dials_total: what a dial of the Edge came to.
                "held",
                "duplicate",
                "refused",
            ]),
        ),
        (
            "reason",
            BTreeSet::from([
                "completed",
                "provider_error",
                "client_disconnected",
                "node_disconnected",
                "retried",
                "queue_timeout",
                "edge_shutdown",
                "deadline",
                "heartbeat_timeout",
                "node_closed",
                "transport_error",
                "protocol_error",
                "replaced",
                "no_client_certificate",
                "untrusted_issuer",
                "expired",
                "not_yet_valid",
                "revoked",
                "bad_certificate",
                "missing_identity",
                "foreign_trust_domain",
                "unknown_node",
                "tls_error",
                "handshake_timeout",
                "unknown_run",
                "wrong_node",
                "fenced_generation",
                "already_attached",
                "config_changed",
                "certificate_expired",
            ]),
        ),
        // Health evidence sources; how a token count was obtained (`iop_edge_tokens_total`).
        (
            "source",
            BTreeSet::from([
                "readiness",
                "probe",
                "stall",
                "unreachable",
                "stream_cut",
                "capabilities",
                "provider",
                "counted",
                "estimated",
            ]),
        ),
        ("health", BTreeSet::from(["available", "unavailable", "unknown"])),
        // Model residency and managed credential state sets.
        ("state", BTreeSet::from(["loaded", "not_loaded", "unknown", "ok", "disabled", "invalid", "rejected"])),
        (
            "result",
            BTreeSet::from([
                "lowered",
                "recovered",
                "unsettled",
                "recorded",
                "ignored",
                "stale_generation",
                "stale_sequence",
                "unsequenced",
                "eligible",
                "attempts_exhausted",
                "answered_by_alternate",
                "answered_by_avoided",
                "exhausted",
                "applied",
                "rejected",
            ]),
        ),
        ("to", BTreeSet::from(["available", "unavailable", "unknown"])),
        // Execution kinds; token kinds (`iop_edge_tokens_total`).
        ("kind", BTreeSet::from(["run", "tunnel", "input", "output", "reasoning"])),
        // Configured principals (`anonymous` with authentication off) and
        // public models, as `route`.
        ("principal", BTreeSet::from(["anonymous"])),
        ("model", BTreeSet::from(["replay", "mock-ollama", "mock-openai", "unknown"])),
        ("classification", BTreeSet::from(["request_stalled", "provider_unhealthy", "health_unknown"])),
        ("retryable", BTreeSet::from(["true", "false"])),
        ("path", BTreeSet::from(["equal_provider", "same_provider", "lower_priority", "no_alternative", "none"])),
        // Per-key limits (`iop_edge_rate_limited_total`) and a node's limits.
        (
            "limit",
            BTreeSet::from([
                "requests",
                "tokens",
                "concurrency",
                "connections",
                "streams",
                "message_size",
                "in_transit",
                "compressed",
            ]),
        ),
    ]);
    let node_metrics = stack.node_metrics.clone().unwrap();
    let mut checked = 0;
    for url in [stack.admin_url("/metrics"), node_metrics] {
        let text = stack.client.get(&url).send().await.unwrap().text().await.unwrap();
        assert!(!text.contains("secret prompt") && !text.contains("made-up-model-name"), "no request data in metrics");
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((_, labels)) = line.split_once('{') else { continue };
            let labels = labels.rsplit_once('}').unwrap().0;
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                let (key, value) = pair.split_once('=').unwrap();
                if key == "le" {
                    continue;
                }
                let value = value.trim_matches('"');
                let allowed = closed.get(key).unwrap_or_else(|| panic!("label `{key}` has no closed set: {line}"));
                assert!(allowed.contains(value), "label {key}=\"{value}\" is not in its closed set: {line}");
                checked += 1;
            }
        }
    }
    assert!(checked > 20, "the scrape had labelled samples ({checked})");
}

#[tokio::test]
async fn a_killed_provider_is_classified_unhealthy_leaves_rotation_and_returns() {
    let (mock2, mock2_url) = spawn_mock("127.0.0.1:0").await;
    let mut doomed = p("doomed", Adapter::Ollama, "mock", "killed", 0, STALL_MS);
    doomed.base_url = mock2_url.clone();
    let stack = stack(vec![p("backup", Adapter::Openai, "mock@words=3", "killed", 1, 0), doomed], None).await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("killed", "hi", false)).await).await;
    assert_eq!(
        body["choices"][0]["message"]["content"], "Hello from the IOP mock provider. You said: hi",
        "{status} {body}"
    );

    // The provider process dies: the next request is answered by the backup,
    // and the probe-backed evidence takes the dead provider out of rotation.
    let status = mock2.terminate().await;
    assert!(status.success());
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("killed", "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "w1 w2 w3");
    assert_eq!(stack.provider_admin("doomed").await["overlay"]["state"], "unavailable");

    // It comes back on the same address: CAPABILITIES recovery returns it.
    let (_mock2, _) = spawn_mock(mock2_url.trim_start_matches("http://")).await;
    wait_until("the provider recovers", WAIT, || async {
        stack.provider_admin("doomed").await["overlay"]["state"] == "available"
    })
    .await;
    let (status, body) =
        json_body(stack.post("/v1/chat/completions", &chat_body("killed", "again", false)).await).await;
    assert_eq!(status, 200);
    assert_eq!(
        body["choices"][0]["message"]["content"], "Hello from the IOP mock provider. You said: again",
        "back in rotation"
    );
}
