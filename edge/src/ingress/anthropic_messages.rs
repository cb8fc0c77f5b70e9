//! Anthropic Messages API <-> IOP's normalized run shape.
//!
//! Pure translation, no I/O: [`parse_request`] turns a request body into
//! normalized messages, tools and options; [`EventRenderer`] (streaming) and
//! [`MessageAggregator`] (non-streaming) turn run events back into the exact
//! Anthropic wire format. Errors use [`ApiError::anthropic_body`].
//!
//! Anthropic's error object has no `param` field, so every validation message
//! starts with the field path in Anthropic's own style (`messages.0.content.1:
//! ...`); the same path is recorded as the [`ApiError::InvalidRequest`] param.

use iop_proto::pb;
use serde_json::{Map, Value, json};

use super::error::ApiError;
use super::hosted_tools::{self, DroppedTool};
use super::json::{Wording, body_object, field, text_message};
use super::openai_common::named_tool_choice;
use super::outcome::{synthetic_id, usage_pair};
use super::transcript::{BlockKind, CallIds, Step, Transcript, arguments_object};

/// Validation messages are worded the Anthropic way (path first).
const JSON: Wording = Wording::Anthropic;

// ---------------------------------------------------------------- request

/// A validated Messages request in normalized form.
#[derive(Debug, Clone, PartialEq)]
pub struct MessagesRequest {
    pub model: String,
    pub stream: bool,
    /// A leading SYSTEM message (from `system`), then the conversation. A user
    /// message carrying `tool_result` blocks becomes TOOL messages first, then
    /// a USER message with its text (if any).
    pub messages: Vec<pb::ChatMessage>,
    pub tools: Vec<pb::ToolDefinition>,
    pub options: pb::GenerationOptions,
    /// Server tools the request named (served without them, or refused, by
    /// the Edge's `api.hosted_tools`).
    pub dropped_tools: Vec<DroppedTool>,
    /// `thinking.display: "omitted"`: thinking blocks go out without their text.
    pub omit_thinking: bool,
}

/// Strict parse + validation. Every error is [`ApiError::InvalidRequest`]
/// whose message names the field (e.g. `messages.2.role: ...`) and whose
/// `param` is that field. Unknown top-level fields are ignored (SDKs and
/// clients send extras such as `metadata`, `thinking`, `service_tier`). An
/// explicit `null` counts as absent.
pub fn parse_request(body: &[u8]) -> Result<MessagesRequest, ApiError> {
    let obj = body_object(body)?;
    let model = JSON.non_empty_string(&obj, "model", "model")?.to_string();

    let mut messages = Vec::new();
    let mut references = Vec::new();
    if let Some(v) = field(&obj, "system") {
        let system = parse_text_content(v, "system")?;
        if !system.is_empty() {
            messages.push(text_message(pb::Role::System, system));
        }
    }
    match field(&obj, "messages") {
        None => return Err(JSON.missing("messages")),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid_param("messages", "messages: at least one message is required"));
        }
        Some(Value::Array(items)) => {
            for (i, m) in items.iter().enumerate() {
                parse_message(m, i, &mut messages, &mut references)?;
            }
        }
        Some(_) => return Err(JSON.type_error("messages", "an array")),
    }

    let mut tools = Vec::new();
    let mut dropped_tools = Vec::new();
    match field(&obj, "tools") {
        None => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let path = format!("tools.{i}");
                let ty = item.get("type").and_then(Value::as_str).unwrap_or_default();
                if let Some(kind) = hosted_tools::anthropic_kind(ty) {
                    dropped_tools.push(DroppedTool { path, kind });
                    continue;
                }
                let (tool, deferred) = parse_tool(item, &path)?;
                // A deferred tool (`defer_loading`, Claude Code's tool search)
                // is offered only once a `tool_reference` loaded it.
                if !deferred || references.contains(&tool.name) {
                    tools.push(tool);
                }
            }
        }
        Some(_) => return Err(JSON.type_error("tools", "an array")),
    }

    let stream = JSON.optional_bool(&obj, "stream", "stream")?.unwrap_or(false);
    let (mut options, omit_thinking) = parse_options(&obj)?;
    match field(&obj, "tool_choice") {
        None => {}
        Some(Value::Object(choice)) => {
            let mode = |mode: pb::ToolChoiceMode| pb::ToolChoice { mode: mode.into(), name: String::new() };
            options.tool_choice = Some(match JSON.non_empty_string(choice, "type", "tool_choice.type")? {
                "auto" => mode(pb::ToolChoiceMode::Auto),
                "any" => mode(pb::ToolChoiceMode::Required),
                "none" => mode(pb::ToolChoiceMode::None),
                "tool" => {
                    let name = JSON.non_empty_string(choice, "name", "tool_choice.name")?;
                    named_tool_choice(name, &tools, "tool_choice.name")?
                }
                other => {
                    let message = format!("tool_choice.type: unknown type `{other}`; expected auto, any, tool or none");
                    return Err(ApiError::invalid_param("tool_choice.type", message));
                }
            });
            let single = "tool_choice.disable_parallel_tool_use";
            if JSON.optional_bool(choice, "disable_parallel_tool_use", single)? == Some(true) {
                options.parallel_tool_calls = Some(false);
            }
        }
        Some(_) => return Err(JSON.type_error("tool_choice", "an object")),
    }

    parse_output_config(&obj, &mut options)?;

    Ok(MessagesRequest { model, stream, messages, tools, options, dropped_tools, omit_thinking })
}

