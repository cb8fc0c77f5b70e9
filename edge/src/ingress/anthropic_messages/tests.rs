use super::*;
use crate::ingress::test_events::{completed, started, text, tool, usage};
use pb::run_event::Event;

fn parse(v: Value) -> Result<MessagesRequest, ApiError> {
    parse_request(v.to_string().as_bytes())
}

fn meta() -> ResponseMeta {
    ResponseMeta { id: "msg_test".into(), model: "claude-local".into(), omit_thinking: false }
}

fn msg(role: pb::Role, content: &str) -> pb::ChatMessage {
    text_message(role, content.into())
}

/// Every rendered event as (name, parsed JSON); checks that the JSON
/// `type` always equals the SSE event name.
fn render_all(renderer: &mut EventRenderer, events: &[Event]) -> Vec<(&'static str, Value)> {
    events
        .iter()
        .flat_map(|e| renderer.render(e))
        .map(|(name, payload)| {
            let v: Value = serde_json::from_str(&payload).expect("payload is JSON");
            assert_eq!(v["type"], name, "type of {payload}");
            (name, v)
        })
        .collect()
}

fn names(events: &[(&'static str, Value)]) -> Vec<&'static str> {
    events.iter().map(|(n, _)| *n).collect()
}

// ---------------------------------------------------- output_config

/// Issue 27 item 2: `output_config.format` (and the beta's
/// `output_format`) reaches the run as a JSON-schema response format,
/// as Chat's `response_format` does; `effort` is accepted.
#[test]
fn output_config_format_becomes_the_runs_json_schema() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]});
    let base = || json!({"model": "claude", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]});
    let with = |key: &str, value: Value| {
        let mut body = base();
        body[key] = value;
        parse(body)
    };
    let expected = pb::ResponseFormat {
        kind: pb::ResponseFormatKind::JsonSchema.into(),
        schema_json: schema.to_string(),
        name: String::new(),
        strict: true,
    };
    let format = json!({"type": "json_schema", "schema": schema});
    // As `messages.parse` sends it, and with Claude Code's `effort`.
    for config in [json!({"format": format}), json!({"format": format, "effort": "high"})] {
        let req = with("output_config", config).unwrap();
        assert_eq!(req.options.response_format.as_ref(), Some(&expected));
        // Without adaptive thinking, effort steers nothing.
        assert_eq!(req.options.reasoning_effort, None);
    }
    assert_eq!(with("output_format", format.clone()).unwrap().options.response_format, Some(expected));

    // `effort` alone (Claude Code's every request), any level, and other fields pass.
    for effort in ["low", "medium", "high", "xhigh", "max"] {
        let req = with("output_config", json!({"effort": effort, "task_budget": {"type": "tokens", "total": 9}}));
        assert_eq!(req.unwrap().options.response_format, None, "{effort}");
    }
    assert_eq!(with("output_config", json!(null)).unwrap().options, parse(base()).unwrap().options);

    for (config, param) in [
        (json!("json"), "output_config"),
        (json!({"format": "json"}), "output_config.format"),
        (json!({"format": {"schema": schema}}), "output_config.format.type"),
        (json!({"format": {"type": "json_object"}}), "output_config.format.type"),
        (json!({"format": {"type": "json_schema"}}), "output_config.format.schema"),
        (json!({"format": {"type": "json_schema", "schema": "{}"}}), "output_config.format.schema"),
        (json!({"effort": "extreme"}), "output_config.effort"),
        (json!({"effort": 3}), "output_config.effort"),
    ] {
        let err = with("output_config", config.clone()).unwrap_err();
        assert!(matches!(&err, ApiError::InvalidRequest { param: Some(p), .. } if p == param), "{config}: {err:?}");
    }
    let mut both = base();
    both["output_config"] = json!({"format": format});
    both["output_format"] = format;
    assert!(
        matches!(parse(both).unwrap_err(), ApiError::InvalidRequest { param: Some(p), .. } if p == "output_format")
    );
}

/// With adaptive thinking, `output_config.effort` is the effort; with a
/// thinking budget the budget's effort stands.
#[test]
fn output_config_effort_steers_adaptive_thinking_only() {
    let effort_of = |extra: Value| {
        let mut body = json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]});
        extra.as_object().unwrap().iter().for_each(|(k, v)| body[k] = v.clone());
        parse(body).unwrap().options.reasoning_effort.map(|e| pb::ReasoningEffort::try_from(e).unwrap())
    };
    let adaptive = |effort: &str| json!({"thinking": {"type": "adaptive"}, "output_config": {"effort": effort}});
    assert_eq!(effort_of(adaptive("low")), Some(pb::ReasoningEffort::Low));
    assert_eq!(effort_of(adaptive("medium")), Some(pb::ReasoningEffort::Medium));
    assert_eq!(effort_of(adaptive("max")), Some(pb::ReasoningEffort::High));
    assert_eq!(effort_of(json!({"thinking": {"type": "adaptive"}})), Some(pb::ReasoningEffort::Adaptive));
    let budget = json!({"thinking": {"type": "enabled", "budget_tokens": 2048}, "output_config": {"effort": "high"}});
    assert_eq!(effort_of(budget), Some(pb::ReasoningEffort::Low));
    let off = json!({"thinking": {"type": "disabled"}, "output_config": {"effort": "high"}});
    assert_eq!(effort_of(off), Some(pb::ReasoningEffort::None));
    assert_eq!(effort_of(json!({"output_config": {"effort": "high"}})), None);
}

// ------------------------------------------------------------ parse

