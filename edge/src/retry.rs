//! The retry discipline of the stream gate: where a request goes after a
//! retryable failure before the commit point. Pure ([`plan`]); the gate
//! (`gate::execute`) does the admitting and the waiting.
//!
//! Priorities say which model the user wants: a provider in the failed one's
//! priority group (or a better one) is an equal, so the request goes there at
//! once. Before it drops to a lower group, the failed provider is retried
//! once when its `Retry-After` (429/503) or, for a 5xx or an unreachable
//! provider, a short backoff fits `retry.same_provider_max_wait_ms` and the
//! request's deadline, and an attempt is left for the lower group after it.
//! With nothing untried, the gate keeps its old rule ([`crate::gate::retry_delay`]):
//! the same provider(s) after `Retry-After` or an exponential backoff.

use std::time::Duration;

use iop_proto::pb::{self, FailureKind};
use iop_proto::provider_error::rejects_credential;

/// The wait before retrying a provider that answered a 5xx without
/// `Retry-After` or was unreachable: long enough for a restarting server's
/// listener or a momentary overload, short next to any generation.
pub const SAME_PROVIDER_BACKOFF: Duration = Duration::from_millis(250);

/// What the gate does after a retryable failure before the commit point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryPlan {
    /// An untried eligible provider in the failed one's priority group (or a
    /// better one): admit among all candidates at once.
    Equal,
    /// Retry the failed provider itself (admission restricted to it) after
    /// this wait, before any lower group.
    SameProviderAfter(Duration),
    /// Drop to the lower priority group(s) at once.
    LowerPriority,
    /// No untried provider is eligible: admit again (tried providers the
    /// gate allows) after this wait.
    Alone(Duration),
    /// The wait does not fit the deadline: the failure ends the request.
    GiveUp,
}

impl RetryPlan {
    /// The `path` label of `iop_edge_retry_paths_total` (a closed set:
    /// `equal_provider`, `same_provider`, `lower_priority`, `no_alternative`,
    /// `none`).
    pub fn label(self) -> &'static str {
        match self {
            RetryPlan::Equal => "equal_provider",
            RetryPlan::SameProviderAfter(_) => "same_provider",
            RetryPlan::LowerPriority => "lower_priority",
            RetryPlan::Alone(_) => "no_alternative",
            RetryPlan::GiveUp => "none",
        }
    }
}

/// What [`plan`] decides from.
#[derive(Debug, Clone, Copy)]
pub struct RetryInput<'a> {
    /// The retryable failure of the attempt that just ended.
    pub failure: &'a pb::ExecutionFailure,
    /// The failed provider's priority for the route (lower is preferred).
    pub failed_priority: u32,
    /// Priorities of the untried candidates admission could choose now.
    pub untried: &'a [u32],
    /// This request already retried the failed provider once.
    pub same_provider_used: bool,
    /// The failed attempt's number (1-based).
    pub attempt: u32,
    /// Attempts left after the failed one (`limits.max_attempts` bound).
    pub attempts_left: u32,
    /// Time left before the request's deadline.
    pub remaining: Duration,
    /// `retry.same_provider_max_wait_ms` for the route.
    pub max_wait: Duration,
}

/// Where the request goes next. Pure.
pub fn plan(input: &RetryInput<'_>) -> RetryPlan {
    if input.untried.iter().any(|p| *p <= input.failed_priority) {
        return RetryPlan::Equal;
    }
    if input.untried.is_empty() {
        let delay = crate::gate::retry_delay(input.failure, input.attempt);
        return if delay < input.remaining { RetryPlan::Alone(delay) } else { RetryPlan::GiveUp };
    }
    match same_provider_wait(input.failure) {
        Some(wait)
            if !input.same_provider_used
                && input.attempts_left >= 2
                && wait <= input.max_wait
                && wait < input.remaining =>
        {
            RetryPlan::SameProviderAfter(wait)
        }
        _ => RetryPlan::LowerPriority,
    }
}

