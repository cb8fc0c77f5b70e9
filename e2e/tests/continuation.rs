//! Issue 28 item 4: a committed stream that breaks after text goes on, in
//! the same client stream, on a provider that continues a prefilled
//! assistant turn; through real processes (mock, Edge, Node) for all three
//! streaming APIs.

mod common;

use common::{Stack, StackOptions, WAIT, provider, spawn_mock_with};
use iop_e2e::harness::{ProviderSpec, wait_until};
use iop_proto::config::{Adapter, Limits};
use serde_json::{Value, json};

/// The whole answer of `mock@words=20`, each word once.
const WORDS: &str = "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19 w20";
const PROMPT: &str = "count from one to twenty";

/// `id` on the public model `public` with mock target `target` (priority).
fn on(id: &str, adapter: Adapter, target: &str, public: &str, priority: u32) -> ProviderSpec {
    ProviderSpec { priority, ..provider(id, adapter, target, public, "") }
}

/// An SSE body as `(event name, data)` pairs (`""` for unnamed events).
async fn sse(response: reqwest::Response) -> Vec<(String, String)> {
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty() && !e.starts_with(':'))
        .map(|e| {
            let mut name = String::new();
            let mut data = String::new();
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
            (name, data)
        })
        .collect()
}

fn json_of(data: &str) -> Value {
    serde_json::from_str(data).unwrap_or(Value::Null)
}

