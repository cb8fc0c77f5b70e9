//! Status mirroring, the I/O half (leader only): every
//! [`MirrorConfig::interval`] it reads the admin API of every Edge replica
//! (`GET /admin/v1/providers` and `/admin/v1/nodes` at the pod's IP and the
//! admin port, all replicas at once, each bounded by the client's timeout),
//! merges them ([`crate::mirror`], pure) and writes the mirrored fields of
//! `Provider.status` and `NodeCatalog.status` (server-side apply on the
//! status subresource, field manager `iop-operator/status`) only for objects
//! whose fields changed since the last write.
//!
//! The replicas are the Edge pods of the controller's pod cache
//! ([`crate::replicas`]): the same pods the Edge config lists. Their
//! addresses come from the pods (`status.podIP`) rather than a Service's
//! EndpointSlices: the operator already watches the pods for the config, so
//! ids, addresses and the list the config holds come from one cache, and a
//! replica that is not Ready yet (starting, waiting for a node) is read too.
//! A replica without an IP yet, or that does not answer, counts as one that
//! sees nothing.
//!
//! Each write is bounded by [`super::namespace::STATUS_WRITE_TIMEOUT`] and a
//! round by [`MirrorConfig::write_timeout`]; polls (one per replica) and
//! writes are counted (`iop_operator_mirror_polls_total`,
//! `iop_operator_status_writes_total` with `writer="mirror"`).
//!
//! The last written value of each object (by uid) is remembered, with the
//! object's resourceVersion before and after that write: while the cache
//! still shows one of those two (it has not seen the write yet, or has seen
//! only it), the remembered value is what the object holds. Once anyone
//! else writes the object (a hand edit of `status.health`, say), the mirror
//! compares against the status it carries, so the edit is corrected at the
//! next poll. An object never written by this process compares against its
//! status too, so a restart or a new leader does not rewrite everything.
//! A mirror field someone else set that the apply leaves out is removed
//! right after it ([`crate::mirror::leftovers`]; the resourceVersion after
//! that removal is remembered too).
//!
//! `WorkspacesReady` is judged from the NodeCatalogs and WorkspaceTemplates
//! of the cache with the build's own function
//! ([`crate::reconcile::desired::node_workspaces`]); the first round waits
//! until both have listed.
//! While no replica answers nothing is written (the last mirrored state
//! stays).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use k8s_openapi::jiff::Timestamp;
use kube::core::object::HasStatus;
use kube::{Api, ResourceExt};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::admin::{AdminClient, AdminError, EdgeAdminUrl};
use super::controller::Stores;
use super::metrics::{HasStatusKind, Metrics, Writer};
use super::namespace::{apply_status, merge_status};
use super::{Context, Error, timestamp};
use crate::crd::{NodeCatalog, Provider};
use crate::mirror::{self, AdminSnapshots, EdgeView, Mirrored, NodeFacts, NodeMirror, ProviderMirror};
use crate::reconcile::desired::node_workspaces;
use crate::replicas::Replica;

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

/// What was last written, by object uid, and which replicas were silent.
#[derive(Debug, Default)]
pub struct MirrorState {
    providers: HashMap<String, Written<ProviderMirror>>,
    nodes: HashMap<String, Written<NodeMirror>>,
    /// Replicas that did not answer the last poll (for logging changes only).
    silent: BTreeSet<String>,
    none_answered: bool,
}

/// A value the mirror wrote, and the object's resourceVersions just before
/// that write and after each of its requests (the apply, and the removal
/// of leftovers when there were any).
#[derive(Debug, Clone)]
struct Written<M> {
    value: M,
    versions: Vec<Option<String>>,
}

impl<M: Clone> Written<M> {
    /// What the object holds: the value written, while the cached object is
    /// the one written or the one before it; otherwise (written since by
    /// someone else, or never by this process) its own status, `of_status`.
    fn current(this: Option<&Self>, cached_version: &Option<String>, of_status: impl FnOnce() -> M) -> M {
        match this {
            Some(w) if w.versions.contains(cached_version) => w.value.clone(),
            _ => of_status(),
        }
    }
}

