//! Status mirroring (pure): from the Edge admin API's snapshots
//! (`GET /admin/v1/providers`, `GET /admin/v1/nodes`) to the fields of
//! `Provider.status` and `NodeCatalog.status` the mirror owns (field manager
//! `iop-operator/status`), and which objects need a write.
//!
//! # Provider health
//!
//! The Edge's `health` is each provider's effective health: config, its
//! node's readiness and the runtime overlay combined, the one definition the
//! Edge's admission uses too. The mirror takes it as it is:
//!
//! | Edge `health`  | health        | classification       |
//! |----------------|---------------|----------------------|
//! | `available`    | `Available`   | (none)               |
//! | `unavailable`  | `Unavailable` | `provider_unhealthy` |
//! | `unknown`      | `Unknown`     | `health_unknown`     |
//!
//! (`unknown`: the node is not connected or not ready, or its probe could
//! not tell.) The classifications are the node's fail-closed pairs;
//! `request_stalled` (available/request_stalled) is never written: a stall
//! whose provider is fine leaves the provider `available`, and the Edge's
//! snapshot cannot tell that apart from a provider that never stalled, so a
//! healthy provider shows no classification.
//!
//! `generation` and `lastObservationSequence` are those of the overlay's
//! last applied evidence when there is any (its `state` may be `available`,
//! `unavailable` or `unknown`); without it `generation` is the node's
//! current connection generation and there is no sequence.
//! `lastTransitionTime` moves only when `health` changes: to the overlay's
//! `since_ms` when the overlay holds the new health since after the last
//! transition, otherwise to `now`.
//!
//! # Writes only when what a user sees changes
//!
//! The node probes a provider that is not available again and again (with
//! backoff, at most every 30 s), and every probe moves the overlay's
//! sequence. A change of `lastObservationSequence` alone is therefore not
//! written ([`visible_change`]): the sequence is updated together with a
//! change of anything else (health, classification, generation, transition
//! time). Each write costs the API server a write and every watcher an event.
//!
//! # Node connection
//!
//! `connected` is the Edge's; `generation` is the current connection's, kept
//! from the last connection while the node is away; `since` moves when
//! `connected` flips or the node reconnects (a new generation): to the
//! connection's `connected_at_ms` when connected, to `now` when it went away.
//!
//! Providers and nodes the Edge does not list (not in its config yet, or
//! left out as not ready) get these fields cleared: the Edge has no live
//! state for them. Objects that do not exist are not written; while the
//! Edge does not answer, nothing is written.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;

use crate::crd::provider::{Classification, Health};
use crate::crd::{NodeCatalogStatus, ProviderStatus};

