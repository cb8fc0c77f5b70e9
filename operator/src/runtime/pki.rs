//! Certificates, the I/O half: the CA Secret (loaded, or created when absent
//! with create-then-reload-on-conflict: an existing CA, the user's included,
//! is never replaced), the Edge server certificate Secret and one Secret per
//! NodeCatalog (server-side apply, `iop-operator/certs`), and each
//! NodeCatalog's `status.certificate` and `CAExpiring` condition. Whether
//! to issue and what to write are decided by the pure functions in
//! [`crate::certs::secrets`] and [`crate::certs::status`]. Keys never reach
//! a log.

use iop_proto::config::EdgeConfig;
use iop_proto::identity::NodeIdentity;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use time::OffsetDateTime;

use super::metrics::{CertKind, Metrics, Writer};
use super::namespace::apply_status;
use super::{Context, Error, is_status, timestamp};
use crate::certs::rotation;
use crate::certs::secrets::{self, CA_VALIDITY, EDGE_RENEW_BEFORE, EDGE_VALIDITY, Reissue};
use crate::certs::status::{self, CaExpiry};
use crate::certs::{
    Authority, CA_SECRET, Ca, CertifiedKey, EDGE_CERT_KEY, EDGE_KEY_KEY, EDGE_TLS_SECRET, NODE_CERT_KEY, NODE_KEY_KEY,
    inspect, node_secret_name,
};
use crate::crd::NodeCatalog;
use crate::crd::node_catalog::CertificateStatus;
use crate::reconcile::FIELD_MANAGER_CERTS;

/// The CA, the Edge certificate, and the certificate of every NodeCatalog
/// in the applied config. Each node is tried; the first error is returned.
///
/// A CA that expires within the longest renewal window (the Edge's 30 days,
/// or a node's `renewBeforeHours`) is reported, never replaced: the
/// `CAExpiring` condition of each node and `iop_operator_ca_expiring`.
pub async fn reconcile(
    ctx: &Context,
    nodes: &[NodeCatalog],
    applied: &EdgeConfig,
    now: OffsetDateTime,
) -> Result<(), Error> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let metrics = &ctx.metrics;
    let authority = ensure_ca(&secrets, &ctx.namespace, metrics, now).await?;
    let ca = &authority.signer;
    let in_config = || applied.nodes.iter().filter_map(|entry| nodes.iter().find(|n| n.name_any() == entry.name));
    let window = in_config().map(|n| n.spec.certificate.renewal().renew_before).fold(EDGE_RENEW_BEFORE, std::cmp::max);
    let expiry = CaExpiry { not_after: ca.not_after(), window };
    if metrics.set_ca(expiry.not_after, expiry.expiring(now)) && expiry.expiring(now) {
        tracing::warn!(
            secret = CA_SECRET,
            not_after = %expiry.not_after,
            "the CA expires within the renewal window: certificates end with it; replace the CA"
        );
    }
    ensure_edge_tls(&secrets, &ctx.namespace, &authority, &ctx.edge_server_names, metrics, now).await?;

    let api: Api<NodeCatalog> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let mut result = Ok(());
    for node in in_config() {
        let name = node.name_any();
        let outcome = async {
            let outcome =
                ensure_node_cert(&secrets, &ctx.namespace, &authority, node, &ctx.settings.trust_domain, metrics, now)
                    .await?;
            let current = node.status.as_ref();
            let update = match outcome {
                NodeCert::Current(cert) => status::node_update(current, cert, &expiry, now, timestamp(now)),
                NodeCert::NotOurs => {
                    let secret = node_secret_name(&name);
                    let update = status::node_refused(current, &secret, &expiry, now, timestamp(now));
                    if update.is_some() {
                        tracing::warn!(node = %name, %secret, "the node's Secret was not created by the operator; it is not overwritten");
                    }
                    update
                }
            };
            if let Some(update) = update {
                apply_status(&api, metrics, Writer::Certs, &name, &update).await?;
            }
            Ok::<_, Error>(())
        }
        .await;
        if let Err(e) = outcome {
            tracing::warn!(node = %name, error = %e, "node certificate not written");
            if result.is_ok() {
                result = Err(e);
            }
        }
    }
    result
}

