//! Structured output and forced tool choice through real processes
//! (issue 27 items 2 and 3): what the client asked for reaches the mock
//! provider as its schema enforcement (the request log), and the mock's
//! schema-following answer comes back in each API's shape, streaming or not.
//!
//! The mock answers a schema-constrained request (Ollama `format`, OpenAI
//! `response_format` schema) with a value that satisfies the schema, as a
//! provider's grammar would force it.

mod common;

use common::*;
use serde_json::{Value, json};

const OLLAMA: &str = "/api/chat";
const OPENAI: &str = "/v1/chat/completions";

fn weather_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": false,
    })
}

/// `value` follows [`weather_schema`]: exactly a string `city` and an
/// integer `days`.
fn assert_weather(value: &Value, context: &str) {
    let object = value.as_object().unwrap_or_else(|| panic!("{context}: not an object: {value}"));
    assert_eq!(object.len(), 2, "{context}: {value}");
    assert!(object["city"].is_string() && object["days"].is_i64(), "{context}: {value}");
}

/// The JSON payloads of an SSE body (`data:` lines; `[DONE]` skipped),
/// with or without `event:` lines.
async fn sse_json(response: reqwest::Response) -> Vec<Value> {
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    text.split("\n\n")
        .filter_map(|event| event.lines().find_map(|line| line.strip_prefix("data: ")))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap_or_else(|_| panic!("not JSON: {data}")))
        .collect()
}

/// Issue 27 item 2: Anthropic's `output_config.format` (as `messages.parse`
/// sends it, with Claude Code's `effort`) is the provider's schema
/// enforcement through both adapters, and the schema's answer comes back.
#[tokio::test]
async fn anthropic_output_config_reaches_both_adapters_as_schema_enforcement() {
    let stack = Stack::start(StackOptions::default()).await;
    for (model, path) in [("mock-ollama", OLLAMA), ("mock-openai", OPENAI)] {
        for stream in [false, true] {
            let context = format!("{model}, stream {stream}");
            let body = json!({
                "model": model, "max_tokens": 200, "stream": stream,
                "output_config": {"format": {"type": "json_schema", "schema": weather_schema()}, "effort": "high"},
                "messages": [{"role": "user", "content": "weather in Oslo?"}],
            });
            let response = stack.post("/v1/messages", &body).await;
            let text = if stream {
                let events = sse_json(response).await;
                assert_eq!(events.last().unwrap()["type"], "message_stop", "{context}");
                events.iter().filter_map(|e| e["delta"]["text"].as_str()).collect::<String>()
            } else {
                let (status, answer) = json_body(response).await;
                assert_eq!(status, 200, "{context}: {answer}");
                answer["content"][0]["text"].as_str().unwrap().to_owned()
            };
            assert_weather(&serde_json::from_str(&text).unwrap(), &context);

            let sent = stack.last_provider_request(path).await;
            match path {
                OLLAMA => assert_eq!(sent["format"], weather_schema(), "{context}"),
                _ => assert_eq!(
                    sent["response_format"],
                    json!({"type": "json_schema", "json_schema": {"name": "response", "strict": true, "schema": weather_schema()}}),
                    "{context}"
                ),
            }
            assert!(sent.get("think").is_none() && sent.get("reasoning_effort").is_none(), "{context}: {sent}");
        }

        // Claude Code's `effort` alone changes nothing the provider sees.
        let body = json!({"model": model, "max_tokens": 50, "output_config": {"effort": "high"},
                          "messages": [{"role": "user", "content": "hi"}]});
        let (status, answer) = json_body(stack.post("/v1/messages", &body).await).await;
        assert_eq!(status, 200, "{model}: {answer}");
        assert!(answer["content"][0]["text"].as_str().unwrap().starts_with("Hello from"), "{answer}");
        let sent = stack.last_provider_request(path).await;
        assert!(sent.get("format").is_none() && sent.get("response_format").is_none(), "{model}: {sent}");
    }
}

/// The forced choices of each API: a named tool (instructor's shape) and
/// "any tool".
#[derive(Debug, Clone, Copy, PartialEq)]
enum Forced {
    Named,
    Required,
}