/// Chat Completions: the text, and checks of one answer (one id, one role
/// chunk, finish `stop`, `[DONE]`); the final usage.
fn chat_answer(events: &[(String, String)]) -> (String, Value) {
    assert_eq!(events.last().map(|e| e.1.as_str()), Some("[DONE]"), "{events:?}");
    let chunks: Vec<Value> = events.iter().filter(|e| e.1 != "[DONE]").map(|e| json_of(&e.1)).collect();
    assert!(chunks.iter().all(|c| c.get("error").is_none()), "{chunks:?}");
    let ids: std::collections::BTreeSet<_> = chunks.iter().map(|c| c["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids.len(), 1, "one response id: {ids:?}");
    let roles = chunks.iter().filter(|c| c["choices"][0]["delta"]["role"].is_string()).count();
    assert_eq!(roles, 1, "one role chunk");
    let finishes: Vec<_> = chunks.iter().filter_map(|c| c["choices"][0]["finish_reason"].as_str()).collect();
    assert_eq!(finishes, ["stop"]);
    let text = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    let usage = chunks.iter().rev().find(|c| c["usage"].is_object()).map(|c| c["usage"].clone()).unwrap_or_default();
    (text, usage)
}

async fn stream_chat(stack: &Stack, model: &str, extra: Value) -> Vec<(String, String)> {
    let mut body = json!({
        "model": model,
        "stream": true,
        "stream_options": { "include_usage": true },
        "messages": [{ "role": "user", "content": PROMPT }],
    });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    sse(stack.post("/v1/chat/completions", &body).await).await
}

async fn continued(stack: &Stack) -> f64 {
    stack.metric("iop_edge_continuations_total{result=\"continued\"}").await
}

async fn no_leaks(stack: &Stack) {
    wait_until("no slot, lease or run outstanding", WAIT, || async {
        let view = stack.get_json("/admin/v1/providers").await;
        let leases = &view["leases"];
        view["in_flight_runs"] == 0
            && view["providers"].as_array().unwrap().iter().all(|p| p["in_flight"] == 0)
            && leases["acquired"] == leases["released"]
    })
    .await;
    let view = stack.get_json("/admin/v1/providers").await;
    assert_eq!(view["leases"]["double_releases"], 0, "{view}");
}

/// The preferred provider cuts its stream after six words; the answer goes
/// on from `w7` on the other continuation provider, in every API, as one
/// answer: each word exactly once, one id, a normal finish.
#[tokio::test]
async fn a_stream_cut_after_text_is_continued_as_one_answer_in_every_api() {
    let stack = Stack::start(StackOptions {
        extra_providers: vec![
            on("cuts", Adapter::Ollama, "mock@words=20,cut_after=6", "story", 0),
            on("whole", Adapter::Openai, "mock@words=20", "story", 1),
            on("plain", Adapter::Ollama, "mock@words=20,cut_after=6", "plain", 0),
            on("cuts-l", Adapter::Ollama, "mock@words=20,cut_after=6", "story-llama", 0),
            on("repeats", Adapter::Openai, "mock@words=20,repeat_prefill", "story-llama", 1),
        ],
        ..StackOptions::default()
    })
    .await;
    stack.declare_continuation(&["cuts", "whole", "cuts-l", "repeats"]).await;
    // An Ollama server the config says never to continue on (by default its
    // node's detection would).
    stack.set_continuation(&["plain"], false).await;

    // Chat Completions.
    let (text, usage) = chat_answer(&stream_chat(&stack, "story", json!({})).await);
    assert_eq!(text, WORDS);
    // The answer's usage is the sum over its runs: the broken one's as its
    // node counted it (the six words it relayed; its prompt estimated from
    // the request's size) and the continuation's (its prompt read the six
    // prefilled words; fourteen words): twenty words, as the client got.
    let estimate = iop_proto::usage::estimate_input_tokens(
        &[iop_proto::pb::ChatMessage { content: PROMPT.into(), ..Default::default() }],
        &[],
    );
    let continuation_prompt = PROMPT.split_whitespace().count() as u64 + 6;
    assert_eq!(usage["prompt_tokens"], estimate + continuation_prompt, "{usage}");
    assert_eq!(usage["completion_tokens"], 20, "{usage}");
    // The accounting agrees with what the client was told.
    iop_e2e::harness::wait_until("both runs charged", WAIT, || async {
        let anonymous = &stack.get_json("/admin/v1/usage").await["principals"]["anonymous"];
        (anonymous["input_tokens"] == usage["prompt_tokens"])
            && (anonymous["output_tokens"] == usage["completion_tokens"])
    })
    .await;
    let prefill = stack.last_provider_request("/v1/chat/completions").await;
    let last = prefill["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "assistant", "{prefill}");
    assert_eq!(last["content"], "w1 w2 w3 w4 w5 w6", "the text the client got, as the prefill");
    assert_eq!(continued(&stack).await, 1.0);

    // Responses.
    let body = json!({ "model": "story", "stream": true, "input": PROMPT });
    let events = sse(stack.post("/v1/responses", &body).await).await;
    assert!(events.iter().all(|(name, _)| name != "response.failed" && name != "error"), "{events:?}");
    let deltas: Vec<Value> =
        events.iter().filter(|(n, _)| n == "response.output_text.delta").map(|(_, d)| json_of(d)).collect();
    let text: String = deltas.iter().filter_map(|d| d["delta"].as_str()).collect();
    assert_eq!(text, WORDS);
    assert!(deltas.iter().all(|d| d["output_index"] == 0 && d["content_index"] == 0), "{deltas:?}");
    let added = events.iter().filter(|(n, _)| n == "response.output_item.added").count();
    assert_eq!(added, 1, "one message item");
    let created = events.iter().find(|(n, _)| n == "response.created").map(|(_, d)| json_of(d)).unwrap();
    let completed = events.iter().find(|(n, _)| n == "response.completed").map(|(_, d)| json_of(d)).unwrap();
    assert_eq!(created["response"]["id"], completed["response"]["id"], "one response");
    assert_eq!(completed["response"]["output"][0]["content"][0]["text"], WORDS);
    assert_eq!(completed["response"]["usage"]["output_tokens"], 20);
    assert_eq!(continued(&stack).await, 2.0);

    // Anthropic Messages.
    let body = json!({
        "model": "story",
        "stream": true,
        "max_tokens": 100,
        "messages": [{ "role": "user", "content": PROMPT }],
    });
    let events = sse(stack.post("/v1/messages", &body).await).await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert!(!names.contains(&"error"), "{events:?}");
    assert_eq!(names.iter().filter(|n| **n == "message_start").count(), 1);
    assert_eq!(names.iter().filter(|n| **n == "content_block_start").count(), 1, "one text block: {names:?}");
    let deltas: Vec<Value> =
        events.iter().filter(|(n, _)| n == "content_block_delta").map(|(_, d)| json_of(d)).collect();
    assert!(deltas.iter().all(|d| d["index"] == 0), "{deltas:?}");
    let text: String = deltas.iter().filter_map(|d| d["delta"]["text"].as_str()).collect();
    assert_eq!(text, WORDS);
    let delta = events.iter().find(|(n, _)| n == "message_delta").map(|(_, d)| json_of(d)).unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(names.last(), Some(&"message_stop"));
    assert_eq!(continued(&stack).await, 3.0);

    // A provider that repeats the prefill before continuing it (llama.cpp's
    // server does): the repeat is not sent again.
    let (text, _) = chat_answer(&stream_chat(&stack, "story-llama", json!({})).await);
    assert_eq!(text, WORDS);
    assert_eq!(continued(&stack).await, 4.0);

    // A break inside a tool call is not continued: the API's error event.
    let tools = json!({ "tools": [{ "type": "function", "function": {
        "name": "lookup",
        "parameters": { "type": "object", "properties": { "query": { "type": "string" } }, "required": ["query"] },
    } }] });
    let mut body =
        json!({ "model": "story", "stream": true, "messages": [{ "role": "user", "content": "call tool" }] });
    body.as_object_mut().unwrap().extend(tools.as_object().unwrap().clone());
    let events = sse(stack.post("/v1/chat/completions", &body).await).await;
    let last = json_of(&events.last().unwrap().1);
    assert!(last["error"].is_object(), "ends with the error event: {events:?}");
    assert!(!events.iter().any(|e| e.1 == "[DONE]"), "never presented as complete");
    assert_eq!(stack.metric("iop_edge_continuations_total{result=\"not_text\"}").await, 1.0);

    // No provider of the model continues prefills: the error event, as before.
    let events = stream_chat(&stack, "plain", json!({})).await;
    let last = json_of(&events.last().unwrap().1);
    assert!(last["error"].is_object(), "{events:?}");
    let text: String = events
        .iter()
        .filter_map(|e| json_of(&e.1)["choices"][0]["delta"]["content"].as_str().map(String::from))
        .collect();
    assert_eq!(text, "w1 w2 w3 w4 w5 w6");
    assert_eq!(stack.metric("iop_edge_continuations_total{result=\"no_capable_provider\"}").await, 1.0);
    assert_eq!(continued(&stack).await, 4.0);

    no_leaks(&stack).await;
}

/// `limits.max_continuations` bounds the continuations: the continuing
/// provider breaks too, and the answer ends with the error event after
/// exactly the words both sent.
#[tokio::test]
async fn continuations_stop_at_the_limit() {
    let stack = Stack::start(StackOptions {
        extra_providers: vec![
            on("cuts", Adapter::Ollama, "mock@words=20,cut_after=6", "story", 0),
            on("cuts-too", Adapter::Openai, "mock@words=20,cut_after=3", "story", 1),
        ],
        limits: Some(Limits { max_continuations: 1, ..Limits::default() }),
        ..StackOptions::default()
    })
    .await;
    stack.declare_continuation(&["cuts", "cuts-too"]).await;
    let events = stream_chat(&stack, "story", json!({})).await;
    let last = json_of(&events.last().unwrap().1);
    assert!(last["error"].is_object(), "{events:?}");
    let text: String = events
        .iter()
        .filter_map(|e| json_of(&e.1)["choices"][0]["delta"]["content"].as_str().map(String::from))
        .collect();
    assert_eq!(text, "w1 w2 w3 w4 w5 w6 w7 w8 w9", "six words, then three of the continuation, each once");
    assert_eq!(continued(&stack).await, 1.0);
    assert_eq!(stack.metric("iop_edge_continuations_total{result=\"limit\"}").await, 1.0);
    no_leaks(&stack).await;
}

/// Issue 46 item 4: with nothing declared, a stream cut on an Ollama
/// server or a llama.cpp-style one goes on, since each node detects which
/// servers continue a prefill; an LM Studio-style server (the OpenAI adapter on a server
/// answering LM Studio's model endpoint) is never asked, so a model with
/// only such a provider ends with the error event.
#[tokio::test]
async fn a_cut_stream_is_continued_on_defaults_where_the_server_continues() {
    // A llama.cpp-style server: only `/props` answers (the node detects it
    // by that), and it repeats the prefill before continuing.
    let (_llama_mock, llama_url) = spawn_mock_with("127.0.0.1:0", &["--residency-api", "llama_cpp"]).await;
    let on_llama =
        |id, target, priority| ProviderSpec { priority, ..provider(id, Adapter::Openai, target, "llama", &llama_url) };
    let stack = Stack::start(StackOptions {
        extra_providers: vec![
            on("cuts", Adapter::Ollama, "mock@words=20,cut_after=6", "story", 0),
            on("whole", Adapter::Ollama, "mock@words=20", "story", 1),
            on("studio", Adapter::Openai, "mock@words=20,cut_after=6", "studio", 0),
            on_llama("llama-cuts", "mock@words=20,cut_after=6", 0),
            on_llama("llama-whole", "mock@words=20,repeat_prefill", 1),
        ],
        ..StackOptions::default()
    })
    .await;
    // What each node detected arrives with its first residency report.
    for id in ["cuts", "whole", "studio", "llama-cuts", "llama-whole"] {
        wait_until(&format!("{id}'s server detected"), WAIT, || async {
            stack.provider_admin(id).await["residency"] != "unknown"
        })
        .await;
    }
    let (text, usage) = chat_answer(&stream_chat(&stack, "story", json!({})).await);
    assert_eq!(text, WORDS);
    assert_eq!(usage["completion_tokens"], 20, "{usage}");
    assert_eq!(continued(&stack).await, 1.0);

    let (text, _) = chat_answer(&stream_chat(&stack, "llama", json!({})).await);
    assert_eq!(text, WORDS, "the llama.cpp-style server continued, its repeat of the prefill dropped");
    assert_eq!(continued(&stack).await, 2.0);

    let events = stream_chat(&stack, "studio", json!({})).await;
    assert!(json_of(&events.last().unwrap().1)["error"].is_object(), "{events:?}");
    assert_eq!(stack.metric("iop_edge_continuations_total{result=\"no_capable_provider\"}").await, 1.0);
    no_leaks(&stack).await;
}
