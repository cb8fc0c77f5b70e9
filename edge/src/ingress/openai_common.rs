//! Request pieces Chat Completions (`openai_chat`) and Responses
//! (`openai_responses`) share, parsed strictly and worded the OpenAI way:
//! text content parts, function tool definitions and function calls. The two
//! APIs nest them differently (Chat Completions under `function`, Responses
//! flat), so each helper takes the object that holds the fields and its path.

use std::borrow::Cow;

use iop_proto::pb;
use serde_json::{Map, Value};

use super::documents::{self, DocumentError};
use super::error::ApiError;
use super::json::{Wording, field};

const JSON: Wording = Wording::OpenAi;
/// JSON Schema used when a tool declares no `parameters`.
const DEFAULT_PARAMETERS_JSON: &str = r#"{"type":"object","properties":{}}"#;

/// A string, or an array of content parts whose type is one of `text_types`;
/// their texts are joined with "\n".
pub(super) fn text_content(value: &Value, path: &str, text_types: &[&str]) -> Result<String, ApiError> {
    content_parts(value, path, text_types, None).map(|(text, _)| text)
}

type JsonObject = Map<String, Value>;

/// How an API spells its media parts: an image's `type` and where the URL
/// is in it; a file's `type` and where its fields are.
pub(super) struct ImagePart {
    pub kind: &'static str,
    pub url_of: fn(&Map<String, Value>) -> Option<&Value>,
    /// The URL's path below the part, for errors (e.g. `.image_url.url`).
    pub url_path: &'static str,
    /// A document's part type (Responses `input_file`, Chat `file`).
    pub file_kind: &'static str,
    /// The object holding `file_data`, `filename`, `file_id` (the part
    /// itself, or Chat's `file`) and its path below the part.
    pub file_of: fn(&JsonObject) -> Option<&JsonObject>,
    pub file_path: &'static str,
}

/// Like [`text_content`], with image and file parts too (a user message's
/// or tool output's content); a file reads as its text (see [`documents`]).
pub(super) fn user_content(
    value: &Value,
    path: &str,
    text_types: &[&str],
    image: &ImagePart,
) -> Result<(String, Vec<pb::Image>), ApiError> {
    content_parts(value, path, text_types, Some(image))
}

