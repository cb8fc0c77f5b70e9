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
use iop_proto::provider_error::rejects_credential;

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

    /// Issue 13 item 7: only a provider 400 the node classified as context
    /// length moves, and only where the route names a fallback.
    #[test]
    fn only_context_length_errors_move_to_a_configured_fallback() {
        let mut config = crate::admission::test_support::one_provider_config("n1");
        config.context_fallbacks.insert("small".into(), "large".into());
        let mut too_long = failure(FailureKind::ProviderHttpStatus, 400, 0);
        too_long.context_length_exceeded = true;
        let anyone = Caller::Anonymous;
        assert_eq!(context_fallback(&config, &anyone, "small", &too_long), Some("large"));
        assert_eq!(context_fallback(&config, &anyone, "other", &too_long), None, "no fallback configured");
        let other_400 = failure(FailureKind::ProviderHttpStatus, 400, 0);
        assert_eq!(context_fallback(&config, &anyone, "small", &other_400), None);
        let mut not_http = failure(FailureKind::ProviderProtocol, 0, 0);
        not_http.context_length_exceeded = true;
        assert_eq!(context_fallback(&config, &anyone, "small", &not_http), None);
    }

    /// Issue 25 item 7: the fallback's model is subject to the caller's
    /// model list like the model the client named.
    #[test]
    fn a_fallback_the_principal_may_not_use_is_not_taken() {
        let mut config = crate::admission::test_support::one_provider_config("n1");
        config.context_fallbacks.insert("small".into(), "large".into());
        let mut too_long = failure(FailureKind::ProviderHttpStatus, 400, 0);
        too_long.context_length_exceeded = true;
        let hash = crate::auth::to_hex(&crate::auth::sha256(b"k"));
        let keys = crate::auth::Keys::parse(&format!(
            "principals:\n  - {{ name: small-only, key_sha256: {hash}, models: [small] }}\n  - {{ name: both, key_sha256: {}, models: [small, 'lar*'] }}\n",
            crate::auth::to_hex(&crate::auth::sha256(b"k2"))
        ))
        .unwrap();
        let caller = |key: &str| {
            let mut headers = axum::http::HeaderMap::new();
            headers.insert("authorization", format!("Bearer {key}").parse().unwrap());
            keys.authenticate(&headers).unwrap()
        };
        assert_eq!(context_fallback(&config, &caller("k"), "small", &too_long), None);
        assert_eq!(context_fallback(&config, &caller("k2"), "small", &too_long), Some("large"));
    }

    /// Issue 25 item 6: a refused credential is not retried with the same
    /// credential: the providers sharing its managed profile are avoided
    /// with it; without a managed profile, only the provider itself.
    #[test]
    fn the_providers_sharing_a_refused_credential() {
        let entry = |id: &str, profile: Option<&str>| {
            let mut p = crate::admission::test_support::one_provider_config("n1").providers.remove(0);
            p.id = id.into();
            p.credential = profile.map(|profile| iop_proto::config::CredentialRef { profile: profile.into() });
            Candidate { priority: 0, provider: p }
        };
        let candidates = [entry("a", Some("lm")), entry("b", Some("lm")), entry("c", Some("other")), entry("d", None)];
        assert_eq!(same_credential(&candidates, Some(&candidates[0].provider)), ["a", "b"]);
        assert_eq!(same_credential(&candidates, Some(&candidates[3].provider)), ["d"]);
        assert!(same_credential(&candidates, None).is_empty());
        let mut refused = failure(FailureKind::ProviderHttpStatus, 401, 0);
        assert!(retryable(&refused), "another credential may answer");
        refused.provider_status = 403;
        assert!(retryable(&refused));
    }

    #[test]
    fn only_pre_byte_transient_failures_retry() {
        assert!(retryable(&failure(FailureKind::ProviderUnreachable, 0, 0)));
        assert!(retryable(&failure(FailureKind::TransportLost, 0, 0)));
        // Issue 28 item 5: a cut before the commit is retried like a refused connection.
        assert!(retryable(&failure(FailureKind::ProviderStreamCut, 0, 0)));
        assert!(retryable(&failure(FailureKind::ProviderHttpStatus, 503, 0)));
        assert!(retryable(&failure(FailureKind::ProviderHttpStatus, 429, 0)));
        for status in [400, 404, 413, 422] {
            assert!(!retryable(&failure(FailureKind::ProviderHttpStatus, status, 0)), "{status}");
        }
        assert!(!retryable(&failure(FailureKind::InvalidRequest, 0, 0)));
        assert!(!retryable(&failure(FailureKind::DeadlineExceeded, 0, 0)));
    }

    #[test]
    fn retry_delay_prefers_retry_after_then_backoff() {
        let limited = failure(FailureKind::ProviderHttpStatus, 429, 2_000);
        assert_eq!(retry_delay(&limited, 1), Duration::from_secs(2));
        let down = failure(FailureKind::ProviderUnreachable, 0, 0);
        assert_eq!(retry_delay(&down, 1), Duration::from_millis(100));
        assert_eq!(retry_delay(&down, 3), Duration::from_millis(400));
        assert_eq!(retry_delay(&down, 30), Duration::from_millis(6_400), "capped");
        let full = failure(FailureKind::CapacityExhausted, 0, 0);
        assert_eq!(retry_delay(&full, 1), Duration::from_millis(25));
        assert_eq!(retry_delay(&full, 30), Duration::from_millis(400), "capped lower: a slot frees any time");
    }
}