/// `GET /admin/v1/providers` (only the fields the mirror reads).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ProvidersSnapshot {
    pub providers: Vec<EdgeProvider>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct EdgeProvider {
    pub id: String,
    pub node: String,
    /// The node's current connection completed readiness.
    pub node_ready: bool,
    /// The provider's effective health (config, node readiness and overlay
    /// combined).
    pub health: EdgeHealth,
    /// The runtime overlay: absent until evidence arrived.
    #[serde(default)]
    pub overlay: Option<Overlay>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EdgeHealth {
    Available,
    Unavailable,
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Overlay {
    pub state: OverlayState,
    pub generation: u64,
    pub sequence: u64,
    pub since_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverlayState {
    Available,
    Unavailable,
    /// The node's probe could not tell (e.g. it timed out).
    Unknown,
}

impl OverlayState {
    fn health(self) -> Health {
        match self {
            Self::Available => Health::Available,
            Self::Unavailable => Health::Unavailable,
            Self::Unknown => Health::Unknown,
        }
    }
}

/// `GET /admin/v1/nodes`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NodesSnapshot {
    pub nodes: Vec<EdgeNode>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct EdgeNode {
    pub name: String,
    pub connected: bool,
    #[serde(default)]
    pub phase: Option<SessionPhase>,
    #[serde(default)]
    pub generation: Option<u64>,
    #[serde(default)]
    pub connected_at_ms: Option<u64>,
    /// What the node reported at registration.
    #[serde(default)]
    pub version: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionPhase {
    Registered,
    Ready,
}

/// The `Provider.status` fields the mirror owns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProviderMirror {
    pub health: Option<Health>,
    pub classification: Option<Classification>,
    pub last_observation_sequence: Option<u64>,
    pub generation: Option<u64>,
    pub last_transition_time: Option<Time>,
}

impl ProviderMirror {
    pub fn of(status: Option<&ProviderStatus>) -> Self {
        let Some(s) = status else { return Self::default() };
        Self {
            health: s.health,
            classification: s.classification,
            last_observation_sequence: s.last_observation_sequence,
            generation: s.generation,
            last_transition_time: s.last_transition_time.clone(),
        }
    }

    /// A status holding only the mirror's fields (the apply body).
    pub fn to_status(&self) -> ProviderStatus {
        ProviderStatus {
            health: self.health,
            classification: self.classification,
            last_observation_sequence: self.last_observation_sequence,
            generation: self.generation,
            last_transition_time: self.last_transition_time.clone(),
            ..Default::default()
        }
    }
}

/// The `NodeCatalog.status` fields the mirror owns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeMirror {
    pub connected: Option<bool>,
    pub generation: Option<u64>,
    pub since: Option<Time>,
    pub version: Option<String>,
}

impl NodeMirror {
    pub fn of(status: Option<&NodeCatalogStatus>) -> Self {
        let Some(s) = status else { return Self::default() };
        Self { connected: s.connected, generation: s.generation, since: s.since.clone(), version: s.version.clone() }
    }

    pub fn to_status(&self) -> NodeCatalogStatus {
        NodeCatalogStatus {
            connected: self.connected,
            generation: self.generation,
            since: self.since.clone(),
            version: self.version.clone(),
            ..Default::default()
        }
    }
}

/// Whole seconds: Kubernetes `Time` has no finer precision, and a value that
/// would not round-trip would look changed on every comparison.
fn seconds(t: Timestamp) -> Time {
    Time(Timestamp::from_second(t.as_second()).unwrap_or(t))
}

fn from_ms(ms: u64) -> Option<Time> {
    i64::try_from(ms / 1000).ok().and_then(|s| Timestamp::from_second(s).ok()).map(Time)
}

/// The mirrored fields of one provider (see the module docs for the table).
pub fn provider(
    p: &EdgeProvider,
    node: Option<&EdgeNode>,
    previous: &ProviderMirror,
    now: Timestamp,
) -> ProviderMirror {
    let (health, classification) = match p.health {
        EdgeHealth::Available => (Health::Available, None),
        EdgeHealth::Unavailable => (Health::Unavailable, Some(Classification::ProviderUnhealthy)),
        EdgeHealth::Unknown => (Health::Unknown, Some(Classification::HealthUnknown)),
    };
    let (generation, last_observation_sequence) = match &p.overlay {
        Some(o) => (Some(o.generation), Some(o.sequence)),
        None => (node.and_then(|n| n.generation), None),
    };
    let last_transition_time = match &previous.last_transition_time {
        Some(t) if previous.health == Some(health) => Some(t.clone()),
        since => {
            // The overlay's own transition, when it is this one (never one
            // older than the transition already recorded).
            let overlay_since = p
                .overlay
                .as_ref()
                .filter(|o| o.state.health() == health)
                .and_then(|o| from_ms(o.since_ms))
                .filter(|t| since.as_ref().is_none_or(|s| t.0 > s.0));
            overlay_since.or_else(|| Some(seconds(now)))
        }
    };
    ProviderMirror { health: Some(health), classification, last_observation_sequence, generation, last_transition_time }
}

/// Whether `next` differs from `previous` in anything but
/// `lastObservationSequence` (see the module docs: a new sequence alone is
/// not worth a write).
pub fn visible_change(previous: &ProviderMirror, next: &ProviderMirror) -> bool {
    let ProviderMirror { health, classification, last_observation_sequence: _, generation, last_transition_time } =
        next;
    (health, classification, generation, last_transition_time)
        != (&previous.health, &previous.classification, &previous.generation, &previous.last_transition_time)
}

/// The mirrored fields of one node.
pub fn node(n: &EdgeNode, previous: &NodeMirror, now: Timestamp) -> NodeMirror {
    let generation = n.generation.or(previous.generation);
    let moved = previous.connected != Some(n.connected) || (n.connected && generation != previous.generation);
    let since = match &previous.since {
        Some(t) if !moved => Some(t.clone()),
        _ if n.connected => n.connected_at_ms.and_then(from_ms).or_else(|| Some(seconds(now))),
        _ => Some(seconds(now)),
    };
    // The version of the last connection stays while the node is away.
    let version = n.version.clone().or_else(|| previous.version.clone());
    NodeMirror { connected: Some(n.connected), generation, since, version }
}

/// What to write after one poll.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Writes {
    pub providers: Vec<(String, ProviderMirror)>,
    pub nodes: Vec<(String, NodeMirror)>,
}

/// Compares the Edge's view with the current mirrored fields of every
/// existing object (by name) and returns only the ones that differ in what
/// a user sees ([`visible_change`]). An object the Edge does not list gets
/// its mirrored fields cleared.
pub fn plan(
    providers: &ProvidersSnapshot,
    nodes: &NodesSnapshot,
    current_providers: &BTreeMap<String, ProviderMirror>,
    current_nodes: &BTreeMap<String, NodeMirror>,
    now: Timestamp,
) -> Writes {
    let node_of = |name: &str| nodes.nodes.iter().find(|n| n.name == name);
    let providers = current_providers
        .iter()
        .filter_map(|(name, previous)| {
            let next = match providers.providers.iter().find(|p| &p.id == name) {
                Some(p) => provider(p, node_of(&p.node), previous, now),
                None => ProviderMirror::default(),
            };
            visible_change(previous, &next).then(|| (name.clone(), next))
        })
        .collect();
    let nodes = current_nodes
        .iter()
        .filter_map(|(name, previous)| {
            let next = node_of(name).map_or_else(NodeMirror::default, |n| node(n, previous, now));
            (&next != previous).then(|| (name.clone(), next))
        })
        .collect();
    Writes { providers, nodes }
}

#[cfg(test)]
mod tests;