#[test]
fn minimal_request_parses_with_defaults() {
    let req =
        parse(json!({"model": "claude", "max_tokens": 1024, "messages": [{"role": "user", "content": "hi"}]})).unwrap();
    assert_eq!(req.model, "claude");
    assert!(!req.stream);
    assert!(req.tools.is_empty());
    assert_eq!(req.options, pb::GenerationOptions { max_tokens: Some(1024), ..Default::default() });
    assert_eq!(req.messages, vec![msg(pb::Role::User, "hi")]);
}

#[test]
fn sdk_style_request_with_system_tools_and_tool_round_trip() {
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let req = parse(json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 512,
        "system": [
            {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Use tools."}
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_02", "name": "get_time", "input": {}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "sunny"},
                {"type": "tool_result", "tool_use_id": "toolu_02",
                 "content": [{"type": "text", "text": "no"}, {"type": "text", "text": "clock"}], "is_error": true},
                {"type": "text", "text": "Thanks!"}
            ]},
            {"role": "assistant", "content": "Sure."},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_03"}]}
        ],
        "tools": [
            {"name": "get_weather", "description": "Weather", "input_schema": schema,
             "cache_control": {"type": "ephemeral"}},
            {"type": "custom", "name": "get_time", "input_schema": {"type": "object"}}
        ],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
        "stream": true,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "stop_sequences": ["\n\nHuman:", "END"],
        "metadata": {"user_id": "u-1"},
        "thinking": null,
        "service_tier": "auto"
    }))
    .unwrap();

    assert!(req.stream);
    assert_eq!(
        req.options,
        pb::GenerationOptions {
            max_tokens: Some(512),
            temperature: Some(0.5),
            top_p: Some(0.9),
            stop: vec!["\n\nHuman:".into(), "END".into()],
            top_k: Some(40),
            tool_choice: Some(pb::ToolChoice { mode: pb::ToolChoiceMode::Auto.into(), name: String::new() }),
            parallel_tool_calls: Some(false),
            ..Default::default()
        }
    );
    let tool_msg =
        |id: &str, content: &str| pb::ChatMessage { tool_call_id: id.into(), ..msg(pb::Role::Tool, content) };
    assert_eq!(
        req.messages,
        vec![
            msg(pb::Role::System, "You are terse.\nUse tools."),
            msg(pb::Role::User, "Weather in Paris?"),
            pb::ChatMessage {
                tool_calls: vec![
                    pb::ToolCall {
                        id: "toolu_01".into(),
                        name: "get_weather".into(),
                        arguments_json: r#"{"city":"Paris"}"#.into(),
                    },
                    pb::ToolCall { id: "toolu_02".into(), name: "get_time".into(), arguments_json: "{}".into() },
                ],
                ..msg(pb::Role::Assistant, "Let me check.")
            },
            tool_msg("toolu_01", "sunny"),
            tool_msg("toolu_02", "Error: no\nclock"),
            msg(pb::Role::User, "Thanks!"),
            msg(pb::Role::Assistant, "Sure."),
            tool_msg("toolu_03", ""),
        ]
    );

    assert_eq!(req.tools.len(), 2);
    assert_eq!(req.tools[0].name, "get_weather");
    assert_eq!(req.tools[0].description, "Weather");
    let parsed: Value = serde_json::from_str(&req.tools[0].parameters_json).unwrap();
    assert_eq!(parsed, schema);
    assert_eq!(req.tools[1].description, "");
    let parsed: Value = serde_json::from_str(&req.tools[1].parameters_json).unwrap();
    assert_eq!(parsed, json!({"type": "object"}));
}

#[test]
fn system_string_and_empty_system() {
    let base = |system: Value| {
        parse(json!({
            "model": "m", "max_tokens": 1, "system": system,
            "messages": [{"role": "user", "content": "x"}]
        }))
        .unwrap()
        .messages
    };
    assert_eq!(base(json!("be brief")), vec![msg(pb::Role::System, "be brief"), msg(pb::Role::User, "x")]);
    assert_eq!(base(json!("")), vec![msg(pb::Role::User, "x")]);
    assert_eq!(base(json!([])), vec![msg(pb::Role::User, "x")]);
}

#[test]
fn malformed_and_non_object_bodies_are_rejected() {
    let err = parse_request(b"{").unwrap_err();
    let ApiError::InvalidRequest { message, param } = err else { panic!("not InvalidRequest") };
    assert!(message.starts_with("invalid JSON: "), "{message}");
    assert_eq!(param, None);

    for body in [&b"[]"[..], b"\"s\"", b"1", b"null"] {
        assert_eq!(parse_request(body).unwrap_err(), ApiError::invalid("request body must be a JSON object"));
    }
}

/// What Claude Code 2.1.332 sent with default settings (recorded through
/// a capturing proxy; long texts cut): a system turn inside `messages`,
/// adaptive thinking with `display: omitted`, `context_management`,
/// `output_config.effort`, a deferred tool, then a Bash round trip.
#[test]
fn claude_code_requests_parse() {
    let recorded: Value = serde_json::from_str(include_str!("../fixtures/claude-code-2.1.332.json")).unwrap();
    let first = parse(recorded["first_turn"].clone()).unwrap();
    let roles: Vec<pb::Role> = first.messages.iter().map(|m| m.role()).collect();
    assert_eq!(roles, [pb::Role::System, pb::Role::User, pb::Role::System]);
    assert!(first.messages[2].content.starts_with("# Environment"), "{}", first.messages[2].content);
    // Adaptive thinking steered by `output_config.effort: "high"`.
    assert_eq!(first.options.reasoning_effort, Some(pb::ReasoningEffort::High.into()));
    assert!(first.omit_thinking);
    assert!(first.stream);
    assert!(first.dropped_tools.is_empty());
    let names: Vec<&str> = first.tools.iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"Bash") && names.contains(&"Write"), "{names:?}");
    assert!(!names.contains(&"DeferredToolPlaceholder"), "a deferred tool is not offered: {names:?}");

    let round_trip = parse(recorded["tool_round_trip"].clone()).unwrap();
    let n = round_trip.messages.len();
    let (call, result) = (&round_trip.messages[n - 2], &round_trip.messages[n - 1]);
    assert_eq!(call.role(), pb::Role::Assistant);
    assert_eq!(call.tool_calls[0].name, "Bash");
    assert_eq!(result.role(), pb::Role::Tool);
    assert_eq!(result.tool_call_id, call.tool_calls[0].id);
}

