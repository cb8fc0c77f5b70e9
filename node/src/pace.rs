//! Deadlines learned per provider (issue 46 item 3): how long its prompts
//! take to read and how far apart its streamed tokens come, and the two
//! deadlines that follow, so a local model is waited for as long as it
//! needs and a stalled one is cut in seconds, not minutes.
//!
//! - **First token** (time from sending the request to the first content
//!   delta, not the response headers): a multiple
//!   ([`PaceProfile::first_token_multiple`]) of the prefill time this
//!   prompt size takes at the provider's measured rate (p95 of its recent
//!   runs' time per prompt token), at least [`PaceProfile::floor`], plus
//!   the model's last measured load when it is not loaded (the residency
//!   cold-load extension); [`PaceProfile::first_token_fallback`] while
//!   fewer than [`PaceProfile::min_samples`] runs were measured.
//! - **Between tokens** (the response-stall timeout when the Edge sends the
//!   default, 0): a multiple ([`PaceProfile::stall_multiple`]) of the p95 of
//!   recent runs' longest gap between two deltas, at least the floor and at
//!   most the spec's 300 s default; that default while nothing is learned.
//!   An explicit `response_stall_timeout_ms` always wins.
//!
//! Pure: samples in, durations out. The node keeps one [`Pace`] per
//! provider for its whole life ([`PaceMemory`]): a reconnect does not
//! forget how fast a model is.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// The constants of the learned deadlines (tests shrink the floor and the
/// fallback: `iop-node --test-pace-floor-ms`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaceProfile {
    /// The shortest learned deadline.
    pub floor: Duration,
    /// The first-token deadline before anything is learned.
    pub first_token_fallback: Duration,
    /// Measured runs before the learned figures apply.
    pub min_samples: usize,
    /// First-token deadline = this × the expected prefill time.
    pub first_token_multiple: f64,
    /// Inter-token deadline = this × the p95 of runs' longest gaps.
    pub stall_multiple: f64,
}

impl Default for PaceProfile {
    fn default() -> Self {
        Self {
            floor: Duration::from_secs(10),
            first_token_fallback: Duration::from_secs(120),
            min_samples: 5,
            first_token_multiple: 3.0,
            stall_multiple: 5.0,
        }
    }
}

impl PaceProfile {
    /// A profile whose floor and fallback are `floor` (tests).
    pub fn with_floor(floor: Duration) -> Self {
        Self { floor, first_token_fallback: floor * 4, min_samples: 3, ..Self::default() }
    }
}

/// Runs remembered per provider.
const WINDOW: usize = 64;

/// One provider's recent runs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pace {
    /// Seconds per prompt token, from request sent to first content.
    prefill: VecDeque<f64>,
    /// Each run's longest gap between two content deltas, in seconds.
    gaps: VecDeque<f64>,
}

fn push(window: &mut VecDeque<f64>, sample: f64) {
    if window.len() == WINDOW {
        window.pop_front();
    }
    window.push_back(sample);
}

/// The 95th percentile of `samples` (nearest rank).
fn p95(samples: &VecDeque<f64>) -> f64 {
    let mut sorted: Vec<f64> = samples.iter().copied().collect();
    sorted.sort_by(f64::total_cmp);
    let rank = (sorted.len() * 95).div_ceil(100).max(1);
    sorted[rank - 1]
}

impl Pace {
    /// A run's first content came `first_token` after its request, for a
    /// prompt of about `prompt_tokens`.
    pub fn record_first_token(&mut self, prompt_tokens: u64, first_token: Duration) {
        push(&mut self.prefill, first_token.as_secs_f64() / prompt_tokens.max(1) as f64);
    }

    /// A streamed run ended; its longest gap between two deltas was `gap`.
    pub fn record_longest_gap(&mut self, gap: Duration) {
        push(&mut self.gaps, gap.as_secs_f64());
    }

    /// The first-token deadline for a prompt of about `prompt_tokens`, plus
    /// `load` (the model's last measured load when it is cold).
    pub fn first_token_deadline(&self, prompt_tokens: u64, load: Duration, profile: &PaceProfile) -> Duration {
        if self.prefill.len() < profile.min_samples {
            return profile.first_token_fallback + load;
        }
        let expected = p95(&self.prefill) * prompt_tokens.max(1) as f64 * profile.first_token_multiple;
        Duration::from_secs_f64(expected.min(MAX_SECS)).max(profile.floor) + load
    }

    /// The learned inter-token deadline, at most `ceiling`; `None` while
    /// nothing is learned.
    pub fn stall_deadline(&self, ceiling: Duration, profile: &PaceProfile) -> Option<Duration> {
        if self.gaps.len() < profile.min_samples {
            return None;
        }
        let learned = Duration::from_secs_f64((p95(&self.gaps) * profile.stall_multiple).min(MAX_SECS));
        Some(learned.clamp(profile.floor.min(ceiling), ceiling))
    }

    /// The learned figures the node reports: the p95 prefill time per 1,000
    /// prompt tokens and the learned inter-token deadline, in milliseconds
    /// (0: not learned yet).
    pub fn figures(&self, ceiling: Duration, profile: &PaceProfile) -> (u64, u64) {
        let prefill = if self.prefill.len() < profile.min_samples { 0.0 } else { p95(&self.prefill) * 1_000_000.0 };
        let stall = self.stall_deadline(ceiling, profile).map_or(0, |d| d.as_millis() as u64);
        (prefill.round() as u64, stall)
    }
}

/// Longest deadline a sample can make (an hour, the longest the wire allows).
const MAX_SECS: f64 = 3600.0;

/// Every provider's [`Pace`], process-wide.
#[derive(Debug, Default)]
pub struct PaceMemory {
    paces: Mutex<HashMap<String, Pace>>,
    profile: OnceLock<PaceProfile>,
}

impl PaceMemory {
    pub fn global() -> &'static Self {
        static GLOBAL: OnceLock<PaceMemory> = OnceLock::new();
        GLOBAL.get_or_init(Self::default)
    }

    /// Sets the profile once, at start (tests).
    pub fn set_profile(&self, profile: PaceProfile) {
        let _ = self.profile.set(profile);
    }

    pub fn profile(&self) -> PaceProfile {
        self.profile.get().copied().unwrap_or_default()
    }

    /// `provider`'s pace now.
    pub fn get(&self, provider: &str) -> Pace {
        self.paces.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(provider).cloned().unwrap_or_default()
    }

    /// Records into `provider`'s pace.
    pub fn update(&self, provider: &str, record: impl FnOnce(&mut Pace)) {
        let mut paces = self.paces.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        record(paces.entry(provider.to_owned()).or_default());
    }
}

#[cfg(test)]
mod tests;
