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
    /// The runtime overlay: what the latest evidence says; `None` until
    /// evidence arrived.
    #[serde(default)]
    pub overlay: Option<Overlay>,
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
mod tests {
    use serde_json::json;

    use super::*;

    fn provider() -> EdgeProvider {
        EdgeProvider {
            adapter: Some(Adapter::Ollama),
            capacity: 4,
            consecutive_failures: 0,
            credential: Some(EdgeCredential {
                problem: Some("the value must be printable ASCII without spaces".into()),
                profile: "lm".into(),
                state: CredentialState::Invalid,
            }),
            dispatchable: false,
            ejected_until: Some("2026-11-01T12:00:00.250Z".into()),
            ejections: 1,
            health: EdgeHealth::Unavailable,
            id: "llama".into(),
            in_flight: 2,
            last_load_at: Some("2026-11-01T11:59:00.750Z".into()),
            last_load_seconds: Some(18.25),
            model_memory: Some(ModelMemory { size_bytes: 42_000_000_000, vram_bytes: 41_000_000_000 }),
            models: vec![ProviderModel { name: "llama3.2".into(), priority: 0 }],
            node: "mac-1".into(),
            node_ready: true,
            overlay: Some(Overlay {
                generation: 3,
                sequence: 7,
                since_ms: 1_700_000_000_000,
                state: EdgeHealth::Unknown,
            }),
            residency: Some(Residency::NotLoaded),
            target_model: "llama3.2:3b".into(),
        }
    }

    fn node() -> EdgeNode {
        EdgeNode {
            command_sandbox: Some("landlock".into()),
            connected: true,
            connected_at_ms: Some(1_700_000_000_123),
            generation: Some(1_700_000_000_123_456),
            name: "mac-1".into(),
            phase: Some(SessionPhase::Ready),
            providers: BTreeMap::from([("llama".into(), EdgeHealth::Unavailable)]),
            sandbox_gaps: vec!["tcp".into()],
            version: Some("0.1.0".into()),
            workspaces: BTreeMap::from([("site".into(), "accepted".into())]),
        }
    }

    /// Every field written, `null` where none, keys in alphabetical order,
    /// and read back as it was.
    #[test]
    fn snapshots_are_written_in_full_and_read_back() {
        let providers = ProvidersSnapshot {
            in_flight_runs: 2,
            leases: Leases { acquired: 5, double_releases: 0, released: 3 },
            providers: vec![provider()],
            queued: BTreeMap::from([("llama3.2".into(), 1)]),
            workspace_calls: 0,
        };
        let text = serde_json::to_string(&providers).unwrap();
        assert_eq!(
            text,
            concat!(
                r#"{"in_flight_runs":2,"leases":{"acquired":5,"double_releases":0,"released":3},"providers":[{"#,
                r#""adapter":"ollama","capacity":4,"consecutive_failures":0,"credential":{"problem":"the value "#,
                r#"must be printable ASCII without spaces","profile":"lm","state":"invalid"},"dispatchable":false,"#,
                r#""ejected_until":"2026-11-01T12:00:00.250Z","ejections":1,"health":"unavailable","id":"llama","#,
                r#""in_flight":2,"last_load_at":"2026-11-01T11:59:00.750Z","last_load_seconds":18.25,"#,
                r#""model_memory":{"size_bytes":42000000000,"vram_bytes":41000000000},"models":[{"name":"llama3.2","#,
                r#""priority":0}],"node":"mac-1","node_ready":true,"overlay":{"generation":3,"sequence":7,"#,
                r#""since_ms":1700000000000,"state":"unknown"},"residency":"not_loaded","target_model":"llama3.2:3b"}],"#,
                r#""queued":{"llama3.2":1},"workspace_calls":0}"#,
            )
        );
        assert_eq!(serde_json::from_str::<ProvidersSnapshot>(&text).unwrap(), providers);

        let none = EdgeProvider {
            credential: None,
            ejected_until: None,
            last_load_at: None,
            last_load_seconds: None,
            model_memory: None,
            overlay: None,
            ..provider()
        };
        let value = serde_json::to_value(&none).unwrap();
        for field in ["credential", "ejected_until", "last_load_at", "last_load_seconds", "model_memory", "overlay"] {
            assert_eq!(value[field], json!(null), "{field} is written as null");
        }
        // A whole number of seconds stays a float.
        let whole = serde_json::to_value(EdgeProvider { last_load_seconds: Some(3.0), ..provider() }).unwrap();
        assert_eq!(whole["last_load_seconds"].to_string(), "3.0");

        let nodes = NodesSnapshot {
            nodes: vec![
                node(),
                EdgeNode {
                    command_sandbox: None,
                    connected: false,
                    connected_at_ms: None,
                    generation: None,
                    name: "mac-2".into(),
                    phase: None,
                    providers: BTreeMap::new(),
                    sandbox_gaps: vec![],
                    version: None,
                    workspaces: BTreeMap::new(),
                },
            ],
        };
        let text = serde_json::to_string(&nodes).unwrap();
        assert_eq!(
            text,
            concat!(
                r#"{"nodes":[{"command_sandbox":"landlock","connected":true,"connected_at_ms":1700000000123,"#,
                r#""generation":1700000000123456,"name":"mac-1","phase":"ready","providers":{"llama":"unavailable"},"#,
                r#""sandbox_gaps":["tcp"],"version":"0.1.0","workspaces":{"site":"accepted"}},"#,
                r#"{"command_sandbox":null,"connected":false,"connected_at_ms":null,"generation":null,"#,
                r#""name":"mac-2","phase":null,"providers":{},"sandbox_gaps":[],"version":null,"workspaces":{}}]}"#,
            )
        );
        assert_eq!(serde_json::from_str::<NodesSnapshot>(&text).unwrap(), nodes);
    }

