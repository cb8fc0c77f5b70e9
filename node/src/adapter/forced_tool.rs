//! A forced tool choice (`required`, or a named tool) on a provider that has
//! no `tool_choice` (Ollama): enforced through the provider's structured
//! output instead. Pure: the schema to send, and the answer read back as a
//! tool call.
//!
//! - A named tool (or `required` with exactly one tool): the schema is that
//!   tool's parameter schema, and the answer is the call's arguments.
//! - `required` with several tools: the schema is a choice among them,
//!   `{"anyOf": [{"type": "object", "properties": {"name": {"const": <tool>},
//!   "arguments": <its parameters>}, "required": ["name", "arguments"],
//!   "additionalProperties": false}, ...]}`, and the answer is
//!   `{"name", "arguments"}`. `anyOf`, `const` and `required` are what
//!   llama.cpp's schema-to-grammar conversion (which Ollama's `format` uses)
//!   supports, so the grammar admits exactly one call of one of the tools.
//!   A tool schema's own references (`#/$defs/...`) are rewritten to point
//!   into its branch.
//!
//! A choice that even this cannot serve is refused: `required` without
//! tools, and any forced choice together with the caller's own
//! `response_format` (both would need the one `format`).

use serde_json::{Value, json};

use super::error::AdapterError;
use super::request::{ResponseFormat, ToolChoice, response_format, tool_choice, tool_parameters};
use iop_proto::pb;

/// How the run's answer becomes its one tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ForcedTool {
    /// The answer is the arguments of a call to this tool.
    Named(String),
    /// The answer is `{"name": <one of these>, "arguments": {...}}`.
    Choice(Vec<String>),
}

/// The forced tool choice of `request`, if it has one, with the JSON schema
/// that enforces it and the index of the only tool to offer (`None`: all).
pub(super) fn plan(request: &pb::RunRequest) -> Result<Option<(ForcedTool, Value, Option<usize>)>, AdapterError> {
    let named = match tool_choice(request)? {
        ToolChoice::Default | ToolChoice::Auto | ToolChoice::None => return Ok(None),
        ToolChoice::Named(name) => Some(name),
        ToolChoice::Required => None,
    };
    let default_options = pb::GenerationOptions::default();
    if response_format(request.options.as_ref().unwrap_or(&default_options))? != ResponseFormat::Text {
        return Err(AdapterError::InvalidRequest(
            "tool_choice `required` or a named tool together with a response format cannot be enforced by \
             Ollama (both need its one `format`); drop one of them or use an OpenAI-compatible provider"
                .into(),
        ));
    }
    let index = match (named, request.tools.len()) {
        (Some(name), _) => request.tools.iter().position(|t| t.name == name),
        (None, 0) => {
            return Err(AdapterError::InvalidRequest("tool_choice `required` needs at least one tool".into()));
        }
        (None, 1) => Some(0),
        (None, _) => None,
    };
    Ok(Some(match index {
        Some(i) => (ForcedTool::Named(request.tools[i].name.clone()), tool_parameters(i, &request.tools[i])?, Some(i)),
        None => {
            let choices = request
                .tools
                .iter()
                .enumerate()
                .map(|(i, tool)| {
                    let mut arguments = tool_parameters(i, tool)?;
                    rebase_refs(&mut arguments, &format!("/anyOf/{i}/properties/arguments"));
                    Ok(json!({
                        "type": "object",
                        "properties": { "name": { "const": tool.name }, "arguments": arguments },
                        "required": ["name", "arguments"],
                        "additionalProperties": false,
                    }))
                })
                .collect::<Result<Vec<_>, AdapterError>>()?;
            let names = request.tools.iter().map(|t| t.name.clone()).collect();
            (ForcedTool::Choice(names), json!({ "anyOf": choices }), None)
        }
    }))
}

/// A tool's schema moved to `at` (a JSON pointer) inside the choice schema:
/// its own references (`#/$defs/...`, pydantic's nested models, or `#`)
/// are made to point to where its definitions now are.
fn rebase_refs(schema: &mut Value, at: &str) {
    match schema {
        Value::Object(object) => {
            for (key, value) in object.iter_mut() {
                match value {
                    Value::String(reference) if key == "$ref" => {
                        if let Some(rest) = reference.strip_prefix('#').filter(|r| r.is_empty() || r.starts_with('/')) {
                            *reference = format!("#{at}{rest}");
                        }
                    }
                    _ => rebase_refs(value, at),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| rebase_refs(item, at)),
        _ => {}
    }
}

/// Why an answer is not the forced call (never quoting the answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum NotACall {
    #[error("the answer is not JSON")]
    NotJson,
    #[error("the answer is not a JSON object")]
    NotObject,
    #[error("the answer names no tool of the run")]
    UnknownTool,
    #[error("the answer's `arguments` is not a JSON object")]
    ArgumentsNotObject,
}

impl ForcedTool {
    /// The model's whole answer as `(tool name, arguments JSON text)`.
    pub(super) fn call(&self, answer: &str) -> Result<(String, String), NotACall> {
        let value: Value = serde_json::from_str(answer).map_err(|_| NotACall::NotJson)?;
        let Value::Object(mut object) = value else { return Err(NotACall::NotObject) };
        match self {
            Self::Named(name) => Ok((name.clone(), Value::Object(object).to_string())),
            Self::Choice(names) => {
                let name = object.get("name").and_then(Value::as_str).ok_or(NotACall::UnknownTool)?;
                let name = names.iter().find(|n| *n == name).ok_or(NotACall::UnknownTool)?.clone();
                match object.remove("arguments") {
                    None | Some(Value::Null) => Ok((name, "{}".to_owned())),
                    Some(arguments @ Value::Object(_)) => Ok((name, arguments.to_string())),
                    Some(_) => Err(NotACall::ArgumentsNotObject),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