/// `output_config: {"format"?: {"type": "json_schema", "schema": {...}},
/// "effort"?: "low" | "medium" | "high" | "xhigh" | "max", ...}` (structured
/// outputs, `messages.parse`; Claude Code sends `effort` on every request),
/// and the structured-outputs beta's top-level `output_format` (the same
/// object as `format`; older SDKs' `beta.messages.parse` send it).
///
/// The schema becomes the run's JSON-schema response format, as Chat's
/// `response_format` and Responses' `text.format` do: Ollama's `format`,
/// an OpenAI-compatible server's `response_format` (name `response`,
/// `strict`, since Anthropic always constrains the answer to the schema).
///
/// `effort` sets the reasoning effort only with `thinking: {"type":
/// "adaptive"}`, where Anthropic lets it steer how much the model thinks
/// (`low`, `medium`, `high`; `xhigh` and `max` as `high`). Without
/// thinking there is nothing for a provider to steer, and with
/// `thinking.budget_tokens` the budget already chose the effort, so there
/// it is accepted and not used. Other `output_config` fields (`task_budget`)
/// are accepted and not used.
fn parse_output_config(obj: &Map<String, Value>, options: &mut pb::GenerationOptions) -> Result<(), ApiError> {
    let (config, format) = match field(obj, "output_config") {
        None => (None, None),
        Some(Value::Object(config)) => (Some(config), field(config, "format").map(|f| (f, "output_config.format"))),
        Some(_) => return Err(JSON.type_error("output_config", "an object")),
    };
    let format = match (format, field(obj, "output_format")) {
        (Some(_), Some(_)) => {
            let message = "output_format: send either `output_config.format` or the older `output_format`, not both";
            return Err(ApiError::invalid_param("output_format", message));
        }
        (Some(format), None) => Some(format),
        (None, legacy) => legacy.map(|f| (f, "output_format")),
    };
    if let Some((format, path)) = format {
        let Value::Object(format) = format else {
            return Err(JSON.type_error(path, "an object"));
        };
        let type_path = format!("{path}.type");
        match JSON.non_empty_string(format, "type", &type_path)? {
            "json_schema" => {
                let schema_path = format!("{path}.schema");
                let schema = match JSON.required(format, "schema", &schema_path)? {
                    schema @ Value::Object(_) => schema.to_string(),
                    _ => return Err(JSON.type_error(&schema_path, "an object")),
                };
                options.response_format = Some(pb::ResponseFormat {
                    kind: pb::ResponseFormatKind::JsonSchema.into(),
                    schema_json: schema,
                    name: String::new(),
                    strict: true,
                });
            }
            other => {
                let message = format!("{type_path}: unknown type `{other}`; expected json_schema");
                return Err(ApiError::invalid_param(&type_path, message));
            }
        }
    }
    if let Some(effort) = config.and_then(|c| field(c, "effort")) {
        let path = "output_config.effort";
        let effort = match JSON.string(effort, path)? {
            "low" => pb::ReasoningEffort::Low,
            "medium" => pb::ReasoningEffort::Medium,
            "high" | "xhigh" | "max" => pb::ReasoningEffort::High,
            other => {
                let message = format!("{path}: unknown effort `{other}`; expected low, medium, high, xhigh or max");
                return Err(ApiError::invalid_param(path, message));
            }
        };
        // Steers adaptive thinking only (parsed before this).
        if options.reasoning_effort == Some(pb::ReasoningEffort::Adaptive.into()) {
            options.reasoning_effort = Some(effort.into());
        }
    }
    Ok(())
}

