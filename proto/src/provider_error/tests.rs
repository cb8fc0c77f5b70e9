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

/// Issue 45 item 5: a model that cannot take the request's content. The
/// request never succeeds there; it is the client's error.
#[test]
fn unsupported_content_is_recognized_and_coded() {
    let yes: [(u16, &[u8]); 5] = [
        // llama.cpp without a projector.
        (500, br#"{"error":{"code":500,"message":"image input is not supported - hint: if this is unexpected, you may need to provide the mmproj","type":"server_error"}}"#),
        (400, br#"{"error":"llama3.2 does not support images"}"#),
        (400, br#"{"error":"Model does not support images. Please use a model that does."}"#),
        (400, br#"{"object":"error","message":"Qwen/Qwen2-7B is not a multimodal model","type":"BadRequestError"}"#),
        (501, br#"{"error":{"message":"audio input is not supported"}}"#),
    ];
    for (status, body) in yes {
        assert!(unsupported_content(status, body), "{}", String::from_utf8_lossy(body));
        assert_eq!(code(status, body).as_deref(), Some(UNSUPPORTED_CONTENT));
    }
    let image = br#"{"error":"image input is not supported"}"#;
    // A refused credential, a rate limit and a gateway error are never it.
    for status in [401, 403, 429, 502, 503] {
        assert!(!unsupported_content(status, image), "{status}");
    }
    // Other errors, and a provider's own code, stay what they are.
    assert!(!unsupported_content(500, br#"{"error":"out of memory"}"#));
    let own = br#"{"error":{"message":"image input is not supported","code":"invalid_image"}}"#;
    assert_eq!(code(400, own).as_deref(), Some("invalid_image"));

    let mut failure = crate::pb::ExecutionFailure::new(crate::pb::FailureKind::ProviderHttpStatus, "x");
    failure.provider_status = 500;
    failure.provider_code = UNSUPPORTED_CONTENT.to_string();
    assert!(refuses_content(&failure));
    failure.provider_status = 403;
    assert!(!refuses_content(&failure), "a refused credential stays the gateway's failure");
    let unreachable = crate::pb::ExecutionFailure::new(crate::pb::FailureKind::ProviderUnreachable, "x");
    assert!(!refuses_content(&unreachable));
}
