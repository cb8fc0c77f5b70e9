use super::*;
use crate::ingress::test_events::{completed, started, text, tool, usage};
use pb::run_event::Event;

fn parse(v: Value) -> Result<ChatCompletionRequest, ApiError> {
    parse_request(v.to_string().as_bytes())
}

fn meta() -> ResponseMeta {
    ResponseMeta { id: "chatcmpl-test".into(), created: 1_700_000_000, model: "llama".into() }
}

fn render_all(renderer: &mut ChunkRenderer, events: &[Event]) -> Vec<Value> {
    events.iter().flat_map(|e| renderer.render(e)).map(|p| serde_json::from_str(&p).expect("payload is JSON")).collect()
}

// ------------------------------------------------------------ parse

/// Chat's `file` part (`{"type":"file","file":{"file_data","filename"}}`)
/// reads as its labelled text; a `file_id` is refused naming the part.
#[test]
fn file_parts_read_as_their_text() {
    use base64::Engine as _;
    let pdf =
        base64::engine::general_purpose::STANDARD.encode(crate::ingress::documents::tests::pdf(&["Chat PDF text"]));
    let file = |file: Value| {
        parse(json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "read"}, {"type": "file", "file": file}
        ]}]}))
    };
    let request =
        file(json!({"filename": "c.pdf", "file_data": format!("data:application/pdf;base64,{pdf}")})).unwrap();
    assert!(request.messages[0].content.contains("<document name=\"c.pdf\" type=\"PDF\" pages=\"1\">\nChat PDF text"));
    match file(json!({"file_id": "file-1"})).unwrap_err() {
        ApiError::InvalidRequest { message, param } => {
            assert_eq!(param.as_deref(), Some("messages[0].content[1]"));
            assert!(message.contains("document source `file_id` is not supported"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn minimal_request_parses_with_defaults() {
    let req = parse(json!({"model": "llama", "messages": [{"role": "user", "content": "hi"}]})).unwrap();
    assert_eq!(req.model, "llama");
    assert!(!req.stream);
    assert!(!req.include_usage);
    assert!(req.tools.is_empty());
    assert_eq!(req.options, pb::GenerationOptions::default());
    assert_eq!(
        req.messages,
        vec![pb::ChatMessage {
            images: Vec::new(),
            role: pb::Role::User.into(),
            content: "hi".into(),
            tool_calls: vec![],
            tool_call_id: String::new(),
        }]
    );
}

#[test]
fn sdk_style_request_with_extras_parses() {
    let req = parse(json!({
        "model": "llama",
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "system", "content": "sys", "name": "ops"},
            {"role": "user", "content": "hi", "name": "alice"}
        ],
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_completion_tokens": 64,
        "temperature": 0.5,
        "top_p": 1,
        "stop": ["\n\n", "END"],
        "seed": -7,
        "n": 1,
        "user": "u-1",
        "metadata": {"k": "v"},
        "logprobs": false,
        "tool_choice": "auto",
        "presence_penalty": null,
        "frequency_penalty": 0
    }))
    .unwrap();
    assert!(req.stream);
    assert!(req.include_usage);
    let roles: Vec<i32> = req.messages.iter().map(|m| m.role).collect();
    let system = i32::from(pb::Role::System);
    assert_eq!(roles, vec![system, system, i32::from(pb::Role::User)]);
    assert_eq!(req.options.max_tokens, Some(64));
    assert_eq!(req.options.temperature, Some(0.5));
    assert_eq!(req.options.top_p, Some(1.0));
    assert_eq!(req.options.stop, vec!["\n\n".to_string(), "END".to_string()]);
    assert_eq!(req.options.seed, Some(-7));
}

#[test]
fn max_tokens_and_single_stop_string() {
    let req = parse(json!({
        "model": "m", "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 10, "stop": "STOP", "stream": false, "stream_options": null
    }))
    .unwrap();
    assert_eq!(req.options.max_tokens, Some(10));
    assert_eq!(req.options.stop, vec!["STOP".to_string()]);
}

#[test]
fn text_content_parts_are_joined() {
    let req = parse(json!({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "first"},
        {"type": "text", "text": "second"}
    ]}]}))
    .unwrap();
    assert_eq!(req.messages[0].content, "first\nsecond");
}

