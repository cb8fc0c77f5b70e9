//! The node's span (OpenTelemetry, exported by `iop_telemetry` when
//! `telemetry.otlp_endpoint` is set): one `provider call` per run or
//! tunnel, a child of the Edge's `attempt` through the request's
//! `traceparent` (untrusted input: parsed strictly, bounded, ignored when
//! malformed), with a `first byte` event and a `stream` child from the
//! provider's first byte to the end. Attributes follow the GenAI semantic
//! conventions: operation, provider kind, target model, token usage, and
//! the closed failure code (`error.type`); never prompts, answers, keys,
//! URLs or paths.
//!
//! What the execution learns on the way (first byte, usage, failure) is
//! noted through a task-local ([`Notes`]) so the execution machinery needs
//! no span of its own.

use std::sync::{Arc, Mutex};

use iop_proto::pb;
use iop_telemetry::{Kind, Span, Tracer};

use crate::metrics::ExecutionKind;

/// What an execution noted for its span.
#[derive(Debug, Default, Clone)]
pub struct Notes {
    pub first_byte: Option<std::time::Instant>,
    pub usage: Option<pb::Usage>,
    pub failure: Option<&'static str>,
}

tokio::task_local! {
    static NOTES: Arc<Mutex<Notes>>;
}

fn note(update: impl FnOnce(&mut Notes)) {
    let _ = NOTES.try_with(|notes| {
        if let Ok(mut notes) = notes.lock() {
            update(&mut notes);
        }
    });
}

/// The provider's first byte arrived at `at`.
pub fn note_first_byte(at: tokio::time::Instant) {
    note(|n| {
        n.first_byte.get_or_insert(at.into_std());
    });
}

/// The provider reported `usage`.
pub fn note_usage(usage: &pb::Usage) {
    note(|n| n.usage = Some(*usage));
}

/// The execution failed with `failure`.
pub fn note_failure(failure: &pb::ExecutionFailure) {
    note(|n| n.failure = Some(failure_code(failure.kind())));
}

/// `error.type` of a failure kind (the wire's closed set). Pure.
pub fn failure_code(kind: pb::FailureKind) -> &'static str {
    use pb::FailureKind as K;
    match kind {
        K::Unspecified => "unspecified",
        K::ProviderUnreachable => "provider_unreachable",
        K::ProviderHttpStatus => "provider_http_status",
        K::ProviderProtocol => "provider_protocol",
        K::InvalidRequest => "invalid_request",
        K::TransportLost => "transport_lost",
        K::CapacityExhausted => "capacity_exhausted",
        K::ResponseTooLarge => "response_too_large",
        K::CredentialRejected => "credential_rejected",
        K::DeadlineExceeded => "deadline_exceeded",
        K::ProviderStreamCut => "provider_stream_cut",
        K::ResponseStalled => "response_stalled",
        K::Internal => "internal",
    }
}

/// `gen_ai.provider.name` of the wire's adapter kind. Pure.
pub fn provider_name(adapter: i32) -> &'static str {
    match pb::AdapterKind::try_from(adapter) {
        Ok(pb::AdapterKind::Ollama) => "ollama",
        Ok(pb::AdapterKind::Openai) => "openai",
        _ => "unknown",
    }
}

/// The span's fixed attributes.
pub struct Call<'a> {
    pub kind: ExecutionKind,
    pub traceparent: &'a str,
    pub operation: &'static str,
    pub adapter: i32,
    pub provider_id: &'a str,
    pub target_model: &'a str,
}

/// Runs `work` (one execution) inside its `provider call` span.
pub async fn provider_call<F: Future>(tracer: &Tracer, call: Call<'_>, work: F) -> F::Output {
    if !tracer.is_on() {
        return work.await;
    }
    let mut span = tracer.start_remote("provider call", Kind::Client, call.traceparent);
    if span.context().is_none() {
        return work.await;
    }
    span.set("gen_ai.operation.name", call.operation);
    span.set("gen_ai.provider.name", provider_name(call.adapter));
    span.set("gen_ai.request.model", call.target_model.to_string());
    span.set("iop.provider.id", call.provider_id.to_string());
    span.set("iop.execution", call.kind.label());
    let notes = Arc::new(Mutex::new(Notes::default()));
    let output = NOTES.scope(notes.clone(), work).await;
    let notes = notes.lock().map(|n| n.clone()).unwrap_or_default();
    finish(&mut span, &notes);
    output
}

/// Puts `notes` on `span`: usage, failure, the first byte as an event and
/// the `stream` child from it to now.
fn finish(span: &mut Span, notes: &Notes) {
    if let Some(usage) = &notes.usage {
        span.set("gen_ai.usage.input_tokens", usage.prompt_tokens);
        span.set("gen_ai.usage.output_tokens", usage.completion_tokens);
    }
    if let Some(code) = notes.failure {
        span.fail(code);
    }
    if let Some(at) = notes.first_byte {
        span.event_at("first byte", at);
        span.child_since("stream", Kind::Internal, at).end();
    }
}

#[cfg(test)]
mod tests;
