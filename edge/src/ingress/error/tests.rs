use super::*;

fn failure(kind: FailureKind, status: u32) -> ApiError {
    let mut f = pb::ExecutionFailure::new(kind, "boom");
    f.provider_status = status;
    ApiError::Execution(f)
}

#[test]
fn provider_client_errors_keep_their_status_and_server_errors_become_502() {
    assert_eq!(failure(FailureKind::ProviderHttpStatus, 400).status(), StatusCode::BAD_REQUEST);
    assert_eq!(failure(FailureKind::ProviderHttpStatus, 429).status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(failure(FailureKind::ProviderHttpStatus, 503).status(), StatusCode::BAD_GATEWAY);
    assert_eq!(failure(FailureKind::ResponseStalled, 0).status(), StatusCode::GATEWAY_TIMEOUT);
    let too_large = failure(FailureKind::ResponseTooLarge, 0);
    assert_eq!((too_large.status(), too_large.code()), (StatusCode::BAD_GATEWAY, "response_too_large"));
    assert_eq!(too_large.openai_body()["error"]["code"], "response_too_large");
    assert_eq!(too_large.anthropic_body()["error"]["type"], "api_error");
}

/// Issue 45 item 5: llama.cpp's 500 "image input is not supported" (coded
/// `unsupported_content` by the node) is the client's 400, in each API.
#[test]
fn a_model_that_cannot_take_the_content_is_the_clients_400() {
    let mut refused = pb::ExecutionFailure::new(FailureKind::ProviderHttpStatus, "image input is not supported");
    refused.provider_status = 500;
    refused.provider_code = iop_proto::provider_error::UNSUPPORTED_CONTENT.to_string();
    let err = ApiError::Execution(refused);
    assert_eq!((err.status(), err.code()), (StatusCode::BAD_REQUEST, "unsupported_content"));
    assert_eq!(err.openai_body()["error"]["type"], "invalid_request_error");
    assert_eq!(err.anthropic_body()["error"]["type"], "invalid_request_error");
    assert_eq!(err.retry_after_secs(), None, "not a temporary failure");
}

/// A provider's context-length 400 (what llama.cpp's server answers to a
/// prompt longer than its context) is each API's own context error:
/// OpenAI's `context_length_exceeded` code and Anthropic's `prompt is too
/// long` wording, which clients act on (compacting, truncating).
#[test]
fn a_context_length_error_is_each_apis_own() {
    let mut too_long = pb::ExecutionFailure::new(
        FailureKind::ProviderHttpStatus,
        "provider answered HTTP 400: request (441 tokens) exceeds the available context size (256 tokens)",
    );
    too_long.provider_status = 400;
    too_long.context_length_exceeded = true;
    let err = ApiError::Execution(too_long.clone());
    assert_eq!((err.status(), err.code()), (StatusCode::BAD_REQUEST, "context_length_exceeded"));
    let openai = err.openai_body();
    assert_eq!(openai["error"]["code"], "context_length_exceeded");
    assert_eq!(openai["error"]["type"], "invalid_request_error");
    assert_eq!(openai["error"]["message"], too_long.message, "the provider's reason");
    let anthropic = err.anthropic_body();
    assert_eq!(anthropic["error"]["type"], "invalid_request_error");
    let message = anthropic["error"]["message"].as_str().unwrap();
    assert_eq!(message, format!("prompt is too long: {}", too_long.message));

    // Any other provider 400 keeps its code and message.
    too_long.context_length_exceeded = false;
    let other = ApiError::Execution(too_long.clone());
    assert_eq!(other.code(), "provider_http_status");
    assert_eq!(other.anthropic_body()["error"]["message"], too_long.message);
}

/// Issue 28 item 5: a provider's own code reaches the client in each
/// API's shape with the provider's status; the metric code stays closed.
#[test]
fn a_providers_own_code_is_passed_through_and_checked_again() {
    let mut refused = pb::ExecutionFailure::new(
        FailureKind::ProviderHttpStatus,
        "provider answered HTTP 400: Your request was rejected by the safety system",
    );
    refused.provider_status = 400;
    refused.provider_code = "content_policy_violation".into();
    let err = ApiError::Execution(refused.clone());
    assert_eq!(err.status(), StatusCode::BAD_REQUEST);
    assert_eq!(err.code(), "provider_http_status", "the metric label stays closed");
    assert_eq!(err.client_code(), "content_policy_violation");
    assert_eq!(err.openai_body()["error"]["code"], "content_policy_violation");
    assert_eq!(err.openai_body()["error"]["type"], "invalid_request_error");
    let anthropic = err.anthropic_body();
    assert_eq!(anthropic["error"]["type"], "invalid_request_error");
    assert_eq!(anthropic["error"]["message"], format!("content_policy_violation: {}", refused.message));

    // A node sending anything outside the closed alphabet: dropped.
    for bad in ["Content Policy", "<b>", "x\ny", &"a".repeat(65)] {
        refused.provider_code = bad.into();
        let err = ApiError::Execution(refused.clone());
        assert_eq!(err.client_code(), "provider_http_status", "{bad:?}");
        assert_eq!(err.anthropic_body()["error"]["message"], refused.message);
    }
    // A refused provider credential keeps the gateway's code.
    refused.provider_status = 401;
    refused.provider_code = "invalid_api_key".into();
    assert_eq!(ApiError::Execution(refused.clone()).client_code(), "provider_credential_rejected");
    // Only provider HTTP errors carry one.
    let mut cut = pb::ExecutionFailure::new(FailureKind::ProviderStreamCut, "reset");
    cut.provider_code = "content_policy_violation".into();
    let cut = ApiError::Execution(cut);
    assert_eq!(
        (cut.status(), cut.code(), cut.client_code()),
        (StatusCode::BAD_GATEWAY, "provider_stream_cut", "provider_stream_cut")
    );
    assert_eq!(cut.anthropic_body()["error"]["type"], "api_error");
    // A 5xx with its own code: the code passes, the status is the gateway's.
    let mut overloaded = pb::ExecutionFailure::new(FailureKind::ProviderHttpStatus, "busy");
    overloaded.provider_status = 503;
    overloaded.provider_code = "server_overloaded".into();
    let overloaded = ApiError::Execution(overloaded);
    assert_eq!((overloaded.status(), overloaded.client_code()), (StatusCode::BAD_GATEWAY, "server_overloaded"));
}

#[test]
fn openai_shape_names_param_and_code() {
    let body = ApiError::ModelNotFound("x".into()).openai_body();
    assert_eq!(body["error"]["param"], "model");
    assert_eq!(body["error"]["code"], "model_not_found");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let body = ApiError::invalid_param("messages", "messages must be an array").openai_body();
    assert_eq!(body["error"]["message"], "messages must be an array");
}

#[test]
fn messages_quoting_client_input_are_capped() {
    let huge = "é".repeat(100_000);
    let err = ApiError::ModelNotFound(huge.clone());
    for message in [err.openai_body()["error"]["message"].clone(), err.anthropic_body()["error"]["message"].clone()] {
        let message = message.as_str().unwrap().to_string();
        assert_eq!(message.chars().count(), MAX_MESSAGE_CHARS + 1, "cut, plus the ellipsis");
        assert!(message.starts_with("the model `éé") && message.ends_with("é…"), "{}", &message[..40]);
    }
    let short = ApiError::ModelNotFound("llama3".into());
    assert_eq!(short.message(), "the model `llama3` does not exist", "short messages are untouched");
}

#[test]
fn auth_errors_are_401_and_403_with_their_codes() {
    let cases = [
        (ApiError::Unauthenticated(AuthFailure::Missing), 401, "authentication_error", "missing_api_key"),
        (ApiError::Unauthenticated(AuthFailure::Unknown), 401, "authentication_error", "invalid_api_key"),
        (ApiError::Unauthenticated(AuthFailure::Disabled), 401, "authentication_error", "api_key_disabled"),
        (ApiError::Unauthenticated(AuthFailure::Expired), 401, "authentication_error", "api_key_expired"),
        (ApiError::ModelNotAllowed("m".into()), 403, "permission_error", "model_not_allowed"),
        // A running job whose grant or workspace a reload removed.
        (ApiError::WorkspaceRevoked("site".into()), 403, "permission_error", "workspace_revoked"),
    ];
    for (err, status, kind, code) in cases {
        assert_eq!(err.status().as_u16(), status);
        let body = err.openai_body();
        assert_eq!((body["error"]["type"].as_str(), body["error"]["code"].as_str()), (Some(kind), Some(code)));
        assert_eq!(err.anthropic_body()["error"]["type"], kind);
    }
}

#[test]
fn anthropic_shape_types_by_status() {
    let execution = |kind: FailureKind| ApiError::Execution(pb::ExecutionFailure::new(kind, "boom"));
    let cases: Vec<(ApiError, &str)> = vec![
        (ApiError::invalid_param("max_tokens", "max_tokens: Field required"), "invalid_request_error"),
        (ApiError::PayloadTooLarge { limit: 10 }, "request_too_large"),
        // A provider refusing its own credential is a gateway failure
        // (issue 25 item 6), never the client's key.
        (failure(FailureKind::ProviderHttpStatus, 401), "api_error"),
        (failure(FailureKind::ProviderHttpStatus, 403), "api_error"),
        (ApiError::ModelNotFound("x".into()), "not_found_error"),
        (ApiError::Unauthenticated(AuthFailure::Missing), "authentication_error"),
        (ApiError::Unauthenticated(AuthFailure::Disabled), "authentication_error"),
        (ApiError::ModelNotAllowed("x".into()), "permission_error"),
        (failure(FailureKind::ProviderHttpStatus, 422), "invalid_request_error"),
        (failure(FailureKind::ProviderHttpStatus, 429), "rate_limit_error"),
        (ApiError::Internal, "api_error"),
        (failure(FailureKind::ProviderHttpStatus, 503), "api_error"),
        (execution(FailureKind::ProviderUnreachable), "api_error"),
        (ApiError::NoProviderAvailable("x".into()), "overloaded_error"),
        (execution(FailureKind::ResponseStalled), "timeout_error"),
        (execution(FailureKind::DeadlineExceeded), "timeout_error"),
    ];
    for (err, want) in cases {
        let body = err.anthropic_body();
        assert_eq!(body, json!({"type": "error", "error": {"type": want, "message": err.to_string()}}), "{err:?}");
    }
    let body = ApiError::ModelNotFound("claude-x".into()).anthropic_body();
    assert_eq!(body["error"]["message"], "the model `claude-x` does not exist");
}

/// Refusals before a handler and job limits: one status, one closed
/// code, each API's own error type; only the job limit says when to
/// come back.
#[test]
fn cross_site_refusals_and_job_limits_map_to_their_status() {
    use crate::job::slots::JobLimit;
    let cases = [
        (ApiError::UnsupportedMediaType, 415, "unsupported_media_type", "invalid_request_error", None),
        (ApiError::OriginNotAllowed, 403, "origin_not_allowed", "permission_error", None),
        (ApiError::HostNotAllowed, 403, "host_not_allowed", "permission_error", None),
        (ApiError::TooManyJobs(JobLimit::Workspace), 429, "too_many_jobs", "rate_limit_error", Some(5)),
        (ApiError::TooManyJobs(JobLimit::Principal), 429, "too_many_jobs", "rate_limit_error", Some(5)),
    ];
    for (err, status, code, kind, retry) in cases {
        assert_eq!((err.status().as_u16(), err.code(), err.retry_after_secs()), (status, code, retry), "{err:?}");
        assert_eq!(err.openai_body()["error"]["type"], kind, "{err:?}");
        assert_eq!(err.anthropic_body()["error"]["type"], kind, "{err:?}");
    }
    assert_ne!(
        ApiError::TooManyJobs(JobLimit::Workspace).message(),
        ApiError::TooManyJobs(JobLimit::Principal).message(),
        "the message says which limit"
    );
}

/// Per-key limits: 429, OpenAI's `rate_limit_exceeded` typed by the
/// limit, Anthropic's `rate_limit_error`; the message names the limit
/// (and the replica's share), the Retry-After is whole seconds.
#[test]
fn rate_limits_are_429_in_each_apis_shape() {
    use crate::ratelimit::{Limit, Refusal, Status};
    let refusal = |limit, replicas, retry_ms| {
        ApiError::RateLimited(Box::new(Refusal {
            limit,
            share: 3,
            configured: if replicas > 1 { 5 } else { 3 },
            replicas,
            retry_after: std::time::Duration::from_millis(retry_ms),
            status: Status::default(),
        }))
    };
    let cases = [
        (refusal(Limit::Requests, 1, 19_001), "requests", 20, "requests per minute on this API key: limit 3."),
        (refusal(Limit::Tokens, 1, 1), "tokens", 1, "tokens per minute on this API key: limit 3."),
        (
            refusal(Limit::Concurrency, 2, 1000),
            "requests",
            1,
            "requests at once on this API key: limit 3 on this gateway replica (5 across 2 replicas).",
        ),
    ];
    for (err, kind, retry, message) in cases {
        assert_eq!(
            (err.status().as_u16(), err.code(), err.retry_after_secs()),
            (429, "rate_limit_exceeded", Some(retry))
        );
        let openai = err.openai_body();
        assert_eq!(openai["error"]["type"], kind);
        assert_eq!(openai["error"]["code"], "rate_limit_exceeded");
        assert!(openai["error"]["message"].as_str().unwrap().contains(message), "{openai}");
        assert!(openai["error"]["message"].as_str().unwrap().ends_with(&format!("try again in {retry}s.")));
        let anthropic = err.anthropic_body();
        assert_eq!(anthropic["error"]["type"], "rate_limit_error");
        assert!(anthropic["error"]["message"].as_str().unwrap().contains(message), "{anthropic}");
    }
}

#[test]
fn retry_after_rounds_up_to_seconds() {
    let mut f = pb::ExecutionFailure::new(FailureKind::ProviderHttpStatus, "slow down");
    f.provider_status = 429;
    f.retry_after_ms = 1500;
    assert_eq!(ApiError::Execution(f).retry_after_secs(), Some(2));
}
