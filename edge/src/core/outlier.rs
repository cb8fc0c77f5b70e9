//! Passive outlier ejection (Envoy's `outlier_detection`, consecutive
//! failures): a provider whose generations keep failing is left out of
//! selection for a while, even though its health (the spec's overlay, fed
//! by the node's metadata probe) still says `available`.
//!
//! # Why a second judgement next to the health overlay
//!
//! The node's probe asks the provider's metadata endpoint (`/api/tags`,
//! `/v1/models`). A provider can answer that and still refuse every
//! generation (a 5xx from a broken backend, a GPU out of memory, a proxy in
//! front of a dead worker). The overlay then stays `available`, and every
//! request during such an outage paid one failed attempt before the gate
//! retried it elsewhere. The overlay is the spec's and stays as it is; the
//! ejection is a separate, purely local filter in admission (see
//! `admission::AdmissionPool::try_acquire`), never written into the overlay
//! or the health the admin API and `iop_edge_provider_health` report.
//!
//! # Rules ([`OutlierDetector::record`], pure, the caller passes `now`)
//!
//! - Every generation's end is one [`Verdict`] ([`verdict`]): a failure of
//!   the provider (its 5xx, unreachable, reset or cut, stall, protocol
//!   error), a success (the run completed), or neither.
//! - `consecutive_failures` failures in a row eject the provider for
//!   `base_ejection_ms × 2^(n − 1)`, capped at `max_ejection_ms`, where `n`
//!   counts its ejections in a row. A success resets the count of failures.
//! - Half-open recovery (a circuit breaker's half-open state): when the
//!   ejection time has passed, exactly one request may go to the provider as
//!   its trial ([`OutlierDetector::gate`], [`OutlierDetector::begin_trial`]);
//!   the provider stays out of selection while the trial runs. The trial
//!   succeeding returns the provider to service; the trial failing ejects it
//!   again, for the doubled time (capped at `max_ejection_ms`: on defaults
//!   10, 20, then 30 s, so a provider that recovered is back within 30 s);
//!   a trial that ends saying nothing (its client left) lets the next request
//!   be the trial, and so does a trial still running after `base_ejection_ms`.
//!   Only the trial's own failure counts: runs admitted before the ejection
//!   that fail meanwhile change nothing. So while its failures continue, a
//!   provider gets one request (its trial) per ejection time.
//! - Decay, like Envoy's ejection multiplier: the count of ejections in a
//!   row drops by one for every `base_ejection_ms` the provider has served
//!   since it last returned, so a provider that failed once a day is not
//!   ejected for the maximum time on its third bad day.
//! - A success ends an ejection at once, whenever it comes (a run admitted
//!   before the ejection, or one sent to it by panic routing): the provider
//!   demonstrably generates. Failures while ejected change nothing (they
//!   are runs admitted before the ejection, or panic routing).
//! - "A probe brings it back" ([`OutlierDetector::forgive`]): the metadata
//!   probe answering is exactly what lies during this outage, so a probe
//!   that keeps saying `available` never ends an ejection. What does is the
//!   node reporting the provider *recovered* (the overlay moving it from
//!   `unavailable` or `unknown` to `available`, `overlay::Applied::
//!   Recovered`): the provider's server was seen down and up again (a
//!   restart), so its failure history is about a process that is gone; the
//!   ejection, the failure count and the ejections in a row are cleared. A
//!   new node connection by itself is not a recovery of the provider.
//! - `consecutive_failures: 0` turns ejection off.
//!
//! # Never eject everything
//!
//! Like Envoy's `max_ejection_percent` panic threshold: an ejected provider
//! is still chosen when no other candidate of the route is eligible
//! (admission treats it like a provider the request already tried), so an
//! outage of every provider of a model answers with the providers' own
//! errors rather than `no_provider_available`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use iop_proto::config::OutlierConfig;
use iop_proto::pb::{self, FailureKind};
use iop_proto::provider_error::{refuses_content, rejects_credential};

/// What one generation's end says about its provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The run completed: the provider generates.
    Success,
    /// The provider failed the generation.
    Failure,
    /// Nothing about the provider (the client, the Edge, the node's
    /// connection or a rate limit ended it).
    Neutral,
}

