use super::*;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn shares(requests: Option<u32>, tokens: Option<u32>, concurrent: Option<u32>) -> Shares {
    Shares { requests, tokens, concurrent }
}

fn caller(name: &str, requests: Option<u32>, tokens: Option<u32>, concurrent: Option<u32>) -> Caller {
    let mut extra = String::new();
    for (field, value) in
        [("requests_per_minute", requests), ("tokens_per_minute", tokens), ("max_concurrent_requests", concurrent)]
    {
        if let Some(v) = value {
            extra.push_str(&format!(", {field}: {v}"));
        }
    }
    let hash = crate::auth::to_hex(&crate::auth::sha256(name.as_bytes()));
    let text = format!("principals:\n  - {{ name: {name}, key_sha256: {hash}, models: ['*']{extra} }}\n");
    let keys = crate::auth::Keys::parse(&text).unwrap();
    let mut headers = axum::http::HeaderMap::new();
    headers.insert("x-api-key", name.parse().unwrap());
    keys.authenticate(&headers).unwrap()
}

fn refusal(result: Result<Permit, Box<Refusal>>) -> Refusal {
    match result {
        Err(r) => *r,
        Ok(_) => panic!("expected a refusal, the request was admitted"),
    }
}

#[test]
fn shares_round_up_and_their_sum_is_bounded() {
    // (limit, replicas, share)
    let cases = [(10, 1, 10), (10, 2, 5), (10, 3, 4), (1, 3, 1), (7, 0, 7), (100, 7, 15), (1_000_000, 1, 1_000_000)];
    for (limit, replicas, want) in cases {
        assert_eq!(share(limit, replicas), want, "{limit}/{replicas}");
        let n = replicas.max(1) as u32;
        assert!(
            want * n >= limit && want * n < limit + n,
            "the error bound (<= limit + replicas - 1): {limit}/{replicas}"
        );
    }
    let limits =
        PrincipalLimits { requests_per_minute: Some(9), tokens_per_minute: None, max_concurrent_requests: Some(1) };
    assert_eq!(Shares::of(limits, 2), shares(Some(5), None, Some(1)));
}

/// Requests per minute: under, at and over the share, the Retry-After,
/// and the refill (one request back every 60 s / share; all after a
/// minute).
#[test]
fn requests_per_minute_under_at_over_and_refill() {
    let t0 = Instant::now();
    let s = shares(Some(3), None, None);
    let mut m = Meter::new(t0);
    // (offset ms, admitted, remaining or retry ms)
    let steps: [(u64, bool, u64); 7] = [
        (0, true, 2),
        (0, true, 1),
        (0, true, 0),
        (0, false, 20_000), // over: the first of the three is paid back in 20 s
        (19_999, false, 1),
        (20_000, true, 0), // one came back
        (80_000, true, 2), // a minute later all are back (this one counted)
    ];
    for (at, admitted, n) in steps {
        let now = t0 + Duration::from_millis(at);
        match m.admit(s, now) {
            Ok(status) => {
                assert!(admitted, "at {at} ms: admitted");
                assert_eq!(status.requests.unwrap().remaining, n as u32, "at {at} ms");
                m.release();
            }
            Err((limit, wait, status)) => {
                assert!(!admitted, "at {at} ms: refused");
                assert_eq!((limit, wait), (Limit::Requests, Duration::from_millis(n)), "at {at} ms");
                assert_eq!(status.requests.unwrap().remaining, 0);
            }
        }
    }
}

#[test]
fn a_refused_request_counts_nothing() {
    let t0 = Instant::now();
    let mut m = Meter::new(t0);
    let s = shares(Some(1), None, None);
    m.admit(s, t0).unwrap();
    m.release();
    for _ in 0..5 {
        assert!(m.admit(s, t0 + secs(30)).is_err());
    }
    assert!(m.admit(s, t0 + secs(60)).is_ok(), "the refusals did not push the refill back");
}

/// Headers' numbers: limit is the share, reset the time until the
/// bucket is full again.
#[test]
fn status_says_limit_remaining_and_reset() {
    let t0 = Instant::now();
    let mut m = Meter::new(t0);
    let s = shares(Some(4), Some(1000), None);
    let status = m.admit(s, t0).unwrap();
    assert_eq!(status.requests, Some(Bucket { limit: 4, remaining: 3, reset: secs(15) }));
    assert_eq!(status.tokens, Some(Bucket { limit: 1000, remaining: 1000, reset: Duration::ZERO }));
    m.charge(250, t0);
    let status = m.status(s, t0 + secs(5));
    assert_eq!(status.requests, Some(Bucket { limit: 4, remaining: 3, reset: secs(10) }));
    assert_eq!(status.tokens, Some(Bucket { limit: 1000, remaining: 833, reset: secs(10) }));
}

