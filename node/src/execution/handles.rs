//! What an execution reports to ([`Observer`]) and is stopped by
//! ([`Cancel`]): handles its session gives it. A module of their own, which
//! imports neither the execution code nor the session, so that the lease
//! ledger, runs, tunnels and the session use them without an import cycle.

use std::sync::{Arc, OnceLock};

use iop_proto::pb;
use tokio_util::sync::CancellationToken;

use crate::health::HealthMonitor;
use crate::metrics::NodeMetrics;
use crate::transport::sequence::SessionSequence;

/// Where an execution's liveness observations go.
#[derive(Clone)]
pub struct Observer {
    /// The connection's health observation sequence; `None` on paths bound
    /// to no connection (the key is then omitted).
    pub sequence: Option<Arc<SessionSequence>>,
    pub metrics: Arc<NodeMetrics>,
    /// The connection's health monitor, told when this execution's evidence
    /// lowers its provider so it probes the provider's return.
    pub health: Option<Arc<HealthMonitor>>,
    /// The connection's residency monitor: says whether a run starts cold
    /// (then its first byte ends a load) and observes the provider again
    /// after every run.
    pub residency: Option<Arc<crate::residency::ResidencyMonitor>>,
}

impl Observer {
    pub fn unbound() -> Self {
        Self { sequence: None, metrics: NodeMetrics::new(), health: None, residency: None }
    }

    /// Evidence about `provider` is final: sequence it and, when it says the
    /// provider is down, have the monitor probe its return.
    pub(crate) fn observed(&self, provider: &str, health: pb::ProviderHealth) -> Option<u64> {
        if health == pb::ProviderHealth::Unavailable
            && let Some(monitor) = &self.health
        {
            monitor.lowered(provider);
        }
        self.sequence.as_deref().map(SessionSequence::next)
    }
}

/// Cancels one execution and remembers why (the first reason wins).
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    token: CancellationToken,
    reason: Arc<OnceLock<pb::CancelReason>>,
}

impl Cancel {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cancel(&self, reason: pb::CancelReason) {
        let _ = self.reason.set(reason);
        self.token.cancel();
    }

    pub async fn cancelled(&self) {
        self.token.cancelled().await
    }

    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// The reason given to [`Cancel::cancel`]; `ClientDisconnected` if none was.
    pub fn reason(&self) -> pb::CancelReason {
        self.reason.get().copied().unwrap_or(pb::CancelReason::ClientDisconnected)
    }

    /// Whether both handles cancel the same execution.
    pub fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.reason, &other.reason)
    }
}