/// A `count_tokens` request: a Messages request without `max_tokens` (and
/// without `stream`); the same strict parse otherwise.
pub fn parse_count_tokens_request(body: &[u8]) -> Result<MessagesRequest, ApiError> {
    let mut obj = body_object(body)?;
    obj.entry("max_tokens").or_insert(Value::from(1));
    obj.remove("stream");
    parse_request(Value::Object(obj).to_string().as_bytes())
}

/// The prompt tokens a completed count run reported, if it completed.
pub fn counted_tokens(events: &[pb::run_event::Event]) -> Option<u64> {
    use pb::run_event::Event;
    let completed = events.iter().any(|e| matches!(e, Event::Completed(_)));
    let usage = events.iter().find_map(|e| match e {
        Event::Usage(u) => Some(u64::from(u.prompt_tokens)),
        _ => None,
    });
    usage.filter(|_| completed)
}

/// Appends the normalized message(s) for `messages[i]` to `out`; the tools a
/// `tool_reference` names join `references`.
fn parse_message(
    value: &Value,
    i: usize,
    out: &mut Vec<pb::ChatMessage>,
    references: &mut Vec<String>,
) -> Result<(), ApiError> {
    let path = format!("messages.{i}");
    let Value::Object(obj) = value else {
        return Err(JSON.type_error(&path, "an object"));
    };

    let role_path = format!("{path}.role");
    let content_path = format!("{path}.content");
    let role = match JSON.string(JSON.required(obj, "role", &role_path)?, &role_path)? {
        "user" => pb::Role::User,
        "assistant" => pb::Role::Assistant,
        // A system turn inside the conversation (Claude Code's environment
        // note, beta `mid-conversation-system`): kept in place; adapters whose
        // servers take one leading system text only join it there.
        "system" => {
            let text = parse_text_content(JSON.required(obj, "content", &content_path)?, &content_path)?;
            out.push(text_message(pb::Role::System, text));
            return Ok(());
        }
        other => {
            return Err(ApiError::invalid_param(
                &role_path,
                format!("{role_path}: Input should be 'user', 'assistant' or 'system' (got `{other}`)"),
            ));
        }
    };

    let blocks = match JSON.required(obj, "content", &content_path)? {
        Value::String(s) => {
            out.push(text_message(role, s.clone()));
            return Ok(());
        }
        Value::Array(blocks) if blocks.is_empty() => {
            return Err(ApiError::invalid_param(&content_path, format!("{content_path}: must not be an empty array")));
        }
        Value::Array(blocks) => blocks,
        _ => return Err(JSON.type_error(&content_path, "a string or an array of content blocks")),
    };

    let mut texts: Vec<&str> = Vec::new();
    let mut tool_calls = Vec::new();
    let mut tool_results = Vec::new();
    let mut images = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let block_path = format!("{content_path}.{j}");
        let Value::Object(b) = block else {
            return Err(JSON.type_error(&block_path, "an object"));
        };
        let type_path = format!("{block_path}.type");
        // `cache_control` and `citations` on any block are accepted and ignored.
        match JSON.string(JSON.required(b, "type", &type_path)?, &type_path)? {
            "text" => texts.push(text_of(b, &block_path)?),
            "tool_use" if role == pb::Role::Assistant => tool_calls.push(parse_tool_use(b, &block_path)?),
            // A client hands back the reasoning of earlier turns (Claude
            // Code does); no provider takes it back, so it is dropped.
            "thinking" | "redacted_thinking" if role == pb::Role::Assistant => {}
            "tool_result" if role == pb::Role::User => {
                tool_results.push(parse_tool_result(b, &block_path, references, &mut images)?);
            }
            "image" if role == pb::Role::User => images.push(parse_image(b, &block_path)?),
            ty @ "tool_use" => return Err(block_not_allowed(&type_path, &block_path, ty, "assistant")),
            ty @ "tool_result" => return Err(block_not_allowed(&type_path, &block_path, ty, "user")),
            other => return Err(unsupported_block(&type_path, &block_path, other)),
        }
    }

    match role {
        pb::Role::Assistant => {
            out.push(pb::ChatMessage { tool_calls, ..text_message(role, texts.join("\n")) });
        }
        _ => {
            // Tool results answer the previous assistant turn, so they come
            // first (Anthropic also requires them before any text).
            out.extend(tool_results);
            if !texts.is_empty() || !images.is_empty() {
                out.push(pb::ChatMessage { images, ..text_message(role, texts.join("\n")) });
            }
        }
    }
    Ok(())
}

