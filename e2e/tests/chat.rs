//! OpenAI Chat Completions through Edge -> Node -> mock provider, over both
//! adapters (Ollama native and OpenAI-compatible), streaming and not.

mod common;

use common::*;
use iop_proto::config::Adapter;
use serde_json::{Value, json};

const EXPECTED: &str = "Hello from the IOP mock provider. You said: hi there";

async fn stack() -> Stack {
    Stack::start(StackOptions {
        extra_providers: vec![
            provider("ollama-429", Adapter::Ollama, "mock@status=429,retry_after=1", "mock-429", ""),
            provider("openai-400", Adapter::Openai, "mock@status=400", "mock-400", ""),
            provider("ollama-cut", Adapter::Ollama, "mock@cut_after=2", "mock-cut", ""),
            provider("openai-no-done", Adapter::Openai, "mock@no_done", "mock-no-done", ""),
            provider("openai-crlf", Adapter::Openai, "mock@sse_line_end=crlf", "mock-crlf", ""),
            provider("openai-cr", Adapter::Openai, "mock@sse_line_end=cr", "mock-cr", ""),
        ],
        ..Default::default()
    })
    .await
}

#[tokio::test]
async fn non_streaming_through_both_adapters() {
    let stack = stack().await;
    for model in ["mock-ollama", "mock-openai"] {
        let (status, body) =
            json_body(stack.post("/v1/chat/completions", &chat_body(model, "hi there", false)).await).await;
        assert_eq!(status, 200, "{model}: {body}");
        assert_eq!(body["object"], "chat.completion");
        assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
        assert_eq!(body["model"], "mock", "the model names the target that answered");
        assert_eq!(body["choices"][0]["message"]["role"], "assistant");
        assert_eq!(body["choices"][0]["message"]["content"], EXPECTED, "{model}");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        // The mock counts prompt words and one token per chunk.
        assert_eq!(body["usage"]["prompt_tokens"], 2, "{model}: {body}");
        assert_eq!(body["usage"]["completion_tokens"], 10, "{model}: {body}");
        assert_eq!(body["usage"]["total_tokens"], 12);
    }
}

#[tokio::test]
async fn streaming_through_both_adapters() {
    let stack = stack().await;
    for model in ["mock-ollama", "mock-openai"] {
        let mut body = chat_body(model, "hi there", true);
        body["stream_options"] = json!({ "include_usage": true });
        let response = stack.post("/v1/chat/completions", &body).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let events = sse_events(response).await;
        assert_eq!(events.last().unwrap(), "[DONE]", "{model}");
        assert_eq!(streamed_text(&events), EXPECTED, "{model}");
        let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
        assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]));
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let finish: Vec<_> = chunks.iter().filter_map(|c| c["choices"][0]["finish_reason"].as_str()).collect();
        assert_eq!(finish, ["stop"], "{model}");
        let usage = &chunks.last().unwrap()["usage"];
        assert_eq!(usage["total_tokens"], 12, "{model}: {usage}");
    }
}

#[tokio::test]
async fn tool_calls_survive_both_adapters() {
    let stack = stack().await;
    let tools = json!([{ "type": "function", "function": {
        "name": "lookup", "description": "find things",
        "parameters": { "type": "object", "properties": { "query": { "type": "string" } } } } }]);
    for model in ["mock-ollama", "mock-openai"] {
        let mut body = chat_body(model, "please call tool", false);
        body["tools"] = tools.clone();
        let (status, body) = json_body(stack.post("/v1/chat/completions", &body).await).await;
        assert_eq!(status, 200, "{model}: {body}");
        assert_eq!(body["choices"][0]["finish_reason"], "tool_calls", "{model}: {body}");
        let call = &body["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "lookup");
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({ "query": "mock" }), "{model}");
        assert!(!call["id"].as_str().unwrap().is_empty());

        // And the answer to the tool call goes back through the same path.
        let follow_up = json!({ "model": model, "tools": tools, "messages": [
            { "role": "user", "content": "please call tool" },
            { "role": "assistant", "content": null, "tool_calls": [call] },
            { "role": "tool", "tool_call_id": call["id"], "content": "42" },
            { "role": "user", "content": "thanks" } ] });
        let (status, body) = json_body(stack.post("/v1/chat/completions", &follow_up).await).await;
        assert_eq!(status, 200, "{model}: {body}");
        assert_eq!(body["choices"][0]["message"]["content"], "Hello from the IOP mock provider. You said: thanks");
    }
}

