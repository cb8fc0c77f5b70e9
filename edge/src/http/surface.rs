//! The three client APIs behind one handler: each [`Surface`] says how to
//! parse its request, render normalized run events as its stream or its
//! final object, frame its SSE events and shape its errors.

use axum::body::Bytes;
use iop_proto::pb::{self, run_event::Event};
use serde_json::Value;

use crate::ingress::error::ApiError;
use crate::ingress::hosted_tools::DroppedTool;
use crate::ingress::{anthropic_messages as messages, openai_chat as chat, openai_responses as responses};
use crate::metrics::Api;

/// What every API's parser yields.
pub struct Parsed<C> {
    pub model: String,
    pub stream: bool,
    pub run: pb::RunRequest,
    /// Per-request data the renderers need (e.g. `include_usage`).
    pub context: C,
    /// Hosted tools the request named, which no provider is offered.
    pub dropped_tools: Vec<DroppedTool>,
}

pub trait Surface: Send + 'static {
    const API: Api;
    /// The same API's path at an OpenAI-compatible provider, if a provider
    /// in `tunnel` mode can take this request as-is.
    const TUNNEL_PATH: Option<&'static str>;
    /// Whether the streamer keeps the whole output (to repeat it in its
    /// final event), so a stream is bounded by `limits.max_response_bytes`.
    const HOLDS_STREAMED_OUTPUT: bool = false;
    /// What tells a streaming client the request is alive before its first
    /// content (`limits.stream_keepalive_ms`).
    const KEEPALIVE: &'static [u8];
    type Context: Send + 'static;
    type Streamer: Send + 'static;
    type Collector: Send + 'static;

    fn parse(body: &[u8]) -> Result<Parsed<Self::Context>, ApiError>;
    fn streamer(context: Self::Context, model: String) -> Self::Streamer;
    /// Framed SSE bytes for one event (including any end-of-stream marker).
    fn stream(streamer: &mut Self::Streamer, event: &Event) -> Vec<Bytes>;
    fn collector(context: Self::Context, model: String) -> Self::Collector;
    fn collect(collector: &mut Self::Collector, event: &Event);
    fn finish(collector: Self::Collector) -> Result<Value, ApiError>;
    fn error_body(error: &ApiError) -> Value;
    /// A failure of a stream whose head already went out (keepalives) before
    /// any content: the API's own error event.
    fn stream_error(error: &ApiError) -> Vec<Bytes>;
}

fn data_frame(payload: &str) -> Bytes {
    Bytes::from(format!("data: {payload}\n\n"))
}

fn event_frame((name, payload): (&str, String)) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {payload}\n\n"))
}

