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

fn unsupported_content(status: u32) -> pb::ExecutionFailure {
    let mut f = http(status);
    f.provider_code = iop_proto::provider_error::UNSUPPORTED_CONTENT.to_string();
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
        // llama.cpp's 500 to an image for a text-only model: the request's fault.
        (Some(unsupported_content(500)), None, Verdict::Neutral),
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
/// Runs named `t…` are trials the gate let through.
#[test]
fn thresholds_trials_and_resets() {
    use Verdict::{Failure as F, Neutral as N, Success as S};
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    // (ms, run, verdict, gate after, failures after, ejections after)
    #[rustfmt::skip]
    let steps: &[(u64, &str, Verdict, Gate, u32, u32)] = &[
        (0, "a", F, Gate::Open, 1, 0),
        (0, "a", N, Gate::Open, 1, 0),         // a 429 or a client error changes nothing
        (0, "a", F, Gate::Open, 2, 0),
        (0, "a", S, Gate::Open, 0, 0),         // a success resets the count
        (1_000, "a", F, Gate::Open, 1, 0),
        (1_000, "a", F, Gate::Open, 2, 0),
        (1_000, "a", F, Gate::Closed, 0, 1),   // the threshold: ejected 10 s
        (5_000, "a", F, Gate::Closed, 0, 1),   // runs from before: nothing
        (10_999, "a", F, Gate::Closed, 0, 1),
        (11_000, "a", F, Gate::Trial, 0, 1),   // the time passed: one trial may go
        (11_000, "t1", N, Gate::Trial, 0, 1),  // (t1 admitted below) said nothing: another may go
        (12_000, "t2", F, Gate::Closed, 0, 2), // the trial failed: ejected again, 20 s
        (31_999, "a", F, Gate::Closed, 0, 2),
        (32_000, "a", N, Gate::Trial, 0, 2),
        (32_000, "b", F, Gate::Closed, 0, 2),  // (t3 on trial) an older run's failure: nothing
        (33_000, "t3", S, Gate::Open, 0, 2),   // the trial succeeded: back, the count kept for decay
        (33_000, "a", F, Gate::Open, 1, 2),
        (34_000, "a", F, Gate::Open, 2, 2),
        (35_000, "a", F, Gate::Closed, 0, 3),  // within 10 s of returning: the 3rd ejection, 40 s
    ];
    let p = policy(3);
    let mut d = OutlierDetector::default();
    for (i, &(ms, run, v, gate, failures, ejections)) in steps.iter().enumerate() {
        let now = at(ms);
        d.record("p", run, v, now, &p);
        // The trials of the table go when the gate lets them.
        match (i, d.gate("p", now, &p)) {
            (9 | 10, Gate::Trial) => d.begin_trial("p", &format!("t{}", i - 8), now),
            (13, Gate::Trial) => d.begin_trial("p", "t3", now),
            _ => {}
        }
        let status = d.status("p", now);
        let gate_now = if matches!(i, 9 | 10 | 13) { Gate::Trial } else { d.gate("p", now, &p) };
        assert_eq!(
            (gate_now, status.consecutive_failures, status.ejections),
            (gate, failures, ejections),
            "step {i} at {ms} ms"
        );
    }
    assert_eq!(d.status("p", at(35_000)).ejected_until, Some(at(75_000)));
    assert!(!d.is_ejected("other", at(35_000), &p), "one provider's failures eject only it");
}

/// One trial at a time: while it runs the provider stays out; a trial
/// still running after a base ejection time is not waited for.
#[test]
fn one_trial_at_a_time() {
    let t0 = Instant::now();
    let p = policy(1);
    let mut d = OutlierDetector::default();
    d.record("p", "r", Verdict::Failure, t0, &p);
    let over = t0 + BASE;
    assert_eq!(d.gate("p", over, &p), Gate::Trial);
    d.begin_trial("p", "t", over);
    assert_eq!(d.gate("p", over + Duration::from_secs(1), &p), Gate::Closed);
    assert!(d.status("p", over).on_trial);
    assert!(d.is_ejected("p", over, &p));
    assert_eq!(d.gate("p", over + BASE, &p), Gate::Trial, "a stuck trial");
}

/// A provider that keeps failing gets one request (its trial) per
/// ejection time; once it recovers it is back within the longest
/// ejection (30 s on defaults). A request every 100 ms for 10 minutes.
#[test]
fn a_failing_provider_gets_one_trial_per_ejection_and_returns_within_the_cap() {
    let t0 = Instant::now();
    let p = OutlierPolicy::default();
    let mut d = OutlierDetector::default();
    let recovery = Duration::from_secs(400);
    let (mut admitted, mut back) = (0, None);
    for tick in 0..6_000u64 {
        let now = t0 + Duration::from_millis(100 * tick);
        let run = format!("r{tick}");
        let gate = d.gate("p", now, &p);
        if gate == Gate::Closed {
            continue;
        }
        if gate == Gate::Trial {
            d.begin_trial("p", &run, now);
        }
        admitted += 1;
        let recovered = now >= t0 + recovery;
        if recovered && back.is_none() {
            back = Some(now - (t0 + recovery));
        }
        d.record("p", &run, if recovered { Verdict::Success } else { Verdict::Failure }, now, &p);
    }
    let back = back.expect("it came back");
    assert!(back <= p.max_ejection, "back {back:?} after its recovery");
    // Before the recovery: the 5 failures that ejected it, then a trial
    // every 10, 20, then 30 s: 5 + (1 + 1 + 12) in 400 s.
    let before = admitted - (6_000 - 4_000 - back.as_millis() as u64 / 100);
    assert!(before <= 5 + 400 / 30 + 2, "{before} requests during the outage");
}

#[test]
fn transitions_say_when_and_for_how_long() {
    let t0 = Instant::now();
    let p = policy(1);
    let mut d = OutlierDetector::default();
    assert_eq!(
        d.record("p", "r", Verdict::Failure, t0, &p),
        Transition::Ejected { until: t0 + BASE, ejections: 1, duration: BASE }
    );
    assert_eq!(d.record("p", "r", Verdict::Success, t0 + Duration::from_secs(1), &p), Transition::Returned);
    assert_eq!(d.record("p", "r", Verdict::Success, t0 + Duration::from_secs(2), &p), Transition::None);
}

/// The doubling decays by one step per base ejection time served.
#[test]
fn the_doubling_decays_while_the_provider_serves() {
    let t0 = Instant::now();
    let p = policy(1);
    let mut d = OutlierDetector::default();
    let mut now = t0;
    d.record("p", "r", Verdict::Failure, now, &p);
    for expected in [2, 3] {
        let until = d.status("p", now).ejected_until.unwrap();
        now = until;
        assert_eq!(d.gate("p", now, &p), Gate::Trial);
        d.begin_trial("p", "t", now);
        match d.record("p", "t", Verdict::Failure, now, &p) {
            Transition::Ejected { ejections, .. } => assert_eq!(ejections, expected),
            other => panic!("{other:?}"),
        }
    }
    // Back after the third; serves 25 s (two base times): 3 - 2 + 1.
    d.record("p", "t", Verdict::Success, now, &p);
    now += Duration::from_secs(25);
    assert!(
        matches!(d.record("p", "r", Verdict::Failure, now, &p), Transition::Ejected { ejections: 2, duration, .. } if duration == 2 * BASE)
    );
    // And after a long healthy time, the first ejection's time again.
    now += 2 * BASE;
    d.record("p", "r", Verdict::Success, now, &p);
    now += Duration::from_secs(3600);
    assert!(
        matches!(d.record("p", "r", Verdict::Failure, now, &p), Transition::Ejected { ejections: 1, duration, .. } if duration == BASE)
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
    d.record("p", "r", Verdict::Failure, t0, &p);
    assert!(d.is_ejected("p", t0, &p));
    assert_eq!(d.record("p", "r", Verdict::Success, t0, &p), Transition::Returned);
    assert!(!d.is_ejected("p", t0, &p));

    d.record("p", "r", Verdict::Failure, t0, &p);
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
        assert_eq!(d.record("p", "r", Verdict::Failure, t0, &policy(0)), Transition::None);
    }
    assert_eq!(d.status("p", t0), OutlierStatus::default());
    d.record("p", "r", Verdict::Failure, t0, &policy(1));
    d.record("q", "r", Verdict::Failure, t0, &policy(1));
    d.retain(&policy(1), |id| id == "q");
    assert!(!d.is_ejected("p", t0, &policy(1)));
    assert!(d.is_ejected("q", t0, &policy(1)));
    d.retain(&policy(0), |_| true);
    assert!(!d.is_ejected("q", t0, &policy(0)), "turning it off ends every ejection");
}

#[test]
fn policy_from_config() {
    let c = OutlierConfig::default();
    let p = OutlierPolicy::from(&c);
    assert_eq!(p.consecutive_failures, 5);
    assert_eq!(p.base_ejection, Duration::from_secs(10));
    assert_eq!(p.max_ejection, Duration::from_secs(30));
    let off = OutlierConfig { enabled: false, ..c };
    assert!(!OutlierPolicy::from(&off).enabled());
}
