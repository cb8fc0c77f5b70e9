//! Closed-enum decoding. prost stores enums as `i32`; a value we do not know,
//! or the zero `UNSPECIFIED` value, is never guessed at: it is a typed error.

use crate::pb;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("field `{field}` has unknown enum value {value}")]
    UnknownEnumValue { field: &'static str, value: i32 },
    #[error("field `{field}` is unspecified")]
    Unspecified { field: &'static str },
    #[error("required field `{field}` is missing")]
    MissingField { field: &'static str },
    #[error("unexpected message: expected {expected}")]
    UnexpectedMessage { expected: &'static str },
}

/// Largest `limits.max_body_bytes` the Edge accepts (64 MiB).
pub const MAX_REQUEST_BODY_BYTES: usize = 64 * 1024 * 1024;

/// Largest message a node accepts on a run's or tunnel's own call: the
/// request (`RunDownlink`, `TunnelDownlink`). Normalizing never makes a
/// request larger than the client's body (protobuf is denser than JSON); the
/// margin covers a tunnel's forwarded headers and rewritten model name.
/// Control-stream messages stay small and keep tonic's 4 MiB default.
pub const MAX_RUN_REQUEST_MESSAGE_BYTES: usize = MAX_REQUEST_BODY_BYTES + 16 * 1024 * 1024;

/// Largest message on a workspace call, either way: a write's content or a
/// read's result / a command's output (bounded by the workspace limits:
/// `max_output_bytes` at most 64 MiB) plus a margin. The only call whose
/// node messages the Edge decodes up to this size.
pub const MAX_WORKSPACE_MESSAGE_BYTES: usize = 64 * 1024 * 1024 + 64 * 1024;

/// Largest message a node sends on its control stream (`NodeToEdge`):
/// Register, NodeReady, health reports and command results, whose largest
/// part is an Ollama API answer the node caps at 1 MiB. tonic's default, and
/// what the node accepts of the Edge's control messages.
pub const MAX_CONTROL_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Largest message a node sends on a run's call (`RunUplink`): one event,
/// usually a few KiB of coalesced text. The large ones are a provider line
/// the node passes whole (it caps lines at 16 MiB) and an embeddings answer
/// (the node reads at most 64 MiB of JSON; a float takes at least ~8 bytes
/// of JSON there and 4 in protobuf).
pub const MAX_RUN_EVENT_MESSAGE_BYTES: usize = 32 * 1024 * 1024;

/// Largest message a node sends on a tunnel's call (`TunnelUplink`): a
/// response head or a body chunk (the node cuts bodies into 64 KiB frames).
pub const MAX_TUNNEL_FRAME_MESSAGE_BYTES: usize = 1024 * 1024;

/// Largest image accepted in a request (decoded), as the big providers
/// bound them; the Edge checks images clients send, the node images it
/// fetches by URL.
pub const MAX_IMAGE_BYTES: usize = 20 * 1024 * 1024;
/// The image types every provider that takes images reads.
pub const IMAGE_MEDIA_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

/// Largest encoded request the Edge puts into a `RunAssign` / `TunnelAssign`
/// on the control stream (32 KiB); a larger one goes down the execution's
/// own call. Inline, the node calls the provider one Edge round trip sooner
/// and the Edge sends one message less per run; the bound keeps what a run
/// can put in front of heartbeats and other assignments small.
pub const MAX_INLINE_REQUEST_BYTES: usize = 32 * 1024;

/// Decodes a wire enum, rejecting unknown values and the zero value.
pub fn closed_enum<E>(field: &'static str, value: i32) -> Result<E, WireError>
where
    E: TryFrom<i32> + Into<i32> + Copy,
{
    if value == 0 {
        return Err(WireError::Unspecified { field });
    }
    E::try_from(value).map_err(|_| WireError::UnknownEnumValue { field, value })
}

impl pb::RunRequest {
    /// Whether any message carries an image (a user's, or a tool result's):
    /// the request needs a provider whose model reads images.
    pub fn carries_images(&self) -> bool {
        self.messages.iter().any(|m| !m.images.is_empty())
    }
}

impl pb::RunEvent {
    /// True for the three events that end a run (completed, failed, cancelled).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self.event,
            Some(
                pb::run_event::Event::Completed(_)
                    | pb::run_event::Event::Failed(_)
                    | pb::run_event::Event::Cancelled(_)
            )
        )
    }
}

impl pb::RunEvent {
    /// Checks that the event is present and every enum in it is a known,
    /// specified value. The Edge applies this to every event a node sends.
    pub fn validate(&self) -> Result<(), WireError> {
        use pb::run_event::Event;
        match self.event.as_ref().ok_or(WireError::MissingField { field: "run_event.event" })? {
            Event::Completed(c) => {
                closed_enum::<pb::FinishReason>("completed.finish_reason", c.finish_reason).map(drop)
            }
            Event::Failed(f) => {
                let failure = f.failure.as_ref().ok_or(WireError::MissingField { field: "failed.failure" })?;
                closed_enum::<pb::FailureKind>("failure.kind", failure.kind).map(drop)
            }
            Event::Cancelled(c) => closed_enum::<pb::CancelReason>("cancelled.reason", c.reason).map(drop),
            Event::Started(_)
            | Event::Text(_)
            | Event::Reasoning(_)
            | Event::ToolCall(_)
            | Event::Usage(_)
            | Event::Embeddings(_) => Ok(()),
        }
    }
}

impl pb::ProviderTunnelFrame {
    /// True for the frames that end a tunnel (end, failed, cancelled).
    pub fn is_terminal(&self) -> bool {
        use pb::provider_tunnel_frame::Frame;
        matches!(self.frame, Some(Frame::End(_) | Frame::Failed(_) | Frame::Cancelled(_)))
    }

    /// Checks that the frame is present and its enums are known values.
    pub fn validate(&self) -> Result<(), WireError> {
        use pb::provider_tunnel_frame::Frame;
        match self.frame.as_ref().ok_or(WireError::MissingField { field: "tunnel_frame.frame" })? {
            Frame::Head(head) if head.status < 100 || head.status > 599 => {
                Err(WireError::UnknownEnumValue { field: "head.status", value: head.status as i32 })
            }
            Frame::Failed(f) => {
                let failure = f.failure.as_ref().ok_or(WireError::MissingField { field: "failed.failure" })?;
                closed_enum::<pb::FailureKind>("failure.kind", failure.kind).map(drop)
            }
            Frame::Cancelled(c) => closed_enum::<pb::CancelReason>("cancelled.reason", c.reason).map(drop),
            Frame::Head(_) | Frame::Body(_) | Frame::End(_) | Frame::Usage(_) => Ok(()),
        }
    }
}

/// Hop-by-hop headers (RFC 9110 section 7.6.1) plus the ones a relay must
/// set itself; never forwarded through a tunnel in either direction.
pub const HOP_BY_HOP_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];

/// Credential headers a client may send to the Edge; the Edge never relays
/// them to a provider (provider credentials are the node's business).
pub const CREDENTIAL_HEADERS: &[&str] =
    &["authorization", "x-api-key", "api-key", "cookie", "openai-organization", "openai-project"];

/// The client headers a tunnel relays to a provider: what the providers'
/// APIs read from a request, nothing else. An allowlist, so that headers a
/// provider (or a proxy in front of it) may trust never come from a client:
/// `x-forwarded-for` and `forwarded` (the client's claimed address),
/// `x-http-method-override`, cloud metadata and token headers
/// (`metadata-flavor`, `x-aws-ec2-metadata-token`, …), cookies and every
/// credential header ([`CREDENTIAL_HEADERS`]: the node adds the managed
/// one). `accept-encoding` is not relayed either: the node asks for an
/// uncompressed answer, which it can check for the managed credential.
/// Checked by the Edge when it builds the tunnel request and again by the
/// node before it calls the provider.
pub const RELAYED_REQUEST_HEADERS: &[&str] = &[
    "content-type",
    "accept",
    "user-agent",
    "x-request-id",
    "x-client-request-id",
    // OpenAI: opt-in API features.
    "openai-beta",
    // Anthropic: API version and opt-in features.
    "anthropic-version",
    "anthropic-beta",
];

/// The provider response headers a tunnel relays to the client: the body's
/// type, caching, request ids and rate-limit state (which SDKs read to back
/// off). Not relayed: `set-cookie` (a provider's session is the node's,
/// not the client's), `openai-organization`/`openai-project` (they name
/// the managed credential's account), `content-encoding` (the node asks for
/// none), `www-authenticate`, server and proxy headers, and everything
/// hop-by-hop.
pub const RELAYED_RESPONSE_HEADERS: &[&str] = &[
    "content-type",
    "cache-control",
    "x-request-id",
    "request-id",
    "retry-after",
    "retry-after-ms",
    "openai-processing-ms",
    "openai-version",
];

/// Prefixes of relayed response headers: the providers' rate-limit families
/// (`x-ratelimit-remaining-requests`, `anthropic-ratelimit-tokens-reset`, …).
pub const RELAYED_RESPONSE_HEADER_PREFIXES: &[&str] = &["x-ratelimit-", "anthropic-ratelimit-"];

/// Whether a client's header may cross a tunnel to the provider
/// ([`RELAYED_REQUEST_HEADERS`]).
pub fn relayable_request_header(name: &str) -> bool {
    RELAYED_REQUEST_HEADERS.iter().any(|allowed| allowed.eq_ignore_ascii_case(name))
}

/// Whether a provider's response header may cross a tunnel to the client
/// ([`RELAYED_RESPONSE_HEADERS`], [`RELAYED_RESPONSE_HEADER_PREFIXES`]).
pub fn relayable_response_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    RELAYED_RESPONSE_HEADERS.contains(&name.as_str())
        || RELAYED_RESPONSE_HEADER_PREFIXES.iter().any(|prefix| name.starts_with(prefix) && name.len() > prefix.len())
}

