use super::*;
use crate::ingress::test_events::{completed, started, text, tool, usage};
use pb::run_event::Event;

fn parse(v: Value) -> Result<ResponsesRequest, ApiError> {
    parse_request(v.to_string().as_bytes())
}

fn msg(role: pb::Role, content: &str) -> pb::ChatMessage {
    text_message(role, content.to_string())
}

fn meta() -> ResponseMeta {
    ResponseMeta {
        id: "resp_test".into(),
        created_at: 1_700_000_000,
        model: "llama".into(),
        instructions: Some("be brief".into()),
        max_output_tokens: Some(64),
        ..ResponseMeta::new(String::new(), 0, None, None)
    }
}

/// What Codex CLI 0.171.0 sent with default settings (recorded through a
/// capturing proxy; long texts cut): developer messages, a `namespace`
/// tool, the hosted `web_search`, `reasoning.summary`, `include`, then
/// an exec_command round trip.
#[test]
fn codex_requests_parse() {
    let recorded: Value = serde_json::from_str(include_str!("../fixtures/codex-0.171.0.json")).unwrap();
    let first = parse(recorded["first_turn"].clone()).unwrap();
    let names: Vec<&str> = first.tools.iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"exec_command"), "{names:?}");
    assert!(names.contains(&"multi_agent_v1__spawn_agent"), "{names:?}");
    assert_eq!(first.namespaces.split("multi_agent_v1__spawn_agent"), Some(("multi_agent_v1", "spawn_agent")));
    assert_eq!(first.namespaces.split("exec_command"), None);
    let web_search = recorded["first_turn"]["tools"].as_array().unwrap().iter().position(|t| t["type"] == "web_search");
    assert_eq!(
        first.dropped_tools,
        [DroppedTool { path: format!("tools[{}]", web_search.unwrap()), kind: "web_search" }]
    );
    assert_eq!(first.messages[0].role(), pb::Role::System);

    let round_trip = parse(recorded["tool_round_trip"].clone()).unwrap();
    let n = round_trip.messages.len();
    assert_eq!(round_trip.messages[n - 2].tool_calls[0].name, "exec_command");
    assert_eq!(round_trip.messages[n - 1].role(), pb::Role::Tool);
}

/// `input_file` with a PDF `file_data` (the openai SDKs' way to send a
/// PDF), in a user message and in a tool output, reads as its labelled
/// text; a text file as its text.
#[test]
fn input_files_read_as_their_text() {
    use base64::Engine as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let pdf = format!("data:application/pdf;base64,{}", b64(&crate::ingress::documents::tests::pdf(&["Totals: 42"])));
    let notes = format!("data:text/markdown;base64,{}", b64(b"# Notes"));
    let request = parse(json!({"model": "m", "input": [
        {"role": "user", "content": [
            {"type": "input_text", "text": "compare"},
            {"type": "input_file", "filename": "a.pdf", "file_data": pdf},
            {"type": "input_file", "filename": "notes.md", "file_data": notes}
        ]},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_file", "file_data": pdf}]}
    ]}))
    .unwrap();
    let user = &request.messages[0];
    assert!(
        user.content.starts_with("compare\n<document name=\"a.pdf\" type=\"PDF\" pages=\"1\">\n"),
        "{}",
        user.content
    );
    assert!(user.content.contains("Totals: 42"), "{}", user.content);
    assert!(
        user.content.ends_with("<document name=\"notes.md\" type=\"text\">\n# Notes\n</document>"),
        "{}",
        user.content
    );
    let output = request.messages.iter().find(|m| m.role == pb::Role::Tool as i32).unwrap();
    assert!(output.content.contains("Totals: 42"), "{}", output.content);
}

