//! OpenAI Responses API (`POST /v1/responses`) <-> IOP's normalized run shape.
//!
//! Pure translation, no I/O: [`parse_request`] turns a request body into
//! normalized messages, tools and options; [`EventRenderer`] (streaming) and
//! [`ResponseAggregator`] (non-streaming) turn run events back into the exact
//! Responses wire format. Both build their output items through the same
//! `OutputItems`, so for the same run events the streamed final response
//! object and the non-streaming body are identical (apart from generated ids).
//!
//! IOP keeps no conversation state: `previous_response_id` and `conversation`
//! are rejected, and nothing is ever stored.

use iop_proto::pb;
use serde_json::{Map, Value, json};

use super::error::ApiError;
use super::hosted_tools::{self, DroppedTool};
use super::json::{Wording, body_object, field, text_message};
use super::openai_common::{
    ImagePart, expect_function_type, function_call, function_definition, named_tool_choice, reasoning_effort,
    refuse_unsupported, response_format, text_content, tool_choice as openai_tool_choice, user_content,
};
use super::outcome::{synthetic_call_id, synthetic_id, usage_pair};
use super::transcript::{BlockKind, Step, Transcript};

/// Validation messages are worded the OpenAI way.
const JSON: Wording = Wording::OpenAi;
/// The content part types whose text is kept (`output_text` when a client
/// replays earlier output).
const TEXT_PART_TYPES: &[&str] = &["input_text", "output_text"];
const STATEFUL_UNSUPPORTED: &str = "stateful responses are not supported: send the full input";

// ---------------------------------------------------------------- request

/// A validated Responses request in normalized form.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesRequest {
    pub model: String,
    pub stream: bool,
    /// `instructions` (as a leading system message) followed by the `input` items.
    pub messages: Vec<pb::ChatMessage>,
    pub tools: Vec<pb::ToolDefinition>,
    pub options: pb::GenerationOptions,
    /// Echoed back in the response object.
    pub instructions: Option<String>,
    /// Hosted tools the request named (served without them, or refused,
    /// by the Edge's `api.hosted_tools`).
    pub dropped_tools: Vec<DroppedTool>,
    /// The functions that came from `namespace` tools.
    pub namespaces: Namespaces,
    /// The functions that came from `custom` tools.
    pub custom_tools: CustomTools,
    /// `reasoning.summary` (`auto`, `concise` or `detailed`) was asked for:
    /// reasoning is rendered as a summary (see [`ResponseMeta::reasoning_summary`]).
    pub reasoning_summary: bool,
}

/// Namespace tools (`{"type":"namespace","name","tools":[functions]}`, as
/// Codex CLI groups its sub-agent tools) are offered to the provider as
/// plain functions named `<namespace>__<name>` (the characters every
/// OpenAI-compatible server takes in a function name); a call of one goes
/// back to the client as `name` plus `namespace`, and a `function_call`
/// input item with a `namespace` is read the same way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespaces(Vec<(String, usize)>);

impl Namespaces {
    const SEPARATOR: &str = "__";

    fn qualified(namespace: &str, name: &str) -> String {
        format!("{namespace}{}{name}", Self::SEPARATOR)
    }

    fn add(&mut self, namespace: &str, name: &str) -> String {
        let qualified = Self::qualified(namespace, name);
        self.0.push((qualified.clone(), namespace.len()));
        qualified
    }

    /// `(namespace, name)` of a provider-facing function name that came
    /// from a namespace tool.
    pub fn split<'a>(&self, function: &'a str) -> Option<(&'a str, &'a str)> {
        let (_, at) = self.0.iter().find(|(qualified, _)| qualified == function)?;
        Some((&function[..*at], &function[at + Self::SEPARATOR.len()..]))
    }
}

/// Custom tools (`{"type":"custom","name","description"?,"format"?}`, as
/// Codex CLI sends its freeform `apply_patch`) are offered to the provider
/// as functions of one string argument ([`CustomTools::ARGUMENT`]), the
/// grammar (if any) noted in the description, bounded
/// ([`GRAMMAR_NOTE_LIMIT`]); no provider behind IOP constrains output to a
/// grammar. A call of one goes back to the client as a `custom_tool_call`
/// with that string as `input`; `custom_tool_call` and
/// `custom_tool_call_output` input items are read back as a call and its
/// result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CustomTools(Vec<String>);

impl CustomTools {
    /// The one argument of a custom tool's function.
    pub const ARGUMENT: &str = "input";