#[test]
fn a_system_turn_inside_the_conversation_keeps_its_place() {
    let req = parse(json!({"model": "m", "max_tokens": 8, "system": "be brief", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "env: linux"}, {"type": "text", "text": "cwd: /"}]},
        {"role": "assistant", "content": "hello"},
    ]}))
    .unwrap();
    assert_eq!(
        req.messages,
        vec![
            msg(pb::Role::System, "be brief"),
            msg(pb::Role::User, "hi"),
            msg(pb::Role::System, "env: linux\ncwd: /"),
            msg(pb::Role::Assistant, "hello"),
        ]
    );
}

#[test]
fn adaptive_thinking_leaves_the_depth_to_the_provider_and_display_omitted_sends_empty_thinking() {
    let with = |thinking: Value| {
        parse(json!({"model": "m", "max_tokens": 8, "thinking": thinking, "messages": [{"role": "user", "content": "x"}]}))
            .unwrap()
    };
    let adaptive = with(json!({"type": "adaptive"}));
    assert_eq!(adaptive.options.reasoning_effort, Some(pb::ReasoningEffort::Adaptive.into()));
    assert!(!adaptive.omit_thinking);
    assert!(with(json!({"type": "enabled", "budget_tokens": 2048, "display": "omitted"})).omit_thinking);
    assert!(!with(json!({"type": "adaptive", "display": "summarized"})).omit_thinking);

    let events = [
        started(),
        Event::Reasoning(pb::ReasoningDelta { text: "secret plan".into() }),
        text("hi"),
        usage(3, 2),
        completed(pb::FinishReason::Stop),
    ];
    let omitting = || ResponseMeta { omit_thinking: true, ..meta() };
    let streamed = render_all(&mut EventRenderer::new(omitting()), &events);
    assert!(!streamed.iter().any(|(_, v)| v.to_string().contains("secret plan")), "{streamed:?}");
    assert_eq!(streamed[1].1["content_block"], json!({"type": "thinking", "thinking": "", "signature": ""}));
    let mut aggregator = MessageAggregator::new(omitting());
    events.iter().for_each(|e| aggregator.push(e));
    let body = aggregator.finish().unwrap();
    assert_eq!(body["content"][0], json!({"type": "thinking", "thinking": "", "signature": ""}));
    assert_eq!(body["content"][1]["text"], "hi");
}

/// Every documented `thinking.display` parses (Claude Code's `stream-json`
/// sends `updates`); `summarized`, `updates` and no display stream the
/// reasoning as it comes, `omitted` sends empty thinking blocks, streaming
/// and not.
#[test]
fn every_documented_thinking_display_is_accepted_and_rendered() {
    let events = [
        started(),
        Event::Reasoning(pb::ReasoningDelta { text: "plan".into() }),
        text("hi"),
        usage(3, 2),
        completed(pb::FinishReason::Stop),
    ];
    for (display, shown) in
        [(Some("summarized"), true), (Some("updates"), true), (Some("omitted"), false), (None, true)]
    {
        let mut thinking = json!({"type": "adaptive"});
        if let Some(display) = display {
            thinking["display"] = json!(display);
        }
        let request =
            parse(json!({"model": "m", "max_tokens": 8, "thinking": thinking, "messages": [{"role": "user", "content": "x"}]}))
                .unwrap();
        assert_eq!(request.omit_thinking, !shown, "{display:?}");
        let meta = || ResponseMeta { omit_thinking: request.omit_thinking, ..meta() };
        let expected = if shown { "plan" } else { "" };

        let streamed = render_all(&mut EventRenderer::new(meta()), &events);
        let deltas: String = streamed
            .iter()
            .filter(|(_, v)| v["delta"]["type"] == "thinking_delta")
            .map(|(_, v)| v["delta"]["thinking"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(deltas, expected, "{display:?}: {streamed:?}");
        assert_eq!(streamed[1].1["content_block"]["type"], "thinking", "{display:?}");

        let mut aggregator = MessageAggregator::new(meta());
        events.iter().for_each(|e| aggregator.push(e));
        let body = aggregator.finish().unwrap();
        assert_eq!(
            body["content"][0],
            json!({"type": "thinking", "thinking": expected, "signature": ""}),
            "{display:?}"
        );
    }
}

/// Claude Code's Read of a PDF answers a `document` block inside the
/// `tool_result`; a user turn may carry documents too (base64 PDF, `text`
/// and `content` sources). Each reads as its labelled text, in place.
#[test]
fn documents_in_user_turns_and_tool_results_read_as_their_text() {
    use base64::Engine as _;
    let pdf = base64::engine::general_purpose::STANDARD
        .encode(crate::ingress::documents::tests::pdf(&["Invoice total 42 EUR"]));
    let request = parse(json!({"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "/a/invoice.pdf"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "text", "text": "PDF file read"},
                {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": pdf}}
            ]},
            {"type": "document", "title": "notes.md", "source": {"type": "text", "media_type": "text/plain", "data": "plain notes"}},
            {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": "chunk one"}]}},
            {"type": "text", "text": "summarize"}
        ]}
    ]}))
    .unwrap();
    let tool = &request.messages[2];
    assert_eq!(tool.role, pb::Role::Tool as i32);
    assert!(tool.content.starts_with("PDF file read\n<document type=\"PDF\" pages=\"1\">\n"), "{}", tool.content);
    assert!(tool.content.contains("Invoice total 42 EUR"), "{}", tool.content);
    let user = &request.messages[3];
    assert_eq!(
        user.content,
        "<document name=\"notes.md\" type=\"text\">\nplain notes\n</document>\n\
         <document type=\"text\">\nchunk one\n</document>\nsummarize"
    );
}

