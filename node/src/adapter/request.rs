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
mod option_tests;
