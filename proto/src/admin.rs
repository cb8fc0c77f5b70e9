//! The Edge admin API's snapshots, `GET /admin/v1/providers` and
//! `GET /admin/v1/nodes`: the one definition the Edge writes and the
//! operator's status mirror (and anyone's script) reads.
//!
//! # Writing
//!
//! The Edge writes every field, `null` where it has no value; nothing is
//! left out. Fields are declared in alphabetical order: the order the Edge
//! wrote them in when they were `serde_json` maps, so a snapshot's bytes
//! did not change when these types replaced the maps
//! (`e2e/tests/admin_snapshot.rs` pins them). Keep new fields in that order.
//!
//! # Reading: what a reader tolerates
//!
//! An Edge newer or older than its reader (in a rollout, both run) may
//! write more, less or otherwise. A reader
//! - ignores fields it does not know (so no `deny_unknown_fields`);
//! - requires what a provider's or node's identity and health rest on,
//!   and reads those enums closed: `providers`, and of each `id`, `node`,
//!   `node_ready`, `health` and `overlay` (absent or `null`: none; present:
//!   all four fields, `state` closed); `nodes`, and of each `name`,
//!   `connected`, `phase` (closed), `generation`, `connected_at_ms` and
//!   `version` (absent or `null`: none). A health or phase it does not
//!   know fails the snapshot: an error, never a guess. No
//!   `#[serde(other)]` folds a newer value into [`EdgeHealth::Unknown`],
//!   which means "the probe could not tell", not "this reader cannot";
//! - reads every other field leniently ([`lenient`]): absent, `null` or
//!   not in this shape is no information (`None`, empty or zero), and the
//!   rest of the snapshot still counts. A `credential` whose `state` it
//!   does not know is `None` as a whole, and so is a `residency` it does
//!   not know.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

use crate::config::Adapter;

/// `GET /admin/v1/providers`: every configured provider as this replica
/// sees it, and the replica's admission load.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProvidersSnapshot {
    /// Runs in flight on this replica.
    #[serde(default, deserialize_with = "lenient")]
    pub in_flight_runs: u64,
    #[serde(default, deserialize_with = "lenient")]
    pub leases: Leases,
    pub providers: Vec<EdgeProvider>,
    /// Requests waiting for a slot, per public model (a model nobody
    /// waited for is absent, or 0).
    #[serde(default, deserialize_with = "lenient")]
    pub queued: BTreeMap<String, u64>,
    /// Admin workspace diagnostics in flight.
    #[serde(default, deserialize_with = "lenient")]
    pub workspace_calls: u64,
}

/// Admission leases since this replica started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leases {
    #[serde(default, deserialize_with = "lenient")]
    pub acquired: u64,
    /// A lease released twice (a bug: always 0).
    #[serde(default, deserialize_with = "lenient")]
    pub double_releases: u64,
    #[serde(default, deserialize_with = "lenient")]
    pub released: u64,
}

/// One configured provider as one Edge replica sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeProvider {
    /// Whether its model reads images: as its config declares, else as its
    /// server said to its node; `None` when unknown. A request with an
    /// image goes only where this is not `false`.
    #[serde(default, deserialize_with = "lenient")]
    pub accepts_images: Option<bool>,
    /// `None` only when read from an Edge with an adapter this reader does
    /// not know.
    #[serde(default, deserialize_with = "lenient")]
    pub adapter: Option<Adapter>,
    /// Most concurrent runs.
    #[serde(default, deserialize_with = "lenient")]
    pub capacity: u32,
    /// Generation failures in a row (outlier ejection; 0 while ejected).
    #[serde(default, deserialize_with = "lenient")]
    pub consecutive_failures: u32,
    /// The managed credential on this replica; `None` when the provider
    /// has none.
    #[serde(default, deserialize_with = "lenient")]
    pub credential: Option<EdgeCredential>,
    /// The replica's admission may send it runs (its effective health and
    /// its node's session allow it).
    #[serde(default, deserialize_with = "lenient")]
    pub dispatchable: bool,
    /// Until when outlier ejection leaves it out of selection (RFC 3339,
    /// UTC, whole milliseconds); `None` while selectable. Separate from
    /// `health`: a provider can answer its probe and fail every generation.
    #[serde(default, deserialize_with = "lenient")]
    pub ejected_until: Option<String>,
    /// Ejections in a row, before decay.
    #[serde(default, deserialize_with = "lenient")]
    pub ejections: u32,
    /// The effective health: config, the node's session (readiness) and
    /// the runtime overlay combined, the one definition the replica's
    /// admission uses too (`iop_edge_provider_health` publishes the same).
    pub health: EdgeHealth,
    pub id: String,
    /// Runs in flight on it.
    #[serde(default, deserialize_with = "lenient")]
    pub in_flight: u32,
    /// When the node's last measured load of the model ended (RFC 3339);
    /// `None` before any.
    #[serde(default, deserialize_with = "lenient")]
    pub last_load_at: Option<String>,
    /// How long that load took, in seconds (millisecond precision).
    #[serde(default, deserialize_with = "lenient")]
    pub last_load_seconds: Option<f64>,
    /// Its node's learned inter-token deadline in ms (`None` while not
    /// learned): a stream silent this long is cut.
    #[serde(default, deserialize_with = "lenient")]
    pub learned_stall_ms: Option<u64>,
    /// Memory the loaded model takes; `None` when the node reported none.
    #[serde(default, deserialize_with = "lenient")]
    pub model_memory: Option<ModelMemory>,
    /// The public models it serves.
    #[serde(default, deserialize_with = "lenient")]
    pub models: Vec<ProviderModel>,
    /// The node it runs on.
    pub node: String,
    /// The node's current session completed readiness.
    pub node_ready: bool,
    /// One request is trying the ejected provider again (its ejection time
    /// passed; it stays out of selection until that request's outcome).
    #[serde(default, deserialize_with = "lenient")]
    pub on_trial: bool,
    /// The runtime overlay: what the latest evidence says; `None` until
    /// evidence arrived.
    #[serde(default)]
    pub overlay: Option<Overlay>,
    /// Its node's learned p95 time to read 1,000 prompt tokens (to the
    /// first token), in ms; `None` while not learned.
    #[serde(default, deserialize_with = "lenient")]
    pub prefill_ms_per_1k_tokens: Option<u64>,
    /// The node's last residency report (the Edge writes `unknown` without
    /// one); `None` only when read from an Edge that did not say, or said
    /// what this reader does not know.
    #[serde(default, deserialize_with = "lenient")]
    pub residency: Option<Residency>,
    /// The model name the provider's server knows.
    #[serde(default, deserialize_with = "lenient")]
    pub target_model: String,
}