fn content_parts(
    value: &Value,
    path: &str,
    text_types: &[&str],
    image: Option<&ImagePart>,
) -> Result<(String, Vec<pb::Image>), ApiError> {
    match value {
        Value::String(s) => Ok((s.clone(), Vec::new())),
        Value::Array(parts) if parts.is_empty() => {
            Err(ApiError::invalid_param(path, format!("`{path}` must not be an empty array")))
        }
        Value::Array(parts) => {
            let (mut texts, mut images): (Vec<Cow<'_, str>>, _) = (Vec::with_capacity(parts.len()), Vec::new());
            for (j, part) in parts.iter().enumerate() {
                let part_path = format!("{path}[{j}]");
                let Value::Object(p) = part else {
                    return Err(JSON.type_error(&part_path, "an object"));
                };
                let type_path = format!("{part_path}.type");
                match JSON.string(JSON.required(p, "type", &type_path)?, &type_path)? {
                    ty if text_types.contains(&ty) => {
                        let text_path = format!("{part_path}.text");
                        texts.push(JSON.string(JSON.required(p, "text", &text_path)?, &text_path)?.into());
                    }
                    ty if image.is_some_and(|i| i.kind == ty) => {
                        let image = image.expect("checked");
                        let url_path = format!("{part_path}{}", image.url_path);
                        let url = (image.url_of)(p).ok_or_else(|| JSON.missing(&url_path))?;
                        images.push(super::images::from_url(JSON.string(url, &url_path)?, &url_path)?);
                    }
                    ty if image.is_some_and(|i| i.file_kind == ty) => {
                        let image = image.expect("checked");
                        let file_path = format!("{part_path}{}", image.file_path);
                        let Some(file) = (image.file_of)(p) else {
                            return Err(JSON.type_error(&file_path, "an object"));
                        };
                        texts.push(file_text(file, &part_path, &file_path)?.into());
                    }
                    other => {
                        return Err(ApiError::invalid_param(
                            &type_path,
                            format!("{part_path}: content part type `{other}` is not supported"),
                        ));
                    }
                }
            }
            Ok((texts.join("\n"), images))
        }
        _ => Err(JSON.type_error(path, "a string or an array of content parts")),
    }
}

/// A file part's text: `file_data`, a base64 `data:` URL of a PDF or text
/// file, read by [`documents`] and labelled with `filename`. A `file_id` or
/// `file_url` is refused: IOP stores and fetches no files.
fn file_text(file: &Map<String, Value>, part_path: &str, file_path: &str) -> Result<String, ApiError> {
    let name = match field(file, "filename") {
        None => None,
        Some(v) => Some(JSON.string(v, &format!("{file_path}.filename"))?),
    };
    let data_path = format!("{file_path}.file_data");
    match field(file, "file_data") {
        Some(v) => documents::from_data_url(JSON.string(v, &data_path)?, name, part_path),
        None => {
            let source = ["file_id", "file_url"].into_iter().find(|k| field(file, k).is_some()).unwrap_or("none");
            Err(DocumentError::Source(source.to_string()).at(part_path))
        }
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

/// A tool choice naming `name`, which must be one of `tools`.
pub(super) fn named_tool_choice(
    name: &str,
    tools: &[pb::ToolDefinition],
    path: &str,
) -> Result<pb::ToolChoice, ApiError> {
    if !tools.iter().any(|t| t.name == name) {
        return Err(ApiError::invalid_param(
            path,
            format!("`{path}` names `{name}`, which is not one of the request's tools"),
        ));
    }
    Ok(pb::ToolChoice { mode: pb::ToolChoiceMode::Named.into(), name: name.to_string() })
}

/// OpenAI's `tool_choice`: `"auto"`, `"none"`, `"required"`, or an object
/// naming a function (`name_of` finds the name in it: Chat nests it under
/// `function`, Responses does not).
pub(super) fn tool_choice(
    value: &Value,
    tools: &[pb::ToolDefinition],
    name_of: fn(&Map<String, Value>) -> Option<&Value>,
) -> Result<pb::ToolChoice, ApiError> {
    let mode = |mode: pb::ToolChoiceMode| Ok(pb::ToolChoice { mode: mode.into(), name: String::new() });
    match value {
        Value::String(s) if s == "auto" => mode(pb::ToolChoiceMode::Auto),
        Value::String(s) if s == "none" => mode(pb::ToolChoiceMode::None),
        Value::String(s) if s == "required" => mode(pb::ToolChoiceMode::Required),
        Value::Object(obj) => {
            expect_function_type(obj, "tool_choice", true)?;
            let name = name_of(obj).and_then(Value::as_str).filter(|n| !n.is_empty());
            let name =
                name.ok_or_else(|| ApiError::invalid_param("tool_choice", "`tool_choice` must name a function"))?;
            named_tool_choice(name, tools, "tool_choice")
        }
        _ => Err(ApiError::invalid_param(
            "tool_choice",
            "`tool_choice` must be \"auto\", \"none\", \"required\" or a function to call",
        )),
    }
}

/// A structured-output request: `kind` is `text`, `json_object` or
/// `json_schema` (the field at `type_path`); for a schema, `spec` holds
/// `name`, `schema` and `strict` (Chat's `response_format.json_schema`,
/// Responses' `text.format`, at `path`).
pub(super) fn response_format(
    kind: &str,
    type_path: &str,
    spec: Option<&Map<String, Value>>,
    path: &str,
) -> Result<pb::ResponseFormat, ApiError> {
    let format = |kind: pb::ResponseFormatKind| pb::ResponseFormat { kind: kind.into(), ..Default::default() };
    match kind {
        "text" => Ok(format(pb::ResponseFormatKind::Text)),
        "json_object" => Ok(format(pb::ResponseFormatKind::JsonObject)),
        "json_schema" => {
            let spec = spec.ok_or_else(|| JSON.missing(path))?;
            let schema = match JSON.required(spec, "schema", &format!("{path}.schema"))? {
                schema @ Value::Object(_) => schema.to_string(),
                _ => return Err(JSON.type_error(&format!("{path}.schema"), "an object")),
            };
            let name = JSON.non_empty_string(spec, "name", &format!("{path}.name"))?.to_string();
            let strict = JSON.optional_bool(spec, "strict", &format!("{path}.strict"))?.unwrap_or(false);
            Ok(pb::ResponseFormat {
                kind: pb::ResponseFormatKind::JsonSchema.into(),
                schema_json: schema,
                name,
                strict,
            })
        }
        other => Err(ApiError::invalid_param(
            type_path,
            format!("`{type_path}` is `{other}`; expected text, json_object or json_schema"),
        )),
    }
}

/// `presence_penalty` and `frequency_penalty` (each -2 to 2).
pub(super) fn penalties(obj: &Map<String, Value>, options: &mut pb::GenerationOptions) -> Result<(), ApiError> {
    if let Some(v) = field(obj, "presence_penalty") {
        options.presence_penalty = Some(JSON.number_in(v, "presence_penalty", -2.0, 2.0)?);
    }
    if let Some(v) = field(obj, "frequency_penalty") {
        options.frequency_penalty = Some(JSON.number_in(v, "frequency_penalty", -2.0, 2.0)?);
    }
    Ok(())
}

/// Fields IOP accepts the name of but cannot serve: refused with a 400
/// naming the field, never silently dropped. `false`, `0` and `null` ask
/// for nothing and pass.
pub(super) fn refuse_unsupported(obj: &Map<String, Value>, fields: &[&str]) -> Result<(), ApiError> {
    for name in fields {
        match field(obj, name) {
            None | Some(Value::Bool(false)) => {}
            Some(Value::Number(n)) if n.as_f64() == Some(0.0) => {}
            Some(_) => return Err(ApiError::invalid_param(name, format!("`{name}` is not supported by IOP"))),
        }
    }
    Ok(())
}

/// OpenAI's reasoning effort (`reasoning_effort`, Responses'
/// `reasoning.effort`): `none`, `minimal` (as low), `low`, `medium`, `high`.
pub(super) fn reasoning_effort(value: &Value, path: &str) -> Result<pb::ReasoningEffort, ApiError> {
    match JSON.string(value, path)? {
        "none" => Ok(pb::ReasoningEffort::None),
        "minimal" | "low" => Ok(pb::ReasoningEffort::Low),
        "medium" => Ok(pb::ReasoningEffort::Medium),
        "high" => Ok(pb::ReasoningEffort::High),
        other => Err(ApiError::invalid_param(
            path,
            format!("`{path}` is `{other}`; expected none, minimal, low, medium or high"),
        )),
    }
}
