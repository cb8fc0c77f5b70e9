//! When the supervisor dials the Edge again. Pure: the caller passes the
//! random draw, so tests are deterministic.
//!
//! [`Backoff`] is the capped exponential backoff with jitter of a dial that
//! failed or a session the Edge refused. [`Redial`] picks the pause by what
//! the last dial came to: a failure backs off exponentially (the Edge, or
//! the way to it, is down or refusing: many nodes must not hammer it), but
//! a dial the load balancer brought to a replica the node holds already (a
//! duplicate) proves the Edge answers; the node only has not reached the
//! replica it misses yet. Backing off there kept nodes from a new replica
//! for up to the 30 s cap (issue 43: 10 to 41 s in a scale-up), so a
//! duplicate waits a short pause instead, bounded so that a load balancer
//! that keeps landing on held replicas (the missing one is not up yet, or
//! never comes) is not dialed in a tight loop.

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
        jitter(step, unit)
    }

    /// A connection that reached Ready resets the backoff.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// "Equal jitter": half of `step` plus a random share (`unit` in [0, 1)) of
/// the other half.
fn jitter(step: Duration, unit: f64) -> Duration {
    step / 2 + step.mul_f64(unit.clamp(0.0, 1.0) / 2.0)
}

/// What a dial came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialed {
    /// A session with a replica the node did not hold: kept.
    Held,
    /// The replica that answered is held already: this session was closed.
    Duplicate,
    /// No connection, or the Edge refused the session before registering it.
    Failed,
    /// The Edge refused the node's certificate or identity at the
    /// handshake (`super::refusal`); backs off as a failure does.
    Refused,
}

impl Dialed {
    /// `iop_node_edge_dials_total{outcome}`.
    pub fn label(self) -> &'static str {
        match self {
            Dialed::Held => "held",
            Dialed::Duplicate => "duplicate",
            Dialed::Failed => "failed",
            Dialed::Refused => "refused",
        }
    }
}

/// Duplicates in a row paused only the initial backoff: enough for a node
/// to reach a new replica among several within a few seconds once it is up.
pub const QUICK_DUPLICATES: u32 = 10;
/// The pause after more duplicates in a row (jittered: 1 to 2 s): a replica
/// listed but not up yet, or one that never comes, costs each node a
/// handshake every second or two with a held replica, no more.
pub const DUPLICATE_CAP: Duration = Duration::from_secs(2);

/// The pause before each dial, by what the previous one came to.
#[derive(Debug, Clone)]
pub struct Redial {
    initial: Duration,
    duplicate_cap: Duration,
    /// Failed dials and refused sessions.
    failures: Backoff,
    /// Duplicates since the last replica held (or the last time nothing was
    /// missing).
    duplicates: u32,
}

impl Redial {
    /// `initial` and `max`: the configured reconnect backoff
    /// (`reconnect.initial_backoff_ms`, `reconnect.max_backoff_ms`).
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            duplicate_cap: DUPLICATE_CAP.min(max).max(initial),
            failures: Backoff::new(initial, max),
            duplicates: 0,
        }
    }

    /// The pause after a dial that came to `dialed` (`unit`: a random draw
    /// in [0, 1)).
    /// - held: the initial backoff (jittered), everything reset;
    /// - duplicate: the initial backoff for the first [`QUICK_DUPLICATES`]
    ///   in a row, then [`DUPLICATE_CAP`] (never above the configured max);
    ///   the failure backoff neither grows nor resets;
    /// - failed or refused: the next step of the capped exponential backoff.
    pub fn next_delay(&mut self, dialed: Dialed, unit: f64) -> Duration {
        match dialed {
            Dialed::Held => {
                self.failures.reset();
                self.duplicates = 0;
                jitter(self.initial, unit)
            }
            Dialed::Duplicate => {
                self.duplicates = self.duplicates.saturating_add(1);
                let step = if self.duplicates <= QUICK_DUPLICATES { self.initial } else { self.duplicate_cap };
                jitter(step, unit)
            }
            Dialed::Failed | Dialed::Refused => self.failures.next_delay(unit),
        }
    }

    /// Nothing is missing (every listed replica is held): the next time one
    /// is, the duplicates start again from quick pauses.
    pub fn settled(&mut self) {
        self.duplicates = 0;
    }
}

#[cfg(test)]
mod tests;
