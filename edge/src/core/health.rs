//! A provider's health as the Edge believes it: the overlay's states and
//! evidence, the pure rules that apply evidence, and [`ProviderView`], the
//! one definition of effective health and dispatchability (the rules are
//! described in [`crate::overlay`]).

use iop_proto::admin;
use iop_proto::pb::{self, FailureKind, ProviderHealth};

use super::credential::CredentialState;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverlayState {
    Available,
    Unavailable,
    /// The node could not tell (a probe timed out); still dispatchable.
    Unknown,
}

impl OverlayState {
    /// Every state, in the order of the `iop_edge_provider_health` state set.
    pub const ALL: [Self; 3] = [Self::Available, Self::Unavailable, Self::Unknown];

    fn of(health: ProviderHealth) -> Self {
        match health {
            ProviderHealth::Available => Self::Available,
            ProviderHealth::Unavailable => Self::Unavailable,
            ProviderHealth::Unknown | ProviderHealth::Unspecified => Self::Unknown,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Available => "available",
            Self::Unavailable => "unavailable",
            Self::Unknown => "unknown",
        }
    }
}

/// As the admin API shows a provider's health and overlay state.
impl From<OverlayState> for admin::EdgeHealth {
    fn from(state: OverlayState) -> Self {
        match state {
            OverlayState::Available => Self::Available,
            OverlayState::Unavailable => Self::Unavailable,
            OverlayState::Unknown => Self::Unknown,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlayEntry {
    pub state: OverlayState,
    /// Generation and sequence of the last applied evidence.
    pub generation: u64,
    pub sequence: u64,
    pub since_ms: u64,
}

/// As `/admin/v1/providers` shows it.
impl From<OverlayEntry> for admin::Overlay {
    fn from(entry: OverlayEntry) -> Self {
        let OverlayEntry { state, generation, sequence, since_ms } = entry;
        Self { generation, sequence, since_ms, state: state.into() }
    }
}

/// Where evidence came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The node's startup check of every provider (NodeReady).
    Readiness,
    /// The node's own periodic probe (ProviderHealthReport).
    Probe,
    /// A run's stall terminal (no progress within the stall timeout).
    Stall,
    /// A run that could not reach its provider, probed by the node.
    Unreachable,
    /// A run whose provider's answer broke after it started (a reset or a
    /// cut body), probed by the node. Not a stall: issue 28 item 5.
    StreamCut,
    Capabilities,
}

impl Source {
    pub fn label(self) -> &'static str {
        match self {
            Self::Readiness => "readiness",
            Self::Probe => "probe",
            Self::Stall => "stall",
            Self::Unreachable => "unreachable",
            Self::StreamCut => "stream_cut",
            Self::Capabilities => "capabilities",
        }
    }
}

/// One piece of evidence about one provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evidence {
    pub source: Source,
    /// Generation of the connection the evidence arrived on.
    pub generation: u64,
    /// The node's current generation when it is applied.
    pub current_generation: Option<u64>,
    /// The node's health observation sequence (readiness is 0).
    pub sequence: Option<u64>,
    pub health: ProviderHealth,
}

/// What applying evidence did (the metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The provider became unavailable.
    Lowered,
    /// The provider became available.
    Recovered,
    /// The provider became unknown.
    Unsettled,
    /// Fresh, recorded, no state change.
    Recorded,
    /// Fresh, but this source cannot move the provider this way (a
    /// CAPABILITIES answer other than a recovery): not recorded.
    Ignored,
    StaleGeneration,
    StaleSequence,
    Unsequenced,
}

impl Applied {
    pub fn label(self) -> &'static str {
        match self {
            Self::Lowered => "lowered",
            Self::Recovered => "recovered",
            Self::Unsettled => "unsettled",
            Self::Recorded => "recorded",
            Self::Ignored => "ignored",
            Self::StaleGeneration => "stale_generation",
            Self::StaleSequence => "stale_sequence",
            Self::Unsequenced => "unsequenced",
        }
    }
}

/// The state `source` moves a provider to from `previous` on `health`, or
/// `None` when that source cannot move it (pure; the rules above).
fn next_state(source: Source, health: ProviderHealth, previous: Option<OverlayState>) -> Option<OverlayState> {
    let stated = OverlayState::of(health);
    match source {
        Source::Readiness | Source::Probe => Some(stated),
        // A run's evidence only lowers (stall, unreachable, cut alike).
        Source::Stall | Source::Unreachable | Source::StreamCut if stated == OverlayState::Unavailable => Some(stated),
        Source::Stall | Source::Unreachable | Source::StreamCut => previous,
        Source::Capabilities if stated == OverlayState::Available && previous != Some(stated) => Some(stated),
        Source::Capabilities => None,
    }
}

