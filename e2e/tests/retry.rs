//! Issue 28 item 1, the retry discipline, through real processes: a
//! provider in the failed one's priority group is an equal and answers at
//! once; before a request drops to a lower group, the failed provider is
//! retried once when its `Retry-After` or a short backoff fits
//! `retry.same_provider_max_wait_ms`. Which provider got what is read from
//! the mock's request log (each provider has its own target model string).

mod common;

use std::collections::BTreeMap;

use common::*;
use iop_e2e::harness::ProviderSpec;
use iop_proto::config::{Adapter, RetryConfig, RouteRetry};

fn p(id: &str, target: &str, public: &str, priority: u32) -> ProviderSpec {
    let mut spec = provider(id, Adapter::Openai, target, public, "");
    spec.priority = priority;
    spec
}

async fn stack_with(providers: Vec<ProviderSpec>, retry: RetryConfig) -> Stack {
    Stack::start(StackOptions { extra_providers: providers, retry, ..Default::default() }).await
}

async fn path_count(stack: &Stack, path: &str) -> f64 {
    stack.metric(&format!("iop_edge_retry_paths_total{{path=\"{path}\"}}")).await
}

const FALLBACK: &str = "mock@words=2";

/// A primary that fails once with `primary` knobs, then answers; a
/// lower-priority fallback. The primary answers the request after one
/// same-provider retry, and the fallback never sees it.
async fn primary_answers_after_one_failure(knobs: &str) {
    let primary = format!("mock@{knobs},fail_times=1");
    let stack =
        stack_with(vec![p("primary", &primary, "pri", 0), p("fallback", FALLBACK, "pri", 1)], RetryConfig::default())
            .await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("pri", "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], primary.as_str(), "answered by the primary");
    assert_eq!(
        stack.mock_requests(&stack.mock_url, "/v1/chat/completions", Some(&primary)).await,
        2,
        "the primary failed once, then answered"
    );
    assert_eq!(
        stack.mock_requests(&stack.mock_url, "/v1/chat/completions", Some(FALLBACK)).await,
        0,
        "the fallback saw no request"
    );
    assert_eq!(path_count(&stack, "same_provider").await, 1.0);
    assert_eq!(path_count(&stack, "lower_priority").await, 0.0);
}

#[tokio::test]
async fn a_429_with_a_short_retry_after_is_retried_on_the_primary() {
    primary_answers_after_one_failure("status=429,retry_after=1").await;
}

#[tokio::test]
async fn a_single_500_is_retried_on_the_primary() {
    primary_answers_after_one_failure("status=500").await;
}

#[tokio::test]
async fn a_retry_after_past_the_max_wait_drops_to_the_fallback_at_once() {
    let primary = "mock@status=429,retry_after=30";
    let stack =
        stack_with(vec![p("primary", primary, "pri", 0), p("fallback", FALLBACK, "pri", 1)], RetryConfig::default())
            .await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("pri", "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], FALLBACK);
    assert_eq!(
        stack.mock_requests(&stack.mock_url, "/v1/chat/completions", Some(primary)).await,
        1,
        "no retry on the primary"
    );
    assert_eq!(path_count(&stack, "lower_priority").await, 1.0);
    assert_eq!(path_count(&stack, "same_provider").await, 0.0);
}

#[tokio::test]
async fn a_route_override_of_zero_drops_to_the_fallback_at_once() {
    let primary = "mock@status=500,fail_times=1";
    let retry = RetryConfig {
        routes: BTreeMap::from([("pri".to_string(), RouteRetry { same_provider_max_wait_ms: 0 })]),
        ..RetryConfig::default()
    };
    let stack = stack_with(vec![p("primary", primary, "pri", 0), p("fallback", FALLBACK, "pri", 1)], retry).await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("pri", "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], FALLBACK);
    assert_eq!(stack.mock_requests(&stack.mock_url, "/v1/chat/completions", Some(primary)).await, 1);
    assert_eq!(path_count(&stack, "lower_priority").await, 1.0);
}

#[tokio::test]
async fn an_equal_provider_answers_at_once_without_a_same_provider_retry() {
    // The flaky provider always refuses (with a Retry-After that would fit);
    // its equal answers every request, the lower group never sees one.
    let flaky = "mock@status=429,retry_after=1";
    let equal = "mock@words=3";
    let stack = stack_with(
        vec![p("flaky", flaky, "eq", 0), p("equal", equal, "eq", 0), p("fallback", FALLBACK, "eq", 1)],
        RetryConfig::default(),
    )
    .await;
    // Round robin picks either first; send until the flaky one was tried.
    for _ in 0..10 {
        let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("eq", "hi", false)).await).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["model"], equal);
        if stack.mock_requests(&stack.mock_url, "/v1/chat/completions", Some(flaky)).await > 0 {
            break;
        }
    }
    assert!(
        stack.mock_requests(&stack.mock_url, "/v1/chat/completions", Some(flaky)).await > 0,
        "round robin reached the flaky provider"
    );
    assert_eq!(
        path_count(&stack, "equal_provider").await,
        stack.mock_requests(&stack.mock_url, "/v1/chat/completions", Some(flaky)).await as f64
    );
    assert_eq!(path_count(&stack, "same_provider").await, 0.0, "no wait for the flaky provider");
    assert_eq!(stack.mock_requests(&stack.mock_url, "/v1/chat/completions", Some(FALLBACK)).await, 0);
}