#[test]
fn tools_tool_calls_and_tool_messages_round_trip() {
    let params = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let req = parse(json!({
        "model": "m",
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
        ],
        "tools": [
            {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": params, "strict": true}},
            {"type": "function", "function": {"name": "noop"}}
        ],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}
    }))
    .unwrap();

    let assistant = &req.messages[1];
    assert_eq!(assistant.role, i32::from(pb::Role::Assistant));
    assert_eq!(assistant.content, "");
    assert_eq!(
        assistant.tool_calls,
        vec![pb::ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments_json: r#"{"city":"Paris"}"#.into(),
        }]
    );
    let tool_msg = &req.messages[2];
    assert_eq!(tool_msg.role, i32::from(pb::Role::Tool));
    assert_eq!(tool_msg.tool_call_id, "call_1");
    assert_eq!(tool_msg.content, "sunny");

    assert_eq!(req.tools.len(), 2);
    assert_eq!(req.tools[0].name, "get_weather");
    assert_eq!(req.tools[0].description, "Weather");
    let parsed: Value = serde_json::from_str(&req.tools[0].parameters_json).unwrap();
    assert_eq!(parsed, params);
    assert_eq!(req.tools[1].description, "");
    let parsed: Value = serde_json::from_str(&req.tools[1].parameters_json).unwrap();
    assert_eq!(parsed, json!({"type": "object", "properties": {}}));
}

#[test]
fn malformed_and_non_object_bodies_are_rejected() {
    let err = parse_request(b"{").unwrap_err();
    let ApiError::InvalidRequest { message, param } = err else { panic!("not InvalidRequest") };
    assert!(message.starts_with("invalid JSON: "), "{message}");
    assert_eq!(param, None);

    let err = parse_request(b"{x").unwrap_err();
    assert!(err.to_string().contains("line 1 column 2"), "{err}");

    for body in [&b"[]"[..], b"\"s\"", b"1", b"null"] {
        assert_eq!(parse_request(body).unwrap_err(), ApiError::invalid("request body must be a JSON object"));
    }
}