/// Tokens per minute: refused while the tokens charged fill the bucket;
/// one answer may overshoot, and the debt is waited out.
#[test]
fn tokens_per_minute_refuse_once_full_and_an_answer_may_overshoot() {
    let t0 = Instant::now();
    let mut m = Meter::new(t0);
    let s = shares(None, Some(600), None); // 100 ms per token
    m.admit(s, t0).unwrap();
    m.charge(599, t0);
    assert!(m.admit(s, t0).is_ok(), "one token left: admitted");
    m.charge(1, t0);
    let (limit, wait, status) = m.admit(s, t0).unwrap_err();
    assert_eq!((limit, status.tokens.unwrap().remaining), (Limit::Tokens, 0));
    assert!(wait > Duration::ZERO && wait < Duration::from_millis(1), "{wait:?}");
    assert!(m.admit(s, t0 + Duration::from_millis(100)).is_ok(), "a token came back");
    // An answer far over the share: charged whole, waited out.
    m.charge(1200, t0 + Duration::from_millis(100));
    let (_, wait, _) = m.admit(s, t0 + Duration::from_millis(100)).unwrap_err();
    assert_eq!(wait, Duration::from_millis(119_900) + Duration::from_nanos(1));
    let refusal = Refusal {
        limit: Limit::Tokens,
        share: 600,
        configured: 600,
        replicas: 1,
        retry_after: wait,
        status: Status::default(),
    };
    assert_eq!(refusal.retry_after_secs(), 120);
    assert!(m.admit(s, t0 + Duration::from_millis(100) + secs(120)).is_ok());
    // The debt is bounded.
    m.charge(u64::MAX, t0);
    assert!(m.status(s, t0).tokens.unwrap().reset <= MAX_BACKLOG);
}

#[test]
fn concurrency_is_held_until_release() {
    let t0 = Instant::now();
    let mut m = Meter::new(t0);
    let s = shares(None, None, Some(2));
    m.admit(s, t0).unwrap();
    m.admit(s, t0).unwrap();
    let (limit, wait, status) = m.admit(s, t0).unwrap_err();
    assert_eq!((limit, wait, status), (Limit::Concurrency, CONCURRENCY_RETRY, Status::default()));
    m.release();
    assert!(m.admit(s, t0).is_ok());
    assert!(!m.idle(t0 + secs(3600)), "two in flight");
}

/// Several limits over: the one with the longest wait is named.
#[test]
fn the_longest_wait_names_the_refusal() {
    let t0 = Instant::now();
    let mut m = Meter::new(t0);
    let s = shares(Some(1), Some(60), Some(1));
    m.admit(s, t0).unwrap();
    m.charge(600, t0); // ten minutes of tokens
    let (limit, wait, _) = m.admit(s, t0).unwrap_err();
    assert_eq!(limit, Limit::Tokens, "{wait:?}");
}

#[test]
fn permits_release_on_drop_and_anonymous_callers_are_unlimited() {
    let limits = RateLimits::default();
    let t0 = Instant::now();
    for _ in 0..1000 {
        let permit = limits.admit_at(&Caller::Anonymous, 1, t0).unwrap();
        assert_eq!(permit.status(), None);
    }
    let unlimited = caller("free", None, None, None);
    limits.admit_at(&unlimited, 1, t0).unwrap();
    assert!(limits.is_empty(), "no meter for callers without limits");

    let c = caller("one-at-once", None, None, Some(1));
    let held = limits.admit_at(&c, 1, t0).unwrap();
    assert_eq!(held.status(), None, "concurrency alone has no headers");
    let refused = refusal(limits.admit_at(&c, 1, t0));
    assert_eq!((refused.limit, refused.retry_after_secs(), refused.share), (Limit::Concurrency, 1, 1));
    drop(held);
    assert!(limits.admit_at(&c, 1, t0).is_ok(), "the dropped permit gave its place back");
}

