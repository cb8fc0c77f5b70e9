use serde_json::{Value, json};

use super::super::{AdapterKind, fake, ollama, openai};
use super::*;

fn with(options: pb::GenerationOptions) -> pb::RunRequest {
    let mut request = fake::request(vec![fake::user("hi")]);
    request.tools = vec![pb::ToolDefinition { name: "lookup".into(), ..Default::default() }];
    request.options = Some(options);
    request
}

fn body(adapter: AdapterKind, request: &pb::RunRequest) -> Result<Value, AdapterError> {
    let target = fake::target(adapter, "http://127.0.0.1:1");
    let bytes = match adapter {
        AdapterKind::Ollama => ollama::request_body(&target, request)?.0,
        AdapterKind::OpenAi => openai::request_body(&target, request)?,
    };
    Ok(serde_json::from_slice(&bytes).unwrap())
}

#[test]
fn later_system_messages_join_the_leading_one_for_openai_compatible_servers_only() {
    let system =
        |text: &str| pb::ChatMessage { role: pb::Role::System.into(), content: text.into(), ..Default::default() };
    let mut request = fake::request(vec![
        system("be brief"),
        fake::user("hi"),
        system("# Environment: linux"),
        fake::user("again"),
        system(""),
    ]);
    request.options = None;
    let openai = body(AdapterKind::OpenAi, &request).unwrap();
    assert_eq!(
        openai["messages"],
        json!([
            {"role": "system", "content": "be brief\n\n# Environment: linux"},
            {"role": "user", "content": "hi"},
            {"role": "user", "content": "again"},
        ])
    );
    // Ollama renders each message with the model's own template, which
    // takes a system turn anywhere: the order is kept.
    let ollama = body(AdapterKind::Ollama, &request).unwrap();
    let roles: Vec<&str> = ollama["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "system", "user", "system"]);

    // Nothing to join: the conversation is used as it is.
    let plain = [system("a"), fake::user("b")];
    assert!(matches!(leading_system(&plain), std::borrow::Cow::Borrowed(_)));
    let late = [fake::user("b"), system("a")];
    assert_eq!(
        leading_system(&late).iter().map(|m| m.role).collect::<Vec<_>>(),
        [i32::from(pb::Role::System), i32::from(pb::Role::User)]
    );
}

fn choice(mode: pb::ToolChoiceMode, name: &str) -> pb::GenerationOptions {
    pb::GenerationOptions {
        tool_choice: Some(pb::ToolChoice { mode: mode.into(), name: name.into() }),
        ..Default::default()
    }
}

fn schema() -> pb::GenerationOptions {
    pb::GenerationOptions {
        response_format: Some(pb::ResponseFormat {
            kind: pb::ResponseFormatKind::JsonSchema.into(),
            schema_json: r#"{"type":"object","properties":{"a":{"type":"string"}}}"#.into(),
            name: "answer".into(),
            strict: true,
        }),
        ..Default::default()
    }
}

#[test]
fn openai_compatible_providers_get_every_option() {
    let sampling = pb::GenerationOptions {
        top_k: Some(40),
        presence_penalty: Some(0.5),
        frequency_penalty: Some(-0.5),
        parallel_tool_calls: Some(false),
        ..choice(pb::ToolChoiceMode::Named, "lookup")
    };
    let sent = body(AdapterKind::OpenAi, &with(sampling)).unwrap();
    assert_eq!(
        (&sent["top_k"], &sent["presence_penalty"], &sent["frequency_penalty"]),
        (&json!(40), &json!(0.5), &json!(-0.5))
    );
    assert_eq!(sent["tool_choice"], json!({"type": "function", "function": {"name": "lookup"}}));
    assert_eq!(sent["parallel_tool_calls"], false);
    for (mode, wire) in [
        (pb::ToolChoiceMode::Auto, "auto"),
        (pb::ToolChoiceMode::None, "none"),
        (pb::ToolChoiceMode::Required, "required"),
    ] {
        assert_eq!(body(AdapterKind::OpenAi, &with(choice(mode, ""))).unwrap()["tool_choice"], wire);
    }
    let sent = body(AdapterKind::OpenAi, &with(schema())).unwrap();
    assert_eq!(
        sent["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "answer", "strict": true,
               "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}})
    );
    let json_object = pb::GenerationOptions {
        response_format: Some(pb::ResponseFormat {
            kind: pb::ResponseFormatKind::JsonObject.into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        body(AdapterKind::OpenAi, &with(json_object)).unwrap()["response_format"],
        json!({"type": "json_object"})
    );
    let plain = body(AdapterKind::OpenAi, &with(pb::GenerationOptions::default())).unwrap();
    for absent in ["tool_choice", "parallel_tool_calls", "response_format", "top_k"] {
        assert!(plain.get(absent).is_none(), "{absent} is not sent unless asked for");
    }
}

#[test]
fn ollama_gets_what_it_can_enforce_and_refuses_the_rest() {
    let sampling = pb::GenerationOptions { top_k: Some(40), presence_penalty: Some(0.5), ..Default::default() };
    let sent = body(AdapterKind::Ollama, &with(sampling)).unwrap();
    assert_eq!(sent["options"], json!({"top_k": 40, "presence_penalty": 0.5}));
    assert_eq!(body(AdapterKind::Ollama, &with(schema())).unwrap()["format"]["properties"]["a"]["type"], "string");
    let json_object = pb::GenerationOptions {
        response_format: Some(pb::ResponseFormat {
            kind: pb::ResponseFormatKind::JsonObject.into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(body(AdapterKind::Ollama, &with(json_object)).unwrap()["format"], "json");
    // `none` is honoured by sending no tools; `auto` is the default.
    assert!(body(AdapterKind::Ollama, &with(choice(pb::ToolChoiceMode::None, ""))).unwrap().get("tools").is_none());
    assert!(body(AdapterKind::Ollama, &with(choice(pb::ToolChoiceMode::Auto, ""))).unwrap()["tools"].is_array());
    // Issue 27 item 3: a forced choice goes through `format`
    // (`forced_tool`); with it one call is all there is, so
    // parallel_tool_calls=false holds too.
    for forced in [choice(pb::ToolChoiceMode::Required, ""), choice(pb::ToolChoiceMode::Named, "lookup")] {
        let forced = pb::GenerationOptions { parallel_tool_calls: Some(false), ..forced };
        let sent = body(AdapterKind::Ollama, &with(forced)).unwrap();
        assert_eq!(sent["format"], json!({"type": "object", "properties": {}}));
        assert_eq!(sent["tools"][0]["function"]["name"], "lookup");
    }
    let refused =
        pb::GenerationOptions { tool_choice: choice(pb::ToolChoiceMode::Required, "").tool_choice, ..schema() };
    assert!(matches!(body(AdapterKind::Ollama, &with(refused)), Err(AdapterError::InvalidRequest(_))));
}

/// Issue 45 item 3: parallel_tool_calls=false is a no-op without tools on
/// every adapter (Codex's compaction sends `tools: []` with it); with tools
/// Ollama keeps the first call (the decoder's part is in `ollama::tests`).
#[test]
fn parallel_tool_calls_false_without_tools_is_a_no_op_and_with_tools_keeps_the_first_on_ollama() {
    let single = || pb::GenerationOptions { parallel_tool_calls: Some(false), ..Default::default() };
    let mut toolless = with(single());
    toolless.tools.clear();
    let target = fake::target(AdapterKind::Ollama, "http://127.0.0.1:1");
    let (sent, plan) = ollama::request_body(&target, &toolless).unwrap();
    let sent: Value = serde_json::from_slice(&sent).unwrap();
    assert!(sent.get("tools").is_none() && !plan.first_tool_call_only, "{sent}");
    assert!(body(AdapterKind::OpenAi, &toolless).unwrap().get("parallel_tool_calls").is_none());
    // `tool_choice: none` offers Ollama no tools either.
    let none = with(pb::GenerationOptions { parallel_tool_calls: Some(false), ..choice(pb::ToolChoiceMode::None, "") });
    assert!(!ollama::request_body(&target, &none).unwrap().1.first_tool_call_only);
    let (sent, plan) = ollama::request_body(&target, &with(single())).unwrap();
    let sent: Value = serde_json::from_slice(&sent).unwrap();
    assert!(plan.first_tool_call_only && plan.forced.is_none());
    assert_eq!(sent["tools"][0]["function"]["name"], "lookup");
    assert!(sent.get("parallel_tool_calls").is_none(), "Ollama has no such field: {sent}");
    assert!(!ollama::request_body(&target, &with(pb::GenerationOptions::default())).unwrap().1.first_tool_call_only);
}

#[test]
fn reasoning_switches_map_per_provider() {
    let effort =
        |e: pb::ReasoningEffort| pb::GenerationOptions { reasoning_effort: Some(e.into()), ..Default::default() };
    let openai = body(AdapterKind::OpenAi, &with(effort(pb::ReasoningEffort::Medium))).unwrap();
    assert_eq!(openai["reasoning_effort"], "medium");
    let ollama = body(AdapterKind::Ollama, &with(effort(pb::ReasoningEffort::High))).unwrap();
    assert_eq!(ollama["think"], true, "Ollama takes the switch, not the level");
    let off = body(AdapterKind::Ollama, &with(effort(pb::ReasoningEffort::None))).unwrap();
    assert_eq!(off["think"], false);
    let unset = body(AdapterKind::Ollama, &with(pb::GenerationOptions::default())).unwrap();
    assert!(
        unset.get("think").is_none()
            && body(AdapterKind::OpenAi, &with(pb::GenerationOptions::default()))
                .unwrap()
                .get("reasoning_effort")
                .is_none()
    );
    let unknown = pb::GenerationOptions { reasoning_effort: Some(99), ..Default::default() };
    assert!(matches!(body(AdapterKind::OpenAi, &with(unknown)), Err(AdapterError::InvalidRequest(_))));
}

#[test]
fn malformed_choices_and_formats_are_invalid_for_both() {
    let bad_schema = pb::GenerationOptions {
        response_format: Some(pb::ResponseFormat {
            kind: pb::ResponseFormatKind::JsonSchema.into(),
            schema_json: "[1]".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    for adapter in [AdapterKind::Ollama, AdapterKind::OpenAi] {
        for bad in [
            choice(pb::ToolChoiceMode::Named, "missing"),
            choice(pb::ToolChoiceMode::Unspecified, ""),
            bad_schema.clone(),
            pb::GenerationOptions { presence_penalty: Some(f32::NAN), ..Default::default() },
        ] {
            assert!(matches!(body(adapter, &with(bad)), Err(AdapterError::InvalidRequest(_))), "{adapter:?}");
        }
    }
}
