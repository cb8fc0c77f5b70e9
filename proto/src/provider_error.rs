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
        None => context_length_exceeded(status, body).then(|| "context_length_exceeded".to_owned()),
    }
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
mod tests {
    use super::*;

    #[test]
    fn context_window_errors_are_recognized_and_nothing_else() {
        let yes: [&[u8]; 5] = [
            br#"{"error":{"message":"too long","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
            br#"{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error"}}"#,
            br#"{"object":"error","message":"This model's maximum context length is 8192 tokens. However, you requested 9000 tokens"}"#,
            br#"{"error":"input length exceeds the context length"}"#,
            br#"{"error":{"message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
        ];
        for body in yes {
            assert!(context_length_exceeded(400, body), "{}", String::from_utf8_lossy(body));
        }
        assert!(!context_length_exceeded(500, yes[0]), "only client errors");
        for body in [br#"{"error":{"message":"model not found"}}"#.as_slice(), b"<html>context length</html>"] {
            assert!(!context_length_exceeded(400, body));
        }
    }

    #[test]
    fn only_closed_alphabet_codes_pass() {
        for good in ["content_policy_violation", "context_length_exceeded", "rate-limit.v2", "x"] {
            assert_eq!(sanitize_code(good), Some(good));
        }
        let long = "a".repeat(MAX_CODE_CHARS + 1);
        for bad in ["", "Content_Policy", "a b", "a\nb", "<script>", "code=1", "é", long.as_str()] {
            assert_eq!(sanitize_code(bad), None, "{bad:?}");
        }
        assert_eq!(sanitize_code(&"a".repeat(MAX_CODE_CHARS)).map(str::len), Some(MAX_CODE_CHARS));
    }

    #[test]
    fn a_providers_code_is_read_from_its_error_body() {
        let openai = br#"{"error":{"message":"no","type":"invalid_request_error","code":"content_policy_violation"}}"#;
        assert_eq!(code(400, openai).as_deref(), Some("content_policy_violation"));
        // A numeric code (llama.cpp repeats the status) or a bad one is no code.
        assert_eq!(code(400, br#"{"error":{"code":400,"message":"bad"}}"#), None);
        assert_eq!(code(400, br#"{"error":{"code":"Bad Code!","message":"bad"}}"#), None);
        // Ollama's plain string: a code only when classified.
        assert_eq!(code(400, br#"{"error":"model 'x' not found"}"#), None);
        let ollama_long = br#"{"error":"input length exceeds the context length"}"#;
        assert_eq!(code(400, ollama_long).as_deref(), Some("context_length_exceeded"));
        assert_eq!(code(500, b"<html>oops</html>"), None);
    }

    #[test]
    fn messages_are_found_in_every_common_shape() {
        let of = |body: &str| message(&serde_json::from_str(body).unwrap()).map(str::to_string);
        assert_eq!(of(r#"{"error":{"message":"bad model","type":"x"}}"#).as_deref(), Some("bad model"));
        assert_eq!(of(r#"{"error":"model 'x' not found"}"#).as_deref(), Some("model 'x' not found"));
        assert_eq!(of(r#"{"object":"error","message":"vllm says no"}"#).as_deref(), Some("vllm says no"));
        assert_eq!(of(r#"{"detail":"  "}"#), None);
    }

    #[test]
    fn retry_after_takes_delta_seconds_only() {
        assert_eq!(retry_after_ms("2"), Some(2000));
        assert_eq!(retry_after_ms(" 0 "), Some(0));
        assert_eq!(retry_after_ms("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(retry_after_ms("-1"), None);
        assert_eq!(retry_after_ms(&u64::MAX.to_string()), Some(u64::MAX), "saturates");
    }
}