    pub fn from_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        Self(names.into_iter().map(str::to_owned).collect())
    }

    pub fn contains(&self, function: &str) -> bool {
        self.0.iter().any(|name| name == function)
    }

    /// A call's `input`: its string argument, or its arguments as the
    /// model wrote them when they are not `{"input": <string>}`.
    pub fn input(arguments: &str) -> String {
        match serde_json::from_str::<Value>(arguments) {
            Ok(Value::Object(mut args)) => match args.remove(Self::ARGUMENT) {
                Some(Value::String(input)) => input,
                _ => arguments.to_owned(),
            },
            _ => arguments.to_owned(),
        }
    }

    /// The part of a call's `input` readable from the start of its JSON
    /// arguments as they stream (`{"input": "...`, complete escapes only);
    /// `None` while they do not start that way.
    pub fn partial_input(arguments: &str) -> Option<String> {
        let rest = arguments.trim_start().strip_prefix('{')?.trim_start();
        let rest = rest.strip_prefix("\"input\"")?.trim_start().strip_prefix(':')?.trim_start().strip_prefix('"')?;
        let mut input = String::new();
        let mut chars = rest.chars();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => {
                    let decoded = match chars.next() {
                        None => break,
                        Some('n') => '\n',
                        Some('t') => '\t',
                        Some('r') => '\r',
                        Some('b') => '\u{8}',
                        Some('f') => '\u{c}',
                        Some('u') => {
                            // Four hex digits, all there.
                            let unit = |chars: &mut std::str::Chars<'_>| {
                                let hex: String = chars.by_ref().take(4).collect();
                                u16::from_str_radix(&hex, 16).ok().filter(|_| hex.len() == 4)
                            };
                            let Some(first) = unit(&mut chars) else { break };
                            let units = if (0xd800..0xdc00).contains(&first) {
                                // A surrogate pair: the low half follows as `\uXXXX`.
                                if chars.next() != Some('\\') || chars.next() != Some('u') {
                                    break;
                                }
                                let Some(second) = unit(&mut chars) else { break };
                                vec![first, second]
                            } else {
                                vec![first]
                            };
                            match char::decode_utf16(units).next() {
                                Some(Ok(c)) => c,
                                _ => break,
                            }
                        }
                        Some(other) => other,
                    };
                    input.push(decoded);
                }
                c => input.push(c),
            }
        }
        Some(input)
    }

    /// The function arguments a custom call's `input` stands for.
    fn arguments(input: &str) -> String {
        let mut args = Map::new();
        args.insert(Self::ARGUMENT.into(), Value::from(input));
        Value::Object(args).to_string()
    }

    fn parameters_json() -> String {
        json!({
            "type": "object",
            "properties": {Self::ARGUMENT: {"type": "string", "description": "The tool's input, as free text."}},
            "required": [Self::ARGUMENT],
        })
        .to_string()
    }
}

/// Most bytes of a custom tool's grammar noted in its description (Codex's
/// `apply_patch` grammar is about 1 KiB); the rest is cut and the note says so.
pub const GRAMMAR_NOTE_LIMIT: usize = 4096;

/// Strict parse + validation. Every error is [`ApiError::InvalidRequest`]
/// with a message saying exactly what is wrong and `param` naming the field
/// (e.g. `input[2].content[0].type`). Unknown top-level fields are ignored
/// (SDKs send extras such as `metadata`, `user`, `include`, `text`). An
/// explicit `null` counts as absent.
pub fn parse_request(body: &[u8]) -> Result<ResponsesRequest, ApiError> {
    let obj = body_object(body)?;
    let model = JSON.non_empty_string(&obj, "model", "model")?.to_string();

    // IOP keeps no conversation state, so a request that points at an earlier
    // response or conversation cannot be honoured.
    for key in ["previous_response_id", "conversation"] {
        if field(&obj, key).is_some() {
            return Err(ApiError::invalid_param(key, STATEFUL_UNSUPPORTED));
        }
    }
    if JSON.optional_bool(&obj, "background", "background")? == Some(true) {
        return Err(ApiError::invalid_param("background", "background responses are not supported"));
    }
    // `store` is accepted and ignored: IOP never stores responses, whatever it says.

    let instructions =
        field(&obj, "instructions").map(|v| JSON.string(v, "instructions").map(str::to_string)).transpose()?;
    let mut messages = Vec::new();
    if let Some(text) = instructions.as_deref().filter(|s| !s.is_empty()) {
        messages.push(text_message(pb::Role::System, text.to_string()));
    }
    match field(&obj, "input") {
        None => return Err(JSON.missing("input")),
        Some(Value::String(s)) => messages.push(text_message(pb::Role::User, s.clone())),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid_param("input", "`input` must contain at least one item"));
        }
        Some(Value::Array(items)) => {
            super::documents::within_bound(&obj, "input")?;
            let mut tool_images = Vec::new();
            for (i, item) in items.iter().enumerate() {
                parse_item(item, i, &mut messages, &mut tool_images)?;
            }
            flush_tool_images(&mut messages, &mut tool_images);
        }
        Some(_) => return Err(JSON.type_error("input", "a string or an array of input items")),
    }

    let mut tools = Vec::new();
    let mut namespaces = Namespaces::default();
    let mut dropped_tools = Vec::new();
    let mut custom_tools = CustomTools::default();
    // (path, index in `tools`) of each custom tool, for the name check.
    let mut customs = Vec::new();
    match field(&obj, "tools") {
        None => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let path = format!("tools[{i}]");
                let ty = item.get("type").and_then(Value::as_str).unwrap_or_default();
                if let Some(kind) = hosted_tools::openai_kind(ty) {
                    dropped_tools.push(DroppedTool { path, kind });
                } else if ty == "namespace" {
                    parse_namespace(item, &path, &mut namespaces, &mut tools)?;
                } else if ty == "custom" {
                    let tool = parse_custom_tool(item, &path)?;
                    custom_tools.0.push(tool.name.clone());
                    customs.push((path, tools.len()));
                    tools.push(tool);
                } else {
                    tools.push(parse_tool(item, &path)?);
                }
            }
        }
        Some(_) => return Err(JSON.type_error("tools", "an array")),
    }
    // A custom tool's calls are told apart by name alone.
    for (path, at) in &customs {
        let name = &tools[*at].name;
        if tools.iter().enumerate().any(|(other, t)| other != *at && &t.name == name) {
            let name_path = format!("{path}.name");
            return Err(ApiError::invalid_param(
                &name_path,
                format!("`{name_path}`: another tool is also named `{name}`; a custom tool's name must be unique"),
            ));
        }
    }

    let stream = JSON.optional_bool(&obj, "stream", "stream")?.unwrap_or(false);
    let mut options = parse_options(&obj)?;
    if let Some(v) = field(&obj, "tool_choice") {
        options.tool_choice = Some(match v {
            // `{"type":"custom","name"}` names a custom tool.
            Value::Object(choice) if choice.get("type").and_then(Value::as_str) == Some("custom") => {
                let name = JSON.non_empty_string(choice, "name", "tool_choice.name")?;
                if !custom_tools.contains(name) {
                    let message =
                        format!("`tool_choice` names `{name}`, which is not one of the request's custom tools");
                    return Err(ApiError::invalid_param("tool_choice.name", message));
                }
                named_tool_choice(name, &tools, "tool_choice")?
            }
            v => openai_tool_choice(v, &tools, |f| f.get("name"))?,
        });
    }
    options.parallel_tool_calls = JSON.optional_bool(&obj, "parallel_tool_calls", "parallel_tool_calls")?;
    let mut reasoning_summary = false;
    match field(&obj, "reasoning") {
        None => {}
        Some(Value::Object(reasoning)) => {
            if let Some(v) = field(reasoning, "effort") {
                options.reasoning_effort = Some(reasoning_effort(v, "reasoning.effort")?.into());
            }
            // `generate_summary` is the older name of `summary`.
            for key in ["summary", "generate_summary"] {
                if let Some(v) = field(reasoning, key) {
                    reasoning_summary = parse_reasoning_summary(v, &format!("reasoning.{key}"))?;
                }
            }
        }
        Some(_) => return Err(JSON.type_error("reasoning", "an object")),
    }
    options.response_format = match field(&obj, "text") {
        None => None,
        Some(Value::Object(text)) => match field(text, "format") {
            None => None,
            Some(Value::Object(format)) => {
                let kind = JSON.non_empty_string(format, "type", "text.format.type")?;
                Some(response_format(kind, "text.format.type", Some(format), "text.format")?)
            }
            Some(_) => return Err(JSON.type_error("text.format", "an object")),
        },
        Some(_) => return Err(JSON.type_error("text", "an object")),
    };

    Ok(ResponsesRequest {
        model,
        stream,
        messages,
        tools,
        options,
        instructions,
        dropped_tools,
        namespaces,
        custom_tools,
        reasoning_summary,
    })
}

