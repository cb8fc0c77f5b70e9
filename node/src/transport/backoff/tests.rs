use super::*;

#[test]
fn grows_exponentially_and_is_capped() {
    let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
    let upper: Vec<_> = (0..6).map(|_| b.next_delay(1.0).as_millis()).collect();
    assert_eq!(upper, [100, 200, 400, 800, 1000, 1000]);
    b.reset();
    assert_eq!(b.next_delay(0.0), Duration::from_millis(50), "lower bound is half the step");
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// The default backoff (500 ms doubling to 30 s): duplicates never grow it,
/// the first ten pause the initial backoff, then at most 2 s.
#[test]
fn duplicates_pause_briefly_and_bounded() {
    let mut r = Redial::new(ms(500), ms(30_000));
    let upper: Vec<_> = (0..12).map(|_| r.next_delay(Dialed::Duplicate, 1.0).as_millis()).collect();
    assert_eq!(upper, [500, 500, 500, 500, 500, 500, 500, 500, 500, 500, 2000, 2000]);
    assert_eq!(r.next_delay(Dialed::Duplicate, 0.0), ms(1000), "jittered: 1 to 2 s");
    // Duplicates did not grow the failure backoff.
    let failures: Vec<_> = (0..3).map(|_| r.next_delay(Dialed::Failed, 1.0).as_millis()).collect();
    assert_eq!(failures, [500, 1000, 2000]);
    // Nor does a duplicate between failures reset it, or end the streak.
    assert_eq!(r.next_delay(Dialed::Duplicate, 1.0), ms(2000));
    assert_eq!(r.next_delay(Dialed::Failed, 1.0), ms(4000));
}

/// Failures back off exponentially up to the configured max, as before.
#[test]
fn failures_back_off_to_the_cap() {
    let mut r = Redial::new(ms(500), ms(30_000));
    let upper: Vec<_> = (0..8).map(|_| r.next_delay(Dialed::Failed, 1.0).as_millis()).collect();
    assert_eq!(upper, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
}

/// A replica held resets both; so does having nothing to dial for
/// (duplicates only).
#[test]
fn held_and_settled_reset() {
    let mut r = Redial::new(ms(500), ms(30_000));
    for _ in 0..20 {
        r.next_delay(Dialed::Duplicate, 0.5);
        r.next_delay(Dialed::Failed, 0.5);
    }
    assert_eq!(r.next_delay(Dialed::Held, 1.0), ms(500));
    assert_eq!(r.next_delay(Dialed::Failed, 1.0), ms(500), "failures start over");
    assert_eq!(r.next_delay(Dialed::Duplicate, 1.0), ms(500), "duplicates start over");
    for _ in 0..20 {
        r.next_delay(Dialed::Duplicate, 0.5);
    }
    r.settled();
    assert_eq!(r.next_delay(Dialed::Duplicate, 1.0), ms(500));
}

/// The duplicate cap never exceeds the configured max, nor falls below
/// the initial backoff.
#[test]
fn the_duplicate_cap_follows_the_configured_backoff() {
    let mut fast = Redial::new(ms(50), ms(500));
    let upper: Vec<_> = (0..12).map(|_| fast.next_delay(Dialed::Duplicate, 1.0).as_millis()).skip(9).collect();
    assert_eq!(upper, [50, 500, 500]);
    let mut slow = Redial::new(ms(5000), ms(60_000));
    let upper: Vec<_> = (0..12).map(|_| slow.next_delay(Dialed::Duplicate, 1.0).as_millis()).skip(9).collect();
    assert_eq!(upper, [5000, 5000, 5000]);
}
