//! Every error a client can see, mapped once to an HTTP status and to each
//! API's own error shape.

use axum::http::StatusCode;
use iop_proto::pb::{self, FailureKind};
use iop_proto::provider_error::{rejects_credential, sanitize_code};
use serde_json::{Value, json};

use crate::auth::AuthFailure;
use crate::job::state::JobFailure;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// Malformed JSON, missing or wrongly typed fields.
    #[error("{message}")]
    InvalidRequest { message: String, param: Option<String> },
    /// No key, an unknown key, or a disabled principal's key.
    #[error("{}", unauthenticated_message(*.0))]
    Unauthenticated(AuthFailure),
    /// The principal may not use this public model.
    #[error("this API key may not use the model `{0}`")]
    ModelNotAllowed(String),
    #[error("request body exceeds the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// The client stopped sending its request body.
    #[error("the request body did not arrive in time")]
    BodyTimeout,
    #[error("the model `{0}` does not exist")]
    ModelNotFound(String),
    /// The model is known but no provider for it is on a ready node.
    #[error("no provider for model `{0}` is available right now")]
    NoProviderAvailable(String),
    /// Every provider of the model is at capacity and its queue is full.
    #[error("too many requests for model `{0}`: its queue is full, retry later")]
    QueueFull(String),
    /// The request waited its whole queue timeout without a free slot.
    #[error("no capacity for model `{0}` became free within the queue timeout, retry later")]
    QueueTimeout(String),
    /// The provider or the transport failed before anything reached the client.
    #[error("{}", execution_message(.0))]
    Execution(pb::ExecutionFailure),
    /// `iop-workspace` names no workspace (or one its node refused): the
    /// answer says nothing of nodes or paths.
    #[error("no workspace `{0}` is available")]
    WorkspaceNotFound(String),
    /// The workspace's node is not ready right now.
    #[error("the workspace `{0}` is not available right now, retry later")]
    WorkspaceUnavailable(String),
    /// A running job's caller may no longer run jobs in the workspace (its
    /// grant or the workspace was removed by a reload): the job was
    /// stopped. One answer for both (`crate::job::standing`).
    #[error("the job was stopped: this caller may no longer run jobs in the workspace `{0}`")]
    WorkspaceRevoked(String),
    /// The workspace, or the caller, already runs as many jobs as its
    /// limit allows (`limits.max_concurrent_jobs`, the principal's).
    #[error("{}", too_many_jobs_message(*.0))]
    TooManyJobs(crate::job::slots::JobLimit),
    /// The caller is over one of its per-key limits (`crate::ratelimit`).
    #[error("{}", rate_limited_message(.0))]
    RateLimited(Box<crate::ratelimit::Refusal>),
    /// A single-request job failed (the closed reason).
    #[error("the job failed: {0}")]
    Job(crate::job::state::JobFailure),
    /// A `POST` body that is not `application/json` (cross-site protection).
    #[error("the request body must be JSON: send `Content-Type: application/json`")]
    UnsupportedMediaType,
    /// A request a web page sent (`Origin`) to a listener no page may use.
    #[error("requests from web pages (with an `Origin` header) are not accepted here")]
    OriginNotAllowed,
    /// With authentication disabled, a `Host` that does not name this
    /// machine (DNS rebinding).
    #[error(
        "with authentication disabled, only requests addressed to localhost or this listener's own address are accepted"
    )]
    HostNotAllowed,
    #[error("internal error")]
    Internal,
}

/// A failed job's status: the workspace's node went away (503, retry),
/// a deadline (504), the cleanup (500), anything the model did (502).
/// An execution failure's message: the provider's own words, said to be
/// about the provider's credential when it refused that.
fn execution_message(f: &pb::ExecutionFailure) -> String {
    if f.kind() == FailureKind::ProviderHttpStatus && rejects_credential(f.provider_status) {
        return format!(
            "the provider rejected its own credential (HTTP {}); this is not about your API key: {}",
            f.provider_status, f.message
        );
    }
    f.message.clone()
}