/// The verdict on a run that ended with `failure` (`None`: it completed).
/// `head_status` is a tunnel's provider response status, when it sent one
/// (its error answers come as the failure they stand for,
/// `dispatch::http_failure`). Pure; the one classification of generation
/// outcomes.
pub fn verdict(failure: Option<&pb::ExecutionFailure>, head_status: Option<u32>) -> Verdict {
    let Some(failure) = failure else {
        return match head_status {
            Some(status) => status_verdict(status),
            None => Verdict::Success,
        };
    };
    match failure.kind() {
        FailureKind::ProviderUnreachable
        | FailureKind::ProviderStreamCut
        | FailureKind::ResponseStalled
        | FailureKind::ProviderProtocol => Verdict::Failure,
        // A model that cannot take the request's content (an image for a
        // text-only model) is the request's fault, whatever the status.
        FailureKind::ProviderHttpStatus if refuses_content(failure) => Verdict::Neutral,
        FailureKind::ProviderHttpStatus => status_verdict(failure.provider_status),
        // The node's connection to the Edge, not the provider: the node's
        // providers are all out of selection while it is away anyway, and
        // ejecting them would outlast its reconnect.
        FailureKind::TransportLost
        // Capacity another replica holds at the node: the provider is busy,
        // not broken.
        | FailureKind::CapacityExhausted
        // The request's own time budget, the client's request, the answer's
        // size, the Edge's lease: none says the provider cannot generate.
        | FailureKind::DeadlineExceeded
        | FailureKind::InvalidRequest
        | FailureKind::ResponseTooLarge
        | FailureKind::CredentialRejected
        | FailureKind::Internal
        | FailureKind::Unspecified => Verdict::Neutral,
    }
}

/// A provider's HTTP status as a verdict. Pure.
///
/// - 5xx: the provider failed.
/// - 429 is not a failure: rate limiting is a healthy provider shedding
///   load, with its own `Retry-After` (the gate honours it); ejecting it would
///   push its load onto its siblings and keep it out for `base_ejection_ms`
///   or more after a limit window of seconds (Envoy counts neither 429 in
///   `consecutive_5xx` nor in `consecutive_gateway_failure`).
/// - 401/403 is the managed credential's health (`credentials`), which
///   already keeps the provider as a last resort.
/// - Other 4xx are the client's request.
fn status_verdict(status: u32) -> Verdict {
    match status {
        500.. => Verdict::Failure,
        429 => Verdict::Neutral,
        s if rejects_credential(s) => Verdict::Neutral,
        400..=499 => Verdict::Neutral,
        _ => Verdict::Success,
    }
}

/// The config's `outlier` section as durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutlierPolicy {
    /// 0: ejection is off.
    pub consecutive_failures: u32,
    pub base_ejection: Duration,
    pub max_ejection: Duration,
}

impl From<&OutlierConfig> for OutlierPolicy {
    fn from(c: &OutlierConfig) -> Self {
        Self {
            consecutive_failures: if c.enabled { c.consecutive_failures } else { 0 },
            base_ejection: Duration::from_millis(c.base_ejection_ms),
            max_ejection: Duration::from_millis(c.max_ejection_ms),
        }
    }
}

impl Default for OutlierPolicy {
    fn default() -> Self {
        Self::from(&OutlierConfig::default())
    }
}

impl OutlierPolicy {
    pub fn enabled(&self) -> bool {
        self.consecutive_failures > 0
    }

    /// How long the `n`th ejection in a row lasts (`n` ≥ 1). Pure.
    pub fn ejection_time(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.saturating_sub(1)).unwrap_or(u32::MAX);
        self.base_ejection.saturating_mul(factor).min(self.max_ejection)
    }
}

/// Where a provider is in the ejection cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// In selection, with this many generation failures in a row.
    Serving { failures: u32 },
    /// Out of selection until `until`; then one request may be its trial.
    Ejected { until: Instant },
    /// Run `run`, admitted at `since`, is the trial: out of selection until
    /// its outcome.
    Trial { run: String, since: Instant },
}

/// What admission may do with a provider now ([`OutlierDetector::gate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// In selection.
    Open,
    /// Out of selection (ejected, or its trial is running).
    Closed,
    /// The ejection time passed: the next request to it is its trial.
    Trial,
}

#[derive(Debug, Clone)]
struct Record {
    phase: Phase,
    /// Ejections in a row (before decay).
    ejections: u32,
    /// When the provider last returned to service (decay counts from there).
    returned_at: Option<Instant>,
}

impl Default for Record {
    fn default() -> Self {
        Self { phase: Phase::Serving { failures: 0 }, ejections: 0, returned_at: None }
    }
}

/// What recording an outcome did (for the metric and log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    None,
    /// Ejected until `until`, its `ejections`th ejection in a row.
    Ejected {
        until: Instant,
        ejections: u32,
        duration: Duration,
    },
    /// Back in service (a success ended the ejection or its trial).
    Returned,
}

/// A provider's ejection state, as the admin API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutlierStatus {
    /// Out of selection until then (`None`: selectable, or on trial).
    pub ejected_until: Option<Instant>,
    /// A request is its trial now.
    pub on_trial: bool,
    /// Generation failures in a row (0 while ejected or on trial).
    pub consecutive_failures: u32,
    /// Ejections in a row, before decay.
    pub ejections: u32,
}

/// Per-provider ejection state. Pure: no clock, no I/O.
#[derive(Debug, Default)]
pub struct OutlierDetector {
    providers: HashMap<String, Record>,
}