#[test]
fn an_image_a_tool_returned_follows_the_tool_results_in_the_user_turn() {
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";
    let req = parse(json!({"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "a.png"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
        ]}]},
    ]}))
    .unwrap();
    let shape: Vec<(pb::Role, &str, usize)> =
        req.messages.iter().map(|m| (m.role(), m.content.as_str(), m.images.len())).collect();
    assert_eq!(
        shape,
        [
            (pb::Role::User, "read it", 0),
            (pb::Role::Assistant, "", 0),
            (pb::Role::Tool, "", 0),
            (pb::Role::User, "", 1)
        ]
    );
    assert_eq!(req.messages[2].tool_call_id, "t1");
}

#[test]
fn a_deferred_tool_is_offered_once_a_tool_reference_loads_it() {
    let tools = json!([
        {"name": "ToolSearch", "input_schema": {"type": "object"}},
        {"name": "WebFetch", "input_schema": {"type": "object"}, "defer_loading": true},
        {"name": "Cron", "input_schema": {"type": "object"}, "defer_loading": true},
    ]);
    let names = |req: &MessagesRequest| req.tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
    let before =
        parse(json!({"model": "m", "max_tokens": 8, "tools": tools, "messages": [{"role": "user", "content": "x"}]}))
            .unwrap();
    assert_eq!(names(&before), ["ToolSearch"]);
    let after = parse(json!({"model": "m", "max_tokens": 8, "tools": tools, "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ToolSearch", "input": {"query": "fetch"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "found:"}, {"type": "tool_reference", "tool_name": "WebFetch"}
        ]}]},
    ]}))
    .unwrap();
    assert_eq!(names(&after), ["ToolSearch", "WebFetch"]);
    assert_eq!(after.messages[2].content, "found:\nTool `WebFetch` is now available.");
}

#[test]
fn server_tools_are_listed_as_dropped_and_not_offered() {
    let req = parse(json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "tools": [
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        {"name": "f", "input_schema": {"type": "object"}},
        {"type": "web_fetch_20250910", "name": "web_fetch"},
    ]}))
    .unwrap();
    assert_eq!(req.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["f"]);
    assert_eq!(
        req.dropped_tools,
        [
            DroppedTool { path: "tools.0".into(), kind: "web_search" },
            DroppedTool { path: "tools.2".into(), kind: "web_fetch" }
        ]
    );
    // Anthropic-defined client tools have no schema to give a local model.
    let bash = parse(json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "bash_20250124", "name": "bash"}]}));
    assert_eq!(
        bash.unwrap_err().message(),
        "tools.0: tool type `bash_20250124` is not supported; only custom tools (with `input_schema`) are"
    );
}

