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
//! sets, e.g. a Provider's credential once the Provider is gone), except, in
//! a Secret, keys another field manager wrote (an apply leaves those, so
//! comparing them would apply again at every resync, forever). Anything
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

/// Whether applying `desired` over `current` (as field manager
/// `manager`) would change nothing: every desired key holds its value, and
/// every other key is another manager's (an apply keeps it).
pub fn secret_holds(current: Option<&Secret>, desired: &Secret, manager: &str) -> bool {
    current.is_some_and(|c| {
        let empty = BTreeMap::new();
        let (have, want) = (c.data.as_ref().unwrap_or(&empty), desired.data.as_ref().unwrap_or(&empty));
        let foreign = foreign_data_keys(&c.metadata, manager);
        meta_holds(&c.metadata, &desired.metadata)
            && (desired.type_.is_none() || c.type_ == desired.type_)
            && want.iter().all(|(k, v)| have.get(k) == Some(v))
            && have.keys().all(|k| want.contains_key(k) || foreign.contains(k))
            && desired.string_data.as_ref().is_none_or(|d| d.is_empty())
    })
}

/// The `data` keys of an object that field managers other than `manager`
/// own and `manager` does not (from `metadata.managedFields`). Without
/// managed fields, none: every key counts as the operator's.
fn foreign_data_keys(meta: &ObjectMeta, manager: &str) -> std::collections::BTreeSet<String> {
    let keys = |fields: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry| {
        let data = fields.fields_v1.as_ref().and_then(|f| f.0.get("f:data")).and_then(|d| d.as_object());
        data.into_iter().flatten().filter_map(|(k, _)| k.strip_prefix("f:").map(str::to_string)).collect::<Vec<_>>()
    };
    let entries = meta.managed_fields.iter().flatten();
    let ours: std::collections::BTreeSet<String> =
        entries.clone().filter(|f| f.manager.as_deref() == Some(manager)).flat_map(keys).collect();
    entries.filter(|f| f.manager.as_deref() != Some(manager)).flat_map(keys).filter(|k| !ours.contains(k)).collect()
}

#[cfg(test)]
mod tests;
