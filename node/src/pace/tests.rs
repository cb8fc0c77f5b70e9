use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn nothing_is_learned_before_the_minimum_of_runs() {
    let profile = PaceProfile::default();
    let mut pace = Pace::default();
    for _ in 0..4 {
        pace.record_first_token(100, ms(100));
        pace.record_longest_gap(ms(50));
    }
    assert_eq!(pace.first_token_deadline(1_000, Duration::ZERO, &profile), profile.first_token_fallback);
    assert_eq!(pace.first_token_deadline(1_000, ms(7_000), &profile), profile.first_token_fallback + ms(7_000));
    assert_eq!(pace.stall_deadline(Duration::from_secs(300), &profile), None);
    assert_eq!(pace.figures(Duration::from_secs(300), &profile), (0, 0));
}

/// (prompt tokens, load ms, the deadline in ms) once a provider that reads
/// 1,000 prompt tokens a second (p95) is learned: three times the expected
/// prefill, at least the 10 s floor, plus the load when cold.
#[test]
fn the_first_token_deadline_follows_the_prefill_rate() {
    let profile = PaceProfile::default();
    let mut pace = Pace::default();
    for _ in 0..19 {
        pace.record_first_token(2_000, ms(1_000)); // 0.5 ms a token
    }
    for _ in 0..2 {
        pace.record_first_token(1_000, ms(1_000)); // slow runs: 1 ms a token, the p95 of 21
    }
    for (prompt, load, want) in [(100, 0, 10_000), (10_000, 0, 30_000), (10_000, 20_000, 50_000), (3_000, 0, 10_000)] {
        assert_eq!(pace.first_token_deadline(prompt, ms(load), &profile), ms(want), "{prompt} tokens, load {load}");
    }
    assert_eq!(pace.figures(Duration::from_secs(300), &profile).0, 1_000, "ms per 1k prompt tokens");
}

/// The inter-token deadline: five times the p95 of runs' longest gaps,
/// between the floor and the ceiling.
#[test]
fn the_stall_deadline_follows_the_token_rate() {
    let profile = PaceProfile::default();
    let ceiling = Duration::from_secs(300);
    let deadline = |gaps: &[u64]| {
        let mut pace = Pace::default();
        for gap in gaps {
            pace.record_longest_gap(ms(*gap));
        }
        pace.stall_deadline(ceiling, &profile).map(|d| d.as_millis() as u64)
    };
    assert_eq!(deadline(&[200; 10]), Some(10_000), "a fast stream: the floor");
    assert_eq!(deadline(&[4_000; 10]), Some(20_000));
    assert_eq!(deadline(&[100_000; 10]), Some(300_000), "never past the ceiling");
    assert_eq!(
        deadline(&[100, 100, 100, 100, 100, 100, 100, 100, 100, 9_000]),
        Some(45_000),
        "the p95 of 10 is the longest"
    );
    let mut twenty = vec![100; 19];
    twenty.push(9_000);
    assert_eq!(deadline(&twenty), Some(10_000), "one slow run in 20 is past the p95");
    let mut pace = Pace::default();
    for _ in 0..10 {
        pace.record_longest_gap(ms(4_000));
    }
    assert_eq!(pace.stall_deadline(ms(15_000), &profile), Some(ms(15_000)), "an explicit lower ceiling");
}

#[test]
fn only_the_recent_runs_count() {
    let profile = PaceProfile::default();
    let mut pace = Pace::default();
    for _ in 0..WINDOW {
        pace.record_longest_gap(Duration::from_secs(50));
    }
    for _ in 0..WINDOW {
        pace.record_longest_gap(ms(10));
    }
    assert_eq!(pace.stall_deadline(Duration::from_secs(300), &profile), Some(profile.floor));
}

#[test]
fn a_test_profile_shrinks_the_floor_and_the_fallback() {
    let profile = PaceProfile::with_floor(ms(300));
    assert_eq!((profile.floor, profile.first_token_fallback, profile.min_samples), (ms(300), ms(1_200), 3));
}