/// `{"type":"custom","name","description"?,"format"?}`, the format `{"type":
/// "text"}` or `{"type":"grammar","syntax":"lark"|"regex","definition"}`:
/// a function of one string argument ([`CustomTools`]).
fn parse_custom_tool(value: &Value, path: &str) -> Result<pb::ToolDefinition, ApiError> {
    let Value::Object(obj) = value else {
        return Err(JSON.type_error(path, "an object"));
    };
    let name = JSON.non_empty_string(obj, "name", &format!("{path}.name"))?.to_string();
    let mut description = match field(obj, "description") {
        None => String::new(),
        Some(v) => JSON.string(v, &format!("{path}.description"))?.to_string(),
    };
    match field(obj, "format") {
        None => {}
        Some(Value::Object(format)) => {
            let type_path = format!("{path}.format.type");
            match JSON.non_empty_string(format, "type", &type_path)? {
                "text" => {}
                "grammar" => {
                    let syntax_path = format!("{path}.format.syntax");
                    let syntax = match field(format, "syntax") {
                        None => "grammar",
                        Some(v) => match JSON.string(v, &syntax_path)? {
                            syntax @ ("lark" | "regex") => syntax,
                            other => {
                                let message = format!("`{syntax_path}` is `{other}`; expected lark or regex");
                                return Err(ApiError::invalid_param(&syntax_path, message));
                            }
                        },
                    };
                    let definition_path = format!("{path}.format.definition");
                    let definition =
                        JSON.string(JSON.required(format, "definition", &definition_path)?, &definition_path)?;
                    description.push_str(&grammar_note(syntax, definition, description.is_empty()));
                }
                other => {
                    let message = format!("`{type_path}` is `{other}`; expected text or grammar");
                    return Err(ApiError::invalid_param(&type_path, message));
                }
            }
        }
        Some(_) => return Err(JSON.type_error(&format!("{path}.format"), "an object")),
    }
    Ok(pb::ToolDefinition { name, description, parameters_json: CustomTools::parameters_json() })
}

/// The description's note of a custom tool's grammar, at most
/// [`GRAMMAR_NOTE_LIMIT`] bytes of it (cut at a character boundary).
fn grammar_note(syntax: &str, definition: &str, alone: bool) -> String {
    let mut end = definition.len().min(GRAMMAR_NOTE_LIMIT);
    while !definition.is_char_boundary(end) {
        end -= 1;
    }
    let cut = if end < definition.len() { " (cut: only its start is shown)" } else { "" };
    let gap = if alone { "" } else { "\n\n" };
    let argument = CustomTools::ARGUMENT;
    format!("{gap}The `{argument}` argument must follow this {syntax} grammar{cut}:\n{}", &definition[..end])
}

/// `{"type":"namespace","name","description"?,"tools":[function tools]}`:
/// each function joins `tools` under its qualified name.
fn parse_namespace(
    value: &Value,
    path: &str,
    namespaces: &mut Namespaces,
    tools: &mut Vec<pb::ToolDefinition>,
) -> Result<(), ApiError> {
    let Value::Object(obj) = value else {
        return Err(JSON.type_error(path, "an object"));
    };
    let namespace = JSON.non_empty_string(obj, "name", &format!("{path}.name"))?;
    let inner_path = format!("{path}.tools");
    let Value::Array(inner) = JSON.required(obj, "tools", &inner_path)? else {
        return Err(JSON.type_error(&inner_path, "an array"));
    };
    for (j, tool) in inner.iter().enumerate() {
        let mut tool = parse_tool(tool, &format!("{inner_path}[{j}]"))?;
        tool.name = namespaces.add(namespace, &tool.name);
        tools.push(tool);
    }
    Ok(())
}

