//! Build stage (pure): from every object of a namespace and the operator's
//! settings to the desired Edge config ConfigMap and the status each object
//! should carry. Invalid objects are left out and reported; they never stop
//! the others from being rendered.

use std::collections::{BTreeMap, BTreeSet};

use iop_proto::config::{ConfigError, EdgeConfig, Limits, NodeEntry, WorkspaceEntry};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

pub use super::conditions::CONTEXT_FALLBACKS_READY;
use super::conditions::{self, READY, Status};
use super::credentials::CredentialProblem;
use super::validate::{self, ACCEPTED, Invalid, Reason};
use super::{CONFIG_KEY, CONFIG_MAP_NAME, Settings, Snapshot, credentials};
use crate::crd::provider::SecretKeyRef;
use crate::crd::{NodeCatalog, NodeCatalogStatus, ProviderStatus, WorkspaceTemplate, WorkspaceTemplateStatus};

/// Everything the apply stage writes for one namespace. Fields are public so
/// apply can destructure it without `..`, proving each part is written.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    /// The rendered config (also inside `config_map`).
    pub config: EdgeConfig,
    /// `iop-edge-config`, key `edge.yaml` (no owner references).
    pub config_map: ConfigMap,
    /// Status fields owned by reconcile (conditions, observedGeneration;
    /// a Provider's publicModels).
    pub providers: Vec<StatusUpdate<ProviderStatus>>,
    pub nodes: Vec<StatusUpdate<NodeCatalogStatus>>,
    pub templates: Vec<StatusUpdate<WorkspaceTemplateStatus>>,
    /// `iop-edge-credentials`: the managed credentials' values and revisions.
    pub credentials: Secret,
    /// Objects left out of the config, and why (for events and logs).
    pub excluded: Vec<Excluded>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StatusUpdate<S> {
    pub name: String,
    pub status: S,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Excluded {
    pub kind: &'static str,
    pub name: String,
    pub reason: Reason,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The operator's own settings do not make a valid Edge config.
    #[error("operator settings are invalid: {0}")]
    Settings(ConfigError),
    /// Objects that passed validation together still broke an Edge rule; the
    /// old config stays in place. A bug: validation must catch every rule.
    #[error("rendered Edge config is invalid: {0}")]
    Config(ConfigError),
}

/// Builds the desired state of `snapshot.namespace` at `now`.
///
/// Edge-wide queue limits: the Edge queues per public model, not per
/// provider, so `limits.queue_depth` and `limits.queue_timeout_ms` are the
/// maximum over valid Providers of each one's `spec.queue` value, where a
/// Provider that sets none counts with the operator default. With no valid
/// Provider they are the operator defaults. No provider gets less than it
/// asked for; a provider cannot lower the limit for the others.
///
/// `replicas` are the Edge pods' names ([`Snapshot::replicas`]), rendered
/// whenever pods are known, one included (see [`crate::replicas`]).
///
/// Context fallbacks are per public model, from the rendered Providers
/// together ([`validate::context_fallbacks`]); a Provider that sets one gets
/// a `ContextFallbacksReady` condition, and a bad fallback is left out
/// without taking the Provider out.
pub fn build(snapshot: &Snapshot, settings: &Settings, now: Timestamp) -> Result<Prepared, BuildError> {
    let mut config = settings.empty_config();
    config.validate().map_err(BuildError::Settings)?;
    config.replicas = snapshot.replicas.clone();
    let mut excluded = Vec::new();
    let mut exclude = |kind: &'static str, name: &str, e: &Invalid| {
        excluded.push(Excluded { kind, name: name.to_string(), reason: e.reason, message: e.message.clone() });
    };

    let Verdicts { templates: template_verdicts, nodes: node_verdicts } = verdicts(snapshot, settings);
    let mut templates = Vec::new();
    for (t, verdict) in template_verdicts {
        if let Err(e) = &verdict {
            exclude("WorkspaceTemplate", &t.name_any(), e);
        }
        let current = t.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
        let generation = t.metadata.generation;
        templates.push(StatusUpdate {
            name: t.name_any(),
            status: WorkspaceTemplateStatus {
                conditions: vec![ready(current, verdict.as_ref().err(), "accepted", generation, now)],
                observed_generation: generation,
            },
        });
    }

    // `WorkspacesReady` is the status mirror's (the node's verdicts decide
    // it): reconcile writes `Ready` only.
    let mut nodes = Vec::new();
    let mut node_ready = BTreeMap::new();
    for (n, verdict) in node_verdicts {
        // A node being deleted is "absent" to its providers, not "not ready".
        if !matches!(&verdict, Err(Invalid { reason: Reason::Deleting, .. })) {
            node_ready.insert(n.meta().name.as_deref().unwrap_or_default(), verdict.is_ok());
        }
        let current = n.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
        let generation = n.metadata.generation;
        let condition = match verdict {
            Ok(rendered) => {
                config.nodes.push(rendered.entry);
                config.workspaces.extend(rendered.workspaces);
                ready(current, None, "rendered into the Edge config", generation, now)
            }
            Err(e) => {
                exclude("NodeCatalog", &n.name_any(), &e);
                ready(current, Some(&e), "", generation, now)
            }
        };
        nodes.push(StatusUpdate {
            name: n.name_any(),
            status: NodeCatalogStatus {
                conditions: vec![condition],
                observed_generation: generation,
                ..Default::default()
            },
        });
    }

    let mut providers = Vec::new();
    let mut queue = None::<(usize, u64)>;
    let mut credential_values = BTreeMap::new();
    let mut rendered = Vec::new();
    for p in sorted(&snapshot.providers) {
        let verdict = validate::provider(p, &node_ready, settings).and_then(|entry| {
            let Some(reference) = &p.spec.credential_secret_ref else { return Ok(entry) };
            let value = credentials::value(&snapshot.secrets, reference)
                .map_err(|problem| credential_invalid(reference, problem))?;
            credential_values.insert(entry.id.clone(), value.to_vec());
            Ok(entry)
        });
        match &verdict {
            Ok(entry) => {
                config.providers.push(entry.clone());
                rendered.push(p);
                let asked = p.spec.queue.clone().unwrap_or_default();
                let depth = asked.depth.map_or(settings.limits.queue_depth, |d| d as usize);
                let timeout = asked.timeout_ms.unwrap_or(settings.limits.queue_timeout_ms);
                queue = Some(queue.map_or((depth, timeout), |(d, t)| (d.max(depth), t.max(timeout))));
            }
            Err(e) => exclude("Provider", &p.name_any(), e),
        }
        let current = p.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
        let generation = p.metadata.generation;
        providers.push(StatusUpdate {
            name: p.name_any(),
            status: ProviderStatus {
                conditions: vec![ready(
                    current,
                    verdict.as_ref().err(),
                    "rendered into the Edge config",
                    generation,
                    now,
                )],
                observed_generation: generation,
                public_models: Some(p.spec.public_models()),
                ..Default::default()
            },
        });
    }
    // Route-level, so from the rendered providers together.
    let (fallbacks, fallback_problems) = validate::context_fallbacks(&rendered);
    config.context_fallbacks = fallbacks;
    for p in rendered.iter().filter(|p| p.spec.models.iter().any(|m| m.context_fallback.is_some())) {
        let name = p.name_any();
        let Some(update) = providers.iter_mut().find(|u| u.name == name) else { continue };
        let current = p.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
        let problems = fallback_problems.get(name.as_str()).map_or(&[][..], |v| &v[..]);
        update.status.conditions.push(fallbacks_ready(current, problems, p.metadata.generation, now));
    }
    if let Some((depth, timeout)) = queue {
        config.limits = Limits { queue_depth: depth, queue_timeout_ms: timeout, ..settings.limits.clone() };
    }
    // The profiles the Edge config holds now: their revisions outlive a
    // deleted credentials Secret.
    let current_profiles = snapshot
        .edge_config_map
        .as_ref()
        .and_then(|cm| cm.data.as_ref()?.get(CONFIG_KEY))
        .and_then(|yaml| EdgeConfig::from_yaml(yaml).ok())
        .map(|c| c.credentials)
        .unwrap_or_default();
    let now_unix_s = u64::try_from(now.as_second()).unwrap_or(0);
    let revisions =
        credentials::revisions(snapshot.edge_credentials.as_ref(), &current_profiles, &credential_values, now_unix_s);
    config.credentials = credentials::profiles(&revisions);
    config.validate().map_err(BuildError::Config)?;

    let config_map = config_map(snapshot, &config);
    let credentials = credentials::secret(&snapshot.namespace, credential_values, &revisions);
    Ok(Prepared { config, config_map, providers, nodes, templates, credentials, excluded })
}