/// Loads the CA (and the one it replaces, during a rotation) from `iop-ca`,
/// or generates one and creates the Secret. When the create loses a race
/// (409), the winner's CA is loaded instead.
///
/// A CA is generated at the first install only: when `iop-ca` is missing
/// but `iop-edge-tls` exists, someone deleted it (to replace it, or by
/// mistake), and a CA made now would cut off every node and win the race
/// against the user's own `kubectl create` ([`Error::CaMissing`]).
pub async fn ensure_ca(
    secrets: &Api<Secret>,
    namespace: &str,
    metrics: &Metrics,
    now: OffsetDateTime,
) -> Result<Authority, Error> {
    if let Some(existing) = secrets.get_opt(CA_SECRET).await? {
        return Ok(secrets::load_authority(&existing, now)?);
    }
    if secrets.get_opt(EDGE_TLS_SECRET).await?.is_some() {
        return Err(Error::CaMissing);
    }
    let ca = Ca::generate(&secrets::ca_common_name(now), now, CA_VALIDITY)?;
    let params = PostParams { field_manager: Some(FIELD_MANAGER_CERTS.to_string()), ..Default::default() };
    match secrets.create(&params, &secrets::ca_secret(namespace, &ca)).await {
        Ok(_) => {
            metrics.issued(CertKind::Ca);
            tracing::info!(secret = CA_SECRET, not_after = %ca.not_after(), "created a new CA");
            Ok(Authority::single(ca))
        }
        Err(e) if is_status(&e, 409) => {
            let existing = secrets.get(CA_SECRET).await?;
            Ok(secrets::load_authority(&existing, now)?)
        }
        Err(e) => Err(e.into()),
    }
}

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER_CERTS).force()
}

/// Issues `iop-edge-tls` when it is missing, for other names, from another
/// CA, or due for rotation; writes it again around the same certificate
/// when only the trust bundle or the served chain changed.
pub async fn ensure_edge_tls(
    secrets: &Api<Secret>,
    namespace: &str,
    authority: &Authority,
    names: &[String],
    metrics: &Metrics,
    now: OffsetDateTime,
) -> Result<(), Error> {
    let existing = secrets.get_opt(EDGE_TLS_SECRET).await?;
    let Some(reason) = secrets::edge_reissue(existing.as_ref(), authority, names, now) else { return Ok(()) };
    let stored = existing.as_ref().and_then(|s| secrets::stored_cert(s, EDGE_CERT_KEY, EDGE_KEY_KEY));
    let edge = match (reason, stored) {
        (Reissue::Trust, Some(stored)) => stored,
        _ => authority.signer.edge_server_cert(names, now, EDGE_VALIDITY)?,
    };
    let secret = secrets::edge_tls_secret(namespace, authority, &edge);
    secrets.patch(EDGE_TLS_SECRET, &apply_params(), &Patch::Apply(&secret)).await?;
    if reason != Reissue::Trust {
        metrics.issued(CertKind::Edge);
    }
    let info = inspect(&edge.cert_pem)?;
    tracing::info!(
        secret = EDGE_TLS_SECRET,
        reason = reason.as_str(),
        serial = %info.serial,
        not_after = %info.not_after,
        "wrote the Edge server certificate"
    );
    Ok(())
}

/// What `iop-operator node-bundle NAME --namespace NS` reads: the CA,
/// certificate and key in Secret `iop-node-NAME`.
pub async fn read_node_secret(
    client: kube::Client,
    namespace: &str,
    node: &str,
) -> Result<(String, String, crate::certs::PrivateKeyPem), String> {
    let name = node_secret_name(node);
    let secrets: Api<Secret> = Api::namespaced(client, namespace);
    match secrets.get_opt(&name).await {
        Ok(Some(secret)) => secrets::node_parts(&secret)
            .ok_or_else(|| format!("Secret {namespace}/{name} lacks ca.pem, node.pem or node-key.pem")),
        Ok(None) => Err(format!(
            "Secret {namespace}/{name} does not exist: is NodeCatalog `{node}` created, ready, and the operator running?"
        )),
        Err(e) => Err(format!("reading Secret {namespace}/{name}: {e}")),
    }
}

