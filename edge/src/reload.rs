//! Config reload. The Edge re-reads its config file when its content or the
//! content of the TLS files it names changes (polled: a Kubernetes ConfigMap
//! or Secret mount swaps a symlink, which content polling follows without
//! inotify corner cases; SIGHUP reloads at once). A renewed server
//! certificate is therefore picked up without a restart.
//! The keys file (`auth.keys_file`) and the credential files
//! (`credentials[].file`) are watched the same way, so a key is added or
//! revoked, or a credential rotated, without a restart. A running job
//! whose caller a reload revokes (key disabled or removed, workspace grant
//! or workspace removed) ends at that reload (`crate::job::standing`).
//! A new config is fully validated, TLS and keys files included, before anything
//! changes; an invalid one keeps the old config and is reported on
//! `/admin/v1/config` and `iop_edge_config_reloads_total{result="rejected"}`.
//!
//! Applying a config swaps it atomically for new requests (in-flight ones
//! keep theirs), replaces the node accept rules, resizes admission, and
//! closes the sessions of nodes that were removed or whose providers changed
//! (their generation is fenced; a still-listed node reconnects and receives
//! its new providers at registration). A node that is no longer admitted
//! (removed from `nodes`, or the trust domain changed) also loses its open
//! connections, and its next handshake is refused (`unknown_node`).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use iop_proto::config::EdgeConfig;
use iop_proto::pb;

use crate::config::Secrets;
use crate::credentials::Credentials;
use crate::metrics::RecoveryLabels;
use crate::node::registry::CloseReason;
use crate::node::session::config_payload;
use crate::node::tls::{AcceptPolicy, PolicyRules, TlsSetupError, server_config};
use crate::state::EdgeState;

/// Who may connect to the node listener under `config`: its TLS files, and
/// the identities it admits, both in the server config's verifier (the
/// handshake) and for the connections a reload keeps open.
pub fn rules(config: &EdgeConfig) -> Result<PolicyRules, TlsSetupError> {
    let allowed_nodes: BTreeSet<String> = config.nodes.iter().map(|n| n.name.clone()).collect();
    let files = &config.tls;
    let tls = server_config(&files.ca_file, &files.cert_file, &files.key_file, &config.trust_domain, &allowed_nodes)?;
    Ok(PolicyRules { tls, trust_domain: config.trust_domain.clone(), allowed_nodes })
}

/// A config loaded and validated completely, with the TLS and keys files it
/// names.
pub struct Loaded {
    pub config: EdgeConfig,
    pub rules: PolicyRules,
    pub secrets: Secrets,
}

fn load(path: &std::path::Path) -> Result<Loaded, String> {
    let config = crate::config::load(path).map_err(|e| e.to_string())?;
    let rules = rules(&config).map_err(|e| e.to_string())?;
    let secrets = Secrets::load(&config)?;
    Ok(Loaded { config, rules, secrets })
}

/// Nodes whose sessions must close when `previous` becomes `next`. A
/// change of capacities alone does not close them ([`capacity_changes`]).
pub fn nodes_to_close(previous: &EdgeConfig, next: &EdgeConfig) -> Vec<String> {
    let without_capacities = |config, name| {
        let mut payload = config_payload(config, name);
        payload.providers.iter_mut().for_each(|p| p.capacity = 0);
        payload
    };
    previous
        .nodes
        .iter()
        .map(|n| n.name.as_str())
        .filter(|name| {
            !next.nodes.iter().any(|n| n.name == *name)
                || without_capacities(previous, name) != without_capacities(next, name)
                || previous.trust_domain != next.trust_domain
        })
        .map(str::to_string)
        .collect()
}

/// Nodes kept by a reload (not in `closed`, [`nodes_to_close`]) whose
/// providers' capacities changed, with the new capacities of all their
/// providers (the node enforces them across its sessions,
/// `ProviderAssignment.capacity`).
pub fn capacity_changes(
    previous: &EdgeConfig,
    next: &EdgeConfig,
    closed: &[String],
) -> Vec<(String, pb::ProviderCapacities)> {
    let capacities = |config, name| -> std::collections::HashMap<String, u32> {
        config_payload(config, name).providers.into_iter().map(|p| (p.provider_id, p.capacity)).collect()
    };
    next.nodes
        .iter()
        .map(|n| n.name.as_str())
        .filter(|name| previous.nodes.iter().any(|n| n.name == *name) && !closed.iter().any(|c| c == name))
        .filter_map(|name| {
            let capacity = capacities(next, name);
            (capacity != capacities(previous, name)).then(|| (name.to_string(), pb::ProviderCapacities { capacity }))
        })
        .collect()
}

