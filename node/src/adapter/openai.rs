//! OpenAI-compatible chat completions: `POST {base}/v1/chat/completions`
//! with `"stream": true`, answered as server-sent events ending in
//! `data: [DONE]`.

use base64::Engine as _;
use iop_proto::pb;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::error::{AdapterError, json_error_summary, stream_error};
use super::events::Events;
use super::malformed::MalformedRun;
use super::request::{
    ResponseFormat, Tool, ToolChoice, check_options, leading_system, message_role, reasoning_effort, response_format,
    to_json_body, tool_choice, wire_tools,
};
use super::sse::SseParser;
use super::stream::StreamDecoder;
use super::target::ProviderTarget;

// ------------------------------------------------------------- request

#[derive(Serialize)]
struct ChatBody<'a> {
    model: &'a str,
    messages: Vec<Message<'a>>,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Tool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f32>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<i64>,
    /// Not in OpenAI's API; vLLM, llama.cpp and LM Studio take it.
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    presence_penalty: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    frequency_penalty: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_effort: Option<&'static str>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    /// `null` only for an assistant turn that is nothing but tool calls;
    /// text and image parts for a user turn with images.
    content: Option<Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<ToolCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

#[derive(Serialize)]
struct ToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: CallFunction<'a>,
}

#[derive(Serialize)]
struct CallFunction<'a> {
    name: &'a str,
    /// JSON text, passed through as the client sent it.
    arguments: &'a str,
}

/// The `/v1/chat/completions` body for `request`. Always streams, with usage.
pub(super) fn request_body(target: &ProviderTarget, request: &pb::RunRequest) -> Result<Vec<u8>, AdapterError> {
    let conversation = leading_system(&request.messages);
    let mut messages = Vec::with_capacity(conversation.len());
    for (i, m) in conversation.iter().enumerate() {
        let content = if m.images.is_empty() {
            Value::from(m.content.as_str())
        } else {
            let text = (!m.content.is_empty()).then(|| json!({"type": "text", "text": m.content}));
            let images = m.images.iter().map(|image| {
                let url = if image.data.is_empty() {
                    image.url.clone()
                } else {
                    let data = base64::engine::general_purpose::STANDARD.encode(&image.data);
                    format!("data:{};base64,{data}", image.media_type)
                };
                json!({"type": "image_url", "image_url": {"url": url}})
            });
            Value::Array(text.into_iter().chain(images).collect())
        };
        let mut message = Message { role: "", content: Some(content), tool_calls: Vec::new(), tool_call_id: None };
        match message_role(i, m)? {
            pb::Role::System => message.role = "system",
            pb::Role::User => message.role = "user",
            pb::Role::Assistant => {
                message.role = "assistant";
                message.tool_calls = m
                    .tool_calls
                    .iter()
                    .map(|call| ToolCall {
                        id: &call.id,
                        kind: "function",
                        function: CallFunction {
                            name: &call.name,
                            arguments: if call.arguments_json.trim().is_empty() { "{}" } else { &call.arguments_json },
                        },
                    })
                    .collect();
                if !message.tool_calls.is_empty() && m.content.is_empty() {
                    message.content = None;
                }
            }
            pb::Role::Tool => {
                message.role = "tool";
                message.tool_call_id = Some(&m.tool_call_id);
            }
            pb::Role::Unspecified => {
                return Err(AdapterError::InvalidRequest(format!("messages[{i}]: role is unspecified")));
            }
        }
        messages.push(message);
    }

    let tools = wire_tools(request)?;

    let default_options = pb::GenerationOptions::default();
    let options = request.options.as_ref().unwrap_or(&default_options);
    check_options(options)?;

    to_json_body(&ChatBody {
        model: &target.target_model,
        messages,
        stream: true,
        stream_options: StreamOptions { include_usage: true },
        tools,
        max_tokens: options.max_tokens,
        temperature: options.temperature,
        top_p: options.top_p,
        stop: &options.stop,
        seed: options.seed,
        top_k: options.top_k,
        presence_penalty: options.presence_penalty,
        frequency_penalty: options.frequency_penalty,
        tool_choice: match tool_choice(request)? {
            ToolChoice::Default => None,
            ToolChoice::Auto => Some(json!("auto")),
            ToolChoice::None => Some(json!("none")),
            ToolChoice::Required => Some(json!("required")),
            ToolChoice::Named(name) => Some(json!({"type": "function", "function": {"name": name}})),
        },
        // Only with tools: OpenAI refuses it without (Codex's compaction
        // sends `tools: []` with `parallel_tool_calls: false`).
        parallel_tool_calls: options.parallel_tool_calls.filter(|_| !request.tools.is_empty()),
        reasoning_effort: reasoning_effort(options)?.and_then(|effort| match effort {
            pb::ReasoningEffort::None | pb::ReasoningEffort::Unspecified => Some("none"),
            pb::ReasoningEffort::Low => Some("low"),
            pb::ReasoningEffort::Medium => Some("medium"),
            pb::ReasoningEffort::High => Some("high"),
            // The server's own default depth.
            pb::ReasoningEffort::Adaptive => None,
        }),
        response_format: match response_format(options)? {
            ResponseFormat::Text => None,
            ResponseFormat::JsonObject => Some(json!({"type": "json_object"})),
            ResponseFormat::JsonSchema { name, schema, strict } => Some(json!({
                "type": "json_schema",
                "json_schema": {"name": if name.is_empty() { "response" } else { name }, "schema": schema, "strict": strict},
            })),
        },
    })
}