/// What [`ensure_node_cert`] found and did.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeCert {
    /// The Secret holds (now) this current certificate.
    Current(CertificateStatus),
    /// A Secret of that name exists that the operator did not make
    /// ([`secrets::node_secret_is_ours`]): left untouched.
    NotOurs,
}

/// Issues `iop-node-<name>` when needed and returns the serial and expiry of
/// the certificate the Secret holds afterwards. A Secret of that name the
/// operator did not make is never overwritten (nor adopted).
pub async fn ensure_node_cert(
    secrets: &Api<Secret>,
    namespace: &str,
    authority: &Authority,
    node: &NodeCatalog,
    trust_domain: &str,
    metrics: &Metrics,
    now: OffsetDateTime,
) -> Result<NodeCert, Error> {
    let name = node.name_any();
    let identity =
        NodeIdentity::new(trust_domain, &name).map_err(|e| crate::certs::CertError::InvalidName(e.to_string()))?;
    let renewal = node.spec.certificate.renewal();
    let secret_name = node_secret_name(&name);
    let existing = secrets.get_opt(&secret_name).await?;
    if existing.as_ref().is_some_and(|s| !secrets::node_secret_is_ours(s, &name)) {
        return Ok(NodeCert::NotOurs);
    }
    let cert_pem = match secrets::node_reissue(existing.as_ref(), authority, &identity, now, renewal) {
        None => existing.as_ref().and_then(|s| secrets::value(s, NODE_CERT_KEY)).unwrap_or_default(),
        Some(reason) => {
            let stored = existing.as_ref().and_then(|s| secrets::stored_cert(s, NODE_CERT_KEY, NODE_KEY_KEY));
            let issued: CertifiedKey = match (reason, stored) {
                (Reissue::Trust, Some(stored)) => stored,
                _ => authority.signer.node_client_cert(&identity, now, renewal.validity)?,
            };
            let secret = secrets::node_secret(namespace, node, authority, &issued);
            secrets.patch(&secret_name, &apply_params(), &Patch::Apply(&secret)).await?;
            if reason != Reissue::Trust {
                metrics.issued(CertKind::Node);
            }
            let info = inspect(&issued.cert_pem)?;
            tracing::info!(
                node = %name,
                secret = %secret_name,
                reason = reason.as_str(),
                serial = %info.serial,
                not_after = %info.not_after,
                "wrote a node certificate"
            );
            issued.cert_pem
        }
    };
    let info = inspect(&cert_pem)?;
    Ok(NodeCert::Current(CertificateStatus { serial: info.serial, not_after: Time(timestamp(info.not_after)) }))
}

/// The field manager of `iop-operator ca rotate` and `ca finish`.
const FIELD_MANAGER_CA: &str = "iop-operator/ca";

/// Replaces `iop-ca` with one guarded write (PUT with the resourceVersion
/// read): a change by anyone in between fails it (409) instead of being lost.
async fn replace_ca(secrets: &Api<Secret>, namespace: &str, secret: &Secret) -> Result<(), String> {
    let params = PostParams { field_manager: Some(FIELD_MANAGER_CA.to_string()), ..Default::default() };
    match secrets.replace(CA_SECRET, &params, secret).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 409) => {
            Err(format!("Secret {namespace}/{CA_SECRET} changed while this ran; nothing was written: run it again"))
        }
        Err(e) => Err(format!("writing Secret {namespace}/{CA_SECRET}: {e}")),
    }
}

