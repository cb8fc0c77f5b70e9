//! Per-key limits end to end (issue 30 item 1): a real `iop-edge`, node and
//! mock provider with `auth.mode: required` and a keys file whose
//! principals have `requests_per_minute`, `tokens_per_minute` and
//! `max_concurrent_requests`. Over a limit a client gets its API's 429 with
//! the rate-limit headers its SDK reads; other principals are unaffected.

mod common;

use common::*;
use iop_e2e::harness::wait_until;
use iop_proto::config::Adapter;
use serde_json::{Value, json};

const RPM_KEY: &str = "sk-rpm-0123456789";
const TPM_KEY: &str = "sk-tpm-0123456789";
const ONE_AT_ONCE_KEY: &str = "sk-one-at-once-0123456789";
const TPM_STREAM_KEY: &str = "sk-tpm-stream-0123456789";
const FREE_KEY: &str = "sk-free-0123456789";
const SDK_OPENAI_KEY: &str = "sk-sdk-openai-0123456789";
const SDK_ANTHROPIC_KEY: &str = "sk-sdk-anthropic-0123456789";

fn hash(key: &str) -> String {
    iop_edge::auth::to_hex(&iop_edge::auth::sha256(key.as_bytes()))
}

fn keys() -> String {
    let entry = |name: &str, key: &str, limits: &str| {
        format!("  - {{ name: {name}, key_sha256: {}, models: [\"*\"]{limits} }}\n", hash(key))
    };
    [
        "principals:\n".to_string(),
        entry("rpm", RPM_KEY, ", requests_per_minute: 2"),
        entry("tpm", TPM_KEY, ", tokens_per_minute: 5"),
        entry("tpm-stream", TPM_STREAM_KEY, ", tokens_per_minute: 5"),
        entry("one-at-once", ONE_AT_ONCE_KEY, ", max_concurrent_requests: 1"),
        entry("free", FREE_KEY, ""),
        entry("sdk-openai", SDK_OPENAI_KEY, ", requests_per_minute: 1, tokens_per_minute: 1000"),
        entry("sdk-anthropic", SDK_ANTHROPIC_KEY, ", requests_per_minute: 1, tokens_per_minute: 1000"),
    ]
    .concat()
}

async fn stack() -> Stack {
    // Requests to `mock-held` wait at the provider until `POST /mock/release/held`.
    let held = provider("held", Adapter::Ollama, "mock@hold=held", "mock-held", "");
    Stack::start(StackOptions { keys: Some(keys()), extra_providers: vec![held], ..Default::default() }).await
}

/// (status, headers, body) of a chat completion (or a message, for `/v1/messages`).
async fn call(stack: &Stack, path: &str, model: &str, key: &str) -> (u16, reqwest::header::HeaderMap, Value) {
    let body = if path == "/v1/messages" {
        json!({ "model": model, "max_tokens": 16, "messages": [{ "role": "user", "content": "hi" }] })
    } else {
        chat_body(model, "hi", false)
    };
    let response = stack.post_as(key, path, &body).await;
    let headers = response.headers().clone();
    let (status, body) = json_body(response).await;
    (status, headers, body)
}

/// A chat of the one-at-once key to `mock-held`, once the provider holds
/// it (until `POST /mock/release/held`): its (status, body) when it ends.
async fn hold_one_at_once(stack: &Stack) -> tokio::task::JoinHandle<(u16, Value)> {
    let (client, url) = (stack.client.clone(), stack.url("/v1/chat/completions"));
    let held = tokio::spawn(async move {
        let request = client
            .post(url)
            .bearer_auth(ONE_AT_ONCE_KEY)
            .header("content-type", "application/json")
            .body(chat_body("mock-held", "hi", false).to_string());
        json_body(request.send().await.unwrap()).await
    });
    wait_until("the chat is held at the provider", WAIT, || async {
        let log = stack.client.get(format!("{}/mock/requests", stack.mock_url)).send().await.unwrap();
        let log: Value = serde_json::from_slice(&log.bytes().await.unwrap()).unwrap();
        // The chat itself (the node's probes name the model too).
        log.as_array().unwrap().iter().any(|r| r["path"] == "/api/chat" && r["body"]["model"] == "mock@hold=held")
    })
    .await;
    held
}

fn header<'a>(headers: &'a reqwest::header::HeaderMap, name: &str) -> &'a str {
    headers.get(name).unwrap_or_else(|| panic!("no `{name}` in {headers:?}")).to_str().unwrap()
}