/// `{"type":"image","source":{"type":"base64","media_type","data"} |
/// {"type":"url","url"}}`.
fn parse_image(obj: &Map<String, Value>, path: &str) -> Result<pb::Image, ApiError> {
    let source_path = format!("{path}.source");
    let Value::Object(source) = JSON.required(obj, "source", &source_path)? else {
        return Err(JSON.type_error(&source_path, "an object"));
    };
    let type_path = format!("{source_path}.type");
    match JSON.non_empty_string(source, "type", &type_path)? {
        "base64" => {
            let media_type = JSON.non_empty_string(source, "media_type", &format!("{source_path}.media_type"))?;
            let data_path = format!("{source_path}.data");
            super::images::from_base64(media_type, JSON.non_empty_string(source, "data", &data_path)?, &data_path)
        }
        "url" => {
            let url_path = format!("{source_path}.url");
            super::images::from_url(JSON.non_empty_string(source, "url", &url_path)?, &url_path)
        }
        other => Err(ApiError::invalid_param(
            &type_path,
            format!("{type_path}: image source type `{other}` is not supported (base64 or url)"),
        )),
    }
}

/// `{"type":"tool_use","id","name","input":{...}}` -> a tool call whose
/// arguments are `input` as JSON text.
fn parse_tool_use(obj: &Map<String, Value>, path: &str) -> Result<pb::ToolCall, ApiError> {
    let id = JSON.non_empty_string(obj, "id", &format!("{path}.id"))?.to_string();
    let name = JSON.non_empty_string(obj, "name", &format!("{path}.name"))?.to_string();
    let input_path = format!("{path}.input");
    let arguments_json = match JSON.required(obj, "input", &input_path)? {
        v @ Value::Object(_) => v.to_string(),
        _ => return Err(JSON.type_error(&input_path, "an object")),
    };
    Ok(pb::ToolCall { id, name, arguments_json })
}

/// `{"type":"tool_result","tool_use_id","content"?: string | [text, image
/// or tool_reference blocks], "is_error"?}` -> a TOOL message. A
/// `tool_reference` (`{"type":"tool_reference","tool_name"}`, what a tool
/// search answers) loads that deferred tool for this request and reads as a
/// line saying so. Images (Claude Code's Read of an image file) join
/// `images`, the turn's user message after its tool results: the tool role
/// carries text only at OpenAI-compatible servers.
fn parse_tool_result(
    obj: &Map<String, Value>,
    path: &str,
    references: &mut Vec<String>,
    images: &mut Vec<pb::Image>,
) -> Result<pb::ChatMessage, ApiError> {
    let tool_call_id = JSON.non_empty_string(obj, "tool_use_id", &format!("{path}.tool_use_id"))?.to_string();
    let content_path = format!("{path}.content");
    let content = match field(obj, "content") {
        None => String::new(),
        Some(Value::Array(blocks)) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (j, block) in blocks.iter().enumerate() {
                let block_path = format!("{content_path}.{j}");
                match block {
                    Value::Object(b) if b.get("type").and_then(Value::as_str) == Some("tool_reference") => {
                        let name = JSON.non_empty_string(b, "tool_name", &format!("{block_path}.tool_name"))?;
                        texts.push(format!("Tool `{name}` is now available."));
                        references.push(name.to_string());
                    }
                    Value::Object(b) if b.get("type").and_then(Value::as_str) == Some("image") => {
                        images.push(parse_image(b, &block_path)?);
                    }
                    _ => texts.push(text_block(block, &block_path)?.to_string()),
                }
            }
            texts.join("\n")
        }
        Some(v) => parse_text_content(v, &content_path)?,
    };
    let is_error = JSON.optional_bool(obj, "is_error", &format!("{path}.is_error"))?.unwrap_or(false);
    let content = if is_error { format!("Error: {content}") } else { content };
    Ok(pb::ChatMessage { tool_call_id, ..text_message(pb::Role::Tool, content) })
}