/// What applying `evidence` to a provider whose last applied entry is
/// `previous` does (pure; the rules in [`crate::overlay`]): the outcome and,
/// when the evidence is recorded, the provider's new entry (`now_ms` stamps
/// a state that changed).
pub fn apply(previous: Option<&OverlayEntry>, evidence: Evidence, now_ms: u64) -> (Applied, Option<OverlayEntry>) {
    if evidence.current_generation != Some(evidence.generation) {
        return (Applied::StaleGeneration, None);
    }
    let Some(sequence) = evidence.sequence else { return (Applied::Unsequenced, None) };
    if let Some(entry) = previous
        && (evidence.generation, sequence) <= (entry.generation, entry.sequence)
    {
        return (Applied::StaleSequence, None);
    }
    let previous_state = previous.map(|e| e.state);
    let Some(next) = next_state(evidence.source, evidence.health, previous_state) else {
        return (Applied::Ignored, None);
    };
    let since_ms = match previous {
        Some(entry) if entry.state == next => entry.since_ms,
        _ => now_ms,
    };
    let applied = match (previous_state, next) {
        (Some(before), after) if before == after => Applied::Recorded,
        (_, OverlayState::Unavailable) => Applied::Lowered,
        (_, OverlayState::Available) => Applied::Recovered,
        (_, OverlayState::Unknown) => Applied::Unsettled,
    };
    (applied, Some(OverlayEntry { state: next, generation: evidence.generation, sequence, since_ms }))
}

/// A provider as the Edge sees it now: config, its node's session and the
/// overlay combined. The one definition of effective health and
/// dispatchability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProviderView {
    /// `unknown` unless the node's current connection is Ready and evidence
    /// from that connection (readiness at least) is in the overlay;
    /// `unavailable` whatever the overlay says while the provider's managed
    /// credential is not `ok` (a provider that cannot authenticate is not
    /// available, however well its server answers probes).
    pub health: OverlayState,
    /// The Ready connection the provider may receive runs on: its node is
    /// Ready, the provider is not unavailable on that connection and its
    /// managed credential, if any, can be leased.
    pub dispatchable_on: Option<u64>,
    /// Its credential was rejected by the provider or refused by its node:
    /// chosen only when no other provider of the route is eligible (its next
    /// answer is the only evidence that the credential works again).
    pub last_resort: bool,
    /// Its managed credential's state; `None` without one.
    pub credential: Option<CredentialState>,
}

pub fn health_label(health: ProviderHealth) -> &'static str {
    match health {
        ProviderHealth::Available => "available",
        ProviderHealth::Unavailable => "unavailable",
        ProviderHealth::Unknown | ProviderHealth::Unspecified => "unknown",
    }
}

/// The source a run's terminal records its health evidence under, if it
/// carries any: a stall always (the spec's stall terminal), an unreachable
/// provider or a cut stream only when the node probed it. Pure.
pub fn evidence_source(failure: &pb::ExecutionFailure) -> Option<Source> {
    match failure.kind() {
        FailureKind::ResponseStalled => Some(Source::Stall),
        FailureKind::ProviderUnreachable if failure.provider_health != 0 => Some(Source::Unreachable),
        FailureKind::ProviderStreamCut if failure.provider_health != 0 => Some(Source::StreamCut),
        _ => None,
    }
}

impl ProviderView {
    /// The view of a provider whose overlay `entry` is the one from its
    /// node's current Ready connection (`None`: no such connection, or no
    /// evidence from it yet) and whose managed credential is `credential`.
    pub fn combine(entry: Option<OverlayEntry>, credential: Option<CredentialState>) -> Self {
        let (health, dispatchable_on) = match entry {
            Some(entry) => (entry.state, (entry.state != OverlayState::Unavailable).then_some(entry.generation)),
            None => (OverlayState::Unknown, None),
        };
        match credential {
            None | Some(CredentialState::Ok) => Self { health, dispatchable_on, last_resort: false, credential },
            Some(state) => Self {
                health: OverlayState::Unavailable,
                dispatchable_on: dispatchable_on.filter(|_| state.leasable()),
                last_resort: state.last_resort(),
                credential,
            },
        }
    }
}
