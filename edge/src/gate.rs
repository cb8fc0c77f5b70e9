//! The stream gate: one request's attempts, from admission to the commit
//! point. This is the one place where a failed attempt is retried.
//!
//! Events of an attempt are buffered until the commit point: the first
//! content (text, tool call, or a completion) for a streaming client, the
//! terminal event for a non-streaming one. Nothing reaches the client before
//! that, so an attempt that fails before it is retried on another provider
//! (connect failure, transport loss, 5xx, 429, stall, protocol error) with the
//! same request. Client errors (other 4xx, invalid request) are never
//! retried. Attempts are bounded by `limits.max_attempts` and share one
//! deadline, `limits.request_timeout_ms`. A 429's `Retry-After` is honoured
//! only when no untried provider is eligible and the wait fits the budget;
//! retrying the same provider otherwise backs off exponentially, so the gate
//! never loops tightly.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use iop_proto::config::EdgeConfig;
use iop_proto::pb::{self, FailureKind, run_event::Event};
use tokio::time::Instant;

use crate::EdgeState;
use crate::admission::{AdmitError, AdmitRequest, Candidate};
use crate::dispatch::{self, RunStream};
use crate::ingress::error::ApiError;

/// Where the client-visible response starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitPoint {
    /// Streaming: at the first content event.
    FirstContent,
    /// Non-streaming: at the terminal event.
    Terminal,
}

/// A request whose answering attempt reached its commit point.
pub struct Committed {
    /// The provider target that answered (the response's `model`).
    pub target_model: String,
    /// Events up to and including the commit event.
    pub buffered: Vec<Event>,
    /// The rest of the run, unless `buffered` already ends with its terminal.
    pub rest: Option<LiveRun>,
}

/// The committed run's remaining events, bounded by the request deadline.
pub struct LiveRun {
    run: RunStream,
    deadline: Instant,
}

impl LiveRun {
    pub async fn next(&mut self) -> Option<Event> {
        match tokio::time::timeout_at(self.deadline, self.run.next()).await {
            Ok(event) => event,
            // Dropping the run cancels it on the node and frees its slot.
            Err(_) => Some(deadline_failure()),
        }
    }
}

fn deadline_failure() -> Event {
    Event::Failed(pb::RunFailed {
        failure: Some(pb::ExecutionFailure::new(FailureKind::DeadlineExceeded, "the request's time budget ran out")),
    })
}

/// Providers serving `model` with their priority for it, best first.
pub fn candidates(config: &EdgeConfig, model: &str) -> Option<Arc<[Candidate]>> {
    let providers = crate::route::candidates(config, model)?;
    Some(
        providers
            .into_iter()
            .map(|p| Candidate {
                priority: p.models.iter().find(|m| m.name == model).map_or(0, |m| m.priority),
                provider: p.clone(),
            })
            .collect(),
    )
}

/// Whether a failure before the commit point may be retried. Pure.
pub fn retryable(failure: &pb::ExecutionFailure) -> bool {
    match failure.kind() {
        FailureKind::ProviderUnreachable
        | FailureKind::TransportLost
        | FailureKind::ResponseStalled
        | FailureKind::ProviderProtocol => true,
        FailureKind::ProviderHttpStatus => failure.provider_status == 429 || failure.provider_status >= 500,
        FailureKind::InvalidRequest
        | FailureKind::Internal
        | FailureKind::DeadlineExceeded
        | FailureKind::Unspecified => false,
    }
}

/// How long to wait before retrying after `failure` on attempt `attempt`
/// (1-based). Pure. With an untried alternative there is no wait; on the
/// same provider(s) a 429's Retry-After wins, else exponential backoff.
pub fn retry_delay(failure: &pb::ExecutionFailure, attempt: u32, alternative: bool) -> Duration {
    if alternative {
        return Duration::ZERO;
    }
    if failure.provider_status == 429 && failure.retry_after_ms > 0 {
        return Duration::from_millis(failure.retry_after_ms);
    }
    Duration::from_millis(100u64 << attempt.saturating_sub(1).min(6))
}

