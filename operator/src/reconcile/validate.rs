//! Validate stage (pure): each object on its own, then its references to
//! other objects. An object that fails gets `Ready=False` with a [`Reason`]
//! and is left out of the Edge config; it never affects the other objects.
//!
//! The CRD schema enforces most rules at admission; they are checked again
//! here because objects admitted under an older CRD, or written while the
//! schema was not installed, still reach the operator. Provider rules are
//! checked by the Edge's own `EdgeConfig::validate`, so the two never drift.

use std::collections::{BTreeMap, BTreeSet};

use iop_proto::config::{
    ConfigError, CredentialRef, EdgeConfig, NodeEntry, ProviderEntry, PublicModel, StagePrompts, Target,
    WorkspaceCommand, WorkspaceEntry, WorkspaceLimits, WorkspaceOperation, WorkspaceStages,
};
use iop_proto::identity;
use kube::{Resource, ResourceExt};

use super::Settings;
use crate::crd::node_catalog::Workspace;
use crate::crd::provider::Adapter;
use crate::crd::workspace_template::{Operation, WorkspaceTemplateSpec};
use crate::crd::{NodeCatalog, Provider, WorkspaceTemplate};

/// Why an object (or a part of it) is not ready. The names are condition reasons and metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// A spec field breaks a rule.
    InvalidSpec,
    /// The name cannot serve as a node identity or provider id.
    InvalidName,
    /// The object is being deleted; it is already out of the Edge config.
    Deleting,
    /// A Provider's `spec.node` names no NodeCatalog (or one being deleted).
    NodeNotFound,
    /// A Provider's NodeCatalog exists but is not ready.
    NodeNotReady,
    /// A workspace names no WorkspaceTemplate.
    TemplateNotFound,
    /// A workspace's WorkspaceTemplate exists but is not ready.
    TemplateNotReady,
    /// `credentialSecretRef` names a Secret or key that does not exist; the
    /// provider is kept out rather than run without its key.
    CredentialSecretMissing,
    /// `credentialSecretRef` names a Secret without the label
    /// `iop.dev/credential: "true"`; its value is not used.
    SecretNotLabelled,
    /// The credential's value breaks the Edge's rule (empty, too long, not
    /// printable ASCII without spaces); it is not copied.
    InvalidCredentialValue,
    /// A `contextFallback` names no public model of any rendered Provider
    /// (condition `ContextFallbacksReady`; the provider stays in).
    ContextFallbackNotFound,
    /// Providers name different `contextFallback`s for one public model;
    /// none of them is rendered (condition `ContextFallbacksReady`).
    ContextFallbackConflict,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidSpec => "InvalidSpec",
            Self::InvalidName => "InvalidName",
            Self::Deleting => "Deleting",
            Self::NodeNotFound => "NodeNotFound",
            Self::NodeNotReady => "NodeNotReady",
            Self::TemplateNotFound => "TemplateNotFound",
            Self::TemplateNotReady => "TemplateNotReady",
            Self::CredentialSecretMissing => "CredentialSecretMissing",
            Self::SecretNotLabelled => "SecretNotLabelled",
            Self::InvalidCredentialValue => "InvalidCredentialValue",
            Self::ContextFallbackNotFound => "ContextFallbackNotFound",
            Self::ContextFallbackConflict => "ContextFallbackConflict",
        }
    }
}

/// Condition reason of a ready object.
pub const ACCEPTED: &str = "Accepted";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", reason.as_str())]
pub struct Invalid {
    pub reason: Reason,
    pub message: String,
}

fn invalid(reason: Reason, message: impl Into<String>) -> Invalid {
    Invalid { reason, message: message.into() }
}

fn spec_error(field: &str, reason: impl std::fmt::Display) -> Invalid {
    invalid(Reason::InvalidSpec, format!("spec.{field}: {reason}"))
}

/// Whether each object of a kind that others refer to is ready, by name.
/// A name that is absent does not exist.
pub type Readiness<'a> = BTreeMap<&'a str, bool>;

