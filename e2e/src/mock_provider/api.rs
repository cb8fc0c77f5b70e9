//! A chat request as the three chat APIs (Ollama's `/api/chat`, OpenAI Chat
//! Completions and Responses) send it, read into one [`ChatRequest`], and
//! what differs between those APIs ([`Api`]): streaming by default, the
//! length limit, the reasoning switch, ids, content types and error shapes.

use axum::Json;
use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::faults::MALFORMED_JSON;

#[derive(Debug, Deserialize)]
pub(super) struct ChatRequest {
    pub(super) model: String,
    #[serde(default)]
    pub(super) messages: Vec<ChatMessage>,
    pub(super) stream: Option<bool>,
    pub(super) stream_options: Option<StreamOptions>,
    pub(super) tools: Option<Vec<Value>>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    options: Option<OllamaOptions>,
    /// Ollama: `true` or a level (`"high"`) asks for reasoning.
    think: Option<Value>,
    /// OpenAI: any value but null asks for reasoning.
    reasoning_effort: Option<Value>,
    /// Responses: the conversation (a string, or message and tool-output
    /// items), read into `messages`.
    input: Option<Value>,
    /// Responses: the system message.
    instructions: Option<String>,
    max_output_tokens: Option<u64>,
    /// Responses: any value but null asks for reasoning.
    reasoning: Option<Value>,
    /// Ollama: a JSON Schema the answer must follow (see *Structured output*).
    format: Option<Value>,
    /// OpenAI Chat: `{"type": "json_schema", "json_schema": {"schema"}}`
    /// (see *Structured output*).
    response_format: Option<Value>,
}

impl ChatRequest {
    /// The JSON Schema the answer must follow: Ollama's `format` (an
    /// object), OpenAI Chat's `response_format.json_schema.schema`.
    pub(super) fn answer_schema(&self, api: Api) -> Option<&Value> {
        let schema = match api {
            Api::Ollama => self.format.as_ref(),
            Api::OpenAi => self.response_format.as_ref().and_then(|f| f.pointer("/json_schema/schema")),
            Api::Responses => None,
        };
        schema.filter(|s| s.is_object())
    }
}

impl ChatRequest {
    /// A Responses request's `instructions` and `input` as chat messages
    /// (a tool's output reads as a `tool` message), so one reply planner
    /// serves every API.
    pub(super) fn responses_messages(&mut self) {
        let mut messages = Vec::new();
        if let Some(instructions) = self.instructions.take() {
            messages.push(ChatMessage { role: "system".into(), content: Value::String(instructions), images: None });
        }
        let items = match self.input.take() {
            Some(Value::String(text)) => vec![json!({ "role": "user", "content": text })],
            Some(Value::Array(items)) => items,
            _ => Vec::new(),
        };
        for item in items {
            let (role, content) = match item.get("type").and_then(Value::as_str) {
                Some("function_call_output") => ("tool", item.get("output").cloned().unwrap_or_default()),
                Some("message") | None => {
                    let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
                    (role, item.get("content").cloned().unwrap_or_default())
                }
                Some(_) => continue,
            };
            messages.push(ChatMessage { role: role.into(), content, images: None });
        }
        self.messages = messages;
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct ChatMessage {
    #[serde(default)]
    pub(super) role: String,
    /// A string, or (OpenAI) an array of `{type:"text",text}` and
    /// `{type:"image_url",image_url}` parts, or null.
    #[serde(default)]
    pub(super) content: Value,
    /// Ollama: base64 images.
    pub(super) images: Option<Vec<Value>>,
}

#[derive(Debug, Deserialize)]
pub(super) struct StreamOptions {
    #[serde(default)]
    pub(super) include_usage: bool,
}

#[derive(Debug, Deserialize)]
struct OllamaOptions {
    /// Negative means "no limit" in Ollama.
    num_predict: Option<i64>,
}

impl ChatMessage {
    pub(super) fn text(&self) -> String {
        match &self.content {
            Value::String(s) => s.clone(),
            Value::Array(parts) => {
                parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n")
            }
            _ => String::new(),
        }
    }

    /// Ollama `images` plus OpenAI `image_url` content parts.
    pub(super) fn image_count(&self) -> usize {
        let parts = match &self.content {
            Value::Array(parts) => {
                parts.iter().filter(|p| p.get("type").and_then(Value::as_str) == Some("image_url")).count()
            }
            _ => 0,
        };
        self.images.as_ref().map_or(0, Vec::len) + parts
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Api {
    Ollama,
    /// OpenAI Chat Completions.
    OpenAi,
    /// OpenAI Responses.
    Responses,
}

impl Api {
    pub(super) fn streams_by_default(self) -> bool {
        self == Api::Ollama
    }

    /// The request's completion-length limit, in chunks.
    pub(super) fn limit(self, req: &ChatRequest) -> Option<usize> {
        let limit = match self {
            Api::Ollama => req.options.as_ref().and_then(|o| o.num_predict).and_then(|n| u64::try_from(n).ok()),
            Api::OpenAi => req.max_completion_tokens.or(req.max_tokens),
            Api::Responses => req.max_output_tokens,
        };
        limit.map(|n| usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// Whether the request asks for reasoning (see *Reasoning*).
    pub(super) fn wants_reasoning(self, req: &ChatRequest) -> bool {
        match self {
            Api::Ollama => matches!(req.think, Some(Value::Bool(true) | Value::String(_))),
            Api::OpenAi => req.reasoning_effort.is_some(),
            Api::Responses => req.reasoning.is_some(),
        }
    }

    /// What a reply's id starts with (a number follows).
    pub(super) fn id_prefix(self) -> &'static str {
        match self {
            Api::Ollama | Api::OpenAi => "chatcmpl-mock-",
            Api::Responses => "resp_mock",
        }
    }

    pub(super) fn stream_content_type(self) -> &'static str {
        match self {
            Api::Ollama => "application/x-ndjson",
            Api::OpenAi | Api::Responses => "text/event-stream",
        }
    }

    /// An error event inside a stream, as each API sends one.
    pub(super) fn stream_error(self, message: &str) -> String {
        match self {
            Api::Ollama => format!("{}\n", json!({ "error": message })),
            Api::OpenAi => {
                let error = json!({ "error": { "message": message, "type": "invalid_request_error", "code": null } });
                format!("data: {error}\n\n")
            }
            Api::Responses => {
                let error = json!({ "type": "error", "code": "invalid_api_key", "message": message, "param": null });
                format!("event: error\ndata: {error}\n\n")
            }
        }
    }

    /// The wire form of a malformed content chunk.
    pub(super) fn malformed_chunk(self) -> Bytes {
        match self {
            Api::Ollama => Bytes::from(format!("{MALFORMED_JSON}\n")),
            Api::OpenAi => Bytes::from(format!("data: {MALFORMED_JSON}\n\n")),
            Api::Responses => Bytes::from(format!("event: response.output_text.delta\ndata: {MALFORMED_JSON}\n\n")),
        }
    }

    pub(super) fn error(self, status: StatusCode, message: &str) -> Response {
        self.error_with_code(status, message, None)
    }

    pub(super) fn error_with_code(self, status: StatusCode, message: &str, code: Option<&str>) -> Response {
        let body = match self {
            Api::Ollama => json!({ "error": message }),
            Api::OpenAi | Api::Responses => {
                let kind = if status.is_server_error() { "server_error" } else { "invalid_request_error" };
                json!({ "error": { "message": message, "type": kind, "param": null, "code": code } })
            }
        };
        (status, Json(body)).into_response()
    }
}
