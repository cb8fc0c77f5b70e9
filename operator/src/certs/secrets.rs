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
    Authority, CA_CERT_KEY, CA_KEY_KEY, CA_SECRET, Ca, CertError, CertifiedKey, EDGE_CERT_KEY, EDGE_KEY_KEY,
    EDGE_TLS_SECRET, NODE_CERT_KEY, NODE_KEY_KEY, PrivateKeyPem, Renewal, Retiring, needs_rotation, node_secret_name,
};
use crate::crd::NodeCatalog;

/// Lifetimes (the same for `iop-edge pki`): a generated CA's, the Edge
/// server certificate's and how long before its expiry it is renewed.
pub use iop_pki::{CA_VALIDITY, EDGE_RENEW_BEFORE, EDGE_RENEWAL, EDGE_VALIDITY};
/// Common name of a CA the operator generates: named after its creation
/// time, so the old and the new CA of a rotation differ by name and a
/// certificate of the wrong one is refused as `untrusted_issuer`.
pub fn ca_common_name(now: OffsetDateTime) -> String {
    let t = now.to_offset(time::UtcOffset::UTC);
    format!(
        "iop operator CA {:04}{:02}{:02}T{:02}{:02}{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Keys `iop-ca` holds while a CA rotation is under way
/// (`iop-operator ca rotate`, until `iop-operator ca finish`): the CA being
/// replaced (still trusted) and the new CA cross-signed by it
/// ([`iop_pki::rotation`]).
pub const RETIRING_CA_KEY: &str = "retiring-ca.pem";
pub const RETIRING_CROSS_KEY: &str = "retiring-cross.pem";

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
    /// The certificate stands, but the trust bundle (`ca.pem`) or the chain
    /// served after it changed (a CA rotation began or ended): the Secret is
    /// written again with the same certificate and key.
    Trust,
}

impl Reissue {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::CaChanged => "ca_changed",
            Self::Rotation => "rotation",
            Self::Mismatch => "mismatch",
            Self::Trust => "trust",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaSecretError {
    #[error("Secret `{CA_SECRET}` has neither `{CA_CERT_KEY}`/`{CA_KEY_KEY}` nor `{TLS_CERT_KEY}`/`{TLS_KEY_KEY}`")]
    MissingKeys,
    #[error("Secret `{CA_SECRET}`: {0}")]
    Invalid(CertError),
    #[error("Secret `{CA_SECRET}` has one of `{RETIRING_CA_KEY}` and `{RETIRING_CROSS_KEY}` without the other")]
    RetiringIncomplete,
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

/// The CA and, while a rotation is under way, the CA it replaces.
pub fn load_authority(secret: &Secret, now: OffsetDateTime) -> Result<Authority, CaSecretError> {
    let signer = load_ca(secret, now)?;
    match (value(secret, RETIRING_CA_KEY), value(secret, RETIRING_CROSS_KEY)) {
        (None, None) => Ok(Authority::single(signer)),
        (Some(ca_pem), Some(cross_pem)) => {
            Authority::rotating(signer, Retiring { ca_pem, cross_pem }).map_err(CaSecretError::Invalid)
        }
        _ => Err(CaSecretError::RetiringIncomplete),
    }
}

/// `iop-edge-tls`: `ca.pem` (the trust bundle), `edge.pem` (the leaf and,
/// during a rotation, the cross-signed CA), `edge-key.pem`.
pub fn edge_tls_secret(namespace: &str, authority: &Authority, edge: &CertifiedKey) -> Secret {
    secret(
        namespace,
        EDGE_TLS_SECRET,
        "edge-tls",
        &[
            (CA_CERT_KEY, &authority.trust_pem()),
            (EDGE_CERT_KEY, &authority.serving_chain(&edge.cert_pem)),
            (EDGE_KEY_KEY, edge.key.expose()),
        ],
    )
}

/// `iop-node-<name>`: `ca.pem`, `node.pem`, `node-key.pem`, owned by its
/// NodeCatalog (deleted with it).
pub fn node_secret(namespace: &str, node: &NodeCatalog, authority: &Authority, cert: &CertifiedKey) -> Secret {
    let name = node.meta().name.as_deref().unwrap_or_default();
    let mut s = secret(
        namespace,
        &node_secret_name(name),
        "node-certificate",
        &[(CA_CERT_KEY, &authority.trust_pem()), (NODE_CERT_KEY, &cert.cert_pem), (NODE_KEY_KEY, cert.key.expose())],
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

/// The certificate and key a stored Secret holds, when both are there.
pub fn stored_cert(secret: &Secret, cert_key: &str, key_key: &str) -> Option<CertifiedKey> {
    Some(CertifiedKey { cert_pem: value(secret, cert_key)?, key: PrivateKeyPem::new(value(secret, key_key)?) })
}

/// Whether the certificate in a stored Secret must be issued again, or the
/// Secret written again around it ([`Reissue::Trust`]). `served` is the
/// certificate text the Secret should hold for its leaf (the Edge's chain).
fn reissue(
    existing: Option<&Secret>,
    (cert_key, key_key): (&str, &str),
    authority: &Authority,
    expected_names: &[String],
    now: OffsetDateTime,
    renewal: Renewal,
    served: impl Fn(&str) -> String,
) -> Option<Reissue> {
    let Some(s) = existing else { return Some(Reissue::Missing) };
    let (Some(ca_pem), Some(cert), Some(key)) = (value(s, CA_CERT_KEY), value(s, cert_key), value(s, key_key)) else {
        return Some(Reissue::Missing);
    };
    // Compared without trailing whitespace: a Secret written before bundles
    // were joined line by line reads the same.
    let same = |a: &str, b: &str| a.trim_end() == b.trim_end();
    let trusted = same(&ca_pem, &authority.trust_pem());
    let ca = &authority.signer;
    let Some(mut names) = leaf_names(&cert, &key, ca) else {
        return Some(if trusted { Reissue::Mismatch } else { Reissue::CaChanged });
    };
    let mut expected = expected_names.to_vec();
    expected.sort();
    names.sort();
    if names != expected {
        return Some(Reissue::Mismatch);
    }
    if needs_rotation(&cert, now, renewal, ca.not_after()) {
        return Some(Reissue::Rotation);
    }
    (!trusted || !same(&cert, &served(&cert))).then_some(Reissue::Trust)
}

/// Whether `iop-edge-tls` must be issued (or written) again for `names`.
pub fn edge_reissue(
    existing: Option<&Secret>,
    authority: &Authority,
    names: &[String],
    now: OffsetDateTime,
) -> Option<Reissue> {
    let served = |cert: &str| authority.serving_chain(cert);
    reissue(existing, (EDGE_CERT_KEY, EDGE_KEY_KEY), authority, names, now, EDGE_RENEWAL, served)
}

/// Whether a node's Secret must be issued (or written) again for `identity`.
pub fn node_reissue(
    existing: Option<&Secret>,
    authority: &Authority,
    identity: &NodeIdentity,
    now: OffsetDateTime,
    renewal: Renewal,
) -> Option<Reissue> {
    let leaf = |cert: &str| iop_pki::rotation::first_pem_block(cert).to_string();
    reissue(existing, (NODE_CERT_KEY, NODE_KEY_KEY), authority, &[identity.uri()], now, renewal, leaf)
}

#[cfg(test)]
mod tests;