#[tokio::test]
async fn provider_errors_keep_their_reason_and_status() {
    let stack = stack().await;
    let response = stack.post("/v1/chat/completions", &chat_body("mock-429", "hi", false)).await;
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "1");
    let (_, body) = json_body(response).await;
    assert_eq!(body["error"]["type"], "rate_limit_error");

    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("mock-400", "hi", true)).await).await;
    assert_eq!(status, 400, "a failure before the first byte is a plain HTTP error, even when streaming: {body}");
    assert_eq!(body["error"]["code"], "provider_http_status");
}

#[tokio::test]
async fn a_cut_stream_is_never_reported_as_success() {
    let stack = stack().await;
    let (status, body) = json_body(stack.post("/v1/chat/completions", &chat_body("mock-cut", "hi", false)).await).await;
    assert_eq!(status, 502, "{body}");

    let events = sse_events(stack.post("/v1/chat/completions", &chat_body("mock-cut", "hi", true)).await).await;
    assert!(!events.contains(&"[DONE]".to_string()), "{events:?}");
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert!(last["error"]["code"].is_string(), "the stream ends with an error event: {last}");
}

/// SSE lines may end with `\n`, `\r\n` or a lone `\r`: an
/// OpenAI-compatible server using any of them streams the same answer,
/// usage included.
#[tokio::test]
async fn every_sse_line_terminator_streams_the_same_answer() {
    let stack = stack().await;
    for model in ["mock-openai", "mock-crlf", "mock-cr"] {
        let mut body = chat_body(model, "hi there", true);
        body["stream_options"] = json!({ "include_usage": true });
        let events = sse_events(stack.post("/v1/chat/completions", &body).await).await;
        assert_eq!(streamed_text(&events), EXPECTED, "{model}");
        assert_eq!(events.last().unwrap(), "[DONE]", "{model}");
        let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        assert_eq!(usage["usage"]["completion_tokens"], 10, "{model}: {usage}");
    }
}

#[tokio::test]
async fn a_complete_answer_without_done_is_finalised() {
    let stack = stack().await;
    let events =
        sse_events(stack.post("/v1/chat/completions", &chat_body("mock-no-done", "hi there", true)).await).await;
    assert_eq!(streamed_text(&events), EXPECTED);
    assert_eq!(events.last().unwrap(), "[DONE]", "the Edge completes the answer the provider finished");
}

