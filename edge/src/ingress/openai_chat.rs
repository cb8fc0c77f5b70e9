//! OpenAI Chat Completions <-> IOP's normalized run shape.
//!
//! Pure translation, no I/O: [`parse_request`] turns a request body into
//! normalized messages, tools and options; [`ChunkRenderer`] (streaming) and
//! [`CompletionAggregator`] (non-streaming) turn run events back into the
//! exact OpenAI wire format.

use iop_proto::pb;
use serde_json::{Map, Value, json};

use super::error::ApiError;
use super::json::{Wording, body_object, field};
use super::openai_common::{
    ImagePart, expect_function_type, function_call, function_definition, penalties, reasoning_effort,
    refuse_unsupported, response_format, text_content, tool_choice as openai_tool_choice, user_content,
};
use super::outcome::{synthetic_call_id, synthetic_id, usage_pair};
use super::transcript::{BlockKind, CallIds, Step, Transcript};

/// Validation messages are worded the OpenAI way.
const JSON: Wording = Wording::OpenAi;
/// The content part types whose text is kept.
const TEXT_PART_TYPES: &[&str] = &["text"];
/// OpenAI accepts at most four stop sequences.
const MAX_STOP_SEQUENCES: usize = 4;

// ---------------------------------------------------------------- request

/// A validated Chat Completions request in normalized form.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    pub messages: Vec<pb::ChatMessage>,
    pub tools: Vec<pb::ToolDefinition>,
    pub options: pb::GenerationOptions,
}

/// Strict parse + validation. Every error is [`ApiError::InvalidRequest`]
/// with a message saying exactly what is wrong and `param` naming the field
/// (e.g. `messages[2].role`). Fields IOP knows but cannot serve
/// (`logprobs: true`, `logit_bias`, ...) are refused by name; other unknown
/// top-level fields are ignored (SDKs send extras such as `user`, `metadata`,
/// `store`). An explicit `null` counts as absent.
pub fn parse_request(body: &[u8]) -> Result<ChatCompletionRequest, ApiError> {
    let obj = body_object(body)?;
    let model = JSON.non_empty_string(&obj, "model", "model")?.to_string();

    let messages = match field(&obj, "messages") {
        None => return Err(JSON.missing("messages")),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid_param("messages", "`messages` must contain at least one message"));
        }
        Some(Value::Array(items)) => {
            super::documents::within_bound(&obj, "messages")?;
            items.iter().enumerate().map(|(i, m)| parse_message(m, i)).collect::<Result<Vec<_>, _>>()?
        }
        Some(_) => return Err(JSON.type_error("messages", "an array")),
    };

    let tools = JSON.optional_array(&obj, "tools", |i| format!("tools[{i}]"), parse_tool)?;

    let stream = JSON.optional_bool(&obj, "stream", "stream")?.unwrap_or(false);
    let include_usage = match field(&obj, "stream_options") {
        None => false,
        Some(Value::Object(so)) => {
            JSON.optional_bool(so, "include_usage", "stream_options.include_usage")?.unwrap_or(false)
        }
        Some(_) => return Err(JSON.type_error("stream_options", "an object")),
    };

    let mut options = parse_options(&obj)?;
    if let Some(v) = field(&obj, "tool_choice") {
        options.tool_choice = Some(openai_tool_choice(v, &tools, |f| f.get("function").and_then(|f| f.get("name")))?);
    }
    options.parallel_tool_calls = JSON.optional_bool(&obj, "parallel_tool_calls", "parallel_tool_calls")?;
    if let Some(v) = field(&obj, "reasoning_effort") {
        options.reasoning_effort = Some(reasoning_effort(v, "reasoning_effort")?.into());
    }
    options.response_format = match field(&obj, "response_format") {
        None => None,
        Some(Value::Object(format)) => {
            let kind = JSON.non_empty_string(format, "type", "response_format.type")?;
            let spec = match field(format, "json_schema") {
                None => None,
                Some(Value::Object(spec)) => Some(spec),
                Some(_) => return Err(JSON.type_error("response_format.json_schema", "an object")),
            };
            Some(response_format(kind, "response_format.type", spec, "response_format.json_schema")?)
        }
        Some(_) => return Err(JSON.type_error("response_format", "an object")),
    };

    Ok(ChatCompletionRequest { model, stream, include_usage, messages, tools, options })
}