#[tokio::test]
async fn a_streaming_request_is_retried_on_the_primary_too() {
    let primary = "mock@status=503,retry_after=1,fail_times=1,words=3";
    let stack =
        stack_with(vec![p("primary", primary, "pri", 0), p("fallback", FALLBACK, "pri", 1)], RetryConfig::default())
            .await;
    let events = sse_events(stack.post("/v1/chat/completions", &chat_body("pri", "hi", true)).await).await;
    assert_eq!(streamed_text(&events), "w1 w2 w3");
    assert_eq!(stack.mock_requests(&stack.mock_url, "/v1/chat/completions", Some(FALLBACK)).await, 0);
}

const PIXEL: &str = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

/// A Chat Completions request for `model` with an image.
fn image_chat(model: &str) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": PIXEL}},
        ]}],
    })
}

/// Issue 45 item 5: an image for a text-only model on an OpenAI-compatible
/// server (llama.cpp without a projector answers 500 "image input is not
/// supported") can never succeed there: the client's 400
/// `unsupported_content` at once, one provider call per request (it was
/// three, then a 502 clients retry), and the provider is not ejected for it,
/// in normalized and tunnel mode. With another provider in the route, the
/// request goes there instead (never back to the refusing one). The
/// text-only providers are declared to read images (wrongly), so that each
/// request reaches them: what their servers say is the next test's.
#[tokio::test]
async fn an_image_for_a_text_only_model_is_the_clients_400_not_a_retry() {
    let text_only = "mock@text_only";
    let mut tunnel = p("tunnel", "mock@text_only,words=3", "tun", 0);
    tunnel.mode = iop_proto::config::ProviderMode::Tunnel;
    let mut wrong = p("wrong", "mock@text_only,words=5", "mixed", 0);
    wrong.mode = iop_proto::config::ProviderMode::Tunnel;
    let providers = vec![p("llama", text_only, "pri", 0), tunnel, wrong, p("seeing", "mock@words=6", "mixed", 1)];
    let stack = stack_with(providers, RetryConfig::default()).await;
    stack.edit_providers(&["llama", "tunnel", "wrong"], |p| p.accepts_images = Some(true)).await;
    for (id, model, target) in [("llama", "pri", text_only), ("tunnel", "tun", "mock@text_only,words=3")] {
        // More requests than the outlier threshold (5 failures in a row).
        for n in 1..=6 {
            let (status, body) = json_body(stack.post("/v1/chat/completions", &image_chat(model)).await).await;
            assert_eq!(status, 400, "{id}: {body}");
            assert_eq!(body["error"]["code"], "unsupported_content", "{id}: {body}");
            assert!(body["error"]["message"].as_str().unwrap_or_default().contains("image input is not supported"));
            assert_eq!(stack.mock_requests(&stack.mock_url, "/v1/chat/completions", Some(target)).await, n, "{id}");
        }
        assert_eq!(stack.metric(&format!("iop_edge_provider_ejections_total{{provider=\"{id}\"}}")).await, 0.0);
        assert_eq!(stack.provider_admin(id).await["consecutive_failures"], 0, "{id}");
        // The provider still serves text.
        let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body(model, "hi", false)).await).await;
        assert_eq!(status, 200, "{id}: {body}");
    }
    assert_eq!(path_count(&stack, "same_provider").await, 0.0);

    // The preferred provider refuses the image; the other one reads it.
    for n in 1..=6 {
        let (status, body) = json_body(stack.post("/v1/chat/completions", &image_chat("mixed")).await).await;
        assert_eq!((status, &body["choices"][0]["message"]["content"]), (200, &serde_json::json!("w1 w2 w3 w4 w5 w6")));
        let wrong_calls =
            stack.mock_requests(&stack.mock_url, "/v1/chat/completions", Some("mock@text_only,words=5")).await;
        assert_eq!(wrong_calls, n, "one refusal per request, never a second");
    }
    assert_eq!(stack.provider_admin("wrong").await["consecutive_failures"], 0);
    assert_eq!(path_count(&stack, "same_provider").await, 0.0);
}