/// A template's own rules, then the Edge's workspace rules (ranges, stages)
/// on what it renders, so a template the Edge would refuse is not ready.
pub fn workspace_template(t: &WorkspaceTemplate, settings: &Settings) -> Result<(), Invalid> {
    if t.metadata.deletion_timestamp.is_some() {
        return Err(invalid(Reason::Deleting, "being deleted"));
    }
    let spec = &t.spec;
    if spec.operations.is_empty() {
        return Err(spec_error("operations", "must allow at least one operation"));
    }
    if spec.operations.iter().collect::<BTreeSet<_>>().len() != spec.operations.len() {
        return Err(spec_error("operations", "lists an operation twice"));
    }
    if spec.commands.is_empty() == spec.operations.contains(&Operation::Command) {
        return Err(spec_error("commands", "are required with the command operation and allowed only with it"));
    }
    let mut ids = BTreeSet::new();
    for (i, c) in spec.commands.iter().enumerate() {
        if !is_dns_label_like(&c.id, b"-_.") {
            return Err(spec_error(&format!("commands[{i}].id"), "must be 1-63 of a-z, 0-9, '-', '_', '.'"));
        }
        if !ids.insert(c.id.as_str()) {
            return Err(spec_error(&format!("commands[{i}].id"), format!("duplicate command id `{}`", c.id)));
        }
        if c.argv.first().is_none_or(String::is_empty) {
            return Err(spec_error(&format!("commands[{i}].argv"), "must start with a program"));
        }
        if !(1_000..=3_600_000).contains(&c.timeout_ms) {
            return Err(spec_error(&format!("commands[{i}].timeoutMs"), "must be between 1000 and 3600000"));
        }
    }
    for (i, name) in spec.env_allowlist.iter().enumerate() {
        let ok = name.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ok {
            return Err(spec_error(
                &format!("envAllowlist[{i}]"),
                format!("`{name}` is not an environment variable name"),
            ));
        }
    }
    let l = &spec.limits;
    let zero = [
        ("maxFileBytes", l.max_file_bytes == 0),
        ("maxListEntries", l.max_list_entries == 0),
        ("maxOutputBytes", l.max_output_bytes == 0),
        ("maxIterations", l.max_iterations == 0),
        ("wallClockMs", l.wall_clock_ms < 1_000),
    ];
    if let Some((field, _)) = zero.iter().find(|(_, bad)| *bad) {
        return Err(spec_error(&format!("limits.{field}"), "is below its minimum"));
    }
    // The rest (ranges, stages) by the Edge's own rules, on a config holding
    // the template rendered into one placeholder workspace.
    const PROBE: &str = "template-probe";
    let alone = EdgeConfig {
        nodes: vec![NodeEntry { name: PROBE.to_string() }],
        workspaces: vec![render(PROBE, PROBE, &format!("/{PROBE}"), spec)],
        ..settings.empty_config()
    };
    alone.validate().map_err(template_rule_error)
}

/// `template` as the Edge config entry of workspace `reference` (at `root`
/// on `node`).
fn render(reference: &str, node: &str, root: &str, template: &WorkspaceTemplateSpec) -> WorkspaceEntry {
    let operation = |o: &Operation| match o {
        Operation::Read => WorkspaceOperation::Read,
        Operation::List => WorkspaceOperation::List,
        Operation::Write => WorkspaceOperation::Write,
        Operation::Delete => WorkspaceOperation::Delete,
        Operation::Command => WorkspaceOperation::Command,
    };
    let l = &template.limits;
    let s = &template.stages;
    let p = &s.prompts;
    WorkspaceEntry {
        reference: reference.to_string(),
        node: node.to_string(),
        root: root.to_string(),
        operations: template.operations.iter().map(operation).collect(),
        commands: template
            .commands
            .iter()
            .map(|c| WorkspaceCommand {
                id: c.id.clone(),
                argv: c.argv.clone(),
                timeout_ms: c.timeout_ms,
                limits: c.limits.into(),
            })
            .collect(),
        env_allowlist: template.env_allowlist.clone(),
        limits: WorkspaceLimits {
            max_file_bytes: l.max_file_bytes,
            max_list_entries: l.max_list_entries,
            max_output_bytes: l.max_output_bytes,
            max_iterations: l.max_iterations,
            wall_clock_ms: l.wall_clock_ms,
            max_concurrent_jobs: l.max_concurrent_jobs,
        },
        network: template.network,
        stages: WorkspaceStages {
            plan: s.plan,
            review: s.review,
            max_repairs: s.max_repairs,
            stage_timeout_ms: s.stage_timeout_ms,
            prompts: StagePrompts {
                plan: p.plan.clone(),
                work: p.work.clone(),
                review: p.review.clone(),
                repair: p.repair.clone(),
                finalize: p.finalize.clone(),
            },
        },
    }
}