/// A string, or an array of text blocks joined with "\n" (`system` and
/// `tool_result` content).
fn parse_text_content(value: &Value, path: &str) -> Result<String, ApiError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let texts = blocks
                .iter()
                .enumerate()
                .map(|(j, block)| text_block(block, &format!("{path}.{j}")))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(texts.join("\n"))
        }
        _ => Err(JSON.type_error(path, "a string or an array of text blocks")),
    }
}

/// The text of a `{"type":"text","text"}` block; any other block is refused.
fn text_block<'a>(block: &'a Value, block_path: &str) -> Result<&'a str, ApiError> {
    let Value::Object(b) = block else {
        return Err(JSON.type_error(block_path, "an object"));
    };
    let type_path = format!("{block_path}.type");
    match JSON.string(JSON.required(b, "type", &type_path)?, &type_path)? {
        "text" => text_of(b, block_path),
        other => Err(unsupported_block(&type_path, block_path, other)),
    }
}

fn text_of<'a>(block: &'a Map<String, Value>, block_path: &str) -> Result<&'a str, ApiError> {
    let text_path = format!("{block_path}.text");
    JSON.string(JSON.required(block, "text", &text_path)?, &text_path)
}

fn unsupported_block(type_path: &str, block_path: &str, ty: &str) -> ApiError {
    ApiError::invalid_param(type_path, format!("{block_path}: content block type `{ty}` is not supported"))
}

fn block_not_allowed(type_path: &str, block_path: &str, ty: &str, role: &str) -> ApiError {
    ApiError::invalid_param(type_path, format!("{block_path}: `{ty}` blocks are only allowed in {role} messages"))
}

/// `{"name","description"?,"input_schema":{...},"type"?:"custom",
/// "defer_loading"?}` and whether it is deferred. Anthropic-defined tools
/// without a schema (`bash_20250124`, `text_editor_*`, ...) cannot be offered
/// to a local model; server tools never reach here (see [`hosted_tools`]).
fn parse_tool(value: &Value, path: &str) -> Result<(pb::ToolDefinition, bool), ApiError> {
    let Value::Object(obj) = value else {
        return Err(JSON.type_error(path, "an object"));
    };
    if let Some(v) = field(obj, "type") {
        let type_path = format!("{path}.type");
        let ty = JSON.string(v, &type_path)?;
        if ty != "custom" {
            return Err(ApiError::invalid_param(
                &type_path,
                format!("{path}: tool type `{ty}` is not supported; only custom tools (with `input_schema`) are"),
            ));
        }
    }
    let name = JSON.non_empty_string(obj, "name", &format!("{path}.name"))?.to_string();
    let description = match field(obj, "description") {
        None => String::new(),
        Some(v) => JSON.string(v, &format!("{path}.description"))?.to_string(),
    };
    let schema_path = format!("{path}.input_schema");
    let parameters_json = match JSON.required(obj, "input_schema", &schema_path)? {
        v @ Value::Object(_) => v.to_string(),
        _ => return Err(JSON.type_error(&schema_path, "an object")),
    };
    let deferred = JSON.optional_bool(obj, "defer_loading", &format!("{path}.defer_loading"))?.unwrap_or(false);
    Ok((pb::ToolDefinition { name, description, parameters_json }, deferred))
}

