//! A node bundle: what a Mac needs to run `iop-node`, in one directory:
//! `ca.pem`, `node.pem`, `node-key.pem` (mode 0600) and a ready
//! `node.yaml`. `iop-operator node-bundle NAME` writes one from the node's
//! Secret, `iop-edge pki node NAME` from a CA of its own. [`build`] checks
//! the parts belong together (the certificate is the node's, signed by the
//! CA, matching the key, current); [`Bundle::write`] puts them on disk.

use std::path::{Path, PathBuf};

use iop_proto::identity::NodeIdentity;
use rcgen::{KeyPair, PublicKeyData};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde::Serialize;
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use crate::PrivateKeyPem;
use crate::files::{self, Access};

pub const CA_FILE: &str = crate::CA_CERT_FILE;
pub const CERT_FILE: &str = crate::NODE_CERT_FILE;
pub const KEY_FILE: &str = crate::NODE_KEY_FILE;
pub const CONFIG_FILE: &str = "node.yaml";

/// The parts of a bundle, as read from the node's Secret or from files.
pub struct Input<'a> {
    pub node: &'a str,
    /// The Edge's node-facing gRPC endpoint, `https://HOST[:PORT]`.
    pub edge_url: &'a str,
    /// Name on the Edge's certificate when it differs from the URL's host.
    pub server_name: Option<&'a str>,
    pub ca_pem: &'a str,
    pub cert_pem: &'a str,
    pub key: &'a PrivateKeyPem,
    /// The command that makes the bundle, named in `node.yaml`'s header
    /// (`iop-operator node-bundle NAME`).
    pub written_by: &'a str,
}

#[derive(Debug)]
pub struct Bundle {
    pub identity: NodeIdentity,
    pub not_after: OffsetDateTime,
    pub ca_pem: String,
    pub cert_pem: String,
    pub key: PrivateKeyPem,
    pub node_yaml: String,
}

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("node name: {0}")]
    Name(#[from] iop_proto::identity::IdentityError),
    #[error("--edge-url `{0}` must be https://HOST[:PORT]")]
    EdgeUrl(String),
    #[error("{what}: no PEM certificate that parses as X.509")]
    Certificate { what: &'static str },
    #[error("node certificate must carry exactly one spiffe://<trust-domain>/node/<name> URI SAN")]
    Identity,
    #[error("node certificate belongs to node `{found}`, not `{expected}`")]
    WrongNode { expected: String, found: String },
    #[error("node certificate is not signed by the given CA")]
    NotSignedByCa,
    #[error("private key is not a PKCS#8 PEM key, or does not belong to the node certificate")]
    KeyMismatch,
    #[error("node certificate is not valid now (valid {not_before} to {not_after})")]
    NotCurrent { not_before: OffsetDateTime, not_after: OffsetDateTime },
    #[error("cannot write {path}: {source}")]
    Write { path: String, source: std::io::Error },
}

#[derive(Serialize)]
struct NodeYaml<'a> {
    edge: EdgeYaml<'a>,
    tls: TlsYaml,
}

#[derive(Serialize)]
struct EdgeYaml<'a> {
    url: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    server_name: Option<&'a str>,
}

#[derive(Serialize)]
struct TlsYaml {
    ca_file: &'static str,
    cert_file: &'static str,
    key_file: &'static str,
}

fn parse<'a>(der: &'a CertificateDer<'a>, what: &'static str) -> Result<X509Certificate<'a>, BundleError> {
    X509Certificate::from_der(der).map(|(_, c)| c).map_err(|_| BundleError::Certificate { what })
}

fn first_der(pem: &str, what: &'static str) -> Result<CertificateDer<'static>, BundleError> {
    CertificateDer::pem_slice_iter(pem.as_bytes()).next().and_then(Result::ok).ok_or(BundleError::Certificate { what })
}

/// Checks the parts and renders `node.yaml` (pure).
pub fn build(input: &Input<'_>, now: OffsetDateTime) -> Result<Bundle, BundleError> {
    iop_proto::identity::validate_name(input.node)?;
    let host = input.edge_url.strip_prefix("https://").and_then(|rest| rest.split('/').next());
    if host.is_none_or(|h| h.is_empty() || h.starts_with(':')) || input.edge_url.chars().any(char::is_whitespace) {
        return Err(BundleError::EdgeUrl(input.edge_url.to_string()));
    }

    let cert_der = first_der(input.cert_pem, "node certificate")?;
    let cert = parse(&cert_der, "node certificate")?;
    let uris: Vec<&str> = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::URI(uri) => Some(*uri),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let [uri] = uris.as_slice() else {
        return Err(BundleError::Identity);
    };
    let identity = NodeIdentity::parse(uri).map_err(|_| BundleError::Identity)?;
    if identity.name != input.node {
        return Err(BundleError::WrongNode { expected: input.node.to_string(), found: identity.name });
    }

    let ca_der = first_der(input.ca_pem, "CA certificate")?;
    let ca = parse(&ca_der, "CA certificate")?;
    cert.verify_signature(Some(ca.public_key())).map_err(|_| BundleError::NotSignedByCa)?;

    let key = KeyPair::from_pem(input.key.expose()).map_err(|_| BundleError::KeyMismatch)?;
    if key.subject_public_key_info() != cert.public_key().raw {
        return Err(BundleError::KeyMismatch);
    }

    let (not_before, not_after) = (cert.validity().not_before.to_datetime(), cert.validity().not_after.to_datetime());
    if now < not_before || now >= not_after {
        return Err(BundleError::NotCurrent { not_before, not_after });
    }

    let doc = NodeYaml {
        edge: EdgeYaml { url: input.edge_url, server_name: input.server_name },
        tls: TlsYaml { ca_file: CA_FILE, cert_file: CERT_FILE, key_file: KEY_FILE },
    };
    let node_yaml = format!(
        "# iop-node --config {CONFIG_FILE}\n\
         # Written by `{written_by}` for {identity}.\n\
         # The TLS files are resolved against this file's directory.\n{body}",
        written_by = input.written_by,
        body = serde_saphyr::to_string(&doc).expect("the node config always serializes"),
    );
    Ok(Bundle {
        identity,
        not_after,
        ca_pem: input.ca_pem.to_string(),
        cert_pem: input.cert_pem.to_string(),
        key: input.key.clone(),
        node_yaml,
    })
}

impl Bundle {
    /// Writes the four files into `dir` (created if missing, its owner's
    /// only); the key is readable by its owner only. Each file is replaced
    /// whole ([`files::write`]). Returns the paths written.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>, BundleError> {
        let err = |path: &Path| {
            let path = path.display().to_string();
            move |source| BundleError::Write { path, source }
        };
        files::create_private_dir(dir).map_err(err(dir))?;
        let parts = [
            (CA_FILE, self.ca_pem.as_str(), Access::Public),
            (CERT_FILE, self.cert_pem.as_str(), Access::Public),
            (KEY_FILE, self.key.expose(), Access::Private),
            (CONFIG_FILE, self.node_yaml.as_str(), Access::Public),
        ];
        let mut written = Vec::with_capacity(parts.len());
        for (name, contents, access) in parts {
            let path = dir.join(name);
            files::write(&path, contents, access).map_err(err(&path))?;
            written.push(path);
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests;
