//! The Secrets that hold the CA and the issued certificates (pure): what they
//! contain, and whether a stored certificate must be issued again. The I/O
//! (get, create, apply) lives in `runtime::pki`.

use std::collections::BTreeMap;

use iop_proto::identity::NodeIdentity;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use rcgen::{KeyPair, PublicKeyData};
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::{
    CA_CERT_KEY, CA_KEY_KEY, CA_SECRET, Ca, CertError, CertifiedKey, EDGE_CERT_KEY, EDGE_KEY_KEY, EDGE_TLS_SECRET,
    NODE_CERT_KEY, NODE_KEY_KEY, PrivateKeyPem, Renewal, needs_rotation, node_secret_name,
};
use crate::crd::NodeCatalog;

/// Lifetimes (the same for `iop-edge pki`): a generated CA's, the Edge
/// server certificate's and how long before its expiry it is renewed.
pub use iop_pki::{CA_VALIDITY, EDGE_RENEW_BEFORE, EDGE_RENEWAL, EDGE_VALIDITY};
/// Common name of a CA the operator generates.
pub const CA_COMMON_NAME: &str = "iop operator CA";

/// Keys a user-supplied CA Secret of type `kubernetes.io/tls` has instead.
const TLS_CERT_KEY: &str = "tls.crt";
const TLS_KEY_KEY: &str = "tls.key";

/// Why a certificate is issued again. The names are log fields and metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reissue {
    /// No Secret, or a key of it is missing.
    Missing,
    /// The Secret's CA is not the current CA.
    CaChanged,
    /// Inside the rotation window (and a new one would end later), expired,
    /// or not valid yet.
    Rotation,
    /// The certificate does not match: other names or identity, not signed
    /// by the CA, or the key is not its own.
    Mismatch,
}

impl Reissue {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::CaChanged => "ca_changed",
            Self::Rotation => "rotation",
            Self::Mismatch => "mismatch",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaSecretError {
    #[error("Secret `{CA_SECRET}` has neither `{CA_CERT_KEY}`/`{CA_KEY_KEY}` nor `{TLS_CERT_KEY}`/`{TLS_KEY_KEY}`")]
    MissingKeys,
    #[error("Secret `{CA_SECRET}`: {0}")]
    Invalid(CertError),
}

fn labels(component: &str) -> BTreeMap<String, String> {
    [
        ("app.kubernetes.io/name", "iop"),
        ("app.kubernetes.io/component", component),
        ("app.kubernetes.io/managed-by", "iop-operator"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn secret(namespace: &str, name: &str, component: &str, data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels(component)),
            ..Default::default()
        },
        type_: Some("Opaque".to_string()),
        data: Some(data.iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect()),
        ..Default::default()
    }
}

/// The value of `key` in a Secret (`data`, or `stringData` as written by a
/// user who has not read it back yet).
pub fn value(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(key).cloned()))
}

/// A generated CA's Secret. It is created, never applied: an existing CA is
/// never replaced.
pub fn ca_secret(namespace: &str, ca: &Ca) -> Secret {
    let key = ca.key_pem();
    secret(namespace, CA_SECRET, "ca", &[(CA_CERT_KEY, ca.cert_pem()), (CA_KEY_KEY, key.expose())])
}

/// The CA from its Secret: `ca.pem` + `ca-key.pem`, or `tls.crt` + `tls.key`
/// (a user-supplied `kubernetes.io/tls` Secret).
pub fn load_ca(secret: &Secret, now: OffsetDateTime) -> Result<Ca, CaSecretError> {
    let pair = |c: &str, k: &str| Some((value(secret, c)?, value(secret, k)?));
    let (cert, key) =
        pair(CA_CERT_KEY, CA_KEY_KEY).or_else(|| pair(TLS_CERT_KEY, TLS_KEY_KEY)).ok_or(CaSecretError::MissingKeys)?;
    Ca::from_pem(&cert, &PrivateKeyPem::new(key), now).map_err(CaSecretError::Invalid)
}

/// `iop-edge-tls`: `ca.pem`, `edge.pem`, `edge-key.pem`.
pub fn edge_tls_secret(namespace: &str, ca: &Ca, edge: &CertifiedKey) -> Secret {
    secret(
        namespace,
        EDGE_TLS_SECRET,
        "edge-tls",
        &[(CA_CERT_KEY, ca.cert_pem()), (EDGE_CERT_KEY, &edge.cert_pem), (EDGE_KEY_KEY, edge.key.expose())],
    )
}

