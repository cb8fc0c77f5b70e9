use iop_proto::pb::run_event::Event;
use serde_json::json;

use super::super::AdapterKind;
use super::super::events::{tool_call, usage};
use super::super::fake::{self, Reply};
use super::*;

const NDJSON: &str = "application/x-ndjson";

fn target(base_url: &str) -> ProviderTarget {
    fake::target(AdapterKind::Ollama, base_url)
}

fn started(model: &str) -> Event {
    super::super::events::started(model)
}

fn text(t: &str) -> Event {
    super::super::events::text(t)
}

#[tokio::test]
async fn streams_text_then_usage_and_stop() {
    let mut server = fake::serve(Reply::chunks(200, NDJSON, [
        // lines split mid-JSON across network chunks; final line has no newline
        "{\"model\":\"llama3.2:3b\",\"created_at\":\"2024-01-01T00:00:00Z\",\"message\":{\"role\":\"assistant\",\"content\":\"Hel\"},\"done\":false}\n{\"model\":\"llama3.2:3b\",\"message\":{\"role\":\"assis",
        "tant\",\"content\":\"lo\"},\"done\":false}\n\n",
        "{\"model\":\"llama3.2:3b\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"stop\",\"prompt_eval_count\":12,\"eval_count\":2}",
    ]))
    .await;
    let (result, events) = fake::run(&target(&server.base_url), &fake::request(vec![fake::user("hi")])).await;
    assert_eq!(result.unwrap(), pb::FinishReason::Stop);
    assert_eq!(events, vec![started("llama3.2:3b"), text("Hel"), text("lo"), usage(12, 2)]);

    let req = server.request().await;
    assert_eq!((req.method.as_str(), req.path.as_str()), ("POST", "/api/chat"));
    assert_eq!(req.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        req.json(),
        json!({"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "stream": true})
    );
}

#[tokio::test]
async fn options_are_sent_and_length_is_mapped() {
    let mut server = fake::serve(Reply::chunks(200, NDJSON, [
        "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"a\"},\"done\":false}\n",
        "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"length\",\"eval_count\":1}\n",
    ]))
    .await;
    let mut request = fake::request(vec![fake::user("hi")]);
    request.stream = false; // we stream from the provider regardless
    request.options = Some(pb::GenerationOptions {
        max_tokens: Some(64),
        temperature: Some(0.7),
        top_p: Some(0.9),
        stop: vec!["\n\n".into()],
        seed: Some(42),
        ..Default::default()
    });
    let (result, events) = fake::run(&target(&server.base_url), &request).await;
    assert_eq!(result.unwrap(), pb::FinishReason::Length);
    assert_eq!(events.last(), Some(&usage(0, 1)));
    let body = server.request().await.json();
    assert_eq!(body["stream"], json!(true));
    assert_eq!(
        body["options"],
        json!({"num_predict": 64, "temperature": 0.7, "top_p": 0.9, "stop": ["\n\n"], "seed": 42})
    );
}

#[tokio::test]
async fn tool_calls_are_translated_both_ways() {
    let mut server = fake::serve(Reply::chunks(200, NDJSON, [
        "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Berlin\"}}},{\"function\":{\"name\":\"get_time\",\"arguments\":{}}}]},\"done\":false}\n",
        "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"stop\",\"prompt_eval_count\":30,\"eval_count\":9}\n",
    ]))
    .await;
    let request = pb::RunRequest {
        messages: vec![
            pb::ChatMessage { role: pb::Role::System.into(), content: "be brief".into(), ..Default::default() },
            fake::user("weather in Paris?"),
            pb::ChatMessage {
                role: pb::Role::Assistant.into(),
                tool_calls: vec![pb::ToolCall {
                    id: "call_a".into(),
                    name: "get_weather".into(),
                    arguments_json: r#"{"city":"Paris"}"#.into(),
                }],
                ..Default::default()
            },
            pb::ChatMessage {
                role: pb::Role::Tool.into(),
                content: "sunny".into(),
                tool_call_id: "call_a".into(),
                ..Default::default()
            },
            pb::ChatMessage { role: pb::Role::Tool.into(), content: "orphan".into(), ..Default::default() },
        ],
        tools: vec![
            pb::ToolDefinition {
                name: "get_weather".into(),
                description: "Current weather".into(),
                parameters_json: r#"{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}"#
                    .into(),
            },
            pb::ToolDefinition { name: "get_time".into(), ..Default::default() },
        ],
        ..fake::request(vec![])
    };
    let (result, mut events) = fake::run(&target(&server.base_url), &request).await;
    assert_eq!(result.unwrap(), pb::FinishReason::ToolCalls);
    // Issue 8 item 7: ids are unique (they used to be call_0, call_1 on
    // every turn, so a client could not tell turns' calls apart).
    let mut ids = Vec::new();
    for event in &mut events {
        if let pb::run_event::Event::ToolCall(call) = event {
            assert!(call.id.starts_with(&format!("call_{}_", request.run_id)), "{}", call.id);
            ids.push(std::mem::take(&mut call.id));
        }
    }
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1]);
    assert_eq!(
        events,
        vec![
            started("m"),
            tool_call(0, "", "get_weather", r#"{"city":"Berlin"}"#),
            tool_call(1, "", "get_time", "{}"),
            usage(30, 9),
        ]
    );

    let body = server.request().await.json();
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
            {"role": "tool", "content": "orphan"},
        ])
    );
    assert_eq!(
        body["tools"],
        json!([
            {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
        ])
    );
}