#[test]
fn invalid_requests_name_the_field() {
    let user = json!({"role": "user", "content": "hi"});
    let with = |extra: Value| {
        let mut base = json!({"model": "m", "max_tokens": 16, "messages": [user.clone()]});
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        base
    };
    let msgs = |m: Value| with(json!({"messages": m}));
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"max_tokens": 1, "messages": [user.clone()]}), "model", "model: Field required"),
        (with(json!({"model": 3})), "model", "model: Input should be a string"),
        (with(json!({"model": ""})), "model", "model: must not be empty"),
        (json!({"model": "m", "messages": [user.clone()]}), "max_tokens", "max_tokens: Field required"),
        (with(json!({"max_tokens": null})), "max_tokens", "max_tokens: Field required"),
        (with(json!({"max_tokens": "10"})), "max_tokens", "max_tokens: Input should be an integer"),
        (
            with(json!({"max_tokens": 0})),
            "max_tokens",
            "max_tokens: Input should be an integer between 1 and 4294967295",
        ),
        (
            with(json!({"max_tokens": 1.5})),
            "max_tokens",
            "max_tokens: Input should be an integer between 1 and 4294967295",
        ),
        (json!({"model": "m", "max_tokens": 1}), "messages", "messages: Field required"),
        (msgs(json!([])), "messages", "messages: at least one message is required"),
        (msgs(json!("hi")), "messages", "messages: Input should be an array"),
        (msgs(json!([user.clone(), "x"])), "messages.1", "messages.1: Input should be an object"),
        (msgs(json!([{"content": "x"}])), "messages.0.role", "messages.0.role: Field required"),
        (
            msgs(json!([user.clone(), {"role": "tool", "content": "x"}])),
            "messages.1.role",
            "messages.1.role: Input should be 'user', 'assistant' or 'system' (got `tool`)",
        ),
        (
            msgs(json!([user.clone(), {"role": "system", "content": [{"type": "image", "source": {}}]}])),
            "messages.1.content.0.type",
            "messages.1.content.0: content block type `image` is not supported",
        ),
        (
            with(json!({"thinking": {"type": "adaptive", "display": "full"}})),
            "thinking.display",
            "thinking.display: unknown value `full`; expected summarized, omitted or updates",
        ),
        (
            with(json!({"tools": [{"name": "f", "input_schema": {}, "defer_loading": "yes"}]})),
            "tools.0.defer_loading",
            "tools.0.defer_loading: Input should be a boolean",
        ),
        (msgs(json!([{"role": "user"}])), "messages.0.content", "messages.0.content: Field required"),
        (
            msgs(json!([{"role": "user", "content": 5}])),
            "messages.0.content",
            "messages.0.content: Input should be a string or an array of content blocks",
        ),
        (
            msgs(json!([{"role": "user", "content": []}])),
            "messages.0.content",
            "messages.0.content: must not be an empty array",
        ),
        (
            msgs(json!([{"role": "user", "content": ["hi"]}])),
            "messages.0.content.0",
            "messages.0.content.0: Input should be an object",
        ),
        (
            msgs(json!([{"role": "user", "content": [{"text": "hi"}]}])),
            "messages.0.content.0.type",
            "messages.0.content.0.type: Field required",
        ),
        (
            msgs(json!([{"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "AA=="}}
            ]}])),
            "messages.0.content.1.source.data",
            "`messages.0.content.1.source.data`: image type `image/bmp` is not supported (png, jpeg, gif or webp)",
        ),
        (
            msgs(json!([user.clone(), {"role": "assistant", "content": [{"type": "document", "source": {}}]}])),
            "messages.1.content.0.type",
            "messages.1.content.0: content block type `document` is not supported",
        ),
        (
            msgs(
                json!([{"role": "user", "content": [{"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}}]}]),
            ),
            "messages.0.content.0",
            "messages.0.content.0: document source `url` is not supported; send the document inline (base64 or text)",
        ),
        (
            msgs(json!([{"role": "user", "content": [{"type": "document", "source": {
                "type": "base64", "media_type": "application/msword", "data": "AA=="}}]}])),
            "messages.0.content.0",
            "messages.0.content.0: document type `application/msword` is not supported (application/pdf, or text/* as UTF-8)",
        ),
        (
            msgs(json!([{"role": "user", "content": [
                {"type": "thinking", "thinking": "hm", "signature": "s"}
            ]}])),
            "messages.0.content.0.type",
            "messages.0.content.0: content block type `thinking` is not supported",
        ),
        (
            msgs(json!([{"role": "user", "content": [{"type": "text", "text": 1}]}])),
            "messages.0.content.0.text",
            "messages.0.content.0.text: Input should be a string",
        ),
        (
            msgs(json!([{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}])),
            "messages.0.content.0.type",
            "messages.0.content.0: `tool_use` blocks are only allowed in assistant messages",
        ),
        (
            msgs(json!([{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}])),
            "messages.0.content.0.type",
            "messages.0.content.0: `tool_result` blocks are only allowed in user messages",
        ),
        (
            msgs(json!([{"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]}])),
            "messages.0.content.0.id",
            "messages.0.content.0.id: Field required",
        ),
        (
            msgs(json!([{"role": "assistant", "content": [
                {"type": "tool_use", "id": "t", "name": "", "input": {}}
            ]}])),
            "messages.0.content.0.name",
            "messages.0.content.0.name: must not be empty",
        ),
        (
            msgs(json!([{"role": "assistant", "content": [
                {"type": "tool_use", "id": "t", "name": "f", "input": "{}"}
            ]}])),
            "messages.0.content.0.input",
            "messages.0.content.0.input: Input should be an object",
        ),
        (
            msgs(json!([{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}])),
            "messages.0.content.0.tool_use_id",
            "messages.0.content.0.tool_use_id: Field required",
        ),
        (
            msgs(json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 3}]}])),
            "messages.0.content.0.content",
            "messages.0.content.0.content: Input should be a string or an array of text blocks",
        ),
        (
            msgs(json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                "content": [{"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "bm90IGEgcGRm"}}]}]}])),
            "messages.0.content.0.content.0",
            "messages.0.content.0.content.0: PDF cannot be read (malformed or truncated)",
        ),
        (
            msgs(json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                "content": [{"type": "image", "source": {}}]}]}])),
            "messages.0.content.0.content.0.source.type",
            "messages.0.content.0.content.0.source.type: Field required",
        ),
        (
            msgs(json!([{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}
            ]}])),
            "messages.0.content.0.is_error",
            "messages.0.content.0.is_error: Input should be a boolean",
        ),
        (with(json!({"system": 1})), "system", "system: Input should be a string or an array of text blocks"),
        (
            with(json!({"system": [{"type": "image"}]})),
            "system.0.type",
            "system.0: content block type `image` is not supported",
        ),
        (with(json!({"tools": {}})), "tools", "tools: Input should be an array"),
        (
            with(json!({"tools": [{"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}]})),
            "tools.0.type",
            "tools.0: tool type `text_editor_20250728` is not supported; only custom tools (with `input_schema`) are",
        ),
        (with(json!({"tools": [{"input_schema": {}}]})), "tools.0.name", "tools.0.name: Field required"),
        (with(json!({"tools": [{"name": "f"}]})), "tools.0.input_schema", "tools.0.input_schema: Field required"),
        (
            with(json!({"tools": [{"name": "f", "input_schema": "{}"}]})),
            "tools.0.input_schema",
            "tools.0.input_schema: Input should be an object",
        ),
        (
            with(json!({"tools": [{"name": "f", "description": 2, "input_schema": {}}]})),
            "tools.0.description",
            "tools.0.description: Input should be a string",
        ),
        (with(json!({"stream": "yes"})), "stream", "stream: Input should be a boolean"),
        (with(json!({"temperature": "hot"})), "temperature", "temperature: Input should be a number"),
        (with(json!({"temperature": 1.5})), "temperature", "temperature: Input should be between 0 and 1"),
        (with(json!({"top_p": -0.1})), "top_p", "top_p: Input should be between 0 and 1"),
        (with(json!({"top_k": "5"})), "top_k", "top_k: Input should be an integer"),
        (with(json!({"top_k": 0})), "top_k", "top_k: Input should be an integer between 1 and 4294967295"),
        (
            with(json!({"tool_choice": {"type": "tool", "name": "nope"}})),
            "tool_choice.name",
            "`tool_choice.name` names `nope`, which is not one of the request's tools",
        ),
        (
            with(json!({"tool_choice": {"type": "maybe"}})),
            "tool_choice.type",
            "tool_choice.type: unknown type `maybe`; expected auto, any, tool or none",
        ),
        (
            with(json!({"stop_sequences": "END"})),
            "stop_sequences",
            "stop_sequences: Input should be an array of strings",
        ),
        (with(json!({"stop_sequences": ["a", 1]})), "stop_sequences.1", "stop_sequences.1: Input should be a string"),
    ];
    for (body, want_param, want_message) in cases {
        let err = parse(body.clone()).expect_err(&format!("should fail: {body}"));
        assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(err, ApiError::invalid_param(want_param, want_message), "body: {body}");
    }
}

// ------------------------------------------------------------ render

#[test]
fn response_meta_id_is_msg_plus_32_hex_and_synthetic_tool_ids_look_like_anthropic() {
    let meta = ResponseMeta::new("m".into());
    let hex = meta.id.strip_prefix("msg_").unwrap();
    assert_eq!(hex.len(), 32);
    assert!(hex.chars().all(|c| c.is_ascii_hexdigit()));
    assert_ne!(meta.id, ResponseMeta::new("m".into()).id);

    let id = synthetic_tool_use_id();
    let hex = id.strip_prefix("toolu_").unwrap();
    assert_eq!(hex.len(), 24);
    assert!(hex.chars().all(|c| c.is_ascii_hexdigit()));
}

#[test]
fn ping_event() {
    let (name, payload) = EventRenderer::ping();
    assert_eq!(name, "ping");
    assert_eq!(serde_json::from_str::<Value>(&payload).unwrap(), json!({"type": "ping"}));
}

#[test]
fn streaming_text() {
    let mut r = EventRenderer::new(meta());
    let events = render_all(
        &mut r,
        &[started(), text("Hel"), text(""), text("lo"), usage(7, 2), completed(pb::FinishReason::Stop)],
    );
    assert_eq!(
        names(&events),
        vec![
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let values: Vec<&Value> = events.iter().map(|(_, v)| v).collect();
    assert_eq!(
        values,
        vec![
            &json!({"type": "message_start", "message": {
                "id": "msg_test", "type": "message", "role": "assistant", "content": [],
                "model": "claude-local", "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 0, "output_tokens": 0}
            }}),
            &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}}),
            &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}}),
            &json!({"type": "content_block_stop", "index": 0}),
            &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                    "usage": {"input_tokens": 7, "output_tokens": 2}}),
            &json!({"type": "message_stop"}),
        ]
    );
    // Nothing after the terminal.
    assert!(r.render(&text("late")).is_empty());
}

