//! The mock over HTTP: a real server for each test, every route and knob
//! end to end (the unit tests of pure code are beside it in each file).

use super::embeddings::{base64_f32s, shortened_embedding};
use super::faults::MALFORMED_JSON;
use super::openai::CREATED_UNIX;
use super::plan::TOOL_CALL_ID;
use super::scripts::tests::SCRIPT_FILE;
use super::*;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

const HELLO: &str = "Hello from the IOP mock provider. You said: ";

async fn spawn(defaults: Faults) -> MockHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    start(listener, MockConfig { defaults, ..MockConfig::default() }).await
}

fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().no_proxy().build().unwrap()
}

fn chat_body(model: &str, content: &str, extra: Value) -> Value {
    let mut body = json!({ "model": model, "messages": [{ "role": "user", "content": content }] });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    body
}

async fn post(mock: &MockHandle, path: &str, body: &Value, faults: Option<&str>) -> reqwest::Response {
    let mut req = client()
        .post(format!("{}{path}", mock.base_url()))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(spec) = faults {
        req = req.header(FAULTS_HEADER, spec);
    }
    req.send().await.unwrap()
}

async fn get_json(mock: &MockHandle, path: &str) -> Value {
    let resp = client().get(format!("{}{path}", mock.base_url())).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap()
}

async fn json_of(resp: reqwest::Response) -> Value {
    serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap()
}

/// Reads the body until its end or an error; returns the bytes and
/// whether the body ended abnormally.
async fn read_lossy(mut resp: reqwest::Response) -> (String, bool) {
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => return (String::from_utf8(body).unwrap(), false),
            Err(_) => return (String::from_utf8(body).unwrap(), true),
        }
    }
}

fn ndjson(body: &str) -> Vec<Value> {
    body.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The payloads of `data: ` SSE events.
fn sse(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").expect("data event").to_owned())
        .collect()
}

/// Reads one NDJSON line from a streaming response.
async fn next_line(resp: &mut reqwest::Response, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(i) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            return Some(String::from_utf8(line).unwrap().trim_end().to_owned());
        }
        buf.extend_from_slice(&resp.chunk().await.ok()??);
    }
}