#[tokio::test]
async fn untranslatable_requests_are_rejected_before_any_call() {
    let base = fake::refused_base_url().await;
    let bad_args = pb::ChatMessage {
        role: pb::Role::Assistant.into(),
        tool_calls: vec![pb::ToolCall { id: "c".into(), name: "f".into(), arguments_json: "{secret".into() }],
        ..Default::default()
    };
    let not_object = pb::ChatMessage {
        role: pb::Role::Assistant.into(),
        tool_calls: vec![pb::ToolCall { id: "c".into(), name: "f".into(), arguments_json: "[1]".into() }],
        ..Default::default()
    };
    let no_role = pb::ChatMessage { content: "x".into(), ..Default::default() };
    for message in [bad_args, not_object, no_role] {
        match fake::run(&target(&base), &fake::request(vec![message])).await {
            (Err(AdapterError::InvalidRequest(msg)), events) => {
                assert!(!msg.contains("secret"), "{msg}");
                assert!(events.is_empty());
            }
            other => panic!("{other:?}"),
        }
    }
    let bad_schema = pb::RunRequest {
        tools: vec![pb::ToolDefinition { name: "f".into(), parameters_json: "nope".into(), ..Default::default() }],
        ..fake::request(vec![fake::user("hi")])
    };
    assert!(matches!(fake::run(&target(&base), &bad_schema).await.0, Err(AdapterError::InvalidRequest(_))));
}