#[test]
fn streaming_message_start_is_implicit_and_empty_responses_are_valid() {
    let mut r = EventRenderer::new(meta());
    let events = render_all(&mut r, &[text("hi"), completed(pb::FinishReason::Length)]);
    assert_eq!(names(&events)[..2], ["message_start", "content_block_start"]);
    assert_eq!(events[4].1["delta"]["stop_reason"], "max_tokens");
    assert_eq!(events[4].1["usage"], json!({"input_tokens": 0, "output_tokens": 0}));

    let mut r = EventRenderer::new(meta());
    let events = render_all(&mut r, &[completed(pb::FinishReason::ContentFilter)]);
    assert_eq!(names(&events), vec!["message_start", "message_delta", "message_stop"]);
    assert_eq!(events[1].1["delta"]["stop_reason"], "refusal");
}

#[test]
fn streaming_tool_use() {
    let mut r = EventRenderer::new(meta());
    let events = render_all(
        &mut r,
        &[
            started(),
            tool(0, "toolu_a", "get_weather", ""),
            tool(0, "", "", "{\"city\":"),
            tool(0, "", "", "\"Paris\"}"),
            tool(1, "call_b", "noop", "{}"),
            usage(20, 9),
            completed(pb::FinishReason::ToolCalls),
        ],
    );
    let values: Vec<&Value> = events.iter().map(|(_, v)| v).collect();
    assert_eq!(
        values[1..],
        [
            &json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {}}}),
            &json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "input_json_delta", "partial_json": "{\"city\":"}}),
            &json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "input_json_delta", "partial_json": "\"Paris\"}"}}),
            &json!({"type": "content_block_stop", "index": 0}),
            &json!({"type": "content_block_start", "index": 1,
                    "content_block": {"type": "tool_use", "id": "call_b", "name": "noop", "input": {}}}),
            &json!({"type": "content_block_delta", "index": 1,
                    "delta": {"type": "input_json_delta", "partial_json": "{}"}}),
            &json!({"type": "content_block_stop", "index": 1}),
            &json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                    "usage": {"input_tokens": 20, "output_tokens": 9}}),
            &json!({"type": "message_stop"}),
        ]
    );
}

