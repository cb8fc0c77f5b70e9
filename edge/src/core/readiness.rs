//! Whether this replica is ready to take requests (`/readyz`): the one
//! decision, over counts and durations, that a load balancer's view of the
//! replica follows.
//!
//! A replica is ready when it can serve what a load balancer sends it: not
//! draining, and every node of the config holds a Ready session with it
//! (or the config lists none). A replica that starts while other replicas
//! serve must not take requests for a node it does not hold yet: those
//! would answer `503 no_provider_available` here while another replica
//! serves them (issue 43: a scale-up whose new replica turned ready on its
//! first node 503'd the other nodes' models until they arrived). Waiting
//! is bounded by the startup grace (`iop-edge --startup-grace-ms`): a node
//! that is off (a Mac asleep, a machine retired but still listed) would
//! otherwise keep every new replica out of rotation for good.
//!
//! Once ready, a replica stays ready until it drains, whatever its nodes
//! do later ([`Ready::WasReady`]). A node that goes away later goes away
//! for every replica alike (it is the node that stopped, lost its network
//! or restarts): taking this replica out of the Service then helps no
//! request, since no other replica serves that node's models either, and
//! it would turn away every request for the other nodes' models, which
//! this replica serves. Were readiness to follow the nodes, one node
//! asleep would take every replica out of the Service at once (no
//! endpoints: every request fails), and a node reconnecting would flap
//! every replica's endpoint. Only a starting replica is behind the others,
//! which hold the nodes it lacks; that is the one case where sending the
//! requests elsewhere is strictly better. (A node that reaches the other
//! replicas but not this one keeps dialing until it holds this one too,
//! see `iop-node`'s reconnect.)

use std::time::Duration;

/// What readiness is decided on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inputs {
    /// The shutdown signal arrived.
    pub draining: bool,
    /// This replica was ready before (it stays so until it drains).
    pub was_ready: bool,
    /// The nodes the config lists.
    pub nodes: usize,
    /// How many of them hold a Ready session with this replica.
    pub ready_nodes: usize,
    /// Since this replica started.
    pub since_start: Duration,
    pub startup_grace: Duration,
}

/// Why a replica is ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// Every node of the config holds a Ready session here.
    EveryNode,
    /// The config lists no node: nothing to wait for.
    NoNodes,
    /// It was ready before; a node lost since does not change that.
    WasReady,
    /// The startup grace passed before every node arrived.
    StartupGrace,
}

/// This replica's readiness, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    Ready(Ready),
    /// Waiting for nodes, for at most `grace_left`.
    Starting {
        grace_left: Duration,
    },
    /// The shutdown signal arrived: load balancers go elsewhere.
    Draining,
}

impl Readiness {
    pub fn of(inputs: Inputs) -> Readiness {
        let Inputs { draining, was_ready, nodes, ready_nodes, since_start, startup_grace } = inputs;
        if draining {
            Readiness::Draining
        } else if nodes == 0 {
            Readiness::Ready(Ready::NoNodes)
        } else if ready_nodes >= nodes {
            Readiness::Ready(Ready::EveryNode)
        } else if was_ready {
            Readiness::Ready(Ready::WasReady)
        } else if since_start >= startup_grace {
            Readiness::Ready(Ready::StartupGrace)
        } else {
            Readiness::Starting { grace_left: startup_grace - since_start }
        }
    }

    pub fn is_ready(self) -> bool {
        matches!(self, Readiness::Ready(_))
    }

    /// `/readyz`'s `status`.
    pub fn status(self) -> &'static str {
        match self {
            Readiness::Ready(_) => "ready",
            Readiness::Starting { .. } => "starting",
            Readiness::Draining => "draining",
        }
    }

    /// `/readyz`'s `reason`: why, for whoever debugs a replica that takes
    /// no traffic (counts only: `/readyz` is on the client listener; the
    /// admin API's `/admin/v1/nodes` names the nodes).
    pub fn reason(self, ready_nodes: usize, nodes: usize) -> String {
        match self {
            Readiness::Ready(Ready::EveryNode) => format!("every node holds a ready session: {ready_nodes} of {nodes}"),
            Readiness::Ready(Ready::NoNodes) => "the config lists no node".to_string(),
            Readiness::Ready(Ready::WasReady) => {
                format!("ready since every node was; {ready_nodes} of {nodes} nodes ready now")
            }
            Readiness::Ready(Ready::StartupGrace) => {
                format!("the startup grace passed with {ready_nodes} of {nodes} nodes ready")
            }
            Readiness::Starting { grace_left } => format!(
                "waiting for nodes: {ready_nodes} of {nodes} ready (ready anyway in {} ms, --startup-grace-ms)",
                grace_left.as_millis()
            ),
            Readiness::Draining => "draining: the shutdown signal arrived".to_string(),
        }
    }
}

#[cfg(test)]
mod tests;