fn parse_message(value: &Value, i: usize) -> Result<pb::ChatMessage, ApiError> {
    let path = format!("messages[{i}]");
    let Value::Object(obj) = value else {
        return Err(JSON.type_error(&path, "an object"));
    };

    let role_path = format!("{path}.role");
    let role = match JSON.string(JSON.required(obj, "role", &role_path)?, &role_path)? {
        "system" | "developer" => pb::Role::System,
        "user" => pb::Role::User,
        "assistant" => pb::Role::Assistant,
        "tool" => pb::Role::Tool,
        other => {
            return Err(ApiError::invalid_param(
                &role_path,
                format!(
                    "`{role_path}` has unknown role `{other}`; expected one of system, developer, user, assistant, tool"
                ),
            ));
        }
    };

    let calls_path = format!("{path}.tool_calls");
    let tool_calls = match field(obj, "tool_calls") {
        None => Vec::new(),
        Some(_) if role != pb::Role::Assistant => {
            return Err(ApiError::invalid_param(
                &calls_path,
                format!("`{calls_path}` is only allowed on assistant messages"),
            ));
        }
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(j, c)| parse_tool_call(c, &format!("{calls_path}[{j}]")))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(JSON.type_error(&calls_path, "an array")),
    };

    // `name` is allowed and ignored.
    let content_path = format!("{path}.content");
    let mut images = Vec::new();
    let content = match field(obj, "content") {
        Some(v) if role == pb::Role::User => {
            let (text, parts) = user_content(v, &content_path, TEXT_PART_TYPES, &IMAGE_PART)?;
            images = parts;
            text
        }
        Some(v) => text_content(v, &content_path, TEXT_PART_TYPES)?,
        None if role == pb::Role::Assistant && !tool_calls.is_empty() => String::new(),
        None if role == pb::Role::Assistant => {
            return Err(ApiError::invalid_param(
                &content_path,
                format!("`{content_path}` is required unless the assistant message has `tool_calls`"),
            ));
        }
        None => return Err(JSON.missing(&content_path)),
    };

    let tool_call_id = if role == pb::Role::Tool {
        JSON.non_empty_string(obj, "tool_call_id", &format!("{path}.tool_call_id"))?.to_string()
    } else {
        String::new()
    };

    Ok(pb::ChatMessage { role: role.into(), content, tool_calls, tool_call_id, images })
}

/// `{"type": "image_url", "image_url": {"url": ..., "detail"?: ...}}`;
/// `{"type": "file", "file": {"file_data", "filename"?}}`.
const IMAGE_PART: ImagePart = ImagePart {
    kind: "image_url",
    url_of: |part| part.get("image_url").and_then(|u| u.get("url")),
    url_path: ".image_url.url",
    file_kind: "file",
    file_of: |part| part.get("file").and_then(Value::as_object),
    file_path: ".file",
};

/// `{"id","type":"function","function":{"name","arguments":<string>}}`.
fn parse_tool_call(value: &Value, path: &str) -> Result<pb::ToolCall, ApiError> {
    let Value::Object(obj) = value else {
        return Err(JSON.type_error(path, "an object"));
    };
    let id = JSON.non_empty_string(obj, "id", &format!("{path}.id"))?.to_string();
    expect_function_type(obj, path, false)?;
    function_call(id, function_object(obj, path)?, &format!("{path}.function"))
}

/// `{"type":"function","function":{"name","description"?,"parameters"?}}`.
fn parse_tool(value: &Value, path: &str) -> Result<pb::ToolDefinition, ApiError> {
    let Value::Object(obj) = value else {
        return Err(JSON.type_error(path, "an object"));
    };
    expect_function_type(obj, path, true)?;
    function_definition(function_object(obj, path)?, &format!("{path}.function"))
}

fn function_object<'a>(obj: &'a Map<String, Value>, path: &str) -> Result<&'a Map<String, Value>, ApiError> {
    let fpath = format!("{path}.function");
    match JSON.required(obj, "function", &fpath)? {
        Value::Object(f) => Ok(f),
        _ => Err(JSON.type_error(&fpath, "an object")),
    }
}

