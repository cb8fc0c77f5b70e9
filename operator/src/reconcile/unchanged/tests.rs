use k8s_openapi::ByteString;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

use super::*;

/// The operator's field manager.
const M: &str = "iop-operator/config";

fn map(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

fn config_map(data: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some("iop-edge-config".into()),
            labels: map(&[("app.kubernetes.io/managed-by", "iop-operator")]),
            ..Default::default()
        },
        data: map(&[("edge.yaml", data)]),
        ..Default::default()
    }
}

fn secret(pairs: &[(&str, &str)], revisions: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some("iop-edge-credentials".into()),
            labels: map(&[("app.kubernetes.io/managed-by", "iop-operator")]),
            annotations: map(&[("iop.dev/credential-revisions", revisions)]),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(pairs.iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect()),
        ..Default::default()
    }
}

#[test]
fn a_config_map_that_holds_the_desired_one_is_not_applied_again() {
    let desired = config_map("nodes: []\n");
    let mut current = desired.clone();
    // What the server adds is not ours to compare.
    current.metadata.resource_version = Some("42".into());
    current.metadata.uid = Some("u".into());
    current.metadata.labels.as_mut().unwrap().insert("team".into(), "llm".into());
    current.metadata.annotations = map(&[("note", "kept")]);
    assert!(config_map_holds(Some(&current), &desired));
}

#[test]
fn a_config_map_is_applied_when_missing_edited_deleting_or_owned() {
    let desired = config_map("nodes: []\n");
    assert!(!config_map_holds(None, &desired), "missing");
    assert!(!config_map_holds(Some(&config_map("edited: true\n")), &desired), "data edited");
    let mut extra = desired.clone();
    extra.data.as_mut().unwrap().insert("other.yaml".into(), "x".into());
    assert!(!config_map_holds(Some(&extra), &desired), "a key the operator does not set");
    let mut relabelled = desired.clone();
    relabelled.metadata.labels = map(&[("app.kubernetes.io/managed-by", "someone")]);
    assert!(!config_map_holds(Some(&relabelled), &desired), "a label changed");
    let mut unlabelled = desired.clone();
    unlabelled.metadata.labels = None;
    assert!(!config_map_holds(Some(&unlabelled), &desired), "a label removed");
    let mut deleting = desired.clone();
    deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
    assert!(!config_map_holds(Some(&deleting), &desired), "being deleted");
    let mut owned = desired.clone();
    owned.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "iop.dev/v1alpha1".into(),
        kind: "Provider".into(),
        name: "p".into(),
        uid: "u".into(),
        ..Default::default()
    }]);
    assert!(!config_map_holds(Some(&owned), &desired), "owner references an older version set");
}

#[test]
fn a_credentials_secret_is_applied_when_a_value_revision_or_key_changes() {
    let desired = secret(&[("p", "key-1")], r#"{"p":1}"#);
    assert!(secret_holds(Some(&desired.clone()), &desired, M));
    assert!(!secret_holds(None, &desired, M));
    assert!(!secret_holds(Some(&secret(&[("p", "key-0")], r#"{"p":1}"#)), &desired, M), "value");
    assert!(!secret_holds(Some(&secret(&[("p", "key-1")], r#"{"p":0}"#)), &desired, M), "revision");
    assert!(!secret_holds(Some(&secret(&[("p", "key-1"), ("gone", "k")], r#"{"p":1}"#)), &desired, M), "stale key");
    let mut typed = desired.clone();
    typed.type_ = Some("kubernetes.io/tls".into());
    assert!(!secret_holds(Some(&typed), &desired, M), "type");
    // No credential at all: an empty Secret holds an empty desired one.
    let empty = secret(&[], "{}");
    let mut stored = empty.clone();
    stored.data = None;
    assert!(secret_holds(Some(&stored), &empty, M));
}

/// Issue 43 item 6: a key someone else added to `iop-edge-credentials` is
/// kept (an apply leaves it) and does not make every resync apply again; a
/// key the operator wrote and no longer wants still does.
#[test]
fn a_foreign_key_in_the_credentials_secret_is_no_reason_to_apply() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    let desired = secret(&[("p", "key-1")], r#"{"p":1}"#);
    let entry = |manager: &str, keys: &[&str]| ManagedFieldsEntry {
        manager: Some(manager.into()),
        fields_v1: Some(FieldsV1(serde_json::json!({
            "f:data": keys.iter().map(|k| (format!("f:{k}"), serde_json::json!({}))).collect::<serde_json::Map<_, _>>()
        }))),
        ..Default::default()
    };
    let mut current = secret(&[("p", "key-1"), ("note", "x")], r#"{"p":1}"#);
    current.metadata.managed_fields = Some(vec![entry(M, &["p"]), entry("kubectl-edit", &["note"])]);
    assert!(secret_holds(Some(&current), &desired, M), "a foreign key");
    // The operator's own stale key: applied (the apply removes it).
    current.metadata.managed_fields = Some(vec![entry(M, &["p", "note"])]);
    assert!(!secret_holds(Some(&current), &desired, M), "our stale key");
    // Both wrote it: still ours to remove.
    current.metadata.managed_fields = Some(vec![entry(M, &["p", "note"]), entry("kubectl-edit", &["note"])]);
    assert!(!secret_holds(Some(&current), &desired, M));
}