#[test]
fn images_in_tool_outputs_follow_the_outputs_as_one_user_message() {
    let png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC";
    let request = parse(json!({"model": "m", "input": [
        {"role": "user", "content": "look at both"},
        {"type": "function_call", "call_id": "c1", "name": "view_image", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "view_image", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_image", "image_url": png, "detail": "high"}]},
        {"type": "function_call_output", "call_id": "c2", "output": [
            {"type": "input_text", "text": "second:"}, {"type": "input_image", "image_url": png}
        ]},
        {"role": "user", "content": "well?"},
    ]}))
    .unwrap();
    let shape: Vec<(pb::Role, &str, usize)> =
        request.messages.iter().map(|m| (m.role(), m.content.as_str(), m.images.len())).collect();
    assert_eq!(
        shape,
        [
            (pb::Role::User, "look at both", 0),
            (pb::Role::Assistant, "", 0),
            (pb::Role::Tool, "", 0),
            (pb::Role::Tool, "second:", 0),
            (pb::Role::User, "", 2),
            (pb::Role::User, "well?", 0),
        ]
    );
    assert_eq!(request.messages[4].images[0].media_type, "image/png");
}

#[test]
fn namespace_tools_are_functions_to_the_provider_and_calls_go_back_with_their_namespace() {
    let request = parse(json!({"model": "m", "input": [
        {"role": "user", "content": "spawn one"},
        {"type": "function_call", "call_id": "c0", "name": "spawn_agent", "namespace": "agents", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c0", "output": "ok"},
    ], "tools": [
        {"type": "namespace", "name": "agents", "description": "sub-agents", "tools": [
            {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}},
            {"type": "function", "name": "close_agent"},
        ]},
        {"type": "function", "name": "exec"},
    ]}))
    .unwrap();
    let names: Vec<&str> = request.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["agents__spawn_agent", "agents__close_agent", "exec"]);
    assert_eq!(request.messages[1].tool_calls[0].name, "agents__spawn_agent");

    let meta = ResponseMeta::for_request(&request, 0);
    let events =
        [started(), tool(0, "call_9", "agents__close_agent", r#"{"id":"a"}"#), tool(1, "call_8", "exec", "{}")];
    let mut aggregator = ResponseAggregator::new(meta.clone());
    events.iter().chain([&completed(pb::FinishReason::ToolCalls)]).for_each(|e| aggregator.push(e));
    let output = aggregator.finish().unwrap()["output"].clone();
    assert_eq!((output[0]["name"].as_str(), output[0]["namespace"].as_str()), (Some("close_agent"), Some("agents")));
    assert_eq!((output[1]["name"].as_str(), output[1].get("namespace")), (Some("exec"), None));
    let streamed = render_all(&mut EventRenderer::new(meta), &events);
    let added = streamed.iter().find(|(kind, _)| *kind == "response.output_item.added").unwrap();
    assert_eq!(
        (added.1["item"]["name"].as_str(), added.1["item"]["namespace"].as_str()),
        (Some("close_agent"), Some("agents"))
    );

    for (bad, param, message) in [
        (json!({"type": "namespace", "tools": []}), "tools[0].name", "`tools[0].name` is required"),
        (json!({"type": "namespace", "name": "n"}), "tools[0].tools", "`tools[0].tools` is required"),
        (
            json!({"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}),
            "tools[0].tools[0].type",
            "tools[0].tools[0]: tool type `web_search` is not supported; only `function` is",
        ),
    ] {
        let error = parse(json!({"model": "m", "input": "x", "tools": [bad]})).unwrap_err();
        assert_eq!(error, ApiError::invalid_param(param, message));
    }
}

fn failed(failure: &pb::ExecutionFailure) -> Event {
    Event::Failed(pb::RunFailed { failure: Some(failure.clone()) })
}

fn cancelled() -> Event {
    Event::Cancelled(pb::RunCancelled { reason: pb::CancelReason::ClientDisconnected.into() })
}

/// Renders `events` with a fresh renderer and checks that every payload
/// names its own type and that sequence numbers count up from 0.
fn render_all(renderer: &mut EventRenderer, events: &[Event]) -> Vec<(&'static str, Value)> {
    let out: Vec<(&'static str, Value)> = events
        .iter()
        .flat_map(|e| renderer.render(e))
        .map(|(kind, p)| (kind, serde_json::from_str(&p).expect("payload is JSON")))
        .collect();
    for (i, (kind, payload)) in out.iter().enumerate() {
        assert_eq!(payload["type"], *kind, "event {i}");
        assert_eq!(payload["sequence_number"], i, "event {i}");
    }
    out
}

fn kinds(events: &[(&'static str, Value)]) -> Vec<&'static str> {
    events.iter().map(|(k, _)| *k).collect()
}

fn assert_id(id: &Value, prefix: &str) -> String {
    let id = id.as_str().expect("id is a string");
    let hex = id.strip_prefix(prefix).unwrap_or_else(|| panic!("{id} lacks prefix {prefix}"));
    assert_eq!(hex.len(), 32, "{id}");
    assert!(hex.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    id.to_string()
}

/// Checks the generated output item ids and replaces them with `msg_N` / `fc_N`.
fn scrub_item_ids(response: &mut Value) {
    for (n, item) in response["output"].as_array_mut().unwrap().iter_mut().enumerate() {
        let prefix = if item["type"] == "message" { "msg_" } else { "fc_" };
        assert_id(&item["id"], prefix);
        item["id"] = format!("{prefix}{n}").into();
    }
}

fn expected_response(status: &str, output: Value, usage: Value) -> Value {
    json!({
        "id": "resp_test",
        "object": "response",
        "created_at": 1_700_000_000u64,
        "status": status,
        "error": null,
        "incomplete_details": null,
        "instructions": "be brief",
        "max_output_tokens": 64,
        "model": "llama",
        "output": output,
        "parallel_tool_calls": true,
        "temperature": null,
        "tool_choice": "auto",
        "tools": [],
        "top_p": null,
        "usage": usage,
    })
}

fn usage_value(input: u32, output: u32) -> Value {
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input + output,
    })
}

// ------------------------------------------------------------ parse

#[test]
fn string_input_parses_with_defaults() {
    let req = parse(json!({"model": "llama", "input": "hi"})).unwrap();
    assert_eq!(req.model, "llama");
    assert!(!req.stream);
    assert!(req.tools.is_empty());
    assert_eq!(req.options, pb::GenerationOptions::default());
    assert_eq!(req.instructions, None);
    assert_eq!(req.messages, vec![msg(pb::Role::User, "hi")]);
}

#[test]
fn sdk_style_request_with_instructions_roles_and_extras_parses() {
    let req = parse(json!({
        "model": "llama",
        "instructions": "be brief",
        "input": [
            {"role": "developer", "content": "dev rules"},
            {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "sys"}]},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "first"},
                {"type": "input_text", "text": "second"}
            ]},
            {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "answer", "annotations": []}]},
            {"role": "user", "content": "thanks"}
        ],
        "stream": true,
        "max_output_tokens": 128,
        "temperature": 0.5,
        "top_p": 1,
        "store": true,
        "tool_choice": "auto",
        "parallel_tool_calls": true,
        "metadata": {"k": "v"},
        "user": "u-1",
        "include": [],
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "reasoning": null,
        "previous_response_id": null,
        "conversation": null,
        "background": false
    }))
    .unwrap();
    assert!(req.stream);
    assert_eq!(req.instructions.as_deref(), Some("be brief"));
    assert_eq!(
        req.messages,
        vec![
            msg(pb::Role::System, "be brief"),
            msg(pb::Role::System, "dev rules"),
            msg(pb::Role::System, "sys"),
            msg(pb::Role::User, "first\nsecond"),
            msg(pb::Role::Assistant, "answer"),
            msg(pb::Role::User, "thanks"),
        ]
    );
    assert_eq!(req.options.max_tokens, Some(128));
    assert_eq!(req.options.temperature, Some(0.5));
    assert_eq!(req.options.top_p, Some(1.0));
    assert!(req.options.stop.is_empty());
}

#[test]
fn empty_instructions_are_echoed_but_add_no_message() {
    let req = parse(json!({"model": "m", "input": "x", "instructions": ""})).unwrap();
    assert_eq!(req.instructions.as_deref(), Some(""));
    assert_eq!(req.messages, vec![msg(pb::Role::User, "x")]);
}

