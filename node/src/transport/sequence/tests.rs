use super::*;
use std::sync::Arc;

#[test]
fn starts_at_one_and_is_unique_under_concurrency() {
    let seq = Arc::new(SessionSequence::default());
    assert_eq!(seq.next(), 1);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let seq = seq.clone();
            std::thread::spawn(move || (0..1000).map(|_| seq.next()).collect::<Vec<_>>())
        })
        .collect();
    let mut all: Vec<u64> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 4000);
    assert_eq!(all.first(), Some(&2));
    assert_eq!(all.last(), Some(&4001));
}