#[test]
fn invalid_requests_name_the_field() {
    let user = json!({"role": "user", "content": "hi"});
    let with = |extra: Value| {
        let mut base = json!({"model": "m", "messages": [user.clone()]});
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        base
    };
    let msgs = |m: Value| with(json!({"messages": m}));
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"messages": [user.clone()]}), "model", "`model` is required"),
        (with(json!({"model": 3})), "model", "`model` must be a string"),
        (with(json!({"model": ""})), "model", "`model` must not be empty"),
        (json!({"model": "m"}), "messages", "`messages` is required"),
        (msgs(json!([])), "messages", "`messages` must contain at least one message"),
        (msgs(json!("hi")), "messages", "`messages` must be an array"),
        (msgs(json!([user.clone(), "x"])), "messages[1]", "`messages[1]` must be an object"),
        (msgs(json!([{"content": "x"}])), "messages[0].role", "`messages[0].role` is required"),
        (
            msgs(json!([user.clone(), user.clone(), {"role": "wizard", "content": "x"}])),
            "messages[2].role",
            "`messages[2].role` has unknown role `wizard`; expected one of system, developer, user, assistant, tool",
        ),
        (msgs(json!([{"role": "user"}])), "messages[0].content", "`messages[0].content` is required"),
        (
            msgs(json!([{"role": "assistant", "content": null}])),
            "messages[0].content",
            "`messages[0].content` is required unless the assistant message has `tool_calls`",
        ),
        (
            msgs(json!([{"role": "user", "content": 5}])),
            "messages[0].content",
            "`messages[0].content` must be a string or an array of content parts",
        ),
        (
            msgs(json!([{"role": "user", "content": []}])),
            "messages[0].content",
            "`messages[0].content` must not be an empty array",
        ),
        (
            msgs(json!([{"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}
            ]}])),
            "messages[0].content[1].image_url.url",
            "`messages[0].content[1].image_url.url` must be an http(s) URL or a base64 `data:` URL",
        ),
        (
            msgs(json!([{"role": "user", "content": [{"type": "text"}]}])),
            "messages[0].content[0].text",
            "`messages[0].content[0].text` is required",
        ),
        (
            msgs(json!([{"role": "tool", "content": "x"}])),
            "messages[0].tool_call_id",
            "`messages[0].tool_call_id` is required",
        ),
        (
            msgs(json!([{"role": "user", "content": "x", "tool_calls": []}])),
            "messages[0].tool_calls",
            "`messages[0].tool_calls` is only allowed on assistant messages",
        ),
        (
            msgs(
                json!([{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]),
            ),
            "messages[0].tool_calls[0].id",
            "`messages[0].tool_calls[0].id` is required",
        ),
        (
            msgs(
                json!([{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}]}]),
            ),
            "messages[0].tool_calls[0].function.arguments",
            "`messages[0].tool_calls[0].function.arguments` must be a string (the arguments as JSON text)",
        ),
        (with(json!({"tools": {}})), "tools", "`tools` must be an array"),
        (
            with(json!({"tools": [{"type": "code_interpreter"}]})),
            "tools[0].type",
            "tools[0]: tool type `code_interpreter` is not supported; only `function` is",
        ),
        (
            with(json!({"tools": [{"type": "function", "function": {"description": "d"}}]})),
            "tools[0].function.name",
            "`tools[0].function.name` is required",
        ),
        (
            with(json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]})),
            "tools[0].function.parameters",
            "`tools[0].function.parameters` must be an object",
        ),
        (with(json!({"stream": "yes"})), "stream", "`stream` must be a boolean"),
        (
            with(json!({"stream_options": {"include_usage": 1}})),
            "stream_options.include_usage",
            "`stream_options.include_usage` must be a boolean",
        ),
        (with(json!({"max_tokens": "10"})), "max_tokens", "`max_tokens` must be an integer"),
        (with(json!({"max_tokens": 0})), "max_tokens", "`max_tokens` must be an integer between 1 and 4294967295"),
        (
            with(json!({"max_completion_tokens": 5_000_000_000u64})),
            "max_completion_tokens",
            "`max_completion_tokens` must be an integer between 1 and 4294967295",
        ),
        (with(json!({"temperature": "hot"})), "temperature", "`temperature` must be a number"),
        (with(json!({"temperature": 2.5})), "temperature", "`temperature` must be between 0 and 2"),
        (with(json!({"top_p": -0.1})), "top_p", "`top_p` must be between 0 and 1"),
        (with(json!({"stop": 3})), "stop", "`stop` must be a string or an array of strings"),
        (with(json!({"stop": ["a", 1]})), "stop[1]", "`stop[1]` must be a string"),
        (with(json!({"stop": ["a", "b", "c", "d", "e"]})), "stop", "`stop` may contain at most 4 sequences"),
        (with(json!({"seed": 1.5})), "seed", "`seed` must be an integer"),
        (with(json!({"n": 2})), "n", "n > 1 is not supported"),
        (with(json!({"n": 0})), "n", "`n` must be 1"),
    ];
    for (body, want_param, want_message) in cases {
        let err = parse(body.clone()).expect_err(&format!("should fail: {body}"));
        assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(err, ApiError::invalid_param(want_param, want_message), "body: {body}");
    }
}

// ------------------------------------------------------------ render