/// Counts of one round (for logs and tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    pub written: usize,
    pub failed: usize,
}

/// Both admin snapshots of one replica.
pub async fn fetch(admin: &AdminClient, edge: &EdgeAdminUrl) -> Result<AdminSnapshots, AdminError> {
    tokio::try_join!(admin.providers(edge), admin.nodes(edge))
}

/// [`fetch`], counted in `iop_operator_mirror_polls_total` (`ok` or the
/// [`AdminError::label`]).
pub async fn poll(admin: &AdminClient, edge: &EdgeAdminUrl, metrics: &Metrics) -> Result<AdminSnapshots, AdminError> {
    let fetched = fetch(admin, edge).await;
    metrics.polled(&fetched);
    fetched
}

/// Polls every replica at once (`admin_port` on its pod IP); a replica
/// without an IP is not polled and counts as not answering.
pub async fn poll_all(admin: &AdminClient, replicas: &[Replica], admin_port: u16, metrics: &Metrics) -> EdgeView {
    let polls = replicas.iter().map(|r| async move {
        let answer = match r.ip {
            Some(ip) => match poll(admin, &EdgeAdminUrl::of(ip, admin_port), metrics).await {
                Ok(snapshots) => Some(snapshots),
                Err(e) => {
                    tracing::debug!(replica = %r.id, error = %e, kind = e.label(), "Edge replica admin API did not answer");
                    None
                }
            },
            None => None,
        };
        (r.id.clone(), answer)
    });
    EdgeView { replicas: join_all(polls).await.into_iter().collect::<BTreeMap<_, _>>() }
}