fn parse_options(obj: &Map<String, Value>) -> Result<pb::GenerationOptions, ApiError> {
    let mut options = pb::GenerationOptions::default();

    // `max_completion_tokens` superseded `max_tokens`; if both are sent the newer one wins.
    for key in ["max_tokens", "max_completion_tokens"] {
        if let Some(v) = field(obj, key) {
            options.max_tokens = Some(JSON.positive_u32(v, key)?);
        }
    }
    if let Some(v) = field(obj, "temperature") {
        options.temperature = Some(JSON.number_in(v, "temperature", 0.0, 2.0)?);
    }
    if let Some(v) = field(obj, "top_p") {
        options.top_p = Some(JSON.number_in(v, "top_p", 0.0, 1.0)?);
    }
    options.stop = match field(obj, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => {
            if items.len() > MAX_STOP_SEQUENCES {
                return Err(ApiError::invalid_param(
                    "stop",
                    format!("`stop` may contain at most {MAX_STOP_SEQUENCES} sequences"),
                ));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, s)| JSON.string(s, &format!("stop[{i}]")).map(str::to_string))
                .collect::<Result<Vec<_>, _>>()?
        }
        Some(_) => return Err(JSON.type_error("stop", "a string or an array of strings")),
    };
    if let Some(v) = field(obj, "seed") {
        options.seed = Some(v.as_i64().ok_or_else(|| JSON.type_error("seed", "an integer"))?);
    }
    // Not in OpenAI's API, but vLLM, llama.cpp and LM Studio take it.
    if let Some(v) = field(obj, "top_k") {
        options.top_k = Some(JSON.positive_u32(v, "top_k")?);
    }
    penalties(obj, &mut options)?;
    // Per-token log probabilities are not carried back from providers.
    refuse_unsupported(obj, &["logprobs", "top_logprobs", "logit_bias", "audio", "prediction"])?;
    if let Some(v) = field(obj, "n") {
        match v.as_i64() {
            None => return Err(JSON.type_error("n", "an integer")),
            Some(1) => {}
            Some(n) if n > 1 => return Err(ApiError::invalid_param("n", "n > 1 is not supported")),
            Some(_) => return Err(ApiError::invalid_param("n", "`n` must be 1")),
        }
    }
    Ok(options)
}

// ---------------------------------------------------------------- response

/// The identity every chunk (or the one completion object) of a response carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseMeta {
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    pub model: String,
}

impl ResponseMeta {
    /// `id` is `chatcmpl-` followed by 32 hex digits (a v4 UUID, simple form).
    pub fn new(model: String, created: u64) -> Self {
        Self { id: synthetic_id("chatcmpl-"), created, model }
    }
}

/// Streaming renderer: one instance per response.
#[derive(Debug)]
pub struct ChunkRenderer {
    meta: ResponseMeta,
    include_usage: bool,
    transcript: Transcript,
    ids: CallIds,
}

impl ChunkRenderer {
    pub fn new(meta: ResponseMeta, include_usage: bool) -> Self {
        Self { meta, include_usage, transcript: Transcript::default(), ids: CallIds::default() }
    }

    /// The JSON payloads of zero or more SSE `data:` events for one run event
    /// (the caller writes `data: <payload>\n\n`, and `data: [DONE]` after a
    /// Completed terminal). Events after a terminal render nothing. A tool
    /// call's `index` is its position among the answer's tool calls.
    pub fn render(&mut self, event: &pb::run_event::Event) -> Vec<String> {
        let mut out = Vec::new();
        for step in self.transcript.push(event) {
            let t = &self.transcript;
            match step {
                Step::Begin => out.push(self.chunk(json!({ "role": "assistant", "content": "" }), None)),
                Step::Open(i) => {
                    if let BlockKind::ToolCall { name, .. } = &t.block(i).kind {
                        let call = json!({
                            "index": t.tool_ordinal(i),
                            "id": self.ids.of(t, i, synthetic_call_id),
                            "type": "function",
                            "function": { "name": name, "arguments": "" },
                        });
                        out.push(self.chunk(json!({ "tool_calls": [call] }), None));
                    }
                }
                Step::Delta(i, text) => {
                    let delta = match t.block(i).kind {
                        BlockKind::Text => json!({ "content": text }),
                        // As llama.cpp, vLLM and DeepSeek stream it.
                        BlockKind::Reasoning => json!({ "reasoning_content": text }),
                        BlockKind::ToolCall { .. } => json!({
                            "tool_calls": [{ "index": t.tool_ordinal(i), "function": { "arguments": text } }],
                        }),
                    };
                    out.push(self.chunk(delta, None));
                }
                Step::Close(_) | Step::Cancel => {}
                Step::Complete { finish_reason } => {
                    out.push(self.chunk(json!({}), Some(finish_reason_str(finish_reason))));
                    if self.include_usage {
                        out.push(
                            json!({
                                "id": self.meta.id,
                                "object": "chat.completion.chunk",
                                "created": self.meta.created,
                                "model": self.meta.model,
                                "system_fingerprint": null,
                                "choices": [],
                                "usage": usage_json(t.usage()),
                            })
                            .to_string(),
                        );
                    }
                }
                Step::Fail(failure) => out.push(stream_error_payload(&failure)),
            }
        }
        out
    }

    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> String {
        let mut chunk = json!({
            "id": self.meta.id,
            "object": "chat.completion.chunk",
            "created": self.meta.created,
            "model": self.meta.model,
            "system_fingerprint": null,
            "choices": [{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason }],
        });
        if self.include_usage {
            // OpenAI marks every chunk before the final usage chunk with `usage: null`.
            chunk["usage"] = Value::Null;
        }
        chunk.to_string()
    }
}