/// `reasoning.summary`: `auto`, `concise` or `detailed` ask for a summary
/// (IOP makes none: the provider's reasoning text is shown as it), `none`
/// for none.
fn parse_reasoning_summary(value: &Value, path: &str) -> Result<bool, ApiError> {
    match JSON.string(value, path)? {
        "auto" | "concise" | "detailed" => Ok(true),
        "none" => Ok(false),
        other => Err(ApiError::invalid_param(
            path,
            format!("`{path}` is `{other}`; expected auto, concise, detailed or none"),
        )),
    }
}

/// One `input` item, appended to `messages`. A `function_call` joins the
/// assistant message right before it (consecutive calls, or the text of the
/// same assistant turn), as Chat Completions would carry it. Images in a
/// `function_call_output` (Codex's `view_image`) wait in `tool_images` for
/// the end of the run of outputs (see [`flush_tool_images`]).
fn parse_item(
    value: &Value,
    i: usize,
    messages: &mut Vec<pb::ChatMessage>,
    tool_images: &mut Vec<pb::Image>,
) -> Result<(), ApiError> {
    let path = format!("input[{i}]");
    let Value::Object(obj) = value else {
        return Err(JSON.type_error(&path, "an object"));
    };
    let type_path = format!("{path}.type");
    // Easy-input messages (`{"role","content"}`) carry no `type`.
    let ty = match field(obj, "type") {
        None => "message",
        Some(v) => JSON.string(v, &type_path)?,
    };
    if ty != "function_call_output" && ty != "custom_tool_call_output" {
        flush_tool_images(messages, tool_images);
    }
    match ty {
        "message" => messages.push(parse_message_item(obj, &path)?),
        "function_call" | "custom_tool_call" => {
            let call = if ty == "custom_tool_call" {
                parse_custom_call(obj, &path)?
            } else {
                parse_function_call(obj, &path)?
            };
            match messages.last_mut() {
                Some(last) if last.role == i32::from(pb::Role::Assistant) => last.tool_calls.push(call),
                _ => messages.push(pb::ChatMessage {
                    role: pb::Role::Assistant.into(),
                    tool_calls: vec![call],
                    ..Default::default()
                }),
            }
        }
        // Earlier turns' reasoning a client hands back (Codex CLI does, with
        // `store: false`): no provider takes it back, so it is dropped.
        "reasoning" => {}
        "function_call_output" | "custom_tool_call_output" => {
            let tool_call_id = JSON.non_empty_string(obj, "call_id", &format!("{path}.call_id"))?.to_string();
            let output_path = format!("{path}.output");
            let output = JSON.required(obj, "output", &output_path)?;
            let (content, images) = user_content(output, &output_path, TEXT_PART_TYPES, &IMAGE_PART)?;
            tool_images.extend(images);
            messages.push(pb::ChatMessage { role: pb::Role::Tool.into(), content, tool_call_id, ..Default::default() });
        }
        other => {
            return Err(ApiError::invalid_param(
                &type_path,
                format!(
                    "{path}: item type `{other}` is not supported; only message, function_call, function_call_output, custom_tool_call, custom_tool_call_output and reasoning are"
                ),
            ));
        }
    }
    Ok(())
}

/// Images that tool outputs returned, as one user message after those
/// outputs: the tool role carries text only at OpenAI-compatible servers,
/// and the outputs of one turn must stay together after its calls.
fn flush_tool_images(messages: &mut Vec<pb::ChatMessage>, tool_images: &mut Vec<pb::Image>) {
    if !tool_images.is_empty() {
        let images = std::mem::take(tool_images);
        messages.push(pb::ChatMessage { images, ..text_message(pb::Role::User, String::new()) });
    }
}

/// `{"type":"message"?,"role","content"}`; `id` and `status` (present when a
/// client replays earlier output items) are ignored.
fn parse_message_item(obj: &Map<String, Value>, path: &str) -> Result<pb::ChatMessage, ApiError> {
    let role_path = format!("{path}.role");
    let role = match JSON.string(JSON.required(obj, "role", &role_path)?, &role_path)? {
        "system" | "developer" => pb::Role::System,
        "user" => pb::Role::User,
        "assistant" => pb::Role::Assistant,
        other => {
            return Err(ApiError::invalid_param(
                &role_path,
                format!("`{role_path}` has unknown role `{other}`; expected one of system, developer, user, assistant"),
            ));
        }
    };
    let content_path = format!("{path}.content");
    let content = JSON.required(obj, "content", &content_path)?;
    if role == pb::Role::User {
        let (text, images) = user_content(content, &content_path, TEXT_PART_TYPES, &IMAGE_PART)?;
        return Ok(pb::ChatMessage { images, ..text_message(role, text) });
    }
    Ok(text_message(role, text_content(content, &content_path, TEXT_PART_TYPES)?))
}

/// `{"type": "input_image", "image_url": <URL>, "detail"?: ...}` (a
/// `file_id` image cannot be fetched: IOP stores no files);
/// `{"type": "input_file", "file_data", "filename"?}`.
const IMAGE_PART: ImagePart = ImagePart {
    kind: "input_image",
    url_of: |part| part.get("image_url"),
    url_path: ".image_url",
    file_kind: "input_file",
    file_of: |part| Some(part),
    file_path: "",
};

/// `{"type":"function_call","call_id","name","namespace"?,"arguments":<string>}`;
/// `id` and `status` are ignored.
fn parse_function_call(obj: &Map<String, Value>, path: &str) -> Result<pb::ToolCall, ApiError> {
    let id = JSON.non_empty_string(obj, "call_id", &format!("{path}.call_id"))?.to_string();
    let mut call = function_call(id, obj, path)?;
    if field(obj, "namespace").is_some() {
        let namespace = JSON.non_empty_string(obj, "namespace", &format!("{path}.namespace"))?;
        call.name = Namespaces::qualified(namespace, &call.name);
    }
    Ok(call)
}