#[tokio::test]
async fn bad_input_gets_openai_errors() {
    let stack = stack().await;
    let cases = [
        (json!({ "model": "nope", "messages": [{ "role": "user", "content": "x" }] }), 404, "model_not_found"),
        (json!({ "model": "mock-ollama" }), 400, "invalid_request"),
        (json!({ "model": "mock-ollama", "messages": [{ "role": "wizard", "content": "x" }] }), 400, "invalid_request"),
    ];
    for (body, status, code) in cases {
        let (got, response) = json_body(stack.post("/v1/chat/completions", &body).await).await;
        assert_eq!(got, status, "{body} -> {response}");
        assert_eq!(response["error"]["code"], code);
        assert!(response["error"]["message"].as_str().unwrap().len() > 5);
    }
    let malformed = stack
        .client
        .post(stack.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    let (status, body) = json_body(malformed).await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"].as_str().unwrap().contains("JSON"), "{body}");

    // A long model name is not echoed back whole, on either API.
    let long_name = "m".repeat(512 * 1024);
    for (path, body) in [
        ("/v1/chat/completions", json!({ "model": long_name, "messages": [{ "role": "user", "content": "x" }] })),
        (
            "/v1/messages",
            json!({ "model": long_name, "max_tokens": 8, "messages": [{ "role": "user", "content": "x" }] }),
        ),
    ] {
        let (status, response) = json_body(stack.post(path, &body).await).await;
        let message = response["error"]["message"].as_str().unwrap();
        assert_eq!(status, 404, "{path}");
        assert!(message.len() < 2048 && message.ends_with('…'), "{path}: {} bytes", message.len());
    }

    let huge = "x".repeat(5 * 1024 * 1024);
    let (status, body) =
        json_body(stack.post("/v1/chat/completions", &chat_body("mock-ollama", &huge, false)).await).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(stack.mock_stats().await["requests_total"], 0, "no bad request reached the provider");
}

#[tokio::test]
async fn models_lists_public_names() {
    let stack = stack().await;
    let body = stack.get_json("/v1/models").await;
    let ids: Vec<_> = body["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        ["mock-400", "mock-429", "mock-cr", "mock-crlf", "mock-cut", "mock-no-done", "mock-ollama", "mock-openai"]
    );
    assert_eq!(body["object"], "list");
    let one = stack.get_json("/v1/models/mock-ollama").await;
    assert_eq!((one["id"].as_str(), one["object"].as_str()), (Some("mock-ollama"), Some("model")));
    let response = stack.client.get(stack.url("/v1/models/org/nope")).send().await.unwrap();
    let (status, body) = json_body(response).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("model_not_found")));
}

#[tokio::test]
async fn responses_and_messages_through_both_adapters() {
    let stack = stack().await;
    for model in ["mock-ollama", "mock-openai"] {
        let (status, body) =
            json_body(stack.post("/v1/responses", &json!({ "model": model, "input": "hi there" })).await).await;
        assert_eq!(status, 200, "{model}: {body}");
        assert_eq!(body["object"], "response");
        assert_eq!(body["status"], "completed");
        assert_eq!(body["output"][0]["content"][0]["text"], EXPECTED, "{model}");
        assert_eq!(body["usage"]["total_tokens"], 12);

        let response =
            stack.post("/v1/responses", &json!({ "model": model, "input": "hi there", "stream": true })).await;
        let text = response.text().await.unwrap();
        let names: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
        assert_eq!(names.first(), Some(&"response.created"), "{model}");
        assert_eq!(names.last(), Some(&"response.completed"), "{model}");
        assert!(names.contains(&"response.output_text.delta"));

        let request =
            json!({ "model": model, "max_tokens": 50, "messages": [{ "role": "user", "content": "hi there" }] });
        let (status, body) = json_body(stack.post("/v1/messages", &request).await).await;
        assert_eq!(status, 200, "{model}: {body}");
        assert_eq!(body["type"], "message");
        assert_eq!(body["content"][0]["text"], EXPECTED, "{model}");
        assert_eq!(body["stop_reason"], "end_turn");

        let mut streaming = request.clone();
        streaming["stream"] = json!(true);
        let text = stack.post("/v1/messages", &streaming).await.text().await.unwrap();
        let names: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
        assert_eq!(names.first(), Some(&"message_start"), "{model}");
        assert_eq!(names.last(), Some(&"message_stop"), "{model}");
    }
}

#[tokio::test]
async fn each_api_answers_errors_in_its_own_shape() {
    let stack = stack().await;
    let (status, body) = json_body(
        stack
            .post(
                "/v1/messages",
                &json!({ "model": "nope", "max_tokens": 5, "messages": [{ "role": "user", "content": "x" }] }),
            )
            .await,
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!((body["type"].as_str(), body["error"]["type"].as_str()), (Some("error"), Some("not_found_error")));
    let (status, body) = json_body(
        stack
            .post("/v1/messages", &json!({ "model": "mock-ollama", "messages": [{ "role": "user", "content": "x" }] }))
            .await,
    )
    .await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"].as_str().unwrap().contains("max_tokens"), "{body}");
    let (status, body) = json_body(stack.post("/v1/responses", &json!({ "model": "mock-ollama" })).await).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["param"], "input", "{body}");
}
