use super::*;

#[test]
fn grows_exponentially_and_is_capped() {
    let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
    let upper: Vec<_> = (0..6).map(|_| b.next_delay(1.0).as_millis()).collect();
    assert_eq!(upper, [100, 200, 400, 800, 1000, 1000]);
    b.reset();
    assert_eq!(b.next_delay(0.0), Duration::from_millis(50), "lower bound is half the step");
}