/// `{"type":"custom_tool_call","call_id","name","input":<string>}`, as the
/// call of its custom tool's function; `id` and `status` are ignored.
fn parse_custom_call(obj: &Map<String, Value>, path: &str) -> Result<pb::ToolCall, ApiError> {
    let id = JSON.non_empty_string(obj, "call_id", &format!("{path}.call_id"))?.to_string();
    let name = JSON.non_empty_string(obj, "name", &format!("{path}.name"))?.to_string();
    let input_path = format!("{path}.input");
    let input = JSON.string(JSON.required(obj, "input", &input_path)?, &input_path)?;
    Ok(pb::ToolCall { id, name, arguments_json: CustomTools::arguments(input) })
}

/// `{"type":"function","name","description"?,"parameters"?,"strict"?}`:
/// Responses tools are flat, not nested under `function`. `strict` is ignored.
fn parse_tool(value: &Value, path: &str) -> Result<pb::ToolDefinition, ApiError> {
    let Value::Object(obj) = value else {
        return Err(JSON.type_error(path, "an object"));
    };
    expect_function_type(obj, path, true)?;
    let name_path = format!("{path}.name");
    if field(obj, "name").is_none() && field(obj, "function").is_some() {
        return Err(ApiError::invalid_param(
            &name_path,
            format!(
                "`{name_path}` is required (Responses tools are flat: put name, description and parameters next to `type`, not under `function`)"
            ),
        ));
    }
    function_definition(obj, path)
}

fn parse_options(obj: &Map<String, Value>) -> Result<pb::GenerationOptions, ApiError> {
    let mut options = pb::GenerationOptions::default();
    if let Some(v) = field(obj, "max_output_tokens") {
        options.max_tokens = Some(JSON.positive_u32(v, "max_output_tokens")?);
    }
    if let Some(v) = field(obj, "temperature") {
        options.temperature = Some(JSON.number_in(v, "temperature", 0.0, 2.0)?);
    }
    if let Some(v) = field(obj, "top_p") {
        options.top_p = Some(JSON.number_in(v, "top_p", 0.0, 1.0)?);
    }
    refuse_unsupported(obj, &["top_logprobs", "prompt", "max_tool_calls"])?;
    Ok(options)
}

// ---------------------------------------------------------------- response

/// What every response object of one response carries: its identity and
/// what it echoes of the request.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseMeta {
    /// `resp_` followed by 32 hex digits.
    pub id: String,
    /// Unix seconds.
    pub created_at: u64,
    pub model: String,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// The request's tools as Responses spells them.
    pub tools: Vec<Value>,
    /// Which function names came from namespace tools.
    pub namespaces: Namespaces,
    /// Which function names came from custom tools.
    pub custom_tools: CustomTools,
    /// The client asked for `reasoning.summary`: each reasoning item
    /// carries the provider's reasoning text as its one `summary_text` (no
    /// `content`), streamed as `response.reasoning_summary_*` events.
    /// Otherwise the text is the item's `reasoning_text` content (as gpt-oss
    /// models answer on the Responses API) and `summary` is empty.
    pub reasoning_summary: bool,
}

impl ResponseMeta {
    /// A fresh id: `resp_` followed by a v4 UUID in simple form; the
    /// defaults of a request that set nothing else.
    pub fn new(model: String, created_at: u64, instructions: Option<String>, max_output_tokens: Option<u32>) -> Self {
        Self {
            id: synthetic_id("resp_"),
            created_at,
            model,
            instructions,
            max_output_tokens,
            tool_choice: json!("auto"),
            parallel_tool_calls: true,
            temperature: None,
            top_p: None,
            tools: Vec::new(),
            namespaces: Namespaces::default(),
            custom_tools: CustomTools::default(),
            reasoning_summary: false,
        }
    }

    /// The meta echoing `request`: instructions, limits, sampling, tools
    /// and tool choice as the client sent them.
    pub fn for_request(request: &ResponsesRequest, created_at: u64) -> Self {
        let o = &request.options;
        let tool_choice = match &o.tool_choice {
            None => json!("auto"),
            Some(choice) => match choice.mode() {
                pb::ToolChoiceMode::None => json!("none"),
                pb::ToolChoiceMode::Required => json!("required"),
                pb::ToolChoiceMode::Named if request.custom_tools.contains(&choice.name) => {
                    json!({ "type": "custom", "name": choice.name })
                }
                pb::ToolChoiceMode::Named => json!({ "type": "function", "name": choice.name }),
                pb::ToolChoiceMode::Auto | pb::ToolChoiceMode::Unspecified => json!("auto"),
            },
        };
        let tools = request
            .tools
            .iter()
            .map(|t| {
                if request.custom_tools.contains(&t.name) {
                    return json!({ "type": "custom", "name": t.name, "description": t.description });
                }
                let parameters: Value = serde_json::from_str(&t.parameters_json).unwrap_or(Value::Null);
                json!({ "type": "function", "name": t.name, "description": t.description, "parameters": parameters })
            })
            .collect();
        Self {
            tool_choice,
            parallel_tool_calls: o.parallel_tool_calls.unwrap_or(true),
            temperature: o.temperature,
            top_p: o.top_p,
            tools,
            namespaces: request.namespaces.clone(),
            custom_tools: request.custom_tools.clone(),
            reasoning_summary: request.reasoning_summary,
            ..Self::new(request.model.clone(), created_at, request.instructions.clone(), o.max_tokens)
        }
    }
}

fn output_text_part(text: &str) -> Value {
    json!({ "type": "output_text", "text": text, "annotations": [] })
}

fn reasoning_text_part(text: &str) -> Value {
    json!({ "type": "reasoning_text", "text": text })
}

