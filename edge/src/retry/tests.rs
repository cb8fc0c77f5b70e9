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
    // llama.cpp's 500 to an image for a model without a projector.
    let no_images = pb::ExecutionFailure {
        provider_code: iop_proto::provider_error::UNSUPPORTED_CONTENT.into(),
        ..failure(ProviderHttpStatus, 500, 0)
    };
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
        (&no_images, 0, &[1], false, 2, 60, 3, LowerPriority),
        (&no_images, 0, &[0], false, 2, 60, 3, Equal),
        // Nothing untried: the old rule, bounded by the deadline.
        (&limited, 0, &[], false, 2, 60, 3, Alone(S)),
        (&limited_long, 0, &[], false, 2, 60, 3, Alone(30 * S)),
        (&limited_long, 0, &[], false, 2, 10, 3, GiveUp),
        (&down, 0, &[], true, 2, 60, 3, Alone(Duration::from_millis(100))),
    ];
    for (i, (failure, failed_priority, untried, used, left, remaining, max_wait, want)) in table.iter().enumerate() {
        let input = RetryInput {
            failure,
            failed_priority: *failed_priority,
            untried,
            same_provider_used: *used,
            failed_ejected: false,
            attempt: 1,
            attempts_left: *left,
            remaining: Duration::from_secs(*remaining),
            max_wait: Duration::from_secs(*max_wait),
        };
        assert_eq!(plan(&input), *want, "row {i}: {:?}", failure.kind());
        // A provider its failure ejected is never the next try: it goes
        // down the groups (or alone, when nothing else is left).
        let ejected = plan(&RetryInput { failed_ejected: true, ..input });
        let want = if matches!(want, SameProviderAfter(_)) { LowerPriority } else { *want };
        assert_eq!(ejected, want, "row {i} ejected: {:?}", failure.kind());
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
    let mut config = crate::testing::one_provider_config("n1");
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
    let mut config = crate::testing::one_provider_config("n1");
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
        let mut p = crate::testing::one_provider_config("n1").providers.remove(0);
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
    // A model's refusal of the content: another provider of the route may
    // read it (the gate never asks the refusing one again).
    let no_images = pb::ExecutionFailure {
        provider_code: iop_proto::provider_error::UNSUPPORTED_CONTENT.into(),
        ..failure(FailureKind::ProviderHttpStatus, 500, 0)
    };
    assert!(retryable(&no_images));
    assert_eq!(same_provider_wait(&no_images), None);
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
