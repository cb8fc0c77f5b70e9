//! The operator's certificates: the pure certificate code is `iop_pki`'s
//! (shared with `iop-edge pki`); here are the Secrets that hold them
//! ([`secrets`]) and what the operator reports about them ([`status`]).

pub use iop_pki::rotation::{Authority, Retiring};
pub use iop_pki::{
    BACKDATE, Ca, CertError, CertInfo, CertifiedKey, PrivateKeyPem, Renewal, ca_expiring, inspect, needs_rotation,
};

pub mod rotation;
pub mod secrets;
pub mod status;

/// The CA Secret (created if absent; a user-supplied one is accepted).
pub const CA_SECRET: &str = "iop-ca";
pub const CA_CERT_KEY: &str = iop_pki::CA_CERT_FILE;
pub const CA_KEY_KEY: &str = iop_pki::CA_KEY_FILE;

/// The Edge's server certificate Secret, mounted at `/etc/iop/tls`.
pub const EDGE_TLS_SECRET: &str = "iop-edge-tls";
pub const EDGE_CERT_KEY: &str = iop_pki::EDGE_CERT_FILE;
pub const EDGE_KEY_KEY: &str = iop_pki::EDGE_KEY_FILE;

/// Keys of a node's Secret (`iop-node-<name>`); it holds `ca.pem` too.
pub const NODE_CERT_KEY: &str = iop_pki::NODE_CERT_FILE;
pub const NODE_KEY_KEY: &str = iop_pki::NODE_KEY_FILE;

/// Name of the Secret holding a node's certificate, key and CA.
pub fn node_secret_name(node: &str) -> String {
    format!("iop-node-{node}")
}

#[cfg(test)]
mod tests;
