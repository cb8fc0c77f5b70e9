use super::*;

const BASE: Duration = Duration::from_secs(10);

fn policy(threshold: u32) -> OutlierPolicy {
    OutlierPolicy { consecutive_failures: threshold, base_ejection: BASE, max_ejection: Duration::from_secs(60) }
}

fn http(status: u32) -> pb::ExecutionFailure {
    let mut f = pb::ExecutionFailure::new(FailureKind::ProviderHttpStatus, "x");
    f.provider_status = status;
    f
}

/// Which outcomes are failures of the provider.
#[test]
fn verdicts() {
    let kind = |k| pb::ExecutionFailure::new(k, "x");
    let cases = [
        (Some(http(500)), None, Verdict::Failure),
        (Some(http(503)), None, Verdict::Failure),
        (Some(kind(FailureKind::ProviderUnreachable)), None, Verdict::Failure),
        (Some(kind(FailureKind::ProviderStreamCut)), None, Verdict::Failure),
        (Some(kind(FailureKind::ResponseStalled)), None, Verdict::Failure),
        (Some(kind(FailureKind::ProviderProtocol)), None, Verdict::Failure),
        (Some(http(429)), None, Verdict::Neutral),
        (Some(http(400)), None, Verdict::Neutral),
        (Some(http(401)), None, Verdict::Neutral),
        (Some(http(403)), None, Verdict::Neutral),
        (Some(kind(FailureKind::TransportLost)), None, Verdict::Neutral),
        (Some(kind(FailureKind::CapacityExhausted)), None, Verdict::Neutral),
        (Some(kind(FailureKind::CredentialRejected)), None, Verdict::Neutral),
        (Some(kind(FailureKind::DeadlineExceeded)), None, Verdict::Neutral),
        (Some(kind(FailureKind::InvalidRequest)), None, Verdict::Neutral),
        (Some(kind(FailureKind::ResponseTooLarge)), None, Verdict::Neutral),
        (None, None, Verdict::Success),
        (None, Some(200), Verdict::Success),
        (None, Some(502), Verdict::Failure),
        (None, Some(429), Verdict::Neutral),
        (None, Some(404), Verdict::Neutral),
    ];
    for (failure, head, expected) in cases {
        assert_eq!(verdict(failure.as_ref(), head), expected, "{failure:?} {head:?}");
    }
}

#[test]
fn ejection_time_doubles_up_to_the_cap() {
    let p = policy(5);
    let times: Vec<u64> = (1..=6).map(|n| p.ejection_time(n).as_secs()).collect();
    assert_eq!(times, [10, 20, 40, 60, 60, 60]);
    assert_eq!(p.ejection_time(200), Duration::from_secs(60), "no overflow");
}

/// Table: outcomes in order, and what the detector says after each.
#[test]
fn thresholds_trials_and_resets() {
    use Verdict::{Failure as F, Neutral as N, Success as S};
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    // (seconds, verdict, ejected after, failures after, ejections after)
    #[rustfmt::skip]
    let steps: &[(u64, Verdict, bool, u32, u32)] = &[
        (0, F, false, 1, 0),
        (0, N, false, 1, 0),  // a 429 or a client error changes nothing
        (0, F, false, 2, 0),
        (0, S, false, 0, 0),  // a success resets the count
        (1, F, false, 1, 0),
        (1, F, false, 2, 0),
        (1, F, true, 0, 1),   // the threshold: ejected 10 s
        (5, F, true, 0, 1),   // failures while ejected change nothing
        (10, F, true, 0, 1),  // still ejected at 10.999
        (11, F, true, 0, 2),  // the failed trial at 11 s: re-ejected at once for 20 s
        (30, N, true, 0, 2),
        (31, S, false, 0, 2), // the trial succeeded: back, the count is kept for decay
        (31, F, false, 1, 2),
        (32, F, false, 2, 2),
        (33, F, true, 0, 3),  // within 10 s of returning: the 3rd ejection, 40 s
    ];
    let p = policy(3);
    let mut d = OutlierDetector::default();
    for (i, &(s, v, ejected, failures, ejections)) in steps.iter().enumerate() {
        // The 10 s step is just before the ejection's end.
        let now = if s == 10 { at(10) + Duration::from_millis(999) } else { at(s) };
        d.record("p", v, now, &p);
        let status = d.status("p", now);
        assert_eq!(
            (status.ejected_until.is_some(), status.consecutive_failures, status.ejections),
            (ejected, failures, ejections),
            "step {i} at {s}s"
        );
    }
    assert_eq!(d.status("p", at(33)).ejected_until, Some(at(73)));
    assert!(!d.is_ejected("other", at(33)), "one provider's failures eject only it");
}

