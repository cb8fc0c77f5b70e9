//! Why the node cannot dial the Edge. A module of its own: the dialer and
//! the TLS file reader below it both return it.

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("{field}: cannot read {path}: {source}")]
    ReadTls { field: &'static str, path: String, source: std::io::Error },
    #[error("edge endpoint: {0}")]
    Endpoint(String),
    #[error("cannot connect to the edge: {0}")]
    Connect(String),
}
