//! Status mirroring, the I/O half (leader only): polls the Edge admin API
//! every [`MirrorConfig::interval`] and writes the mirrored fields of
//! `Provider.status` and `NodeCatalog.status` (server-side apply on the
//! status subresource, field manager `iop-operator/status`) only for objects
//! whose fields changed since the last write. What to write is decided by
//! [`crate::mirror`] (pure).
//!
//! Each write is bounded by [`super::namespace::STATUS_WRITE_TIMEOUT`] and a
//! round by [`MirrorConfig::write_timeout`]; polls and writes are counted
//! (`iop_operator_mirror_polls_total`, `iop_operator_status_writes_total`
//! with `writer="mirror"`).
//!
//! The last written value of each object (by uid) is remembered; an object
//! never written by this process compares against the status it carries, so
//! a restart or a new leader does not rewrite everything. While the Edge does
//! not answer nothing is written (the last mirrored state stays).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::{Api, ResourceExt};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::admin::{AdminClient, AdminError};
use super::controller::Stores;
use super::metrics::{Metrics, Writer};
use super::namespace::apply_status;
use super::{Context, timestamp};
use crate::crd::{NodeCatalog, Provider};
use crate::mirror::{self, NodeMirror, NodesSnapshot, ProviderMirror, ProvidersSnapshot};

#[derive(Debug, Clone, Copy)]
pub struct MirrorConfig {
    pub interval: Duration,
    /// Bound of one round of writes.
    pub write_timeout: Duration,
}

impl Default for MirrorConfig {
    fn default() -> Self {
        Self { interval: Duration::from_secs(5), write_timeout: Duration::from_secs(20) }
    }
}

/// What was last written, by object uid.
#[derive(Debug, Default)]
pub struct MirrorState {
    providers: HashMap<String, ProviderMirror>,
    nodes: HashMap<String, NodeMirror>,
    edge_unreachable: bool,
}

/// Counts of one round (for logs and tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    pub written: usize,
    pub failed: usize,
}

/// Both admin snapshots.
pub async fn fetch(admin: &AdminClient) -> Result<(ProvidersSnapshot, NodesSnapshot), AdminError> {
    tokio::try_join!(admin.providers(), admin.nodes())
}

/// [`fetch`], counted in `iop_operator_mirror_polls_total` (`ok` or the
/// [`AdminError::label`]).
pub async fn poll(admin: &AdminClient, metrics: &Metrics) -> Result<(ProvidersSnapshot, NodesSnapshot), AdminError> {
    let fetched = fetch(admin).await;
    metrics.polled(&fetched);
    fetched
}

/// Writes what changed between the Edge's view and the objects' mirrored
/// fields.
pub async fn write(
    ctx: &Context,
    stores: &Stores,
    edge: &(ProvidersSnapshot, NodesSnapshot),
    state: &mut MirrorState,
    now: Timestamp,
) -> Round {
    let live = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| m.deletion_timestamp.is_none();
    let providers: Vec<Provider> = stores
        .providers
        .state()
        .iter()
        .filter_map(|g| g.0.as_ref().ok().filter(|p| live(&p.metadata)).cloned())
        .collect();
    let nodes: Vec<NodeCatalog> =
        stores.nodes.state().iter().filter_map(|g| g.0.as_ref().ok().filter(|n| live(&n.metadata)).cloned()).collect();
    let uid = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| m.uid.clone().unwrap_or_default();

    let current_providers: BTreeMap<String, ProviderMirror> = providers
        .iter()
        .map(|p| {
            let current = state.providers.get(&uid(&p.metadata)).cloned();
            (p.name_any(), current.unwrap_or_else(|| ProviderMirror::of(p.status.as_ref())))
        })
        .collect();
    let current_nodes: BTreeMap<String, NodeMirror> = nodes
        .iter()
        .map(|n| {
            let current = state.nodes.get(&uid(&n.metadata)).cloned();
            (n.name_any(), current.unwrap_or_else(|| NodeMirror::of(n.status.as_ref())))
        })
        .collect();
    let writes = mirror::plan(&edge.0, &edge.1, &current_providers, &current_nodes, now);

    let mut round = Round::default();
    let api: Api<Provider> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    for (name, m) in writes.providers {
        let Some(p) = providers.iter().find(|p| p.name_any() == name) else { continue };
        match apply_status(&api, &ctx.metrics, Writer::Mirror, &name, &m.to_status()).await {
            Ok(()) => {
                tracing::debug!(provider = %name, health = ?m.health, "mirrored provider health");
                state.providers.insert(uid(&p.metadata), m);
                round.written += 1;
            }
            Err(e) => {
                tracing::warn!(provider = %name, error = %e, "writing provider health failed");
                round.failed += 1;
            }
        }
    }
    let api: Api<NodeCatalog> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    for (name, m) in writes.nodes {
        let Some(n) = nodes.iter().find(|n| n.name_any() == name) else { continue };
        match apply_status(&api, &ctx.metrics, Writer::Mirror, &name, &m.to_status()).await {
            Ok(()) => {
                tracing::debug!(node = %name, connected = ?m.connected, "mirrored node connection");
                state.nodes.insert(uid(&n.metadata), m);
                round.written += 1;
            }
            Err(e) => {
                tracing::warn!(node = %name, error = %e, "writing node connection failed");
                round.failed += 1;
            }
        }
    }
    // Forget objects that no longer exist.
    let uids: std::collections::HashSet<String> =
        providers.iter().map(|p| uid(&p.metadata)).chain(nodes.iter().map(|n| uid(&n.metadata))).collect();
    state.providers.retain(|k, _| uids.contains(k));
    state.nodes.retain(|k, _| uids.contains(k));
    round
}

/// Polls and writes until `cancel`.
pub async fn run(
    ctx: Arc<Context>,
    stores: Stores,
    admin: AdminClient,
    config: MirrorConfig,
    cancel: CancellationToken,
) {
    let mut interval = tokio::time::interval(config.interval);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut state = MirrorState::default();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = interval.tick() => {}
        }
        let edge = match poll(&admin, &ctx.metrics).await {
            Ok(edge) => edge,
            Err(e) => {
                if !state.edge_unreachable {
                    tracing::warn!(error = %e, kind = e.label(), "the Edge admin API does not answer; status mirroring paused");
                }
                state.edge_unreachable = true;
                continue;
            }
        };
        if std::mem::take(&mut state.edge_unreachable) {
            tracing::info!("the Edge admin API answers again; status mirroring resumed");
        }
        let now = timestamp(ctx.clock.now());
        match tokio::time::timeout(config.write_timeout, write(&ctx, &stores, &edge, &mut state, now)).await {
            Ok(round) if round.failed > 0 => tracing::debug!(?round, "mirror round had failures"),
            Ok(_) => {}
            Err(_) => tracing::warn!(timeout = ?config.write_timeout, "mirror round timed out"),
        }
    }
}

#[cfg(test)]
mod tests;
