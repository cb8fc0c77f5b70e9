//! One reconcile of a namespace, in stages:
//!
//! 1. finalizers: every live NodeCatalog gets [`NODE_FINALIZER`], so its
//!    deletion waits until its identity has left the Edge config;
//! 2. read the Secrets Providers' `credentialSecretRef`s name and the
//!    operator's `iop-edge-credentials`, then build (pure,
//!    [`crate::reconcile::build`]) -> [`Prepared`];
//! 3. apply `iop-edge-credentials`, then the ConfigMap that names its files
//!    (server-side apply, `iop-operator/config`, force) -> [`Applied`];
//! 4. status from what was applied: conditions and `observedGeneration`
//!    (`iop-operator/config`), only for objects where they changed;
//! 5. deleted NodeCatalogs: the config just applied no longer has them, so
//!    their finalizer is removed;
//! 6. certificates ([`super::pki`]).
//!
//! `Prepared` and `Applied` are destructured without `..`: a new part of
//! either does not compile until it is written.

use std::fmt::Debug;
use std::time::Duration;

use iop_proto::config::EdgeConfig;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use time::OffsetDateTime;

use super::controller::{Kind, Read, Undecodable};
use super::metrics::{HasStatusKind, Metrics, WriteResult, Writer};
use super::{Context, Error, is_status, pki, timestamp};
use crate::crd::{
    NodeCatalog, NodeCatalogStatus, Provider, ProviderStatus, WorkspaceTemplate, WorkspaceTemplateStatus,
};
use crate::reconcile::conditions::same_reconcile_conditions;
use crate::reconcile::{self, CONFIG_MAP_NAME, FIELD_MANAGER_CONFIG, Prepared, StatusUpdate, credentials, unchanged};

/// Held by every live NodeCatalog; removed once its identity is out of the
/// Edge config.
pub const NODE_FINALIZER: &str = "iop.dev/node-identity";

/// Bound of one whole reconcile.
pub const RECONCILE_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound of one status write (any writer).
pub const STATUS_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What was written in stage 3, and the status computed with it.
#[derive(Debug)]
pub struct Applied {
    /// The config the ConfigMap now holds.
    pub config: EdgeConfig,
    pub providers: Vec<StatusUpdate<ProviderStatus>>,
    pub nodes: Vec<StatusUpdate<NodeCatalogStatus>>,
    pub templates: Vec<StatusUpdate<WorkspaceTemplateStatus>>,
}

/// [`reconcile`] at the context's `now`, bounded by [`RECONCILE_TIMEOUT`],
/// counted and timed.
pub async fn reconcile_with_timeout(ctx: &Context, read: Read) -> Result<(), Error> {
    let now = ctx.clock.now();
    let started = tokio::time::Instant::now();
    let result = tokio::time::timeout(RECONCILE_TIMEOUT, reconcile(ctx, read, now))
        .await
        .unwrap_or(Err(Error::Timeout(RECONCILE_TIMEOUT)));
    ctx.metrics.reconciled(&result, started.elapsed());
    result
}

pub async fn reconcile(ctx: &Context, read: Read, now: OffsetDateTime) -> Result<(), Error> {
    let Read { mut snapshot, undecodable } = read;
    let nodes: Api<NodeCatalog> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    if snapshot.namespace_terminating {
        return release_every_finalizer(&nodes, node_metas(&snapshot.nodes, &undecodable)).await;
    }

    for n in snapshot.nodes.iter().filter(|n| n.metadata.deletion_timestamp.is_none()) {
        if !has_finalizer(&n.metadata) {
            let mut finalizers = n.finalizers().to_vec();
            finalizers.push(NODE_FINALIZER.to_string());
            set_finalizers(&nodes, &n.metadata, finalizers).await?;
        }
    }

    read_credential_secrets(ctx, &mut snapshot).await?;
    let prepared = reconcile::build(&snapshot, &ctx.settings, timestamp(now))?;
    let applied = apply(ctx, prepared, &snapshot).await?;

    let status = write_status(ctx, &snapshot, &applied).await;

    release_finalizers(&nodes, &snapshot.nodes, &undecodable, &applied.config).await?;

    let certs = pki::reconcile(ctx, &snapshot.nodes, &applied.config, now).await;
    status.and(certs)
}

