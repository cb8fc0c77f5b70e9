//! The request translation both provider APIs share: a run's roles, tools,
//! tool choice, structured output, reasoning switch and options, checked
//! (every refusal is an `InvalidRequest` that never quotes the request),
//! and the JSON body.

use std::fmt;

use iop_proto::pb;
use iop_proto::wire::closed_enum;

use super::error::{AdapterError, json_error_summary};

/// The run's reasoning switch: `None` when the client did not ask.
pub(super) fn reasoning_effort(options: &pb::GenerationOptions) -> Result<Option<pb::ReasoningEffort>, AdapterError> {
    options
        .reasoning_effort
        .map(|effort| {
            iop_proto::wire::closed_enum::<pb::ReasoningEffort>("options.reasoning_effort", effort)
                .map_err(|e| AdapterError::InvalidRequest(e.to_string()))
        })
        .transpose()
}

/// The conversation with every SYSTEM message's text joined (in order, by a
/// blank line) into one leading SYSTEM message, for servers whose chat
/// template takes a system text only first: Gemma's and Mistral's Jinja
/// templates, as llama.cpp, LM Studio and vLLM run them, raise "roles must
/// alternate" on a second or later one. Clients send them later (Claude
/// Code's environment note, OpenAI `developer` turns, Responses
/// `instructions` beside system items). Borrowed when there is nothing to join.
pub(super) fn leading_system(messages: &[pb::ChatMessage]) -> std::borrow::Cow<'_, [pb::ChatMessage]> {
    let is_system = |m: &pb::ChatMessage| m.role == i32::from(pb::Role::System);
    let systems = messages.iter().filter(|m| is_system(m)).count();
    if systems == 0 || (systems == 1 && is_system(&messages[0])) {
        return std::borrow::Cow::Borrowed(messages);
    }
    let texts: Vec<&str> =
        messages.iter().filter(|m| is_system(m)).map(|m| m.content.as_str()).filter(|t| !t.is_empty()).collect();
    let leading = pb::ChatMessage { role: pb::Role::System.into(), content: texts.join("\n\n"), ..Default::default() };
    std::iter::once(leading).chain(messages.iter().filter(|m| !is_system(m)).cloned()).collect()
}

pub(super) fn message_role(index: usize, message: &pb::ChatMessage) -> Result<pb::Role, AdapterError> {
    closed_enum::<pb::Role>("role", message.role)
        .map_err(|e| AdapterError::InvalidRequest(format!("messages[{index}]: {e}")))
}

/// A JSON-text field of the request, parsed. Errors name the field, never
/// its content.
fn parse_json_text(what: fmt::Arguments<'_>, text: &str) -> Result<serde_json::Value, AdapterError> {
    serde_json::from_str(text)
        .map_err(|e| AdapterError::InvalidRequest(format!("{what} is not valid JSON ({})", json_error_summary(&e))))
}

/// Tool-call arguments as a JSON object (empty text means no arguments).
pub(super) fn parse_arguments_object(what: fmt::Arguments<'_>, text: &str) -> Result<serde_json::Value, AdapterError> {
    if text.trim().is_empty() {
        return Ok(serde_json::Value::Object(Default::default()));
    }
    let value = parse_json_text(what, text)?;
    if !value.is_object() {
        return Err(AdapterError::InvalidRequest(format!("{what} is not a JSON object")));
    }
    Ok(value)
}

/// A tool's parameter schema (empty text means "no parameters").
/// A function tool as both Ollama and OpenAI-compatible servers take it.
#[derive(serde::Serialize)]
pub(super) struct Tool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: ToolFunction<'a>,
}

#[derive(serde::Serialize)]
struct ToolFunction<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    description: &'a str,
    parameters: serde_json::Value,
}

/// The run's tools in the shape both provider APIs share.
pub(super) fn wire_tools(request: &pb::RunRequest) -> Result<Vec<Tool<'_>>, AdapterError> {
    request
        .tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            Ok(Tool {
                kind: "function",
                function: ToolFunction {
                    name: &t.name,
                    description: &t.description,
                    parameters: tool_parameters(i, t)?,
                },
            })
        })
        .collect()
}