#[test]
fn response_meta_id_is_chatcmpl_plus_32_hex() {
    let meta = ResponseMeta::new("m".into(), 5);
    let hex = meta.id.strip_prefix("chatcmpl-").unwrap();
    assert_eq!(hex.len(), 32);
    assert!(hex.chars().all(|c| c.is_ascii_hexdigit()));
    assert_ne!(meta.id, ResponseMeta::new("m".into(), 5).id);
}

#[test]
fn streaming_text_with_usage() {
    let mut r = ChunkRenderer::new(meta(), true);
    let chunks =
        render_all(&mut r, &[started(), text("Hel"), text("lo"), usage(7, 2), completed(pb::FinishReason::Stop)]);
    assert_eq!(chunks.len(), 5);
    for c in &chunks {
        assert_eq!(c["id"], "chatcmpl-test");
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["created"], 1_700_000_000u64);
        assert_eq!(c["model"], "llama");
        assert_eq!(c["system_fingerprint"], Value::Null);
    }
    let choice = |i: usize| &chunks[i]["choices"][0];
    assert_eq!(choice(0)["delta"], json!({"role": "assistant", "content": ""}));
    assert_eq!(choice(1)["delta"], json!({"content": "Hel"}));
    assert_eq!(choice(2)["delta"], json!({"content": "lo"}));
    assert_eq!(choice(3)["delta"], json!({}));
    assert_eq!(choice(3)["finish_reason"], "stop");
    for i in 0..3 {
        assert_eq!(choice(i)["finish_reason"], Value::Null);
        assert_eq!(choice(i)["index"], 0);
        assert_eq!(choice(i)["logprobs"], Value::Null);
    }
    for c in &chunks[..4] {
        let usage = c.as_object().unwrap().get("usage");
        assert_eq!(usage, Some(&Value::Null));
    }
    assert_eq!(chunks[4]["choices"], json!([]));
    assert_eq!(chunks[4]["usage"], json!({"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}));
    // Nothing after the terminal.
    assert!(r.render(&text("late")).is_empty());
}

#[test]
fn streaming_without_include_usage_has_no_usage_key_and_role_chunk_is_implicit() {
    let mut r = ChunkRenderer::new(meta(), false);
    let chunks = render_all(&mut r, &[text("hi"), usage(1, 1), completed(pb::FinishReason::Length)]);
    assert_eq!(chunks.len(), 3);
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    assert_eq!(chunks[1]["choices"][0]["delta"], json!({"content": "hi"}));
    assert_eq!(chunks[2]["choices"][0]["finish_reason"], "length");
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
}

#[test]
fn streaming_usage_chunk_is_zero_without_usage_event() {
    let mut r = ChunkRenderer::new(meta(), true);
    let chunks = render_all(&mut r, &[completed(pb::FinishReason::ContentFilter)]);
    assert_eq!(chunks.len(), 3);
    assert_eq!(chunks[1]["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(chunks[2]["usage"], json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}));
}

#[test]
fn streaming_tool_call_pieces() {
    let mut r = ChunkRenderer::new(meta(), false);
    let chunks = render_all(
        &mut r,
        &[
            started(),
            tool(0, "call_a", "get_weather", ""),
            tool(0, "", "", "{\"city\":"),
            tool(0, "", "", "\"Paris\"}"),
            tool(1, "call_b", "noop", "{}"),
            completed(pb::FinishReason::ToolCalls),
        ],
    );
    assert_eq!(chunks.len(), 7);
    let delta = |i: usize| chunks[i]["choices"][0]["delta"].clone();
    assert_eq!(
        delta(1),
        json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                               "function": {"name": "get_weather", "arguments": ""}}]})
    );
    assert_eq!(delta(2), json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\":"}}]}));
    assert_eq!(delta(3), json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}));
    // A call opens with its id and name, its arguments follow.
    assert_eq!(
        delta(4),
        json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                               "function": {"name": "noop", "arguments": ""}}]})
    );
    assert_eq!(delta(5), json!({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}));
    assert_eq!(chunks[6]["choices"][0]["finish_reason"], "tool_calls");
}

