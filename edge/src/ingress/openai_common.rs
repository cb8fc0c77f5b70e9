//! Request pieces Chat Completions (`openai_chat`) and Responses
//! (`openai_responses`) share, parsed strictly and worded the OpenAI way:
//! text content parts, function tool definitions and function calls. The two
//! APIs nest them differently (Chat Completions under `function`, Responses
//! flat), so each helper takes the object that holds the fields and its path.

use iop_proto::pb;
use serde_json::{Map, Value};

use super::error::ApiError;
use super::json::{Wording, field};

const JSON: Wording = Wording::OpenAi;
/// JSON Schema used when a tool declares no `parameters`.
const DEFAULT_PARAMETERS_JSON: &str = r#"{"type":"object","properties":{}}"#;

/// A string, or an array of content parts whose type is one of `text_types`;
/// their texts are joined with "\n".
pub(super) fn text_content(value: &Value, path: &str, text_types: &[&str]) -> Result<String, ApiError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) if parts.is_empty() => {
            Err(ApiError::invalid_param(path, format!("`{path}` must not be an empty array")))
        }
        Value::Array(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let part_path = format!("{path}[{j}]");
                let Value::Object(p) = part else {
                    return Err(JSON.type_error(&part_path, "an object"));
                };
                let type_path = format!("{part_path}.type");
                match JSON.string(JSON.required(p, "type", &type_path)?, &type_path)? {
                    ty if text_types.contains(&ty) => {
                        let text_path = format!("{part_path}.text");
                        texts.push(JSON.string(JSON.required(p, "text", &text_path)?, &text_path)?);
                    }
                    other => {
                        return Err(ApiError::invalid_param(
                            &type_path,
                            format!("{part_path}: content part type `{other}` is not supported"),
                        ));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(JSON.type_error(path, "a string or an array of content parts")),
    }
}

/// The tool's `type` (at `{path}.type`) must be "function", the only tool
/// type supported; `required_field` says whether it must be present.
pub(super) fn expect_function_type(obj: &Map<String, Value>, path: &str, required_field: bool) -> Result<(), ApiError> {
    let type_path = format!("{path}.type");
    let ty = match field(obj, "type") {
        None if required_field => return Err(JSON.missing(&type_path)),
        None => return Ok(()),
        Some(v) => JSON.string(v, &type_path)?,
    };
    if ty != "function" {
        return Err(ApiError::invalid_param(
            &type_path,
            format!("{path}: tool type `{ty}` is not supported; only `function` is"),
        ));
    }
    Ok(())
}

/// `{"name","description"?,"parameters"?}` of a function tool found at `path`.
pub(super) fn function_definition(obj: &Map<String, Value>, path: &str) -> Result<pb::ToolDefinition, ApiError> {
    let name = JSON.non_empty_string(obj, "name", &format!("{path}.name"))?.to_string();
    let description = match field(obj, "description") {
        None => String::new(),
        Some(v) => JSON.string(v, &format!("{path}.description"))?.to_string(),
    };
    let parameters_json = match field(obj, "parameters") {
        None => DEFAULT_PARAMETERS_JSON.to_string(),
        Some(v @ Value::Object(_)) => v.to_string(),
        Some(_) => return Err(JSON.type_error(&format!("{path}.parameters"), "an object")),
    };
    Ok(pb::ToolDefinition { name, description, parameters_json })
}

/// `{"name","arguments":<string>}` of a function call found at `path`, with
/// the call's already validated `id`.
pub(super) fn function_call(id: String, obj: &Map<String, Value>, path: &str) -> Result<pb::ToolCall, ApiError> {
    let name = JSON.non_empty_string(obj, "name", &format!("{path}.name"))?.to_string();
    let args_path = format!("{path}.arguments");
    let arguments_json = match JSON.required(obj, "arguments", &args_path)? {
        Value::String(s) => s.clone(),
        _ => return Err(JSON.type_error(&args_path, "a string (the arguments as JSON text)")),
    };
    Ok(pb::ToolCall { id, name, arguments_json })
}