fn is_commit(event: &Event, point: CommitPoint) -> bool {
    match point {
        CommitPoint::FirstContent => matches!(event, Event::Text(_) | Event::ToolCall(_) | Event::Completed(_)),
        CommitPoint::Terminal => matches!(event, Event::Completed(_)),
    }
}

/// Runs `request` for public model `model` until an attempt commits.
pub async fn execute(
    state: &Arc<EdgeState>,
    model: &str,
    request: pb::RunRequest,
    point: CommitPoint,
) -> Result<Committed, ApiError> {
    let candidates = candidates(&state.config, model).ok_or_else(|| ApiError::ModelNotFound(model.to_string()))?;
    let limits = &state.config.limits;
    let deadline = Instant::now() + Duration::from_millis(limits.request_timeout_ms);
    let queue_timeout = Duration::from_millis(limits.queue_timeout_ms);
    let mut avoid = HashSet::new();
    let mut last_failure: Option<pb::ExecutionFailure> = None;

    for attempt in 1..=limits.max_attempts {
        let admit = AdmitRequest {
            route: model.to_string(),
            run_id: uuid::Uuid::new_v4().simple().to_string(),
            candidates: candidates.clone(),
            avoid: avoid.clone(),
        };
        let wait = queue_timeout.min(deadline.saturating_duration_since(Instant::now()));
        let lease = match state.admission.admit(admit, limits.queue_depth, wait).await {
            Ok(lease) => lease,
            // After a failed attempt, the provider's own answer says more
            // than "nothing else is available".
            Err(e) => return Err(last_failure.map(ApiError::Execution).unwrap_or_else(|| admit_error(e, model))),
        };
        let provider_id = lease.lease().provider_id().to_string();
        let outcome = attempt_once(state, &candidates, lease, &request, point, deadline).await;
        let failure = match outcome {
            Attempt::Committed(committed) => return Ok(*committed),
            Attempt::Failed(failure) => failure,
        };
        if !retryable(&failure) || attempt == limits.max_attempts {
            return Err(ApiError::Execution(failure));
        }
        tracing::info!(provider = %provider_id, attempt, kind = ?failure.kind(), "attempt failed before the first byte; retrying");
        avoid.insert(provider_id);
        let alternative = candidates.iter().any(|c| !avoid.contains(&c.provider.id));
        let delay = retry_delay(&failure, attempt, alternative);
        if Instant::now() + delay >= deadline {
            return Err(ApiError::Execution(failure));
        }
        tokio::time::sleep(delay).await;
        last_failure = Some(failure);
    }
    Err(last_failure.map(ApiError::Execution).unwrap_or(ApiError::Internal))
}

enum Attempt {
    Committed(Box<Committed>),
    Failed(pb::ExecutionFailure),
}

async fn attempt_once(
    state: &Arc<EdgeState>,
    candidates: &[Candidate],
    lease: crate::admission::LeaseGuard,
    request: &pb::RunRequest,
    point: CommitPoint,
    deadline: Instant,
) -> Attempt {
    let l = lease.lease();
    let Some(control) = state.registry.control_if_current(l.node(), l.generation()) else {
        return Attempt::Failed(pb::ExecutionFailure::new(
            FailureKind::TransportLost,
            "node connection closed before dispatch",
        ));
    };
    let provider = candidates.iter().find(|c| c.provider.id == l.provider_id()).map(|c| &c.provider);
    let mut request = request.clone();
    request.run_id = l.run_id().to_string();
    request.provider_id = l.provider_id().to_string();
    request.adapter = pb::AdapterKind::from(l.adapter()).into();
    request.target_model = l.target_model().to_string();
    // The stall timeout travels with the request to whichever provider answers.
    request.response_stall_timeout_ms = provider.map_or(0, |p| p.response_stall_timeout_ms);
    let target_model = l.target_model().to_string();

    let mut run = match dispatch::start_run(&state.runs, &state.metrics, lease, control, request).await {
        Ok(run) => run,
        Err(failure) => return Attempt::Failed(failure),
    };
    let mut buffered = Vec::new();
    loop {
        let event = match tokio::time::timeout_at(deadline, run.next()).await {
            Err(_) => return Attempt::Failed(failure_of(&deadline_failure())),
            Ok(None) => return Attempt::Failed(pb::ExecutionFailure::new(FailureKind::Internal, "run ended twice")),
            Ok(Some(event)) => event,
        };
        if let Event::Failed(_) | Event::Cancelled(_) = &event {
            run.mark_retried();
            return Attempt::Failed(failure_of(&event));
        }
        let commit = is_commit(&event, point);
        let terminal = matches!(event, Event::Completed(_));
        buffered.push(event);
        if commit {
            let rest = (!terminal).then_some(LiveRun { run, deadline });
            return Attempt::Committed(Box::new(Committed { target_model, buffered, rest }));
        }
    }
}