fn run_request(
    messages: Vec<pb::ChatMessage>,
    tools: Vec<pb::ToolDefinition>,
    options: pb::GenerationOptions,
    stream: bool,
) -> pb::RunRequest {
    pb::RunRequest { messages, tools, options: Some(options), stream, ..Default::default() }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// OpenAI Chat Completions: `data:`-only SSE ending in `data: [DONE]`.
pub struct ChatCompletions;

impl Surface for ChatCompletions {
    const API: Api = Api::chat_completions;
    const TUNNEL_PATH: Option<&'static str> = Some("/v1/chat/completions");
    const KEEPALIVE: &'static [u8] = b": keepalive\n\n";
    type Context = bool;
    type Streamer = chat::ChunkRenderer;
    type Collector = chat::CompletionAggregator;

    fn parse(body: &[u8]) -> Result<Parsed<bool>, ApiError> {
        let r = chat::parse_request(body)?;
        let run = run_request(r.messages, r.tools, r.options, r.stream);
        Ok(Parsed { model: r.model, stream: r.stream, run, context: r.include_usage, dropped_tools: Vec::new() })
    }
    fn streamer(include_usage: bool, model: String) -> Self::Streamer {
        chat::ChunkRenderer::new(chat::ResponseMeta::new(model, unix_now()), include_usage)
    }
    fn stream(streamer: &mut Self::Streamer, event: &Event) -> Vec<Bytes> {
        let mut frames: Vec<Bytes> = streamer.render(event).iter().map(|p| data_frame(p)).collect();
        if let Event::Completed(_) = event {
            frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
        }
        frames
    }
    fn collector(_: bool, model: String) -> Self::Collector {
        chat::CompletionAggregator::new(chat::ResponseMeta::new(model, unix_now()))
    }
    fn collect(collector: &mut Self::Collector, event: &Event) {
        collector.push(event);
    }
    fn finish(collector: Self::Collector) -> Result<Value, ApiError> {
        collector.finish()
    }
    fn error_body(error: &ApiError) -> Value {
        error.openai_body()
    }
    fn stream_error(error: &ApiError) -> Vec<Bytes> {
        // The same `data: {"error": ...}` a stream broken after its start ends with.
        vec![data_frame(&error.openai_body().to_string())]
    }
}

/// OpenAI Responses: named SSE events.
pub struct Responses;

impl Surface for Responses {
    const API: Api = Api::responses;
    const TUNNEL_PATH: Option<&'static str> = Some("/v1/responses");
    const HOLDS_STREAMED_OUTPUT: bool = true;
    const KEEPALIVE: &'static [u8] = b": keepalive\n\n";
    /// What the answer echoes of the request (its id, time and model are
    /// filled in when the answer starts).
    type Context = responses::ResponseMeta;
    type Streamer = responses::EventRenderer;
    type Collector = responses::ResponseAggregator;

    fn parse(body: &[u8]) -> Result<Parsed<Self::Context>, ApiError> {
        let r = responses::parse_request(body)?;
        let context = responses::ResponseMeta::for_request(&r, 0);
        let run = run_request(r.messages, r.tools, r.options, r.stream);
        Ok(Parsed { model: r.model, stream: r.stream, run, context, dropped_tools: r.dropped_tools })
    }
    fn streamer(echo: Self::Context, model: String) -> Self::Streamer {
        responses::EventRenderer::new(responses::ResponseMeta { model, created_at: unix_now(), ..echo })
    }
    fn stream(streamer: &mut Self::Streamer, event: &Event) -> Vec<Bytes> {
        streamer.render(event).into_iter().map(event_frame).collect()
    }
    fn collector(echo: Self::Context, model: String) -> Self::Collector {
        responses::ResponseAggregator::new(responses::ResponseMeta { model, created_at: unix_now(), ..echo })
    }
    fn collect(collector: &mut Self::Collector, event: &Event) {
        collector.push(event);
    }
    fn finish(collector: Self::Collector) -> Result<Value, ApiError> {
        collector.finish()
    }
    fn error_body(error: &ApiError) -> Value {
        error.openai_body()
    }
    fn stream_error(error: &ApiError) -> Vec<Bytes> {
        // The Responses stream's `error` event.
        let payload = serde_json::json!({
            "type": "error", "code": error.client_code(), "message": error.message(), "param": null, "sequence_number": 0,
        });
        vec![event_frame(("error", payload.to_string()))]
    }
}

/// Anthropic Messages: named SSE events, Anthropic error shape.
pub struct Messages;

impl Surface for Messages {
    const API: Api = Api::messages;
    // No provider adapter speaks the Anthropic API: always normalized.
    const TUNNEL_PATH: Option<&'static str> = None;
    const KEEPALIVE: &'static [u8] = b"event: ping\ndata: {\"type\": \"ping\"}\n\n";
    /// `thinking.display: "omitted"`.
    type Context = bool;
    type Streamer = messages::EventRenderer;
    type Collector = messages::MessageAggregator;

    fn parse(body: &[u8]) -> Result<Parsed<bool>, ApiError> {
        let r = messages::parse_request(body)?;
        let run = run_request(r.messages, r.tools, r.options, r.stream);
        Ok(Parsed { model: r.model, stream: r.stream, run, context: r.omit_thinking, dropped_tools: r.dropped_tools })
    }
    fn streamer(omit_thinking: bool, model: String) -> Self::Streamer {
        messages::EventRenderer::new(messages::ResponseMeta { omit_thinking, ..messages::ResponseMeta::new(model) })
    }
    fn stream(streamer: &mut Self::Streamer, event: &Event) -> Vec<Bytes> {
        streamer.render(event).into_iter().map(event_frame).collect()
    }
    fn collector(omit_thinking: bool, model: String) -> Self::Collector {
        messages::MessageAggregator::new(messages::ResponseMeta { omit_thinking, ..messages::ResponseMeta::new(model) })
    }
    fn collect(collector: &mut Self::Collector, event: &Event) {
        collector.push(event);
    }
    fn finish(collector: Self::Collector) -> Result<Value, ApiError> {
        collector.finish()
    }
    fn error_body(error: &ApiError) -> Value {
        error.anthropic_body()
    }
    fn stream_error(error: &ApiError) -> Vec<Bytes> {
        vec![event_frame(("error", error.anthropic_body().to_string()))]
    }
}