/// A public model a provider serves.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderModel {
    pub name: String,
    /// Lower is preferred.
    pub priority: u32,
}

/// A loaded model's memory, as the node reported it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelMemory {
    pub size_bytes: u64,
    /// Of which in GPU / unified memory.
    pub vram_bytes: u64,
}

/// A provider's managed credential on one replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeCredential {
    /// With `refused_by_node`: the node's closed reason (`revoked`,
    /// `expired`, ...).
    #[serde(default, deserialize_with = "lenient")]
    pub node_refusal: Option<String>,
    /// Why the value is not usable (with `invalid`); never the value.
    #[serde(default, deserialize_with = "lenient")]
    pub problem: Option<String>,
    pub profile: String,
    pub state: CredentialState,
}

/// A managed credential's state on one replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CredentialState {
    Ok,
    /// `disabled: true` in the Edge config.
    Disabled,
    /// The replica could not load a usable value.
    Invalid,
    /// The provider answered 401/403 to it (until its revision changes).
    Rejected,
    /// The provider's node refused its leases (until the node opens one or
    /// its revision changes); `node_refusal` says why.
    RefusedByNode,
}

/// A provider's health as an Edge replica sees it: its effective health,
/// and the state of its overlay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EdgeHealth {
    Available,
    Unavailable,
    /// Nothing to tell by: the node is not connected or not ready, or its
    /// probe could not tell (e.g. it timed out).
    Unknown,
}

/// The runtime overlay of a provider: the last applied evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overlay {
    /// The node connection the evidence arrived on.
    pub generation: u64,
    /// The node's health observation sequence on it (readiness is 0).
    pub sequence: u64,
    /// Since when (ms since the epoch) the overlay holds `state`.
    pub since_ms: u64,
    pub state: EdgeHealth,
}

/// Whether a provider's model is in its server's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Residency {
    Loaded,
    NotLoaded,
    /// No report, the node is not Ready, or the server cannot say.
    Unknown,
}

/// `GET /admin/v1/nodes`: every configured node and this replica's session
/// with it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodesSnapshot {
    pub nodes: Vec<EdgeNode>,
}

/// One configured node and this replica's session with it (the session's
/// fields are `None` while there is none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeNode {
    /// The serial (lowercase hex) of the certificate the node presented
    /// for this session; `None` without a session. Compared with the
    /// NodeCatalog's issued serial, it tells whether the Mac runs the
    /// current bundle.
    #[serde(default, deserialize_with = "lenient")]
    pub certificate_serial: Option<String>,
    /// How the node runs workspace commands: `landlock`, `seatbelt`,
    /// `unsandboxed` (its owner allowed commands without a sandbox),
    /// `unavailable` (commands refused) or `unknown`.
    #[serde(default, deserialize_with = "lenient")]
    pub command_sandbox: Option<String>,
    /// This replica holds a session with the node.
    pub connected: bool,
    /// When that session connected (ms since the epoch).
    #[serde(default)]
    pub connected_at_ms: Option<u64>,
    /// That session's generation (they grow with time, across restarts).
    #[serde(default)]
    pub generation: Option<u64>,
    pub name: String,
    #[serde(default)]
    pub phase: Option<SessionPhase>,
    /// The effective health of each of its providers, as in
    /// `/admin/v1/providers`.
    #[serde(default, deserialize_with = "lenient")]
    pub providers: BTreeMap<String, EdgeHealth>,
    /// What its sandbox cannot refuse on its machine: `signal_scope`,
    /// `tcp`, `reserved_writable`, `bounding_set`, `priority`; empty when
    /// nothing, or without a session.
    #[serde(default, deserialize_with = "lenient")]
    pub sandbox_gaps: Vec<String>,
    /// What the node reported at registration (its `iop-node` version).
    #[serde(default)]
    pub version: Option<String>,
    /// Its verdict on each workspace assigned to it: `accepted` or why it
    /// refused it; empty without a session or before readiness.
    #[serde(default, deserialize_with = "lenient")]
    pub workspaces: BTreeMap<String, String>,
}

/// A node session's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionPhase {
    /// Register answered; waiting for NodeReady. Not dispatchable.
    Registered,
    /// Readiness completed on this connection: dispatchable.
    Ready,
}

/// Reads a field leniently (see the module docs): `null` or a value not in
/// `T`'s shape reads as `T::default()` (with `#[serde(default)]`, so does
/// an absent field). The snapshots are JSON; the value is read as JSON
/// first.
fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned + Default>(d: D) -> Result<T, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(value).unwrap_or_default())
}

#[cfg(test)]
mod tests;
