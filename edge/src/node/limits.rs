//! What one node may hold of the Edge: connections, concurrent calls
//! (HTTP/2 streams) and bytes of messages in transit, each derived from the
//! node's entry in the config, so a node certificate (even a stolen one)
//! can cost the Edge a bounded amount of memory and never more.
//!
//! The limits are pure functions of the config ([`NodeLimits::of`],
//! [`NodeMethod::max_message_bytes`]); [`NodeLoad`] counts what each node
//! holds now and refuses what would exceed them ([`LimitRefusal`]); the
//! gRPC layer that applies them to every call is `super::meter`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use iop_proto::config::EdgeConfig;
use iop_proto::wire;

use crate::metrics::{EdgeMetrics, NodeLabels, NodeLimitLabels};

/// Connections one node may hold open with this replica. A node needs one
/// (one session per replica); the rest covers reconnects: the Edge may
/// still hold a connection the node already gave up on (a changed network)
/// until HTTP/2 keepalive finds it dead, and a node that dialed the load
/// balancer for another replica and met this one again closes its extra
/// connection right after Register.
pub const MAX_CONNECTIONS_PER_NODE: usize = 4;

/// Calls a node may have open beyond what its providers and workspaces
/// explain (a command or diagnostic racing a run, a call whose end has not
/// reached the Edge yet).
pub const STREAM_HEADROOM: usize = 16;

/// The `NodeGateway` methods, by what a node sends on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeMethod {
    Control,
    RunEvents,
    TunnelFrames,
    WorkspaceCalls,
    /// A path the service does not serve (tonic answers `UNIMPLEMENTED`).
    Unknown,
}

impl NodeMethod {
    pub fn of_path(path: &str) -> Self {
        let service = iop_proto::pb::node_gateway_server::SERVICE_NAME;
        let Some(method) =
            path.strip_prefix('/').and_then(|p| p.strip_prefix(service)).and_then(|p| p.strip_prefix('/'))
        else {
            return Self::Unknown;
        };
        match method {
            "Control" => Self::Control,
            "RunEvents" => Self::RunEvents,
            "TunnelFrames" => Self::TunnelFrames,
            "WorkspaceCalls" => Self::WorkspaceCalls,
            _ => Self::Unknown,
        }
    }

    /// Largest message a node may send on this method. Only workspace
    /// answers (file contents, command output) are large; tonic's own
    /// decode limit is one per service, so the layer in `super::meter`
    /// checks this one per method before tonic reads a message.
    pub fn max_message_bytes(self) -> usize {
        match self {
            Self::Control | Self::Unknown => wire::MAX_CONTROL_MESSAGE_BYTES,
            Self::RunEvents => wire::MAX_RUN_EVENT_MESSAGE_BYTES,
            Self::TunnelFrames => wire::MAX_TUNNEL_FRAME_MESSAGE_BYTES,
            Self::WorkspaceCalls => wire::MAX_WORKSPACE_MESSAGE_BYTES,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Control => "control",
            Self::RunEvents => "run_events",
            Self::TunnelFrames => "tunnel_frames",
            Self::WorkspaceCalls => "workspace_calls",
            Self::Unknown => "unknown",
        }
    }
}

/// The largest message any method accepts: tonic's service-wide decode
/// limit, above which the per-method check never lets a message through.
pub const MAX_NODE_MESSAGE_BYTES: usize = wire::MAX_WORKSPACE_MESSAGE_BYTES;

/// What one node may hold of this replica besides its
/// [`MAX_CONNECTIONS_PER_NODE`] connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeLimits {
    /// Calls open at once over all its connections.
    pub streams: usize,
    /// Bytes of messages the node announced (a message's length prefix)
    /// that have not all reached the Edge's decoder yet, over all its calls.
    pub in_transit_bytes: usize,
}

impl NodeLimits {
    /// The formula (docs/security.md "Node-facing limits"):
    ///
    /// - streams = one control stream per allowed connection plus
    ///   2 x slots (one call per run or tunnel in a provider slot, and as
    ///   many again for calls whose end is still on its way while the slot
    ///   already holds the next run) plus one workspace call per job the
    ///   node's workspaces admit at once plus [`STREAM_HEADROOM`];
    /// - bytes in transit = one control message + one run event at their
    ///   largest + one largest workspace answer per job the node's
    ///   workspaces admit at once,
    ///
    /// where slots is the sum of the `capacity` of the node's providers.
    /// A node the config does not list gets the floor (it cannot connect).
    pub fn of(config: &EdgeConfig, node: &str) -> Self {
        let slots: usize = config.providers.iter().filter(|p| p.node == node).map(|p| p.capacity as usize).sum();
        let jobs: usize =
            config.workspaces.iter().filter(|w| w.node == node).map(|w| w.limits.max_concurrent_jobs as usize).sum();
        Self {
            streams: MAX_CONNECTIONS_PER_NODE + 2 * slots + jobs + STREAM_HEADROOM,
            in_transit_bytes: wire::MAX_CONTROL_MESSAGE_BYTES
                + wire::MAX_RUN_EVENT_MESSAGE_BYTES
                + jobs * wire::MAX_WORKSPACE_MESSAGE_BYTES,
        }
    }
}

