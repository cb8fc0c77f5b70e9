//! IOP's certificates, in one place for the operator (which keeps them in
//! Secrets) and for `iop-edge pki` (which keeps them in a directory, for an
//! Edge without Kubernetes).
//!
//! - [`Ca`] and the certificates it issues, as pure functions: every time
//!   is an argument and nothing is read or written; [`inspect`],
//!   [`needs_rotation`] and [`ca_expiring`] judge existing certificates.
//! - [`bundle`]: what a node needs (`ca.pem`, `node.pem`, `node-key.pem`,
//!   `node.yaml`), checked to belong together.
//! - [`files`]: writing them, private keys readable by their owner only.
//! - [`rotation`]: replacing the CA with an overlap (both trusted, the new
//!   one cross-signed by the old).
//!
//! Private keys live in [`PrivateKeyPem`], which never prints.

use std::time::Duration;

pub mod bundle;
mod certs;
pub mod files;
pub mod rotation;

pub use certs::*;

/// File names of the certificates and keys: the same in a directory
/// written by `iop-edge pki`, in a node bundle and as keys of the
/// operator's Secrets.
pub const CA_CERT_FILE: &str = "ca.pem";
pub const CA_KEY_FILE: &str = "ca-key.pem";
pub const EDGE_CERT_FILE: &str = "edge.pem";
pub const EDGE_KEY_FILE: &str = "edge-key.pem";
pub const NODE_CERT_FILE: &str = "node.pem";
pub const NODE_KEY_FILE: &str = "node-key.pem";

const DAY: u64 = 86_400;

/// Lifetime of a generated CA.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * DAY);
/// Lifetime of the Edge server certificate, and how long before its expiry
/// a new one is issued.
pub const EDGE_VALIDITY: Duration = Duration::from_secs(90 * DAY);
pub const EDGE_RENEW_BEFORE: Duration = Duration::from_secs(30 * DAY);
/// Both, as the Edge certificate's [`Renewal`].
pub const EDGE_RENEWAL: Renewal = Renewal { validity: EDGE_VALIDITY, renew_before: EDGE_RENEW_BEFORE };
/// Lifetime of a node certificate, and how long before its expiry a new
/// one is issued (the defaults of a NodeCatalog's `certificate`).
pub const NODE_VALIDITY: Duration = Duration::from_secs(30 * DAY);
pub const NODE_RENEW_BEFORE: Duration = Duration::from_secs(10 * DAY);
