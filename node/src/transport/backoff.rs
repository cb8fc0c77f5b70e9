//! Capped exponential reconnect backoff with jitter. Pure: the caller passes
//! the random draw, so tests are deterministic.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self { initial, max, attempt: 0 }
    }

    /// Delay before the next attempt. "Equal jitter": half the capped
    /// exponential step plus a random share of the other half, so nodes that
    /// lost the same Edge spread out but never retry instantly.
    /// `unit` is a random draw in [0, 1).
    pub fn next_delay(&mut self, unit: f64) -> Duration {
        let step = self.initial.saturating_mul(1u32 << self.attempt.min(20)).min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        step / 2 + step.mul_f64(unit.clamp(0.0, 1.0) / 2.0)
    }

    /// A connection that reached Ready resets the backoff.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests;