fn summary_text_part(text: &str) -> Value {
    json!({ "type": "summary_text", "text": text })
}

/// The ids Responses gives each block of the transcript, in order: an item
/// id (`msg_…` / `fc_…`) and, for a tool call, its `call_id` (the
/// provider's, or a made-up `call_…`).
#[derive(Debug, Default)]
struct ItemIds {
    ids: Vec<(String, String)>,
    /// Reasoning as a summary ([`ResponseMeta::reasoning_summary`]).
    summary: bool,
    /// Which function names came from namespace tools.
    namespaces: Namespaces,
    /// Which function names came from custom tools.
    custom_tools: CustomTools,
}

impl ItemIds {
    fn new(meta: &ResponseMeta) -> Self {
        let (namespaces, custom_tools) = (meta.namespaces.clone(), meta.custom_tools.clone());
        Self { ids: Vec::new(), summary: meta.reasoning_summary, namespaces, custom_tools }
    }

    /// Whether output item `i` is a call of a custom tool.
    fn is_custom(&self, transcript: &Transcript, i: usize) -> bool {
        matches!(&transcript.block(i).kind, BlockKind::ToolCall { name, .. } if self.custom_tools.contains(name))
    }

    fn of(&mut self, transcript: &Transcript, i: usize) -> (String, String) {
        while self.ids.len() <= i {
            let ids = match &transcript.block(self.ids.len()).kind {
                BlockKind::Text => (synthetic_id("msg_"), String::new()),
                BlockKind::Reasoning => (synthetic_id("rs_"), String::new()),
                BlockKind::ToolCall { id, name, .. } => {
                    let prefix = if self.custom_tools.contains(name) { "ctc_" } else { "fc_" };
                    (synthetic_id(prefix), if id.is_empty() { synthetic_call_id() } else { id.clone() })
                }
            };
            self.ids.push(ids);
        }
        self.ids[i].clone()
    }

    /// Output item `i` with `status`; `added` shows it as just opened.
    fn item(&mut self, transcript: &Transcript, i: usize, status: &str, added: bool) -> Value {
        let (id, call_id) = self.of(transcript, i);
        let block = transcript.block(i);
        match &block.kind {
            BlockKind::Text if added => {
                json!({ "type": "message", "id": id, "status": status, "role": "assistant", "content": [] })
            }
            BlockKind::Text => json!({
                "type": "message", "id": id, "status": status, "role": "assistant",
                "content": [output_text_part(&block.content)],
            }),
            // Asked for a summary: the provider's text as the one summary
            // part (IOP summarizes nothing). `encrypted_content` is left out
            // even when `include` asks for it: there is nothing to encrypt,
            // and a client hands no reasoning back that a provider would take.
            BlockKind::Reasoning if self.summary && added => json!({ "type": "reasoning", "id": id, "summary": [] }),
            BlockKind::Reasoning if self.summary => {
                json!({ "type": "reasoning", "id": id, "summary": [summary_text_part(&block.content)] })
            }
            // Otherwise the raw reasoning, as gpt-oss models answer on the
            // Responses API (no summary is made up).
            BlockKind::Reasoning if added => json!({ "type": "reasoning", "id": id, "summary": [], "content": [] }),
            BlockKind::Reasoning => json!({
                "type": "reasoning", "id": id, "summary": [],
                "content": [reasoning_text_part(&block.content)],
            }),
            BlockKind::ToolCall { name, .. } if self.custom_tools.contains(name) => json!({
                "type": "custom_tool_call", "id": id, "call_id": call_id, "name": name,
                "input": if added { String::new() } else { CustomTools::input(&block.content) }, "status": status,
            }),
            BlockKind::ToolCall { name, .. } => {
                let mut item = json!({
                    "type": "function_call", "id": id, "call_id": call_id, "name": name,
                    "arguments": if added { "" } else { block.content.as_str() }, "status": status,
                });
                if let Some((namespace, name)) = self.namespaces.split(name) {
                    item["name"] = json!(name);
                    item["namespace"] = json!(namespace);
                }
                item
            }
        }
    }

    /// Every item; the open one (if any) with `open_status`, the rest completed.
    fn output(&mut self, transcript: &Transcript, open_status: &str) -> Vec<Value> {
        (0..transcript.blocks().len())
            .map(|i| self.item(transcript, i, if transcript.is_open(i) { open_status } else { "completed" }, false))
            .collect()
    }

    /// Every item of a completed run; when the run stopped short (`cut`),
    /// the last item, the one being generated when it stopped, `incomplete`.
    fn completed_output(&mut self, transcript: &Transcript, cut: bool) -> Vec<Value> {
        let last = transcript.blocks().len().checked_sub(1);
        (0..transcript.blocks().len())
            .map(|i| self.item(transcript, i, if cut && Some(i) == last { "incomplete" } else { "completed" }, false))
            .collect()
    }
}

/// Streaming renderer: one instance per response.
#[derive(Debug)]
pub struct EventRenderer {
    meta: ResponseMeta,
    transcript: Transcript,
    ids: ItemIds,
    next_sequence_number: u64,
    begun: bool,
    /// Per open custom call (output index): its input streamed so far.
    custom_streamed: Vec<(usize, String)>,
}

impl EventRenderer {
    pub fn new(meta: ResponseMeta) -> Self {
        let ids = ItemIds::new(&meta);
        let custom_streamed = Vec::new();
        Self { meta, transcript: Transcript::default(), ids, next_sequence_number: 0, begun: false, custom_streamed }
    }