async fn read_ca(secrets: &Api<Secret>, namespace: &str) -> Result<Secret, String> {
    match secrets.get_opt(CA_SECRET).await {
        Ok(Some(secret)) => Ok(secret),
        Ok(None) => Err(format!(
            "Secret {namespace}/{CA_SECRET} does not exist: there is no CA to rotate from (the operator creates one at \
             its first run; to start over with a new CA, create {CA_SECRET} with it: every node then needs a new bundle)"
        )),
        Err(e) => Err(format!("reading Secret {namespace}/{CA_SECRET}: {e}")),
    }
}

/// `iop-operator ca rotate`: `new` (or a generated CA) becomes the signer,
/// the current CA stays trusted until [`finish_rotation`]. Returns what was
/// done and what to do next.
pub async fn rotate_ca(
    client: kube::Client,
    namespace: &str,
    new: Option<Ca>,
    now: OffsetDateTime,
) -> Result<String, String> {
    let secrets: Api<Secret> = Api::namespaced(client, namespace);
    let current = read_ca(&secrets, namespace).await?;
    let new = match new {
        Some(ca) => ca,
        None => Ca::generate(&secrets::ca_common_name(now), now, CA_VALIDITY).map_err(|e| e.to_string())?,
    };
    let rotating = rotation::begin(&current, &new, now).map_err(|e| e.to_string())?;
    replace_ca(&secrets, namespace, &rotating).await?;
    Ok(format!(
        "Secret {namespace}/{CA_SECRET} now signs with the new CA (valid until {not_after}); the CA it replaces stays \
         trusted until `iop-operator ca finish -n {namespace}`.\n\
         The operator re-issues iop-edge-tls and every iop-node-<name> now; the Edge takes them up without a restart \
         once the kubelet has refreshed its volume (60-90 s). Nodes on their old bundles keep working.\n\
         Next: make each node a new bundle (iop-operator node-bundle NAME -n {namespace} ...) and restart iop-node on \
         its Mac; `kubectl -n {namespace} get nodecatalogs` shows BUNDLE-CURRENT True once it runs it. Then run \
         `iop-operator ca finish -n {namespace}`.",
        not_after = new.not_after(),
    ))
}

/// `iop-operator ca finish`: the retiring CA leaves `iop-ca`, and so every
/// trust bundle and the Edge's chain. Refused while a NodeCatalog's Mac does
/// not run a bundle of the new CA (it would be cut off), unless `force`.
pub async fn finish_rotation(
    client: kube::Client,
    namespace: &str,
    force: bool,
    now: OffsetDateTime,
) -> Result<String, String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let current = read_ca(&secrets, namespace).await?;
    let done = rotation::finish(&current, now).map_err(|e| e.to_string())?;
    let authority = secrets::load_authority(&current, now).map_err(|e| e.to_string())?;
    let nodes: Api<NodeCatalog> = Api::namespaced(client, namespace);
    let nodes = nodes.list(&Default::default()).await.map_err(|e| format!("listing NodeCatalogs: {e}"))?.items;
    let mut node_secrets = std::collections::BTreeMap::new();
    for node in &nodes {
        let name = node_secret_name(&node.name_any());
        if let Some(secret) = secrets.get_opt(&name).await.map_err(|e| format!("reading Secret {name}: {e}"))? {
            node_secrets.insert(node.name_any(), secret);
        }
    }
    let pending = rotation::pending(&authority.signer, &nodes, |name| node_secrets.get(name));
    if !pending.is_empty() && !force {
        let list: Vec<String> = pending.iter().map(|p| format!("  {}: {}", p.node, p.reason)).collect();
        return Err(format!(
            "not finished: {} node(s) do not run a bundle of the new CA yet and would be cut off:\n{}\n\
             Give each a new bundle (iop-operator node-bundle NAME -n {namespace} ...) and restart iop-node, or pass \
             --force to cut them off.",
            pending.len(),
            list.join("\n")
        ));
    }
    replace_ca(&secrets, namespace, &done).await?;
    Ok(format!(
        "Secret {namespace}/{CA_SECRET} no longer holds the retiring CA: the operator rewrites every trust bundle and \
         the Edge's chain now (same certificates); a bundle made before the rotation is refused from then on."
    ))
}