/// `get_weather` (the schema) and `get_time` (no parameters).
fn tools_of(api: &str) -> Value {
    let tools = [
        ("get_weather", "Weather for a city", weather_schema()),
        ("get_time", "The time", json!({"type": "object", "properties": {}})),
    ];
    tools
        .iter()
        .map(|(name, description, schema)| match api {
            "chat" => json!({"type": "function", "function": {"name": name, "description": description, "parameters": schema}}),
            "responses" => json!({"type": "function", "name": name, "description": description, "parameters": schema}),
            _ => json!({"name": name, "description": description, "input_schema": schema}),
        })
        .collect()
}

fn forced_request(api: &str, forced: Forced, stream: bool) -> (&'static str, Value) {
    let tool_choice = match (api, forced) {
        ("chat", Forced::Named) => json!({"type": "function", "function": {"name": "get_weather"}}),
        ("responses", Forced::Named) => json!({"type": "function", "name": "get_weather"}),
        ("chat" | "responses", Forced::Required) => json!("required"),
        (_, Forced::Named) => json!({"type": "tool", "name": "get_weather"}),
        (_, Forced::Required) => json!({"type": "any"}),
    };
    let question = "what is the weather in Oslo?";
    match api {
        "chat" => (
            "/v1/chat/completions",
            json!({
                "model": "mock-ollama", "stream": stream, "tools": tools_of(api), "tool_choice": tool_choice,
                "messages": [{"role": "user", "content": question}],
            }),
        ),
        "responses" => (
            "/v1/responses",
            json!({
                "model": "mock-ollama", "stream": stream, "tools": tools_of(api), "tool_choice": tool_choice,
                "input": question,
            }),
        ),
        _ => (
            "/v1/messages",
            json!({
                "model": "mock-ollama", "max_tokens": 200, "stream": stream, "tools": tools_of(api),
                "tool_choice": tool_choice, "messages": [{"role": "user", "content": question}],
            }),
        ),
    }
}

/// The one tool call of an answer as `(name, arguments)`, checking that no
/// text came with it and that the answer says it ends in a tool call.
async fn the_tool_call(api: &str, stream: bool, response: reqwest::Response, context: &str) -> (String, Value) {
    if stream {
        let events = sse_json(response).await;
        let text = |e: &Value| {
            e["choices"][0]["delta"]["content"].as_str().is_some_and(|t| !t.is_empty())
                || e["type"] == "response.output_text.delta"
                || e["delta"]["type"] == "text_delta"
        };
        assert!(!events.iter().any(text), "{context}: text leaked: {events:?}");
        match api {
            "chat" => {
                let calls: Vec<&Value> =
                    events.iter().filter_map(|e| e["choices"][0]["delta"]["tool_calls"].get(0)).collect();
                assert!(calls.iter().all(|c| c["index"] == 0), "{context}: one call: {calls:?}");
                let name = calls.iter().find_map(|c| c["function"]["name"].as_str()).unwrap().to_owned();
                let arguments: String = calls.iter().filter_map(|c| c["function"]["arguments"].as_str()).collect();
                let finish = events.iter().find_map(|e| e["choices"][0]["finish_reason"].as_str());
                assert_eq!(finish, Some("tool_calls"), "{context}");
                (name, serde_json::from_str(&arguments).unwrap())
            }
            "responses" => {
                let done = events.iter().find(|e| e["type"] == "response.completed").expect("response.completed");
                one_function_call(&done["response"], context)
            }
            _ => {
                let starts: Vec<&Value> = events.iter().filter(|e| e["type"] == "content_block_start").collect();
                assert_eq!(starts.len(), 1, "{context}: {events:?}");
                assert_eq!(starts[0]["content_block"]["type"], "tool_use", "{context}");
                let name = starts[0]["content_block"]["name"].as_str().unwrap().to_owned();
                let input: String = events.iter().filter_map(|e| e["delta"]["partial_json"].as_str()).collect();
                let stop = events.iter().find_map(|e| e["delta"]["stop_reason"].as_str());
                assert_eq!(stop, Some("tool_use"), "{context}");
                (name, serde_json::from_str(&input).unwrap())
            }
        }
    } else {
        let (status, body) = json_body(response).await;
        assert_eq!(status, 200, "{context}: {body}");
        match api {
            "chat" => {
                let choice = &body["choices"][0];
                assert_eq!(choice["finish_reason"], "tool_calls", "{context}: {body}");
                assert!(choice["message"]["content"].as_str().is_none_or(str::is_empty), "{context}: {body}");
                let calls = choice["message"]["tool_calls"].as_array().unwrap();
                assert_eq!(calls.len(), 1, "{context}: {body}");
                let function = &calls[0]["function"];
                (
                    function["name"].as_str().unwrap().to_owned(),
                    serde_json::from_str(function["arguments"].as_str().unwrap()).unwrap(),
                )
            }
            "responses" => one_function_call(&body, context),
            _ => {
                assert_eq!(body["stop_reason"], "tool_use", "{context}: {body}");
                let content = body["content"].as_array().unwrap();
                assert_eq!(content.len(), 1, "{context}: {body}");
                assert_eq!(content[0]["type"], "tool_use", "{context}: {body}");
                (content[0]["name"].as_str().unwrap().to_owned(), content[0]["input"].clone())
            }
        }
    }
}