#[test]
fn streaming_text_then_tool_uses_two_blocks() {
    let mut r = EventRenderer::new(meta());
    let events = render_all(
        &mut r,
        &[started(), text("Checking."), tool(0, "", "lookup", "{\"q\":1}"), completed(pb::FinishReason::Stop)],
    );
    assert_eq!(
        names(&events),
        vec![
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(events[1].1["index"], 0);
    assert_eq!(events[1].1["content_block"], json!({"type": "text", "text": ""}));
    assert_eq!(events[3].1["index"], 0);
    let block = &events[4].1;
    assert_eq!(block["index"], 1);
    assert_eq!(block["content_block"]["type"], "tool_use");
    assert_eq!(block["content_block"]["name"], "lookup");
    // The node gave no id: a synthetic Anthropic-style one.
    assert!(block["content_block"]["id"].as_str().unwrap().starts_with("toolu_"));
    assert_eq!(events[5].1["index"], 1);
    assert_eq!(events[6].1, json!({"type": "content_block_stop", "index": 1}));
    // A plain stop after tool calls is reported as tool_use.
    assert_eq!(events[7].1["delta"]["stop_reason"], "tool_use");
}

#[test]
fn streaming_repeated_id_continues_and_a_late_piece_of_a_closed_call_fails_the_run() {
    let mut r = EventRenderer::new(meta());
    let events = render_all(
        &mut r,
        &[
            tool(0, "t0", "a", "{"),
            tool(0, "t0", "", "}"),
            text("between"),
            tool(0, "", "", "{\"late\":1}"),
            completed(pb::FinishReason::ToolCalls),
        ],
    );
    assert_eq!(
        names(&events),
        vec![
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            // A block cannot be reopened: the transcript's one policy.
            "error"
        ]
    );
    assert_eq!(events[3].1["delta"]["partial_json"], "}");
    assert_eq!(events[6].1["delta"], json!({"type": "text_delta", "text": "between"}));
    assert_eq!(events[7].1["error"]["type"], "api_error");
}

#[test]
fn streaming_failure_renders_anthropic_error_and_cancel_renders_nothing() {
    let failure = pb::ExecutionFailure::new(pb::FailureKind::ResponseStalled, "provider stalled");
    let mut r = EventRenderer::new(meta());
    let events =
        render_all(&mut r, &[started(), text("par"), Event::Failed(pb::RunFailed { failure: Some(failure.clone()) })]);
    assert_eq!(names(&events), vec!["message_start", "content_block_start", "content_block_delta", "error"]);
    assert_eq!(
        events[3].1,
        json!({"type": "error", "error": {"type": "timeout_error", "message": "provider stalled"}})
    );
    let (name, payload) = stream_error_event(&failure);
    assert_eq!(name, "error");
    assert_eq!(serde_json::from_str::<Value>(&payload).unwrap(), ApiError::Execution(failure).anthropic_body());
    assert!(r.render(&completed(pb::FinishReason::Stop)).is_empty());

    let mut r = EventRenderer::new(meta());
    let events = render_all(&mut r, &[Event::Failed(pb::RunFailed { failure: None })]);
    assert_eq!(events[0].1["error"]["type"], "api_error");

    let mut r = EventRenderer::new(meta());
    render_all(&mut r, &[started()]);
    let cancelled = Event::Cancelled(pb::RunCancelled { reason: pb::CancelReason::ClientDisconnected.into() });
    assert!(r.render(&cancelled).is_empty());
    assert!(r.render(&completed(pb::FinishReason::Stop)).is_empty());
}

#[test]
fn aggregates_text_tool_use_and_usage() {
    let mut agg = MessageAggregator::new(meta());
    for e in [
        started(),
        text("Let me "),
        text("check."),
        tool(0, "toolu_a", "get_weather", "{\"city\""),
        tool(0, "", "", ":\"Paris\"}"),
        tool(1, "toolu_b", "noop", ""),
        text("Done?"),
        usage(10, 5),
        completed(pb::FinishReason::ToolCalls),
    ] {
        agg.push(&e);
    }
    assert_eq!(
        agg.finish().unwrap(),
        json!({
            "id": "msg_test",
            "type": "message",
            "role": "assistant",
            "model": "claude-local",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_b", "name": "noop", "input": {}},
                {"type": "text", "text": "Done?"}
            ],
            "stop_reason": "tool_use",
            "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 5}
        })
    );
}

#[test]
fn aggregated_text_only_and_empty_responses() {
    let mut agg = MessageAggregator::new(meta());
    agg.push(&text("hello"));
    agg.push(&completed(pb::FinishReason::Stop));
    let body = agg.finish().unwrap();
    assert_eq!(body["content"], json!([{"type": "text", "text": "hello"}]));
    assert_eq!(body["stop_reason"], "end_turn");
    assert_eq!(body["usage"], json!({"input_tokens": 0, "output_tokens": 0}));

    let mut agg = MessageAggregator::new(meta());
    agg.push(&completed(pb::FinishReason::Length));
    let body = agg.finish().unwrap();
    assert_eq!(body["content"], json!([]));
    assert_eq!(body["stop_reason"], "max_tokens");

    let mut agg = MessageAggregator::new(meta());
    agg.push(&tool(0, "", "f", "{}"));
    agg.push(&completed(pb::FinishReason::Stop));
    let body = agg.finish().unwrap();
    assert!(body["content"][0]["id"].as_str().unwrap().starts_with("toolu_"));
    assert_eq!(body["stop_reason"], "tool_use");
}

#[test]
fn aggregated_tool_arguments_that_are_not_an_object_are_a_protocol_failure() {
    for args in ["{\"city\":", "[1]", "\"x\""] {
        let mut agg = MessageAggregator::new(meta());
        agg.push(&tool(0, "toolu_a", "get_weather", args));
        agg.push(&completed(pb::FinishReason::ToolCalls));
        let Err(ApiError::Execution(f)) = agg.finish() else { panic!("expected Execution error for {args}") };
        assert_eq!(f.kind(), pb::FailureKind::ProviderProtocol);
        assert!(f.message.contains("get_weather"), "{}", f.message);
    }
}

#[test]
fn aggregator_failed_returns_the_failure() {
    let mut failure = pb::ExecutionFailure::new(pb::FailureKind::ProviderHttpStatus, "rate limited");
    failure.provider_status = 429;
    let mut agg = MessageAggregator::new(meta());
    agg.push(&text("partial"));
    agg.push(&Event::Failed(pb::RunFailed { failure: Some(failure.clone()) }));
    agg.push(&completed(pb::FinishReason::Stop)); // ignored after the terminal
    let err = agg.finish().unwrap_err();
    assert_eq!(err, ApiError::Execution(failure));
    assert_eq!(err.anthropic_body()["error"]["type"], "rate_limit_error");
}

#[test]
fn aggregator_without_completion_is_an_execution_error() {
    let mut agg = MessageAggregator::new(meta());
    agg.push(&text("partial"));
    let Err(ApiError::Execution(f)) = agg.finish() else { panic!("expected Execution error") };
    assert_eq!(f.kind(), pb::FailureKind::TransportLost);

    let mut agg = MessageAggregator::new(meta());
    agg.push(&Event::Cancelled(pb::RunCancelled { reason: pb::CancelReason::ClientDisconnected.into() }));
    let Err(ApiError::Execution(f)) = agg.finish() else { panic!("expected Execution error") };
    assert_eq!(f.kind(), pb::FailureKind::Internal);

    let mut agg = MessageAggregator::new(meta());
    agg.push(&Event::Cancelled(pb::RunCancelled { reason: pb::CancelReason::Deadline.into() }));
    let Err(ApiError::Execution(f)) = agg.finish() else { panic!("expected Execution error") };
    assert_eq!(f.kind(), pb::FailureKind::DeadlineExceeded, "a deadline is no stall");
    assert_eq!(ApiError::Execution(f).code(), "request_timeout");

    let mut agg = MessageAggregator::new(meta());
    agg.push(&Event::Failed(pb::RunFailed { failure: None }));
    let Err(ApiError::Execution(f)) = agg.finish() else { panic!("expected Execution error") };
    assert_eq!(f.kind(), pb::FailureKind::Internal);
}

/// Found by `fuzz_parsers_valid_requests_round_trip`: without serde_json's
/// `float_roundtrip` a float in a tool call's `input` (or a tool schema, or a
/// tunnelled body) came out one ULP off before it reached the provider.
#[test]
fn floats_in_tool_input_reach_the_provider_exactly() {
    let body = br#"{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[
            {"type":"tool_use","id":"t","name":"f","input":{"x":9.728671207290542e+217,"y":0.1}}]}]}"#;
    let request = parse_request(body).unwrap();
    assert_eq!(request.messages[0].tool_calls[0].arguments_json, r#"{"x":9.728671207290542e+217,"y":0.1}"#);
}