impl pb::ExecutionFailure {
    pub fn new(kind: pb::FailureKind, message: impl Into<String>) -> Self {
        Self { kind: kind.into(), message: message.into(), ..Default::default() }
    }
}

/// The only health/classification pairs stall evidence may carry. Anything
/// else (unspecified, unknown values, mismatched pairs) is normalized
/// fail-closed to unknown/health_unknown.
pub fn evidence_pair(health: i32, classification: i32) -> (pb::ProviderHealth, pb::LivenessClassification) {
    use pb::{LivenessClassification as C, ProviderHealth as H};
    let health = closed_enum::<H>("provider_health", health);
    let classification = closed_enum::<C>("liveness_classification", classification);
    match (health, classification) {
        (Ok(H::Available), Ok(C::RequestStalled)) => (H::Available, C::RequestStalled),
        (Ok(H::Unavailable), Ok(C::ProviderUnhealthy)) => (H::Unavailable, C::ProviderUnhealthy),
        _ => (H::Unknown, C::HealthUnknown),
    }
}

/// The classification a probe verdict implies.
pub fn classify(health: pb::ProviderHealth) -> pb::LivenessClassification {
    match health {
        pb::ProviderHealth::Available => pb::LivenessClassification::RequestStalled,
        pb::ProviderHealth::Unavailable => pb::LivenessClassification::ProviderUnhealthy,
        pb::ProviderHealth::Unknown | pb::ProviderHealth::Unspecified => pb::LivenessClassification::HealthUnknown,
    }
}