/// A NodeCatalog that passed validation: its Edge config entry, the
/// workspaces rendered for it, and the problems of those left out.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedNode {
    pub entry: NodeEntry,
    pub workspaces: Vec<WorkspaceEntry>,
    pub problems: Vec<Invalid>,
}

/// The verdicts on a snapshot's WorkspaceTemplates and NodeCatalogs, each
/// in name order.
#[derive(Debug)]
pub struct Verdicts<'a> {
    pub templates: Vec<(&'a WorkspaceTemplate, Result<(), Invalid>)>,
    pub nodes: Vec<(&'a NodeCatalog, Result<RenderedNode, Invalid>)>,
}

/// Judges every template, then every node with its workspaces: a workspace
/// is rendered when its template is ready and the Edge's own rules accept
/// it (a ref is unique in the Edge config: the first node in name order
/// keeps it). The one definition of what the build renders and of the
/// workspace problems the status mirror reports in `WorkspacesReady`
/// ([`node_workspaces`]).
pub fn verdicts<'a>(snapshot: &'a Snapshot, settings: &Settings) -> Verdicts<'a> {
    let templates: Vec<_> =
        sorted(&snapshot.templates).into_iter().map(|t| (t, validate::workspace_template(t, settings))).collect();
    let mut template_ready = BTreeMap::new();
    for (t, verdict) in &templates {
        // A template being deleted is "absent" to its workspaces, not "not ready".
        if !matches!(verdict, Err(Invalid { reason: Reason::Deleting, .. })) {
            template_ready.insert(t.meta().name.as_deref().unwrap_or_default(), verdict.is_ok());
        }
    }
    let mut taken = BTreeSet::new();
    let nodes = sorted(&snapshot.nodes)
        .into_iter()
        .map(|n| {
            let verdict = validate::node_catalog(n, &template_ready).map(|(entry, mut problems)| {
                let mut workspaces = Vec::new();
                for w in &n.spec.workspaces {
                    // A template that is missing or not ready is already a problem.
                    let template = snapshot.templates.iter().find(|t| t.name_any() == w.template);
                    let Some(template) = template.filter(|_| template_ready.get(w.template.as_str()) == Some(&true))
                    else {
                        continue;
                    };
                    match validate::workspace(&entry.name, w, &template.spec, &taken, settings) {
                        Ok(rendered) => {
                            taken.insert(rendered.reference.clone());
                            workspaces.push(rendered);
                        }
                        Err(problem) => problems.push(problem),
                    }
                }
                RenderedNode { entry, workspaces, problems }
            });
            (n, verdict)
        })
        .collect();
    Verdicts { templates, nodes }
}

