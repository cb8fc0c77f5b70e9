//! The connection-scoped health observation sequence. Each connection
//! (session) owns one source: it starts at 0 and the first observation gets
//! 1; runs and tunnels of that connection share it, so values are unique and
//! increasing even when observations finalize concurrently.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct SessionSequence {
    last: AtomicU64,
}

impl SessionSequence {
    pub fn next(&self) -> u64 {
        self.last.fetch_add(1, Ordering::AcqRel) + 1
    }
}

#[cfg(test)]
mod tests {
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
}
