//! The chart's cluster-scoped objects, the operator's ClusterRole and
//! ClusterRoleBinding (`IOP_CLUSTER_RBAC_NAME`), outlive a `kubectl delete
//! namespace` (only `helm uninstall` removes them, and the release is gone
//! with the namespace). Nothing in the namespace can own a cluster-scoped
//! object, but the Namespace itself can: the leader makes it their owner
//! (an owner reference, server-side apply with its own field manager,
//! nothing else touched), so the garbage collector removes them once the
//! namespace is gone, even with no operator left to do it.
//!
//! Patching its own ClusterRole cannot widen the operator's rights: the API
//! server refuses any role update that grants what the writer does not
//! already hold (RBAC escalation prevention), and the chart grants the patch
//! on these two names only.

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde_json::json;

use super::Error;

/// The field manager of the owner references.
pub const FIELD_MANAGER: &str = "iop-operator/ownership";

/// The owner reference to `namespace` (`None` before it has a uid).
pub fn namespace_owner(namespace: &Namespace) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: "v1".into(),
        kind: "Namespace".into(),
        name: namespace.metadata.name.clone()?,
        uid: namespace.metadata.uid.clone()?,
        // No blockOwnerDeletion: it would need the `namespaces/finalizers`
        // right, and nothing waits on these objects.
        ..Default::default()
    })
}

/// Whether `meta` already names `owner` among its owners.
pub fn owned_by(meta: &ObjectMeta, owner: &OwnerReference) -> bool {
    meta.owner_references.iter().flatten().any(|o| o.uid == owner.uid)
}

/// Makes `namespace` the owner of ClusterRole and ClusterRoleBinding `name`
/// where it is not yet; reads only when it is (a restart writes nothing).
pub async fn own_cluster_rbac(client: &Client, namespace: &str, name: &str) -> Result<(), Error> {
    let ns = Api::<Namespace>::all(client.clone()).get(namespace).await?;
    let Some(owner) = namespace_owner(&ns) else { return Ok(()) };
    own::<ClusterRole>(client, name, &owner).await?;
    own::<ClusterRoleBinding>(client, name, &owner).await
}

async fn own<K>(client: &Client, name: &str, owner: &OwnerReference) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let api = Api::<K>::all(client.clone());
    let Some(object) = api.get_opt(name).await? else {
        tracing::warn!(kind = K::kind(&()).as_ref(), name, "not found: IOP_CLUSTER_RBAC_NAME names no such object");
        return Ok(());
    };
    if owned_by(object.meta(), owner) {
        return Ok(());
    }
    let patch = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": { "name": name, "ownerReferences": [owner] },
    });
    api.patch(name, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(&patch)).await?;
    tracing::info!(kind = K::kind(&()).as_ref(), name, "owned by the namespace: deleting the namespace removes it");
    Ok(())
}

/// Whether `namespace` is being deleted.
pub fn is_terminating(namespace: &Namespace) -> bool {
    namespace.metadata.deletion_timestamp.is_some()
}

/// The namespace is being deleted, or gone (read now, not from a cache).
pub async fn terminating(client: &Client, namespace: &str) -> Result<bool, Error> {
    let ns = Api::<Namespace>::all(client.clone()).get_opt(namespace).await?;
    Ok(ns.is_none_or(|ns| is_terminating(&ns)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_is_the_namespace_by_uid() {
        let mut ns = Namespace::default();
        assert_eq!(namespace_owner(&ns), None, "no name and uid yet");
        ns.metadata.name = Some("iop".into());
        ns.metadata.uid = Some("u-1".into());
        let owner = namespace_owner(&ns).unwrap();
        assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()), ("Namespace", "iop", "u-1"));
        assert_eq!(owner.block_owner_deletion, None);
        let mut meta = ObjectMeta::default();
        assert!(!owned_by(&meta, &owner));
        // Another owner (a namespace re-created under the same name has another uid).
        meta.owner_references = Some(vec![OwnerReference { uid: "u-0".into(), ..owner.clone() }]);
        assert!(!owned_by(&meta, &owner));
        meta.owner_references.as_mut().unwrap().push(owner.clone());
        assert!(owned_by(&meta, &owner));
    }
}