/// Issue 45 item 5: what a provider's server says of images (here LM
/// Studio's model `type`, reported with its residency) decides before
/// anything is sent: an image goes to the provider of the route that reads
/// images even when the text-only one is preferred, and a route whose every
/// provider reads text only is the client's 400 `unsupported_content` with
/// no provider called, in every API. Text still goes by priority.
#[tokio::test]
async fn an_image_goes_only_where_the_model_reads_images() {
    let (text_only, vision) = ("mock@text_only,words=2", "mock@words=3");
    let mut solo = p("solo", "mock@text_only,words=4", "solo", 0);
    solo.mode = iop_proto::config::ProviderMode::Tunnel;
    let providers = vec![p("text", text_only, "pri", 0), p("vision", vision, "pri", 1), solo];
    let stack = stack_with(providers, RetryConfig::default()).await;
    stack.wait_accepts_images("text", false).await;
    stack.wait_accepts_images("vision", true).await;
    stack.wait_accepts_images("solo", false).await;
    let calls = |target: &'static str| {
        let stack = &stack;
        async move { stack.mock_requests(&stack.mock_url, "/v1/chat/completions", Some(target)).await }
    };

    let (status, body) = json_body(stack.post("/v1/chat/completions", &image_chat("pri")).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "w1 w2 w3", "the vision provider answered");
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("pri", "hi", false)).await).await;
    assert_eq!((status, &body["choices"][0]["message"]["content"]), (200, &serde_json::json!("w1 w2")), "{body}");
    assert_eq!((calls(text_only).await, calls(vision).await), (1, 1), "the image never reached the text-only model");

    let messages = serde_json::json!({"model": "solo", "max_tokens": 50, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL.split_once(',').unwrap().1}},
        {"type": "text", "text": "and this"}
    ]}]});
    for (path, body) in [("/v1/chat/completions", image_chat("solo")), ("/v1/messages", messages)] {
        let (status, answer) = json_body(stack.post(path, &body).await).await;
        assert_eq!(status, 400, "{path}: {answer}");
        let (code, message) = match path {
            "/v1/messages" => (&answer["error"]["type"], &answer["error"]["message"]),
            _ => (&answer["error"]["code"], &answer["error"]["message"]),
        };
        let expected = if path == "/v1/messages" { "invalid_request_error" } else { "unsupported_content" };
        assert_eq!(code, expected, "{path}: {answer}");
        assert!(message.as_str().unwrap().contains("does not accept images"), "{path}: {answer}");
    }
    assert_eq!(calls("mock@text_only,words=4").await, 0, "no provider was called");
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("solo", "hi", false)).await).await;
    assert_eq!((status, &body["choices"][0]["message"]["content"]), (200, &serde_json::json!("w1 w2 w3 w4")), "{body}");
}
