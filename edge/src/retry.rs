//! The retry policy of the stream gate, all of it: which failures before the
//! commit point are retried ([`retryable`]), where the request goes next
//! ([`plan`], [`context_fallback`], [`same_credential`]) and how long it
//! waits ([`retry_delay`]). Pure; the gate (`gate::execute`) does the
//! admitting and the waiting.
//!
//! Priorities say which model the user wants: a provider in the failed one's
//! priority group (or a better one) is an equal, so the request goes there at
//! once. Before it drops to a lower group, the failed provider is retried
//! once when its `Retry-After` (429/503) or, for a 5xx or an unreachable
//! provider, a short backoff fits `retry.same_provider_max_wait_ms` and the
//! request's deadline, and an attempt is left for the lower group after it.
//! With nothing untried, the gate keeps its old rule ([`retry_delay`]):
//! the same provider(s) after `Retry-After` or an exponential backoff.

use std::time::Duration;

use iop_proto::config::{EdgeConfig, ProviderEntry};
use iop_proto::pb::{self, FailureKind};
use iop_proto::provider_error::{refuses_content, rejects_credential};

use crate::auth::Caller;
use crate::core::selection::Candidate;

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
    /// The failure (with those before it) ejected the failed provider
    /// (`core::outlier`, recorded as the run ended): never retried on it.
    pub failed_ejected: bool,
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
        let delay = retry_delay(input.failure, input.attempt);
        return if delay < input.remaining { RetryPlan::Alone(delay) } else { RetryPlan::GiveUp };
    }
    match same_provider_wait(input.failure) {
        Some(wait)
            if !input.same_provider_used
                && !input.failed_ejected
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
/// with the same credential), a model's refusal of the content, a stall (replayed per the spec), a full node
/// (waits like the queue), a protocol error, a lost node connection. Pure.
pub fn same_provider_wait(failure: &pb::ExecutionFailure) -> Option<Duration> {
    if refuses_content(failure) {
        return None;
    }
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

/// Whether a failure before the commit point may be retried. Pure.
pub fn retryable(failure: &pb::ExecutionFailure) -> bool {
    match failure.kind() {
        FailureKind::ProviderUnreachable
        | FailureKind::ProviderStreamCut
        | FailureKind::TransportLost
        | FailureKind::ResponseStalled
        | FailureKind::ProviderProtocol
        | FailureKind::CapacityExhausted => true,
        // A provider refusing its credential: another provider (with
        // another credential) may answer; the execute loop never retries
        // the same credential.
        // A model that cannot take the request's content: no attempt on it
        // can succeed, but another provider of the route may read it (one
        // whose modalities were not known); the execute loop never retries
        // the refusing provider, and with none left it is the client's error.
        FailureKind::ProviderHttpStatus if refuses_content(failure) => true,
        FailureKind::ProviderHttpStatus => {
            let status = failure.provider_status;
            status == 429 || status >= 500 || rejects_credential(status)
        }
        FailureKind::InvalidRequest
        | FailureKind::Internal
        | FailureKind::DeadlineExceeded
        | FailureKind::ResponseTooLarge
        // A refused credential lease fails closed: no other provider (and
        // so no other credential) is tried because of it.
        | FailureKind::CredentialRejected
        | FailureKind::Unspecified => false,
    }
}

/// The route to move to when `failure` says the request did not fit
/// `route`'s context window and the config names a fallback for it that
/// `caller` may use (a fallback is a model like any other: a principal not
/// allowed it gets the original context error). Pure.
pub fn context_fallback<'a>(
    config: &'a EdgeConfig,
    caller: &Caller,
    route: &str,
    failure: &pb::ExecutionFailure,
) -> Option<&'a str> {
    if !failure.context_length_exceeded || failure.kind() != FailureKind::ProviderHttpStatus {
        return None;
    }
    config.context_fallbacks.get(route).map(String::as_str).filter(|next| caller.may_use(next))
}

/// The providers among `candidates` that share `provider`'s credential: its
/// managed profile, or only itself without one. Pure.
pub fn same_credential<'a>(candidates: &'a [Candidate], provider: Option<&ProviderEntry>) -> Vec<&'a str> {
    let Some(provider) = provider else { return Vec::new() };
    let profile = provider.credential.as_ref().map(|c| &c.profile);
    candidates
        .iter()
        .filter(|c| {
            c.provider.id == provider.id
                || (profile.is_some() && c.provider.credential.as_ref().map(|c| &c.profile) == profile)
        })
        .map(|c| c.provider.id.as_str())
        .collect()
}

/// How long to wait before retrying the same provider(s) after `failure`
/// on attempt `attempt` (1-based), when nothing untried is eligible
/// ([`RetryPlan::Alone`]; with an alternative the plan goes
/// there at once). Pure. A 429's Retry-After wins, else exponential backoff.
pub fn retry_delay(failure: &pb::ExecutionFailure, attempt: u32) -> Duration {
    if failure.provider_status == 429 && failure.retry_after_ms > 0 {
        return Duration::from_millis(failure.retry_after_ms);
    }
    // A slot frees when another replica's run ends: look again soon.
    if failure.kind() == FailureKind::CapacityExhausted {
        return Duration::from_millis(25u64 << attempt.saturating_sub(1).min(4));
    }
    Duration::from_millis(100u64 << attempt.saturating_sub(1).min(6))
}

#[cfg(test)]
mod tests;