/// Reads what the build stage needs besides the IOP objects: each Secret a
/// Provider's `credentialSecretRef` names (a missing one is left out: the
/// build reports it on the Provider) and the operator's own credentials
/// Secret. A referenced Secret's metadata is read first; its data only when
/// it carries the label `iop.dev/credential: "true"` (one without it is
/// kept as metadata only, for the build to say so): the operator never
/// holds the value of a Secret not meant for it. A change to a labelled
/// Secret reconciles by itself ([`super::controller::secret_signals`]).
async fn read_credential_secrets(ctx: &Context, snapshot: &mut reconcile::Snapshot) -> Result<(), Error> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let names: std::collections::BTreeSet<&str> =
        snapshot.providers.iter().filter_map(|p| p.spec.credential_secret()).collect();
    let mut secrets = std::collections::BTreeMap::new();
    for name in names {
        let Some(meta) = api.get_metadata_opt(name).await? else { continue };
        let secret = if credentials::labelled(&meta.metadata) {
            match api.get_opt(name).await? {
                Some(secret) => secret,
                None => continue,
            }
        } else {
            Secret { metadata: meta.metadata, ..Default::default() }
        };
        secrets.insert(name.to_string(), secret);
    }
    snapshot.secrets = secrets;
    snapshot.edge_credentials = api.get_opt(credentials::EDGE_CREDENTIALS_SECRET).await?;
    Ok(())
}

/// Stage 3: writes the credentials Secret, then the ConfigMap; each only
/// when the one `current` holds differs ([`unchanged`]), so a restart, a
/// new leader or a resync with nothing to change sends no write.
pub async fn apply(ctx: &Context, prepared: Prepared, current: &reconcile::Snapshot) -> Result<Applied, Error> {
    let Prepared { config, config_map, providers, nodes, templates, credentials, excluded } = prepared;
    for e in &excluded {
        tracing::debug!(kind = e.kind, name = %e.name, reason = e.reason.as_str(), message = %e.message, "left out of the Edge config");
    }
    // First: the config about to be applied names its files.
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let params = PatchParams::apply(FIELD_MANAGER_CONFIG).force();
    if !unchanged::secret_holds(current.edge_credentials.as_ref(), &credentials, FIELD_MANAGER_CONFIG) {
        secrets.patch(credentials::EDGE_CREDENTIALS_SECRET, &params, &Patch::Apply(&credentials)).await?;
    }
    if unchanged::config_map_holds(current.edge_config_map.as_ref(), &config_map) {
        tracing::debug!(nodes = config.nodes.len(), providers = config.providers.len(), "the Edge config is unchanged");
    } else {
        let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
        api.patch(CONFIG_MAP_NAME, &params, &Patch::Apply(&config_map)).await?;
        tracing::debug!(nodes = config.nodes.len(), providers = config.providers.len(), "applied the Edge config");
    }
    Ok(Applied { config, providers, nodes, templates })
}