/// Problems of a valid node's workspaces. They do not make the node unready
/// (its providers keep running); they are reported on their own condition.
pub type WorkspaceProblems = Vec<Invalid>;

pub fn node_catalog(n: &NodeCatalog, templates: &Readiness<'_>) -> Result<(NodeEntry, WorkspaceProblems), Invalid> {
    if n.metadata.deletion_timestamp.is_some() {
        return Err(invalid(Reason::Deleting, "being deleted; its identity is removed from the Edge config"));
    }
    let name = n.name_any();
    identity::validate_name(&name).map_err(|e| invalid(Reason::InvalidName, e.to_string()))?;
    let cert = &n.spec.certificate;
    if !(1..=8760).contains(&cert.validity_hours) {
        return Err(spec_error("certificate.validityHours", "must be between 1 and 8760"));
    }
    if cert.renew_before_hours == 0 {
        return Err(spec_error(
            "certificate.renewBeforeHours",
            "must be at least 1 (certificates are checked every 5 minutes)",
        ));
    }
    if cert.renew_before_hours >= cert.validity_hours {
        return Err(spec_error("certificate.renewBeforeHours", "must be less than validityHours"));
    }
    let mut refs = BTreeSet::new();
    for (i, w) in n.spec.workspaces.iter().enumerate() {
        if !is_dns_label_like(&w.reference, b"-_.") {
            return Err(spec_error(&format!("workspaces[{i}].ref"), "must be 1-63 of a-z, 0-9, '-', '_', '.'"));
        }
        if !refs.insert(w.reference.as_str()) {
            return Err(spec_error(&format!("workspaces[{i}].ref"), format!("duplicate ref `{}`", w.reference)));
        }
        if !w.root_path.starts_with('/') || w.root_path.len() < 2 || w.root_path.contains('\0') {
            return Err(spec_error(&format!("workspaces[{i}].rootPath"), "must be an absolute path below /"));
        }
    }
    let problems = n
        .spec
        .workspaces
        .iter()
        .filter_map(|w| match templates.get(w.template.as_str()) {
            Some(true) => None,
            Some(false) => Some(invalid(
                Reason::TemplateNotReady,
                format!("workspace `{}`: WorkspaceTemplate `{}` is not ready", w.reference, w.template),
            )),
            None => Some(invalid(
                Reason::TemplateNotFound,
                format!("workspace `{}`: WorkspaceTemplate `{}` does not exist", w.reference, w.template),
            )),
        })
        .collect();
    Ok((NodeEntry { name }, problems))
}

/// The Edge config entry of workspace `w` of node `node` with its (ready)
/// template, checked by the Edge's own rules; `taken` holds the refs other
/// nodes already use (a ref is unique in the Edge config).
pub fn workspace(
    node: &str,
    w: &Workspace,
    template: &WorkspaceTemplateSpec,
    taken: &BTreeSet<String>,
    settings: &Settings,
) -> Result<WorkspaceEntry, Invalid> {
    let problem = |reason: String| invalid(Reason::InvalidSpec, format!("workspace `{}`: {reason}", w.reference));
    if taken.contains(&w.reference) {
        return Err(problem("the ref is already used by another NodeCatalog".into()));
    }
    let entry = render(&w.reference, node, &w.root_path, template);
    // The Edge's own rules, on a config holding just this workspace and its node.
    let alone = EdgeConfig {
        nodes: vec![NodeEntry { name: node.to_string() }],
        workspaces: vec![entry.clone()],
        ..settings.empty_config()
    };
    match alone.validate() {
        Ok(()) => Ok(entry),
        Err(ConfigError::Invalid { field, reason }) => {
            Err(problem(format!("{}: {reason}", field.trim_start_matches("workspaces[0]."))))
        }
        Err(e) => Err(problem(e.to_string())),
    }
}