#[test]
fn transitions_say_when_and_for_how_long() {
    let t0 = Instant::now();
    let p = policy(1);
    let mut d = OutlierDetector::default();
    assert_eq!(
        d.record("p", Verdict::Failure, t0, &p),
        Transition::Ejected { until: t0 + BASE, ejections: 1, duration: BASE }
    );
    assert_eq!(d.record("p", Verdict::Success, t0 + Duration::from_secs(1), &p), Transition::Returned);
    assert_eq!(d.record("p", Verdict::Success, t0 + Duration::from_secs(2), &p), Transition::None);
}

/// The doubling decays by one step per base ejection time served.
#[test]
fn the_doubling_decays_while_the_provider_serves() {
    let t0 = Instant::now();
    let p = policy(1);
    let mut d = OutlierDetector::default();
    let mut now = t0;
    for expected in [1, 2, 3] {
        match d.record("p", Verdict::Failure, now, &p) {
            Transition::Ejected { ejections, until, .. } => {
                assert_eq!(ejections, expected);
                now = until;
            }
            other => panic!("{other:?}"),
        }
    }
    // Back after the third; serves 25 s (two base times): 3 - 2 + 1.
    d.record("p", Verdict::Success, now, &p);
    now += Duration::from_secs(25);
    assert!(
        matches!(d.record("p", Verdict::Failure, now, &p), Transition::Ejected { ejections: 2, duration, .. } if duration == 2 * BASE)
    );
    // And after a long healthy time, the first ejection's time again.
    now += 2 * BASE;
    d.record("p", Verdict::Success, now, &p);
    now += Duration::from_secs(3600);
    assert!(
        matches!(d.record("p", Verdict::Failure, now, &p), Transition::Ejected { ejections: 1, duration, .. } if duration == BASE)
    );
}

/// A success ends an ejection at once; a recovery the node saw clears
/// the whole history; a probe that keeps saying available is never
/// passed here at all.
#[test]
fn a_success_or_a_recovery_brings_it_back() {
    let t0 = Instant::now();
    let p = policy(1);
    let mut d = OutlierDetector::default();
    d.record("p", Verdict::Failure, t0, &p);
    assert!(d.is_ejected("p", t0));
    assert_eq!(d.record("p", Verdict::Success, t0, &p), Transition::Returned);
    assert!(!d.is_ejected("p", t0));

    d.record("p", Verdict::Failure, t0, &p);
    assert_eq!(d.status("p", t0).ejections, 2);
    assert!(d.forgive("p"));
    assert_eq!(d.status("p", t0), OutlierStatus::default(), "history cleared");
    assert!(!d.forgive("p"));
}

#[test]
fn zero_turns_ejection_off_and_a_reload_drops_removed_providers() {
    let t0 = Instant::now();
    let mut d = OutlierDetector::default();
    for _ in 0..100 {
        assert_eq!(d.record("p", Verdict::Failure, t0, &policy(0)), Transition::None);
    }
    assert_eq!(d.status("p", t0), OutlierStatus::default());
    d.record("p", Verdict::Failure, t0, &policy(1));
    d.record("q", Verdict::Failure, t0, &policy(1));
    d.retain(&policy(1), |id| id == "q");
    assert!(!d.is_ejected("p", t0));
    assert!(d.is_ejected("q", t0));
    d.retain(&policy(0), |_| true);
    assert!(!d.is_ejected("q", t0), "turning it off ends every ejection");
}

#[test]
fn policy_from_config() {
    let c = OutlierConfig::default();
    let p = OutlierPolicy::from(&c);
    assert_eq!(p.consecutive_failures, 5);
    assert_eq!(p.base_ejection, Duration::from_secs(30));
    assert_eq!(p.max_ejection, Duration::from_secs(300));
    let off = OutlierConfig { enabled: false, ..c };
    assert!(!OutlierPolicy::from(&off).enabled());
}