/// Stage 4: conditions and `observedGeneration`, written where they differ
/// from the object's current status. Every write is tried; the first error
/// is returned.
async fn write_status(ctx: &Context, snapshot: &reconcile::Snapshot, applied: &Applied) -> Result<(), Error> {
    let Applied { config: _, providers, nodes, templates } = applied;
    let client = &ctx.client;
    let mut result = Ok(());
    let mut record = |r: Result<(), Error>| {
        if result.is_ok() {
            result = r;
        }
    };

    let api: Api<Provider> = Api::namespaced(client.clone(), &ctx.namespace);
    for u in providers {
        let current = snapshot.providers.iter().find(|p| p.name_any() == u.name);
        let status = current.and_then(|p| p.status.as_ref());
        let unchanged = owned_unchanged(
            status.map(|s| (&s.conditions[..], s.observed_generation)),
            &u.status.conditions,
            u.status.observed_generation,
        ) && status.and_then(|s| s.public_models.as_ref()) == u.status.public_models.as_ref();
        record(write_if_changed(&api, &ctx.metrics, current.map(|p| &p.metadata), &u.name, unchanged, &u.status).await);
    }
    let api: Api<NodeCatalog> = Api::namespaced(client.clone(), &ctx.namespace);
    for u in nodes {
        let current = snapshot.nodes.iter().find(|n| n.name_any() == u.name);
        let status = current.and_then(|n| n.status.as_ref());
        let unchanged = owned_unchanged(
            status.map(|s| (&s.conditions[..], s.observed_generation)),
            &u.status.conditions,
            u.status.observed_generation,
        );
        record(write_if_changed(&api, &ctx.metrics, current.map(|n| &n.metadata), &u.name, unchanged, &u.status).await);
    }
    let api: Api<WorkspaceTemplate> = Api::namespaced(client.clone(), &ctx.namespace);
    for u in templates {
        let current = snapshot.templates.iter().find(|t| t.name_any() == u.name);
        let status = current.and_then(|t| t.status.as_ref());
        let unchanged = owned_unchanged(
            status.map(|s| (&s.conditions[..], s.observed_generation)),
            &u.status.conditions,
            u.status.observed_generation,
        );
        record(write_if_changed(&api, &ctx.metrics, current.map(|t| &t.metadata), &u.name, unchanged, &u.status).await);
    }
    result
}

/// Whether the conditions and `observedGeneration` reconcile owns already
/// hold what it would write (other writers' conditions are not compared).
fn owned_unchanged(
    current: Option<(&[Condition], Option<i64>)>,
    conditions: &[Condition],
    generation: Option<i64>,
) -> bool {
    let (current_conditions, current_generation) = current.unwrap_or((&[], None));
    current_generation == generation && same_reconcile_conditions(current_conditions, conditions)
}

async fn write_if_changed<K>(
    api: &Api<K>,
    metrics: &Metrics,
    meta: Option<&ObjectMeta>,
    name: &str,
    unchanged: bool,
    status: &impl Serialize,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + HasStatusKind + Clone + DeserializeOwned + Debug,
{
    // Gone or going: nothing to tell.
    if meta.is_none_or(|m| m.deletion_timestamp.is_some()) || unchanged {
        return Ok(());
    }
    apply_status(api, metrics, Writer::Reconcile, name, status).await.map(|_| ())
}

/// Server-side apply of `status` (only the fields given) on the status
/// subresource, with `writer`'s field manager, bounded by
/// [`STATUS_WRITE_TIMEOUT`] and counted in `iop_operator_status_writes_total`
/// (`ok`, `failed`, `timeout`). A missing object is not an error (it was
/// deleted meanwhile). Callers decide that the fields changed; this writes.
/// Returns the object after the write (`None` when gone).
pub async fn apply_status<K>(
    api: &Api<K>,
    metrics: &Metrics,
    writer: Writer,
    name: &str,
    status: &impl Serialize,
) -> Result<Option<K>, Error>
where
    K: Resource<DynamicType = ()> + HasStatusKind + Clone + DeserializeOwned + Debug,
{
    let body = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": { "name": name },
        "status": status,
    });
    let params = PatchParams::apply(writer.field_manager()).force();
    counted_status_write(api, metrics, writer, name, &params, &Patch::Apply(&body)).await
}

/// A JSON merge patch of the status subresource with `writer`'s field
/// manager (the status mirror's removal of fields another manager set:
/// [`crate::mirror::removal`]), bounded and counted like [`apply_status`].
pub async fn merge_status<K>(
    api: &Api<K>,
    metrics: &Metrics,
    writer: Writer,
    name: &str,
    patch: &serde_json::Value,
) -> Result<Option<K>, Error>
where
    K: Resource<DynamicType = ()> + HasStatusKind + Clone + DeserializeOwned + Debug,
{
    let params = PatchParams { field_manager: Some(writer.field_manager().to_string()), ..Default::default() };
    counted_status_write(api, metrics, writer, name, &params, &Patch::Merge(patch)).await
}

