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
    last_progress: Instant,
    /// Until the provider's first byte: when the first-byte deadline passes.
    first_byte_by: Option<Instant>,
    /// The claim was for the first-byte deadline.
    missed_first_byte: bool,
    phase: Phase,
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
        Self { timeout, last_progress: now, first_byte_by: None, missed_first_byte: false, phase: Phase::Watching }
    }

    /// With a first-byte deadline `first_byte` after the start.
    pub fn with_first_byte(mut self, first_byte: Duration) -> Self {
        self.first_byte_by = Some(self.last_progress + first_byte);
        self
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
        (self.phase == Phase::Watching).then(|| self.first_byte_by.map_or(stall, |at| at.min(stall)))
    }

    /// Claims the stall if the provider has been silent for the timeout, or
    /// sent nothing by its first-byte deadline. Returns how long it was
    /// silent; claims at most once.
    pub fn claim(&mut self, now: Instant) -> Option<Duration> {
        let deadline = self.deadline()?;
        if now < deadline {
            return None;
        }
        self.missed_first_byte = self.first_byte_by.is_some_and(|at| now >= at);
        self.phase = Phase::Claimed;
        Some(now - self.last_progress)
    }

    /// The claim was for the first-byte deadline (stage `first_byte`), not
    /// for silence after the first byte.
    pub fn missed_first_byte(&self) -> bool {
        self.missed_first_byte
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
mod tests {
    use super::*;
    use pb::{LivenessClassification as C, ProviderHealth as H};

    fn at(ms: u64, base: Instant) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[tokio::test(start_paused = true)]
    async fn fires_at_the_threshold_and_only_progress_resets_it() {
        let t0 = Instant::now();
        let mut dog = StallWatchdog::new(Duration::from_millis(1000), t0);
        assert_eq!(dog.claim(at(999, t0)), None, "below the threshold");
        assert_eq!(dog.progress(at(500, t0)), Progress::Accepted);
        assert_eq!(dog.deadline(), Some(at(1500, t0)), "progress moved the deadline");
        assert_eq!(dog.claim(at(1499, t0)), None);
        assert_eq!(dog.claim(at(1500, t0)), Some(Duration::from_millis(1000)), "exactly at the threshold");
        assert_eq!(dog.claim(at(5000, t0)), None, "claimed once");
        assert_eq!(dog.deadline(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_byte_deadline_applies_until_any_byte_and_is_labelled() {
        let t0 = Instant::now();
        let fresh = || StallWatchdog::new(Duration::from_millis(1000), t0).with_first_byte(Duration::from_millis(300));
        // Nothing at all: claimed at the first-byte deadline, as first_byte.
        let mut silent = fresh();
        assert_eq!(silent.deadline(), Some(at(300, t0)));
        assert_eq!(silent.claim(at(299, t0)), None);
        assert_eq!(silent.claim(at(300, t0)), Some(Duration::from_millis(300)));
        assert!(silent.missed_first_byte());
        // Headers arrived: only the stall timeout is left, from the start.
        let mut headers = fresh();
        headers.first_byte();
        assert_eq!(headers.deadline(), Some(at(1000, t0)), "headers are not progress");
        assert_eq!(headers.claim(at(1000, t0)), Some(Duration::from_millis(1000)));
        assert!(!headers.missed_first_byte(), "a stall, not a missed first byte");
        // Output is a first byte too.
        let mut output = fresh();
        assert_eq!(output.progress(at(100, t0)), Progress::Accepted);
        assert_eq!(output.deadline(), Some(at(1100, t0)));
        // A stall timeout shorter than the first-byte one still bounds the wait.
        let mut short = StallWatchdog::new(Duration::from_millis(200), t0).with_first_byte(Duration::from_millis(300));
        assert_eq!(short.claim(at(200, t0)), Some(Duration::from_millis(200)));
        assert!(!short.missed_first_byte());
    }

    #[tokio::test]
    async fn the_first_byte_mark_reaches_only_its_own_scope() {
        let mine = FirstByte::default();
        let other = FirstByte::default();
        FirstByte::mark(); // outside any execution: nothing
        mine.clone().scope(async { FirstByte::mark() }).await;
        assert!(mine.arrived());
        assert!(!other.arrived());
    }

    #[tokio::test(start_paused = true)]
    async fn output_after_the_claim_is_fenced_and_the_terminal_loses() {
        let t0 = Instant::now();
        let mut dog = StallWatchdog::new(Duration::from_millis(10), t0);
        assert!(dog.claim(at(10, t0)).is_some());
        assert_eq!(dog.progress(at(11, t0)), Progress::Fenced);
        assert!(!dog.finish(), "the stall terminal already counts");
    }

    #[tokio::test(start_paused = true)]
    async fn a_terminal_before_the_claim_wins_and_ends_watching() {
        let t0 = Instant::now();
        let mut dog = StallWatchdog::new(Duration::from_millis(10), t0);
        assert!(dog.finish());
        assert_eq!(dog.claim(at(100, t0)), None);
        assert_eq!(dog.progress(at(101, t0)), Progress::Fenced);
        assert!(!dog.finish(), "exactly one terminal");
    }

    #[tokio::test(start_paused = true)]
    async fn close_and_probe_are_joined_not_serialized() {
        let started = Instant::now();
        let slow_close = tokio::time::sleep(Duration::from_millis(1500));
        let slow_probe = async {
            tokio::time::sleep(Duration::from_millis(1800)).await;
            H::Available
        };
        let evidence = join_evidence(slow_close, slow_probe, CLOSE_GRACE, PROBE_TIMEOUT).await;
        assert_eq!(started.elapsed(), Duration::from_millis(1800), "the longer of the two, not the sum");
        assert_eq!(
            evidence,
            StallEvidence { health: H::Available, classification: C::RequestStalled, retryable: true }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn no_return_within_grace_is_not_retryable_and_a_hung_probe_is_unknown() {
        let started = Instant::now();
        let never_closes = std::future::pending::<()>();
        let hung_probe = std::future::pending::<H>();
        let evidence = join_evidence(never_closes, hung_probe, CLOSE_GRACE, PROBE_TIMEOUT).await;
        assert_eq!(started.elapsed(), PROBE_TIMEOUT.max(CLOSE_GRACE), "both bounded");
        assert_eq!(evidence, StallEvidence { health: H::Unknown, classification: C::HealthUnknown, retryable: false });
    }

    #[tokio::test(start_paused = true)]
    async fn probe_outcomes_pair_fail_closed() {
        for (probe, pair) in [
            (H::Available, (H::Available, C::RequestStalled)),
            (H::Unavailable, (H::Unavailable, C::ProviderUnhealthy)),
            (H::Unknown, (H::Unknown, C::HealthUnknown)),
            (H::Unspecified, (H::Unknown, C::HealthUnknown)),
        ] {
            let evidence = join_evidence(async {}, async move { probe }, CLOSE_GRACE, PROBE_TIMEOUT).await;
            assert_eq!((evidence.health, evidence.classification), pair);
            assert!(evidence.retryable);
        }
    }

    #[test]
    fn the_stall_failure_carries_only_safe_metadata() {
        let evidence = StallEvidence { health: H::Unavailable, classification: C::ProviderUnhealthy, retryable: true };
        let failure = evidence.to_failure(Duration::from_millis(1234), Some(7));
        assert_eq!(failure.kind(), pb::FailureKind::ResponseStalled);
        assert_eq!(failure.message, "no progress from the provider for 1234 ms");
        assert_eq!(
            (failure.health_observation_seq, failure.stalled_after_ms, failure.retryable),
            (Some(7), 1234, true)
        );
        assert_eq!(evidence.to_failure(Duration::ZERO, None).health_observation_seq, None, "unbound paths omit it");
    }
}
