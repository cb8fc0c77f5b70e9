//! Whether an object the operator applies already holds what it would
//! apply, so the server-side apply is not sent at all. An apply of an
//! unchanged object changes nothing on the server, but it is still a write
//! request (audited, authorized, a round trip): a restarted operator, a new
//! leader and every 5-minute resync sent one for the ConfigMap and the
//! credentials Secret each (found on a real API server by
//! `e2e/tests/cluster.rs`).
//!
//! "Holds" means: the object exists and is not being deleted; every label and
//! annotation the desired object sets has that value (others may add more:
//! an apply would leave theirs); it has the same owner references (an apply
//! removes ones an older version of the operator set); and its data is
//! exactly the desired data (an apply removes a key the operator no longer
//! sets, e.g. a Provider's credential once the Provider is gone). Anything
//! else is applied as before.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Whether `current` holds `desired`'s labels, annotations and owner references.
pub fn meta_holds(current: &ObjectMeta, desired: &ObjectMeta) -> bool {
    fn subset(desired: &Option<BTreeMap<String, String>>, current: &Option<BTreeMap<String, String>>) -> bool {
        desired.iter().flatten().all(|(k, v)| current.as_ref().and_then(|c| c.get(k)) == Some(v))
    }
    current.deletion_timestamp.is_none()
        && subset(&desired.labels, &current.labels)
        && subset(&desired.annotations, &current.annotations)
        && current.owner_references.as_deref().unwrap_or_default()
            == desired.owner_references.as_deref().unwrap_or_default()
}

/// Whether applying `desired` over `current` would change nothing.
pub fn config_map_holds(current: Option<&ConfigMap>, desired: &ConfigMap) -> bool {
    current.is_some_and(|c| {
        meta_holds(&c.metadata, &desired.metadata)
            && c.data.as_ref().filter(|d| !d.is_empty()) == desired.data.as_ref().filter(|d| !d.is_empty())
            && c.binary_data.as_ref().filter(|d| !d.is_empty())
                == desired.binary_data.as_ref().filter(|d| !d.is_empty())
    })
}

/// Whether applying `desired` over `current` would change nothing.
pub fn secret_holds(current: Option<&Secret>, desired: &Secret) -> bool {
    current.is_some_and(|c| {
        meta_holds(&c.metadata, &desired.metadata)
            && (desired.type_.is_none() || c.type_ == desired.type_)
            && c.data.as_ref().filter(|d| !d.is_empty()) == desired.data.as_ref().filter(|d| !d.is_empty())
            && desired.string_data.as_ref().is_none_or(|d| d.is_empty())
    })
}

#[cfg(test)]
mod tests;