async fn counted_status_write<K>(
    api: &Api<K>,
    metrics: &Metrics,
    writer: Writer,
    name: &str,
    params: &PatchParams,
    patch: &Patch<impl Serialize + Debug>,
) -> Result<Option<K>, Error>
where
    K: Resource<DynamicType = ()> + HasStatusKind + Clone + DeserializeOwned + Debug,
{
    let pending = metrics.status_write(K::STATUS_KIND, writer);
    let write = async {
        match api.patch_status(name, params, patch).await {
            Ok(object) => Ok(Some(object)),
            Err(e) if is_status(&e, 404) => Ok(None),
            Err(e) => Err(e.into()),
        }
    };
    let result =
        tokio::time::timeout(STATUS_WRITE_TIMEOUT, write).await.unwrap_or(Err(Error::Timeout(STATUS_WRITE_TIMEOUT)));
    pending.finish(match &result {
        Ok(_) => WriteResult::Ok,
        Err(Error::Timeout(_)) => WriteResult::Timeout,
        Err(_) => WriteResult::Failed,
    });
    result
}

fn has_finalizer(meta: &ObjectMeta) -> bool {
    meta.finalizers.as_ref().is_some_and(|f| f.iter().any(|f| f == NODE_FINALIZER))
}

/// Sets `metadata.finalizers` with a merge patch that carries the
/// resourceVersion read: someone else's change in between makes it fail
/// (409) instead of dropping their finalizer. A missing object is fine.
async fn set_finalizers(api: &Api<NodeCatalog>, meta: &ObjectMeta, finalizers: Vec<String>) -> Result<(), Error> {
    let name = meta.name.as_deref().unwrap_or_default();
    let patch = json!({ "metadata": { "resourceVersion": meta.resource_version, "finalizers": finalizers } });
    let params = PatchParams { field_manager: Some(FIELD_MANAGER_CONFIG.to_string()), ..Default::default() };
    match api.patch(name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 404) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The namespace is being deleted: Kubernetes deletes its Pods first (the
/// operator's and the Edge's) and its NodeCatalogs only once they are gone,
/// so an operator waiting for each NodeCatalog's deletion would never see
/// it and the namespace would never finish. With the Edge going too there
/// is no config to take the node out of: every NodeCatalog loses the
/// finalizer now (deleted or not yet). Called by the reconcile (the
/// namespace watch) and at shutdown ([`super::release_if_terminating`]), whichever
/// comes first.
pub async fn release_every_finalizer(
    api: &Api<NodeCatalog>,
    nodes: impl Iterator<Item = &ObjectMeta>,
) -> Result<(), Error> {
    for meta in nodes.filter(|m| has_finalizer(m)) {
        drop_finalizer(api, meta).await?;
        tracing::info!(node = meta.name.as_deref().unwrap_or_default(), "namespace terminating: finalizer released");
    }
    Ok(())
}

/// Every NodeCatalog's metadata, undecodable ones included.
fn node_metas<'a>(nodes: &'a [NodeCatalog], undecodable: &'a [Undecodable]) -> impl Iterator<Item = &'a ObjectMeta> {
    let undecodable = undecodable.iter().filter(|u| u.kind == Kind::NodeCatalog).map(|u| &u.metadata);
    nodes.iter().map(|n| &n.metadata).chain(undecodable)
}

/// Removes [`NODE_FINALIZER`] from the NodeCatalog `meta`, keeping the others.
async fn drop_finalizer(api: &Api<NodeCatalog>, meta: &ObjectMeta) -> Result<(), Error> {
    let rest = meta.finalizers.iter().flatten().filter(|f| *f != NODE_FINALIZER).cloned().collect();
    set_finalizers(api, meta, rest).await
}

/// Stage 5: NodeCatalogs being deleted whose identity is not in the applied
/// config lose the finalizer (undecodable ones too: they never were in it).
async fn release_finalizers(
    api: &Api<NodeCatalog>,
    nodes: &[NodeCatalog],
    undecodable: &[Undecodable],
    applied: &EdgeConfig,
) -> Result<(), Error> {
    let deleting = node_metas(nodes, undecodable).filter(|m| m.deletion_timestamp.is_some() && has_finalizer(m));
    for meta in deleting {
        let name = meta.name.as_deref().unwrap_or_default();
        if applied.nodes.iter().any(|n| n.name == name) {
            continue;
        }
        drop_finalizer(api, meta).await?;
        tracing::info!(node = name, "node identity removed from the Edge config; finalizer released");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