/// Which limit refused a node; the `limit` label of
/// `iop_edge_node_limit_refusals_total` and the log field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitRefusal {
    #[error("the node holds as many connections as it may")]
    Connections,
    #[error("the node has as many calls open as it may")]
    Streams,
    #[error("the message is larger than this call accepts")]
    MessageSize,
    #[error("the node has as many message bytes in transit as it may")]
    InTransit,
    #[error("the message is compressed (no compression is negotiated)")]
    Compressed,
}

impl LimitRefusal {
    pub fn label(self) -> &'static str {
        match self {
            Self::Connections => "connections",
            Self::Streams => "streams",
            Self::MessageSize => "message_size",
            Self::InTransit => "in_transit",
            Self::Compressed => "compressed",
        }
    }

    /// What the node's call ends with.
    pub fn status(self) -> tonic::Status {
        match self {
            Self::Compressed => tonic::Status::unimplemented(self.to_string()),
            _ => tonic::Status::resource_exhausted(format!("{} ({})", self, self.label())),
        }
    }
}

/// What one node holds now.
#[derive(Debug, Default)]
struct Held {
    connections: AtomicUsize,
    streams: AtomicUsize,
    in_transit: AtomicUsize,
}

/// Counts per node (configured names only: the accept loop admits no
/// other), and the gauges and refusal counter that show them.
pub struct NodeLoad {
    nodes: Mutex<HashMap<String, Arc<Held>>>,
    metrics: Arc<EdgeMetrics>,
}

/// Adds `amount` to `counter` if the result stays within `limit`.
fn try_add(counter: &AtomicUsize, amount: usize, limit: usize) -> Result<usize, usize> {
    counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| held.checked_add(amount).filter(|&n| n <= limit))
}

impl NodeLoad {
    pub fn new(metrics: Arc<EdgeMetrics>) -> Arc<Self> {
        Arc::new(Self { nodes: Mutex::default(), metrics })
    }

    fn held(&self, node: &str) -> Arc<Held> {
        self.nodes.lock().unwrap().entry(node.to_string()).or_default().clone()
    }

    /// Counts and logs a refusal of `node` on `what` (a method's label or
    /// `connection`).
    pub fn refused(&self, node: &str, refusal: LimitRefusal, what: &'static str) {
        let labels = NodeLimitLabels { node: node.to_string(), limit: refusal.label() };
        self.metrics.node_limit_refusals.get_or_create(&labels).inc();
        tracing::warn!(%node, limit = refusal.label(), on = what, "node refused: {refusal}");
    }

    /// A connection of `node`, held until the guard drops (with the
    /// connection), or the refusal when it holds `max` already
    /// ([`MAX_CONNECTIONS_PER_NODE`]).
    pub fn open_connection(self: &Arc<Self>, node: &str, max: usize) -> Result<ConnectionGuard, LimitRefusal> {
        let held = self.held(node);
        let now = try_add(&held.connections, 1, max).map_err(|_| LimitRefusal::Connections)? + 1;
        self.gauge(&self.metrics.node_connections, node, now);
        Ok(ConnectionGuard { load: self.clone(), node: node.to_string(), held })
    }

    /// A call of `node`, held until the guard drops, or the refusal when
    /// it has `limits.streams` open.
    pub fn open_stream(self: &Arc<Self>, node: &str, limits: &NodeLimits) -> Result<StreamGuard, LimitRefusal> {
        let held = self.held(node);
        let now = try_add(&held.streams, 1, limits.streams).map_err(|_| LimitRefusal::Streams)? + 1;
        self.gauge(&self.metrics.node_streams, node, now);
        Ok(StreamGuard { load: self.clone(), node: node.to_string(), held, budget: limits.in_transit_bytes })
    }

    fn gauge(
        &self,
        family: &prometheus_client::metrics::family::Family<NodeLabels, prometheus_client::metrics::gauge::Gauge>,
        node: &str,
        value: usize,
    ) {
        family.get_or_create(&NodeLabels { node: node.to_string() }).set(value as i64);
    }
}

/// One open connection of a node.
pub struct ConnectionGuard {
    load: Arc<NodeLoad>,
    node: String,
    held: Arc<Held>,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        let now = self.held.connections.fetch_sub(1, Ordering::AcqRel) - 1;
        self.load.gauge(&self.load.metrics.node_connections, &self.node, now);
    }
}

/// One open call of a node; reserves and releases its bytes in transit.
pub struct StreamGuard {
    load: Arc<NodeLoad>,
    node: String,
    held: Arc<Held>,
    budget: usize,
}

impl StreamGuard {
    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn load(&self) -> &NodeLoad {
        &self.load
    }

    /// Reserves `bytes` of the node's budget for a message in transit.
    pub fn reserve(&self, bytes: usize) -> Result<(), LimitRefusal> {
        let now = try_add(&self.held.in_transit, bytes, self.budget).map_err(|_| LimitRefusal::InTransit)? + bytes;
        self.load.gauge(&self.load.metrics.node_in_transit_bytes, &self.node, now);
        Ok(())
    }

    /// Returns `bytes` reserved by [`StreamGuard::reserve`].
    pub fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let now = self.held.in_transit.fetch_sub(bytes, Ordering::AcqRel) - bytes;
        self.load.gauge(&self.load.metrics.node_in_transit_bytes, &self.node, now);
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let now = self.held.streams.fetch_sub(1, Ordering::AcqRel) - 1;
        self.load.gauge(&self.load.metrics.node_streams, &self.node, now);
    }
}

#[cfg(test)]
mod tests;