pub fn provider(p: &Provider, nodes: &Readiness<'_>, settings: &Settings) -> Result<ProviderEntry, Invalid> {
    if p.metadata.deletion_timestamp.is_some() {
        return Err(invalid(Reason::Deleting, "being deleted; it is removed from the Edge config"));
    }
    let spec = &p.spec;
    // The CRD's CEL rule, restated: an Ollama server takes no API key.
    if spec.credential_secret_ref.is_some() && spec.adapter == Adapter::Ollama {
        return Err(spec_error("credentialSecretRef", "applies only to the openai adapter (ollama takes no API key)"));
    }
    // Likewise: keep-warm is Ollama's `keep_alive`.
    if spec.keep_warm && spec.adapter != Adapter::Ollama {
        return Err(spec_error("keepWarm", "applies only to the ollama adapter (Ollama's keep_alive)"));
    }
    let entry = ProviderEntry {
        id: p.name_any(),
        node: spec.node.clone(),
        adapter: spec.adapter.into(),
        target: Target { model: spec.target.model.clone(), base_url: spec.target.base_url.clone() },
        models: spec.models.iter().map(|m| PublicModel { name: m.name.clone(), priority: m.priority }).collect(),
        response_stall_timeout_ms: spec.response_stall_timeout_ms,
        first_byte_timeout_ms: spec.first_byte_timeout_ms,
        capacity: spec.capacity,
        mode: spec.mode.into(),
        continuation: spec.continuation,
        context_window: spec.context_window,
        accepts_images: spec.accepts_images,
        keep_warm: spec.keep_warm,
        // The profile is the Provider's own: its secret is checked and copied
        // by the build stage (`super::credentials`).
        credential: spec.credential_secret_ref.as_ref().map(|_| CredentialRef { profile: p.name_any() }),
    };
    // The Edge's own rules, on a config holding just this provider and its node.
    let alone = EdgeConfig {
        nodes: vec![NodeEntry { name: entry.node.clone() }],
        providers: vec![entry.clone()],
        // Its profile as the build stage renders it (revision and file aside).
        credentials: entry
            .credential
            .iter()
            .flat_map(|c| super::credentials::profiles(&[(c.profile.clone(), 1)].into()))
            .collect(),
        ..settings.empty_config()
    };
    // Target model and base URL included: `iop_proto::config::check_base_url`
    // and `check_target_model`, the rules the CRD schema's patterns restate.
    alone.validate().map_err(edge_rule_error)?;
    // The CRD's CEL rule, for objects stored before it.
    let path = spec.target.base_url.trim_end_matches('/');
    if path.ends_with("/v1") {
        return Err(spec_error("target.baseUrl", crate::crd::provider::API_SUFFIX_MESSAGE));
    }
    let mut names = BTreeSet::new();
    for (i, m) in spec.models.iter().enumerate() {
        if !names.insert(m.name.as_str()) {
            return Err(spec_error(&format!("models[{i}].name"), format!("duplicate public model `{}`", m.name)));
        }
        // The CRD schema's length, pattern and CEL rule, restated (whether
        // the fallback exists is decided across Providers: `context_fallbacks`).
        if let Some(to) = m.context_fallback.as_deref() {
            let field = format!("models[{i}].contextFallback");
            if to.is_empty() || to.len() > 256 || to.chars().any(char::is_whitespace) {
                return Err(spec_error(&field, "must be 1-256 characters without whitespace"));
            }
            if to == m.name {
                return Err(spec_error(&field, "cannot fall back to the model itself"));
            }
        }
    }
    if let Some(q) = &spec.queue {
        if q.depth.is_some_and(|d| d > 100_000) {
            return Err(spec_error("queue.depth", "must be at most 100000"));
        }
        if q.timeout_ms.is_some_and(|t| !(1..=3_600_000).contains(&t)) {
            return Err(spec_error("queue.timeoutMs", "must be between 1 and 3600000"));
        }
    }
    match nodes.get(spec.node.as_str()) {
        Some(true) => Ok(entry),
        Some(false) => Err(invalid(Reason::NodeNotReady, format!("NodeCatalog `{}` is not ready", spec.node))),
        None => Err(invalid(Reason::NodeNotFound, format!("NodeCatalog `{}` does not exist", spec.node))),
    }
}

/// Problems of rendered Providers' context fallbacks, by Provider name.
pub type FallbackProblems<'a> = BTreeMap<&'a str, Vec<Invalid>>;

