use super::*;
use pb::{LivenessClassification as C, ProviderHealth as H};

fn at(ms: u64, base: Instant) -> Instant {
    base + Duration::from_millis(ms)
}

#[tokio::test(start_paused = true)]
async fn fires_at_the_threshold_and_only_progress_resets_it() {
    let t0 = Instant::now();
    let mut dog = StallWatchdog::new(Duration::from_millis(1000), t0);
    assert_eq!(dog.claim(at(999, t0)), None, "below the threshold");
    assert_eq!(dog.progress(at(500, t0)), Progress::Accepted);
    assert_eq!(dog.deadline(), Some(at(1500, t0)), "progress moved the deadline");
    assert_eq!(dog.claim(at(1499, t0)), None);
    assert_eq!(dog.claim(at(1500, t0)), Some(Duration::from_millis(1000)), "exactly at the threshold");
    assert_eq!(dog.claim(at(5000, t0)), None, "claimed once");
    assert_eq!(dog.deadline(), None);
}

#[tokio::test(start_paused = true)]
async fn the_first_byte_deadline_applies_until_any_byte_and_is_labelled() {
    let t0 = Instant::now();
    let fresh = || StallWatchdog::new(Duration::from_millis(1000), t0).with_first_byte(Duration::from_millis(300));
    // Nothing at all: claimed at the first-byte deadline, as first_byte.
    let mut silent = fresh();
    assert_eq!(silent.deadline(), Some(at(300, t0)));
    assert_eq!(silent.claim(at(299, t0)), None);
    assert_eq!(silent.claim(at(300, t0)), Some(Duration::from_millis(300)));
    assert!(silent.missed_first_byte());
    // Headers arrived: only the stall timeout is left, from the start.
    let mut headers = fresh();
    headers.first_byte();
    assert_eq!(headers.deadline(), Some(at(1000, t0)), "headers are not progress");
    assert_eq!(headers.claim(at(1000, t0)), Some(Duration::from_millis(1000)));
    assert!(!headers.missed_first_byte(), "a stall, not a missed first byte");
    // Output is a first byte too.
    let mut output = fresh();
    assert_eq!(output.progress(at(100, t0)), Progress::Accepted);
    assert_eq!(output.deadline(), Some(at(1100, t0)));
    // A stall timeout shorter than the first-byte one still bounds the wait.
    let mut short = StallWatchdog::new(Duration::from_millis(200), t0).with_first_byte(Duration::from_millis(300));
    assert_eq!(short.claim(at(200, t0)), Some(Duration::from_millis(200)));
    assert!(!short.missed_first_byte());
}

/// Headers, then nothing: the first-token deadline (learned, `crate::pace`)
/// claims it, labelled as a miss before the answer; content ends it, and
/// the watchdog keeps what the pace learns (time to first content, the
/// longest gap between two).
#[tokio::test(start_paused = true)]
async fn the_first_token_deadline_applies_until_content() {
    let t0 = Instant::now();
    let fresh = || {
        StallWatchdog::new(Duration::from_millis(1000), t0)
            .with_first_byte(Duration::from_millis(300))
            .with_first_token(Duration::from_millis(600))
    };
    let mut headers_only = fresh();
    headers_only.first_byte();
    assert_eq!(headers_only.progress(at(50, t0)), Progress::Accepted, "a started event is progress");
    assert_eq!(headers_only.deadline(), Some(at(600, t0)), "progress is not content");
    assert_eq!(headers_only.claim(at(600, t0)), Some(Duration::from_millis(550)));
    assert_eq!(headers_only.missed(), Some(Missed::FirstToken));
    assert!(headers_only.missed_first_byte(), "a miss before the answer on the wire");

    let mut answering = fresh();
    answering.progress(at(100, t0));
    answering.content(at(100, t0));
    assert_eq!(answering.deadline(), Some(at(1100, t0)), "only the stall timeout is left");
    for ms in [150, 400, 450] {
        answering.progress(at(ms, t0));
        answering.content(at(ms, t0));
    }
    assert_eq!(answering.pace(), (Some(Duration::from_millis(100)), Some(Duration::from_millis(250))));
    assert_eq!(answering.claim(at(1450, t0)), Some(Duration::from_millis(1000)));
    assert_eq!(answering.missed(), Some(Missed::Stall));
    assert_eq!(fresh().pace(), (None, None));
}