/// Writes what changed between the Edge's view and the objects' mirrored
/// fields.
pub async fn write(ctx: &Context, stores: &Stores, edge: &EdgeView, state: &mut MirrorState, now: Timestamp) -> Round {
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
            let written = state.providers.get(&uid(&p.metadata));
            let current =
                Written::current(written, &p.metadata.resource_version, || ProviderMirror::of(p.status.as_ref()));
            (p.name_any(), current)
        })
        .collect();
    let current_nodes: BTreeMap<String, NodeMirror> = nodes
        .iter()
        .map(|n| {
            let written = state.nodes.get(&uid(&n.metadata));
            let current = Written::current(written, &n.metadata.resource_version, || NodeMirror::of(n.status.as_ref()));
            (n.name_any(), current)
        })
        .collect();
    let snapshot = stores.read(&ctx.namespace).snapshot;
    let mut workspaces = node_workspaces(&snapshot, &ctx.settings);
    let facts: BTreeMap<String, NodeFacts> = nodes
        .iter()
        .map(|n| {
            let issued_serial = n.status.as_ref().and_then(|s| s.certificate.as_ref()).map(|c| c.serial.clone());
            (n.name_any(), NodeFacts { issued_serial, workspaces: workspaces.remove(&n.name_any()) })
        })
        .collect();
    let writes = mirror::plan(edge, &current_providers, &current_nodes, &facts, now);

    let mut round = Round::default();
    let api: Api<Provider> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    for (name, m) in writes.providers {
        let Some(p) = providers.iter().find(|p| p.name_any() == name) else { continue };
        match write_one(&api, &ctx.metrics, &name, &m).await {
            Ok(after) => {
                tracing::debug!(provider = %name, health = ?m.health, "mirrored provider health");
                let versions = std::iter::once(p.metadata.resource_version.clone()).chain(after).collect();
                state.providers.insert(uid(&p.metadata), Written { value: m, versions });
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
        match write_one(&api, &ctx.metrics, &name, &m).await {
            Ok(after) => {
                tracing::debug!(node = %name, connected = ?m.connected, replicas = ?m.replicas_summary, "mirrored node connection");
                let versions = std::iter::once(n.metadata.resource_version.clone()).chain(after).collect();
                state.nodes.insert(uid(&n.metadata), Written { value: m, versions });
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

/// Writes the mirror's fields `m` of object `name`: a server-side apply,
/// then, only when the object still holds a mirror field the apply left out
/// (set by another field manager: [`mirror::leftovers`]), a merge patch
/// that removes it ([`mirror::removal`]). Server-side apply cannot remove a
/// field another manager owns, and a merge patch of every field would make
/// the operator's fields an `Update` manager's instead of its apply's; so
/// the apply stays the one write of the steady state, and the removal is a
/// second write only after someone else wrote. Returns the object's
/// resourceVersion after each request (`None` when it is gone).
async fn write_one<K, M>(api: &Api<K>, metrics: &Metrics, name: &str, m: &M) -> Result<Vec<Option<String>>, Error>
where
    K: kube::Resource<DynamicType = ()>
        + HasStatus<Status = M::Status>
        + HasStatusKind
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    M: Mirrored,
{
    let version = |o: &Option<K>| o.as_ref().and_then(|o| o.meta().resource_version.clone());
    let Some(after) = apply_status(api, metrics, Writer::Mirror, name, &m.to_status()).await? else {
        return Ok(vec![None]);
    };
    let leftovers = mirror::leftovers(after.status(), m);
    let applied = after.meta().resource_version.clone();
    if leftovers.is_empty() {
        return Ok(vec![applied]);
    }
    tracing::info!(name, fields = ?leftovers.fields, conditions = ?leftovers.conditions, "removing status fields another field manager set");
    let object = serde_json::to_value(&after).unwrap_or_default();
    let removed = merge_status(api, metrics, Writer::Mirror, name, &mirror::removal(&object, &leftovers)).await?;
    Ok(vec![applied, version(&removed)])
}

/// Logs which replicas stopped or started answering (only changes).
fn log_answers(edge: &EdgeView, state: &mut MirrorState) {
    let silent: BTreeSet<String> =
        edge.replicas.iter().filter(|(_, answer)| answer.is_none()).map(|(id, _)| id.clone()).collect();
    for id in silent.difference(&state.silent) {
        // Expected for a moment while a replica starts or stops (rolling update): not a warning.
        tracing::info!(replica = %id, "an Edge replica's admin API does not answer (or its pod has no IP yet); it counts as seeing nothing");
    }
    for id in state.silent.difference(&silent).filter(|id| edge.replicas.contains_key(*id)) {
        tracing::info!(replica = %id, "an Edge replica's admin API answers again");
    }
    state.silent = silent;
    let none = edge.answered().next().is_none();
    if none && !state.none_answered {
        tracing::warn!(replicas = edge.replicas.len(), "no Edge replica answers; status mirroring paused");
    } else if !none && state.none_answered {
        tracing::info!("an Edge replica answers again; status mirroring resumed");
    }
    state.none_answered = none;
}

/// Polls and writes until `cancel`.
pub async fn run(
    ctx: Arc<Context>,
    stores: Stores,
    admin: AdminClient,
    config: MirrorConfig,
    cancel: CancellationToken,
) {
    // `WorkspacesReady` is judged from the NodeCatalogs and the templates
    // together: a round before both have listed would judge a workspace
    // without its template.
    let listed = async {
        let _ = tokio::join!(
            stores.providers.wait_until_ready(),
            stores.nodes.wait_until_ready(),
            stores.templates.wait_until_ready()
        );
    };
    tokio::select! {
        _ = cancel.cancelled() => return,
        _ = listed => {}
    }
    let mut interval = tokio::time::interval(config.interval);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut state = MirrorState::default();
    let admin_port = ctx.settings.listen.admin.port();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = interval.tick() => {}
        }
        let replicas = crate::replicas::replicas(stores.pods.state().iter().map(|p| p.as_ref()));
        if replicas.is_empty() {
            tracing::debug!("no Edge pod: nothing to mirror");
            continue;
        }
        let edge = poll_all(&admin, &replicas, admin_port, &ctx.metrics).await;
        log_answers(&edge, &mut state);
        if state.none_answered {
            continue;
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