// ------------------------------------------------------------ response

#[derive(Deserialize)]
struct Chunk {
    model: Option<String>,
    choices: Option<Vec<Choice>>,
    usage: Option<crate::usage::ProviderUsage>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice {
    delta: Option<Delta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
    /// Reasoning as llama.cpp, vLLM and DeepSeek stream it; newer vLLM and
    /// OpenRouter call it `reasoning`.
    #[serde(alias = "reasoning")]
    reasoning_content: Option<String>,
    tool_calls: Option<Vec<DeltaToolCall>>,
}

#[derive(Deserialize)]
struct DeltaToolCall {
    index: Option<u32>,
    id: Option<String>,
    function: Option<DeltaFunction>,
}

#[derive(Deserialize)]
struct DeltaFunction {
    name: Option<String>,
    arguments: Option<String>,
}

/// Decodes an OpenAI chat-completions SSE stream.
pub(super) struct Decoder {
    sse: SseParser,
    fallback_model: String,
    started: bool,
    finish_reason: Option<String>,
    malformed: MalformedRun,
}

/// What [`MalformedRun`] calls an undecodable event of this stream.
const EVENT: &str = "SSE data payload";

impl Decoder {
    pub(super) fn new(model: &str) -> Self {
        Self {
            sse: SseParser::new(),
            fallback_model: model.to_owned(),
            started: false,
            finish_reason: None,
            malformed: MalformedRun::default(),
        }
    }

    /// One SSE event's data.
    fn data(&mut self, data: &str, out: &mut Events) -> Result<Option<pb::FinishReason>, AdapterError> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(None);
        }
        if data == "[DONE]" {
            return self.finish("provider sent [DONE] without a finish_reason").map(Some);
        }
        let chunk: Chunk = match serde_json::from_str(data) {
            Ok(chunk) => chunk,
            Err(e) => return self.malformed.malformed(EVENT, &json_error_summary(&e)).map(|()| None),
        };
        self.malformed.on_good();
        if let Some(error) = chunk.error.as_ref().filter(|e| !e.is_null()) {
            return Err(stream_error(error));
        }
        if !self.started {
            self.started = true;
            let model = chunk.model.as_deref().filter(|m| !m.is_empty()).unwrap_or(&self.fallback_model);
            out.push(super::events::started(model));
        }
        if let Some(choice) = chunk.choices.iter().flatten().next() {
            if let Some(delta) = &choice.delta {
                if let Some(reasoning) = delta.reasoning_content.as_deref().filter(|r| !r.is_empty()) {
                    out.push(super::events::reasoning(reasoning));
                }
                if let Some(content) = delta.content.as_deref().filter(|c| !c.is_empty()) {
                    out.push(super::events::text(content));
                }
                for (position, call) in delta.tool_calls.iter().flatten().enumerate() {
                    let function = call.function.as_ref();
                    out.push(super::events::tool_call(
                        call.index.unwrap_or(position as u32),
                        call.id.as_deref().unwrap_or(""),
                        function.and_then(|f| f.name.as_deref()).unwrap_or(""),
                        function.and_then(|f| f.arguments.as_deref()).unwrap_or(""),
                    ));
                }
            }
            if let Some(reason) = &choice.finish_reason {
                self.finish_reason = Some(reason.clone());
            }
        }
        if let Some(usage) = &chunk.usage {
            out.push(pb::run_event::Event::Usage(usage.to_pb()));
        }
        Ok(None)
    }

    fn finish(&self, missing: &str) -> Result<pb::FinishReason, AdapterError> {
        match self.finish_reason.as_deref() {
            Some(reason) => Ok(map_finish_reason(reason)),
            None => Err(AdapterError::Protocol(missing.to_owned())),
        }
    }
}

fn map_finish_reason(reason: &str) -> pb::FinishReason {
    match reason {
        "length" => pb::FinishReason::Length,
        "tool_calls" | "function_call" => pb::FinishReason::ToolCalls,
        "content_filter" => pb::FinishReason::ContentFilter,
        _ => pb::FinishReason::Stop,
    }
}

impl StreamDecoder for Decoder {
    fn line(&mut self, line: &str, out: &mut Events) -> Result<Option<pb::FinishReason>, AdapterError> {
        match self.sse.line(line)? {
            Some(data) => self.data(&data, out),
            None => Ok(None),
        }
    }

    fn end(&mut self, out: &mut Events) -> Result<pb::FinishReason, AdapterError> {
        if let Some(data) = self.sse.finish()
            && let Some(reason) = self.data(&data, out)?
        {
            return Ok(reason);
        }
        self.malformed.end(EVENT)?;
        // A missing [DONE] after a complete answer is fine.
        self.finish("stream ended before the provider's final chunk")
    }

    fn malformed_skipped(&self) -> u64 {
        self.malformed.skipped()
    }
}

#[cfg(test)]
mod tests;
