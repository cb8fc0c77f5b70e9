//! Why the node cannot dial the Edge. A module of its own: the dialer and
//! the TLS file reader below it both return it.

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("{field}: cannot read {path}: {source}")]
    ReadTls { field: &'static str, path: String, source: std::io::Error },
    #[error("edge endpoint: {0}")]
    Endpoint(String),
    /// The TLS files were read but hold no usable CA, certificate or key.
    #[error(transparent)]
    Tls(#[from] ClientConfigError),
    #[error("cannot connect to the edge: {0}")]
    Connect(String),
    /// The Edge refused the handshake; the reason its TLS alert gave.
    #[error("{0}")]
    Refused(super::refusal::Refusal),
    /// This node refused the Edge's certificate; why.
    #[error("{0}")]
    EdgeDistrusted(super::refusal::EdgeDistrust),
}

/// Why [`super::tls::client_config`] could not be built (never quotes key material).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClientConfigError {
    #[error("tls.ca_file holds no PEM certificate")]
    NoCaCertificate,
    #[error("tls.cert_file holds no PEM certificate")]
    NoCertificate,
    #[error("tls.key_file holds no PEM private key")]
    NoKey,
    #[error("tls.cert_file and tls.key_file: {0}")]
    Identity(rustls::Error),
}
