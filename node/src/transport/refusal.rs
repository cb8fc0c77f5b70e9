//! Why the Edge refused this node, as far as the node can learn it: the TLS
//! alert the Edge ends a refused handshake with. The Edge decides inside the
//! handshake and sends the most specific alert it has (`certificate_expired`,
//! `unknown_ca`, `access_denied`, ...); it logs and counts its own, finer
//! reason (`iop_edge_node_handshake_rejections_total{reason}`). One
//! definition for the supervisor's log and `iop-node doctor`.

use std::error::Error;
use std::fmt;
use std::io;

use rustls::{AlertDescription, CertificateError};

/// The two ways to get a node bundle (`ca.pem`, `node.pem`, `node-key.pem`,
/// `node.yaml`), named by every fix that points to a fresh one.
pub const BUNDLE_SOURCES: &str = "`iop-operator node-bundle NODE ...` where the Edge runs in Kubernetes, \
                                  `iop-edge pki node NODE ...` on the machine of a standalone Edge \
                                  (docs/standalone.md)";

/// A refusal of the Edge, by the alert it sent. Closed: an alert this node
/// does not map is [`Refusal::Other`], with the alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `certificate_expired`: the certificate's notAfter is past.
    Expired,
    /// `certificate_expired` for a certificate whose notBefore is still
    /// ahead by this machine's clock (TLS has one alert for both).
    NotYetValid,
    /// `unknown_ca`, `decrypt_error`: not signed by a CA the Edge trusts.
    UntrustedIssuer,
    /// `certificate_revoked`.
    Revoked,
    /// `access_denied`: a valid certificate of an identity this Edge does
    /// not admit (not listed in its config, or of another trust domain).
    NotAdmitted,
    /// `bad_certificate`, `unsupported_certificate`, `certificate_unknown`:
    /// not a node certificate the Edge accepts.
    BadCertificate,
    /// `certificate_required`: the node presented no certificate.
    NoClientCertificate,
    /// Any other alert.
    Other(AlertDescription),
}

impl Refusal {
    /// The refusal `alert` says. `not_before` (Unix seconds) of the
    /// certificate this node presented, when known, tells a certificate not
    /// valid yet at `now` from an expired one.
    pub fn from_alert(alert: AlertDescription, not_before: Option<i64>, now: i64) -> Self {
        use AlertDescription as A;
        match alert {
            A::CertificateExpired if not_before.is_some_and(|start| start > now) => Self::NotYetValid,
            A::CertificateExpired => Self::Expired,
            A::UnknownCA | A::DecryptError => Self::UntrustedIssuer,
            A::CertificateRevoked => Self::Revoked,
            A::AccessDenied => Self::NotAdmitted,
            A::BadCertificate | A::UnsupportedCertificate | A::CertificateUnknown => Self::BadCertificate,
            A::CertificateRequired => Self::NoClientCertificate,
            other => Self::Other(other),
        }
    }

    /// The log field's value (`refused = "expired"`).
    pub fn label(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::UntrustedIssuer => "untrusted_issuer",
            Self::Revoked => "revoked",
            Self::NotAdmitted => "not_admitted",
            Self::BadCertificate => "bad_certificate",
            Self::NoClientCertificate => "no_client_certificate",
            Self::Other(_) => "tls_alert",
        }
    }

    /// What the Edge refused, and why.
    pub fn what(self) -> String {
        let certificate = "the Edge refused this node's certificate";
        match self {
            Self::Expired => format!("{certificate}: it has expired"),
            Self::NotYetValid => format!("{certificate}: it is not valid yet"),
            Self::UntrustedIssuer => format!(
                "{certificate}: it is not signed by the CA the Edge trusts (a bundle of another Edge, or of a CA \
                 since replaced)"
            ),
            Self::Revoked => format!("{certificate}: it was revoked"),
            Self::NotAdmitted => "the Edge refused this node's identity: its config does not list this node, or the \
                                  certificate is of another trust domain"
                .to_string(),
            Self::BadCertificate => format!(
                "{certificate}: it is not a node certificate (exactly one spiffe://<trust-domain>/node/<name> URI \
                 SAN, for client authentication)"
            ),
            Self::NoClientCertificate => "the Edge refused this node: it presented no client certificate".to_string(),
            Self::Other(alert) => format!("the Edge refused this node's connection with the TLS alert {alert:?}"),
        }
    }

    /// What to do about it.
    pub fn fix(self) -> String {
        let new_bundle = format!(
            "make a new bundle ({BUNDLE_SOURCES}), install its node.pem and node-key.pem as tls.cert_file and \
             tls.key_file, and restart iop-node"
        );
        match self {
            Self::Expired | Self::Revoked | Self::BadCertificate | Self::UntrustedIssuer => new_bundle,
            Self::NotYetValid => "check the clocks of this machine and of the Edge".to_string(),
            Self::NotAdmitted => format!(
                "list the node in the Edge config (a NodeCatalog named after it); if it is listed, the bundle is \
                 another Edge's: {new_bundle}"
            ),
            Self::NoClientCertificate => {
                "set tls.cert_file and tls.key_file to this node's certificate and key".to_string()
            }
            Self::Other(_) => "the Edge logs `node connection refused` with the reason".to_string(),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; {}", self.what(), self.fix())
    }
}