/// The generation options, and whether thinking text is to be omitted.
fn parse_options(obj: &Map<String, Value>) -> Result<(pb::GenerationOptions, bool), ApiError> {
    let mut options = pb::GenerationOptions {
        // Required by the Messages API (unlike Chat Completions).
        max_tokens: Some(JSON.positive_u32(JSON.required(obj, "max_tokens", "max_tokens")?, "max_tokens")?),
        ..Default::default()
    };
    if let Some(v) = field(obj, "temperature") {
        options.temperature = Some(JSON.number_in(v, "temperature", 0.0, 1.0)?);
    }
    if let Some(v) = field(obj, "top_p") {
        options.top_p = Some(JSON.number_in(v, "top_p", 0.0, 1.0)?);
    }
    if let Some(v) = field(obj, "top_k") {
        options.top_k = Some(JSON.positive_u32(v, "top_k")?);
    }
    // Extended thinking: on with a token budget (mapped to an effort), on
    // with the depth left to the provider (`adaptive`), or off.
    let mut omit_thinking = false;
    match field(obj, "thinking") {
        None => {}
        Some(Value::Object(thinking)) => {
            omit_thinking = match field(thinking, "display") {
                None => false,
                Some(v) => match JSON.string(v, "thinking.display")? {
                    "summarized" => false,
                    "omitted" => true,
                    other => {
                        let message =
                            format!("thinking.display: unknown value `{other}`; expected summarized or omitted");
                        return Err(ApiError::invalid_param("thinking.display", message));
                    }
                },
            };
            let effort = match JSON.non_empty_string(thinking, "type", "thinking.type")? {
                "disabled" => pb::ReasoningEffort::None,
                "adaptive" => pb::ReasoningEffort::Adaptive,
                "enabled" => {
                    let budget = JSON.required(thinking, "budget_tokens", "thinking.budget_tokens")?;
                    match JSON.positive_u32(budget, "thinking.budget_tokens")? {
                        ..4_096 => pb::ReasoningEffort::Low,
                        4_096..16_384 => pb::ReasoningEffort::Medium,
                        _ => pb::ReasoningEffort::High,
                    }
                }
                other => {
                    let message =
                        format!("thinking.type: unknown type `{other}`; expected enabled, adaptive or disabled");
                    return Err(ApiError::invalid_param("thinking.type", message));
                }
            };
            options.reasoning_effort = Some(effort.into());
        }
        Some(_) => return Err(JSON.type_error("thinking", "an object")),
    }
    options.stop = match field(obj, "stop_sequences") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, s)| JSON.string(s, &format!("stop_sequences.{i}")).map(str::to_string))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(JSON.type_error("stop_sequences", "an array of strings")),
    };
    Ok((options, omit_thinking))
}

// ---------------------------------------------------------------- response

/// The identity a response carries (in `message_start`, or the one message object).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseMeta {
    pub id: String,
    /// The model name the client asked for.
    pub model: String,
    /// `thinking.display: "omitted"`: thinking blocks are sent empty.
    pub omit_thinking: bool,
}

impl ResponseMeta {
    /// `id` is `msg_` followed by 32 hex digits (a v4 UUID, simple form).
    pub fn new(model: String) -> Self {
        Self { id: synthetic_id("msg_"), model, omit_thinking: false }
    }
}

/// Streaming renderer: one instance per response.
#[derive(Debug)]
pub struct EventRenderer {
    meta: ResponseMeta,
    transcript: Transcript,
    ids: CallIds,
    /// The answer began and `message_start` is not out yet: it waits for the
    /// first step that shows anything, so it carries the input tokens the
    /// node reported before that.
    start_pending: bool,
}

impl EventRenderer {
    pub fn new(meta: ResponseMeta) -> Self {
        Self { meta, transcript: Transcript::default(), ids: CallIds::default(), start_pending: false }
    }

    /// `message_start`. Its `usage.input_tokens` is the prompt count the
    /// node reported before the first content (0 if none: Ollama and
    /// OpenAI-compatible servers report usage with their last chunk, so the
    /// count normally arrives in `message_delta`, as Anthropic's does too).
    fn message_start(&self) -> (&'static str, String) {
        let input_tokens = self.transcript.usage().map_or(0, |u| u.prompt_tokens);
        let message = json!({
            "id": self.meta.id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.meta.model,
            "stop_reason": null,
            "stop_sequence": null,
            "usage": { "input_tokens": input_tokens, "output_tokens": 0 },
        });
        ("message_start", json!({ "type": "message_start", "message": message }).to_string())
    }