    /// Zero or more `(event type, JSON payload)` pairs for one run event; the
    /// caller writes `event: <type>\ndata: <payload>\n\n` for each. The first
    /// call (unless Cancelled) starts with `response.created` and
    /// `response.in_progress`. The stream ends after `response.completed`,
    /// `response.incomplete` or `response.failed` (there is no `[DONE]`);
    /// Cancelled renders nothing, and so does every event after a terminal.
    pub fn render(&mut self, event: &pb::run_event::Event) -> Vec<(&'static str, String)> {
        let mut events: Vec<(&'static str, Value)> = Vec::new();
        // A run that stops short closes the item it was generating as
        // `incomplete`, as OpenAI marks a message cut by `max_output_tokens`.
        let cut = matches!(event, pb::run_event::Event::Completed(c) if incomplete_reason(c.finish_reason).is_some());
        for step in self.transcript.push(event) {
            self.step_events(step, cut, &mut events);
        }
        events
            .into_iter()
            .map(|(kind, mut payload)| {
                payload["type"] = kind.into();
                payload["sequence_number"] = self.next_sequence_number.into();
                self.next_sequence_number += 1;
                (kind, payload.to_string())
            })
            .collect()
    }

    fn begin(&mut self, events: &mut Vec<(&'static str, Value)>) {
        if !self.begun {
            self.begun = true;
            let response = response_json(&self.meta, "in_progress", Vec::new(), Value::Null);
            events.push(("response.created", json!({ "response": response })));
            events.push(("response.in_progress", json!({ "response": response })));
        }
    }

    /// `cut`: this event ended a run that stopped short (the block it
    /// closes is `incomplete`).
    fn step_events(&mut self, step: Step<'_>, cut: bool, events: &mut Vec<(&'static str, Value)>) {
        let t = &self.transcript;
        let summary = self.ids.summary;
        match step {
            Step::Begin => self.begin(events),
            Step::Open(i) => {
                let item = self.ids.item(t, i, "in_progress", true);
                events.push(("response.output_item.added", json!({ "output_index": i, "item": item })));
                let (id, _) = self.ids.of(t, i);
                let part = match t.block(i).kind {
                    BlockKind::Text => Some(("response.content_part.added", "content_index", output_text_part(""))),
                    BlockKind::Reasoning if summary => {
                        Some(("response.reasoning_summary_part.added", "summary_index", summary_text_part("")))
                    }
                    BlockKind::Reasoning => {
                        Some(("response.content_part.added", "content_index", reasoning_text_part("")))
                    }
                    BlockKind::ToolCall { .. } => None,
                };
                if let Some((kind, index, part)) = part {
                    let mut payload = json!({ "item_id": id, "output_index": i, "part": part });
                    payload[index] = 0.into();
                    events.push((kind, payload));
                }
            }
            // A custom call's input is inside the JSON arguments the
            // provider streams: what of it is readable so far goes out as it
            // grows (a long patch from a slow model must not look idle).
            Step::Delta(i, _) if self.ids.is_custom(t, i) => {
                let Some(readable) = CustomTools::partial_input(&t.block(i).content) else { return };
                let at = match self.custom_streamed.iter().position(|(index, _)| *index == i) {
                    Some(at) => at,
                    None => {
                        self.custom_streamed.push((i, String::new()));
                        self.custom_streamed.len() - 1
                    }
                };
                let streamed = &mut self.custom_streamed[at].1;
                if let Some(delta) = readable.strip_prefix(streamed.as_str()).filter(|d| !d.is_empty()) {
                    let (id, _) = self.ids.of(t, i);
                    events.push((
                        "response.custom_tool_call_input.delta",
                        json!({ "item_id": id, "output_index": i, "delta": delta }),
                    ));
                    *streamed = readable;
                }
            }
            Step::Delta(i, delta) => {
                let (id, _) = self.ids.of(t, i);
                events.push(match t.block(i).kind {
                    BlockKind::Text => (
                        "response.output_text.delta",
                        json!({ "item_id": id, "output_index": i, "content_index": 0, "delta": delta, "logprobs": [] }),
                    ),
                    BlockKind::Reasoning if summary => (
                        "response.reasoning_summary_text.delta",
                        json!({ "item_id": id, "output_index": i, "summary_index": 0, "delta": delta }),
                    ),
                    BlockKind::Reasoning => (
                        "response.reasoning_text.delta",
                        json!({ "item_id": id, "output_index": i, "content_index": 0, "delta": delta }),
                    ),
                    BlockKind::ToolCall { .. } => (
                        "response.function_call_arguments.delta",
                        json!({ "item_id": id, "output_index": i, "delta": delta }),
                    ),
                });
            }
            Step::Close(i) => {
                let (id, _) = self.ids.of(t, i);
                let block = t.block(i);
                match block.kind {
                    BlockKind::Text => {
                        events.push((
                            "response.output_text.done",
                            json!({
                                "item_id": id, "output_index": i, "content_index": 0,
                                "text": block.content, "logprobs": [],
                            }),
                        ));
                        events.push((
                            "response.content_part.done",
                            json!({
                                "item_id": id, "output_index": i, "content_index": 0,
                                "part": output_text_part(&block.content),
                            }),
                        ));
                    }
                    BlockKind::Reasoning if summary => {
                        events.push((
                            "response.reasoning_summary_text.done",
                            json!({ "item_id": id, "output_index": i, "summary_index": 0, "text": block.content }),
                        ));
                        events.push((
                            "response.reasoning_summary_part.done",
                            json!({
                                "item_id": id, "output_index": i, "summary_index": 0,
                                "part": summary_text_part(&block.content),
                            }),
                        ));
                    }
                    BlockKind::Reasoning => {
                        events.push((
                            "response.reasoning_text.done",
                            json!({ "item_id": id, "output_index": i, "content_index": 0, "text": block.content }),
                        ));
                        events.push((
                            "response.content_part.done",
                            json!({
                                "item_id": id, "output_index": i, "content_index": 0,
                                "part": reasoning_text_part(&block.content),
                            }),
                        ));
                    }
                    BlockKind::ToolCall { .. } if self.ids.is_custom(t, i) => {
                        let input = CustomTools::input(&block.content);
                        let streamed = match self.custom_streamed.iter().position(|(index, _)| *index == i) {
                            Some(at) => self.custom_streamed.swap_remove(at).1,
                            None => String::new(),
                        };
                        // The rest; when what was streamed turns out not to
                        // start the input (arguments of another shape), the
                        // `.done` event's `input` is the one that counts.
                        if let Some(rest) = input.strip_prefix(streamed.as_str()).filter(|r| !r.is_empty()) {
                            events.push((
                                "response.custom_tool_call_input.delta",
                                json!({ "item_id": id, "output_index": i, "delta": rest }),
                            ));
                        }
                        events.push((
                            "response.custom_tool_call_input.done",
                            json!({ "item_id": id, "output_index": i, "input": input }),
                        ));
                    }
                    BlockKind::ToolCall { .. } => events.push((
                        "response.function_call_arguments.done",
                        json!({ "item_id": id, "output_index": i, "arguments": block.content }),
                    )),
                }
                let item = self.ids.item(t, i, if cut { "incomplete" } else { "completed" }, false);
                events.push(("response.output_item.done", json!({ "output_index": i, "item": item })));
            }
            Step::Complete { finish_reason } => {
                let response = completed_response(&self.meta, t, &mut self.ids, finish_reason);
                let kind =
                    if response["status"] == "incomplete" { "response.incomplete" } else { "response.completed" };
                events.push((kind, json!({ "response": response })));
            }
            Step::Fail(failure) => {
                self.begin(events);
                let response = failed_response(&self.meta, &self.transcript, &mut self.ids, &failure);
                events.push(("response.failed", json!({ "response": response })));
            }
            Step::Cancel => {}
        }
    }
}

/// Non-streaming: collects run events and produces the final response object
/// (the same object `response.completed` carries when streaming).
#[derive(Debug)]
pub struct ResponseAggregator {
    meta: ResponseMeta,
    transcript: Transcript,
}

impl ResponseAggregator {
    pub fn new(meta: ResponseMeta) -> Self {
        Self { meta, transcript: Transcript::default() }
    }

