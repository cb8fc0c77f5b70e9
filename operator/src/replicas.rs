//! The Edge's replicas, from its pods (pure).
//!
//! Every Edge pod is one replica, and its replica id is its pod name (the
//! chart passes `iop-edge --replica-id=$(POD_NAME)`). The operator watches
//! the Edge pods (label selector `IOP_EDGE_POD_SELECTOR`) and
//!
//! - renders their ids into the Edge config's `replicas` ([`replica_ids`]),
//!   so every node keeps one session with each of them;
//! - reads each one's admin API at its pod IP for status ([`replicas`],
//!   [`crate::mirror`]).
//!
//! A pod is a replica while it is not terminating (no `deletionTimestamp`:
//! a draining pod is on its way out, and nodes need not reach it again) and
//! has not ended (phase `Failed` or `Succeeded`: an evicted pod stays in the
//! API but never serves again). A pod that is still starting (`Pending`, no
//! IP yet) is a replica: it is in the config before it runs, so the nodes
//! dial it as soon as it listens. Names that are not valid replica ids
//! (never the case for pod names) are left out rather than make the whole
//! config invalid.
//!
//! The ids are rendered whenever the pods are known, one replica included:
//! an Edge whose own id is listed behaves as with an empty list (one
//! replica, whatever its id), and a second pod joins without a special case.
//! `replicas` is empty only while no Edge pod exists.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;

/// One Edge replica: its id (the pod name) and where its admin API is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Replica {
    pub id: String,
    /// The pod's IP (`status.podIP`); absent until the pod has one.
    pub ip: Option<IpAddr>,
}

/// Whether a pod counts as a replica (see the module docs).
pub fn is_replica(pod: &Pod) -> bool {
    let ended = pod.status.as_ref().and_then(|s| s.phase.as_deref()).is_some_and(|p| p == "Failed" || p == "Succeeded");
    pod.metadata.deletion_timestamp.is_none() && !ended
}

/// The replicas among `pods`, sorted by id, each id once.
pub fn replicas<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Vec<Replica> {
    let mut out: Vec<Replica> = pods
        .into_iter()
        .filter(|p| is_replica(p))
        .filter_map(|p| {
            let id = p.metadata.name.clone().filter(|n| iop_proto::config::is_replica_id(n))?;
            let ip = p.status.as_ref().and_then(|s| s.pod_ip.as_deref()).and_then(|ip| ip.parse().ok());
            Some(Replica { id, ip })
        })
        .collect();
    out.sort();
    out.dedup_by(|a, b| a.id == b.id);
    out
}

/// The Edge config's `replicas`: the replicas' ids, sorted.
pub fn replica_ids<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Vec<String> {
    replicas(pods).into_iter().map(|r| r.id).collect()
}

#[cfg(test)]
mod tests;