#[test]
fn function_calls_and_outputs_round_trip() {
    // What a client sends after replaying `response.output` and adding the tool results.
    let req = parse(json!({
        "model": "m",
        "input": [
            {"role": "user", "content": "weather in Paris and Rome?"},
            {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
             "arguments": "{\"city\":\"Paris\"}", "status": "completed"},
            {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_2",
             "output": [{"type": "input_text", "text": "rainy"}]},
            {"type": "function_call", "call_id": "call_3", "name": "noop", "arguments": "{}"}
        ]
    }))
    .unwrap();
    let call = |id: &str, name: &str, args: &str| pb::ToolCall {
        id: id.into(),
        name: name.into(),
        arguments_json: args.into(),
    };
    let tool_msg = |id: &str, content: &str| pb::ChatMessage {
        images: Vec::new(),
        role: pb::Role::Tool.into(),
        content: content.into(),
        tool_calls: vec![],
        tool_call_id: id.into(),
    };
    assert_eq!(
        req.messages,
        vec![
            msg(pb::Role::User, "weather in Paris and Rome?"),
            pb::ChatMessage {
                images: Vec::new(),
                role: pb::Role::Assistant.into(),
                content: "Let me check.".into(),
                tool_calls: vec![
                    call("call_1", "get_weather", r#"{"city":"Paris"}"#),
                    call("call_2", "get_weather", r#"{"city":"Rome"}"#),
                ],
                tool_call_id: String::new(),
            },
            tool_msg("call_1", "sunny"),
            tool_msg("call_2", "rainy"),
            pb::ChatMessage {
                images: Vec::new(),
                role: pb::Role::Assistant.into(),
                content: String::new(),
                tool_calls: vec![call("call_3", "noop", "{}")],
                tool_call_id: String::new(),
            },
        ]
    );
}

#[test]
fn flat_function_tools_parse() {
    let params = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let req = parse(json!({
        "model": "m",
        "input": "weather?",
        "tools": [
            {"type": "function", "name": "get_weather", "description": "Weather", "parameters": params, "strict": true},
            {"type": "function", "name": "noop", "parameters": null, "strict": false}
        ],
        "tool_choice": {"type": "function", "name": "get_weather"}
    }))
    .unwrap();
    assert_eq!(req.tools.len(), 2);
    assert_eq!(req.tools[0].name, "get_weather");
    assert_eq!(req.tools[0].description, "Weather");
    let parsed: Value = serde_json::from_str(&req.tools[0].parameters_json).unwrap();
    assert_eq!(parsed, params);
    assert_eq!(req.tools[1].name, "noop");
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

    for body in [&b"[]"[..], b"\"s\"", b"1", b"null"] {
        assert_eq!(parse_request(body).unwrap_err(), ApiError::invalid("request body must be a JSON object"));
    }
}

#[test]
fn invalid_requests_name_the_field() {
    let with = |extra: Value| {
        let mut base = json!({"model": "m", "input": "hi"});
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        base
    };
    let input = |items: Value| with(json!({"input": items}));
    let user = json!({"role": "user", "content": "hi"});
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"input": "hi"}), "model", "`model` is required"),
        (with(json!({"model": 3})), "model", "`model` must be a string"),
        (with(json!({"model": ""})), "model", "`model` must not be empty"),
        (json!({"model": "m"}), "input", "`input` is required"),
        (with(json!({"input": null})), "input", "`input` is required"),
        (input(json!(5)), "input", "`input` must be a string or an array of input items"),
        (input(json!([])), "input", "`input` must contain at least one item"),
        (input(json!([user.clone(), "x"])), "input[1]", "`input[1]` must be an object"),
        (input(json!([{"content": "x"}])), "input[0].role", "`input[0].role` is required"),
        (
            input(json!([{"role": "tool", "content": "x"}])),
            "input[0].role",
            "`input[0].role` has unknown role `tool`; expected one of system, developer, user, assistant",
        ),
        (input(json!([{"type": 5, "role": "user"}])), "input[0].type", "`input[0].type` must be a string"),
        (input(json!([{"type": "message", "role": "user"}])), "input[0].content", "`input[0].content` is required"),
        (
            input(json!([{"role": "user", "content": 5}])),
            "input[0].content",
            "`input[0].content` must be a string or an array of content parts",
        ),
        (
            input(json!([{"role": "user", "content": []}])),
            "input[0].content",
            "`input[0].content` must not be an empty array",
        ),
        (
            input(json!([{"role": "user", "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "file_id": "file-1", "detail": "auto"}
            ]}])),
            "input[0].content[1].image_url",
            "`input[0].content[1].image_url` is required",
        ),
        (
            input(json!([user.clone(), {"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}])),
            "input[1].content[0]",
            "input[1].content[0]: document source `file_id` is not supported; send the document inline (base64 or text)",
        ),
        (
            input(
                json!([{"role": "user", "content": [{"type": "input_file", "file_data": "data:application/pdf;base64,bm9wZQ=="}]}]),
            ),
            "input[0].content[0]",
            "input[0].content[0]: PDF cannot be read (malformed or truncated)",
        ),
        (
            input(json!([{"role": "user", "content": [{"type": "input_text"}]}])),
            "input[0].content[0].text",
            "`input[0].content[0].text` is required",
        ),
        (
            input(json!([{"type": "web_search_call", "id": "ws_1", "status": "completed"}])),
            "input[0].type",
            "input[0]: item type `web_search_call` is not supported; only message, function_call, function_call_output, custom_tool_call, custom_tool_call_output and reasoning are",
        ),
        (
            input(json!([{"type": "function_call", "name": "f", "arguments": "{}"}])),
            "input[0].call_id",
            "`input[0].call_id` is required",
        ),
        (
            input(json!([{"type": "function_call", "call_id": "c", "arguments": "{}"}])),
            "input[0].name",
            "`input[0].name` is required",
        ),
        (
            input(json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}])),
            "input[0].arguments",
            "`input[0].arguments` must be a string (the arguments as JSON text)",
        ),
        (
            input(json!([{"type": "function_call_output", "output": "x"}])),
            "input[0].call_id",
            "`input[0].call_id` is required",
        ),
        (
            input(json!([{"type": "function_call_output", "call_id": "c"}])),
            "input[0].output",
            "`input[0].output` is required",
        ),
        (with(json!({"instructions": 5})), "instructions", "`instructions` must be a string"),
        (with(json!({"tools": {}})), "tools", "`tools` must be an array"),
        (with(json!({"tools": ["f"]})), "tools[0]", "`tools[0]` must be an object"),
        (with(json!({"tools": [{"name": "f"}]})), "tools[0].type", "`tools[0].type` is required"),
        (
            with(json!({"tools": [{"type": "function", "name": "f"}, {"type": "local_shell"}]})),
            "tools[1].type",
            "tools[1]: tool type `local_shell` is not supported; only `function` is",
        ),
        (with(json!({"tools": [{"type": "function"}]})), "tools[0].name", "`tools[0].name` is required"),
        (
            with(json!({"tools": [{"type": "function", "function": {"name": "f"}}]})),
            "tools[0].name",
            "`tools[0].name` is required (Responses tools are flat: put name, description and parameters next to `type`, not under `function`)",
        ),
        (
            with(json!({"tools": [{"type": "function", "name": "f", "parameters": "{}"}]})),
            "tools[0].parameters",
            "`tools[0].parameters` must be an object",
        ),
        (
            with(json!({"tools": [{"type": "function", "name": "f", "description": 1}]})),
            "tools[0].description",
            "`tools[0].description` must be a string",
        ),
        (with(json!({"previous_response_id": "resp_1"})), "previous_response_id", STATEFUL_UNSUPPORTED),
        (with(json!({"conversation": "conv_1"})), "conversation", STATEFUL_UNSUPPORTED),
        (with(json!({"conversation": {"id": "conv_1"}})), "conversation", STATEFUL_UNSUPPORTED),
        (with(json!({"background": true})), "background", "background responses are not supported"),
        (with(json!({"background": "yes"})), "background", "`background` must be a boolean"),
        (with(json!({"stream": "yes"})), "stream", "`stream` must be a boolean"),
        (with(json!({"max_output_tokens": "10"})), "max_output_tokens", "`max_output_tokens` must be an integer"),
        (
            with(json!({"max_output_tokens": 0})),
            "max_output_tokens",
            "`max_output_tokens` must be an integer between 1 and 4294967295",
        ),
        (with(json!({"temperature": "hot"})), "temperature", "`temperature` must be a number"),
        (with(json!({"temperature": 2.5})), "temperature", "`temperature` must be between 0 and 2"),
        (with(json!({"top_p": 1.5})), "top_p", "`top_p` must be between 0 and 1"),
    ];
    for (body, want_param, want_message) in cases {
        let err = parse(body.clone()).expect_err(&format!("should fail: {body}"));
        assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(err, ApiError::invalid_param(want_param, want_message), "body: {body}");
        assert_eq!(err.openai_body()["error"]["param"], want_param);
    }
}

// ------------------------------------------------------------ render