/// Issue 27 item 4: `message_start` carries the input tokens when the
/// node reported them before the first content (it waits for the first
/// content, the commit point, so nothing reaches the client later than
/// before); otherwise 0, and `message_delta` carries the count at the
/// end either way, as Anthropic's does.
#[test]
fn message_start_carries_the_input_tokens_reported_before_the_first_content() {
    let start_usage = |events: &[(&'static str, Value)]| events[0].1["message"]["usage"].clone();
    let mut r = EventRenderer::new(meta());
    let early = [started(), usage(12, 0), text("hi"), usage(12, 3), completed(pb::FinishReason::Stop)];
    let events = render_all(&mut r, &early);
    assert_eq!(names(&events)[..2], ["message_start", "content_block_start"]);
    assert_eq!(start_usage(&events), json!({"input_tokens": 12, "output_tokens": 0}));
    let delta = events.iter().find(|(name, _)| *name == "message_delta").unwrap();
    assert_eq!(delta.1["usage"], json!({"input_tokens": 12, "output_tokens": 3}));

    // Usage with the last chunk (what Ollama and OpenAI-compatible servers do).
    let mut r = EventRenderer::new(meta());
    let late = [started(), text("hi"), usage(12, 3), completed(pb::FinishReason::Stop)];
    let events = render_all(&mut r, &late);
    assert_eq!(start_usage(&events), json!({"input_tokens": 0, "output_tokens": 0}));
    let delta = events.iter().find(|(name, _)| *name == "message_delta").unwrap();
    assert_eq!(delta.1["usage"], json!({"input_tokens": 12, "output_tokens": 3}));

    // `Started` alone shows nothing yet; a failure after it still gets
    // its `message_start` first.
    let mut r = EventRenderer::new(meta());
    assert!(r.render(&started()).is_empty());
    assert!(r.render(&usage(5, 0)).is_empty());
    let failed = r.render(&Event::Failed(pb::RunFailed { failure: None }));
    assert_eq!(failed.iter().map(|(n, _)| *n).collect::<Vec<_>>(), ["message_start", "error"]);
    let start: Value = serde_json::from_str(&failed[0].1).unwrap();
    assert_eq!(start["message"]["usage"]["input_tokens"], 5);
}

/// Issue 45 item 3: `disable_parallel_tool_use: true` without tools is
/// accepted and carried; the adapters make it a no-op.
#[test]
fn disable_parallel_tool_use_without_tools_is_accepted() {
    for tools in [json!({"tools": []}), json!({})] {
        let mut body = json!({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}],
                              "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}});
        body.as_object_mut().unwrap().extend(tools.as_object().unwrap().clone());
        let r = parse(body).unwrap();
        assert!(r.tools.is_empty());
        assert_eq!(r.options.parallel_tool_calls, Some(false));
    }
}
