use super::*;

const LIMITS: BodyLimits =
    BodyLimits { max_bytes: 1 << 20, idle: Duration::from_secs(10), min_rate: 1000, in_flight: 3 << 20 };

/// Each chunk within the idle bound of the last, and the whole at the
/// minimum rate once the first idle bound passed; no minimum at 0.
#[test]
fn the_next_chunk_is_due_by_the_idle_bound_and_the_minimum_rate() {
    let started = Instant::now();
    let s = Duration::from_secs;
    // Nothing yet: one idle bound.
    assert_eq!(next_chunk_by(started, started, 0, LIMITS), started + s(10));
    // Steady at the minimum: the idle bound of the last chunk rules.
    assert_eq!(next_chunk_by(started, started + s(5), 50_000, LIMITS), started + s(15));
    // A byte every 9 s: each within the idle bound, but 3 bytes by 27 s
    // earn 3 ms past the first 10 s.
    let trickle = next_chunk_by(started, started + s(27), 3, LIMITS);
    assert_eq!(trickle, started + s(10) + Duration::from_millis(3));
    let no_minimum = BodyLimits { min_rate: 0, ..LIMITS };
    assert_eq!(next_chunk_by(started, started + s(27), 3, no_minimum), started + s(37));
}

/// Shares of the budget add up to at most its limit and are given back
/// when dropped; a share that does not fit takes nothing.
#[test]
fn the_budget_is_shared_and_given_back() {
    let budget = Arc::new(BodyBudget::default());
    let mut a = budget.permit();
    let mut b = budget.permit();
    assert!(a.grow(2 << 20, LIMITS.in_flight));
    assert!(!b.grow(2 << 20, LIMITS.in_flight), "over the limit");
    assert_eq!(budget.held(), 2 << 20, "a refused share takes nothing");
    assert!(b.grow(1 << 20, LIMITS.in_flight));
    assert!(!b.grow(1, LIMITS.in_flight));
    drop(a);
    assert_eq!(budget.held(), 1 << 20);
    assert!(b.grow(1, LIMITS.in_flight));
    drop(b);
    assert_eq!(budget.held(), 0);
}