/// `context_fallbacks` of the Edge config from the `contextFallback`s of
/// the Providers rendered into it (`rendered`), and the problems of those
/// left out. A fallback is a route-level setting: one on any Provider
/// applies to the public model on all of them. Left out and reported: a
/// fallback to the model itself (`InvalidSpec`), to a name that is no public
/// model of a rendered Provider (`ContextFallbackNotFound`), and every
/// fallback of a public model for which Providers name different ones
/// (`ContextFallbackConflict`, on each of them). What is rendered thus
/// passes `EdgeConfig::validate`'s fallback rules.
pub fn context_fallbacks<'a>(rendered: &[&'a Provider]) -> (BTreeMap<String, String>, FallbackProblems<'a>) {
    let public: BTreeSet<&str> = rendered.iter().flat_map(|p| &p.spec.models).map(|m| m.name.as_str()).collect();
    let mut problems = FallbackProblems::new();
    // Public model -> fallback -> the (provider, models index) naming it.
    let mut claims = BTreeMap::<&str, BTreeMap<&str, Vec<(&str, usize)>>>::new();
    for p in rendered {
        let provider = p.meta().name.as_deref().unwrap_or_default();
        for (i, m) in p.spec.models.iter().enumerate() {
            let Some(to) = m.context_fallback.as_deref() else { continue };
            let field = format!("models[{i}].contextFallback");
            // (A fallback to the model itself never gets here: `provider`.)
            let problem = if !public.contains(to) {
                invalid(
                    Reason::ContextFallbackNotFound,
                    format!("spec.{field}: `{to}` is not a public model of any rendered Provider; not rendered"),
                )
            } else {
                claims.entry(m.name.as_str()).or_default().entry(to).or_default().push((provider, i));
                continue;
            };
            problems.entry(provider).or_default().push(problem);
        }
    }
    let mut fallbacks = BTreeMap::new();
    for (from, targets) in claims {
        if targets.len() == 1 {
            let to = targets.into_keys().next().unwrap_or_default();
            fallbacks.insert(from.to_string(), to.to_string());
            continue;
        }
        let named = targets
            .iter()
            .map(|(to, by)| {
                let by = by.iter().map(|(p, _)| format!("`{p}`")).collect::<Vec<_>>().join(", ");
                format!("`{to}` ({by})")
            })
            .collect::<Vec<_>>()
            .join(", ");
        for (provider, i) in targets.values().flatten() {
            problems.entry(provider).or_default().push(invalid(
                Reason::ContextFallbackConflict,
                format!(
                    "spec.models[{i}].contextFallback: Providers name different fallbacks for `{from}`: {named}; \
                     none is rendered"
                ),
            ));
        }
    }
    (fallbacks, problems)
}

/// Maps an Edge config error about a template's one-workspace probe onto
/// the template's own fields.
fn template_rule_error(e: ConfigError) -> Invalid {
    match e {
        ConfigError::Invalid { field, reason } => match field.strip_prefix("workspaces[0].") {
            Some(path) => spec_error(&camel_case_path(path), reason),
            None => invalid(Reason::InvalidSpec, format!("{field}: {reason}")),
        },
        ConfigError::Parse(reason) => invalid(Reason::InvalidSpec, reason),
    }
}

/// Maps an Edge config error about the one-provider config onto the
/// Provider's own fields.
fn edge_rule_error(e: ConfigError) -> Invalid {
    let (field, reason) = match e {
        ConfigError::Invalid { field, reason } => (field, reason),
        ConfigError::Parse(reason) => return invalid(Reason::InvalidSpec, reason),
    };
    if field == "providers[0].id" {
        return invalid(Reason::InvalidName, format!("metadata.name: {reason}"));
    }
    if field == "nodes[0].name" {
        return spec_error("node", reason);
    }
    match field.strip_prefix("providers[0].") {
        Some(path) => spec_error(&camel_case_path(path), reason),
        None => invalid(Reason::InvalidSpec, format!("{field}: {reason}")),
    }
}

/// `target.base_url` -> `target.baseUrl`.
fn camel_case_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut upper = false;
    for c in path.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.push(c.to_ascii_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

fn is_dns_label_like(s: &str, extra: &[u8]) -> bool {
    let edge_ok = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    s.len() <= 63
        && edge_ok(s.bytes().next())
        && edge_ok(s.bytes().last())
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || extra.contains(&b))
}

#[cfg(test)]
mod tests;