async fn wait_for_stats(mock: &MockHandle, check: impl Fn(&MockStats) -> bool) -> MockStats {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let stats: MockStats = serde_json::from_value(get_json(mock, "/mock/stats").await).unwrap();
        if check(&stats) || Instant::now() > deadline {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What the `call tool` call answers for [`tools`]' schema.
const TOOL_ARGUMENTS: &str = r#"{"query":"mock"}"#;

fn tools() -> Value {
    json!({ "tools": [{ "type": "function", "function": { "name": "search", "parameters": query_schema() } }] })
}

fn query_schema() -> Value {
    json!({ "type": "object", "properties": { "query": { "type": "string" } } })
}

#[tokio::test]
async fn echo_auth_quotes_the_authorization_header_in_errors_and_streams() {
    let mock = spawn(Faults::default()).await;
    let key = "Bearer sk-proj-Zq8vK2mN4pR7tW1xY5aB3cD6eF9gH0jL";
    let send = |path: &'static str, body: Value, faults: &'static str| {
        client()
            .post(format!("{}{path}", mock.base_url()))
            .header("authorization", key)
            .header(FAULTS_HEADER, faults)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let refused = send("/v1/chat/completions", chat_body("mock", "hi", json!({})), "echo_auth").await.unwrap();
    assert_eq!(refused.status(), 401);
    let body = json_of(refused).await;
    assert_eq!(body["error"]["message"], format!("Incorrect API key provided: {key}"));
    let status = send("/api/chat", chat_body("mock", "hi", json!({})), "echo_auth,status=403").await.unwrap();
    assert_eq!(status.status(), 403);
    assert_eq!(json_of(status).await["error"], format!("Incorrect API key provided: {key}"));

    // A stream: one content chunk, then the error event in two writes.
    let mut streamed =
        send("/v1/chat/completions", chat_body("mock", "hi", json!({ "stream": true })), "echo_auth").await.unwrap();
    assert_eq!(streamed.status(), 200);
    let mut chunks = Vec::new();
    while let Some(chunk) = streamed.chunk().await.unwrap() {
        chunks.push(String::from_utf8(chunk.to_vec()).unwrap());
    }
    let events = sse(&chunks.concat());
    assert_eq!(events.len(), 3, "{events:?}");
    let error: Value = serde_json::from_str(&events[2]).unwrap();
    assert_eq!(error["error"]["message"], format!("Incorrect API key provided: {key}"));
    assert!(!chunks.iter().any(|c| c.contains(key)), "the key is split across writes: {chunks:?}");
    let responses = send("/v1/responses", json!({ "model": "mock", "input": "hi", "stream": true }), "echo_auth");
    let (text, _) = read_lossy(responses.await.unwrap()).await;
    assert!(text.contains("event: error\ndata: {\"code\":\"invalid_api_key\""), "{text}");
    assert!(text.contains(key), "{text}");
}

#[tokio::test]
async fn set_cookie_answers_with_a_cookie_and_the_log_keeps_request_headers() {
    let mock = spawn(Faults::default()).await;
    let response = client()
        .post(format!("{}/v1/chat/completions", mock.base_url()))
        .header("x-forwarded-for", "10.0.0.1")
        .header(FAULTS_HEADER, "set_cookie")
        .header("content-type", "application/json")
        .body(chat_body("mock", "hi", json!({})).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["set-cookie"].to_str().unwrap().starts_with("mock-session="));
    assert_eq!(response.headers()["x-ratelimit-remaining-requests"], "99");
    let logged = &mock.requests()[0];
    assert!(logged.headers.contains(&("x-forwarded-for".into(), "10.0.0.1".into())), "{logged:?}");
}

#[tokio::test]
async fn listings_health_and_stats() {
    let mock = spawn(Faults::default()).await;
    assert_eq!(get_json(&mock, "/api/tags").await["models"][0]["name"], "mock");
    let models = get_json(&mock, "/v1/models").await;
    assert_eq!(models["data"][0]["id"], "mock");
    assert_eq!(models["data"][0]["owned_by"], "iop-mock");
    for (model, capabilities) in [
        ("mock", json!(["completion", "tools", "vision"])),
        ("text-only", json!(["completion", "tools"])),
        ("mock@text_only", json!(["completion", "tools"])),
        ("mock@text_only=false", json!(["completion", "tools", "vision"])),
    ] {
        let shown = json_of(post(&mock, "/api/show", &json!({ "model": model }), None).await).await;
        assert_eq!(shown["capabilities"], capabilities);
    }
    let health = client().get(format!("{}/healthz", mock.base_url())).send().await.unwrap();
    assert_eq!(health.text().await.unwrap(), "ok");
    assert_eq!(
        get_json(&mock, "/mock/stats").await,
        json!({
            "requests_total": 0, "completed_streams": 0, "aborted_streams": 0, "stream_bytes": 0, "loads": 0,
        })
    );
    mock.shutdown().await;
}

#[tokio::test]
async fn ollama_streams_ndjson_by_default() {
    let mock = spawn(Faults::default()).await;
    let resp = post(&mock, "/api/chat", &chat_body("mock", "hi there", json!({})), None).await;
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let lines = ndjson(&resp.text().await.unwrap());
    let (last, chunks) = lines.split_last().unwrap();
    let text: String = chunks
        .iter()
        .inspect(|c| assert_eq!(c["done"], false))
        .map(|c| c["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, format!("{HELLO}hi there"));
    assert_eq!(chunks[1]["message"]["content"], " from");
    assert_eq!(last["done"], true);
    assert_eq!(last["done_reason"], "stop");
    assert_eq!(last["message"]["content"], "");
    assert_eq!(last["prompt_eval_count"], 2);
    assert_eq!(last["eval_count"], chunks.len());
    let stats = wait_for_stats(&mock, |s| s.completed_streams == 1).await;
    assert_eq!((stats.requests_total, stats.completed_streams, stats.aborted_streams), (1, 1, 0));
    assert!(stats.stream_bytes > 0);
}

#[tokio::test]
async fn ollama_non_streaming_and_num_predict() {
    let mock = spawn(Faults::default()).await;
    let long = "x".repeat(300);
    let body = chat_body("mock", &long, json!({ "stream": false }));
    let reply = json_of(post(&mock, "/api/chat", &body, None).await).await;
    assert_eq!(reply["message"]["content"], format!("{HELLO}{}", "x".repeat(200)));
    assert_eq!(reply["done"], true);
    assert_eq!(reply["done_reason"], "stop");
    assert_eq!(reply["prompt_eval_count"], 1);
    assert_eq!(reply["eval_count"], 9);

    let body = chat_body("mock@words=5", "hi", json!({ "stream": false, "options": { "num_predict": 2 } }));
    let reply = json_of(post(&mock, "/api/chat", &body, None).await).await;
    assert_eq!(reply["model"], "mock@words=5");
    assert_eq!(reply["message"]["content"], "w1 w2");
    assert_eq!(reply["done_reason"], "length");
    assert_eq!(reply["eval_count"], 2);
}

/// Issue 27 items 2 and 3: a JSON-Schema `format` (and OpenAI's
/// `response_format` schema) is honoured as a provider's grammar would
/// force it, streamed in pieces or whole; `"json"` and `json_object`
/// change nothing.
#[tokio::test]
async fn ollama_format_schema_is_answered_with_a_matching_value() {
    let mock = spawn(Faults::default()).await;
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                        "required": ["city", "days"]});
    let expected = crate::schema_example::example_for_schema(&schema);
    // "call tool" would otherwise answer a tool call.
    let body = chat_body(
        "mock",
        "please call tool",
        json!({ "stream": false, "format": schema,
        "tools": [{ "type": "function", "function": { "name": "search", "parameters": {} } }] }),
    );
    let reply = json_of(post(&mock, "/api/chat", &body, None).await).await;
    let content = reply["message"]["content"].as_str().unwrap();
    assert_eq!(serde_json::from_str::<Value>(content).unwrap(), expected);
    assert!(reply["message"].get("tool_calls").is_none(), "{reply}");

    let body = chat_body("mock", "hi", json!({ "format": schema }));
    let lines = ndjson(&post(&mock, "/api/chat", &body, None).await.text().await.unwrap());
    let (_, chunks) = lines.split_last().unwrap();
    assert!(chunks.len() > 1, "streamed in pieces: {chunks:?}");
    let text: String = chunks.iter().map(|c| c["message"]["content"].as_str().unwrap()).collect();
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), expected);

    let response_format = json!({ "type": "json_schema", "json_schema": { "name": "a", "schema": schema } });
    let body = chat_body("mock", "hi", json!({ "response_format": response_format }));
    let reply = json_of(post(&mock, "/v1/chat/completions", &body, None).await).await;
    let content = reply["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(serde_json::from_str::<Value>(content).unwrap(), expected);

    for (path, extra) in [
        ("/api/chat", json!({ "stream": false, "format": "json" })),
        ("/v1/chat/completions", json!({ "format": schema, "response_format": { "type": "json_object" } })),
    ] {
        let reply = json_of(post(&mock, path, &chat_body("mock", "hi", extra), None).await).await;
        let content = reply.pointer("/message/content").or(reply.pointer("/choices/0/message/content"));
        assert_eq!(content.and_then(Value::as_str), Some(format!("{HELLO}hi").as_str()), "{path}");
    }
}

#[tokio::test]
async fn openai_stream_with_usage_and_done() {
    let mock = spawn(Faults::default()).await;
    let body = chat_body(
        "mock@words=3",
        "one two three",
        json!({ "stream": true, "stream_options": { "include_usage": true } }),
    );
    let resp = post(&mock, "/v1/chat/completions", &body, None).await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let events = sse(&resp.text().await.unwrap());
    assert_eq!(events.len(), 1 + 3 + 1 + 1 + 1, "{events:?}");
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..6].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], "mock@words=3");
        assert_eq!(chunk["created"], CREATED_UNIX);
        assert!(chunk["id"].as_str().unwrap().starts_with("chatcmpl-mock-"));
    }
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({ "role": "assistant", "content": "" }));
    let text: String = chunks[1..4].iter().map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap()).collect();
    assert_eq!(text, "w1 w2 w3");
    assert_eq!(chunks[4]["choices"][0]["delta"], json!({}));
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[5]["choices"], json!([]));
    assert_eq!(chunks[5]["usage"], json!({ "prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6 }));
}

#[tokio::test]
async fn openai_non_streaming_and_max_tokens() {
    let mock = spawn(Faults::default()).await;
    let body = chat_body("mock", "hello world", json!({}));
    let reply = json_of(post(&mock, "/v1/chat/completions", &body, None).await).await;
    assert_eq!(reply["object"], "chat.completion");
    assert_eq!(reply["created"], CREATED_UNIX);
    assert!(reply["id"].as_str().unwrap().starts_with("chatcmpl-mock-"));
    assert_eq!(reply["choices"][0]["message"]["role"], "assistant");
    assert_eq!(reply["choices"][0]["message"]["content"], format!("{HELLO}hello world"));
    assert_eq!(reply["choices"][0]["finish_reason"], "stop");
    assert_eq!(reply["usage"], json!({ "prompt_tokens": 2, "completion_tokens": 10, "total_tokens": 12 }));

    let body = chat_body("mock", "hello", json!({ "max_tokens": 3 }));
    let reply = json_of(post(&mock, "/v1/chat/completions", &body, None).await).await;
    assert_eq!(reply["choices"][0]["message"]["content"], "Hello from the");
    assert_eq!(reply["choices"][0]["finish_reason"], "length");
    assert_eq!(reply["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn tool_calls_on_both_apis() {
    let mock = spawn(Faults::default()).await;
    let body = chat_body("mock", "please call tool now", tools());
    let reply = json_of(post(&mock, "/v1/chat/completions", &body, None).await).await;
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["tool_calls"][0]["id"], TOOL_CALL_ID);
    assert_eq!(choice["message"]["tool_calls"][0]["function"]["name"], "search");
    assert_eq!(choice["message"]["tool_calls"][0]["function"]["arguments"], TOOL_ARGUMENTS);

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let events = sse(&post(&mock, "/v1/chat/completions", &streaming, None).await.text().await.unwrap());
    let deltas: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0].clone())
        .collect();
    let head = &deltas[1]["delta"]["tool_calls"][0];
    assert_eq!(head["id"], TOOL_CALL_ID);
    assert_eq!(head["type"], "function");
    assert_eq!(head["function"], json!({ "name": "search", "arguments": "" }));
    let arguments: String =
        deltas[2..4].iter().map(|d| d["delta"]["tool_calls"][0]["function"]["arguments"].as_str().unwrap()).collect();
    assert_eq!(arguments, TOOL_ARGUMENTS);
    assert_eq!(deltas[4]["finish_reason"], "tool_calls");

    let lines = ndjson(&post(&mock, "/api/chat", &body, None).await.text().await.unwrap());
    assert_eq!(lines.len(), 2);
    assert_eq!(
        lines[0]["message"]["tool_calls"],
        json!([{ "function": { "name": "search", "arguments": { "query": "mock" } } }])
    );
    assert_eq!(lines[1]["done"], true);
    assert_eq!(lines[1]["done_reason"], "stop");

    // Without the trigger phrase, tools are ignored.
    let body = chat_body("mock", "hello", tools());
    let reply = json_of(post(&mock, "/v1/chat/completions", &body, None).await).await;
    assert_eq!(reply["choices"][0]["finish_reason"], "stop");
}

/// The call's arguments fit the tool's schema (required properties with
/// values of their types), on both APIs; no schema gives `{}`.
#[tokio::test]
async fn tool_call_arguments_follow_the_tool_schema() {
    let mock = spawn(Faults::default()).await;
    let schema = json!({ "type": "object", "required": ["command", "timeout_ms"], "properties": {
        "command": { "type": "array", "items": { "type": "string" } },
        "timeout_ms": { "type": "integer", "minimum": 100 },
        "workdir": { "type": "string" },
    } });
    let want = json!({ "command": ["mock"], "timeout_ms": 100 });
    let tools = json!({ "tools": [{ "type": "function", "function": { "name": "shell", "parameters": schema } }] });
    let body = chat_body("mock", "call tool", tools);
    let reply = json_of(post(&mock, "/v1/chat/completions", &body, None).await).await;
    let arguments = reply["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].as_str().unwrap();
    assert_eq!(serde_json::from_str::<Value>(arguments).unwrap(), want);
    let lines = ndjson(&post(&mock, "/api/chat", &body, None).await.text().await.unwrap());
    assert_eq!(lines[0]["message"]["tool_calls"][0]["function"]["arguments"], want);

    let bare = json!({ "tools": [{ "type": "function", "function": { "name": "now" } }] });
    let reply = json_of(post(&mock, "/v1/chat/completions", &chat_body("mock", "call tool", bare), None).await).await;
    assert_eq!(reply["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{}");
}

#[tokio::test]
async fn both_chat_apis_continue_a_prefill_as_a_stream() {
    let mock = spawn(Faults::default()).await;
    let messages = json!([{ "role": "user", "content": "count" }, { "role": "assistant", "content": "w1 w2 w3 w4" }]);
    let body = json!({ "model": "mock@words=7", "messages": messages, "stream": true });
    let (ollama, broken) = read_lossy(post(&mock, "/api/chat", &body, None).await).await;
    assert!(!broken);
    let text: String = ndjson(&ollama).iter().filter_map(|l| l["message"]["content"].as_str()).collect();
    assert_eq!(text, " w5 w6 w7");
    let (openai, broken) = read_lossy(post(&mock, "/v1/chat/completions", &body, None).await).await;
    assert!(!broken);
    let text: String = sse(&openai)
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| {
            serde_json::from_str::<Value>(e).ok()?["choices"][0]["delta"]["content"].as_str().map(String::from)
        })
        .collect();
    assert_eq!(text, " w5 w6 w7");
    // llama.cpp's way: the prefill, then its continuation.
    let (openai, _) = read_lossy(post(&mock, "/v1/chat/completions", &body, Some("repeat_prefill")).await).await;
    let text: String = sse(&openai)
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| {
            serde_json::from_str::<Value>(e).ok()?["choices"][0]["delta"]["content"].as_str().map(String::from)
        })
        .collect();
    assert_eq!(text, "w1 w2 w3 w4 w5 w6 w7");
}

#[tokio::test]
async fn knob_sources_merge_in_order() {
    let mock = spawn(Faults { words: Some(3), ..Faults::default() }).await;
    let words = async |model: &str, header: Option<&str>| {
        let body = chat_body(model, "hi", json!({}));
        let reply = json_of(post(&mock, "/v1/chat/completions", &body, header).await).await;
        reply["usage"]["completion_tokens"].clone()
    };
    assert_eq!(words("mock", None).await, 3);
    assert_eq!(words("mock@words=4", None).await, 4);
    assert_eq!(words("mock@words=4", Some("words=5")).await, 5);
}

#[tokio::test]
async fn bad_knobs_are_400_in_the_api_shape() {
    let mock = spawn(Faults::default()).await;
    let body = chat_body("mock", "hi", json!({}));
    let resp = post(&mock, "/v1/chat/completions", &body, Some("bogus=1")).await;
    assert_eq!(resp.status(), 400);
    let error = json_of(resp).await;
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(error["error"]["message"].as_str().unwrap().contains("bogus"), "{error}");

    let body = chat_body("mock@stall_after=x", "hi", json!({}));
    let resp = post(&mock, "/api/chat", &body, None).await;
    assert_eq!(resp.status(), 400);
    assert!(json_of(resp).await["error"].as_str().unwrap().contains("stall_after"));
}

#[tokio::test]
async fn status_fault_with_retry_after() {
    let mock = spawn(Faults::default()).await;
    let body = chat_body("mock", "hi", json!({ "stream": true }));
    let resp = post(&mock, "/v1/chat/completions", &body, Some("status=429,retry_after=7")).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "7");
    assert!(json_of(resp).await["error"]["message"].is_string());

    let resp = post(&mock, "/api/chat", &body, Some("status=503")).await;
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().get("retry-after").is_none());
    assert!(json_of(resp).await["error"].is_string());

    // `error_code`: the OpenAI body's code; Ollama's string has none.
    let resp = post(&mock, "/v1/chat/completions", &body, Some("status=400,error_code=content_policy_violation")).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(json_of(resp).await["error"]["code"], "content_policy_violation");
    let resp = post(&mock, "/api/chat", &body, Some("status=400,error_code=content_policy_violation")).await;
    assert!(json_of(resp).await["error"].is_string());
}