/// The refusal names the configured limit, this replica's share and
/// the replica count; two replicas each admit their share.
#[test]
fn two_replicas_each_admit_their_share() {
    let t0 = Instant::now();
    let c = caller("team", Some(5), None, None);
    let (a, b) = (RateLimits::default(), RateLimits::default());
    let admitted = |limits: &RateLimits| (0..10).filter(|_| limits.admit_at(&c, 2, t0).is_ok()).count();
    assert_eq!((admitted(&a), admitted(&b)), (3, 3), "ceil(5 / 2) each: 6 <= 5 + 2 - 1");
    let refused = refusal(a.admit_at(&c, 2, t0));
    assert_eq!((refused.share, refused.configured, refused.replicas), (3, 5, 2));
    assert_eq!(refused.retry_after_secs(), 20);
}

/// A keys reload gives the principal a new `Arc` (and maybe new
/// limits): its use is kept by name, as the fraction of the minute
/// spent.
#[test]
fn a_reload_keeps_use_by_name_and_applies_new_limits() {
    let t0 = Instant::now();
    let limits = RateLimits::default();
    let before = caller("ci", Some(2), None, None);
    limits.admit_at(&before, 1, t0).unwrap();
    limits.admit_at(&before, 1, t0).unwrap();
    assert!(limits.admit_at(&before, 1, t0).is_err());
    let same = caller("ci", Some(2), None, None);
    assert!(limits.admit_at(&same, 1, t0).is_err(), "a new Arc, the same principal");
    let raised = caller("ci", Some(4), None, None);
    let permit = limits.admit_at(&raised, 1, t0).unwrap();
    // The two requests counted stay counted, at the new share's rate.
    assert_eq!(permit.status().unwrap().requests.unwrap(), Bucket { limit: 4, remaining: 1, reset: secs(45) });
    let lowered = caller("ci", Some(1), None, None);
    assert!(limits.admit_at(&lowered, 1, t0).is_err());
    assert!(limits.admit_at(&lowered, 1, t0 + secs(179)).is_err(), "three counted at one a minute");
    assert!(limits.admit_at(&lowered, 1, t0 + secs(180)).is_ok());
    let other = caller("other", Some(1), None, None);
    assert!(limits.admit_at(&other, 1, t0).is_ok(), "another principal is unaffected");
}

#[test]
fn tokens_are_charged_to_the_principal_by_name() {
    let t0 = Instant::now();
    let limits = RateLimits::default();
    let c = caller("big", None, Some(100), None);
    drop(limits.admit_at(&c, 1, t0).unwrap());
    limits.charge_tokens_at("big", 100, t0);
    limits.charge_tokens_at("nobody", 100, t0);
    let refused = refusal(limits.admit_at(&c, 1, t0));
    assert_eq!(refused.limit, Limit::Tokens);
    assert_eq!(limits.len(), 1, "no meter for a name without limits");
}

/// Memory: idle meters go (a principal a reload removed, once its
/// minute passed); busy ones stay.
#[test]
fn idle_meters_are_pruned() {
    let t0 = Instant::now();
    let limits = RateLimits::default();
    for i in 0..50 {
        drop(limits.admit_at(&caller(&format!("p{i}"), Some(10), None, None), 1, t0).unwrap());
    }
    let busy = caller("busy", None, None, Some(5));
    let held = limits.admit_at(&busy, 1, t0).unwrap();
    assert_eq!(limits.len(), 51);
    // Within the minute nothing is pruned; after it the idle ones are.
    limits.admit_at(&busy, 1, t0 + secs(30)).unwrap();
    assert_eq!(limits.len(), 51);
    let _again = limits.admit_at(&busy, 1, t0 + secs(61)).unwrap();
    assert_eq!(limits.len(), 1, "only the principal in flight is left");
    drop(held);
}

