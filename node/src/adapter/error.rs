//! Why a provider call failed ([`AdapterError`]) and the messages that go
//! with it: the provider's own error message, a transport error's chain, a
//! JSON error's position. Every message is safe to put on the wire.

use iop_proto::pb;

/// Longest provider error message we pass on.
const ERROR_MESSAGE_CHARS: usize = 500;

/// Why a provider call failed. [`AdapterError::to_failure`] is the single
/// mapping onto the wire taxonomy; every message is safe to put on the wire
/// (no prompt text, no response payload beyond the provider's own error
/// message).
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    /// Connect or transport failure before or during the response.
    #[error("provider unreachable: {0}")]
    Unreachable(String),
    /// The provider answered with a non-2xx status. `message` is the
    /// provider's own error message (truncated to 500 chars) or the status text.
    /// `code` is the provider's own error code, sanitized
    /// ([`iop_proto::provider_error::code`]).
    #[error("provider answered HTTP {status}: {message}")]
    HttpStatus { status: u16, retry_after_ms: Option<u64>, message: String, context_length: bool, code: Option<String> },
    /// The response started (status and headers received, 2xx) and its body
    /// then broke at the transport: a reset, an incomplete chunked body, a
    /// body shorter than its `Content-Length`. A body that ends cleanly
    /// without the API's terminal is [`Self::Protocol`].
    #[error("provider stream cut: {0}")]
    StreamCut(String),
    /// Malformed chunk, or the stream ended without its terminal.
    #[error("provider protocol error: {0}")]
    Protocol(String),
    /// A streamed line or event past its size bound.
    #[error("provider response too large: {0}")]
    TooLarge(String),
    /// The request cannot be translated for the provider.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The event receiver is gone (the edge side cancelled).
    #[error("run event receiver closed")]
    SinkClosed,
}

impl AdapterError {
    /// The wire failure for this error.
    pub fn to_failure(&self) -> pb::ExecutionFailure {
        let kind = match self {
            Self::Unreachable(_) => pb::FailureKind::ProviderUnreachable,
            Self::StreamCut(_) => pb::FailureKind::ProviderStreamCut,
            Self::HttpStatus { .. } => pb::FailureKind::ProviderHttpStatus,
            Self::Protocol(_) => pb::FailureKind::ProviderProtocol,
            Self::TooLarge(_) => pb::FailureKind::ResponseTooLarge,
            Self::InvalidRequest(_) => pb::FailureKind::InvalidRequest,
            Self::SinkClosed => pb::FailureKind::Internal,
        };
        let mut failure = pb::ExecutionFailure::new(kind, self.to_string());
        if let Self::HttpStatus { status, retry_after_ms, context_length, code, .. } = self {
            failure.provider_status = u32::from(*status);
            failure.retry_after_ms = retry_after_ms.unwrap_or(0);
            failure.context_length_exceeded = *context_length;
            failure.provider_code =
                code.as_deref().and_then(iop_proto::provider_error::sanitize_code).unwrap_or_default().to_owned();
        }
        failure
    }

    /// The message without the kind prefix.
    pub(super) fn detail(&self) -> String {
        match self {
            Self::Unreachable(m)
            | Self::StreamCut(m)
            | Self::Protocol(m)
            | Self::TooLarge(m)
            | Self::InvalidRequest(m) => m.clone(),
            other => other.to_string(),
        }
    }
}

/// The provider's own error message from a JSON error body: OpenAI
/// `{"error":{"message":..}}`, Ollama `{"error":".."}`, and the common
/// `{"message":..}` / `{"detail":..}` shapes of OpenAI-compatible servers.
pub(super) fn provider_error_message(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    error_message_in(&value)
}

fn error_message_in(value: &serde_json::Value) -> Option<String> {
    iop_proto::provider_error::message(value).map(|text| truncate_chars(text, ERROR_MESSAGE_CHARS))
}

/// An `"error"` field inside an otherwise successful stream.
pub(super) fn stream_error(error: &serde_json::Value) -> AdapterError {
    let message =
        iop_proto::provider_error::error_field_text(error).map(str::trim).filter(|text| !text.is_empty()).map_or_else(
            || "provider reported an error mid-stream".to_owned(),
            |text| truncate_chars(text, ERROR_MESSAGE_CHARS),
        );
    AdapterError::Protocol(message)
}

fn truncate_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => text[..cut].to_owned(),
        None => text.to_owned(),
    }
}

/// A body read that failed after the response started ([`AdapterError::StreamCut`]).
pub(crate) fn stream_cut(context: &str, e: reqwest::Error) -> AdapterError {
    AdapterError::StreamCut(format!("{context}: {}", error_chain(&e.without_url())))
}

pub(crate) fn transport_error(context: &str, e: reqwest::Error) -> AdapterError {
    // Without the URL: reqwest's Display names it, and the provider's
    // address is internal (the message reaches clients).
    AdapterError::Unreachable(format!("{context}: {}", error_chain(&e.without_url())))
}

/// `error: source: source…`, skipping sources whose text is already included.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// Position and category of a JSON error, never the offending text (serde's
/// own messages can quote payload).
pub(super) fn json_error_summary(e: &serde_json::Error) -> String {
    let category = match e.classify() {
        serde_json::error::Category::Io => "I/O",
        serde_json::error::Category::Syntax => "syntax",
        serde_json::error::Category::Data => "unexpected shape",
        serde_json::error::Category::Eof => "truncated",
    };
    format!("{category} error at line {} column {}", e.line(), e.column())
}

#[cfg(test)]
mod tests;
