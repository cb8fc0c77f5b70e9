//! Response-stall liveness on the node: one [`StallWatchdog`] per run and per
//! tunnel, and the evidence join that follows a stall claim.
//!
//! Only progress resets the watchdog: for runs every non-terminal event the
//! adapter produced (started, text, tool call, usage), for tunnels the
//! response head and body chunks. A terminal wins over whatever it carries.
//! When the provider stays silent for the response-stall timeout the
//! watchdog claims the stall exactly once; from then on the execution is
//! fenced: anything the provider still produces is dropped and counted.
//!
//! After the claim two bounded things run concurrently and are joined (the
//! wait is the longer of the two bounds, never their sum): the close-grace
//! fence (the provider request is torn down; its return confirmed within the
//! grace makes the failure `retryable`) and an independent exact-target
//! health probe (a metadata call, never a generation). The probe's verdict
//! becomes the three-way evidence on the single `response_stalled` terminal.
//! A successful probe is not progress and grants no retry by itself.
//!
//! Before the provider's first byte a second, distinct deadline applies:
//! the first-byte timeout, from sending the request until any byte of the
//! answer (its headers included, [`FirstByte`]). Missing it is claimed like
//! a stall (the same evidence join and `response_stalled` terminal, replayed
//! by the Edge before the commit point) and labelled `first_byte`
//! (`ExecutionFailure.first_byte_timeout`). The stall timeout keeps its
//! meaning and still bounds the wait before the first byte too.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use iop_proto::pb;
use tokio::time::Instant;

/// How long the torn-down provider request has to confirm its return.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// Bound of the exact-target health probe after a stall (the probe's own).
pub use crate::adapter::probe::PROBE_TIMEOUT;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Watching,
    /// The stall was claimed: later output is fenced.
    Claimed,
    /// The provider finished (a terminal) before any claim.
    Finished,
}

/// The activity watchdog of one execution. Pure: callers pass the time.
#[derive(Debug, Clone)]
pub struct StallWatchdog {
    timeout: Duration,
    started: Instant,
    last_progress: Instant,
    /// Until the provider's first byte: when the first-byte deadline passes.
    first_byte_by: Option<Instant>,
    /// Until the provider's first content: when the first-token deadline
    /// passes (`crate::pace`).
    first_token_by: Option<Instant>,
    /// What the claim was for.
    missed: Option<Missed>,
    phase: Phase,
    /// The first content, and the last, and the longest gap between two.
    first_content: Option<Instant>,
    last_content: Option<Instant>,
    longest_gap: Duration,
}

/// Which deadline a claim was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    /// Nothing at all (not even headers) by the first-byte deadline.
    FirstByte,
    /// No content by the first-token deadline.
    FirstToken,
    /// Silence for the stall timeout after progress.
    Stall,
}

/// What happened to one piece of provider output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Counted as progress; forward it.
    Accepted,
    /// Arrived after the stall claim: drop it.
    Fenced,
}

impl StallWatchdog {
    pub fn new(timeout: Duration, now: Instant) -> Self {
        Self {
            timeout,
            started: now,
            last_progress: now,
            first_byte_by: None,
            first_token_by: None,
            missed: None,
            phase: Phase::Watching,
            first_content: None,
            last_content: None,
            longest_gap: Duration::ZERO,
        }
    }

    /// With a first-byte deadline `first_byte` after the start.
    pub fn with_first_byte(mut self, first_byte: Duration) -> Self {
        self.first_byte_by = Some(self.started + first_byte);
        self
    }

    /// With a first-token deadline `first_token` after the start.
    pub fn with_first_token(mut self, first_token: Duration) -> Self {
        self.first_token_by = Some(self.started + first_token);
        self
    }

    /// A piece of the answer itself (content, not headers or metadata)
    /// arrived at `now`: the first-token deadline no longer applies.
    pub fn content(&mut self, now: Instant) {
        self.first_token_by = None;
        self.first_content.get_or_insert(now);
        if let Some(last) = self.last_content.replace(now) {
            self.longest_gap = self.longest_gap.max(now.saturating_duration_since(last));
        }
    }

    /// Time to the first content, and the longest gap between two contents
    /// (`None` before two): what `crate::pace` learns from a finished run.
    pub fn pace(&self) -> (Option<Duration>, Option<Duration>) {
        let first = self.first_content.map(|at| at.saturating_duration_since(self.started));
        let two = self.first_content.is_some() && self.last_content != self.first_content;
        (first, two.then_some(self.longest_gap))
    }

    /// The provider's first byte arrived (its response headers): the
    /// first-byte deadline no longer applies. Not progress.
    pub fn first_byte(&mut self) {
        self.first_byte_by = None;
    }

    /// Provider output (never a terminal) arrived.
    pub fn progress(&mut self, now: Instant) -> Progress {
        match self.phase {
            Phase::Watching => {
                self.last_progress = self.last_progress.max(now);
                self.first_byte_by = None;
                Progress::Accepted
            }
            Phase::Claimed | Phase::Finished => Progress::Fenced,
        }
    }