#[tokio::test]
async fn the_first_byte_mark_reaches_only_its_own_scope() {
    let mine = FirstByte::default();
    let other = FirstByte::default();
    FirstByte::mark(); // outside any execution: nothing
    mine.clone().scope(async { FirstByte::mark() }).await;
    assert!(mine.arrived());
    assert!(!other.arrived());
}

#[tokio::test(start_paused = true)]
async fn output_after_the_claim_is_fenced_and_the_terminal_loses() {
    let t0 = Instant::now();
    let mut dog = StallWatchdog::new(Duration::from_millis(10), t0);
    assert!(dog.claim(at(10, t0)).is_some());
    assert_eq!(dog.progress(at(11, t0)), Progress::Fenced);
    assert!(!dog.finish(), "the stall terminal already counts");
}

#[tokio::test(start_paused = true)]
async fn a_terminal_before_the_claim_wins_and_ends_watching() {
    let t0 = Instant::now();
    let mut dog = StallWatchdog::new(Duration::from_millis(10), t0);
    assert!(dog.finish());
    assert_eq!(dog.claim(at(100, t0)), None);
    assert_eq!(dog.progress(at(101, t0)), Progress::Fenced);
    assert!(!dog.finish(), "exactly one terminal");
}

#[tokio::test(start_paused = true)]
async fn close_and_probe_are_joined_not_serialized() {
    let started = Instant::now();
    let slow_close = tokio::time::sleep(Duration::from_millis(1500));
    let slow_probe = async {
        tokio::time::sleep(Duration::from_millis(1800)).await;
        H::Available
    };
    let evidence = join_evidence(slow_close, slow_probe, CLOSE_GRACE, PROBE_TIMEOUT).await;
    assert_eq!(started.elapsed(), Duration::from_millis(1800), "the longer of the two, not the sum");
    assert_eq!(evidence, StallEvidence { health: H::Available, classification: C::RequestStalled, retryable: true });
}

#[tokio::test(start_paused = true)]
async fn no_return_within_grace_is_not_retryable_and_a_hung_probe_is_unknown() {
    let started = Instant::now();
    let never_closes = std::future::pending::<()>();
    let hung_probe = std::future::pending::<H>();
    let evidence = join_evidence(never_closes, hung_probe, CLOSE_GRACE, PROBE_TIMEOUT).await;
    assert_eq!(started.elapsed(), PROBE_TIMEOUT.max(CLOSE_GRACE), "both bounded");
    assert_eq!(evidence, StallEvidence { health: H::Unknown, classification: C::HealthUnknown, retryable: false });
}

#[tokio::test(start_paused = true)]
async fn probe_outcomes_pair_fail_closed() {
    for (probe, pair) in [
        (H::Available, (H::Available, C::RequestStalled)),
        (H::Unavailable, (H::Unavailable, C::ProviderUnhealthy)),
        (H::Unknown, (H::Unknown, C::HealthUnknown)),
        (H::Unspecified, (H::Unknown, C::HealthUnknown)),
    ] {
        let evidence = join_evidence(async {}, async move { probe }, CLOSE_GRACE, PROBE_TIMEOUT).await;
        assert_eq!((evidence.health, evidence.classification), pair);
        assert!(evidence.retryable);
    }
}

#[test]
fn the_stall_failure_carries_only_safe_metadata() {
    let evidence = StallEvidence { health: H::Unavailable, classification: C::ProviderUnhealthy, retryable: true };
    let failure = evidence.to_failure(Duration::from_millis(1234), Some(7));
    assert_eq!(failure.kind(), pb::FailureKind::ResponseStalled);
    assert_eq!(failure.message, "no progress from the provider for 1234 ms");
    assert_eq!((failure.health_observation_seq, failure.stalled_after_ms, failure.retryable), (Some(7), 1234, true));
    assert_eq!(evidence.to_failure(Duration::ZERO, None).health_observation_seq, None, "unbound paths omit it");
}