#[test]
fn openai_and_anthropic_headers() {
    let status = Status {
        requests: Some(Bucket { limit: 60, remaining: 59, reset: secs(1) }),
        tokens: Some(Bucket { limit: 150_000, remaining: 149_984, reset: Duration::from_millis(6) }),
    };
    let now = SystemTime::UNIX_EPOCH + secs(1_700_000_000);
    let openai = headers(HeaderForm::OpenAi, &status, Some(Duration::from_millis(1500)), now);
    let want = [
        ("x-ratelimit-limit-requests", "60"),
        ("x-ratelimit-remaining-requests", "59"),
        ("x-ratelimit-reset-requests", "1s"),
        ("x-ratelimit-limit-tokens", "150000"),
        ("x-ratelimit-remaining-tokens", "149984"),
        ("x-ratelimit-reset-tokens", "6ms"),
        ("retry-after-ms", "1500"),
    ];
    let got: Vec<(&str, &str)> = openai.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(got, want);
    let anthropic = headers(HeaderForm::Anthropic, &status, Some(secs(2)), now);
    let got: Vec<(&str, &str)> = anthropic.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(
        got,
        [
            ("anthropic-ratelimit-requests-limit", "60"),
            ("anthropic-ratelimit-requests-remaining", "59"),
            ("anthropic-ratelimit-requests-reset", "2023-11-14T22:13:21Z"),
            ("anthropic-ratelimit-tokens-limit", "150000"),
            ("anthropic-ratelimit-tokens-remaining", "149984"),
            ("anthropic-ratelimit-tokens-reset", "2023-11-14T22:13:21Z"),
        ]
    );
    let only_requests = Status { requests: status.requests, tokens: None };
    assert_eq!(headers(HeaderForm::OpenAi, &only_requests, None, now).len(), 3);
}

#[test]
fn reset_durations_in_gos_form() {
    let cases = [
        (Duration::ZERO, "0s"),
        (Duration::from_nanos(1), "1ms"),
        (Duration::from_millis(17), "17ms"),
        (Duration::from_millis(999), "999ms"),
        (secs(1), "1s"),
        (Duration::from_millis(1001), "2s"),
        (secs(59), "59s"),
        (secs(360), "6m0s"),
        (secs(3661), "1h1m1s"),
    ];
    for (d, want) in cases {
        assert_eq!(go_duration(d), want, "{d:?}");
    }
}

/// 20 parallel requests, each reserving 120 tokens of a 1,000-token
/// minute: admitted while the bucket has room, so the bucket passes full
/// by at most one reservation; the rest refused for tokens.
#[test]
fn reservations_refuse_parallel_requests_beyond_one_reserve() {
    let limits = RateLimits::default();
    let who = caller("parallel", None, Some(1_000), None);
    let now = Instant::now();
    let (mut held, mut refused) = (Vec::new(), 0);
    for _ in 0..20 {
        // The full bucket refuses at admission already, or at the reservation.
        let admitted = limits.admit_at(&who, 1, now).and_then(|mut permit| {
            limits.reserve_at(&mut permit, &who, 1, 120, now)?;
            Ok(permit)
        });
        match admitted {
            Ok(permit) => held.push(permit),
            Err(refusal) => {
                assert_eq!(refusal.limit, Limit::Tokens);
                refused += 1;
            }
        }
    }
    // 8 x 120 = 960 < 1,000: a ninth fits while there is room, the tenth does not.
    assert_eq!((held.len(), refused), (9, 11));
    let status = lock(held[0].meter.as_ref().unwrap()).status(shares(None, Some(1_000), None), now);
    assert_eq!(status.tokens.unwrap().remaining, 0);
}

/// A reservation is given back when the request ends; what its attempts
/// used stays charged.
#[test]
fn a_reservation_is_settled_by_what_was_used() {
    let limits = RateLimits::default();
    let who = caller("settled", None, Some(1_000), None);
    let now = Instant::now();
    let mut permit = limits.admit_at(&who, 1, now).unwrap();
    limits.reserve_at(&mut permit, &who, 1, 600, now).unwrap();
    assert_eq!(permit.status().unwrap().tokens.unwrap().remaining, 400);
    limits.charge_tokens_at("settled", 150, now);
    let meter = permit.meter.clone().unwrap();
    drop(permit);
    let status = lock(&meter).status(shares(None, Some(1_000), None), Instant::now());
    // 150 used; a moment has passed since, so 850 or a token more.
    assert!((850..=851).contains(&status.tokens.unwrap().remaining), "{status:?}");
    // A refund never makes the bucket more than full.
    let mut meter = Meter::new(now);
    meter.token_share = Some(1_000);
    meter.refund(5_000, now);
    assert_eq!(meter.status(shares(None, Some(1_000), None), now).tokens.unwrap().remaining, 1_000);
}

/// A caller without a tokens limit reserves nothing and is never refused.
#[test]
fn without_a_tokens_limit_nothing_is_reserved() {
    let limits = RateLimits::default();
    let who = caller("requests-only", Some(100), None, None);
    let mut permit = limits.admit(&who, 1).unwrap();
    limits.reserve(&mut permit, &who, 1, u64::MAX).unwrap();
    let mut anonymous = Permit::default();
    limits.reserve(&mut anonymous, &who, 1, 10).unwrap();
}