/// `iop-node-<name>`: `ca.pem`, `node.pem`, `node-key.pem`, owned by its
/// NodeCatalog (deleted with it).
pub fn node_secret(namespace: &str, node: &NodeCatalog, ca: &Ca, cert: &CertifiedKey) -> Secret {
    let name = node.meta().name.as_deref().unwrap_or_default();
    let mut s = secret(
        namespace,
        &node_secret_name(name),
        "node-certificate",
        &[(CA_CERT_KEY, ca.cert_pem()), (NODE_CERT_KEY, &cert.cert_pem), (NODE_KEY_KEY, cert.key.expose())],
    );
    if let Some(labels) = s.metadata.labels.as_mut() {
        labels.insert("iop.dev/node".to_string(), name.to_string());
    }
    s.metadata.owner_references = node.controller_owner_ref(&()).map(|o| vec![o]);
    s
}

/// Whether an existing `iop-node-<node>` is one the operator made for that
/// node: controlled by a NodeCatalog of that name (its controller owner
/// reference, of any uid: one re-created under the same name takes its
/// Secret over). Judged by the owner reference, not the labels: someone
/// removing a label does not make the operator abandon its own Secret (the
/// next apply puts the label back). Anything else there (a user's Secret
/// that happens to have the name, labels copied or not) is never adopted or
/// overwritten.
pub fn node_secret_is_ours(secret: &Secret, node: &str) -> bool {
    secret.metadata.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true) && o.kind == "NodeCatalog" && o.api_version.starts_with("iop.dev/") && o.name == node
    })
}

/// `ca.pem`, `node.pem` and `node-key.pem` of a node's Secret, when all are there.
pub fn node_parts(secret: &Secret) -> Option<(String, String, PrivateKeyPem)> {
    Some((value(secret, CA_CERT_KEY)?, value(secret, NODE_CERT_KEY)?, PrivateKeyPem::new(value(secret, NODE_KEY_KEY)?)))
}

/// Subject alternative names of a leaf that is signed by `ca` and whose
/// private key is `key`; `None` when it is not.
fn leaf_names(cert_pem: &str, key_pem: &str, ca: &Ca) -> Option<Vec<String>> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).ok()?;
    let (_, cert) = X509Certificate::from_der(&der).ok()?;
    let ca_der = CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).ok()?;
    let (_, ca_cert) = X509Certificate::from_der(&ca_der).ok()?;
    cert.verify_signature(Some(ca_cert.public_key())).ok()?;
    let key = KeyPair::from_pem(key_pem).ok()?;
    if key.subject_public_key_info() != cert.public_key().raw {
        return None;
    }
    cert.subject_alternative_name().ok().flatten()?;
    let mut names = iop_pki::san_names(&cert);
    names.sort();
    Some(names)
}

/// Whether the certificate in a stored Secret must be issued again.
fn reissue(
    existing: Option<&Secret>,
    cert_key: &str,
    key_key: &str,
    ca: &Ca,
    expected_names: &[String],
    now: OffsetDateTime,
    renewal: Renewal,
) -> Option<Reissue> {
    let Some(s) = existing else { return Some(Reissue::Missing) };
    let (Some(ca_pem), Some(cert), Some(key)) = (value(s, CA_CERT_KEY), value(s, cert_key), value(s, key_key)) else {
        return Some(Reissue::Missing);
    };
    if ca_pem != ca.cert_pem() {
        return Some(Reissue::CaChanged);
    }
    let mut expected = expected_names.to_vec();
    expected.sort();
    if leaf_names(&cert, &key, ca).is_none_or(|names| names != expected) {
        return Some(Reissue::Mismatch);
    }
    needs_rotation(&cert, now, renewal, ca.not_after()).then_some(Reissue::Rotation)
}

/// Whether `iop-edge-tls` must be issued again for `names`.
pub fn edge_reissue(existing: Option<&Secret>, ca: &Ca, names: &[String], now: OffsetDateTime) -> Option<Reissue> {
    reissue(existing, EDGE_CERT_KEY, EDGE_KEY_KEY, ca, names, now, EDGE_RENEWAL)
}

/// Whether a node's Secret must be issued again for `identity`.
pub fn node_reissue(
    existing: Option<&Secret>,
    ca: &Ca,
    identity: &NodeIdentity,
    now: OffsetDateTime,
    renewal: Renewal,
) -> Option<Reissue> {
    reissue(existing, NODE_CERT_KEY, NODE_KEY_KEY, ca, &[identity.uri()], now, renewal)
}

#[cfg(test)]
mod tests;