    /// Events after a terminal are ignored.
    pub fn push(&mut self, event: &pb::run_event::Event) {
        self.transcript.push(event);
    }

    /// `Ok(response object)` after a Completed terminal (status `completed`,
    /// or `incomplete` for a length / content-filter stop);
    /// `Err(ApiError::Execution(..))` after Failed (that failure), Cancelled,
    /// or no terminal at all.
    pub fn finish(mut self) -> Result<Value, ApiError> {
        let finish_reason = self.transcript.finish()?;
        Ok(completed_response(&self.meta, &self.transcript, &mut ItemIds::new(&self.meta), finish_reason))
    }
}

/// The response object, echoing what [`ResponseMeta`] keeps of the request.
fn response_json(meta: &ResponseMeta, status: &str, output: Vec<Value>, usage: Value) -> Value {
    json!({
        "id": meta.id,
        "object": "response",
        "created_at": meta.created_at,
        "status": status,
        "error": null,
        "incomplete_details": null,
        "instructions": meta.instructions,
        "max_output_tokens": meta.max_output_tokens,
        "model": meta.model,
        "output": output,
        "parallel_tool_calls": meta.parallel_tool_calls,
        "temperature": meta.temperature,
        "tool_choice": meta.tool_choice,
        "tools": meta.tools,
        "top_p": meta.top_p,
        "usage": usage,
    })
}

/// The final object after a Completed terminal: `incomplete` with a reason
/// when the provider stopped at the token limit or its content filter.
fn completed_response(meta: &ResponseMeta, transcript: &Transcript, ids: &mut ItemIds, finish_reason: i32) -> Value {
    let incomplete_reason = incomplete_reason(finish_reason);
    let status = if incomplete_reason.is_some() { "incomplete" } else { "completed" };
    let output = ids.completed_output(transcript, incomplete_reason.is_some());
    let mut response = response_json(meta, status, output, usage_json(transcript.usage()));
    if let Some(reason) = incomplete_reason {
        response["incomplete_details"] = json!({ "reason": reason });
    }
    response
}

/// Why a completed run is `incomplete`: the provider stopped at the token
/// limit or its content filter.
fn incomplete_reason(finish_reason: i32) -> Option<&'static str> {
    match pb::FinishReason::try_from(finish_reason) {
        Ok(pb::FinishReason::Length) => Some("max_output_tokens"),
        Ok(pb::FinishReason::ContentFilter) => Some("content_filter"),
        _ => None,
    }
}

/// The object `response.failed` carries: the items so far (the one being
/// generated as `incomplete`), usage if any was reported, and the error.
fn failed_response(
    meta: &ResponseMeta,
    transcript: &Transcript,
    ids: &mut ItemIds,
    failure: &pb::ExecutionFailure,
) -> Value {
    let usage = transcript.usage().map_or(Value::Null, |u| usage_json(Some(u)));
    let mut response = response_json(meta, "failed", ids.output(transcript, "incomplete"), usage);
    let error = ApiError::Execution(failure.clone());
    response["error"] = json!({ "code": error.client_code(), "message": error.message() });
    response
}

fn usage_json(usage: Option<&pb::Usage>) -> Value {
    let (input, output) = usage_pair(usage);
    json!({
        "input_tokens": input,
        "input_tokens_details": { "cached_tokens": 0 },
        "output_tokens": output,
        "output_tokens_details": { "reasoning_tokens": 0 },
        "total_tokens": u64::from(input) + u64::from(output),
    })
}

#[cfg(test)]
mod tests;