    /// A newer Edge: fields this reader does not know, and values it does
    /// not know or in another shape where it reads leniently. Each is no
    /// information; the rest of the snapshot still counts.
    #[test]
    fn a_newer_edge_is_read_leniently() {
        let providers: ProvidersSnapshot = serde_json::from_value(json!({
            "providers": [{
                "id": "llama", "node": "mac-1", "node_ready": true, "health": "available",
                "overlay": {"state": "available", "generation": 4, "sequence": 2, "since_ms": 5000, "source": "probe"},
                "adapter": "llama_cpp", "capacity": "four", "credential": {"profile": "lm", "state": "expiring"},
                "dispatchable": "yes", "ejected_until": 17, "residency": "warming", "last_load_seconds": "12",
                "last_load_at": {"at": 1}, "model_memory": "2 GB", "models": [{"name": "llama"}],
                "target_model": null, "in_flight": -1, "weight": 0.5
            }],
            "queued": [], "leases": {"acquired": "many", "released": 1}, "in_flight_runs": null, "draining": true
        }))
        .unwrap();
        let p = &providers.providers[0];
        assert_eq!(
            (p.id.as_str(), p.node.as_str(), p.node_ready, p.health),
            ("llama", "mac-1", true, EdgeHealth::Available)
        );
        assert_eq!(
            p.overlay,
            Some(Overlay { generation: 4, sequence: 2, since_ms: 5000, state: EdgeHealth::Available })
        );
        assert_eq!((p.adapter, p.capacity, p.credential.as_ref(), p.dispatchable), (None, 0, None, false));
        assert_eq!(
            (p.ejected_until.as_ref(), p.residency, p.last_load_seconds, p.last_load_at.as_ref()),
            (None, None, None, None)
        );
        assert_eq!((p.model_memory, p.models.as_slice(), p.target_model.as_str(), p.in_flight), (None, &[][..], "", 0));
        assert_eq!(providers.queued, BTreeMap::new());
        assert_eq!(providers.leases, Leases { acquired: 0, double_releases: 0, released: 1 });
        assert_eq!(providers.in_flight_runs, 0);

        let nodes: NodesSnapshot = serde_json::from_value(json!({"nodes": [{
            "name": "mac-1", "connected": true, "phase": "ready", "generation": 4, "connected_at_ms": 5000,
            "version": "9.0.0", "providers": {"llama": "degraded"}, "workspaces": {"site": {"verdict": "accepted"}},
            "command_sandbox": {"kind": "landlock"}, "sandbox_gaps": "tcp", "os": "linux"
        }]}))
        .unwrap();
        let n = &nodes.nodes[0];
        assert_eq!(
            (n.name.as_str(), n.connected, n.phase, n.generation),
            ("mac-1", true, Some(SessionPhase::Ready), Some(4))
        );
        assert_eq!((n.connected_at_ms, n.version.as_deref()), (Some(5000), Some("9.0.0")));
        assert!(n.providers.is_empty() && n.workspaces.is_empty() && n.sandbox_gaps.is_empty());
        assert_eq!(n.command_sandbox, None);
    }

    /// An older Edge: only what the reader requires. Absent or `null`.
    #[test]
    fn an_older_edge_is_read_with_what_it_wrote() {
        let providers: ProvidersSnapshot = serde_json::from_value(json!({
            "providers": [{"id": "llama", "node": "mac-1", "node_ready": false, "health": "unknown"},
                          {"id": "qwen", "node": "mac-1", "node_ready": true, "health": "available", "overlay": null}]
        }))
        .unwrap();
        let p = &providers.providers[0];
        assert_eq!((p.overlay.as_ref(), p.credential.as_ref(), p.residency, p.adapter), (None, None, None, None));
        assert_eq!(providers.providers[1].overlay, None);
        let nodes: NodesSnapshot = serde_json::from_value(json!({"nodes": [
            {"name": "mac-1", "connected": false},
            {"name": "mac-2", "connected": false, "phase": null, "generation": null, "connected_at_ms": null, "version": null}
        ]}))
        .unwrap();
        for n in &nodes.nodes {
            assert_eq!((n.phase, n.generation, n.connected_at_ms, n.version.as_deref()), (None, None, None, None));
        }
    }

    /// What health and identity rest on is read closed: a health, overlay
    /// state or phase this reader does not know fails the snapshot (an
    /// error, never a guess), and so does a missing id or overlay field.
    #[test]
    fn health_and_identity_are_read_closed() {
        let provider = |fields: serde_json::Value| {
            let mut p = json!({"id": "a", "node": "n", "node_ready": true, "health": "available"});
            p.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
            serde_json::from_value::<ProvidersSnapshot>(json!({ "providers": [p] }))
        };
        assert!(provider(json!({})).is_ok());
        for bad in [
            json!({"health": "degraded"}),
            json!({"health": null}),
            json!({"id": null}),
            json!({"node_ready": "yes"}),
            json!({"overlay": {"state": "degraded", "generation": 1, "sequence": 1, "since_ms": 1}}),
            json!({"overlay": {"state": "available", "generation": 1, "sequence": 1}}),
        ] {
            assert!(provider(bad.clone()).is_err(), "{bad}");
        }
        assert!(serde_json::from_value::<ProvidersSnapshot>(json!({})).is_err(), "no providers");

        let node = |fields: serde_json::Value| {
            let mut n = json!({"name": "mac-1", "connected": true});
            n.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
            serde_json::from_value::<NodesSnapshot>(json!({ "nodes": [n] }))
        };
        assert!(node(json!({})).is_ok());
        for bad in [json!({"phase": "draining"}), json!({"generation": "4"}), json!({"connected": null})] {
            assert!(node(bad.clone()).is_err(), "{bad}");
        }
    }
}