/// Non-streaming: collects run events and produces the final `chat.completion` JSON.
#[derive(Debug)]
pub struct CompletionAggregator {
    meta: ResponseMeta,
    transcript: Transcript,
}

impl CompletionAggregator {
    pub fn new(meta: ResponseMeta) -> Self {
        Self { meta, transcript: Transcript::default() }
    }

    /// Events after a terminal are ignored.
    pub fn push(&mut self, event: &pb::run_event::Event) {
        self.transcript.push(event);
    }

    /// `Ok(body)` after a Completed terminal; `Err(ApiError::Execution(..))`
    /// after Failed (that failure), Cancelled, or no terminal at all. The
    /// message's `content` is every text block in order, its
    /// `reasoning_content` (when there is any) every reasoning block.
    pub fn finish(mut self) -> Result<Value, ApiError> {
        let finish_reason = self.transcript.finish()?;
        let t = &self.transcript;
        let mut ids = CallIds::default();
        let text = t.joined(&BlockKind::Text);
        let reasoning = t.joined(&BlockKind::Reasoning);
        let tool_calls: Vec<Value> = (0..t.blocks().len())
            .filter_map(|i| match &t.block(i).kind {
                BlockKind::ToolCall { name, .. } => Some(json!({
                    "id": ids.of(t, i, synthetic_call_id),
                    "type": "function",
                    "function": { "name": name, "arguments": t.block(i).content },
                })),
                BlockKind::Text | BlockKind::Reasoning => None,
            })
            .collect();
        let content = if text.is_empty() && !tool_calls.is_empty() { Value::Null } else { text.into() };
        let mut message = json!({ "role": "assistant", "content": content, "refusal": null });
        if !reasoning.is_empty() {
            message["reasoning_content"] = reasoning.into();
        }
        if !tool_calls.is_empty() {
            message["tool_calls"] = tool_calls.into();
        }

        Ok(json!({
            "id": self.meta.id,
            "object": "chat.completion",
            "created": self.meta.created,
            "model": self.meta.model,
            "system_fingerprint": null,
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": null,
                "finish_reason": finish_reason_str(finish_reason),
            }],
            "usage": usage_json(t.usage()),
        }))
    }
}

/// SSE payload for a failure after streaming already started (OpenAI sends
/// `data: {"error":{...}}`).
pub fn stream_error_payload(failure: &pb::ExecutionFailure) -> String {
    ApiError::Execution(failure.clone()).openai_body().to_string()
}

/// OpenAI's finish_reason; an unspecified or unknown value renders as "stop".
fn finish_reason_str(value: i32) -> &'static str {
    match pb::FinishReason::try_from(value) {
        Ok(pb::FinishReason::Length) => "length",
        Ok(pb::FinishReason::ToolCalls) => "tool_calls",
        Ok(pb::FinishReason::ContentFilter) => "content_filter",
        _ => "stop",
    }
}

fn usage_json(usage: Option<&pb::Usage>) -> Value {
    let (prompt, completion) = usage_pair(usage);
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": u64::from(prompt) + u64::from(completion),
    })
}

#[cfg(test)]
mod tests;