#[test]
fn response_meta_id_is_resp_plus_32_hex_and_echoes_the_request() {
    let req = parse(json!({"model": "m", "input": "x", "instructions": "sys", "max_output_tokens": 9})).unwrap();
    let meta = ResponseMeta::for_request(&req, 5);
    assert_id(&meta.id.clone().into(), "resp_");
    assert_eq!((meta.created_at, meta.model.as_str()), (5, "m"));
    assert_eq!((meta.instructions.as_deref(), meta.max_output_tokens), (Some("sys"), Some(9)));
    assert_ne!(meta.id, ResponseMeta::for_request(&req, 5).id);
}

#[test]
fn streaming_text_event_order_and_payloads() {
    let mut r = EventRenderer::new(meta());
    let events = render_all(
        &mut r,
        &[started(), text("Hel"), text(""), text("lo"), usage(7, 2), completed(pb::FinishReason::Stop)],
    );
    assert_eq!(
        kinds(&events),
        vec![
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let p = |i: usize| events[i].1.clone();
    let in_progress = expected_response("in_progress", json!([]), Value::Null);
    assert_eq!(p(0)["response"], in_progress);
    assert_eq!(p(1)["response"], in_progress);

    let item_id = assert_id(&p(2)["item"]["id"], "msg_");
    assert_eq!(p(2)["output_index"], 0);
    assert_eq!(
        p(2)["item"],
        json!({"type": "message", "id": item_id, "status": "in_progress", "role": "assistant", "content": []})
    );
    let part = |text: &str| json!({"type": "output_text", "text": text, "annotations": []});
    let located = |i: usize| (p(i)["item_id"].clone(), p(i)["output_index"].clone(), p(i)["content_index"].clone());
    for i in 3..=7 {
        assert_eq!(located(i), (json!(item_id), json!(0), json!(0)), "event {i}");
    }
    assert_eq!(p(3)["part"], part(""));
    assert_eq!((p(4)["delta"].clone(), p(5)["delta"].clone()), (json!("Hel"), json!("lo")));
    assert_eq!(p(6)["text"], "Hello");
    assert_eq!(p(7)["part"], part("Hello"));
    let done_item = json!({"type": "message", "id": item_id, "status": "completed", "role": "assistant",
                           "content": [part("Hello")]});
    assert_eq!(p(8)["output_index"], 0);
    assert_eq!(p(8)["item"], done_item);
    assert_eq!(p(9)["response"], expected_response("completed", json!([done_item]), usage_value(7, 2)));

    // Nothing after the terminal.
    assert!(r.render(&text("late")).is_empty());
}

#[test]
fn streaming_function_calls() {
    let mut r = EventRenderer::new(meta());
    let events = render_all(
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
    assert_eq!(
        kinds(&events),
        vec![
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let p = |i: usize| events[i].1.clone();
    let fc_a = assert_id(&p(2)["item"]["id"], "fc_");
    let fc_b = assert_id(&p(7)["item"]["id"], "fc_");
    assert_ne!(fc_a, fc_b);
    assert_eq!(
        p(2),
        json!({"type": "response.output_item.added", "sequence_number": 2, "output_index": 0,
               "item": {"type": "function_call", "id": fc_a, "call_id": "call_a", "name": "get_weather",
                        "arguments": "", "status": "in_progress"}})
    );
    assert_eq!(
        p(3),
        json!({"type": "response.function_call_arguments.delta", "sequence_number": 3,
               "item_id": fc_a, "output_index": 0, "delta": "{\"city\":"})
    );
    assert_eq!(p(4)["delta"], "\"Paris\"}");
    assert_eq!(
        p(5),
        json!({"type": "response.function_call_arguments.done", "sequence_number": 5,
               "item_id": fc_a, "output_index": 0, "arguments": "{\"city\":\"Paris\"}"})
    );
    let done_a = json!({"type": "function_call", "id": fc_a, "call_id": "call_a", "name": "get_weather",
                        "arguments": "{\"city\":\"Paris\"}", "status": "completed"});
    assert_eq!((p(6)["output_index"].clone(), p(6)["item"].clone()), (json!(0), done_a.clone()));
    assert_eq!(p(7)["output_index"], 1);
    assert_eq!(p(7)["item"]["call_id"], "call_b");
    assert_eq!((p(8)["item_id"].clone(), p(8)["output_index"].clone()), (json!(fc_b), json!(1)));
    assert_eq!(p(8)["delta"], "{}");
    assert_eq!(p(9)["arguments"], "{}");
    let done_b = json!({"type": "function_call", "id": fc_b, "call_id": "call_b", "name": "noop",
                        "arguments": "{}", "status": "completed"});
    assert_eq!(p(10)["item"], done_b);
    assert_eq!(p(11)["response"], expected_response("completed", json!([done_a, done_b]), usage_value(0, 0)));
}

#[test]
fn text_then_function_call_then_text_are_separate_items() {
    let mut r = EventRenderer::new(meta());
    let events = render_all(
        &mut r,
        &[text("Let me check."), tool(0, "call_a", "f", "{}"), text("Done."), completed(pb::FinishReason::Stop)],
    );
    assert_eq!(
        kinds(&events),
        vec![
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            // The tool call closes the message.
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            // The text after it closes the call.
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let indices: Vec<(&str, Value)> = events
        .iter()
        .filter(|(k, _)| k.starts_with("response.output_item."))
        .map(|(k, p)| (*k, p["output_index"].clone()))
        .collect();
    assert_eq!(
        indices,
        vec![
            ("response.output_item.added", json!(0)),
            ("response.output_item.done", json!(0)),
            ("response.output_item.added", json!(1)),
            ("response.output_item.done", json!(1)),
            ("response.output_item.added", json!(2)),
            ("response.output_item.done", json!(2)),
        ]
    );
    let mut response = events.last().unwrap().1["response"].clone();
    scrub_item_ids(&mut response);
    let output = json!([
        {"type": "message", "id": "msg_0", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "f", "arguments": "{}",
         "status": "completed"},
        {"type": "message", "id": "msg_2", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "Done.", "annotations": []}]}
    ]);
    assert_eq!(response, expected_response("completed", output, usage_value(0, 0)));
}

#[test]
fn length_and_content_filter_finish_as_incomplete() {
    for (reason, want) in
        [(pb::FinishReason::Length, "max_output_tokens"), (pb::FinishReason::ContentFilter, "content_filter")]
    {
        let mut r = EventRenderer::new(meta());
        let events = render_all(&mut r, &[text("abc"), usage(3, 64), completed(reason)]);
        let (kind, last) = events.last().unwrap();
        assert_eq!(*kind, "response.incomplete");
        assert_eq!(last["response"]["status"], "incomplete");
        assert_eq!(last["response"]["incomplete_details"], json!({"reason": want}));
        assert_eq!(last["response"]["output"][0]["content"][0]["text"], "abc");
        assert_eq!(last["response"]["usage"], usage_value(3, 64));
        assert_eq!(events[events.len() - 2].0, "response.output_item.done");

        let mut agg = ResponseAggregator::new(meta());
        for e in [text("abc"), usage(3, 64), completed(reason)] {
            agg.push(&e);
        }
        let body = agg.finish().unwrap();
        assert_eq!(body["status"], "incomplete");
        assert_eq!(body["incomplete_details"], json!({"reason": want}));
    }
}

#[test]
fn streaming_failure_renders_response_failed() {
    let failure = pb::ExecutionFailure::new(pb::FailureKind::ResponseStalled, "provider stalled");
    let mut r = EventRenderer::new(meta());
    let events = render_all(&mut r, &[started(), text("partial"), failed(&failure)]);
    assert_eq!(
        kinds(&events),
        vec![
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.failed",
        ]
    );
    let mut response = events[5].1["response"].clone();
    scrub_item_ids(&mut response);
    let mut want = expected_response(
        "failed",
        json!([{"type": "message", "id": "msg_0", "status": "incomplete", "role": "assistant",
                "content": [{"type": "output_text", "text": "partial", "annotations": []}]}]),
        Value::Null,
    );
    want["error"] = json!({"code": "response_stalled", "message": "provider stalled"});
    assert_eq!(response, want);
    assert!(r.render(&completed(pb::FinishReason::Stop)).is_empty());

    // A failure before anything else still opens the stream properly.
    let mut r = EventRenderer::new(meta());
    let events = render_all(&mut r, &[failed(&failure)]);
    assert_eq!(kinds(&events), vec!["response.created", "response.in_progress", "response.failed"]);
    assert_eq!(events[2].1["response"]["output"], json!([]));
    assert_eq!(events[2].1["response"]["error"]["code"], "response_stalled");

    // A Failed without a description is an internal error.
    let mut r = EventRenderer::new(meta());
    let events = render_all(&mut r, &[Event::Failed(pb::RunFailed { failure: None })]);
    assert_eq!(events[2].1["response"]["error"]["code"], "internal");
}

#[test]
fn cancel_renders_nothing() {
    let mut r = EventRenderer::new(meta());
    assert!(r.render(&cancelled()).is_empty());
    assert!(r.render(&text("late")).is_empty());

    let mut r = EventRenderer::new(meta());
    assert_eq!(render_all(&mut r, &[text("hi")]).len(), 5);
    assert!(r.render(&cancelled()).is_empty());
    assert!(r.render(&completed(pb::FinishReason::Stop)).is_empty());
}

#[test]
fn aggregates_text_function_calls_and_usage() {
    let mut agg = ResponseAggregator::new(meta());
    for e in [
        started(),
        text("Let me "),
        text("check."),
        tool(0, "call_a", "get_weather", "{\"city\""),
        tool(0, "", "", ":\"Paris\"}"),
        tool(1, "", "noop", "{}"),
        usage(10, 5),
        completed(pb::FinishReason::ToolCalls),
    ] {
        agg.push(&e);
    }
    let mut body = agg.finish().unwrap();
    // A call streamed without an id gets a synthetic call id.
    assert_id(&body["output"][2]["call_id"], "call_");
    body["output"][2]["call_id"] = "call_synthetic".into();
    scrub_item_ids(&mut body);
    assert_eq!(
        body,
        expected_response(
            "completed",
            json!([
                {"type": "message", "id": "msg_0", "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
                {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "get_weather",
                 "arguments": "{\"city\":\"Paris\"}", "status": "completed"},
                {"type": "function_call", "id": "fc_2", "call_id": "call_synthetic", "name": "noop",
                 "arguments": "{}", "status": "completed"}
            ]),
            usage_value(10, 5),
        )
    );
}

#[test]
fn aggregate_equals_the_streamed_final_response() {
    let run = [
        started(),
        text("a"),
        tool(0, "call_a", "f", "{"),
        tool(0, "", "", "}"),
        usage(1, 2),
        completed(pb::FinishReason::Stop),
    ];
    let mut r = EventRenderer::new(meta());
    let mut streamed = render_all(&mut r, &run).pop().unwrap().1["response"].clone();
    let mut agg = ResponseAggregator::new(meta());
    run.iter().for_each(|e| agg.push(e));
    let mut body = agg.finish().unwrap();
    scrub_item_ids(&mut streamed);
    scrub_item_ids(&mut body);
    assert_eq!(body, streamed);
    assert_eq!(body["output"].as_array().unwrap().len(), 2);
}

#[test]
fn aggregator_failed_returns_the_failure() {
    let mut failure = pb::ExecutionFailure::new(pb::FailureKind::ProviderHttpStatus, "rate limited");
    failure.provider_status = 429;
    let mut agg = ResponseAggregator::new(meta());
    agg.push(&text("partial"));
    agg.push(&failed(&failure));
    agg.push(&completed(pb::FinishReason::Stop)); // ignored after the terminal
    let err = agg.finish().unwrap_err();
    assert_eq!(err, ApiError::Execution(failure));
    assert_eq!(err.openai_body()["error"]["code"], "provider_http_status");
}

#[test]
fn aggregator_without_completion_is_an_execution_error() {
    let mut agg = ResponseAggregator::new(meta());
    agg.push(&text("partial"));
    let Err(ApiError::Execution(f)) = agg.finish() else { panic!("expected Execution error") };
    assert_eq!(f.kind(), pb::FailureKind::TransportLost);

    let mut agg = ResponseAggregator::new(meta());
    agg.push(&cancelled());
    let Err(ApiError::Execution(f)) = agg.finish() else { panic!("expected Execution error") };
    assert_eq!(f.kind(), pb::FailureKind::Internal);

    let mut agg = ResponseAggregator::new(meta());
    agg.push(&Event::Cancelled(pb::RunCancelled { reason: pb::CancelReason::Deadline.into() }));
    let Err(ApiError::Execution(f)) = agg.finish() else { panic!("expected Execution error") };
    assert_eq!(f.kind(), pb::FailureKind::DeadlineExceeded, "a deadline is no stall");
    assert_eq!(ApiError::Execution(f).code(), "request_timeout");

    let mut agg = ResponseAggregator::new(meta());
    agg.push(&Event::Failed(pb::RunFailed { failure: None }));
    let Err(ApiError::Execution(f)) = agg.finish() else { panic!("expected Execution error") };
    assert_eq!(f.kind(), pb::FailureKind::Internal);
}

/// Issue 13 items 2, 3: tool choice and `text.format` reach the run.
#[test]
fn tool_choice_and_text_format_are_carried() {
    let body = |extra: Value| {
        let mut body = json!({"model": "m", "input": "hi",
            "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        parse(body)
    };
    let r = body(json!({
        "tool_choice": {"type": "function", "name": "lookup"},
        "parallel_tool_calls": true,
        "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}, "strict": false}}
    }))
    .unwrap();
    assert_eq!(r.options.tool_choice.unwrap().name, "lookup");
    assert_eq!(r.options.parallel_tool_calls, Some(true));
    assert_eq!(r.options.response_format.unwrap().kind(), pb::ResponseFormatKind::JsonSchema);
    let plain = body(json!({"text": {"format": {"type": "text"}}, "tool_choice": "required"})).unwrap();
    assert_eq!(plain.options.response_format.unwrap().kind(), pb::ResponseFormatKind::Text);
    assert_eq!(plain.options.tool_choice.unwrap().mode(), pb::ToolChoiceMode::Required);
    for (extra, param) in [
        (json!({"tool_choice": {"type": "function", "name": "nope"}}), "tool_choice"),
        (json!({"text": {"format": {"type": "json_schema", "name": "a"}}}), "text.format.schema"),
        (json!({"top_logprobs": 3}), "top_logprobs"),
    ] {
        let err = body(extra.clone()).unwrap_err();
        assert!(matches!(&err, ApiError::InvalidRequest { param: Some(p), .. } if p == param), "{extra}: {err:?}");
    }
}

// ------------------------------------------------- issue 27 item 4

fn reasoning(text: &str) -> Event {
    Event::Reasoning(pb::ReasoningDelta { text: text.into() })
}

/// The output items of `run`, streamed (each `response.output_item.done`
/// item, and the final response's output) and not.
fn done_items_final_and_whole(meta: ResponseMeta, run: &[Event]) -> (Vec<Value>, Value, Value) {
    let mut r = EventRenderer::new(meta.clone());
    let events = render_all(&mut r, run);
    let done = events.iter().filter(|(k, _)| *k == "response.output_item.done").map(|(_, p)| p["item"].clone());
    let final_output = events.last().unwrap().1["response"]["output"].clone();
    let mut agg = ResponseAggregator::new(meta);
    run.iter().for_each(|e| agg.push(e));
    (done.collect(), final_output, agg.finish().unwrap()["output"].clone())
}

/// A message cut by the token limit (or the content filter) is
/// `incomplete` as OpenAI marks it, in `response.output_item.done`, in
/// `response.incomplete`'s output and in the non-streaming body; items
/// finished before the cut stay `completed`.
#[test]
fn a_truncated_answer_marks_the_item_it_was_generating_incomplete() {
    for reason in [pb::FinishReason::Length, pb::FinishReason::ContentFilter] {
        let run = [started(), text("abc"), usage(3, 64), completed(reason)];
        let (done, final_output, whole) = done_items_final_and_whole(meta(), &run);
        assert_eq!(done.len(), 1);
        for output in [&done[0], &final_output[0], &whole[0]] {
            assert_eq!((output["type"].as_str(), output["status"].as_str()), (Some("message"), Some("incomplete")));
        }

        let run = [started(), text("a"), tool(0, "call_a", "f", "{}"), completed(reason)];
        let (done, final_output, whole) = done_items_final_and_whole(meta(), &run);
        let statuses = |items: &[Value]| items.iter().map(|i| i["status"].clone()).collect::<Vec<_>>();
        assert_eq!(statuses(&done), [json!("completed"), json!("incomplete")]);
        assert_eq!(statuses(final_output.as_array().unwrap()), statuses(&done));
        assert_eq!(statuses(whole.as_array().unwrap()), statuses(&done));
    }
    // A run that stops normally completes every item.
    let (done, final_output, whole) =
        done_items_final_and_whole(meta(), &[text("abc"), completed(pb::FinishReason::Stop)]);
    for output in [&done[0], &final_output[0], &whole[0]] {
        assert_eq!(output["status"], "completed");
    }
}

/// Codex CLI's request shape: `reasoning.summary` and `include:
/// ["reasoning.encrypted_content"]` are accepted; `summary` is on for
/// `auto`/`concise`/`detailed` (and the older `generate_summary`), off
/// when absent, null or `none`; anything else names the field.
#[test]
fn reasoning_summary_and_include_encrypted_content_are_accepted() {
    let codex = json!({
        "model": "m", "instructions": "be useful", "input": [{"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "hi"}]}], "tools": [], "tool_choice": "auto",
        "parallel_tool_calls": false, "reasoning": {"effort": "medium", "summary": "auto"}, "store": false,
        "stream": true, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
    });
    let req = parse(codex).unwrap();
    assert!(req.reasoning_summary);
    assert_eq!(req.options.reasoning_effort, Some(pb::ReasoningEffort::Medium.into()));
    assert!(ResponseMeta::for_request(&req, 0).reasoning_summary);
    for (reasoning, want) in [
        (json!({"summary": "concise"}), true),
        (json!({"summary": "detailed"}), true),
        (json!({"generate_summary": "auto"}), true),
        (json!({"summary": null}), false),
        (json!({"summary": "none"}), false),
        (json!({"effort": "low"}), false),
    ] {
        let req = parse(json!({"model": "m", "input": "x", "reasoning": reasoning})).unwrap();
        assert_eq!(req.reasoning_summary, want, "{reasoning}");
    }
    let err = parse(json!({"model": "m", "input": "x", "reasoning": {"summary": "verbose"}})).unwrap_err();
    assert!(matches!(&err, ApiError::InvalidRequest { param: Some(p), .. } if p == "reasoning.summary"), "{err:?}");
}

/// With `reasoning.summary` the provider's reasoning text is the item's
/// summary, streamed with OpenAI's summary events; without it, today's
/// `reasoning_text` content, now with its content part events.
#[test]
fn reasoning_renders_as_a_summary_when_asked_and_as_content_otherwise() {
    let run = [started(), reasoning("Think"), reasoning("ing"), text("ok"), completed(pb::FinishReason::Stop)];
    let summary_meta = ResponseMeta { reasoning_summary: true, ..meta() };
    let mut r = EventRenderer::new(summary_meta.clone());
    let events = render_all(&mut r, &run);
    assert_eq!(
        kinds(&events)[2..9],
        [
            "response.output_item.added",
            "response.reasoning_summary_part.added",
            "response.reasoning_summary_text.delta",
            "response.reasoning_summary_text.delta",
            "response.reasoning_summary_text.done",
            "response.reasoning_summary_part.done",
            "response.output_item.done",
        ]
    );
    let p = |i: usize| events[i].1.clone();
    let id = assert_id(&p(2)["item"]["id"], "rs_");
    assert_eq!(p(2)["item"], json!({"type": "reasoning", "id": id, "summary": []}));
    let at = |i: usize| (p(i)["item_id"].clone(), p(i)["output_index"].clone(), p(i)["summary_index"].clone());
    for i in 3..=7 {
        assert_eq!(at(i), (json!(id), json!(0), json!(0)), "event {i}");
    }
    assert_eq!(p(3)["part"], json!({"type": "summary_text", "text": ""}));
    assert_eq!((p(4)["delta"].clone(), p(5)["delta"].clone()), (json!("Think"), json!("ing")));
    assert_eq!(p(6)["text"], "Thinking");
    assert_eq!(p(7)["part"], json!({"type": "summary_text", "text": "Thinking"}));
    let item = json!({"type": "reasoning", "id": id, "summary": [{"type": "summary_text", "text": "Thinking"}]});
    assert_eq!(p(8)["item"], item);
    assert_eq!(events.last().unwrap().1["response"]["output"][0], item);
    let mut agg = ResponseAggregator::new(summary_meta);
    run.iter().for_each(|e| agg.push(e));
    let body = agg.finish().unwrap();
    assert_eq!(body["output"][0]["summary"], item["summary"]);
    assert!(body["output"][0].get("content").is_none() && body["output"][0].get("encrypted_content").is_none());

    let mut r = EventRenderer::new(meta());
    let events = render_all(&mut r, &run);
    assert_eq!(
        kinds(&events)[2..9],
        [
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
        ]
    );
    let p = |i: usize| events[i].1.clone();
    assert_eq!(p(3)["part"], json!({"type": "reasoning_text", "text": ""}));
    assert_eq!((p(3)["content_index"].clone(), p(7)["content_index"].clone()), (json!(0), json!(0)));
    assert_eq!(p(7)["part"], json!({"type": "reasoning_text", "text": "Thinking"}));
    assert_eq!(p(8)["item"]["summary"], json!([]));
    assert_eq!(p(8)["item"]["content"], json!([{"type": "reasoning_text", "text": "Thinking"}]));
}

/// Issue 45 item 3: `parallel_tool_calls: false` with `tools: []` (Codex's
/// compaction) is accepted and carried; the adapters make it a no-op.
#[test]
fn parallel_tool_calls_false_without_tools_is_accepted() {
    let r = parse(json!({"model": "m", "input": "summarize", "tools": [], "parallel_tool_calls": false})).unwrap();
    assert!(r.tools.is_empty());
    assert_eq!(r.options.parallel_tool_calls, Some(false));
    assert!(!ResponseMeta::for_request(&r, 0).parallel_tool_calls);
}

fn custom_request(tools: Value) -> Result<ResponsesRequest, ApiError> {
    parse(json!({"model": "m", "input": "patch it", "tools": tools}))
}

fn param_of(err: ApiError) -> String {
    match err {
        ApiError::InvalidRequest { param, .. } => param.unwrap_or_default(),
        other => panic!("{other:?}"),
    }
}

/// Issue 45 item 4, abuse first: a huge grammar reaches the model bounded;
/// a custom tool that clashes with a function's name, an unknown format
/// or syntax, a missing name or definition, is a 400 naming the field.
#[test]
fn custom_tool_abuse_is_bounded_or_refused_by_field() {
    let huge = "start: line+\nline: /.+/\n".repeat(100_000);
    let r = custom_request(json!([{"type": "custom", "name": "apply_patch", "description": "Patch files.",
        "format": {"type": "grammar", "syntax": "lark", "definition": huge}}]))
    .unwrap();
    let tool = &r.tools[0];
    assert!(tool.description.starts_with("Patch files."), "{}", tool.description);
    assert!(tool.description.len() < GRAMMAR_NOTE_LIMIT + 512, "{}", tool.description.len());
    assert!(tool.description.contains("lark") && tool.description.contains("cut"), "{}", &tool.description[..200]);
    // A multi-byte character at the cut is not split.
    let wide = "é".repeat(GRAMMAR_NOTE_LIMIT);
    let r = custom_request(json!([{"type": "custom", "name": "t",
        "format": {"type": "grammar", "syntax": "regex", "definition": wide}}]))
    .unwrap();
    assert!(r.tools[0].description.len() <= GRAMMAR_NOTE_LIMIT + 256);

    for (tools, param) in [
        (
            json!([{"type": "function", "name": "apply_patch"}, {"type": "custom", "name": "apply_patch"}]),
            "tools[1].name",
        ),
        (
            json!([{"type": "custom", "name": "apply_patch"}, {"type": "function", "name": "apply_patch"}]),
            "tools[0].name",
        ),
        (json!([{"type": "custom", "name": "a"}, {"type": "custom", "name": "a"}]), "tools[0].name"),
        (json!([{"type": "custom", "name": "a", "format": {"type": "json"}}]), "tools[0].format.type"),
        (json!([{"type": "custom", "name": "a", "format": "grammar"}]), "tools[0].format"),
        (
            json!([{"type": "custom", "name": "a", "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}]),
            "tools[0].format.syntax",
        ),
        (
            json!([{"type": "custom", "name": "a", "format": {"type": "grammar", "syntax": "lark"}}]),
            "tools[0].format.definition",
        ),
        (json!([{"type": "custom"}]), "tools[0].name"),
        (json!([{"type": "custom", "name": "a", "description": 7}]), "tools[0].description"),
    ] {
        assert_eq!(param_of(custom_request(tools.clone()).unwrap_err()), param, "{tools}");
    }
    // The items that carry custom calls back are checked the same way.
    for (item, param) in [
        (json!({"type": "custom_tool_call", "name": "apply_patch", "input": "x"}), "input[0].call_id"),
        (json!({"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": 3}), "input[0].input"),
        (json!({"type": "custom_tool_call_output", "output": "ok"}), "input[0].call_id"),
        (json!({"type": "custom_tool_call_output", "call_id": "c"}), "input[0].output"),
    ] {
        let err = parse(json!({"model": "m", "input": [item]})).unwrap_err();
        assert_eq!(param_of(err), param, "{item}");
    }
}

/// Custom tools (with a grammar, plain text, or no format) become functions
/// of one string argument `input`; `tool_search` is dropped like the other
/// hosted tools; a custom tool can be named in `tool_choice`; earlier custom
/// calls and their outputs read back as a call and its result.
#[test]
fn custom_tools_become_functions_of_one_string() {
    let r = parse(json!({"model": "m", "tool_choice": {"type": "custom", "name": "apply_patch"},
    "tools": [
        {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
        {"type": "custom", "name": "apply_patch", "description": "Patch files.",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch"}},
        {"type": "custom", "name": "note", "format": {"type": "text"}},
        {"type": "custom", "name": "plain"},
        {"type": "tool_search"},
    ],
    "input": [
        {"type": "message", "role": "user", "content": "patch it"},
        {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1", "name": "apply_patch",
         "input": "*** Begin Patch\n*** End Patch\n", "status": "completed"},
        {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Done!"},
    ]}))
    .unwrap();
    let names: Vec<&str> = r.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["exec_command", "apply_patch", "note", "plain"]);
    assert_eq!(r.dropped_tools, [DroppedTool { path: "tools[4]".into(), kind: "tool_search" }]);
    let patch = &r.tools[1];
    assert!(patch.description.starts_with("Patch files.") && patch.description.contains("start: begin_patch"));
    let schema: Value = serde_json::from_str(&patch.parameters_json).unwrap();
    assert_eq!(schema["properties"]["input"]["type"], "string");
    assert_eq!(schema["required"], json!(["input"]));
    assert_eq!(r.tools[3].parameters_json, patch.parameters_json);
    assert!(r.custom_tools.contains("apply_patch") && !r.custom_tools.contains("exec_command"));
    assert_eq!(
        r.options.tool_choice.as_ref().map(|c| (c.mode(), c.name.as_str())),
        Some((pb::ToolChoiceMode::Named, "apply_patch"))
    );
    let call = &r.messages[1].tool_calls[0];
    assert_eq!((call.id.as_str(), call.name.as_str()), ("call_1", "apply_patch"));
    assert_eq!(
        serde_json::from_str::<Value>(&call.arguments_json).unwrap(),
        json!({"input": "*** Begin Patch\n*** End Patch\n"})
    );
    assert_eq!(
        (r.messages[2].role(), r.messages[2].tool_call_id.as_str(), r.messages[2].content.as_str()),
        (pb::Role::Tool, "call_1", "Done!")
    );
    // The response echoes custom tools as custom.
    let meta = ResponseMeta::for_request(&r, 0);
    assert_eq!(meta.tools[1]["type"], "custom");
    assert_eq!(meta.tool_choice, json!({"type": "custom", "name": "apply_patch"}));
}

/// A call of a custom tool goes back as a `custom_tool_call` with `input`,
/// streamed as `response.custom_tool_call_input.delta`/`.done` (read out of
/// the JSON arguments as the provider streams them) and the
/// same in the non-streaming body; arguments that are not `{"input": "..."}`
/// are passed on as the model wrote them (arguments that are no JSON object
/// at all the transcript already refuses).
#[test]
fn custom_tool_calls_render_as_custom_tool_call_items() {
    let meta = || {
        let mut m = meta();
        m.custom_tools = CustomTools::from_names(["apply_patch"]);
        m
    };
    let events = [
        started(),
        tool(0, "call_7", "apply_patch", r#"{"input": "*** Begin"#),
        tool(0, "", "", r#" Patch\n"}"#),
        tool(1, "call_8", "apply_patch", r#"{"patch":"x"}"#),
        tool(2, "call_9", "exec_command", r#"{"cmd":"ls"}"#),
        usage(3, 4),
        completed(pb::FinishReason::ToolCalls),
    ];
    let mut aggregator = ResponseAggregator::new(meta());
    for e in &events {
        aggregator.push(e);
    }
    let body = aggregator.finish().unwrap();
    let output = body["output"].as_array().unwrap();
    assert_eq!(output[0]["type"], "custom_tool_call");
    assert!(output[0]["id"].as_str().unwrap().starts_with("ctc_"), "{}", output[0]);
    assert_eq!((&output[0]["call_id"], &output[0]["name"]), (&json!("call_7"), &json!("apply_patch")));
    assert_eq!(output[0]["input"], "*** Begin Patch\n");
    assert!(output[0].get("arguments").is_none());
    assert_eq!(output[1]["input"], r#"{"patch":"x"}"#);
    assert_eq!(output[2]["type"], "function_call");

    let mut renderer = EventRenderer::new(meta());
    let streamed: Vec<(&str, Value)> = events
        .iter()
        .flat_map(|e| renderer.render(e))
        .map(|(kind, data)| (kind, serde_json::from_str(&data).unwrap()))
        .collect();
    let kinds: Vec<&str> = streamed.iter().map(|(k, _)| *k).collect();
    assert!(
        !kinds[..kinds.iter().position(|k| *k == "response.output_item.done").unwrap()]
            .contains(&"response.function_call_arguments.delta"),
        "{kinds:?}"
    );
    // The input streams as the arguments grow, then `.done` has all of it;
    // arguments of another shape go out whole at the end.
    let deltas = |index: u64| -> Vec<&str> {
        streamed
            .iter()
            .filter(|(k, p)| *k == "response.custom_tool_call_input.delta" && p["output_index"] == index)
            .map(|(_, p)| p["delta"].as_str().unwrap())
            .collect()
    };
    assert_eq!(deltas(0), ["*** Begin", " Patch\n"]);
    assert_eq!(deltas(1), [r#"{"patch":"x"}"#]);
    let done = streamed.iter().find(|(k, _)| *k == "response.custom_tool_call_input.done").unwrap();
    assert_eq!((&done.1["output_index"], &done.1["input"]), (&json!(0), &json!("*** Begin Patch\n")));
    let added = streamed.iter().find(|(k, _)| *k == "response.output_item.added").unwrap();
    assert_eq!((&added.1["item"]["type"], &added.1["item"]["input"]), (&json!("custom_tool_call"), &json!("")));
    let completed = &streamed.last().unwrap().1["response"]["output"];
    assert_eq!(completed[0]["input"], "*** Begin Patch\n");
    assert!(kinds.contains(&"response.function_call_arguments.delta"), "the function call still streams: {kinds:?}");
}

/// What Codex CLI 0.171.0 sends under a model name it knows (`gpt-5.5`;
/// recorded through a capturing proxy, see the fixture's `_note`):
/// `apply_patch` as a custom grammar tool, `tool_search` (dropped and
/// named), a custom call round trip, and the
/// auto-compaction request (`tools: []` with `parallel_tool_calls: false`).
#[test]
fn codex_requests_under_a_known_model_name_parse() {
    let recorded: Value = serde_json::from_str(include_str!("../fixtures/codex-0.171.0-gpt-5.5.json")).unwrap();
    let first = parse(recorded["first_turn"].clone()).unwrap();
    assert!(first.custom_tools.contains("apply_patch"));
    let patch = first.tools.iter().find(|t| t.name == "apply_patch").unwrap();
    assert!(patch.description.contains("lark grammar") && patch.description.contains("begin_patch"));
    let kinds: Vec<&str> = first.dropped_tools.iter().map(|t| t.kind).collect();
    assert_eq!(kinds, ["tool_search", "web_search"]);

    let round_trip = parse(recorded["tool_round_trip"].clone()).unwrap();
    let n = round_trip.messages.len();
    let call = &round_trip.messages[n - 2].tool_calls[0];
    assert_eq!(call.name, "apply_patch");
    let items = recorded["tool_round_trip"]["input"].as_array().unwrap();
    assert_eq!(CustomTools::input(&call.arguments_json), items[items.len() - 2]["input"]);
    assert_eq!(
        (round_trip.messages[n - 1].role(), &round_trip.messages[n - 1].tool_call_id),
        (pb::Role::Tool, &call.id)
    );

    let compaction = parse(recorded["compaction"].clone()).unwrap();
    assert!(compaction.tools.is_empty());
    assert_eq!(compaction.options.parallel_tool_calls, Some(false));
}

/// The readable part of a custom call's input while its JSON arguments
/// stream: only complete escapes, nothing before the `input` string starts.
#[test]
fn partial_custom_input_decodes_only_what_is_complete() {
    for (arguments, want) in [
        ("", None),
        (r#"{"inp"#, None),
        (r#"{"input":"#, None),
        (r#" { "input" : ""#, Some("")),
        (r#"{"input": "a\"#, Some("a")),
        (r#"{"input": "a\n"#, Some("a\n")),
        (r#"{"input": "a\"q\"\\"#, Some("a\"q\"\\")),
        (r#"{"input": "\u00e"#, Some("")),
        (r#"{"input": "\u00e9\ud83d"#, Some("é")),
        (r#"{"input": "\u00e9\ud83d\ude00 done", "x": 1}"#, Some("é😀 done")),
        (r#"{"other": "x", "input": "y"}"#, None),
    ] {
        assert_eq!(CustomTools::partial_input(arguments).as_deref(), want, "{arguments}");
    }
}