impl OutlierDetector {
    /// Records the end of run `run`'s generation on `provider` at `now`.
    pub fn record(
        &mut self,
        provider: &str,
        run: &str,
        verdict: Verdict,
        now: Instant,
        policy: &OutlierPolicy,
    ) -> Transition {
        if !policy.enabled() {
            return Transition::None;
        }
        let Some(record) = self.providers.get_mut(provider) else {
            if verdict != Verdict::Failure {
                return Transition::None;
            }
            let record = self.providers.entry(provider.to_string()).or_default();
            return fail(record, now, policy);
        };
        let trial = matches!(&record.phase, Phase::Trial { run: trial, .. } if trial == run);
        match (&record.phase, verdict) {
            (Phase::Serving { .. }, Verdict::Success) => {
                record.phase = Phase::Serving { failures: 0 };
                Transition::None
            }
            // A success ends an ejection whenever it comes.
            (Phase::Ejected { .. } | Phase::Trial { .. }, Verdict::Success) => {
                record.phase = Phase::Serving { failures: 0 };
                record.returned_at = Some(now);
                Transition::Returned
            }
            (Phase::Serving { .. }, Verdict::Failure) => fail(record, now, policy),
            // The trial failed: ejected again, for longer.
            (Phase::Trial { .. }, Verdict::Failure) if trial => eject(record, now, policy),
            // The trial said nothing: the next request may be the trial.
            (Phase::Trial { .. }, Verdict::Neutral) if trial => {
                record.phase = Phase::Ejected { until: now };
                Transition::None
            }
            // Runs admitted before the ejection (or sent by panic routing).
            (Phase::Ejected { .. } | Phase::Trial { .. }, _) | (Phase::Serving { .. }, Verdict::Neutral) => {
                Transition::None
            }
        }
    }

    /// What admission may do with `provider` at `now`.
    pub fn gate(&self, provider: &str, now: Instant, policy: &OutlierPolicy) -> Gate {
        match self.providers.get(provider).map(|r| &r.phase) {
            None | Some(Phase::Serving { .. }) => Gate::Open,
            Some(Phase::Ejected { until }) if now < *until => Gate::Closed,
            Some(Phase::Ejected { .. }) => Gate::Trial,
            // A trial that has run as long as an ejection is not waited for.
            Some(Phase::Trial { since, .. }) if now.saturating_duration_since(*since) >= policy.base_ejection => {
                Gate::Trial
            }
            Some(Phase::Trial { .. }) => Gate::Closed,
        }
    }

    /// Run `run` was admitted to `provider` as its trial (its gate said
    /// [`Gate::Trial`]).
    pub fn begin_trial(&mut self, provider: &str, run: &str, now: Instant) {
        if let Some(record) = self.providers.get_mut(provider) {
            record.phase = Phase::Trial { run: run.to_string(), since: now };
        }
    }

    /// Whether `provider` is out of selection at `now`.
    pub fn is_ejected(&self, provider: &str, now: Instant, policy: &OutlierPolicy) -> bool {
        self.gate(provider, now, policy) == Gate::Closed
    }

    pub fn status(&self, provider: &str, now: Instant) -> OutlierStatus {
        let Some(record) = self.providers.get(provider) else { return OutlierStatus::default() };
        let (ejected_until, consecutive_failures, on_trial) = match &record.phase {
            Phase::Serving { failures } => (None, *failures, false),
            Phase::Ejected { until } => ((now < *until).then_some(*until), 0, false),
            Phase::Trial { .. } => (None, 0, true),
        };
        OutlierStatus { ejected_until, consecutive_failures, ejections: record.ejections, on_trial }
    }

    /// The node saw the provider recover (see the module docs): its history
    /// is cleared. Returns whether it was ejected or on trial.
    pub fn forgive(&mut self, provider: &str) -> bool {
        self.providers.remove(provider).is_some_and(|r| !matches!(r.phase, Phase::Serving { .. }))
    }

    /// Keeps only the providers `keep` accepts (a reload removed the others),
    /// or none when ejection is off.
    pub fn retain(&mut self, policy: &OutlierPolicy, keep: impl Fn(&str) -> bool) {
        if !policy.enabled() {
            self.providers.clear();
        }
        self.providers.retain(|id, _| keep(id));
    }
}

/// A failure while serving: counted, and at the threshold an ejection.
fn fail(record: &mut Record, now: Instant, policy: &OutlierPolicy) -> Transition {
    let Phase::Serving { failures } = record.phase else { return Transition::None };
    if failures + 1 < policy.consecutive_failures {
        record.phase = Phase::Serving { failures: failures + 1 };
        return Transition::None;
    }
    eject(record, now, policy)
}

fn eject(record: &mut Record, now: Instant, policy: &OutlierPolicy) -> Transition {
    let served = record.returned_at.map_or(Duration::ZERO, |at| now.saturating_duration_since(at));
    let decay = if policy.base_ejection.is_zero() {
        0
    } else {
        u32::try_from(served.as_millis() / policy.base_ejection.as_millis()).unwrap_or(u32::MAX)
    };
    let ejections = record.ejections.saturating_sub(decay).saturating_add(1);
    let duration = policy.ejection_time(ejections);
    let until = now + duration;
    record.ejections = ejections;
    record.phase = Phase::Ejected { until };
    Transition::Ejected { until, ejections, duration }
}

#[cfg(test)]
mod tests;
