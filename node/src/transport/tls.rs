//! The node's TLS material (`tls.*` of the config): the one place that reads
//! those files and decodes them, used by the [`Dialer`](super::Dialer) and
//! by `iop-node doctor`.
//!
//! [`client_config`] is the one rustls client config the node dials the Edge
//! with (`super::connect`, which does the TLS itself to read the Edge's
//! refusal alerts) and the doctor's handshake: roots = `tls.ca_file` only,
//! client auth = `tls.cert_file` + `tls.key_file`, ALPN `h2`, ring, safe
//! default protocol versions.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use zeroize::Zeroizing;

pub use super::error::ClientConfigError;
use super::error::TransportError;
use crate::config::NodeTlsConfig;

/// The ALPN protocol the node speaks to the Edge (gRPC over HTTP/2).
pub const ALPN_H2: &[u8] = b"h2";

/// A private key file's bytes: zeroized on drop, never printed.
pub struct KeyPem(Zeroizing<Vec<u8>>);

impl KeyPem {
    pub fn new(bytes: Vec<u8>) -> Self {
        Self(Zeroizing::new(bytes))
    }

    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for KeyPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyPem([redacted])")
    }
}

/// The three `tls.*` files as read.
#[derive(Debug)]
pub struct TlsFiles {
    pub ca: Vec<u8>,
    pub cert: Vec<u8>,
    pub key: KeyPem,
}

impl TlsFiles {
    /// Reads `tls.ca_file`, `tls.cert_file` and `tls.key_file`; the first
    /// that cannot be read is the error, naming its field and path.
    pub fn read(tls: &NodeTlsConfig) -> Result<Self, TransportError> {
        Ok(Self {
            ca: read_file("tls.ca_file", &tls.ca_file)?,
            cert: read_file("tls.cert_file", &tls.cert_file)?,
            key: KeyPem::new(read_file("tls.key_file", &tls.key_file)?),
        })
    }
}

/// Reads one TLS file; the error names the config field and the path.
pub fn read_file(field: &'static str, path: &Path) -> Result<Vec<u8>, TransportError> {
    std::fs::read(path).map_err(|source| TransportError::ReadTls { field, path: path.display().to_string(), source })
}

/// Every PEM `CERTIFICATE` block in `pem` (other blocks are skipped, as tonic does).
pub fn parse_certs(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem).filter_map(Result::ok).collect()
}

/// The first PEM private key (PKCS#8, PKCS#1 or SEC1) in `pem`.
pub fn parse_key(key: &KeyPem) -> Option<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(key.expose()).ok()
}

/// The rustls client config the node dials the Edge with (see the module
/// docs). rustls refuses a key that does not match the certificate.
pub fn client_config(files: &TlsFiles) -> Result<rustls::ClientConfig, ClientConfigError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(parse_certs(&files.ca));
    if added == 0 {
        return Err(ClientConfigError::NoCaCertificate);
    }
    let chain = parse_certs(&files.cert);
    if chain.is_empty() {
        return Err(ClientConfigError::NoCertificate);
    }
    let key = parse_key(&files.key).ok_or(ClientConfigError::NoKey)?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(ClientConfigError::Identity)?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(ClientConfigError::Identity)?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests;
