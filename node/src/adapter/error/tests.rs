use super::*;

#[test]
fn to_failure_maps_every_variant() {
    let f = AdapterError::Unreachable("connect refused".into()).to_failure();
    assert_eq!(f.kind(), pb::FailureKind::ProviderUnreachable);
    assert!(f.message.contains("connect refused"));

    let f = AdapterError::HttpStatus {
        status: 429,
        retry_after_ms: Some(2000),
        message: "slow down".into(),
        context_length: false,
        code: Some("rate_limit_exceeded".into()),
    }
    .to_failure();
    assert_eq!(f.provider_code, "rate_limit_exceeded");
    assert_eq!(f.kind(), pb::FailureKind::ProviderHttpStatus);
    assert_eq!((f.provider_status, f.retry_after_ms), (429, 2000));
    assert_eq!(f.message, "provider answered HTTP 429: slow down");

    let f = AdapterError::HttpStatus {
        status: 500,
        retry_after_ms: None,
        message: "x".into(),
        context_length: false,
        code: Some("Not A Code".into()),
    }
    .to_failure();
    assert_eq!((f.provider_status, f.retry_after_ms), (500, 0));
    assert_eq!(f.provider_code, "", "an unsanitary code is dropped, not repaired");

    let f = AdapterError::StreamCut("reset".into()).to_failure();
    assert_eq!(f.kind(), pb::FailureKind::ProviderStreamCut);

    let f = AdapterError::TooLarge("line".into()).to_failure();
    assert_eq!(f.kind(), pb::FailureKind::ResponseTooLarge);

    let f = AdapterError::Protocol("bad chunk".into()).to_failure();
    assert_eq!(f.kind(), pb::FailureKind::ProviderProtocol);
    assert_eq!((f.provider_status, f.retry_after_ms), (0, 0));

    assert_eq!(AdapterError::InvalidRequest("x".into()).to_failure().kind(), pb::FailureKind::InvalidRequest);
    assert_eq!(AdapterError::SinkClosed.to_failure().kind(), pb::FailureKind::Internal);
}

#[test]
fn provider_error_messages_are_extracted_and_truncated() {
    assert_eq!(
        provider_error_message(br#"{"error":{"message":"bad model","type":"x"}}"#).as_deref(),
        Some("bad model")
    );
    assert_eq!(provider_error_message(br#"{"error":"model 'x' not found"}"#).as_deref(), Some("model 'x' not found"));
    assert_eq!(
        provider_error_message(br#"{"object":"error","message":"vllm says no"}"#).as_deref(),
        Some("vllm says no")
    );
    assert_eq!(provider_error_message(b"<html>oops</html>"), None);
    assert_eq!(provider_error_message(br#"{"error":{"code":1}}"#), None);
    let long = format!(r#"{{"error":"{}"}}"#, "\u{e9}".repeat(800));
    assert_eq!(provider_error_message(long.as_bytes()).unwrap().chars().count(), 500);
}

#[test]
fn json_errors_never_quote_payload() {
    let e = serde_json::from_str::<u32>(r#""secret prompt""#).unwrap_err();
    assert!(!json_error_summary(&e).contains("secret"));
}
