//! Issue 28 item 2, the first-byte deadline, through real processes: a
//! provider that accepts the connection and never answers (`never_answer`,
//! not even headers) is abandoned at its `first_byte_timeout_ms` and the
//! request is answered by another provider; one whose headers come late but
//! within the deadline, or whose headers come at once and its first token
//! late (a prefill), is not abandoned. The request's budget is short, so
//! without the deadline the silent provider would hold the request until the
//! budget ran out (`504`) rather than hang the test.

mod common;

use common::*;
use iop_e2e::harness::ProviderSpec;
use iop_proto::config::{Adapter, Limits, ProviderMode};

/// Short in tests; the real default is 60 s.
const FIRST_BYTE_MS: u64 = 1_000;
const FALLBACK: &str = "mock@words=2";

fn p(id: &str, target: &str, public: &str, priority: u32, first_byte_timeout_ms: u64) -> ProviderSpec {
    let mut spec = provider(id, Adapter::Openai, target, public, "");
    spec.priority = priority;
    spec.first_byte_timeout_ms = first_byte_timeout_ms;
    spec
}

async fn stack(providers: Vec<ProviderSpec>) -> Stack {
    // Far below the 300 s stall default: without a first-byte deadline the
    // silent provider holds the request until this budget ends it.
    let limits = Limits { request_timeout_ms: 20_000, ..Limits::default() };
    Stack::start(StackOptions { extra_providers: providers, limits: Some(limits), ..Default::default() }).await
}

async fn node_first_byte_timeouts(stack: &Stack, kind: &str) -> f64 {
    let url = stack.node_metrics.clone().unwrap();
    stack.metric_at(&url, &format!("iop_node_first_byte_timeouts_total{{kind=\"{kind}\"}}")).await
}

#[tokio::test]
async fn a_provider_that_never_answers_is_abandoned_at_its_first_byte_deadline() {
    let silent = "mock@never_answer";
    let stack = stack(vec![p("silent", silent, "fb", 0, FIRST_BYTE_MS), p("spare", FALLBACK, "fb", 1, 0)]).await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("fb", "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], FALLBACK, "answered by the other provider");
    assert_eq!(stack.mock_requests(&stack.mock_url, "/v1/chat/completions", Some(silent)).await, 1);
    assert_eq!(node_first_byte_timeouts(&stack, "run").await, 1.0, "labelled first_byte on the node");
    assert!(stack.metric("iop_edge_attempts_total{provider=\"silent\",outcome=\"retried\"}").await >= 1.0);
}

#[tokio::test]
async fn a_tunnel_that_never_answers_is_abandoned_at_its_first_byte_deadline() {
    let silent = "mock@never_answer";
    let mut tunnel = p("silent-tunnel", silent, "fb-tunnel", 0, FIRST_BYTE_MS);
    tunnel.mode = ProviderMode::Tunnel;
    let stack = stack(vec![tunnel, p("spare", FALLBACK, "fb-tunnel", 1, 0)]).await;
    let (status, body) =
        json_body(stack.post("/v1/chat/completions", &chat_body("fb-tunnel", "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], FALLBACK);
    assert_eq!(node_first_byte_timeouts(&stack, "tunnel").await, 1.0);
}

#[tokio::test]
async fn late_headers_within_the_deadline_are_waited_for() {
    let slow = "mock@headers_delay_ms=300,words=3";
    let stack = stack(vec![p("slow", slow, "fb", 0, 5_000), p("spare", FALLBACK, "fb", 1, 0)]).await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("fb", "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], slow, "the slow provider answered");
    assert_eq!(stack.mock_requests(&stack.mock_url, "/v1/chat/completions", Some(FALLBACK)).await, 0);
}

#[tokio::test]
async fn headers_are_the_first_byte_so_a_long_prefill_is_not_abandoned() {
    // Headers at once, the first token after the first-byte deadline: the
    // deadline was met by the headers; the stall timeout (default) governs.
    let prefill = "mock@first_token_delay_ms=2500,words=3";
    let stack = stack(vec![p("prefill", prefill, "fb", 0, FIRST_BYTE_MS), p("spare", FALLBACK, "fb", 1, 0)]).await;
    let events = sse_events(stack.post("/v1/chat/completions", &chat_body("fb", "hi", true)).await).await;
    assert_eq!(streamed_text(&events), "w1 w2 w3");
    assert_eq!(stack.mock_requests(&stack.mock_url, "/v1/chat/completions", Some(FALLBACK)).await, 0);
    assert_eq!(node_first_byte_timeouts(&stack, "run").await, 0.0);
}

#[tokio::test]
async fn a_lone_silent_provider_is_replayed_on_once_then_the_client_gets_the_stall() {
    // Its metadata call answers (the probe says healthy), so the first miss
    // is replayed on it; a second miss is not replayed again, whatever
    // `limits.max_attempts` (3) would allow.
    let silent = "mock@never_answer";
    let stack = stack(vec![p("lone", silent, "fb-lone", 0, FIRST_BYTE_MS)]).await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("fb-lone", "hi", false)).await).await;
    assert_eq!(body["error"]["code"], "response_stalled", "{status} {body}");
    assert_eq!(
        stack.mock_requests(&stack.mock_url, "/v1/chat/completions", Some(silent)).await,
        2,
        "the first try and one replay"
    );
    assert_eq!(node_first_byte_timeouts(&stack, "run").await, 2.0);
}
