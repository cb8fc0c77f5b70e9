//! What a run was admitted to ([`Lease`]) and why its slot was given back
//! ([`ReleaseReason`]): the nouns admission, dispatch, credentials and the
//! overlay share.

use iop_proto::config::{Adapter, ProviderEntry};

/// Immutable record of what a run was admitted to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    run_id: String,
    provider_id: String,
    adapter: Adapter,
    target_model: String,
    node: String,
    generation: u64,
    slot: u32,
}

impl Lease {
    /// The lease of slot `slot` of `provider` for run `run_id`, on its
    /// node's connection `generation`.
    pub fn new(run_id: String, provider: &ProviderEntry, generation: u64, slot: u32) -> Self {
        Self {
            run_id,
            provider_id: provider.id.clone(),
            adapter: provider.adapter,
            target_model: provider.target.model.clone(),
            node: provider.node.clone(),
            generation,
            slot,
        }
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }
    pub fn provider_id(&self) -> &str {
        &self.provider_id
    }
    pub fn adapter(&self) -> Adapter {
        self.adapter
    }
    pub fn target_model(&self) -> &str {
        &self.target_model
    }
    pub fn node(&self) -> &str {
        &self.node
    }
    pub fn generation(&self) -> u64 {
        self.generation
    }
    pub fn slot(&self) -> u32 {
        self.slot
    }
}

/// Why a lease was released; the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReleaseReason {
    Completed,
    ProviderError,
    ClientDisconnected,
    /// The node's connection ended (fenced generation) during the run.
    NodeDisconnected,
    /// The attempt failed before the first byte and the request moved on.
    Retried,
    /// Granted to a waiter that had already given up (queue timeout).
    QueueTimeout,
    EdgeShutdown,
    /// The request's time budget ran out before the run's terminal.
    Deadline,
}

impl ReleaseReason {
    pub fn label(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::ProviderError => "provider_error",
            Self::ClientDisconnected => "client_disconnected",
            Self::NodeDisconnected => "node_disconnected",
            Self::Retried => "retried",
            Self::QueueTimeout => "queue_timeout",
            Self::EdgeShutdown => "edge_shutdown",
            Self::Deadline => "deadline",
        }
    }
}