pub(super) fn tool_parameters(index: usize, tool: &pb::ToolDefinition) -> Result<serde_json::Value, AdapterError> {
    if tool.parameters_json.trim().is_empty() {
        return Ok(serde_json::json!({"type": "object", "properties": {}}));
    }
    let value = parse_json_text(format_args!("tools[{index}].parameters_json"), &tool.parameters_json)?;
    if !value.is_object() {
        return Err(AdapterError::InvalidRequest(format!("tools[{index}].parameters_json is not a JSON object")));
    }
    Ok(value)
}

/// The run's tool choice, checked: a named tool must be one of the run's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ToolChoice<'a> {
    /// Not set: the provider's default.
    Default,
    Auto,
    None,
    Required,
    Named(&'a str),
}

pub(super) fn tool_choice(request: &pb::RunRequest) -> Result<ToolChoice<'_>, AdapterError> {
    let Some(choice) = request.options.as_ref().and_then(|o| o.tool_choice.as_ref()) else {
        return Ok(ToolChoice::Default);
    };
    let mode = iop_proto::wire::closed_enum::<pb::ToolChoiceMode>("options.tool_choice.mode", choice.mode)
        .map_err(|e| AdapterError::InvalidRequest(e.to_string()))?;
    Ok(match mode {
        pb::ToolChoiceMode::Auto => ToolChoice::Auto,
        pb::ToolChoiceMode::None => ToolChoice::None,
        pb::ToolChoiceMode::Required => ToolChoice::Required,
        pb::ToolChoiceMode::Named if request.tools.iter().any(|t| t.name == choice.name) => {
            ToolChoice::Named(&choice.name)
        }
        pb::ToolChoiceMode::Named | pb::ToolChoiceMode::Unspecified => {
            return Err(AdapterError::InvalidRequest("options.tool_choice names no tool of the run".into()));
        }
    })
}

/// The run's structured-output request, checked.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum ResponseFormat<'a> {
    Text,
    JsonObject,
    JsonSchema { name: &'a str, schema: serde_json::Value, strict: bool },
}

pub(super) fn response_format(options: &pb::GenerationOptions) -> Result<ResponseFormat<'_>, AdapterError> {
    let Some(format) = &options.response_format else { return Ok(ResponseFormat::Text) };
    let kind = iop_proto::wire::closed_enum::<pb::ResponseFormatKind>("options.response_format.kind", format.kind)
        .map_err(|e| AdapterError::InvalidRequest(e.to_string()))?;
    Ok(match kind {
        pb::ResponseFormatKind::Text | pb::ResponseFormatKind::Unspecified => ResponseFormat::Text,
        pb::ResponseFormatKind::JsonObject => ResponseFormat::JsonObject,
        pb::ResponseFormatKind::JsonSchema => {
            let schema = parse_json_text(format_args!("options.response_format.schema_json"), &format.schema_json)?;
            if !schema.is_object() {
                return Err(AdapterError::InvalidRequest(
                    "options.response_format.schema_json is not a JSON object".into(),
                ));
            }
            ResponseFormat::JsonSchema { name: &format.name, schema, strict: format.strict }
        }
    })
}

pub(super) fn check_options(options: &pb::GenerationOptions) -> Result<(), AdapterError> {
    for (name, value) in [
        ("temperature", options.temperature),
        ("top_p", options.top_p),
        ("presence_penalty", options.presence_penalty),
        ("frequency_penalty", options.frequency_penalty),
    ] {
        if value.is_some_and(|v| !v.is_finite()) {
            return Err(AdapterError::InvalidRequest(format!("options.{name} is not a finite number")));
        }
    }
    Ok(())
}

pub(super) fn to_json_body<T: serde::Serialize>(body: &T) -> Result<Vec<u8>, AdapterError> {
    serde_json::to_vec(body).map_err(|e| {
        AdapterError::InvalidRequest(format!("request cannot be encoded as JSON ({})", json_error_summary(&e)))
    })
}

/// Issue 13 items 2, 3, 5: tool choice, structured output and the wider
/// options, as each adapter sends them or refuses them.
#[cfg(test)]
mod option_tests {
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
        let roles: Vec<&str> =
            ollama["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
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
        for refused in [
            pb::GenerationOptions { parallel_tool_calls: Some(false), ..Default::default() },
            pb::GenerationOptions { tool_choice: choice(pb::ToolChoiceMode::Required, "").tool_choice, ..schema() },
        ] {
            assert!(matches!(body(AdapterKind::Ollama, &with(refused)), Err(AdapterError::InvalidRequest(_))));
        }
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
}
