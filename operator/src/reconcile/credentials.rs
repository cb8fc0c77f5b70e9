//! Managed provider credentials (pure): a Provider's `credentialSecretRef`
//! becomes a profile of the Edge config, named after the Provider, whose
//! secret the operator copies into the Secret [`EDGE_CREDENTIALS_SECRET`]
//! that the Edge mounts at [`EDGE_CREDENTIALS_DIR`]. The credential is never
//! written into the ConfigMap.
//!
//! Which Secrets may be used: only those labelled [`CREDENTIAL_LABEL`]`:
//! "true"`. A Provider's author chooses its `baseUrl`, and the Edge sends
//! the credential there as a Bearer token: without the label rule, a
//! Provider could name another provider's Secret (or any Secret of the
//! namespace) and receive its value. The label is the Secret owner's consent
//! to this use. A value must also pass the Edge's own rule
//! ([`iop_proto::lease::check_credential`]) before it is copied: a bad value
//! is never copied, its Provider is left out with a condition that names the
//! Secret and key (never the value), and everything else reconciles.
//!
//! Revisions: each profile's revision is kept in the annotation
//! [`REVISIONS_ANNOTATION`] of that Secret (and in the Edge config) and
//! raised whenever its value changes, so a node refuses leases of an older
//! value after a rotation; it never goes back, even when that Secret or the
//! Provider is deleted and re-created ([`revisions`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use iop_proto::config::CredentialProfile;
use iop_proto::lease::{CredentialValueError, check_credential};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::crd::provider::SecretKeyRef;

/// Written by the operator, mounted by the Edge.
pub const EDGE_CREDENTIALS_SECRET: &str = "iop-edge-credentials";
/// Where the Edge pod mounts [`EDGE_CREDENTIALS_SECRET`] (one file per profile).
pub const EDGE_CREDENTIALS_DIR: &str = "/etc/iop/credentials";
/// JSON object profile -> revision on [`EDGE_CREDENTIALS_SECRET`].
pub const REVISIONS_ANNOTATION: &str = "iop.dev/credential-revisions";

/// The label (value `"true"`) a Secret must carry to be usable by a
/// `credentialSecretRef`; the operator's Secret watch selects on it.
pub const CREDENTIAL_LABEL: &str = "iop.dev/credential";
/// [`CREDENTIAL_LABEL`]`=true`, as a label selector.
pub const CREDENTIAL_SELECTOR: &str = "iop.dev/credential=true";

/// Whether a Secret (its metadata) consents to being a provider credential.
pub fn labelled(meta: &ObjectMeta) -> bool {
    meta.labels.as_ref().and_then(|l| l.get(CREDENTIAL_LABEL)).is_some_and(|v| v == "true")
}

/// Why a `credentialSecretRef` gives no value. Never carries the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialProblem {
    /// No such Secret.
    SecretMissing,
    /// The Secret is not labelled [`CREDENTIAL_LABEL`]`: "true"` (its data
    /// is never read).
    NotLabelled,
    /// The Secret has no such key.
    KeyMissing,
    /// The key's value breaks the Edge's rule.
    InvalidValue(CredentialValueError),
}

/// The value `reference` points at among the Secrets read (trimmed, as the
/// Edge would load it), or why there is none.
pub fn value<'a>(
    secrets: &'a BTreeMap<String, Secret>,
    reference: &SecretKeyRef,
) -> Result<&'a [u8], CredentialProblem> {
    let secret = secrets.get(&reference.name).ok_or(CredentialProblem::SecretMissing)?;
    if !labelled(&secret.metadata) {
        return Err(CredentialProblem::NotLabelled);
    }
    let value = secret.data.as_ref().and_then(|d| d.get(&reference.key)).ok_or(CredentialProblem::KeyMissing)?;
    check_credential(&value.0).map_err(CredentialProblem::InvalidValue)
}

/// Each profile's revision, which only ever goes up: the previous one
/// while its value is unchanged; otherwise (a changed value, a new profile,
/// or one whose previous value is gone because [`EDGE_CREDENTIALS_SECRET`]
/// or its Provider was deleted and re-created) the later of one more than
/// any revision still known for it (`previous`'s annotation, or
/// `previous_config`, the Edge config's current profiles) and `now_unix_s`.
/// A node refuses a lease older than the newest revision it has seen, so a
/// revision that went back would make it refuse every request; a Unix time
/// is past every revision given before, even those nothing remembers.
pub fn revisions(
    previous: Option<&Secret>,
    previous_config: &[CredentialProfile],
    values: &BTreeMap<String, Vec<u8>>,
    now_unix_s: u64,
) -> BTreeMap<String, u64> {
    let old_revisions: BTreeMap<String, u64> = previous
        .and_then(|s| s.metadata.annotations.as_ref()?.get(REVISIONS_ANNOTATION))
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_default();
    let old_value = |profile: &str| previous.and_then(|s| s.data.as_ref()?.get(profile)).map(|v| v.0.as_slice());
    let configured = |profile: &str| previous_config.iter().find(|c| c.profile == profile).map(|c| c.revision);
    values
        .iter()
        .map(|(profile, value)| {
            let known = old_revisions.get(profile).copied().max(configured(profile));
            let revision = match (old_revisions.get(profile), old_value(profile)) {
                (Some(&revision), Some(old)) if old == value.as_slice() => revision.max(known.unwrap_or(0)),
                _ => known.map_or(0, |k| k.saturating_add(1)).max(now_unix_s).max(1),
            };
            (profile.clone(), revision)
        })
        .collect()
}

/// The Edge config's `credentials` for `revisions`.
pub fn profiles(revisions: &BTreeMap<String, u64>) -> Vec<CredentialProfile> {
    revisions
        .iter()
        .map(|(profile, &revision)| CredentialProfile {
            profile: profile.clone(),
            file: PathBuf::from(EDGE_CREDENTIALS_DIR).join(profile),
            revision,
            disabled: false,
        })
        .collect()
}

/// The desired [`EDGE_CREDENTIALS_SECRET`].
pub fn secret(namespace: &str, values: BTreeMap<String, Vec<u8>>, revisions: &BTreeMap<String, u64>) -> Secret {
    let labels = [
        ("app.kubernetes.io/name", "iop"),
        ("app.kubernetes.io/component", "edge-credentials"),
        ("app.kubernetes.io/managed-by", "iop-operator"),
    ];
    let revisions = serde_json::to_string(revisions).expect("a map of numbers serializes");
    Secret {
        metadata: ObjectMeta {
            name: Some(EDGE_CREDENTIALS_SECRET.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            annotations: Some([(REVISIONS_ANNOTATION.to_string(), revisions)].into()),
            ..Default::default()
        },
        type_: Some("Opaque".to_string()),
        data: Some(values.into_iter().map(|(k, v)| (k, ByteString(v))).collect()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
