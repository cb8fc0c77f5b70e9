//! The transport liveness profile shared by both transports. The spec fixes
//! it at a 30 s heartbeat interval and a 45 s wait: long enough that a
//! healthy connection survives a long prompt prefill or streaming
//! backpressure. It is a transport constant, not a wire field and not user
//! config; only tests shorten it (both binaries take a hidden flag).

use std::time::Duration;

/// Close reason when no heartbeat answer arrived within the wait.
pub const HEARTBEAT_TIMEOUT_REASON: &str = "heartbeat_timeout";

/// Wire value 0 for `response_stall_timeout_ms` means this default.
pub const DEFAULT_RESPONSE_STALL_TIMEOUT_MS: u64 = 300_000;
/// Shortest explicit `response_stall_timeout_ms` (one second).
pub const MIN_RESPONSE_STALL_TIMEOUT_MS: u64 = 1_000;
/// Longest explicit `response_stall_timeout_ms` (one hour).
pub const MAX_RESPONSE_STALL_TIMEOUT_MS: u64 = 3_600_000;

/// A `response_stall_timeout_ms` outside the one rule both sides apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "response_stall_timeout_ms {0} is out of range (0 for the default, or {MIN_RESPONSE_STALL_TIMEOUT_MS}..={MAX_RESPONSE_STALL_TIMEOUT_MS})"
)]
pub struct StallTimeoutOutOfRange(pub u64);

/// The one rule for `response_stall_timeout_ms`, applied by the Edge config
/// and by the node to every request: 0 means the default (300 s), anything
/// else must be 1000..=3600000 ms.
pub fn response_stall_timeout(ms: u64) -> Result<Duration, StallTimeoutOutOfRange> {
    match ms {
        0 => Ok(Duration::from_millis(DEFAULT_RESPONSE_STALL_TIMEOUT_MS)),
        MIN_RESPONSE_STALL_TIMEOUT_MS..=MAX_RESPONSE_STALL_TIMEOUT_MS => Ok(Duration::from_millis(ms)),
        other => Err(StallTimeoutOutOfRange(other)),
    }
}

// The first-byte deadline is what shortens the wait on a silent provider.
const _: () = assert!(DEFAULT_FIRST_BYTE_TIMEOUT_MS < DEFAULT_RESPONSE_STALL_TIMEOUT_MS);

/// Wire value 0 for `first_byte_timeout_ms` means this default: a cold
/// model load on a Mac (a 40 GB model read at 2-3 GB/s is 15-20 s, plus
/// warm-up and the prompt's prefill, which Ollama finishes before it sends
/// its headers) fits with room to spare, while a provider that accepts the
/// connection and never answers is abandoned after a minute, not five
/// (docs/routing.md, "Retries before the first byte").
pub const DEFAULT_FIRST_BYTE_TIMEOUT_MS: u64 = 60_000;

/// A `first_byte_timeout_ms` outside the one rule both sides apply (the
/// same range as the stall timeout's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "first_byte_timeout_ms {0} is out of range (0 for the default, or {MIN_RESPONSE_STALL_TIMEOUT_MS}..={MAX_RESPONSE_STALL_TIMEOUT_MS})"
)]
pub struct FirstByteTimeoutOutOfRange(pub u64);

/// The one rule for `first_byte_timeout_ms` (the time from sending the
/// request to the provider until any byte of its answer, headers included),
/// applied by the Edge config and by the node to every request: 0 means the
/// default (60 s), anything else must be 1000..=3600000 ms.
pub fn first_byte_timeout(ms: u64) -> Result<Duration, FirstByteTimeoutOutOfRange> {
    match ms {
        0 => Ok(Duration::from_millis(DEFAULT_FIRST_BYTE_TIMEOUT_MS)),
        MIN_RESPONSE_STALL_TIMEOUT_MS..=MAX_RESPONSE_STALL_TIMEOUT_MS => Ok(Duration::from_millis(ms)),
        other => Err(FirstByteTimeoutOutOfRange(other)),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatProfile {
    /// How often each side sends a heartbeat.
    pub interval: Duration,
    /// How long a side waits for any answer before closing with `heartbeat_timeout`.
    pub wait: Duration,
}

impl HeartbeatProfile {
    pub const PRODUCTION: HeartbeatProfile =
        HeartbeatProfile { interval: Duration::from_secs(30), wait: Duration::from_secs(45) };

    /// Parses the test override `INTERVAL_MS,WAIT_MS`.
    pub fn parse_test_override(text: &str) -> Result<Self, String> {
        let (interval, wait) =
            text.split_once(',').ok_or_else(|| format!("heartbeat profile `{text}` is not INTERVAL_MS,WAIT_MS"))?;
        let parse = |s: &str| {
            s.trim()
                .parse::<u64>()
                .map_err(|_| format!("heartbeat profile `{text}`: `{s}` is not a number of milliseconds"))
        };
        let (interval, wait) = (parse(interval)?, parse(wait)?);
        if interval == 0 || wait <= interval {
            return Err(format!("heartbeat profile `{text}`: interval must be > 0 and wait must exceed it"));
        }
        Ok(Self { interval: Duration::from_millis(interval), wait: Duration::from_millis(wait) })
    }
}

impl Default for HeartbeatProfile {
    fn default() -> Self {
        Self::PRODUCTION
    }
}

/// Tracks when the peer last answered, and decides when the wait is exceeded.
/// Pure: the caller passes the current instant, so tests need no clock.
#[derive(Debug, Clone)]
pub struct HeartbeatMonitor<I> {
    profile: HeartbeatProfile,
    last_heard: I,
    next_seq: u64,
}

impl<I> HeartbeatMonitor<I>
where
    I: Copy + Ord + std::ops::Add<Duration, Output = I>,
{
    pub fn new(profile: HeartbeatProfile, now: I) -> Self {
        Self { profile, last_heard: now, next_seq: 1 }
    }

    /// Anything received from the peer proves it is alive.
    pub fn heard(&mut self, now: I) {
        if now > self.last_heard {
            self.last_heard = now;
        }
    }

    /// Sequence number for the next heartbeat we send.
    pub fn next_ping(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// True once the peer has been silent for longer than the wait.
    pub fn expired(&self, now: I) -> bool {
        now > self.last_heard + self.profile.wait
    }

    pub fn deadline(&self) -> I {
        self.last_heard + self.profile.wait
    }
}

#[cfg(test)]
mod tests;
