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

use super::documents::{self, DocumentError};
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
            documents::within_bound(&obj, "messages")?;
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

    let mut texts: Vec<std::borrow::Cow<'_, str>> = Vec::new();
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
            "text" => texts.push(text_of(b, &block_path)?.into()),
            "document" if role == pb::Role::User => texts.push(parse_document(b, &block_path)?.into()),
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

/// `{"type":"document","source":{...},"title"?,"context"?,"citations"?}`
/// -> the text a local model reads (see [`documents`]). Sources: `base64`
/// (a PDF, or a text media type), `text` (`data`) and `content` (a string
/// or text blocks); a document by `url` or `file` id is refused (the Edge
/// fetches nothing for a client).
fn parse_document(obj: &Map<String, Value>, path: &str) -> Result<String, ApiError> {
    let source_path = format!("{path}.source");
    let Value::Object(source) = JSON.required(obj, "source", &source_path)? else {
        return Err(JSON.type_error(&source_path, "an object"));
    };
    let title = match field(obj, "title") {
        None => None,
        Some(v) => Some(JSON.string(v, &format!("{path}.title"))?),
    };
    let data_path = format!("{source_path}.data");
    match JSON.non_empty_string(source, "type", &format!("{source_path}.type"))? {
        "base64" => {
            let media_type = JSON.non_empty_string(source, "media_type", &format!("{source_path}.media_type"))?;
            documents::from_base64(media_type, JSON.non_empty_string(source, "data", &data_path)?, title, path)
        }
        "text" => {
            documents::from_text(JSON.string(JSON.required(source, "data", &data_path)?, &data_path)?, title, path)
        }
        "content" => {
            let content_path = format!("{source_path}.content");
            let text = parse_text_content(JSON.required(source, "content", &content_path)?, &content_path)?;
            documents::from_text(&text, title, path)
        }
        other => Err(DocumentError::Source(other.to_string()).at(path)),
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

/// `{"type":"tool_result","tool_use_id","content"?: string | [text, image,
/// document or tool_reference blocks], "is_error"?}` -> a TOOL message. A
/// `tool_reference` (`{"type":"tool_reference","tool_name"}`, what a tool
/// search answers) loads that deferred tool for this request and reads as a
/// line saying so. Images (Claude Code's Read of an image file) join
/// `images`, the turn's user message after its tool results: the tool role
/// carries text only at OpenAI-compatible servers. Documents (Claude Code's
/// Read of a PDF) read as their text, in place.
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
                    // Claude Code's Read of a PDF.
                    Value::Object(b) if b.get("type").and_then(Value::as_str) == Some("document") => {
                        texts.push(parse_document(b, &block_path)?);
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

/// `thinking.display`: every value the Messages API documents (an unknown one
/// is a 400 naming them, so a typo does not silently change what comes back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkingDisplay {
    /// Thinking text comes back (summarized by Anthropic's own models).
    Summarized,
    /// Thinking blocks come back empty.
    Omitted,
    /// Only the short progress notes between tool calls come back (Claude
    /// Code's `stream-json`, beta `thinking-display-updates-2026-08-18`).
    Updates,
}

impl ThinkingDisplay {
    const VALUES: &str = "summarized, omitted or updates";

    fn parse(value: &str) -> Result<Self, ApiError> {
        match value {
            "summarized" => Ok(Self::Summarized),
            "omitted" => Ok(Self::Omitted),
            "updates" => Ok(Self::Updates),
            other => {
                let message = format!("thinking.display: unknown value `{other}`; expected {}", Self::VALUES);
                Err(ApiError::invalid_param("thinking.display", message))
            }
        }
    }

    /// Whether thinking blocks go out without their text. A local model's
    /// reasoning is neither summarized nor split into progress notes, so
    /// `summarized` and `updates` both stream it as it comes.
    pub fn omits_thinking(self) -> bool {
        match self {
            Self::Summarized | Self::Updates => false,
            Self::Omitted => true,
        }
    }
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
                Some(v) => ThinkingDisplay::parse(JSON.string(v, "thinking.display")?)?.omits_thinking(),
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
mod tests;
