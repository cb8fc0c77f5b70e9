//! `NodeRegistry`: node name -> its current session (generation, phase).
//! Pure bookkeeping behind one mutex; the session task owns the I/O.
//! Provider health lives in the runtime overlay (`crate::overlay`), readiness
//! included.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use iop_proto::admin::SessionPhase;
use iop_proto::liveness::HEARTBEAT_TIMEOUT_REASON;
use iop_proto::pb;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Messages the Edge sends to one node's control stream.
pub type ControlSender = mpsc::Sender<Result<pb::EdgeToNode, tonic::Status>>;

/// Why a session ended; the metric label and the status the node receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    HeartbeatTimeout,
    NodeClosed,
    TransportError,
    ProtocolError,
    /// A newer connection of the same node took over.
    Replaced,
    EdgeShutdown,
    /// A config reload removed the node or changed its providers.
    ConfigChanged,
    /// The node holds a session with this replica already; the new one
    /// was answered and never registered.
    Duplicate,
    /// The certificate the node presented on the connection reached its
    /// notAfter; the connection ended with it (`super::tls`).
    CertificateExpired,
}

impl CloseReason {
    /// Whether sessions normally end this way (the node or this Edge
    /// stopping, a reload, a newer connection), logged at INFO when no run
    /// was lost with it; a lost connection is a WARN.
    pub fn orderly(self) -> bool {
        match self {
            Self::NodeClosed | Self::EdgeShutdown | Self::Replaced | Self::ConfigChanged | Self::Duplicate => true,
            Self::HeartbeatTimeout | Self::TransportError | Self::ProtocolError | Self::CertificateExpired => false,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::HeartbeatTimeout => HEARTBEAT_TIMEOUT_REASON,
            Self::NodeClosed => "node_closed",
            Self::TransportError => "transport_error",
            Self::ProtocolError => "protocol_error",
            Self::Replaced => "replaced",
            Self::EdgeShutdown => "edge_shutdown",
            Self::ConfigChanged => "config_changed",
            Self::Duplicate => "duplicate",
            Self::CertificateExpired => "certificate_expired",
        }
    }
}

/// Hands out connection generations that are unique across Edge restarts:
/// each is `max(now in microseconds since the epoch, previous + 1)`, so a
/// restarted Edge (whose clock moved on) never reuses a generation, and
/// generations of one process strictly increase.
#[derive(Debug, Default)]
pub struct GenerationSource {
    last: AtomicU64,
}