    /// Zero or more complete SSE events `(event name, JSON data)` for one run
    /// event; the caller writes `event: <name>\ndata: <json>\n\n`. Events after
    /// a terminal render nothing. Content block indexes are the transcript's
    /// block positions.
    pub fn render(&mut self, event: &pb::run_event::Event) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let steps = self.transcript.push(event);
        for step in steps {
            match step {
                // Held until something shows (see `start_pending`).
                Step::Begin => {
                    self.start_pending = true;
                    continue;
                }
                Step::Cancel => {
                    self.start_pending = false;
                    continue;
                }
                _ if self.start_pending => {
                    self.start_pending = false;
                    out.push(self.message_start());
                }
                _ => {}
            }
            let t = &self.transcript;
            let event = match step {
                Step::Begin | Step::Cancel => continue,
                Step::Open(i) => {
                    let block = match &t.block(i).kind {
                        BlockKind::Text => json!({ "type": "text", "text": "" }),
                        // No provider signs its reasoning; the field is there
                        // (empty) so clients that require it parse the block.
                        BlockKind::Reasoning => json!({ "type": "thinking", "thinking": "", "signature": "" }),
                        BlockKind::ToolCall { name, .. } => {
                            json!({ "type": "tool_use", "id": self.ids.of(t, i, synthetic_tool_use_id), "name": name, "input": {} })
                        }
                    };
                    (
                        "content_block_start",
                        json!({ "type": "content_block_start", "index": i, "content_block": block }),
                    )
                }
                Step::Delta(i, text) => {
                    let delta = match t.block(i).kind {
                        BlockKind::Text => json!({ "type": "text_delta", "text": text }),
                        BlockKind::Reasoning if self.meta.omit_thinking => continue,
                        BlockKind::Reasoning => json!({ "type": "thinking_delta", "thinking": text }),
                        BlockKind::ToolCall { .. } => json!({ "type": "input_json_delta", "partial_json": text }),
                    };
                    ("content_block_delta", json!({ "type": "content_block_delta", "index": i, "delta": delta }))
                }
                Step::Close(i) => ("content_block_stop", json!({ "type": "content_block_stop", "index": i })),
                Step::Complete { finish_reason } => {
                    let (input_tokens, output_tokens) = usage_pair(t.usage());
                    out.push((
                        "message_delta",
                        json!({
                            "type": "message_delta",
                            "delta": {
                                "stop_reason": stop_reason_str(finish_reason, t.has_tool_calls()),
                                "stop_sequence": null,
                            },
                            "usage": { "input_tokens": input_tokens, "output_tokens": output_tokens },
                        })
                        .to_string(),
                    ));
                    ("message_stop", json!({ "type": "message_stop" }))
                }
                Step::Fail(failure) => {
                    out.push(stream_error_event(&failure));
                    continue;
                }
            };
            out.push((event.0, event.1.to_string()));
        }
        out
    }

    /// The keep-alive event Anthropic sends while a response is in progress.
    pub fn ping() -> (&'static str, String) {
        ("ping", json!({ "type": "ping" }).to_string())
    }
}

/// Non-streaming: collects run events and produces the final `message` JSON.
#[derive(Debug)]
pub struct MessageAggregator {
    meta: ResponseMeta,
    transcript: Transcript,
}

impl MessageAggregator {
    pub fn new(meta: ResponseMeta) -> Self {
        Self { meta, transcript: Transcript::default() }
    }

    /// Events after a terminal are ignored.
    pub fn push(&mut self, event: &pb::run_event::Event) {
        self.transcript.push(event);
    }

