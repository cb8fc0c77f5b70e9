//! `meta/v1` Conditions. `lastTransitionTime` moves only when a condition's
//! status flips; reason, message and observed generation may change without
//! moving it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

pub const READY: &str = "Ready";
/// Condition of a rendered NodeCatalog saying whether its workspaces can
/// take jobs: each renders (its template is ready, the Edge's rules accept
/// it) and the node accepted it. Written by the status mirror
/// (`iop-operator/status`): the node's verdicts reach it through the Edge
/// ([`crate::mirror::workspaces_ready`]). Workspace problems never take the
/// node itself out.
pub const WORKSPACES_READY: &str = "WorkspacesReady";
/// Condition of a NodeCatalog saying whether the node's sessions present
/// the certificate the operator issued last (`status.certificate.serial`):
/// `False` while a Mac runs an older bundle. Written by the status mirror
/// ([`crate::mirror::bundle_current`]).
pub const BUNDLE_CURRENT: &str = "BundleCurrent";
/// Condition of a ready Provider that sets a `contextFallback`, saying
/// whether each one is rendered. A fallback problem never takes the
/// provider itself out.
pub const CONTEXT_FALLBACKS_READY: &str = "ContextFallbacksReady";

/// The condition types reconcile writes (field manager `iop-operator/config`).
/// Other writers own other types of the same list (server-side apply merges
/// the list by `type`), e.g. `CAExpiring` (`iop-operator/certs`),
/// [`WORKSPACES_READY`] and [`BUNDLE_CURRENT`] (`iop-operator/status`).
pub const RECONCILE_TYPES: [&str; 2] = [READY, CONTEXT_FALLBACKS_READY];

/// Whether `current` already holds exactly the reconcile-owned conditions
/// `desired`: conditions of other writers are not compared (else every
/// reconcile would rewrite them).
pub fn same_reconcile_conditions(current: &[Condition], desired: &[Condition]) -> bool {
    let owned: Vec<&Condition> = current.iter().filter(|c| RECONCILE_TYPES.contains(&c.type_.as_str())).collect();
    owned.len() == desired.len() && owned.iter().zip(desired).all(|(a, b)| *a == b)
}

/// `True`, `False` or `Unknown`, as Kubernetes spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

/// The condition of `type_` to write now, given the object's current ones.
pub fn next(
    current: &[Condition],
    type_: &str,
    status: Status,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let last_transition_time = current
        .iter()
        .find(|c| c.type_ == type_ && c.status == status.as_str())
        .map_or(Time(now), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_string(),
        status: status.as_str().to_string(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation,
        last_transition_time,
    }
}

#[cfg(test)]
mod tests;