#[tokio::test]
async fn per_key_limits_refuse_in_each_apis_shape_with_the_headers_clients_read() {
    let stack = stack().await;

    // Requests per minute: two answered, with the headers counting down...
    for remaining in ["1", "0"] {
        let (status, headers, body) = call(&stack, "/v1/chat/completions", "mock-ollama", RPM_KEY).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(header(&headers, "x-ratelimit-limit-requests"), "2");
        assert_eq!(header(&headers, "x-ratelimit-remaining-requests"), remaining);
        assert!(headers.get("x-ratelimit-limit-tokens").is_none(), "no tokens limit, no tokens headers");
    }
    // ...the third is OpenAI's 429: typed by the limit, with when to retry.
    let before = stack.mock_stats().await["requests_total"].as_u64().unwrap();
    let (status, headers, body) = call(&stack, "/v1/chat/completions", "mock-ollama", RPM_KEY).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(
        (body["error"]["type"].as_str(), body["error"]["code"].as_str()),
        (Some("requests"), Some("rate_limit_exceeded"))
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("requests per minute") && !message.contains(RPM_KEY), "{message}");
    // One request comes back every 30 s (2 per minute).
    let retry: u64 = header(&headers, "retry-after").parse().unwrap();
    assert!((1..=30).contains(&retry), "{retry}");
    let retry_ms: u64 = header(&headers, "retry-after-ms").parse().unwrap();
    assert!(retry_ms <= retry * 1000 && retry_ms > (retry - 1) * 1000, "{retry_ms} vs {retry}");
    assert_eq!(header(&headers, "x-ratelimit-remaining-requests"), "0");
    let reset = header(&headers, "x-ratelimit-reset-requests");
    assert!(reset.ends_with('s') && !reset.ends_with("ms"), "Go's form: {reset}");
    // The same key on the Anthropic API: Anthropic's shape and headers.
    let (status, headers, body) = call(&stack, "/v1/messages", "mock-ollama", RPM_KEY).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!((body["type"].as_str(), body["error"]["type"].as_str()), (Some("error"), Some("rate_limit_error")));
    assert_eq!(header(&headers, "anthropic-ratelimit-requests-limit"), "2");
    assert_eq!(header(&headers, "anthropic-ratelimit-requests-remaining"), "0");
    let reset = header(&headers, "anthropic-ratelimit-requests-reset");
    assert!(time::OffsetDateTime::parse(reset, &time::format_description::well_known::Rfc3339).is_ok(), "{reset}");
    assert!(header(&headers, "retry-after").parse::<u64>().unwrap() >= 1);
    assert!(headers.get("x-ratelimit-limit-requests").is_none());
    // Embeddings count as requests too, in OpenAI's form.
    let response = stack
        .client
        .post(stack.url("/v1/embeddings"))
        .bearer_auth(RPM_KEY)
        .header("content-type", "application/json")
        .body(json!({ "model": "mock-ollama", "input": "hi" }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(header(response.headers(), "x-ratelimit-remaining-requests"), "0");
    assert_eq!(stack.mock_stats().await["requests_total"].as_u64().unwrap(), before, "refusals never reach a provider");

    // Another principal is unaffected, and without limits has no headers.
    let (status, headers, body) = call(&stack, "/v1/chat/completions", "mock-ollama", FREE_KEY).await;
    assert_eq!(status, 200, "{body}");
    assert!(headers.keys().all(|name| !name.as_str().contains("ratelimit")), "{headers:?}");

    // Tokens per minute: the first answer (a 1-token prompt, a longer
    // reply) takes the bucket past its 5; the next request waits it out.
    let (status, headers, body) = call(&stack, "/v1/chat/completions", "mock-ollama", TPM_KEY).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&headers, "x-ratelimit-limit-tokens"), "5");
    assert!(body["usage"]["total_tokens"].as_u64().unwrap() > 5, "{body}");
    let (status, headers, body) = call(&stack, "/v1/chat/completions", "mock-ollama", TPM_KEY).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["type"], "tokens", "{body}");
    assert_eq!(header(&headers, "x-ratelimit-remaining-tokens"), "0");
    assert!(body["error"]["message"].as_str().unwrap().contains("tokens per minute"), "{body}");

    // A streamed answer's usage counts the same (the client asked for none).
    let response = stack
        .client
        .post(stack.url("/v1/chat/completions"))
        .bearer_auth(TPM_STREAM_KEY)
        .header("content-type", "application/json")
        .body(chat_body("mock-ollama", "hi", true).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // Its reservation (its input estimate and 1,024 tokens for a request
    // without max_tokens) holds the bucket until the answer ends.
    assert_eq!(header(response.headers(), "x-ratelimit-remaining-tokens"), "0");
    assert!(streamed_text(&sse_events(response).await).contains("You said: hi"));
    let (status, _, body) = call(&stack, "/v1/chat/completions", "mock-ollama", TPM_STREAM_KEY).await;
    assert_eq!((status, body["error"]["type"].as_str()), (429, Some("tokens")), "{body}");

    // Requests at once: one held at the provider, the next refused until
    // it ends.
    let first = hold_one_at_once(&stack).await;
    let (status, headers, body) = call(&stack, "/v1/chat/completions", "mock-ollama", ONE_AT_ONCE_KEY).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["type"], "requests", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("requests at once"), "{body}");
    assert_eq!(header(&headers, "retry-after"), "1");
    let response = stack.client.post(format!("{}/mock/release/held", stack.mock_url)).send().await.unwrap();
    assert_eq!(response.status(), 204);
    let (status, body) = first.await.unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = call(&stack, "/v1/chat/completions", "mock-ollama", ONE_AT_ONCE_KEY).await;
    assert_eq!(status, 200, "the ended request gave its place back: {body}");

    // Counted per principal and limit.
    for (principal, limit, count) in [
        ("rpm", "requests", 3.0),
        ("tpm", "tokens", 1.0),
        ("tpm-stream", "tokens", 1.0),
        ("one-at-once", "concurrency", 1.0),
    ] {
        let sample = format!("iop_edge_rate_limited_total{{principal=\"{principal}\",limit=\"{limit}\"}}");
        assert_eq!(stack.metric(&sample).await, count, "{sample}");
    }
}