impl GenerationSource {
    pub fn next(&self) -> u64 {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
        let mut last = self.last.load(Ordering::Relaxed);
        loop {
            let next = now.max(last + 1);
            match self.last.compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return next,
                Err(seen) => last = seen,
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct Session {
    pub generation: u64,
    /// As `/admin/v1/nodes` shows it.
    pub phase: SessionPhase,
    pub connected_at_ms: u64,
    /// What the node reported in Register (`iop-node` version).
    pub node_version: String,
    pub control: ControlSender,
    /// Cancelled to make the session task close this connection.
    pub close: CancellationToken,
    /// Why `close` was cancelled, when it was not a newer connection.
    pub close_reason: Arc<std::sync::OnceLock<CloseReason>>,
    /// The X25519 key this connection's node sent in Register for sealing
    /// credential leases; `None` when it sent none (or not 32 bytes).
    pub lease_key: Option<Arc<[u8]>>,
    /// The node's verdict on each workspace assigned to it, from NodeReady
    /// (`accepted` or a closed reason; see `session::workspace_verdicts`).
    pub workspaces: BTreeMap<String, &'static str>,
    /// How the node runs workspace commands, as it said in Register
    /// (`session::command_sandbox_label`).
    pub command_sandbox: &'static str,
    /// What the node's sandbox cannot refuse on its machine
    /// (`session::sandbox_gap_labels`).
    pub sandbox_gaps: Vec<&'static str>,
    /// The serial of the certificate the node presented on this connection
    /// (`super::tls::Presented::serial`).
    pub certificate_serial: String,
}

#[derive(Debug, Default)]
pub struct NodeRegistry {
    sessions: Mutex<BTreeMap<String, Session>>,
}

/// A configured node and its current session, if any (what
/// `/admin/v1/nodes` shows, [`iop_proto::admin::EdgeNode`]).
#[derive(Debug, Clone)]
pub struct NodeSnapshot {
    pub name: String,
    pub connected: bool,
    pub phase: Option<SessionPhase>,
    pub generation: Option<u64>,
    pub connected_at_ms: Option<u64>,
    pub version: Option<String>,
    /// Workspace ref -> `accepted` or why the node refused it (empty while
    /// not connected or before readiness).
    pub workspaces: BTreeMap<String, &'static str>,
    /// `landlock`, `seatbelt`, `unsandboxed` (the owner allowed commands
    /// without a sandbox), `unavailable` (commands refused) or `unknown`.
    pub command_sandbox: Option<&'static str>,
    /// What that sandbox cannot refuse on the node's machine (docs/security.md
    /// "What the node says it cannot refuse"): `signal_scope`, `tcp`, `reserved_writable`,
    /// `bounding_set`, `priority`; empty when nothing.
    pub sandbox_gaps: Vec<&'static str>,
    /// The serial of the certificate the session's connection presented.
    pub certificate_serial: Option<String>,
}

impl NodeRegistry {
    /// Installs a new current session for `node`. A previous session of the
    /// same node is returned so the caller can fence and close it.
    pub fn register(&self, node: &str, session: Session) -> Option<Session> {
        self.sessions.lock().unwrap().insert(node.to_string(), session)
    }

    /// Marks the session ready, only if `generation` is still current.
    pub fn mark_ready(&self, node: &str, generation: u64) -> bool {
        let mut sessions = self.sessions.lock().unwrap();
        match sessions.get_mut(node) {
            Some(s) if s.generation == generation => {
                s.phase = SessionPhase::Ready;
                true
            }
            _ => false,
        }
    }

    /// Records the workspace verdicts of `node`'s connection `generation`.
    pub fn set_workspaces(&self, node: &str, generation: u64, verdicts: BTreeMap<String, &'static str>) {
        if let Some(s) = self.sessions.lock().unwrap().get_mut(node).filter(|s| s.generation == generation) {
            s.workspaces = verdicts;
        }
    }

    /// The node's verdict on workspace `reference` on connection
    /// `generation` (`accepted` or why not); `None` when that connection is
    /// not current or the node did not report it.
    pub fn workspace_verdict(&self, node: &str, generation: u64, reference: &str) -> Option<&'static str> {
        let sessions = self.sessions.lock().unwrap();
        sessions.get(node).filter(|s| s.generation == generation).and_then(|s| s.workspaces.get(reference).copied())
    }

    /// Removes the session only if it is still the current one for `node`.
    pub fn remove(&self, node: &str, generation: u64) -> bool {
        let mut sessions = self.sessions.lock().unwrap();
        if sessions.get(node).is_some_and(|s| s.generation == generation) {
            sessions.remove(node);
            true
        } else {
            false
        }
    }

    pub fn current_generation(&self, node: &str) -> Option<u64> {
        self.sessions.lock().unwrap().get(node).map(|s| s.generation)
    }

    pub fn is_current(&self, node: &str, generation: u64) -> bool {
        self.sessions.lock().unwrap().get(node).is_some_and(|s| s.generation == generation)
    }

    /// The generation of the node's current connection if it completed
    /// readiness (whether a provider of it may receive runs is
    /// `crate::core::health::ProviderView`'s to say).
    pub fn ready_generation(&self, node: &str) -> Option<u64> {
        let sessions = self.sessions.lock().unwrap();
        sessions.get(node).filter(|s| s.phase == SessionPhase::Ready).map(|s| s.generation)
    }

    /// The control channel of `node`'s session if `generation` is still its
    /// current, Ready connection (a lease is only good on that connection).
    pub fn control_if_current(&self, node: &str, generation: u64) -> Option<ControlSender> {
        let sessions = self.sessions.lock().unwrap();
        sessions
            .get(node)
            .filter(|s| s.generation == generation && s.phase == SessionPhase::Ready)
            .map(|s| s.control.clone())
    }

    /// The lease key `node` sent on connection `generation` (`Some(None)`:
    /// it sent none); `None` when that connection is no longer current.
    pub fn lease_key(&self, node: &str, generation: u64) -> Option<Option<Arc<[u8]>>> {
        let sessions = self.sessions.lock().unwrap();
        sessions.get(node).filter(|s| s.generation == generation).map(|s| s.lease_key.clone())
    }

    /// The control channel of the node's current Ready session.
    pub fn control_of(&self, node: &str) -> Option<ControlSender> {
        let sessions = self.sessions.lock().unwrap();
        sessions.get(node).filter(|s| s.phase == SessionPhase::Ready).map(|s| s.control.clone())
    }

    pub fn ready_count(&self) -> usize {
        self.sessions.lock().unwrap().values().filter(|s| s.phase == SessionPhase::Ready).count()
    }

    /// Which of `nodes` have a Ready session (in their order).
    pub fn ready_among<'a>(&self, nodes: impl IntoIterator<Item = &'a str>) -> Vec<bool> {
        let sessions = self.sessions.lock().unwrap();
        nodes.into_iter().map(|n| sessions.get(n).is_some_and(|s| s.phase == SessionPhase::Ready)).collect()
    }

    /// The control channel of `node`'s session, whatever its phase.
    pub fn control_in_any_phase(&self, node: &str) -> Option<ControlSender> {
        self.sessions.lock().unwrap().get(node).map(|s| s.control.clone())
    }

    /// The control channel of every session, whatever its phase.
    pub fn controls(&self) -> Vec<ControlSender> {
        self.sessions.lock().unwrap().values().map(|s| s.control.clone()).collect()
    }

    /// Closes every session (edge shutdown).
    pub fn close_all(&self) {
        for s in self.sessions.lock().unwrap().values() {
            s.close.cancel();
        }
    }

    /// Closes `node`'s current session for `reason`; its generation is fenced.
    pub fn close(&self, node: &str, reason: CloseReason) {
        if let Some(s) = self.sessions.lock().unwrap().get(node) {
            let _ = s.close_reason.set(reason);
            s.close.cancel();
        }
    }

    pub fn snapshot(&self, configured: &[String]) -> Vec<NodeSnapshot> {
        let sessions = self.sessions.lock().unwrap();
        configured
            .iter()
            .map(|name| {
                let s = sessions.get(name);
                NodeSnapshot {
                    name: name.clone(),
                    connected: s.is_some(),
                    phase: s.map(|s| s.phase),
                    generation: s.map(|s| s.generation),
                    connected_at_ms: s.map(|s| s.connected_at_ms),
                    version: s.map(|s| s.node_version.clone()),
                    workspaces: s.map(|s| s.workspaces.clone()).unwrap_or_default(),
                    command_sandbox: s.map(|s| s.command_sandbox),
                    sandbox_gaps: s.map(|s| s.sandbox_gaps.clone()).unwrap_or_default(),
                    certificate_serial: s.map(|s| s.certificate_serial.clone()),
                }
            })
            .collect()
    }
}

#[cfg(test)]
impl Session {
    /// A session that answered Register on `generation` (tests of the
    /// registry and of what reads it).
    pub(crate) fn registered(generation: u64, control: ControlSender) -> Self {
        Session {
            generation,
            phase: SessionPhase::Registered,
            connected_at_ms: 0,
            node_version: String::new(),
            control,
            close: CancellationToken::new(),
            close_reason: Default::default(),
            lease_key: None,
            workspaces: BTreeMap::new(),
            command_sandbox: "unknown",
            sandbox_gaps: Vec::new(),
            certificate_serial: String::new(),
        }
    }
}

#[cfg(test)]
mod tests;