#[test]
fn streaming_failure_renders_openai_error_and_cancel_renders_nothing() {
    let failure = pb::ExecutionFailure::new(pb::FailureKind::ResponseStalled, "provider stalled");
    let mut r = ChunkRenderer::new(meta(), true);
    let out = r.render(&Event::Failed(pb::RunFailed { failure: Some(failure.clone()) }));
    assert_eq!(out.len(), 1);
    let v: Value = serde_json::from_str(&out[0]).unwrap();
    assert_eq!(v, ApiError::Execution(failure.clone()).openai_body());
    assert_eq!(v["error"]["message"], "provider stalled");
    assert_eq!(v["error"]["code"], "response_stalled");
    assert_eq!(stream_error_payload(&failure), out[0]);

    let mut r = ChunkRenderer::new(meta(), true);
    let cancelled = Event::Cancelled(pb::RunCancelled { reason: pb::CancelReason::ClientDisconnected.into() });
    assert!(r.render(&cancelled).is_empty());
}

#[test]
fn aggregates_text_tool_calls_and_usage() {
    let mut agg = CompletionAggregator::new(meta());
    for e in [
        started(),
        text("Let me "),
        text("check."),
        tool(1, "call_b", "noop", "{}"),
        tool(0, "call_a", "get_weather", "{\"city\""),
        tool(0, "", "", ":\"Paris\"}"),
        usage(10, 5),
        completed(pb::FinishReason::ToolCalls),
    ] {
        agg.push(&e);
    }
    let body = agg.finish().unwrap();
    assert_eq!(
        body,
        json!({
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": 1_700_000_000u64,
            "model": "llama",
            "system_fingerprint": null,
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Let me check.",
                    "refusal": null,
                    // In the order the calls appeared (the transcript's blocks).
                    "tool_calls": [
                        {"id": "call_b", "type": "function", "function": {"name": "noop", "arguments": "{}"}},
                        {"id": "call_a", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}
                    ]
                },
                "logprobs": null,
                "finish_reason": "tool_calls"
            }],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        })
    );
}

#[test]
fn aggregated_tool_calls_only_have_null_content_and_text_only_has_no_tool_calls() {
    let mut agg = CompletionAggregator::new(meta());
    agg.push(&tool(0, "call_a", "f", "{}"));
    agg.push(&completed(pb::FinishReason::ToolCalls));
    let body = agg.finish().unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], Value::Null);

    let mut agg = CompletionAggregator::new(meta());
    agg.push(&text("hello"));
    agg.push(&completed(pb::FinishReason::Stop));
    let body = agg.finish().unwrap();
    let message = &body["choices"][0]["message"];
    assert_eq!(message["content"], "hello");
    assert!(message.get("tool_calls").is_none());
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["usage"], json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}));
}

#[test]
fn aggregator_failed_returns_the_failure() {
    let mut failure = pb::ExecutionFailure::new(pb::FailureKind::ProviderHttpStatus, "rate limited");
    failure.provider_status = 429;
    let mut agg = CompletionAggregator::new(meta());
    agg.push(&text("partial"));
    agg.push(&Event::Failed(pb::RunFailed { failure: Some(failure.clone()) }));
    agg.push(&completed(pb::FinishReason::Stop)); // ignored after the terminal
    assert_eq!(agg.finish().unwrap_err(), ApiError::Execution(failure));
}