pub fn apply(state: &Arc<EdgeState>, policy: &AcceptPolicy, Loaded { config: next, rules, secrets }: Loaded) {
    // Also removes the node certificate expiry series of the nodes removed.
    policy.replace(rules, &state.metrics);
    state.routing.admission.reconfigure(&next);
    let before = state.config.current();
    if next.auth.mode != before.auth.mode || next.auth.anonymous_workspaces != before.auth.anonymous_workspaces {
        crate::auth::log_mode(&next.auth);
    }
    let previous = state.config.swap(next, secrets);
    let current = state.config.current();
    let closed = nodes_to_close(&previous, &current);
    for node in &closed {
        state.registry.close(node, CloseReason::ConfigChanged);
    }
    // Then the connections of the nodes no longer admitted: a node that kept
    // its connection open could otherwise register again on it.
    for node in policy.cut_off() {
        tracing::warn!(%node, "the config no longer admits this node; its connections are closed");
    }
    for (node, capacities) in capacity_changes(&previous, &current, &closed) {
        if let Some(control) = state.registry.control_in_any_phase(&node) {
            crate::node::session::send_now(&control, pb::edge_to_node::Msg::Capacities(capacities));
        }
    }
    state.warn_if_unlisted(&current);
    let replicas = state.replica_set(&current);
    if replicas != state.replica_set(&previous) {
        tracing::info!(replicas = replicas.len(), "the replica set changed; telling every node");
        for control in state.registry.controls() {
            let update = pb::ReplicaSet { replicas: replicas.clone() };
            crate::node::session::send_now(&control, pb::edge_to_node::Msg::ReplicaSet(update));
        }
    }
    state.record_config_revision();
    crate::node::tls::record_server_certificate(&state.metrics, &current.tls.cert_file);
    state.metrics.config_reloads.get_or_create(&RecoveryLabels { result: "applied" }).inc();
    tracing::info!(revision = state.config.status().revision, "config reloaded");
}

/// The bytes whose change triggers a reload: the config file and the TLS,
/// keys and credential files of the config currently loaded. (Held only
/// for the comparison; the digest of secrets would do, but the TLS files
/// were compared whole before and are small.)
fn fingerprint(path: &std::path::Path, config: &EdgeConfig) -> Option<Vec<u8>> {
    let mut bytes = std::fs::read(path).ok()?;
    let keys = config.auth.keys_file.as_ref();
    let files = [&config.tls.ca_file, &config.tls.cert_file, &config.tls.key_file].into_iter().chain(keys);
    for file in files.chain(Credentials::files(config)) {
        bytes.extend(std::fs::read(file).unwrap_or_default());
        bytes.push(0);
    }
    Some(bytes)
}

pub async fn watch(state: Arc<EdgeState>, policy: Arc<AcceptPolicy>, path: PathBuf, interval: Duration) {
    let mut last = fingerprint(&path, &state.config.current());
    // A rejected config is tried again every interval: a file it names may
    // appear later (the kubelet updates each mounted Secret on its own
    // schedule). Only a new reason is logged and counted.
    let mut rejected: Option<String> = None;
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        let forced = tokio::select! {
            _ = tokio::time::sleep(interval) => false,
            Some(_) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
        };
        #[cfg(not(unix))]
        let forced = {
            tokio::time::sleep(interval).await;
            false
        };
        let Some(content) = fingerprint(&path, &state.config.current()) else {
            state.config.reject(format!("cannot read config file {}", path.display()));
            continue;
        };
        if !forced && rejected.is_none() && last.as_deref() == Some(content.as_slice()) {
            continue;
        }
        last = Some(content);
        match load(&path) {
            Ok(loaded) => {
                rejected = None;
                apply(&state, &policy, loaded);
            }
            Err(error) if rejected.as_ref() == Some(&error) => {}
            Err(error) => {
                tracing::warn!(%error, "config reload rejected; keeping the previous config");
                state.config.reject(error.clone());
                state.metrics.config_reloads.get_or_create(&RecoveryLabels { result: "rejected" }).inc();
                rejected = Some(error);
            }
        }
    }
}

#[cfg(test)]
mod tests;