impl pb::CommandLimit {
    /// The limit as metrics and tool results name it (closed); `None` for
    /// no limit.
    pub fn label(self) -> Option<&'static str> {
        use pb::CommandLimit as L;
        match self {
            L::Unspecified => None,
            L::Processes => Some("processes"),
            L::Memory => Some("memory"),
            L::Cpu => Some("cpu"),
            L::FileSize => Some("file_size"),
            L::Disk => Some("disk"),
        }
    }
}

impl pb::SandboxGap {
    /// The gap as logs and `/admin/v1/nodes` name it (closed).
    pub fn label(self) -> &'static str {
        use pb::SandboxGap as G;
        match self {
            G::Unspecified => "unspecified",
            G::SignalScope => "signal_scope",
            G::Tcp => "tcp",
            G::ReservedWritable => "reserved_writable",
            G::BoundingSet => "bounding_set",
            G::Priority => "priority",
        }
    }
}

impl pb::WorkspaceToolErrorCode {
    /// The code as logs, metrics and tool results name it (closed).
    pub fn label(self) -> &'static str {
        use pb::WorkspaceToolErrorCode as C;
        match self {
            C::Unspecified => "unspecified",
            C::InvalidPath => "invalid_path",
            C::Reserved => "reserved",
            C::NotFound => "not_found",
            C::Symlink => "symlink",
            C::CrossDevice => "cross_device",
            C::NotADirectory => "not_a_directory",
            C::IsADirectory => "is_a_directory",
            C::SpecialFile => "special_file",
            C::Exists => "exists",
            C::NotEmpty => "not_empty",
            C::TooLarge => "too_large",
            C::ParentChanged => "parent_changed",
            C::Io => "io",
            C::Denied => "denied",
            C::SpawnFailed => "spawn_failed",
            C::NotOpen => "not_open",
            C::Busy => "busy",
            C::DuplicateCall => "duplicate_call",
            C::InvalidRequest => "invalid_request",
            C::SandboxUnavailable => "sandbox_unavailable",
            C::SandboxFailed => "sandbox_failed",
        }
    }
}

impl pb::WorkspaceToolResponse {
    /// The outcome as one closed label: `ok`, a command's `exit_nonzero`,
    /// `timed_out` or `cancelled`, or the error code's label.
    pub fn result_label(&self) -> &'static str {
        use pb::workspace_tool_response::Result as R;
        match &self.result {
            Some(R::Command(c)) if c.cancelled => "cancelled",
            Some(R::Command(c)) if c.limit_exceeded().label().is_some() => "limit_exceeded",
            Some(R::Command(c)) if c.timed_out => "timed_out",
            Some(R::Command(c)) if c.exit_code != Some(0) => "exit_nonzero",
            Some(R::Read(_) | R::List(_) | R::Write(_) | R::Delete(_) | R::Command(_)) => "ok",
            Some(R::Error(e)) => e.code().label(),
            None => "invalid_request",
        }
    }
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests;
