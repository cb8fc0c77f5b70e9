//! `iop-operator ca rotate` and `ca finish`, the pure half: what `iop-ca`
//! becomes, and whether the overlap may end. The I/O (one read, one
//! replace guarded by the resourceVersion read) lives in `runtime::pki`.
//!
//! Rotating is one write to the one Secret the operator reads its CA from,
//! so it never races the operator: there is no moment without `iop-ca`,
//! and a concurrent change makes the write fail (409) instead of being lost.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::secrets::{self, CaSecretError, RETIRING_CA_KEY, RETIRING_CROSS_KEY};
use super::{CA_CERT_KEY, CA_KEY_KEY, Ca, CertError, NODE_CERT_KEY, inspect};
use crate::crd::NodeCatalog;
use crate::reconcile::conditions::BUNDLE_CURRENT;

/// Keys a `kubernetes.io/tls` CA Secret holds the CA in.
const TLS_CERT_KEY: &str = "tls.crt";
const TLS_KEY_KEY: &str = "tls.key";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RotationError {
    #[error(transparent)]
    CaSecret(#[from] CaSecretError),
    #[error("the new CA: {0}")]
    NewCa(CertError),
    #[error("a rotation is already under way: end it first with `iop-operator ca finish`")]
    AlreadyRotating,
    #[error("no rotation is under way: `iop-ca` holds no retiring CA")]
    NotRotating,
    #[error("the new CA is the current CA")]
    SameCa,
    #[error("cross-signing the new CA: {0}")]
    CrossSign(CertError),
}

/// `iop-ca` with `new` as the signer and the current CA retiring: the
/// signer's keys are replaced where the operator reads them (`ca.pem` +
/// `ca-key.pem`, or `tls.crt` + `tls.key`; the Secret's type is kept, as
/// Kubernetes never lets it change), the retiring keys added. The old CA's
/// private key is not kept: the cross-signed certificate is all the overlap
/// needs of it.
pub fn begin(current: &Secret, new: &Ca, now: OffsetDateTime) -> Result<Secret, RotationError> {
    let authority = secrets::load_authority(current, now)?;
    if authority.retiring.is_some() {
        return Err(RotationError::AlreadyRotating);
    }
    let old = authority.signer;
    if old.cert_pem().trim_end() == new.cert_pem().trim_end() {
        return Err(RotationError::SameCa);
    }
    let cross = old.cross_sign(new, now).map_err(RotationError::CrossSign)?;
    let (cert_key, key_key) =
        if secrets::value(current, CA_CERT_KEY).is_some() && secrets::value(current, CA_KEY_KEY).is_some() {
            (CA_CERT_KEY, CA_KEY_KEY)
        } else {
            (TLS_CERT_KEY, TLS_KEY_KEY)
        };
    let key = new.key_pem();
    Ok(rewritten(
        current,
        &[
            (cert_key, Some(new.cert_pem())),
            (key_key, Some(key.expose())),
            (RETIRING_CA_KEY, Some(old.cert_pem())),
            (RETIRING_CROSS_KEY, Some(&cross)),
        ],
    ))
}

/// `iop-ca` without the retiring CA: the overlap ends.
pub fn finish(current: &Secret, now: OffsetDateTime) -> Result<Secret, RotationError> {
    if secrets::load_authority(current, now)?.retiring.is_none() {
        return Err(RotationError::NotRotating);
    }
    Ok(rewritten(current, &[(RETIRING_CA_KEY, None), (RETIRING_CROSS_KEY, None)]))
}

/// `current` with `changes` applied to its data (`None` removes a key);
/// `stringData` (write-only, already folded into `data`) dropped; metadata,
/// its resourceVersion included, kept for the guarded replace.
fn rewritten(current: &Secret, changes: &[(&str, Option<&str>)]) -> Secret {
    let mut secret = current.clone();
    let mut data = secret.data.take().unwrap_or_default();
    for (key, value) in secret.string_data.take().unwrap_or_default() {
        data.insert(key, ByteString(value.into_bytes()));
    }
    for (key, value) in changes {
        match value {
            Some(value) => data.insert(key.to_string(), ByteString(value.as_bytes().to_vec())),
            None => data.remove(*key),
        };
    }
    secret.data = Some(data);
    secret.metadata.managed_fields = None;
    secret
}

/// Why a node would be cut off if the overlap ended now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub node: String,
    pub reason: String,
}

/// The NodeCatalogs whose Macs do not run a bundle of the signer yet: the
/// Secret `iop-node-<name>` is not re-issued by the signer, the status does
/// not show that certificate yet, or the node's sessions do not present it
/// (`BundleCurrent` is not `True`: an older bundle, or not connected).
/// `secret_of` gives a node's Secret, when it exists.
pub fn pending<'a>(
    signer: &Ca,
    nodes: &'a [NodeCatalog],
    secret_of: impl Fn(&str) -> Option<&'a Secret>,
) -> Vec<Pending> {
    let mut pending = Vec::new();
    for node in nodes {
        let name = node.name_any();
        let issued = secret_of(&name).and_then(|s| secrets::value(s, NODE_CERT_KEY));
        let reason = match issued {
            None => Some("no certificate issued yet".to_string()),
            Some(cert) if !signed_by(&cert, signer) => Some("its certificate is not re-issued yet".to_string()),
            Some(cert) => {
                let serial = inspect(&cert).map(|i| i.serial).unwrap_or_default();
                let status = node.status.as_ref();
                let shown = status.and_then(|s| s.certificate.as_ref()).map(|c| c.serial.as_str());
                let condition = status.and_then(|s| s.conditions.iter().find(|c| c.type_ == BUNDLE_CURRENT));
                if shown != Some(serial.as_str()) {
                    Some("its status does not show the re-issued certificate yet".to_string())
                } else {
                    match condition {
                        Some(c) if c.status == "True" => None,
                        Some(c) => Some(format!("{} {}: {}", BUNDLE_CURRENT, c.reason, c.message)),
                        None => Some(format!("no {BUNDLE_CURRENT} condition yet")),
                    }
                }
            }
        };
        if let Some(reason) = reason {
            pending.push(Pending { node: name, reason });
        }
    }
    pending
}

/// Whether the first certificate of `cert_pem` is signed by `ca`.
fn signed_by(cert_pem: &str, ca: &Ca) -> bool {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let der = |pem: &str| CertificateDer::pem_slice_iter(pem.as_bytes()).next().and_then(Result::ok);
    let (Some(cert), Some(ca)) = (der(cert_pem), der(ca.cert_pem())) else { return false };
    let (Ok((_, cert)), Ok((_, ca))) = (X509Certificate::from_der(&cert), X509Certificate::from_der(&ca)) else {
        return false;
    };
    cert.verify_signature(Some(ca.public_key())).is_ok()
}

#[cfg(test)]
mod tests;
