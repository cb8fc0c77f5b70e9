use super::*;
use pb::ProviderHealth::{Available, Unavailable, Unknown};

fn profile() -> HealthConfig {
    HealthConfig { idle_interval_ms: 60_000, retry_initial_ms: 1_000, retry_max_ms: 30_000 }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn unavailable_providers_back_off_to_the_cap_and_available_ones_idle() {
    let t0 = Instant::now();
    let mut s = HealthSchedule::new(profile(), [("a".into(), Available), ("b".into(), Unavailable)], t0);
    assert_eq!(s.next_due(), Some(t0 + ms(1_000)), "the unavailable one first, after the initial retry");
    assert_eq!(s.due(t0 + ms(999)), Vec::<String>::new());
    assert_eq!(s.due(t0 + ms(1_000)), vec!["b".to_string()]);

    // Still down: 1 s, 2 s, 4 s, ... capped at 30 s; nothing owed.
    let mut now = t0 + ms(1_000);
    let mut waits = Vec::new();
    for _ in 0..8 {
        assert!(!s.probed("b", Unavailable, now), "unchanged verdicts are not reported again");
        let due = s.entries["b"].due;
        waits.push((due - now).as_millis() as u64);
        now = due;
    }
    assert_eq!(waits, [1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000]);

    // It returns: reported once, then probed on the idle interval.
    assert!(s.probed("b", Available, now), "a change is owed a report");
    assert_eq!(s.entries["b"].due, now + ms(60_000));
    assert!(!s.probed("b", Available, now + ms(60_000)));
    assert_eq!(s.entries["a"].due, t0 + ms(60_000), "the idle provider waits the idle interval");
}

#[test]
fn an_idle_provider_that_goes_down_is_reported_and_retried_soon() {
    let t0 = Instant::now();
    let mut s = HealthSchedule::new(profile(), [("a".into(), Available)], t0);
    let t1 = t0 + ms(60_000);
    assert!(s.probed("a", Unavailable, t1));
    assert_eq!(s.entries["a"].due, t1 + ms(1_000));
    assert!(s.probed("a", Unknown, t1 + ms(1_000)), "unknown differs from unavailable");
    assert_eq!(s.entries["a"].due, t1 + ms(3_000), "still backing off: not available");
}

#[test]
fn evidence_from_a_run_restarts_the_retry_and_counts_as_reported() {
    let t0 = Instant::now();
    let mut s = HealthSchedule::new(profile(), [("a".into(), Available), ("b".into(), Available)], t0);
    s.lowered("a", t0 + ms(5));
    assert_eq!(s.next_due(), Some(t0 + ms(1_005)));
    assert!(!s.probed("a", Unavailable, t0 + ms(1_005)), "the Edge already has this verdict");
    assert!(s.probed("a", Available, t0 + ms(3_005)), "its return is reported");
    assert_eq!(s.entries["b"].reported, Available, "a sibling is untouched");
    assert!(!s.probed("unknown", Available, t0), "providers outside the schedule are ignored");
    s.lowered("unknown", t0);
    assert!(!s.entries.contains_key("unknown"));
}