/// Why this node does not trust the Edge's certificate (its own check of
/// the server, not the Edge's refusal). Closed, like [`Refusal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeDistrust {
    /// Not signed by a CA in `tls.ca_file`.
    UntrustedIssuer,
    /// Its notAfter is past.
    Expired,
    /// Its notBefore is ahead.
    NotYetValid,
    /// Not a certificate for the name this node dials.
    WrongName,
    /// Anything else rustls refused in it.
    Other,
}

impl EdgeDistrust {
    fn from_error(error: &CertificateError) -> Self {
        use CertificateError as E;
        match error {
            E::UnknownIssuer | E::BadSignature => Self::UntrustedIssuer,
            E::Expired | E::ExpiredContext { .. } => Self::Expired,
            E::NotValidYet | E::NotValidYetContext { .. } => Self::NotYetValid,
            E::NotValidForName | E::NotValidForNameContext { .. } => Self::WrongName,
            _ => Self::Other,
        }
    }

    /// The log field's value (`edge_certificate = "untrusted_issuer"`).
    pub fn label(self) -> &'static str {
        match self {
            Self::UntrustedIssuer => "untrusted_issuer",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::WrongName => "wrong_name",
            Self::Other => "invalid",
        }
    }
}

impl fmt::Display for EdgeDistrust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let certificate = "this node does not trust the Edge's certificate";
        match self {
            Self::UntrustedIssuer => write!(
                f,
                "{certificate}: it is not signed by a CA in tls.ca_file (the Edge's CA was replaced and the \
                 rotation has ended, or the bundle is another Edge's); make a new bundle ({BUNDLE_SOURCES}) and \
                 restart iop-node"
            ),
            Self::Expired | Self::NotYetValid => write!(
                f,
                "{certificate}: it is {} by this machine's clock; check the clocks of this machine and of the Edge \
                 (the operator renews the Edge's certificate 30 days before it expires)",
                if *self == Self::Expired { "expired" } else { "not valid yet" }
            ),
            Self::WrongName => write!(
                f,
                "{certificate}: it is not for the name this node dials; set edge.server_name to a name on it (a \
                 node bundle sets it)"
            ),
            Self::Other => write!(f, "{certificate}; make a new bundle ({BUNDLE_SOURCES})"),
        }
    }
}

/// Why this node refused the Edge's certificate, anywhere in `err`'s chain.
pub fn edge_distrust_in(err: &(dyn Error + 'static)) -> Option<EdgeDistrust> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(rustls::Error::InvalidCertificate(cert)) = e.downcast_ref::<rustls::Error>() {
            return Some(EdgeDistrust::from_error(cert));
        }
        if let Some(found) =
            e.downcast_ref::<io::Error>().and_then(io::Error::get_ref).and_then(|inner| edge_distrust_in(inner))
        {
            return Some(found);
        }
        next = e.source();
    }
    None
}

/// The alert the peer ended the connection with, anywhere in `err`'s chain.
pub fn alert_in(err: &(dyn Error + 'static)) -> Option<AlertDescription> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(rustls::Error::AlertReceived(alert)) = e.downcast_ref::<rustls::Error>() {
            return Some(*alert);
        }
        // An io::Error's `source` is the source of the error it wraps,
        // skipping that error (rustls's, in tokio-rustls's I/O errors).
        if let Some(alert) =
            e.downcast_ref::<io::Error>().and_then(io::Error::get_ref).and_then(|inner| alert_in(inner))
        {
            return Some(alert);
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests;