#[tokio::test]
async fn fail_times_fails_the_first_n_requests_of_one_knob_set_only() {
    let mock = spawn(Faults::default()).await;
    let body = chat_body("mock@status=500,fail_times=2", "hi", json!({}));
    let other = chat_body("mock@status=500,fail_times=2,words=2", "hi", json!({}));
    let status = async |body: &Value| post(&mock, "/v1/chat/completions", body, None).await.status().as_u16();
    assert_eq!(status(&body).await, 500);
    assert_eq!(status(&other).await, 500, "another knob set counts on its own");
    assert_eq!(status(&body).await, 500);
    assert_eq!(status(&body).await, 200, "past N the knob set answers normally");
    assert_eq!(status(&other).await, 500);
    assert_eq!(status(&other).await, 200);
}

#[tokio::test]
async fn cut_after_ends_the_body_without_done() {
    let mock = spawn(Faults::default()).await;
    let body = chat_body("mock@cut_after=2", "hi", json!({}));
    let (text, aborted) = read_lossy(post(&mock, "/api/chat", &body, None).await).await;
    assert!(aborted, "the chunked body must end abnormally");
    let lines = ndjson(&text);
    assert_eq!(lines.len(), 2);
    assert!(lines.iter().all(|l| l["done"] == false));

    let body = chat_body("mock", "hi", json!({ "stream": true }));
    let resp = post(&mock, "/v1/chat/completions", &body, Some("cut_after=1")).await;
    let (text, aborted) = read_lossy(resp).await;
    assert!(aborted);
    assert_eq!(sse(&text).len(), 2); // role chunk + one content chunk
    assert!(!text.contains("[DONE]"));
}

#[tokio::test]
async fn malformed_at_replaces_one_chunk() {
    let mock = spawn(Faults::default()).await;
    let body = chat_body("mock@words=3,malformed_at=2", "hi", json!({ "stream": true }));
    let events = sse(&post(&mock, "/v1/chat/completions", &body, None).await.text().await.unwrap());
    assert_eq!(events[2], MALFORMED_JSON);
    assert!(serde_json::from_str::<Value>(&events[3]).is_ok());
    assert_eq!(events.last().unwrap(), "[DONE]");

    let body = chat_body("mock@words=3,malformed_at=1", "hi", json!({}));
    let text = post(&mock, "/api/chat", &body, None).await.text().await.unwrap();
    assert_eq!(text.lines().next().unwrap(), MALFORMED_JSON);
    assert_eq!(text.lines().count(), 4);
}

#[tokio::test]
async fn malformed_run_and_end_replace_chunks_in_a_row_and_the_reply_end() {
    let mock = spawn(Faults::default()).await;
    let body = chat_body("mock@words=5,malformed_at=2,malformed_run=3", "hi", json!({ "stream": true }));
    let events = sse(&post(&mock, "/v1/chat/completions", &body, None).await.text().await.unwrap());
    // role chunk, w1, three broken, w5, finish, usage?, [DONE]
    assert_eq!(events[2..5], [MALFORMED_JSON; 3]);
    assert!(serde_json::from_str::<Value>(&events[1]).is_ok());
    assert!(serde_json::from_str::<Value>(&events[5]).is_ok());
    assert_eq!(events.last().unwrap(), "[DONE]");

    let body = chat_body("mock@words=3,malformed_run=2", "hi", json!({}));
    let text = post(&mock, "/api/chat", &body, None).await.text().await.unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[..2], [MALFORMED_JSON; 2], "from the first chunk when malformed_at is unset");
    assert_eq!(lines.len(), 4);

    let body = chat_body("mock@words=3,malformed_end", "hi", json!({ "stream": true }));
    let events = sse(&post(&mock, "/v1/chat/completions", &body, None).await.text().await.unwrap());
    assert_eq!(events.len(), 5, "role chunk, three words, the broken end: {events:?}");
    assert_eq!(events.last().unwrap(), MALFORMED_JSON);
    let body = chat_body("mock@words=3,malformed_end", "hi", json!({}));
    let text = post(&mock, "/api/chat", &body, None).await.text().await.unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4);
    assert_eq!(*lines.last().unwrap(), MALFORMED_JSON);
    assert!(!text.contains("\"done\":true"), "{text}");
}

/// `(type, data)` of each typed SSE event (`event:` then `data:`).
fn typed_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (kind, data) = e.split_once('\n').expect("event and data lines");
            let kind = kind.strip_prefix("event: ").expect("event line").to_owned();
            (kind, serde_json::from_str(data.strip_prefix("data: ").expect("data line")).unwrap())
        })
        .collect()
}