/// The provider refused the request as longer than the model's context
/// window (a client error it recognized as such; see
/// `iop_proto::provider_error::context_length_exceeded`).
fn context_length_exceeded(f: &pb::ExecutionFailure) -> bool {
    f.context_length_exceeded
        && f.kind() == FailureKind::ProviderHttpStatus
        && (400..500).contains(&f.provider_status)
        && !rejects_credential(f.provider_status)
}

/// The provider's own error code the client sees in place of
/// `provider_http_status`: only on a provider's HTTP error that is not a
/// refused credential (that one is the gateway's failure, never the
/// client's), and only when it passes [`sanitize_code`] again here (the node
/// is semi-trusted, the provider untrusted); anything else is dropped.
/// Never a metric label: [`ApiError::code`] stays the closed set.
fn passed_code(f: &pb::ExecutionFailure) -> Option<&str> {
    if f.kind() != FailureKind::ProviderHttpStatus || rejects_credential(f.provider_status) {
        return None;
    }
    sanitize_code(&f.provider_code)
}

fn job_status(failure: JobFailure) -> StatusCode {
    match failure {
        JobFailure::WorkspaceLost => StatusCode::SERVICE_UNAVAILABLE,
        JobFailure::StageDeadline | JobFailure::WallClock => StatusCode::GATEWAY_TIMEOUT,
        JobFailure::CleanupFailed | JobFailure::Internal | JobFailure::WorkspaceOpenFailed => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        JobFailure::IterationBudget
        | JobFailure::OutputBudget
        | JobFailure::ToolDenied
        | JobFailure::MalformedToolCall
        | JobFailure::UnexpectedToolCall
        | JobFailure::ModelFailed => StatusCode::BAD_GATEWAY,
    }
}

fn too_many_jobs_message(limit: crate::job::slots::JobLimit) -> &'static str {
    match limit {
        crate::job::slots::JobLimit::Workspace => "the workspace runs as many jobs as it may at once, retry later",
        crate::job::slots::JobLimit::Principal => "this caller runs as many jobs as it may at once, retry later",
    }
}

/// Names the limit and this replica's share of it, never the key.
fn rate_limited_message(r: &crate::ratelimit::Refusal) -> String {
    let what = r.limit.describe();
    let limit = if r.replicas > 1 {
        format!("limit {} on this gateway replica ({} across {} replicas)", r.share, r.configured, r.replicas)
    } else {
        format!("limit {}", r.share)
    };
    format!("Rate limit reached for {what} on this API key: {limit}. Please try again in {}s.", r.retry_after_secs())
}

fn unauthenticated_message(failure: AuthFailure) -> &'static str {
    match failure {
        AuthFailure::Missing => "missing API key: send it as `Authorization: Bearer KEY` or `x-api-key: KEY`",
        AuthFailure::Unknown => "invalid API key",
        AuthFailure::Disabled => "this API key is disabled",
        AuthFailure::Expired => "this API key has expired: ask for a new one",
    }
}

/// `Retry-After` of a job refused by a concurrency limit.
pub const TOO_MANY_JOBS_RETRY_SECS: u64 = 5;

/// The longest message a client sees, in characters. Messages quote what
/// the client sent (a model name, a block type, serde's `invalid type:
/// string "..."`) and a provider's error text; a megabyte-long model name
/// must not come back a megabyte long.
const MAX_MESSAGE_CHARS: usize = 1024;