/// A Responses `response` whose output is exactly one `function_call`.
fn one_function_call(response: &Value, context: &str) -> (String, Value) {
    let output = response["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{context}: {response}");
    assert_eq!(output[0]["type"], "function_call", "{context}: {response}");
    let arguments = serde_json::from_str(output[0]["arguments"].as_str().unwrap()).unwrap();
    (output[0]["name"].as_str().unwrap().to_owned(), arguments)
}

/// Issue 27 item 3: `tool_choice` naming a tool (instructor's structured
/// output) or `required` / `any` on an Ollama provider is enforced through
/// `format` and answered with a real tool call in every API's shape,
/// streaming or not, whose arguments follow the tool's schema.
#[tokio::test]
async fn forced_tool_choice_on_ollama_is_a_real_tool_call_in_every_api() {
    let stack = Stack::start(StackOptions::default()).await;
    for api in ["chat", "responses", "messages"] {
        for forced in [Forced::Named, Forced::Required] {
            for stream in [false, true] {
                let context = format!("{api}, {forced:?}, stream {stream}");
                let (path, body) = forced_request(api, forced, stream);
                let response = stack.post(path, &body).await;
                let (name, arguments) = the_tool_call(api, stream, response, &context).await;
                // The mock's grammar picks the first choice: get_weather.
                assert_eq!(name, "get_weather", "{context}");
                assert_weather(&arguments, &context);

                let sent = stack.last_provider_request(OLLAMA).await;
                let offered: Vec<&str> =
                    sent["tools"].as_array().unwrap().iter().filter_map(|t| t["function"]["name"].as_str()).collect();
                match forced {
                    Forced::Named => {
                        assert_eq!(sent["format"], weather_schema(), "{context}");
                        assert_eq!(offered, ["get_weather"], "{context}");
                    }
                    Forced::Required => {
                        let choices = sent["format"]["anyOf"].as_array().expect("a choice among the tools");
                        assert_eq!(choices[0]["properties"]["arguments"], weather_schema(), "{context}");
                        assert_eq!(choices[1]["properties"]["name"], json!({"const": "get_time"}), "{context}");
                        assert_eq!(offered, ["get_weather", "get_time"], "{context}");
                    }
                }
            }
        }
    }

    // Where `format` cannot enforce it: a clear 400.
    let (_, mut body) = forced_request("chat", Forced::Named, false);
    body["response_format"] = json!({"type": "json_object"});
    let (status, answer) = json_body(stack.post("/v1/chat/completions", &body).await).await;
    assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("invalid_request")), "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("tool_choice"), "{answer}");
}

/// The official SDKs, unmodified (`e2e/sdk/structured.py`): Anthropic's
/// `messages.parse` through both adapters; instructor-style forced tool
/// calls (OpenAI `chat.completions.parse` with a pydantic tool, Anthropic
/// `tool_choice`, Responses `required`) on Ollama, streaming and not.
#[tokio::test]
#[cfg_attr(iop_absent_python_sdks, ignore = "needs the Python SDKs: scripts/test-deps")]
async fn official_sdks_get_structured_output_and_forced_tool_calls() {
    let stack = Stack::start(StackOptions::default()).await;
    run_script("structured.py", &[stack.url("").trim_end_matches('/')]).await;
    let sent = stack.last_provider_request(OPENAI).await;
    assert_eq!(sent["response_format"]["type"], "json_schema", "{sent}");
}
