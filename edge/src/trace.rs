//! The Edge's spans (OpenTelemetry, exported by `iop_telemetry` when
//! `telemetry.otlp_endpoint` is set): one `ingress` root per client
//! request, child of the client's `traceparent` when it sent a valid one;
//! under it one `admission wait` per admission, one `attempt` per attempt
//! on a provider (its `traceparent` travels with the run or tunnel, so the
//! node's `provider call` is its child) and one `continuation` per
//! continued stream. Span names are fixed; attributes follow the GenAI
//! semantic conventions where they have a name, else `iop.*`, all from
//! closed sets or the config (never prompts, answers, keys or paths).
//!
//! The request's root travels to the gate as a task-local ([`scope`]), so
//! the gate's callers need not pass it along.

use iop_proto::config::Adapter;
use iop_proto::pb;
use iop_telemetry::{Span, SpanContext};

use crate::metrics::Api;

tokio::task_local! {
    static CURRENT: Option<SpanContext>;
}

/// The span the current task's work belongs to (the request's root).
pub fn current() -> Option<SpanContext> {
    CURRENT.try_with(|c| *c).ok().flatten()
}

/// Runs `work` with `parent` as its [`current`] span.
pub fn scope<F: Future>(parent: Option<SpanContext>, work: F) -> impl Future<Output = F::Output> {
    CURRENT.scope(parent, work)
}

/// The client's W3C `traceparent`, when it sent a valid one (anything
/// else starts a new trace: never an error).
pub fn client_parent(headers: &::http::HeaderMap) -> Option<SpanContext> {
    let value = headers.get("traceparent")?.to_str().ok()?;
    SpanContext::parse(value)
}

/// `gen_ai.operation.name` of an API. Pure.
pub fn operation(api: Api) -> &'static str {
    match api {
        Api::embeddings => "embeddings",
        Api::chat_completions | Api::responses | Api::messages => "chat",
    }
}

/// `iop.api`. Pure.
pub fn api_name(api: Api) -> &'static str {
    match api {
        Api::chat_completions => "chat_completions",
        Api::responses => "responses",
        Api::messages => "messages",
        Api::embeddings => "embeddings",
    }
}

/// `gen_ai.provider.name` of an adapter (the API the provider speaks). Pure.
pub fn provider_name(adapter: Adapter) -> &'static str {
    match adapter {
        Adapter::Ollama => "ollama",
        Adapter::Openai => "openai",
    }
}

/// The usage attributes of `usage` (GenAI semconv names). Pure.
pub fn usage_attributes(usage: &pb::Usage) -> [(&'static str, u32); 2] {
    [("gen_ai.usage.input_tokens", usage.prompt_tokens), ("gen_ai.usage.output_tokens", usage.completion_tokens)]
}

/// Sets `usage`'s attributes on `span`.
pub fn set_usage(span: &mut Span, usage: &pb::Usage) {
    for (key, value) in usage_attributes(usage) {
        span.set(key, value);
    }
}

#[cfg(test)]
mod tests;