fn failure_of(event: &Event) -> pb::ExecutionFailure {
    match event {
        Event::Failed(f) => f.failure.clone().unwrap_or_else(|| pb::ExecutionFailure::new(FailureKind::Internal, "")),
        Event::Cancelled(_) => pb::ExecutionFailure::new(FailureKind::Internal, "the node cancelled the run"),
        _ => pb::ExecutionFailure::new(FailureKind::Internal, "not a failure"),
    }
}

fn admit_error(error: AdmitError, model: &str) -> ApiError {
    match error {
        AdmitError::NoneEligible => ApiError::NoProviderAvailable(model.to_string()),
        AdmitError::QueueFull => ApiError::QueueFull(model.to_string()),
        AdmitError::QueueTimeout => ApiError::QueueTimeout(model.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(kind: FailureKind, status: u32, retry_after_ms: u64) -> pb::ExecutionFailure {
        let mut f = pb::ExecutionFailure::new(kind, "x");
        f.provider_status = status;
        f.retry_after_ms = retry_after_ms;
        f
    }

    #[test]
    fn only_pre_byte_transient_failures_retry() {
        assert!(retryable(&failure(FailureKind::ProviderUnreachable, 0, 0)));
        assert!(retryable(&failure(FailureKind::TransportLost, 0, 0)));
        assert!(retryable(&failure(FailureKind::ProviderHttpStatus, 503, 0)));
        assert!(retryable(&failure(FailureKind::ProviderHttpStatus, 429, 0)));
        for status in [400, 401, 403, 404, 413, 422] {
            assert!(!retryable(&failure(FailureKind::ProviderHttpStatus, status, 0)), "{status}");
        }
        assert!(!retryable(&failure(FailureKind::InvalidRequest, 0, 0)));
        assert!(!retryable(&failure(FailureKind::DeadlineExceeded, 0, 0)));
    }

    #[test]
    fn retry_delay_prefers_alternatives_then_retry_after_then_backoff() {
        let limited = failure(FailureKind::ProviderHttpStatus, 429, 2_000);
        assert_eq!(retry_delay(&limited, 1, true), Duration::ZERO);
        assert_eq!(retry_delay(&limited, 1, false), Duration::from_secs(2));
        let down = failure(FailureKind::ProviderUnreachable, 0, 0);
        assert_eq!(retry_delay(&down, 1, false), Duration::from_millis(100));
        assert_eq!(retry_delay(&down, 3, false), Duration::from_millis(400));
        assert_eq!(retry_delay(&down, 30, false), Duration::from_millis(6_400), "capped");
    }

    #[test]
    fn commit_points() {
        let text = Event::Text(pb::TextDelta { text: "a".into() });
        let started = Event::Started(pb::RunStarted { model: "m".into() });
        assert!(is_commit(&text, CommitPoint::FirstContent));
        assert!(!is_commit(&started, CommitPoint::FirstContent), "headers alone commit nothing");
        assert!(!is_commit(&text, CommitPoint::Terminal));
    }
}
