//! `iop-operator node-bundle NAME`: what a Mac needs to run `iop-node`, in
//! one directory: `ca.pem`, `node.pem`, `node-key.pem` (mode 0600) and a
//! ready `node.yaml`. [`build`] checks the parts belong together (the
//! certificate is the node's, signed by the CA, matching the key, current);
//! [`Bundle::write`] puts them on disk.

use std::io::Write;
use std::path::{Path, PathBuf};

use iop_proto::identity::NodeIdentity;
use rcgen::{KeyPair, PublicKeyData};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde::Serialize;
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use crate::certs::PrivateKeyPem;

pub const CA_FILE: &str = "ca.pem";
pub const CERT_FILE: &str = "node.pem";
pub const KEY_FILE: &str = "node-key.pem";
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
         # Written by `iop-operator node-bundle {node}` for {identity}.\n\
         # The TLS files are resolved against this file's directory.\n{body}",
        node = input.node,
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
    /// Writes the four files into `dir` (created if missing); the key is
    /// readable by its owner only. Returns the paths written.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>, BundleError> {
        let err = |path: &Path| {
            let path = path.display().to_string();
            move |source| BundleError::Write { path, source }
        };
        std::fs::create_dir_all(dir).map_err(err(dir))?;
        let files = [
            (CA_FILE, self.ca_pem.as_str(), false),
            (CERT_FILE, self.cert_pem.as_str(), false),
            (KEY_FILE, self.key.expose(), true),
            (CONFIG_FILE, self.node_yaml.as_str(), false),
        ];
        let mut written = Vec::with_capacity(files.len());
        for (name, contents, private) in files {
            let path = dir.join(name);
            write_file(&path, contents, private).map_err(err(&path))?;
            written.push(path);
        }
        Ok(written)
    }
}

fn write_file(path: &Path, contents: &str, private: bool) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let mode = if private { 0o600 } else { 0o644 };
        options.mode(mode);
        let mut file = options.open(path)?;
        // An existing file keeps its old mode on open; set it explicitly.
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        file.write_all(contents.as_bytes())
    }
    #[cfg(not(unix))]
    {
        let _ = private;
        options.open(path)?.write_all(contents.as_bytes())
    }
}

#[cfg(test)]
mod tests;