#[tokio::test]
async fn responses_answer_the_same_reply_as_a_response_object() {
    let mock = spawn(Faults::default()).await;
    let body = json!({ "model": "mock", "instructions": "be brief", "input": [
        { "role": "user", "content": [{ "type": "input_text", "text": "hi there" }] },
    ] });
    let answer = json_of(post(&mock, "/v1/responses", &body, None).await).await;
    assert_eq!((answer["object"].as_str(), answer["status"].as_str()), (Some("response"), Some("completed")));
    assert!(answer["id"].as_str().unwrap().starts_with("resp_mock"), "{answer}");
    let item = &answer["output"][0];
    assert_eq!((item["type"].as_str(), item["role"].as_str()), (Some("message"), Some("assistant")));
    assert_eq!(item["content"][0]["text"], "Hello from the IOP mock provider. You said: hi there");
    // Words of the instructions and the input; one token per piece.
    assert_eq!(answer["usage"], json!({ "input_tokens": 4, "output_tokens": 10, "total_tokens": 14 }));

    let cut = json_of(
        post(&mock, "/v1/responses", &json!({ "model": "mock", "input": "hi", "max_output_tokens": 2 }), None).await,
    )
    .await;
    assert_eq!(cut["status"], "incomplete");
    assert_eq!(cut["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(cut["output"][0]["content"][0]["text"], "Hello from");
    assert_eq!(cut["output"][0]["status"], "incomplete");

    let tools = json!([{ "type": "function", "name": "search", "parameters": query_schema() }]);
    let call = json!({ "model": "mock", "input": "please call tool", "tools": tools });
    let answer = json_of(post(&mock, "/v1/responses", &call, None).await).await;
    let item = &answer["output"][0];
    assert_eq!((item["type"].as_str(), item["name"].as_str()), (Some("function_call"), Some("search")));
    assert_eq!(item["arguments"], TOOL_ARGUMENTS);
}

#[tokio::test]
async fn responses_stream_typed_events_in_sequence() {
    let mock = spawn(Faults::default()).await;
    let body = json!({ "model": "mock", "input": "hi", "stream": true, "reasoning": { "effort": "low" } });
    let response = post(&mock, "/v1/responses", &body, None).await;
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let events = typed_events(&response.text().await.unwrap());
    for (n, (kind, data)) in events.iter().enumerate() {
        assert_eq!((data["type"].as_str(), data["sequence_number"].as_u64()), (Some(kind.as_str()), Some(n as u64)));
    }
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds.first(), Some(&"response.created"));
    assert_eq!(kinds.last(), Some(&"response.completed"));
    let deltas = |kind: &str| -> String {
        events.iter().filter(|(k, _)| k == kind).map(|(_, d)| d["delta"].as_str().unwrap()).collect()
    };
    assert_eq!(deltas("response.output_text.delta"), "Hello from the IOP mock provider. You said: hi");
    assert_eq!(deltas("response.reasoning_text.delta"), "Thinking about: hi");
    let done = &events.last().unwrap().1["response"];
    assert_eq!(done["output"][1]["content"][0]["text"], "Hello from the IOP mock provider. You said: hi");
    assert_eq!(done["output"][0]["type"], "reasoning");
    assert!(done["usage"]["output_tokens"].as_u64().unwrap() > 0);

    // The fault knobs count the deltas.
    let body = json!({ "model": "mock@cut_after=2", "input": "hi", "stream": true });
    let (text, aborted) = read_lossy(post(&mock, "/v1/responses", &body, None).await).await;
    assert!(aborted);
    assert_eq!(text.matches("event: response.output_text.delta").count(), 2);
}

#[tokio::test]
async fn sse_line_end_writes_every_line_with_that_terminator() {
    let mock = spawn(Faults::default()).await;
    let body = chat_body("mock", "hi", json!({ "stream": true }));
    // Requests are numbered in their completion ids; the rest is equal.
    let lf = post(&mock, "/v1/chat/completions", &body, None).await.text().await.unwrap();
    for (n, end, terminator) in [(1, "cr", "\r"), (2, "crlf", "\r\n")] {
        let faults = format!("sse_line_end={end}");
        let text = post(&mock, "/v1/chat/completions", &body, Some(&faults)).await.text().await.unwrap();
        let text = text.replace(&format!("chatcmpl-mock-{n}"), "chatcmpl-mock-0");
        assert_eq!(text, lf.replace('\n', terminator), "{end}");
    }
    let ollama = post(&mock, "/api/chat", &body, Some("sse_line_end=cr")).await.text().await.unwrap();
    assert!(!ollama.contains('\r'), "NDJSON keeps its `\\n`");
}

#[tokio::test]
async fn no_done_omits_only_the_done_marker() {
    let mock = spawn(Faults::default()).await;
    let body =
        chat_body("mock@words=2,no_done", "hi", json!({ "stream": true, "stream_options": { "include_usage": true } }));
    let events = sse(&post(&mock, "/v1/chat/completions", &body, None).await.text().await.unwrap());
    assert_eq!(events.len(), 5);
    assert!(events.iter().all(|e| e != "[DONE]"));
    assert!(events[3].contains(r#""finish_reason":"stop""#));
    assert!(events[4].contains(r#""usage""#));
}

#[tokio::test]
async fn stall_after_then_client_drop_counts_as_aborted() {
    let mock = spawn(Faults::default()).await;
    let body = chat_body("mock@stall_after=2", "hi", json!({}));
    let mut resp = post(&mock, "/api/chat", &body, None).await;
    let mut buf = Vec::new();
    for _ in 0..2 {
        next_line(&mut resp, &mut buf).await.expect("content line");
    }
    let more = tokio::time::timeout(Duration::from_millis(300), next_line(&mut resp, &mut buf)).await;
    assert!(more.is_err(), "nothing may arrive after a stall: {more:?}");
    drop(resp);
    let stats = wait_for_stats(&mock, |s| s.aborted_streams == 1).await;
    assert_eq!(stats.aborted_streams, 1);
    assert_eq!(stats.completed_streams, 0);
}

#[tokio::test]
async fn shutdown_ends_stalled_streams() {
    let mock = spawn(Faults { stall_after: Some(0), ..Faults::default() }).await;
    let body = chat_body("mock", "hi", json!({}));
    let resp = post(&mock, "/api/chat", &body, None).await;
    let reading = tokio::spawn(read_lossy(resp));
    tokio::time::timeout(Duration::from_secs(2), mock.shutdown()).await.unwrap();
    let (text, aborted) = reading.await.unwrap();
    assert!(text.is_empty() && aborted);
}

#[tokio::test]
async fn delays_are_real_on_the_wire() {
    let mock = spawn(Faults::default()).await;
    let body = chat_body("mock@words=3", "hi", json!({}));

    let started = Instant::now();
    let resp = post(&mock, "/api/chat", &body, Some("headers_delay_ms=150")).await;
    assert!(started.elapsed() >= Duration::from_millis(150));
    resp.text().await.unwrap();

    let started = Instant::now();
    let faults = "first_token_delay_ms=300,chunk_delay_ms=50";
    let mut resp = post(&mock, "/api/chat", &body, Some(faults)).await;
    let headers_at = started.elapsed();
    let mut buf = Vec::new();
    next_line(&mut resp, &mut buf).await.unwrap();
    let first_at = started.elapsed();
    while next_line(&mut resp, &mut buf).await.is_some() {}
    assert!(headers_at < Duration::from_millis(300), "headers before the first token: {headers_at:?}");
    assert!(first_at >= Duration::from_millis(300));
    assert!(started.elapsed() >= Duration::from_millis(400));
}

#[tokio::test]
async fn never_answer_sends_no_headers() {
    let mock = spawn(Faults::default()).await;
    let body = chat_body("mock@never_answer", "hi", json!({}));
    let result = client()
        .post(format!("{}/v1/chat/completions", mock.base_url()))
        .timeout(Duration::from_millis(200))
        .body(body.to_string())
        .send()
        .await;
    assert!(result.unwrap_err().is_timeout());
    tokio::time::timeout(Duration::from_secs(2), mock.shutdown()).await.unwrap();
}

#[tokio::test]
async fn non_streaming_degradations() {
    let mock = spawn(Faults::default()).await;
    let body = chat_body("mock", "hi", json!({}));
    let resp = post(&mock, "/v1/chat/completions", &body, Some("malformed_at=1")).await;
    assert_eq!(resp.text().await.unwrap(), MALFORMED_JSON);
    let resp = post(&mock, "/v1/chat/completions", &body, Some("cut_after=1")).await;
    let (text, aborted) = read_lossy(resp).await;
    assert!(aborted && !text.is_empty() && serde_json::from_str::<Value>(&text).is_err());
}

// -- Request log ---------------------------------------------------------

#[tokio::test]
async fn request_log_records_provider_requests_with_bodies_as_sent() {
    let mock = spawn(Faults::default()).await;
    let chat = chat_body("mock", "hi", json!({ "stream": false, "temperature": 0.5 }));
    post(&mock, "/api/chat", &chat, None).await.text().await.unwrap();
    let url = |path: &str| format!("{}{path}", mock.base_url());
    let raw = client().post(url("/v1/chat/completions?trace=1")).body("not json").send().await.unwrap();
    assert_eq!(raw.status(), 400);
    get_json(&mock, "/api/tags").await;
    let missing = client().post(url("/nowhere")).body(r#"{"a":1}"#).send().await.unwrap();
    assert_eq!(missing.status(), 404);
    // Neither the mock's own routes nor `/healthz` are logged.
    get_json(&mock, "/mock/stats").await;
    client().get(url("/healthz")).send().await.unwrap();
    // A request the API key refuses still reached the provider.
    client().post(url("/mock/api-key")).body("k").send().await.unwrap();
    let refused = post(&mock, "/v1/embeddings", &json!({ "model": "mock", "input": "x" }), None).await;
    assert_eq!(refused.status(), 401);

    let expected = json!([
        { "method": "POST", "path": "/api/chat", "body": chat },
        { "method": "POST", "path": "/v1/chat/completions", "body": "not json" },
        { "method": "GET", "path": "/api/tags", "body": "" },
        { "method": "POST", "path": "/nowhere", "body": { "a": 1 } },
        { "method": "POST", "path": "/v1/embeddings", "body": { "model": "mock", "input": "x" } },
    ]);
    // Headers as received (checked by the set_cookie test); here only
    // what the request line and body say.
    let without_headers = |mut log: Value| {
        for entry in log.as_array_mut().unwrap() {
            entry.as_object_mut().unwrap().remove("headers");
        }
        log
    };
    assert_eq!(without_headers(get_json(&mock, "/mock/requests").await), expected);
    assert_eq!(without_headers(serde_json::to_value(mock.requests()).unwrap()), expected);
}

#[tokio::test]
async fn request_log_keeps_the_last_100_oldest_first_and_resets() {
    let mock = spawn(Faults::default()).await;
    // One client: one connection for all of them.
    let one = client();
    for i in 0..REQUEST_LOG_LIMIT + 5 {
        let body = json!({ "content": format!("n{i}") }).to_string();
        one.post(format!("{}/tokenize", mock.base_url())).body(body).send().await.unwrap();
    }
    let log: Vec<RecordedRequest> = serde_json::from_value(get_json(&mock, "/mock/requests").await).unwrap();
    assert_eq!(log.len(), REQUEST_LOG_LIMIT);
    let contents: Vec<Value> = log.iter().map(|r| r.body["content"].clone()).collect();
    let expected: Vec<Value> = (5..REQUEST_LOG_LIMIT + 5).map(|i| json!(format!("n{i}"))).collect();
    assert_eq!(contents, expected);

    let reset = client().post(format!("{}/mock/requests/reset", mock.base_url())).send().await.unwrap();
    assert_eq!(reset.status(), 204);
    assert_eq!(get_json(&mock, "/mock/requests").await, json!([]));
    post(&mock, "/tokenize", &json!({ "content": "again" }), None).await;
    let logged = mock.requests();
    assert!(logged[0].headers.contains(&("content-type".into(), "application/json".into())), "{logged:?}");
    assert_eq!(
        logged.into_iter().map(|r| RecordedRequest { headers: vec![], ..r }).collect::<Vec<_>>(),
        [RecordedRequest {
            method: "POST".into(),
            path: "/tokenize".into(),
            body: json!({ "content": "again" }),
            headers: vec![],
        }]
    );
}

// -- Embeddings and tokens -----------------------------------------------

/// A JSON array of numbers as `f32`s (exact for numbers written from `f32`s).
fn floats(value: &Value) -> Vec<f32> {
    value.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

#[tokio::test]
async fn ollama_embed_batch_shape_and_determinism() {
    let mock = spawn(Faults::default()).await;
    let body = json!({ "model": "mock", "input": ["hello world", "bye", "hello world"] });
    let reply = json_of(post(&mock, "/api/embed", &body, None).await).await;
    let embeddings = reply["embeddings"].as_array().unwrap();
    let vectors: Vec<Vec<f32>> = embeddings.iter().map(floats).collect();
    assert_eq!(
        vectors,
        [embedding("hello world").to_vec(), embedding("bye").to_vec(), embedding("hello world").to_vec()]
    );
    let mut rest = reply.clone();
    rest.as_object_mut().unwrap().remove("embeddings");
    assert_eq!(rest, json!({ "model": "mock", "total_duration": 0, "load_duration": 0, "prompt_eval_count": 5 }));

    // A single string; the same text, the same vector in another request.
    let reply = json_of(post(&mock, "/api/embed", &json!({ "model": "m", "input": "bye" }), None).await).await;
    assert_eq!(reply["embeddings"].as_array().unwrap().len(), 1);
    assert_eq!(floats(&reply["embeddings"][0]), vectors[1]);
    assert_eq!((reply["model"].clone(), reply["prompt_eval_count"].clone()), (json!("m"), json!(1)));
}

#[tokio::test]
async fn openai_embeddings_shape_base64_and_dimensions() {
    let mock = spawn(Faults::default()).await;
    let embed = async |extra: Value| {
        let mut body = json!({ "model": "mock", "input": ["a b", "c"] });
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let resp = post(&mock, "/v1/embeddings", &body, None).await;
        assert_eq!(resp.status(), 200);
        json_of(resp).await
    };

    let reply = embed(json!({})).await;
    assert_eq!(reply["object"], "list");
    assert_eq!(reply["model"], "mock");
    assert_eq!(reply["usage"], json!({ "prompt_tokens": 3, "total_tokens": 3 }));
    let data = reply["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    for (index, (item, text)) in data.iter().zip(["a b", "c"]).enumerate() {
        assert_eq!((item["object"].clone(), item["index"].clone()), (json!("embedding"), json!(index)));
        assert_eq!(floats(&item["embedding"]), embedding(text));
    }
    assert_eq!(embed(json!({ "encoding_format": "float" })).await, reply);

    let reply = embed(json!({ "encoding_format": "base64" })).await;
    assert_eq!(reply["data"][0]["embedding"], base64_f32s(&embedding("a b")));
    assert_eq!(reply["data"][1]["embedding"], base64_f32s(&embedding("c")));
    assert_eq!(reply["data"][0]["embedding"].as_str().unwrap().len(), 44, "32 bytes of base64");

    let reply = embed(json!({ "dimensions": 3 })).await;
    assert_eq!(floats(&reply["data"][0]["embedding"]), shortened_embedding("a b", 3));
    assert_eq!(floats(&reply["data"][1]["embedding"]).len(), 3);

    let reply = embed(json!({ "dimensions": 2, "encoding_format": "base64" })).await;
    assert_eq!(reply["data"][1]["embedding"], base64_f32s(&shortened_embedding("c", 2)));
}

#[tokio::test]
async fn bad_embedding_input_is_400_in_the_api_shape() {
    let mock = spawn(Faults::default()).await;
    let inputs = [json!(null), json!([]), json!([1, 2]), json!([["a"]]), json!(7), json!(["a", null])];
    for input in inputs {
        let mut body = json!({ "model": "mock" });
        if !input.is_null() {
            body["input"] = input;
        }
        let resp = post(&mock, "/v1/embeddings", &body, None).await;
        assert_eq!(resp.status(), 400, "{body}");
        let error = json_of(resp).await;
        assert_eq!(error["error"]["type"], "invalid_request_error");
        assert!(error["error"]["message"].as_str().unwrap().contains("`input`"), "{error}");
        let resp = post(&mock, "/api/embed", &body, None).await;
        assert_eq!(resp.status(), 400, "{body}");
        assert!(json_of(resp).await["error"].as_str().unwrap().contains("`input`"));
    }

    let options = [
        json!({ "encoding_format": "hex" }),
        json!({ "encoding_format": 1 }),
        json!({ "dimensions": 0 }),
        json!({ "dimensions": EMBEDDING_DIMENSIONS + 1 }),
        json!({ "dimensions": "2" }),
    ];
    for extra in options {
        let mut body = json!({ "model": "mock", "input": "a" });
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let resp = post(&mock, "/v1/embeddings", &body, None).await;
        assert_eq!(resp.status(), 400, "{body}");
        assert_eq!(json_of(resp).await["error"]["type"], "invalid_request_error");
        // They are OpenAI's: Ollama ignores them.
        assert_eq!(post(&mock, "/api/embed", &body, None).await.status(), 200, "{body}");
    }

    for path in ["/v1/embeddings", "/api/embed"] {
        let resp = post(&mock, path, &json!({ "input": "a" }), None).await;
        assert_eq!(resp.status(), 400);
        assert!(json_of(resp).await.to_string().contains("model"));
    }
}

#[tokio::test]
async fn fault_knobs_apply_to_embeddings() {
    let mock = spawn(Faults::default()).await;
    let body = json!({ "model": "mock@status=503,retry_after=2", "input": "x" });
    let resp = post(&mock, "/v1/embeddings", &body, None).await;
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "2");
    assert_eq!(json_of(resp).await["error"]["type"], "server_error");

    let body = json!({ "model": "mock", "input": "x" });
    let resp = post(&mock, "/api/embed", &body, Some("status=429")).await;
    assert_eq!(resp.status(), 429);
    assert!(json_of(resp).await["error"].is_string());
    let resp = post(&mock, "/api/embed", &body, Some("bogus=1")).await;
    assert_eq!(resp.status(), 400);

    // The chunk knobs and `words` do not apply; embeddings are no chat requests.
    let resp = post(&mock, "/v1/embeddings", &body, Some("words=2,stall_after=0,malformed_at=1")).await;
    assert_eq!(floats(&json_of(resp).await["data"][0]["embedding"]), embedding("x"));
    assert_eq!(mock.stats().requests_total, 0);
}

#[tokio::test]
async fn tokenize_counts_the_chat_prompt_tokens() {
    let mock = spawn(Faults::default()).await;
    let text = "one two  three one";
    let reply = json_of(post(&mock, "/tokenize", &json!({ "content": text }), None).await).await;
    assert_eq!(reply, json!({ "tokens": tokenize(text) }));
    assert_eq!(reply["tokens"].as_array().unwrap().len(), 4);
    let chat = json_of(post(&mock, "/v1/chat/completions", &chat_body("mock", text, json!({})), None).await).await;
    assert_eq!(chat["usage"]["prompt_tokens"], 4);

    let messages = json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]);
    let chat =
        json_of(post(&mock, "/v1/chat/completions", &json!({"model": "mock", "messages": messages}), None).await).await;
    let template =
        json_of(post(&mock, "/apply-template", &json!({"model": "mock", "messages": messages}), None).await).await;
    assert_eq!(template, json!({ "prompt": "be brief\none two  three one" }));
    let counted = json_of(post(&mock, "/tokenize", &json!({ "content": template["prompt"] }), None).await).await;
    assert_eq!(counted["tokens"].as_array().unwrap().len(), 6);
    assert_eq!(chat["usage"]["prompt_tokens"], 6);

    let resp = post(&mock, "/apply-template", &json!({ "prompt": "x" }), None).await;
    assert_eq!(resp.status(), 400);
    for bad in [json!({}), json!({ "content": 1 }), json!("one")] {
        let resp = post(&mock, "/tokenize", &bad, None).await;
        assert_eq!(resp.status(), 400, "{bad}");
        assert_eq!(json_of(resp).await["error"]["type"], "invalid_request_error");
    }
    // Ollama has no tokenizer endpoint.
    assert_eq!(post(&mock, "/api/tokenize", &json!({ "content": text }), None).await.status(), 404);
}

// -- Images and reasoning ------------------------------------------------

#[tokio::test]
async fn images_are_counted_in_the_echo_on_both_apis() {
    let mock = spawn_scripted(SCRIPT_FILE).await;
    let ollama = json!({ "model": "mock", "stream": false, "messages": [
        { "role": "user", "content": "first", "images": ["aGk="] },
        { "role": "assistant", "content": "ok", "images": null },
        { "role": "user", "content": "what is this?", "images": ["aGk=", "aGk="] },
    ] });
    let reply = json_of(post(&mock, "/api/chat", &ollama, None).await).await;
    assert_eq!(reply["message"]["content"], format!("{HELLO}what is this? [images: 3]"));
    assert_eq!(reply["prompt_eval_count"], 5, "images are no words");
    let mut streaming = ollama.clone();
    streaming["stream"] = json!(true);
    let lines = ndjson(&post(&mock, "/api/chat", &streaming, None).await.text().await.unwrap());
    let text: String = lines.iter().map(|l| l["message"]["content"].as_str().unwrap()).collect();
    assert_eq!(text, format!("{HELLO}what is this? [images: 3]"));

    let openai = json!({ "model": "mock", "messages": [{ "role": "user", "content": [
        { "type": "text", "text": "describe" },
        { "type": "image_url", "image_url": { "url": "data:image/png;base64,aGk=" } },
        { "type": "image_url", "image_url": { "url": "https://example.com/a.png" } },
    ] }] });
    let reply = json_of(post(&mock, "/v1/chat/completions", &openai, None).await).await;
    assert_eq!(reply["choices"][0]["message"]["content"], format!("{HELLO}describe [images: 2]"));
    let mut streaming = openai.clone();
    streaming["stream"] = json!(true);
    let text = post(&mock, "/v1/chat/completions", &streaming, None).await.text().await.unwrap();
    assert_eq!(openai_stream_text(&text).0, format!("{HELLO}describe [images: 2]"));

    // Only the echo shows the count: not `words`, not a scripted turn.
    let mut words = openai.clone();
    words["model"] = json!("mock@words=2");
    let reply = json_of(post(&mock, "/v1/chat/completions", &words, None).await).await;
    assert_eq!(reply["choices"][0]["message"]["content"], "w1 w2");
    let mut scripted = openai.clone();
    scripted["messages"][0]["content"][0]["text"] = json!("iop-mock-script:greet");
    let reply = json_of(post(&mock, "/v1/chat/completions", &scripted, None).await).await;
    assert_eq!(reply["choices"][0]["message"]["content"], "hi there friend");
}

const THINKING: [&str; 4] = ["Thinking", " about:", " hi", " there"];

#[tokio::test]
async fn ollama_reasoning_in_thinking_streaming_or_not() {
    let mock = spawn(Faults::default()).await;
    let reply_text = format!("{HELLO}hi there");

    for think in [json!(true), json!("high")] {
        let body = chat_body("mock", "hi there", json!({ "stream": false, "think": think }));
        let reply = json_of(post(&mock, "/api/chat", &body, None).await).await;
        assert_eq!(
            reply["message"],
            json!({ "role": "assistant", "content": reply_text, "thinking": "Thinking about: hi there" })
        );
        assert_eq!((reply["prompt_eval_count"].clone(), reply["eval_count"].clone()), (json!(2), json!(14)));
    }

    let body = chat_body("mock", "hi there", json!({ "think": "high" }));
    let lines = ndjson(&post(&mock, "/api/chat", &body, None).await.text().await.unwrap());
    assert_eq!(lines.len(), 4 + 10 + 1);
    for (line, piece) in lines.iter().zip(THINKING) {
        assert_eq!(line["message"], json!({ "role": "assistant", "content": "", "thinking": piece }));
        assert_eq!(line["done"], false);
    }
    assert!(lines[4..].iter().all(|l| l["message"].get("thinking").is_none()));
    let text: String = lines[4..].iter().map(|l| l["message"]["content"].as_str().unwrap()).collect();
    assert_eq!(text, reply_text);
    assert_eq!((lines[14]["done"].clone(), lines[14]["eval_count"].clone()), (json!(true), json!(14)));

    // Reasoning chunks are content chunks for the knobs.
    let (text, aborted) = read_lossy(post(&mock, "/api/chat", &body, Some("cut_after=2")).await).await;
    assert!(aborted);
    let thinking: Vec<Value> = ndjson(&text).iter().map(|l| l["message"]["thinking"].clone()).collect();
    assert_eq!(thinking, [json!("Thinking"), json!(" about:")]);

    // Without the switch, nothing changes.
    for extra in [json!({ "stream": false }), json!({ "stream": false, "think": false })] {
        let reply = json_of(post(&mock, "/api/chat", &chat_body("mock", "hi there", extra), None).await).await;
        assert_eq!(reply["message"], json!({ "role": "assistant", "content": reply_text }));
        assert_eq!(reply["eval_count"], 10);
    }
}

#[tokio::test]
async fn openai_reasoning_in_reasoning_content_streaming_or_not() {
    let mock = spawn(Faults::default()).await;
    let reply_text = format!("{HELLO}hi there");

    let body = chat_body("mock", "hi there", json!({ "reasoning_effort": "low" }));
    let reply = json_of(post(&mock, "/v1/chat/completions", &body, None).await).await;
    assert_eq!(
        reply["choices"][0]["message"],
        json!({ "role": "assistant", "content": reply_text, "reasoning_content": "Thinking about: hi there" })
    );
    assert_eq!(reply["usage"], json!({ "prompt_tokens": 2, "completion_tokens": 14, "total_tokens": 16 }));

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    streaming["stream_options"] = json!({ "include_usage": true });
    let text = post(&mock, "/v1/chat/completions", &streaming, None).await.text().await.unwrap();
    let events = sse(&text);
    assert_eq!(events.len(), 1 + 4 + 10 + 1 + 1 + 1, "{events:?}");
    let delta = |i: usize| serde_json::from_str::<Value>(&events[i]).unwrap()["choices"][0]["delta"].clone();
    assert_eq!(delta(0), json!({ "role": "assistant", "content": "" }));
    for (i, piece) in (1..).zip(THINKING) {
        assert_eq!(delta(i), json!({ "reasoning_content": piece }));
    }
    assert_eq!(delta(5), json!({ "content": "Hello" }));
    let content: String = (5..15).map(|i| delta(i)["content"].as_str().unwrap().to_owned()).collect();
    assert_eq!(content, reply_text);
    let finish: Value = serde_json::from_str(&events[15]).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    let usage: Value = serde_json::from_str(&events[16]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 14);

    // Reasoning comes before a tool call too.
    let mut tool = chat_body("mock", "call tool", tools());
    tool["reasoning_effort"] = json!("high");
    let reply = json_of(post(&mock, "/v1/chat/completions", &tool, None).await).await;
    let message = &reply["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "Thinking about: call tool");
    assert_eq!(message["tool_calls"][0]["function"]["name"], "search");
    assert_eq!(reply["usage"]["completion_tokens"], 2 + 4, "two argument pieces and four of reasoning");

    // Without the switch (null, or Ollama's `think`), nothing changes.
    for extra in [json!({ "reasoning_effort": null }), json!({ "think": true })] {
        let body = chat_body("mock", "hi there", extra);
        let reply = json_of(post(&mock, "/v1/chat/completions", &body, None).await).await;
        assert_eq!(reply["choices"][0]["message"], json!({ "role": "assistant", "content": reply_text }));
        assert_eq!(reply["usage"]["completion_tokens"], 10);
    }
}

// -- Scripted turns ------------------------------------------------------

async fn spawn_scripted(yaml: &str) -> MockHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let scripts = Some(Scripts::from_yaml(yaml).unwrap());
    start(listener, MockConfig { scripts, ..MockConfig::default() }).await
}

/// The text of a streamed OpenAI reply and its finish reason.
fn openai_stream_text(body: &str) -> (String, Value) {
    let events = sse(body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let text = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    (text, chunks.last().unwrap()["choices"][0]["finish_reason"].clone())
}

#[tokio::test]
async fn scripted_text_on_both_apis_streaming_or_not() {
    let mock = spawn_scripted(SCRIPT_FILE).await;
    let prompt = "iop-mock-script:greet say hi";

    let reply = json_of(post(&mock, "/v1/chat/completions", &chat_body("mock", prompt, json!({})), None).await).await;
    assert_eq!(reply["choices"][0]["message"], json!({ "role": "assistant", "content": "hi there friend" }));
    assert_eq!(reply["choices"][0]["finish_reason"], "stop");
    assert_eq!(reply["usage"], json!({ "prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6 }));

    let body = chat_body("mock", prompt, json!({ "stream": true }));
    let text = post(&mock, "/v1/chat/completions", &body, None).await.text().await.unwrap();
    let events = sse(&text);
    let pieces: Vec<Value> = events[1..4]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["delta"]["content"].clone())
        .collect();
    assert_eq!(pieces, [json!("hi"), json!(" there"), json!(" friend")]);
    assert_eq!(openai_stream_text(&text), ("hi there friend".to_owned(), json!("stop")));

    let body = chat_body("mock", prompt, json!({ "stream": false }));
    let reply = json_of(post(&mock, "/api/chat", &body, None).await).await;
    assert_eq!(reply["message"], json!({ "role": "assistant", "content": "hi there friend" }));
    assert_eq!((reply["prompt_eval_count"].clone(), reply["eval_count"].clone()), (json!(3), json!(3)));

    let lines =
        ndjson(&post(&mock, "/api/chat", &chat_body("mock", prompt, json!({})), None).await.text().await.unwrap());
    let contents: Vec<&str> = lines.iter().map(|l| l["message"]["content"].as_str().unwrap()).collect();
    assert_eq!(contents, ["hi", " there", " friend", ""]);
    assert_eq!(lines[3]["done"], true);
    assert_eq!(lines[3]["eval_count"], 3);

    // The limit truncates scripted text like the echo.
    let body = chat_body("mock", prompt, json!({ "max_tokens": 2 }));
    let reply = json_of(post(&mock, "/v1/chat/completions", &body, None).await).await;
    assert_eq!(reply["choices"][0]["message"]["content"], "hi there");
    assert_eq!(reply["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn scripted_tool_calls_on_both_apis_streaming_or_not() {
    let mock = spawn_scripted(SCRIPT_FILE).await;
    // Turn 2 of fix-readme has two calls; step past turns 0 and 1.
    let body = chat_body("mock", "iop-mock-script:fix-readme", json!({ "stream": false }));
    for _ in 0..2 {
        post(&mock, "/api/chat", &body, None).await.text().await.unwrap();
    }
    // serde_json's map sorts the keys.
    let write_args = r#"{"content":"x","path":"a.txt"}"#;

    // The last turn repeats, so rewind to replay turn 2 for each form.
    let replay = async || {
        let reset = client().post(format!("{}/mock/scripts/reset", mock.base_url())).send().await.unwrap();
        assert_eq!(reset.status(), 204);
        for _ in 0..2 {
            post(&mock, "/api/chat", &body, None).await.text().await.unwrap();
        }
    };

    // OpenAI, non-streaming: ids count scripted calls (turn 0 had call_0).
    let reply = json_of(post(&mock, "/v1/chat/completions", &body, None).await).await;
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(
        choice["message"],
        json!({ "role": "assistant", "content": null, "tool_calls": [
            { "id": "call_1", "type": "function",
              "function": { "name": "workspace_write", "arguments": write_args } },
            { "id": "call_2", "type": "function",
              "function": { "name": "workspace_list", "arguments": "{}" } },
        ] })
    );
    assert_eq!(reply["usage"], json!({ "prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3 }));

    // OpenAI, streaming: per call a head delta, then the arguments in two pieces.
    replay().await;
    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    streaming["stream_options"] = json!({ "include_usage": true });
    let events = sse(&post(&mock, "/v1/chat/completions", &streaming, None).await.text().await.unwrap());
    assert_eq!(events.len(), 1 + 2 * 3 + 1 + 1 + 1, "{events:?}");
    let chunks: Vec<Value> = events[..8].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let deltas: Vec<&Value> = chunks[1..7].iter().map(|c| &c["choices"][0]["delta"]["tool_calls"][0]).collect();
    assert_eq!(
        *deltas[0],
        json!({ "index": 0, "id": "call_4", "type": "function",
                "function": { "name": "workspace_write", "arguments": "" } })
    );
    assert_eq!(
        *deltas[3],
        json!({ "index": 1, "id": "call_5", "type": "function",
                "function": { "name": "workspace_list", "arguments": "" } })
    );
    let arguments = |ds: &[&Value]| -> String {
        ds.iter()
            .inspect(|d| assert!(d.get("id").is_none()))
            .map(|d| d["function"]["arguments"].as_str().unwrap())
            .collect()
    };
    assert_eq!(arguments(&deltas[1..3]), write_args);
    assert_eq!(deltas[1]["index"], 0);
    assert_eq!(arguments(&deltas[4..6]), "{}");
    assert_eq!(deltas[4]["index"], 1);
    assert_eq!(chunks[7]["choices"][0]["finish_reason"], "tool_calls");
    let usage: Value = serde_json::from_str(&events[8]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 2);

    // Ollama, non-streaming and streaming: one message with both calls.
    let ollama_calls = json!([
        { "function": { "name": "workspace_write", "arguments": { "path": "a.txt", "content": "x" } } },
        { "function": { "name": "workspace_list", "arguments": {} } },
    ]);
    replay().await;
    let reply = json_of(post(&mock, "/api/chat", &body, None).await).await;
    assert_eq!(reply["message"], json!({ "role": "assistant", "content": "", "tool_calls": ollama_calls }));
    assert_eq!((reply["done_reason"].clone(), reply["eval_count"].clone()), (json!("stop"), json!(2)));

    replay().await;
    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let lines = ndjson(&post(&mock, "/api/chat", &streaming, None).await.text().await.unwrap());
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["done"], false);
    assert_eq!(lines[0]["message"]["tool_calls"], ollama_calls);
    assert_eq!(lines[1]["done"], true);
    assert_eq!(lines[1]["eval_count"], 2);
}

#[tokio::test]
async fn script_cursors_advance_repeat_the_last_turn_and_reset() {
    let mock =
        spawn_scripted("scripts:\n  a:\n    - text: one\n    - text: two\n  b:\n    - text: bee\n    - text: bee2\n")
            .await;
    let say = async |script: &str| {
        let body = chat_body("mock", &format!("go iop-mock-script:{script}"), json!({}));
        let reply = json_of(post(&mock, "/v1/chat/completions", &body, None).await).await;
        reply["choices"][0]["message"]["content"].as_str().unwrap().to_owned()
    };
    assert_eq!(say("a").await, "one");
    assert_eq!(say("a").await, "two");
    assert_eq!(say("b").await, "bee", "b has its own cursor");
    assert_eq!(say("a").await, "two", "past the end the last turn repeats");
    assert_eq!(say("b").await, "bee2");
    assert_eq!(mock.stats().scripts, BTreeMap::from([("a".to_owned(), 3), ("b".to_owned(), 2)]));
    assert_eq!(get_json(&mock, "/mock/stats").await["scripts"], json!({ "a": 3, "b": 2 }));

    // Without a marker, the echo; no cursor moves.
    let reply = json_of(post(&mock, "/v1/chat/completions", &chat_body("mock", "a", json!({})), None).await).await;
    assert_eq!(reply["choices"][0]["message"]["content"], format!("{HELLO}a"));

    let reset = client().post(format!("{}/mock/scripts/reset", mock.base_url())).send().await.unwrap();
    assert_eq!(reset.status(), 204);
    assert!(get_json(&mock, "/mock/stats").await.get("scripts").is_none());
    assert_eq!(say("a").await, "one");
    assert_eq!(say("b").await, "bee");
}

#[tokio::test]
async fn unknown_script_is_400_in_the_api_shape() {
    let mock = spawn_scripted(SCRIPT_FILE).await;
    let body = chat_body("mock", "iop-mock-script:nope", json!({ "stream": true }));
    let resp = post(&mock, "/v1/chat/completions", &body, None).await;
    assert_eq!(resp.status(), 400);
    let error = json_of(resp).await;
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(error["error"]["message"].as_str().unwrap().contains("`nope`"), "{error}");

    let resp = post(&mock, "/api/chat", &body, None).await;
    assert_eq!(resp.status(), 400);
    assert!(json_of(resp).await["error"].as_str().unwrap().contains("`nope`"));
    assert!(mock.stats().scripts.is_empty());

    // A mock without a script file refuses every marker.
    let plain = spawn(Faults::default()).await;
    let resp = post(&plain, "/api/chat", &chat_body("mock", "iop-mock-script:greet", json!({})), None).await;
    assert_eq!(resp.status(), 400);
    assert!(json_of(resp).await["error"].as_str().unwrap().contains("`greet`"));
}

#[tokio::test]
async fn fault_knobs_apply_to_scripted_replies() {
    let mock = spawn_scripted(SCRIPT_FILE).await;
    let body = chat_body("mock", "iop-mock-script:greet", json!({ "stream": true }));

    // A fault status takes no turn: the retry gets the same one.
    let resp = post(&mock, "/v1/chat/completions", &body, Some("status=429,retry_after=1")).await;
    assert_eq!(resp.status(), 429);
    assert!(mock.stats().scripts.is_empty());

    // `words` does not replace the script's text; chunk knobs still apply.
    let resp = post(&mock, "/v1/chat/completions", &body, Some("words=9,cut_after=2")).await;
    let (text, aborted) = read_lossy(resp).await;
    assert!(aborted && !text.contains("[DONE]"));
    assert_eq!(openai_stream_text(&format!("{text}data: [DONE]\n\n")).0, "hi there");
    assert_eq!(mock.stats().scripts["greet"], 1);

    // A held request takes its turn once released.
    let held = tokio::spawn({
        let url = format!("{}/v1/chat/completions", mock.base_url());
        let body = chat_body("mock", "iop-mock-script:fix-readme", json!({}));
        async move {
            let resp = client().post(url).header(FAULTS_HEADER, "hold=h").body(body.to_string()).send().await;
            json_of(resp.unwrap()).await
        }
    });
    wait_for_stats(&mock, |s| s.requests_total == 3).await;
    assert!(!mock.stats().scripts.contains_key("fix-readme"));
    client().post(format!("{}/mock/release/h", mock.base_url())).send().await.unwrap();
    let reply = held.await.unwrap();
    assert_eq!(reply["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "workspace_read");
    assert_eq!(mock.stats().scripts["fix-readme"], 1);
}

// -- Residency ----------------------------------------------------------

async fn spawn_resident(residency: ResidencyConfig) -> MockHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    start(listener, MockConfig { residency, ..MockConfig::default() }).await
}

fn cold(load_delay_ms: u64) -> ResidencyConfig {
    ResidencyConfig { loaded: false, load_delay_ms, ..ResidencyConfig::default() }
}

async fn get(mock: &MockHandle, path: &str) -> (u16, Value) {
    let resp = client().get(format!("{}{path}", mock.base_url())).send().await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

async fn set_residency(mock: &MockHandle, body: &str) -> u16 {
    let url = format!("{}/mock/residency", mock.base_url());
    client().post(url).body(body.to_owned()).send().await.unwrap().status().as_u16()
}

/// The names `/api/ps` lists.
async fn ps_names(mock: &MockHandle) -> Vec<String> {
    let (status, ps) = get(mock, "/api/ps").await;
    assert_eq!(status, 200);
    ps["models"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap().to_owned()).collect()
}

/// Each residency endpoint in its server's shape while resident, for
/// every model a request named (by its base name).
#[tokio::test]
async fn residency_endpoints_in_each_servers_shape_while_resident() {
    let mock = spawn_resident(ResidencyConfig::default()).await;
    assert_eq!(ps_names(&mock).await, ["mock:latest"], "the mock's own model from the start");
    let shown = post(&mock, "/api/show", &json!({ "model": "llama3.2:3b" }), None).await;
    assert_eq!(shown.status(), 200);
    let chat = post(&mock, "/v1/chat/completions", &chat_body("qwen@words=2", "hi", json!({})), None).await;
    assert_eq!(chat.status(), 200);
    chat.bytes().await.unwrap();
    // A bad knob: the request answers 400, but it named the model.
    let embed = json!({ "model": "nomic-embed@words=1", "input": "a" });
    assert_eq!(post(&mock, "/api/embed", &embed, Some("bogus=1")).await.status(), 400);

    let (status, ps) = get(&mock, "/api/ps").await;
    assert_eq!(status, 200);
    let names: Vec<&str> = ps["models"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["llama3.2:3b", "mock:latest", "nomic-embed:latest", "qwen:latest"]);
    let entry = &ps["models"][0];
    assert_eq!(entry["model"], "llama3.2:3b");
    assert_eq!(entry["size"], MODEL_SIZE_BYTES);
    assert_eq!(entry["size_vram"], MODEL_SIZE_BYTES);
    let expires = entry["expires_at"].as_str().unwrap();
    assert!(expires.len() == 20 && expires.ends_with('Z') && expires.as_bytes()[10] == b'T', "{expires}");
    assert_eq!(entry["details"]["format"], "gguf");

    let (status, props) = get(&mock, "/props").await;
    assert_eq!(status, 200);
    assert_eq!(props["default_generation_settings"]["n_ctx"], MODEL_CONTEXT_LENGTH);
    assert_eq!(props["total_slots"], 1);
    assert!(props["model_path"].as_str().unwrap().ends_with(".gguf"));
    assert_eq!(props["modalities"], json!({ "vision": true, "audio": false }));

    // Any name, learned from the call (slashes included).
    let (status, one) = get(&mock, "/api/v0/models/lmstudio-community/gemma@words=1").await;
    assert_eq!(status, 200);
    assert_eq!(
        (&one["id"], &one["object"], &one["type"], &one["state"]),
        (&json!("lmstudio-community/gemma"), &json!("model"), &json!("vlm"), &json!("loaded"))
    );
    assert_eq!(one["max_context_length"], MODEL_CONTEXT_LENGTH);
    let (status, list) = get(&mock, "/api/v0/models").await;
    assert_eq!(status, 200);
    assert_eq!(list["object"], "list");
    let ids: Vec<&str> = list["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["llama3.2:3b", "lmstudio-community/gemma", "mock", "nomic-embed", "qwen"]);
    assert!(list["data"].as_array().unwrap().iter().all(|m| m["state"] == "loaded" && m["type"] == "vlm"));
    // A text-only model (its knob), as LM Studio and llama.cpp say it.
    let (_, text_only) = get(&mock, "/api/v0/models/gemma@text_only").await;
    assert_eq!((&text_only["id"], &text_only["type"]), (&json!("gemma"), &json!("llm")));
    // llama.cpp serves one model: once a text-only one was named, no images.
    assert_eq!(get(&mock, "/props").await.1["modalities"]["vision"], json!(true), "knobs are not learned");
    get(&mock, "/api/v0/models/text-model").await;
    assert_eq!(get(&mock, "/props").await.1["modalities"]["vision"], json!(false));
    mock.shutdown().await;
}

/// Not resident: `/api/ps` empty, `/props` 503 "Loading model", LM
/// Studio `not-loaded`.
#[tokio::test]
async fn residency_endpoints_while_not_resident() {
    let mock = spawn_resident(cold(0)).await;
    assert_eq!(get(&mock, "/api/ps").await, (200, json!({ "models": [] })));
    assert_eq!(
        get(&mock, "/props").await,
        (503, json!({ "error": { "code": 503, "message": "Loading model", "type": "unavailable_error" } }))
    );
    let (status, one) = get(&mock, "/api/v0/models/mock").await;
    assert_eq!((status, &one["state"]), (200, &json!("not-loaded")));
    assert!(one.get("loaded_context_length").is_none());
    let (_, list) = get(&mock, "/api/v0/models").await;
    assert_eq!(list["data"][0]["state"], "not-loaded");
    assert_eq!(mock.stats().loads, 0, "asking never loads");
    mock.shutdown().await;
}

/// `--residency-api` picks the endpoints that answer; the others are 404.
#[tokio::test]
async fn residency_api_selects_the_endpoints_that_answer() {
    let endpoints = ["/api/ps", "/props", "/api/v0/models", "/api/v0/models/mock"];
    for (api, answering) in [
        (ResidencyApi::All, [true, true, true, true]),
        (ResidencyApi::Ollama, [true, false, false, false]),
        (ResidencyApi::LlamaCpp, [false, true, false, false]),
        (ResidencyApi::LmStudio, [false, false, true, true]),
        (ResidencyApi::None, [false, false, false, false]),
    ] {
        let mock = spawn_resident(ResidencyConfig { residency_api: api, ..ResidencyConfig::default() }).await;
        for (path, answers) in endpoints.iter().zip(answering) {
            let (status, _) = get(&mock, path).await;
            assert_eq!(status, if answers { 200 } else { 404 }, "{api:?} {path}");
        }
        // Chat is not affected.
        let resp = post(&mock, "/api/chat", &chat_body("mock", "hi", json!({ "stream": false })), None).await;
        assert_eq!(resp.status(), 200, "{api:?}");
        mock.shutdown().await;
    }
}

/// A request while not resident waits the load before its headers;
/// requests during the load wait for the same load; then the model is
/// resident and later requests load nothing (`loads` stays 1).
#[tokio::test]
async fn a_load_delays_the_headers_once_for_every_waiting_request() {
    const DELAY: Duration = Duration::from_millis(300);
    let mock = spawn_resident(cold(DELAY.as_millis() as u64)).await;
    let started = Instant::now();
    let requests: Vec<_> = [
        ("/api/chat", chat_body("mock", "hi", json!({ "stream": false }))),
        ("/v1/chat/completions", chat_body("mock@words=2", "hi", json!({ "stream": true }))),
        ("/v1/responses", json!({ "model": "mock", "input": "hi" })),
        ("/v1/embeddings", json!({ "model": "mock", "input": "hi" })),
    ]
    .into_iter()
    .map(|(path, body)| {
        let url = format!("{}{path}", mock.base_url());
        tokio::spawn(async move {
            let resp = client().post(url).body(body.to_string()).send().await.unwrap();
            let headers_at = started.elapsed();
            (resp.status().as_u16(), headers_at, resp.bytes().await.unwrap())
        })
    })
    .collect();
    for request in requests {
        let (status, headers_at, _) = request.await.unwrap();
        assert_eq!(status, 200);
        assert!(headers_at >= DELAY, "headers after the load: {headers_at:?}");
    }
    assert_eq!(mock.stats().loads, 1, "one load for all of them");
    assert_eq!(ps_names(&mock).await, ["mock:latest"]);

    // Resident now: no load.
    let resp = post(&mock, "/api/chat", &chat_body("mock", "again", json!({ "stream": false })), None).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(mock.stats().loads, 1);
    assert_eq!(get_json(&mock, "/mock/stats").await["loads"], 1);
    mock.shutdown().await;
}

/// A client that leaves during the load does not cancel it.
#[tokio::test]
async fn a_load_goes_on_when_its_client_leaves() {
    let mock = spawn_resident(cold(200)).await;
    let url = format!("{}/api/chat", mock.base_url());
    let body = chat_body("mock", "hi", json!({ "stream": false })).to_string();
    let gone = tokio::time::timeout(Duration::from_millis(50), client().post(url).body(body).send()).await;
    assert!(gone.is_err(), "still loading");
    // The next request waits for the same load, not a new one.
    let resp = post(&mock, "/api/chat", &chat_body("mock", "hi", json!({ "stream": false })), None).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(mock.stats().loads, 1);
    mock.shutdown().await;
}

/// `POST /mock/residency` evicts (the next request loads again, with a
/// new delay) and makes resident without a load.
#[tokio::test]
async fn mock_residency_evicts_and_makes_resident() {
    let mock = spawn_resident(ResidencyConfig::default()).await;
    assert_eq!(set_residency(&mock, r#"{"loaded": false, "load_delay_ms": 150}"#).await, 204);
    assert!(ps_names(&mock).await.is_empty());
    assert_eq!(get(&mock, "/props").await.0, 503);
    assert_eq!(get(&mock, "/api/v0/models/mock").await.1["state"], "not-loaded");

    let started = Instant::now();
    let resp = post(&mock, "/api/embed", &json!({ "model": "mock", "input": "a" }), None).await;
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert_eq!(resp.status(), 200);
    assert_eq!(mock.stats().loads, 1);
    assert_eq!(ps_names(&mock).await, ["mock:latest"]);
    assert_eq!(get(&mock, "/props").await.0, 200);

    // Evicted, then made resident by hand: no load counted, none waited.
    assert_eq!(set_residency(&mock, r#"{"loaded": false}"#).await, 204);
    assert_eq!(set_residency(&mock, r#"{"loaded": true, "load_delay_ms": null}"#).await, 204);
    let resp = post(&mock, "/api/chat", &chat_body("mock", "hi", json!({ "stream": false })), None).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(mock.stats().loads, 1);

    for bad in ["", "{}", r#"{"loaded": "no"}"#, r#"{"loaded": false, "load_delay_ms": -1}"#] {
        assert_eq!(set_residency(&mock, bad).await, 400, "{bad}");
    }
    mock.shutdown().await;
}