    /// When the stall (or the first-byte deadline, if sooner) fires if
    /// nothing else happens; `None` once claimed or finished.
    pub fn deadline(&self) -> Option<Instant> {
        let stall = self.last_progress + self.timeout;
        let earliest = [self.first_byte_by, self.first_token_by].into_iter().flatten().fold(stall, Instant::min);
        (self.phase == Phase::Watching).then_some(earliest)
    }

    /// Claims the stall if the provider has been silent for the timeout, or
    /// sent nothing by its first-byte deadline. Returns how long it was
    /// silent; claims at most once.
    pub fn claim(&mut self, now: Instant) -> Option<Duration> {
        let deadline = self.deadline()?;
        if now < deadline {
            return None;
        }
        self.missed = Some(if self.first_byte_by.is_some_and(|at| now >= at) {
            Missed::FirstByte
        } else if self.first_token_by.is_some_and(|at| now >= at) {
            Missed::FirstToken
        } else {
            Missed::Stall
        });
        self.phase = Phase::Claimed;
        Some(now - self.last_progress)
    }

    /// What the claim was for (`None` before one).
    pub fn missed(&self) -> Option<Missed> {
        self.missed
    }

    /// The claim was for a deadline before the answer started (the first
    /// byte, or the first token: stage `first_byte` on the wire), not for
    /// silence after it.
    pub fn missed_first_byte(&self) -> bool {
        matches!(self.missed, Some(Missed::FirstByte | Missed::FirstToken))
    }

    /// The provider's terminal arrived. It wins unless the stall was already
    /// claimed (then the stall terminal is the one that counts): returns
    /// whether the terminal may be emitted.
    pub fn finish(&mut self) -> bool {
        match self.phase {
            Phase::Watching => {
                self.phase = Phase::Finished;
                true
            }
            Phase::Claimed | Phase::Finished => false,
        }
    }
}

/// Whether the provider's first byte (its response headers) arrived, set by
/// the code that sends the provider request ([`FirstByte::mark`]) and read
/// by the execution's watchdog.
#[derive(Debug, Clone, Default)]
pub struct FirstByte(Arc<OnceLock<Instant>>);

tokio::task_local! {
    static FIRST_BYTE: FirstByte;
}

impl FirstByte {
    pub fn arrived(&self) -> bool {
        self.0.get().is_some()
    }

    /// When the first byte arrived (the first mark).
    pub fn arrived_at(&self) -> Option<Instant> {
        self.0.get().copied()
    }

    /// `work` with this as its execution's first-byte signal.
    pub fn scope<F: Future>(self, work: F) -> impl Future<Output = F::Output> {
        FIRST_BYTE.scope(self, work)
    }

    /// Marks the first byte of the execution being polled; nothing outside one.
    pub fn mark() {
        let _ = FIRST_BYTE.try_with(|f| {
            f.0.get_or_init(Instant::now);
        });
    }
}

/// The joined outcome of the close-grace fence and the health probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StallEvidence {
    pub health: pb::ProviderHealth,
    pub classification: pb::LivenessClassification,
    /// The provider request's return was confirmed within the close grace.
    pub retryable: bool,
}

/// Runs the close-grace fence (`closed` resolves when the provider request
/// has returned) and the probe concurrently, each under its own bound, and
/// joins them. A probe that errs or times out yields `unknown`.
pub async fn join_evidence(
    closed: impl Future<Output = ()>,
    probe: impl Future<Output = pb::ProviderHealth>,
    grace: Duration,
    probe_timeout: Duration,
) -> StallEvidence {
    let (closed, probed) =
        tokio::join!(tokio::time::timeout(grace, closed), tokio::time::timeout(probe_timeout, probe));
    let health = match probed {
        Ok(pb::ProviderHealth::Available) => pb::ProviderHealth::Available,
        Ok(pb::ProviderHealth::Unavailable) => pb::ProviderHealth::Unavailable,
        Ok(pb::ProviderHealth::Unknown | pb::ProviderHealth::Unspecified) | Err(_) => pb::ProviderHealth::Unknown,
    };
    StallEvidence { health, classification: iop_proto::wire::classify(health), retryable: closed.is_ok() }
}

impl StallEvidence {
    /// The single `response_stalled` failure: node-owned safe metadata only.
    pub fn to_failure(self, silent_for: Duration, sequence: Option<u64>) -> pb::ExecutionFailure {
        let mut failure = pb::ExecutionFailure::new(
            pb::FailureKind::ResponseStalled,
            format!("no progress from the provider for {} ms", silent_for.as_millis()),
        );
        failure.provider_health = self.health.into();
        failure.liveness_classification = self.classification.into();
        failure.retryable = self.retryable;
        failure.stalled_after_ms = silent_for.as_millis() as u64;
        failure.health_observation_seq = sequence;
        failure
    }
}

#[cfg(test)]
mod tests;