#[test]
fn aggregator_without_completion_is_an_execution_error() {
    let mut agg = CompletionAggregator::new(meta());
    agg.push(&text("partial"));
    let Err(ApiError::Execution(f)) = agg.finish() else { panic!("expected Execution error") };
    assert_eq!(f.kind(), pb::FailureKind::TransportLost);

    let mut agg = CompletionAggregator::new(meta());
    agg.push(&Event::Cancelled(pb::RunCancelled { reason: pb::CancelReason::ClientDisconnected.into() }));
    let Err(ApiError::Execution(f)) = agg.finish() else { panic!("expected Execution error") };
    assert_eq!(f.kind(), pb::FailureKind::Internal);

    let mut agg = CompletionAggregator::new(meta());
    agg.push(&Event::Failed(pb::RunFailed { failure: None }));
    let Err(ApiError::Execution(f)) = agg.finish() else { panic!("expected Execution error") };
    assert_eq!(f.kind(), pb::FailureKind::Internal);
}

/// Issue 13 items 2, 3, 5: tool choice, structured output and the wider
/// options reach the run; what IOP cannot serve is refused by name.
#[test]
fn tool_choice_response_format_and_sampling_options_are_carried() {
    let tools = json!([{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]);
    let base = |extra: Value| {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        parse_request(body.to_string().as_bytes())
    };
    let r = base(json!({
        "tool_choice": {"type": "function", "function": {"name": "lookup"}},
        "parallel_tool_calls": false,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "strict": true, "schema": {"type": "object"}}},
        "presence_penalty": 1.5, "frequency_penalty": -1, "top_k": 20,
        "user": "u-1", "metadata": {"k": "v"}, "store": false, "logprobs": false
    }))
    .unwrap();
    let o = r.options;
    assert_eq!(o.tool_choice, Some(pb::ToolChoice { mode: pb::ToolChoiceMode::Named.into(), name: "lookup".into() }));
    assert_eq!(o.parallel_tool_calls, Some(false));
    let format = o.response_format.unwrap();
    assert_eq!((format.kind(), format.name.as_str(), format.strict), (pb::ResponseFormatKind::JsonSchema, "a", true));
    assert_eq!(format.schema_json, r#"{"type":"object"}"#);
    assert_eq!((o.presence_penalty, o.frequency_penalty, o.top_k), (Some(1.5), Some(-1.0), Some(20)));
    for (choice, mode) in [
        ("auto", pb::ToolChoiceMode::Auto),
        ("none", pb::ToolChoiceMode::None),
        ("required", pb::ToolChoiceMode::Required),
    ] {
        let o = base(json!({"tool_choice": choice})).unwrap().options;
        assert_eq!(o.tool_choice.unwrap().mode(), mode);
    }
    let o = base(json!({"response_format": {"type": "json_object"}})).unwrap().options;
    assert_eq!(o.response_format.unwrap().kind(), pb::ResponseFormatKind::JsonObject);

    let refused = [
        (json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}}), "tool_choice"),
        (json!({"tool_choice": "sometimes"}), "tool_choice"),
        (json!({"response_format": {"type": "yaml"}}), "response_format.type"),
        (json!({"response_format": {"type": "json_schema"}}), "response_format.json_schema"),
        (json!({"presence_penalty": 3}), "presence_penalty"),
        (json!({"logprobs": true}), "logprobs"),
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (json!({"logit_bias": {"50256": -100}}), "logit_bias"),
        (json!({"n": 2}), "n"),
    ];
    for (extra, param) in refused {
        let err = base(extra.clone()).unwrap_err();
        assert!(matches!(&err, ApiError::InvalidRequest { param: Some(p), .. } if p == param), "{extra}: {err:?}");
    }
}

/// Issue 45 item 3: `parallel_tool_calls: false` with `tools: []` (Codex's
/// compaction) is accepted and carried; the adapters make it a no-op.
#[test]
fn parallel_tool_calls_false_without_tools_is_accepted() {
    for tools in [json!({"tools": []}), json!({})] {
        let mut body =
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "parallel_tool_calls": false});
        body.as_object_mut().unwrap().extend(tools.as_object().unwrap().clone());
        let r = parse(body).unwrap();
        assert!(r.tools.is_empty());
        assert_eq!(r.options.parallel_tool_calls, Some(false));
    }
}
