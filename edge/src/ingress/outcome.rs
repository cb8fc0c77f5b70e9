//! Run outcomes as the renderers and aggregators of all three APIs see them:
//! how a run ended ([`Terminal`]), the failure a client gets when it did not
//! complete, synthetic ids and token counts.

use iop_proto::pb;

use super::error::ApiError;

/// How a run ended, as the transcript keeps it until `finish`.
#[derive(Debug)]
pub(super) enum Terminal {
    Completed { finish_reason: i32 },
    Failed(pb::ExecutionFailure),
    Cancelled { reason: i32 },
}

/// The finish reason of a completed run; otherwise `ApiError::Execution`
/// with the run's failure, the failure its cancellation stands for, or
/// `TransportLost` when the run ended without a terminal event.
pub(super) fn finish_reason(terminal: Option<Terminal>) -> Result<i32, ApiError> {
    match terminal {
        Some(Terminal::Completed { finish_reason }) => Ok(finish_reason),
        Some(Terminal::Failed(f)) => Err(ApiError::Execution(f)),
        Some(Terminal::Cancelled { reason }) => Err(ApiError::Execution(cancelled_failure(reason))),
        None => Err(ApiError::Execution(pb::ExecutionFailure::new(
            pb::FailureKind::TransportLost,
            "the run ended without a terminal event",
        ))),
    }
}

/// The failure a Failed event carries (`Internal` if it carries none).
pub(super) fn failure_of(failed: &pb::RunFailed) -> pb::ExecutionFailure {
    failed.failure.clone().unwrap_or_else(|| {
        pb::ExecutionFailure::new(pb::FailureKind::Internal, "the run failed without a failure description")
    })
}

fn cancelled_failure(reason: i32) -> pb::ExecutionFailure {
    match pb::CancelReason::try_from(reason) {
        Ok(pb::CancelReason::Deadline) => pb::ExecutionFailure::new(
            pb::FailureKind::DeadlineExceeded,
            "the run was cancelled: the request's time budget ran out",
        ),
        Ok(pb::CancelReason::EdgeShutdown) => pb::ExecutionFailure::new(
            pb::FailureKind::TransportLost,
            "the run was cancelled: the edge is shutting down",
        ),
        _ => pb::ExecutionFailure::new(pb::FailureKind::Internal, "the run was cancelled before it completed"),
    }
}

/// `(prompt, completion)` tokens; `(0, 0)` when the run reported no usage.
pub(super) fn usage_pair(usage: Option<&pb::Usage>) -> (u32, u32) {
    usage.map_or((0, 0), |u| (u.prompt_tokens, u.completion_tokens))
}

/// `prefix` followed by 32 hex digits (a v4 UUID, simple form), e.g.
/// `synthetic_id("resp_")`.
pub(super) fn synthetic_id(prefix: &str) -> String {
    format!("{prefix}{}", crate::ids::new_uuid().simple())
}

/// An OpenAI-style `call_…` id, for a provider that streamed a tool call
/// without an id (the proto says the first delta carries one; this keeps the
/// response valid if it did not).
pub(super) fn synthetic_call_id() -> String {
    synthetic_id("call_")
}