    /// `Ok(body)` after a Completed terminal; `Err(ApiError::Execution(..))`
    /// after Failed (that failure, a tool call's arguments that are not a
    /// JSON object included), Cancelled, or no terminal at all.
    pub fn finish(mut self) -> Result<Value, ApiError> {
        let finish_reason = self.transcript.finish()?;
        let t = &self.transcript;
        let mut ids = CallIds::default();
        let content: Vec<Value> = (0..t.blocks().len())
            .map(|i| match &t.block(i).kind {
                BlockKind::Text => json!({ "type": "text", "text": t.block(i).content }),
                BlockKind::Reasoning => {
                    let thinking = if self.meta.omit_thinking { "" } else { t.block(i).content.as_str() };
                    json!({ "type": "thinking", "thinking": thinking, "signature": "" })
                }
                BlockKind::ToolCall { name, .. } => json!({
                    "type": "tool_use", "id": ids.of(t, i, synthetic_tool_use_id), "name": name, "input": arguments_object(&t.block(i).content),
                }),
            })
            .collect();
        let (input_tokens, output_tokens) = usage_pair(t.usage());
        Ok(json!({
            "id": self.meta.id,
            "type": "message",
            "role": "assistant",
            "model": self.meta.model,
            "content": content,
            "stop_reason": stop_reason_str(finish_reason, t.has_tool_calls()),
            "stop_sequence": null,
            "usage": { "input_tokens": input_tokens, "output_tokens": output_tokens },
        }))
    }
}

/// SSE event for a failure after streaming already started (Anthropic sends
/// `event: error` with the same body as an HTTP error).
pub fn stream_error_event(failure: &pb::ExecutionFailure) -> (&'static str, String) {
    ("error", ApiError::Execution(failure.clone()).anthropic_body().to_string())
}

/// Anthropic's stop_reason. Stop sequences cannot be told apart from a natural
/// stop (the run only reports Stop), so `stop_sequence` is never produced. A
/// plain stop after tool calls is `tool_use`: some providers (e.g. Ollama)
/// report "stop" there, and Anthropic clients loop on `stop_reason == "tool_use"`.
fn stop_reason_str(value: i32, has_tool_use: bool) -> &'static str {
    match pb::FinishReason::try_from(value) {
        Ok(pb::FinishReason::Length) => "max_tokens",
        Ok(pb::FinishReason::ToolCalls) => "tool_use",
        Ok(pb::FinishReason::ContentFilter) => "refusal",
        _ if has_tool_use => "tool_use",
        _ => "end_turn",
    }
}

/// For a provider that streamed a tool call without an id (the proto says the
/// first delta carries one; this keeps the response valid if it did not).
fn synthetic_tool_use_id() -> String {
    let hex = crate::ids::new_uuid().simple().to_string();
    format!("toolu_{}", &hex[..24])
}

#[cfg(test)]
mod tests {
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
        let budget =
            json!({"thinking": {"type": "enabled", "budget_tokens": 2048}, "output_config": {"effort": "high"}});
        assert_eq!(effort_of(budget), Some(pb::ReasoningEffort::Low));
        let off = json!({"thinking": {"type": "disabled"}, "output_config": {"effort": "high"}});
        assert_eq!(effort_of(off), Some(pb::ReasoningEffort::None));
        assert_eq!(effort_of(json!({"output_config": {"effort": "high"}})), None);
    }

    // ------------------------------------------------------------ parse

    #[test]
    fn minimal_request_parses_with_defaults() {
        let req =
            parse(json!({"model": "claude", "max_tokens": 1024, "messages": [{"role": "user", "content": "hi"}]}))
                .unwrap();
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
        let recorded: Value = serde_json::from_str(include_str!("fixtures/claude-code-2.1.332.json")).unwrap();
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
        let before = parse(
            json!({"model": "m", "max_tokens": 8, "tools": tools, "messages": [{"role": "user", "content": "x"}]}),
        )
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
        let req =
            parse(json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "tools": [
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
                "thinking.display: unknown value `full`; expected summarized or omitted",
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
                msgs(json!([{"role": "user", "content": [{"type": "document", "source": {}}]}])),
                "messages.0.content.0.type",
                "messages.0.content.0: content block type `document` is not supported",
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
                    "content": [{"type": "document", "source": {}}]}]}])),
                "messages.0.content.0.content.0.type",
                "messages.0.content.0.content.0: content block type `document` is not supported",
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
            (
                with(json!({"stop_sequences": ["a", 1]})),
                "stop_sequences.1",
                "stop_sequences.1: Input should be a string",
            ),
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
        let events = render_all(
            &mut r,
            &[started(), text("par"), Event::Failed(pb::RunFailed { failure: Some(failure.clone()) })],
        );
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
}