#[tokio::test]
async fn http_429_carries_retry_after_and_provider_message() {
    let server =
        fake::serve(Reply::json(429, r#"{"error":"server busy, please retry"}"#).header("retry-after", "2")).await;
    match fake::run(&target(&server.base_url), &fake::request(vec![fake::user("hi")])).await {
        (Err(AdapterError::HttpStatus { status, retry_after_ms, message, .. }), events) => {
            assert_eq!((status, retry_after_ms), (429, Some(2000)));
            assert_eq!(message, "server busy, please retry");
            assert!(events.is_empty());
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn http_400_preserves_provider_message_and_plain_bodies_fall_back_to_status_text() {
    let server = fake::serve(Reply::json(400, r#"{"error":"model \"nope\" not found, try pulling it first"}"#)).await;
    match fake::run(&target(&server.base_url), &fake::request(vec![fake::user("hi")])).await.0 {
        Err(AdapterError::HttpStatus { status: 400, retry_after_ms: None, message, .. }) => {
            assert_eq!(message, "model \"nope\" not found, try pulling it first")
        }
        other => panic!("{other:?}"),
    }
    let server = fake::serve(Reply::chunks(503, "text/html", ["<html>echo of the prompt</html>"])).await;
    match fake::run(&target(&server.base_url), &fake::request(vec![fake::user("hi")])).await.0 {
        Err(AdapterError::HttpStatus { status: 503, message, .. }) => assert_eq!(message, "Service Unavailable"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn connection_refused_is_unreachable() {
    let base = fake::refused_base_url().await;
    match fake::run(&target(&base), &fake::request(vec![fake::user("hi")])).await.0 {
        Err(e @ AdapterError::Unreachable(_)) => {
            assert_eq!(e.to_failure().kind(), pb::FailureKind::ProviderUnreachable)
        }
        other => panic!("{other:?}"),
    }
}

const MALFORMED: &str = "data: {\"secret\": true\n";

fn malformed_count(metrics: &crate::metrics::NodeMetrics) -> String {
    let text = metrics.encode();
    let line = text.lines().find(|l| l.starts_with("iop_node_provider_malformed_events_total{"));
    line.unwrap_or("none").to_owned()
}

/// Issue 28 item 3: one undecodable line amid good ones is skipped,
/// counted for its provider, and the answer completes with the rest.
#[tokio::test]
async fn one_malformed_line_mid_stream_is_skipped_and_counted() {
    let (hel, lo) = (content_line("Hel"), content_line("lo"));
    let server = fake::serve(Reply::chunks(200, NDJSON, [MALFORMED, &hel, MALFORMED, &lo, DONE])).await;
    let metrics = crate::metrics::NodeMetrics::new();
    let request = fake::request(vec![fake::user("hi")]);
    let (result, events) = fake::run_counted(&target(&server.base_url), &request, &metrics).await;
    assert_eq!(result.unwrap(), pb::FinishReason::Stop);
    assert_eq!(events, vec![started("m"), text("Hel"), text("lo"), usage(7, 5)]);
    assert_eq!(malformed_count(&metrics), r#"iop_node_provider_malformed_events_total{provider="p1"} 2"#);
}

/// Three in a row: the run fails as before, without quoting the payload.
#[tokio::test]
async fn malformed_lines_in_a_row_are_a_protocol_error() {
    let (ok, never) = (content_line("ok"), content_line("never"));
    let server =
        fake::serve(Reply::chunks(200, NDJSON, [&ok, MALFORMED, "{\"done\":\n", MALFORMED, &never, DONE])).await;
    let metrics = crate::metrics::NodeMetrics::new();
    let request = fake::request(vec![fake::user("hi")]);
    let (result, events) = fake::run_counted(&target(&server.base_url), &request, &metrics).await;
    match result {
        Err(e @ AdapterError::Protocol(_)) => {
            assert_eq!(e.to_failure().kind(), pb::FailureKind::ProviderProtocol);
            assert!(!e.to_string().contains("secret"), "{e}");
            assert!(e.to_string().contains("3 invalid NDJSON lines in a row"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(events, vec![started("m"), text("ok")]);
    assert_eq!(malformed_count(&metrics), r#"iop_node_provider_malformed_events_total{provider="p1"} 2"#);
}

/// A malformed last line (the `done` line, say) with the stream ending
/// after it fails: the answer's end is lost.
#[tokio::test]
async fn malformed_last_line_is_a_protocol_error() {
    let ok = content_line("ok");
    for last in [MALFORMED, MALFORMED.trim_end()] {
        let server = fake::serve(Reply::chunks(200, NDJSON, [ok.as_str(), last])).await;
        let (result, events) = fake::run(&target(&server.base_url), &fake::request(vec![fake::user("hi")])).await;
        match result {
            Err(AdapterError::Protocol(msg)) => assert_eq!(msg, "stream ended right after an invalid NDJSON line"),
            other => panic!("{other:?}"),
        }
        assert_eq!(events, vec![started("m"), text("ok")]);
    }
}

#[tokio::test]
async fn error_field_mid_stream_is_a_protocol_error_with_its_message() {
    let server = fake::serve(Reply::chunks(
        200,
        NDJSON,
        [
            "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"ok\"},\"done\":false}\n",
            "{\"error\":\"model runner has unexpectedly stopped\"}\n",
        ],
    ))
    .await;
    match fake::run(&target(&server.base_url), &fake::request(vec![fake::user("hi")])).await.0 {
        Err(AdapterError::Protocol(msg)) => assert_eq!(msg, "model runner has unexpectedly stopped"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn stream_cut_before_done_is_a_protocol_error() {
    let server = fake::serve(Reply::chunks(
        200,
        NDJSON,
        ["{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"partial\"},\"done\":false}\n"],
    ))
    .await;
    let (result, events) = fake::run(&target(&server.base_url), &fake::request(vec![fake::user("hi")])).await;
    match result {
        Err(AdapterError::Protocol(msg)) => assert_eq!(msg, "stream ended before the provider's final chunk"),
        other => panic!("{other:?}"),
    }
    assert_eq!(events, vec![started("m"), text("partial")]);
}

#[tokio::test]
async fn dropping_the_run_closes_the_provider_connection() {
    fake::assert_drop_closes_connection(
        AdapterKind::Ollama,
        NDJSON,
        "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"a\"},\"done\":false}\n",
    )
    .await;
}

fn forced_request(mode: pb::ToolChoiceMode, name: &str) -> pb::RunRequest {
    let tool = |name: &str, parameters_json: &str| pb::ToolDefinition {
        name: name.into(),
        description: format!("the {name} tool"),
        parameters_json: parameters_json.into(),
    };
    pb::RunRequest {
        tools: vec![
            tool("get_time", ""),
            tool("get_weather", r#"{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}"#),
        ],
        options: Some(pb::GenerationOptions {
            tool_choice: Some(pb::ToolChoice { mode: mode.into(), name: name.into() }),
            ..Default::default()
        }),
        ..fake::request(vec![fake::user("weather in Oslo?")])
    }
}

fn content_line(content: &str) -> String {
    format!("{}\n", json!({"model": "m", "message": {"role": "assistant", "content": content}, "done": false}))
}

const DONE: &str = "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"stop\",\"prompt_eval_count\":7,\"eval_count\":5}\n";

/// Issue 27 item 3: a named tool is enforced through `format` (its
/// parameter schema, only that tool offered), and the streamed answer
/// is held back and becomes one tool call: no text reaches the client.
#[tokio::test]
async fn forced_named_tool_goes_through_format_and_comes_back_as_one_call() {
    let lines: Vec<String> = ["{\n", "  \"city\": ", "\"Oslo\"\n", "}"].iter().map(|c| content_line(c)).collect();
    let mut server = fake::serve(Reply::chunks(200, NDJSON, [&lines[0], &lines[1], &lines[2], &lines[3], DONE])).await;
    let request = forced_request(pb::ToolChoiceMode::Named, "get_weather");
    let (result, events) = fake::run(&target(&server.base_url), &request).await;
    assert_eq!(result.unwrap(), pb::FinishReason::ToolCalls);
    let id = format!("call_{}_0", request.run_id);
    assert_eq!(events, vec![started("m"), tool_call(0, &id, "get_weather", r#"{"city":"Oslo"}"#), usage(7, 5)]);
    let body = server.request().await.json();
    assert_eq!(
        body["format"],
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
    );
    assert_eq!(body["tools"].as_array().map(Vec::len), Some(1));
    assert_eq!(body["tools"][0]["function"]["name"], "get_weather");
}

/// `required` among several tools: the schema is a choice, the answer
/// names the tool.
#[tokio::test]
async fn forced_required_choice_comes_back_as_the_chosen_call() {
    let answer = content_line(r#"{"name": "get_weather", "arguments": {"city": "Oslo"}}"#);
    let mut server = fake::serve(Reply::chunks(200, NDJSON, [answer.as_str(), DONE])).await;
    let request = forced_request(pb::ToolChoiceMode::Required, "");
    let (result, events) = fake::run(&target(&server.base_url), &request).await;
    assert_eq!(result.unwrap(), pb::FinishReason::ToolCalls);
    let id = format!("call_{}_0", request.run_id);
    assert_eq!(events, vec![started("m"), tool_call(0, &id, "get_weather", r#"{"city":"Oslo"}"#), usage(7, 5)]);
    let body = server.request().await.json();
    assert_eq!(body["format"]["anyOf"][1]["properties"]["name"], json!({"const": "get_weather"}));
    assert_eq!(body["tools"].as_array().map(Vec::len), Some(2));
}

#[test]
fn forced_answers_that_are_no_call() {
    let forced = || Some(ForcedTool::Choice(vec!["a".into(), "b".into()]));
    let done = |reason: &str| format!(r#"{{"done":true,"done_reason":"{reason}","eval_count":3}}"#);

    // The provider's own call stands; the held-back text is dropped.
    let mut d = Decoder::new("m", "r").forcing(forced());
    let mut out = Vec::new();
    d.line(&content_line("ignored"), &mut out).unwrap();
    d.line(r#"{"message":{"tool_calls":[{"function":{"name":"b","arguments":{"x":1}}}]},"done":false}"#, &mut out)
        .unwrap();
    assert_eq!(d.line(&done("stop"), &mut out).unwrap(), Some(pb::FinishReason::ToolCalls));
    assert_eq!(out, vec![started("m"), tool_call(0, "call_r_0", "b", r#"{"x":1}"#), usage(0, 3)]);

    // Cut by the length limit: the partial answer is text, finish length.
    let mut d = Decoder::new("m", "r").forcing(forced());
    let mut out = Vec::new();
    d.line(&content_line(r#"{"name": "a", "argu"#), &mut out).unwrap();
    assert_eq!(d.line(&done("length"), &mut out).unwrap(), Some(pb::FinishReason::Length));
    assert_eq!(out, vec![started("m"), text(r#"{"name": "a", "argu"#), usage(0, 3)]);

    // Anything else is a protocol error that does not quote the answer.
    for answer in ["secret words", r#"{"name": "secret", "arguments": {}}"#, "[1]"] {
        let mut d = Decoder::new("m", "r").forcing(forced());
        let mut out = Vec::new();
        d.line(&content_line(answer), &mut out).unwrap();
        match d.line(&done("stop"), &mut out) {
            Err(AdapterError::Protocol(msg)) => assert!(!msg.contains("secret"), "{msg}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(out, vec![started("m")]);
    }

    // The held-back answer is bounded.
    let mut d = Decoder::new("m", "r").forcing(forced());
    let piece = content_line(&"x".repeat(64 * 1024));
    let mut out = Vec::new();
    let result = (0..=16).try_for_each(|_| d.line(&piece, &mut out).map(drop));
    assert!(matches!(result, Err(AdapterError::TooLarge(_))), "{result:?}");
}

#[test]
fn decoder_unit_edge_cases() {
    let mut d = Decoder::new("fallback", "r1");
    let mut out = Vec::new();
    // first line without a model name falls back to the assigned model
    assert_eq!(d.line(r#"{"message":{"content":"x"},"done":false}"#, &mut out).unwrap(), None);
    assert_eq!(d.line("   ", &mut out).unwrap(), None);
    assert_eq!(d.line("42", &mut out).unwrap(), None, "an isolated undecodable line is skipped");
    assert_eq!(d.line(r#"{"done":true,"done_reason":"unload"}"#, &mut out).unwrap(), Some(pb::FinishReason::Stop));
    assert_eq!(out, vec![started("fallback"), text("x"), usage(0, 0)]);
}

/// Issue 45 item 3: parallel_tool_calls=false with tools on Ollama keeps
/// the first call, whether the rest come in the same chunk or later ones,
/// and says so in the run's start (the Edge's `iop-parallel-tool-calls`).
#[test]
fn first_tool_call_only_keeps_the_first_call_and_drops_the_rest() {
    let plan = Plan { forced: None, first_tool_call_only: true };
    let mut d = Decoder::new("m", "r").planned(plan);
    let mut out = Vec::new();
    let calls = r#"{"message":{"tool_calls":[{"function":{"name":"a","arguments":{"x":1}}},{"function":{"name":"b","arguments":{}}}]},"done":false}"#;
    d.line(calls, &mut out).unwrap();
    d.line(r#"{"message":{"tool_calls":[{"function":{"name":"c","arguments":{}}}]},"done":false}"#, &mut out).unwrap();
    let done = r#"{"done":true,"done_reason":"stop","eval_count":3}"#;
    assert_eq!(d.line(done, &mut out).unwrap(), Some(pb::FinishReason::ToolCalls));
    let started = Event::Started(pb::RunStarted { model: "m".into(), first_tool_call_only: true });
    assert_eq!(out, vec![started, tool_call(0, "call_r_0", "a", r#"{"x":1}"#), usage(0, 3)]);
    // Without the plan every call is relayed.
    let mut d = Decoder::new("m", "r");
    let mut out = Vec::new();
    d.line(calls, &mut out).unwrap();
    assert_eq!(out.len(), 3, "{out:?}");
}
