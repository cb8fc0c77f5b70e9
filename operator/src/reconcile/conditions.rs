//! `meta/v1` Conditions. `lastTransitionTime` moves only when a condition's
//! status flips; reason, message and observed generation may change without
//! moving it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

pub const READY: &str = "Ready";
/// Condition of a NodeCatalog saying whether all its workspaces refer to
/// ready templates. Workspace problems never take the node itself out.
pub const WORKSPACES_READY: &str = "WorkspacesReady";
/// Condition of a ready Provider that sets a `contextFallback`, saying
/// whether each one is rendered. A fallback problem never takes the
/// provider itself out.
pub const CONTEXT_FALLBACKS_READY: &str = "ContextFallbacksReady";

/// The condition types reconcile writes (field manager `iop-operator/config`).
/// Other writers own other types of the same list (server-side apply merges
/// the list by `type`), e.g. `CAExpiring` (`iop-operator/certs`).
pub const RECONCILE_TYPES: [&str; 3] = [READY, WORKSPACES_READY, CONTEXT_FALLBACKS_READY];

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
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    #[test]
    fn transition_time_moves_only_when_the_status_flips() {
        let first = next(&[], READY, Status::False, "NodeNotFound", "a", Some(1), at(100));
        assert_eq!(first.last_transition_time, Time(at(100)));

        // Same status, new reason, message and generation: time stays.
        let same = next(std::slice::from_ref(&first), READY, Status::False, "InvalidSpec", "b", Some(2), at(200));
        assert_eq!(same.last_transition_time, Time(at(100)));
        assert_eq!(
            (same.reason.as_str(), same.message.as_str(), same.observed_generation),
            ("InvalidSpec", "b", Some(2))
        );

        // Flip: time moves.
        let flipped = next(&[same], READY, Status::True, "Accepted", "ok", Some(2), at(300));
        assert_eq!(flipped.last_transition_time, Time(at(300)));
        assert_eq!(flipped.status, "True");
    }

    #[test]
    fn only_the_reconciles_own_conditions_are_compared() {
        let ready = next(&[], READY, Status::True, "Accepted", "", Some(1), at(100));
        let workspaces = next(&[], WORKSPACES_READY, Status::True, "Accepted", "", Some(1), at(100));
        let ca = next(&[], "CAExpiring", Status::True, "WithinRenewalWindow", "", None, at(100));
        let desired = [ready.clone(), workspaces.clone()];
        assert!(same_reconcile_conditions(&[ready.clone(), workspaces.clone(), ca.clone()], &desired));
        assert!(same_reconcile_conditions(&[ca.clone(), ready.clone(), workspaces.clone()], &desired));
        // One of its own is missing, extra, or different: not the same.
        assert!(!same_reconcile_conditions(&[ready.clone(), ca.clone()], &desired));
        assert!(!same_reconcile_conditions(&[ready.clone(), workspaces.clone()], std::slice::from_ref(&ready)));
        let older = Condition { observed_generation: Some(0), ..ready.clone() };
        assert!(!same_reconcile_conditions(&[older, workspaces], &desired));
    }

    #[test]
    fn other_condition_types_do_not_count() {
        let other = next(&[], "Connected", Status::True, "Connected", "", None, at(100));
        let ready = next(&[other], READY, Status::True, "Accepted", "", None, at(200));
        assert_eq!(ready.last_transition_time, Time(at(200)));
    }
}