/// What the status mirror needs of a rendered NodeCatalog for its
/// `WorkspacesReady` condition: the workspace refs the Edge config assigns
/// to the node, the problems of the workspaces left out, and the
/// `metadata.generation` they were judged at.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeWorkspaces {
    pub assigned: Vec<String>,
    pub problems: Vec<Invalid>,
    pub generation: Option<i64>,
}

/// [`NodeWorkspaces`] of every NodeCatalog the build renders (by name);
/// one it leaves out (not `Ready`) is absent.
pub fn node_workspaces(snapshot: &Snapshot, settings: &Settings) -> BTreeMap<String, NodeWorkspaces> {
    verdicts(snapshot, settings)
        .nodes
        .into_iter()
        .filter_map(|(n, verdict)| {
            let rendered = verdict.ok()?;
            let assigned = rendered.workspaces.into_iter().map(|w| w.reference).collect();
            let workspaces =
                NodeWorkspaces { assigned, problems: rendered.problems, generation: n.metadata.generation };
            Some((n.name_any(), workspaces))
        })
        .collect()
}

/// The Provider's `Ready=False` for a credential it cannot use: names the
/// Secret and key, never the value.
fn credential_invalid(reference: &SecretKeyRef, problem: CredentialProblem) -> Invalid {
    let (name, key) = (&reference.name, &reference.key);
    let (reason, why) = match problem {
        CredentialProblem::SecretMissing => {
            (Reason::CredentialSecretMissing, format!("Secret `{name}` does not exist"))
        }
        CredentialProblem::KeyMissing => {
            (Reason::CredentialSecretMissing, format!("Secret `{name}` has no key `{key}`"))
        }
        CredentialProblem::NotLabelled => (
            Reason::SecretNotLabelled,
            format!(
                "Secret `{name}` is not labelled `{}: \"true\"`, so its value is not used (only Secrets so \
                 labelled may be provider credentials)",
                credentials::CREDENTIAL_LABEL
            ),
        ),
        CredentialProblem::InvalidValue(e) => {
            (Reason::InvalidCredentialValue, format!("Secret `{name}` key `{key}`: {e}; it is not copied"))
        }
    };
    Invalid {
        reason,
        message: format!(
            "spec.credentialSecretRef: {why}; the provider is kept out instead of running without its key"
        ),
    }
}