impl ApiError {
    /// The message as clients see it: the error's text, cut to
    /// [`MAX_MESSAGE_CHARS`] with a trailing `…` when longer.
    pub fn message(&self) -> String {
        let mut text = self.to_string();
        if let Some((cut, _)) = text.char_indices().nth(MAX_MESSAGE_CHARS) {
            text.truncate(cut);
            text.push('…');
        }
        text
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::InvalidRequest { message: message.into(), param: None }
    }

    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        Self::InvalidRequest { message: message.into(), param: Some(param.to_string()) }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Self::ModelNotAllowed(_) | Self::OriginNotAllowed | Self::HostNotAllowed => StatusCode::FORBIDDEN,
            Self::WorkspaceRevoked(_) => StatusCode::FORBIDDEN,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::ModelNotFound(_) => StatusCode::NOT_FOUND,
            Self::NoProviderAvailable(_) | Self::QueueTimeout(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::QueueFull(_) | Self::TooManyJobs(_) | Self::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Self::WorkspaceNotFound(_) => StatusCode::NOT_FOUND,
            Self::WorkspaceUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Job(failure) => job_status(*failure),
            Self::Execution(f) => match f.kind() {
                FailureKind::InvalidRequest => StatusCode::BAD_REQUEST,
                // Client errors the provider reported keep their status so the
                // client sees the provider's reason (context length, auth, ...).
                FailureKind::ProviderHttpStatus => match f.provider_status {
                    // The provider refused its own credential: a gateway
                    // failure, never the client's key (SDKs would report a
                    // 401 as a bad client key).
                    s if rejects_credential(s) => StatusCode::BAD_GATEWAY,
                    s @ (400 | 404 | 413 | 422 | 429) => {
                        StatusCode::from_u16(s as u16).unwrap_or(StatusCode::BAD_GATEWAY)
                    }
                    _ => StatusCode::BAD_GATEWAY,
                },
                FailureKind::ProviderUnreachable | FailureKind::ProviderProtocol => StatusCode::BAD_GATEWAY,
                // The provider's answer broke after it started: a gateway
                // failure, whatever the client sent.
                FailureKind::ProviderStreamCut => StatusCode::BAD_GATEWAY,
                FailureKind::ResponseTooLarge | FailureKind::CredentialRejected => StatusCode::BAD_GATEWAY,
                FailureKind::TransportLost => StatusCode::BAD_GATEWAY,
                // Every provider's capacity was taken by other replicas' work.
                FailureKind::CapacityExhausted => StatusCode::SERVICE_UNAVAILABLE,
                FailureKind::ResponseStalled | FailureKind::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
                FailureKind::Internal | FailureKind::Unspecified => StatusCode::INTERNAL_SERVER_ERROR,
            },
        }
    }

    /// Seconds for a `Retry-After` header, when the client should retry later.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Self::NoProviderAvailable(_) | Self::QueueFull(_) | Self::QueueTimeout(_) => Some(1),
            Self::WorkspaceUnavailable(_) | Self::Job(JobFailure::WorkspaceLost) => Some(1),
            // Jobs take minutes: a client polling each second gains nothing.
            Self::TooManyJobs(_) => Some(TOO_MANY_JOBS_RETRY_SECS),
            Self::RateLimited(refusal) => Some(refusal.retry_after_secs()),
            Self::Execution(f) if f.retry_after_ms > 0 => Some(f.retry_after_ms.div_ceil(1000)),
            Self::Execution(f) if f.kind() == FailureKind::CapacityExhausted => Some(1),
            _ => None,
        }
    }

    /// Stable, low-cardinality code; also the metric label.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidRequest { .. } => "invalid_request",
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::BodyTimeout => "request_body_timeout",
            Self::Unauthenticated(failure) => failure.label(),
            Self::ModelNotAllowed(_) => "model_not_allowed",
            Self::ModelNotFound(_) => "model_not_found",
            Self::NoProviderAvailable(_) => "no_provider_available",
            Self::QueueFull(_) => "queue_full",
            Self::QueueTimeout(_) => "queue_timeout",
            Self::Internal => "internal",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::OriginNotAllowed => "origin_not_allowed",
            Self::HostNotAllowed => "host_not_allowed",
            Self::WorkspaceNotFound(_) => "workspace_not_found",
            Self::WorkspaceUnavailable(_) => "workspace_unavailable",
            Self::WorkspaceRevoked(_) => "workspace_revoked",
            Self::TooManyJobs(_) => "too_many_jobs",
            Self::RateLimited(_) => "rate_limit_exceeded",
            Self::Job(failure) => failure.label(),
            Self::Execution(f) => match f.kind() {
                FailureKind::ProviderUnreachable => "provider_unreachable",
                FailureKind::ProviderStreamCut => "provider_stream_cut",
                FailureKind::ProviderHttpStatus if rejects_credential(f.provider_status) => {
                    "provider_credential_rejected"
                }
                // A request too long for the model's context window, in
                // OpenAI's own code (clients compact or truncate on it).
                FailureKind::ProviderHttpStatus if context_length_exceeded(f) => "context_length_exceeded",
                FailureKind::ProviderHttpStatus => "provider_http_status",
                FailureKind::ProviderProtocol => "provider_protocol",
                FailureKind::ResponseTooLarge => "response_too_large",
                FailureKind::CredentialRejected => "credential_rejected",
                FailureKind::InvalidRequest => "invalid_request",
                FailureKind::TransportLost => "transport_lost",
                FailureKind::CapacityExhausted => "capacity_exhausted",
                FailureKind::ResponseStalled => "response_stalled",
                // The request's own budget (`limits.request_timeout_ms`).
                FailureKind::DeadlineExceeded => "request_timeout",
                FailureKind::Internal | FailureKind::Unspecified => "internal",
            },
        }
    }

    /// The code clients see: [`Self::code`], except that a provider's own
    /// error code (`content_policy_violation`, ...) replaces
    /// `provider_http_status` ([`passed_code`]). Not a metric label.
    pub fn client_code(&self) -> &str {
        self.provider_code().unwrap_or_else(|| self.code())
    }

    /// The provider's own error code, when the client sees it in place of
    /// `provider_http_status` ([`passed_code`]).
    pub fn provider_code(&self) -> Option<&str> {
        match self {
            Self::Execution(f) if self.code() == "provider_http_status" => passed_code(f),
            _ => None,
        }
    }

    /// OpenAI error object: `{"error":{"message","type","param","code"}}`.
    pub fn openai_body(&self) -> Value {
        let kind = match self.status().as_u16() {
            400 | 413 | 415 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "invalid_request_error",
            // OpenAI types its own rate-limit refusals by the limit.
            429 if let Self::RateLimited(r) = self => match r.limit {
                crate::ratelimit::Limit::Tokens => "tokens",
                crate::ratelimit::Limit::Requests | crate::ratelimit::Limit::Concurrency => "requests",
            },
            429 => "rate_limit_error",
            500 => "server_error",
            _ => "api_error",
        };
        let param = match self {
            Self::InvalidRequest { param, .. } => param.clone(),
            Self::ModelNotFound(_) | Self::ModelNotAllowed(_) => Some("model".to_string()),
            _ => None,
        };
        json!({ "error": { "message": self.message(), "type": kind, "param": param, "code": self.client_code() } })
    }

    /// Anthropic error object: `{"type":"error","error":{"type","message"}}`,
    /// typed by HTTP status as Anthropic documents it (other 4xx are
    /// `invalid_request_error`; 503 is `overloaded_error`, Anthropic's
    /// retryable "try again later"; other 5xx are `api_error`).
    pub fn anthropic_body(&self) -> Value {
        let kind = match self.status().as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            504 => "timeout_error",
            400..=499 => "invalid_request_error",
            _ => "api_error",
        };
        let message = match self {
            // Anthropic's own wording for a prompt longer than the context
            // window, which clients (Claude Code's compaction) look for.
            Self::Execution(f) if context_length_exceeded(f) => format!("prompt is too long: {}", self.message()),
            // Anthropic's `error.type` is a closed set: the provider's own
            // code leads the message instead.
            _ if let Some(code) = self.provider_code() => format!("{code}: {}", self.message()),
            _ => self.message(),
        };
        json!({ "type": "error", "error": { "type": kind, "message": message } })
    }
}

#[cfg(test)]
mod tests {
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
        for message in [err.openai_body()["error"]["message"].clone(), err.anthropic_body()["error"]["message"].clone()]
        {
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
}