/// `count_tokens` is a request like any other for the caller's limits
/// (issue 41 item 4): a key allowed 2 requests a minute gets 2 counts and
/// then Anthropic's 429, which its chats share; a key allowed one request
/// at once gets no count while its chat is running, and one after.
#[tokio::test]
async fn count_tokens_counts_against_the_callers_limits() {
    let stack = stack().await;
    let count = |key: &'static str| {
        let body = json!({ "model": "mock-ollama", "messages": [{ "role": "user", "content": "hi" }] });
        let request = stack
            .client
            .post(stack.url("/v1/messages/count_tokens"))
            .bearer_auth(key)
            .header("content-type", "application/json")
            .body(body.to_string());
        async move {
            let response = request.send().await.unwrap();
            let headers = response.headers().clone();
            let (status, body) = json_body(response).await;
            (status, headers, body)
        }
    };
    for _ in 0..2 {
        let (status, _, body) = count(RPM_KEY).await;
        assert_eq!(status, 200, "{body}");
        assert!(body["input_tokens"].as_u64().unwrap() > 0, "{body}");
    }
    let (status, headers, body) = count(RPM_KEY).await;
    assert_eq!((status, body["error"]["type"].as_str()), (429, Some("rate_limit_error")), "{body}");
    assert!(header(&headers, "retry-after").parse::<u64>().unwrap() >= 1);
    let (status, _, body) = call(&stack, "/v1/messages", "mock-ollama", RPM_KEY).await;
    assert_eq!(status, 429, "the counts used the minute's requests: {body}");

    let held = hold_one_at_once(&stack).await;
    let (status, _, body) = count(ONE_AT_ONCE_KEY).await;
    assert_eq!(status, 429, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("requests at once"), "{body}");
    let response = stack.client.post(format!("{}/mock/release/held", stack.mock_url)).send().await.unwrap();
    assert_eq!(response.status(), 204);
    assert_eq!(held.await.unwrap().0, 200);
    let (status, _, body) = count(ONE_AT_ONCE_KEY).await;
    assert_eq!(status, 200, "{body}");

    for (principal, limit) in [("rpm", "requests"), ("one-at-once", "concurrency")] {
        let sample = format!("iop_edge_rate_limited_total{{principal=\"{principal}\",limit=\"{limit}\"}}");
        assert_eq!(stack.metric(&sample).await, if principal == "rpm" { 2.0 } else { 1.0 }, "{sample}");
    }
}

/// The official SDKs (`max_retries=0`) raise their `RateLimitError` with
/// status 429 and read the headers (e2e/sdk/rate_limits.py).
#[tokio::test]
#[cfg_attr(iop_absent_python_sdks, ignore = "needs the Python SDKs: scripts/test-deps")]
async fn sdks_raise_their_rate_limit_errors_and_read_the_headers() {
    let stack = stack().await;
    run_script(
        "rate_limits.py",
        &[stack.url("").trim_end_matches('/'), SDK_OPENAI_KEY, SDK_ANTHROPIC_KEY, "mock-ollama"],
    )
    .await;
}

/// Two replicas in the config's `replicas`: this one enforces its share,
/// `ceil(2 / 2) = 1` request per minute, and says so (the other replica's
/// share is the unit tests' `two_replicas_each_admit_their_share`).
#[tokio::test]
async fn each_replica_the_config_lists_enforces_its_share() {
    let stack = Stack::start(StackOptions {
        keys: Some(keys()),
        edge_args: vec!["--replica-id", "edge-a"],
        ..Default::default()
    })
    .await;
    let revision = stack.get_json("/admin/v1/config").await["config"]["revision"].as_u64().unwrap();
    let text = std::fs::read_to_string(&stack.edge_config).unwrap();
    let mut config = iop_proto::config::EdgeConfig::from_yaml(&text).unwrap();
    config.replicas = vec!["edge-a".into(), "edge-b".into()];
    std::fs::write(&stack.edge_config, config.to_yaml()).unwrap();
    wait_until("the two-replica config is applied", WAIT, || async {
        stack.get_json("/admin/v1/config").await["config"]["revision"].as_u64() == Some(revision + 1)
    })
    .await;

    let (status, headers, body) = call(&stack, "/v1/chat/completions", "mock-ollama", RPM_KEY).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(header(&headers, "x-ratelimit-limit-requests"), "1", "this replica's share of 2");
    assert_eq!(header(&headers, "x-ratelimit-remaining-requests"), "0");
    let (status, _, body) = call(&stack, "/v1/chat/completions", "mock-ollama", RPM_KEY).await;
    assert_eq!(status, 429, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("limit 1 on this gateway replica (2 across 2 replicas)"), "{message}");
}