fn sorted<K: Resource>(objects: &[K]) -> Vec<&K> {
    let mut objects: Vec<&K> = objects.iter().collect();
    objects.sort_by(|a, b| a.meta().name.cmp(&b.meta().name));
    objects
}

fn ready(
    current: &[Condition],
    error: Option<&Invalid>,
    ok: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    match error {
        None => conditions::next(current, READY, Status::True, ACCEPTED, ok, generation, now),
        Some(e) => conditions::next(current, READY, Status::False, e.reason.as_str(), &e.message, generation, now),
    }
}

fn fallbacks_ready(current: &[Condition], problems: &[Invalid], generation: Option<i64>, now: Timestamp) -> Condition {
    let (status, reason, message) = match problems.first() {
        None => (Status::True, ACCEPTED, "rendered into the Edge config".to_string()),
        Some(first) => {
            let message = problems.iter().map(|p| p.message.as_str()).collect::<Vec<_>>().join("; ");
            (Status::False, first.reason.as_str(), message)
        }
    };
    conditions::next(current, CONTEXT_FALLBACKS_READY, status, reason, message, generation, now)
}

/// `iop-edge-config`. It has no owner references: it is the operator's
/// (re-created at once when deleted, see `runtime::controller`), and an owner
/// list that changed with every Provider and NodeCatalog added or removed
/// needed `delete` on it where OwnerReferencesPermissionEnforcement is on
/// (a right the operator never uses otherwise).
fn config_map(snapshot: &Snapshot, config: &EdgeConfig) -> ConfigMap {
    let labels = [
        ("app.kubernetes.io/name", "iop"),
        ("app.kubernetes.io/component", "edge-config"),
        ("app.kubernetes.io/managed-by", "iop-operator"),
    ];
    let yaml = format!(
        "# Rendered by iop-operator from the Provider and NodeCatalog objects of namespace `{}`.\n\
         # Edits are overwritten; change those objects instead.\n{}",
        snapshot.namespace,
        config.to_yaml()
    );
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIG_MAP_NAME.to_string()),
            namespace: Some(snapshot.namespace.clone()),
            labels: Some(labels.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        },
        data: Some([(CONFIG_KEY.to_string(), yaml)].into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