/// How long the same provider asks to be left alone after `failure`, for
/// failures worth retrying on it: its `Retry-After` on a 429 or 5xx, a short
/// backoff on a 5xx without one, an unreachable provider or a reset
/// (a stream cut before the commit). `None` for the
/// rest: a 429 without `Retry-After`, a refused credential (never retried
/// with the same credential), a stall (replayed per the spec), a full node
/// (waits like the queue), a protocol error, a lost node connection. Pure.
pub fn same_provider_wait(failure: &pb::ExecutionFailure) -> Option<Duration> {
    match failure.kind() {
        FailureKind::ProviderHttpStatus => {
            let status = failure.provider_status;
            if rejects_credential(status) || !(status == 429 || status >= 500) {
                return None;
            }
            if failure.retry_after_ms > 0 {
                return Some(Duration::from_millis(failure.retry_after_ms));
            }
            (status >= 500).then_some(SAME_PROVIDER_BACKOFF)
        }
        // Refused or reset, before or after the response's head.
        FailureKind::ProviderUnreachable | FailureKind::ProviderStreamCut => Some(SAME_PROVIDER_BACKOFF),
        _ => None,
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

    const S: Duration = Duration::from_secs(1);

    /// (failure, failed priority, untried, used, attempts left, remaining s, max wait s, plan)
    type Row<'a> = (&'a pb::ExecutionFailure, u32, &'a [u32], bool, u32, u64, u64, RetryPlan);

    #[test]
    fn the_plan_table() {
        use FailureKind::*;
        use RetryPlan::*;
        let limited = failure(ProviderHttpStatus, 429, 1_000);
        let limited_long = failure(ProviderHttpStatus, 429, 30_000);
        let limited_bare = failure(ProviderHttpStatus, 429, 0);
        let unavailable = failure(ProviderHttpStatus, 503, 2_000);
        let down = failure(ProviderHttpStatus, 500, 0);
        let unreachable = failure(ProviderUnreachable, 0, 0);
        let cut = failure(ProviderStreamCut, 0, 0);
        let refused = failure(ProviderHttpStatus, 401, 0);
        let stalled = failure(ResponseStalled, 0, 0);
        let full = failure(CapacityExhausted, 0, 0);
        let lost = failure(TransportLost, 0, 0);
        let protocol = failure(ProviderProtocol, 0, 0);
        let backoff = SameProviderAfter(SAME_PROVIDER_BACKOFF);
        // (failure, failed priority, untried, used, attempts left, remaining s, max wait s) -> plan
        #[rustfmt::skip]
        let table: &[Row<'_>] = &[
            // An equal (or better) untried provider: at once, whatever failed.
            (&limited, 0, &[0, 1], false, 2, 60, 3, Equal),
            (&down, 1, &[0], false, 2, 60, 3, Equal),
            (&stalled, 0, &[0], false, 2, 60, 3, Equal),
            (&full, 0, &[0], false, 2, 60, 3, Equal),
            // Only lower groups left: the same provider once, when its wait fits.
            (&limited, 0, &[1], false, 2, 60, 3, SameProviderAfter(S)),
            (&unavailable, 0, &[1, 2], false, 2, 60, 3, SameProviderAfter(2 * S)),
            (&down, 0, &[1], false, 2, 60, 3, backoff),
            (&unreachable, 0, &[1], false, 2, 60, 3, backoff),
            (&cut, 0, &[1], false, 2, 60, 3, backoff),
            (&limited_long, 0, &[1], false, 2, 60, 3, LowerPriority),
            (&limited, 0, &[1], true, 2, 60, 3, LowerPriority),
            (&limited, 0, &[1], false, 1, 60, 3, LowerPriority),
            (&limited, 0, &[1], false, 2, 1, 3, LowerPriority),
            (&limited, 0, &[1], false, 2, 60, 0, LowerPriority),
            // Failures the same provider is not retried for.
            (&limited_bare, 0, &[1], false, 2, 60, 3, LowerPriority),
            (&refused, 0, &[1], false, 2, 60, 3, LowerPriority),
            (&stalled, 0, &[1], false, 2, 60, 3, LowerPriority),
            (&full, 0, &[1], false, 2, 60, 3, LowerPriority),
            (&lost, 0, &[1], false, 2, 60, 3, LowerPriority),
            (&protocol, 0, &[1], false, 2, 60, 3, LowerPriority),
            // Nothing untried: the old rule, bounded by the deadline.
            (&limited, 0, &[], false, 2, 60, 3, Alone(S)),
            (&limited_long, 0, &[], false, 2, 60, 3, Alone(30 * S)),
            (&limited_long, 0, &[], false, 2, 10, 3, GiveUp),
            (&down, 0, &[], true, 2, 60, 3, Alone(Duration::from_millis(100))),
        ];
        for (i, (failure, failed_priority, untried, used, left, remaining, max_wait, want)) in table.iter().enumerate()
        {
            let input = RetryInput {
                failure,
                failed_priority: *failed_priority,
                untried,
                same_provider_used: *used,
                attempt: 1,
                attempts_left: *left,
                remaining: Duration::from_secs(*remaining),
                max_wait: Duration::from_secs(*max_wait),
            };
            assert_eq!(plan(&input), *want, "row {i}: {:?}", failure.kind());
        }
    }

    #[test]
    fn labels_are_a_closed_set() {
        let labels: Vec<_> = [
            RetryPlan::Equal,
            RetryPlan::SameProviderAfter(S),
            RetryPlan::LowerPriority,
            RetryPlan::Alone(S),
            RetryPlan::GiveUp,
        ]
        .map(RetryPlan::label)
        .into();
        assert_eq!(labels, ["equal_provider", "same_provider", "lower_priority", "no_alternative", "none"]);
    }
}
