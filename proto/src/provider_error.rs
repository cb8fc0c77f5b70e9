//! What a provider's error answer says, read one way by the node (its
//! failure message, whether the request exceeded the model's context
//! window, when to retry) and by the Edge (a tunnel's relayed error answer).

use serde_json::Value;

/// The provider's own message in a JSON error body: OpenAI
/// `{"error":{"message":..}}`, Ollama `{"error":".."}`, and the common
/// `{"message":..}` / `{"detail":..}` shapes of OpenAI-compatible servers.
pub fn message(value: &Value) -> Option<&str> {
    value
        .get("error")
        .and_then(error_field_text)
        .or_else(|| value.get("message").and_then(Value::as_str))
        .or_else(|| value.get("detail").and_then(Value::as_str))
        .map(str::trim)
        .filter(|text| !text.is_empty())
}

/// The text of an `"error"` field: a string, or an object's `message`.
pub fn error_field_text(error: &Value) -> Option<&str> {
    match error {
        Value::String(s) => Some(s),
        other => other.get("message").and_then(Value::as_str),
    }
}

/// The longest provider error code kept ([`sanitize_code`]).
pub const MAX_CODE_CHARS: usize = 64;

/// A provider's own error code, when it is safe to pass on: 1 to
/// [`MAX_CODE_CHARS`] characters of `[a-z0-9_.-]` (OpenAI's codes are
/// `snake_case`). Anything else is dropped, never repaired: the code comes
/// from an untrusted provider through a semi-trusted node, so both ends
/// check it with this one function.
pub fn sanitize_code(code: &str) -> Option<&str> {
    let ok = (1..=MAX_CODE_CHARS).contains(&code.len())
        && code.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-'));
    ok.then_some(code)
}

/// The provider's own error code in a JSON error body, sanitized: OpenAI's
/// `{"error":{"code":"content_policy_violation"}}` (a string; numeric codes
/// such as llama.cpp's `"code": 400` are only the status again), or the
/// context-window refusal [`context_length_exceeded`] recognizes in any
/// shape (Ollama's plain-string errors have no code otherwise).
pub fn code(status: u16, body: &[u8]) -> Option<String> {
    let value = serde_json::from_slice::<Value>(body).ok();
    let own = value.as_ref().and_then(|v| v.get("error")).and_then(|e| e.get("code")).and_then(Value::as_str);
    match own.and_then(sanitize_code) {
        Some(code) => Some(code.to_owned()),
        None if context_length_exceeded(status, body) => Some("context_length_exceeded".to_owned()),
        None => unsupported_content(status, body).then(|| UNSUPPORTED_CONTENT.to_owned()),
    }
}

/// The code of a provider's refusal of the request's kind of content (an
/// image, audio or a file for a model that reads text only): [`code`] gives
/// it, [`refuses_content`] reads it.
pub const UNSUPPORTED_CONTENT: &str = "unsupported_content";

/// Whether an error answer says the model cannot take an input of the
/// request (llama.cpp's 500 "image input is not supported", Ollama's and LM
/// Studio's "does not support images", vLLM's "is not a multimodal model").
/// The request can never succeed on that provider, so it is the client's
/// error: not retried, not held against the provider. Any 4xx but a
/// refused credential or a rate limit, and 500/501 (llama.cpp answers 500).
pub fn unsupported_content(status: u16, body: &[u8]) -> bool {
    if !matches!(status, 400..=501) || matches!(status, 401 | 403 | 429) {
        return false;
    }
    let Ok(value) = serde_json::from_slice::<Value>(body) else { return false };
    const WORDING: [&str; 8] = [
        "image input is not supported",
        "audio input is not supported",
        "file input is not supported",
        "does not support image",
        "does not support vision",
        "does not support audio",
        "is not a multimodal model",
        "multimodal input is not supported",
    ];
    let said = message(&value).map(str::to_lowercase).unwrap_or_default();
    WORDING.iter().any(|w| said.contains(w))
}

/// Whether a run failed because its provider cannot take the request's
/// content ([`unsupported_content`], as the node or the Edge coded it).
pub fn refuses_content(failure: &crate::pb::ExecutionFailure) -> bool {
    failure.kind() == crate::pb::FailureKind::ProviderHttpStatus
        && failure.provider_code == UNSUPPORTED_CONTENT
        && !rejects_credential(failure.provider_status)
        && failure.provider_status != 429
}

/// Whether a provider's HTTP status says it refused the credential it was
/// given (401, 403). The client's own key was checked by the Edge, so this
/// is never the client's fault: the provider's credential (a managed one,
/// or one configured on its server) is broken.
pub fn rejects_credential(status: u32) -> bool {
    matches!(status, 401 | 403)
}

/// Whether an error answer says the request did not fit the model's
/// context window: OpenAI's `context_length_exceeded` code, llama.cpp's
/// `exceed_context_size_error` type, or the wording vLLM, Ollama, LM Studio
/// and others put in the message. Only 400 and 413 answers qualify.
pub fn context_length_exceeded(status: u16, body: &[u8]) -> bool {
    if !matches!(status, 400 | 413) {
        return false;
    }
    let Ok(value) = serde_json::from_slice::<Value>(body) else { return false };
    let error = value.get("error").unwrap_or(&value);
    let tagged = ["code", "type"].iter().any(|key| {
        error.get(key).and_then(Value::as_str).is_some_and(|v| {
            matches!(v, "context_length_exceeded" | "exceed_context_size_error" | "string_above_max_length")
        })
    });
    const WORDING: [&str; 6] = [
        "context length",
        "context window",
        "context size",
        "maximum context",
        "prompt is too long",
        "input length exceeds",
    ];
    let said = message(&value).map(str::to_lowercase).unwrap_or_default();
    tagged || WORDING.iter().any(|w| said.contains(w))
}

/// A `Retry-After` header value in milliseconds. Only the delta-seconds
/// form is read; an HTTP date (or anything else) is `None`, as if absent.
pub fn retry_after_ms(value: &str) -> Option<u64> {
    let seconds: u64 = value.trim().parse().ok()?;
    Some(seconds.saturating_mul(1000))
}

#[cfg(test)]
mod tests;
