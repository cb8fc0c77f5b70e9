//! Every error a client can see, mapped once to an HTTP status and to each
//! API's own error shape.

use axum::http::StatusCode;
use iop_proto::pb::{self, FailureKind};
use iop_proto::provider_error::{refuses_content, rejects_credential, sanitize_code};
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
    /// The request carries images and no provider of the model reads them
    /// (as declared, or as their servers said): refused before any is
    /// called.
    #[error("the model `{0}` does not accept images: no provider serving it reads them")]
    ImagesNotAccepted(String),
    /// The model is known but no provider for it is on a ready node.
    #[error("no provider for model `{0}` is available right now")]
    NoProviderAvailable(String),
    /// Every provider of the model is at capacity and its queue is full.
    #[error("too many requests for model `{0}`: its queue is full, retry later")]
    QueueFull(String),
    /// The Edge holds as many request bodies as `limits.max_body_bytes_in_flight`
    /// allows (`crate::http::body`).
    #[error("the gateway is holding as many request bodies as it may right now, retry shortly")]
    Overloaded,
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
            Self::InvalidRequest { .. } | Self::ImagesNotAccepted(_) => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Self::ModelNotAllowed(_) | Self::OriginNotAllowed | Self::HostNotAllowed => StatusCode::FORBIDDEN,
            Self::WorkspaceRevoked(_) => StatusCode::FORBIDDEN,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::ModelNotFound(_) => StatusCode::NOT_FOUND,
            Self::NoProviderAvailable(_) | Self::QueueTimeout(_) | Self::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            Self::QueueFull(_) | Self::TooManyJobs(_) | Self::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Self::WorkspaceNotFound(_) => StatusCode::NOT_FOUND,
            Self::WorkspaceUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Job(failure) => job_status(*failure),
            Self::Execution(f) => match f.kind() {
                FailureKind::InvalidRequest => StatusCode::BAD_REQUEST,
                // Client errors the provider reported keep their status so the
                // client sees the provider's reason (context length, auth, ...).
                // A model that cannot take the request's content (llama.cpp
                // answers 500): the client's error, never retried.
                FailureKind::ProviderHttpStatus if refuses_content(f) => StatusCode::BAD_REQUEST,
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
            Self::NoProviderAvailable(_) | Self::QueueFull(_) | Self::QueueTimeout(_) | Self::Overloaded => Some(1),
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
            // The code a provider's own refusal of the content gets too.
            Self::ImagesNotAccepted(_) => "unsupported_content",
            Self::NoProviderAvailable(_) => "no_provider_available",
            Self::QueueFull(_) => "queue_full",
            Self::QueueTimeout(_) => "queue_timeout",
            Self::Overloaded => "overloaded",
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
                FailureKind::ProviderHttpStatus if refuses_content(f) => "unsupported_content",
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
mod tests;
