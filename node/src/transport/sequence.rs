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
mod tests;
