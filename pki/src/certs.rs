//! Certificates, as pure functions: every time is an argument and nothing is
//! read or written. The CA signs the Edge's server certificate and one client
//! certificate per node: a SPIFFE X509-SVID with exactly one URI SAN
//! `spiffe://<trust-domain>/node/<name>`, CA=false, digitalSignature and the
//! clientAuth EKU.
//!
//! Leaf certificates start [`BACKDATE`] before `now` (so a node whose clock
//! runs a little behind accepts them at once) and never outlive their CA.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use iop_proto::identity::NodeIdentity;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData, SanType,
};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use time::OffsetDateTime;

/// How far before `now` a leaf certificate becomes valid.
pub const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// A PEM private key. It never prints: `Debug` and `Display` show `[redacted]`.
#[derive(Clone, PartialEq, Eq)]
pub struct PrivateKeyPem(String);

impl PrivateKeyPem {
    pub fn new(pem: impl Into<String>) -> Self {
        Self(pem.into())
    }

    /// The PEM text, for writing into a Secret or a file with restricted mode.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for PrivateKeyPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for PrivateKeyPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// A certificate and its private key.
#[derive(Debug, Clone)]
pub struct CertifiedKey {
    pub cert_pem: String,
    pub key: PrivateKeyPem,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    #[error("{what}: no PEM certificate that parses as X.509")]
    Certificate { what: &'static str },
    #[error("CA private key: not a PKCS#8 PEM key (\"PRIVATE KEY\") of a supported algorithm")]
    CaKey,
    #[error("CA private key does not belong to the CA certificate")]
    CaKeyMismatch,
    #[error("CA certificate is not a CA (basicConstraints CA=true is missing)")]
    NotACa,
    #[error("CA certificate is not valid at this time (valid {not_before} to {not_after})")]
    CaNotCurrent { not_before: OffsetDateTime, not_after: OffsetDateTime },
    #[error("`{0}` is not a valid DNS name or IP address")]
    InvalidName(String),
    #[error("validity must be at least one minute")]
    Validity,
    #[error("the cross-signed CA certificate does not carry the CA's key, or is not signed by the retiring CA")]
    CrossMismatch,
    #[error("certificate generation failed: {0}")]
    Generate(String),
}

fn generate(e: rcgen::Error) -> CertError {
    CertError::Generate(e.to_string())
}

/// Serial number, validity and names of a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// Lowercase hex, no separators.
    pub serial: String,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
    /// Its subject alternative names ([`san_names`]).
    pub names: Vec<String>,
}

/// Reads the first certificate of a PEM bundle.
pub fn inspect(cert_pem: &str) -> Result<CertInfo, CertError> {
    let der = first_der(cert_pem, "certificate")?;
    let (_, cert) =
        x509_parser::parse_x509_certificate(&der).map_err(|_| CertError::Certificate { what: "certificate" })?;
    let validity = cert.validity();
    Ok(CertInfo {
        serial: cert.tbs_certificate.raw_serial().iter().map(|b| format!("{b:02x}")).collect(),
        not_before: validity.not_before.to_datetime(),
        not_after: validity.not_after.to_datetime(),
        names: san_names(&cert),
    })
}

/// The DNS names, IP addresses and URIs among a certificate's subject
/// alternative names, as text, in the certificate's order (others are
/// skipped).
pub fn san_names(cert: &x509_parser::certificate::X509Certificate<'_>) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok(Some(san)) = cert.subject_alternative_name() else { return Vec::new() };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(d) => Some(d.to_string()),
            GeneralName::URI(u) => Some(u.to_string()),
            GeneralName::IPAddress(b) => match b.len() {
                4 => Some(IpAddr::from(<[u8; 4]>::try_from(*b).ok()?).to_string()),
                16 => Some(IpAddr::from(<[u8; 16]>::try_from(*b).ok()?).to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn first_der(pem: &str, what: &'static str) -> Result<CertificateDer<'static>, CertError> {
    CertificateDer::pem_slice_iter(pem.as_bytes()).next().and_then(Result::ok).ok_or(CertError::Certificate { what })
}

/// When certificates of one kind are issued again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewal {
    /// Lifetime asked for each new certificate (never past the CA's expiry).
    pub validity: Duration,
    /// How long before its expiry a certificate is replaced.
    pub renew_before: Duration,
}

/// Whether a certificate should be replaced at `now`, by one valid until
/// `min(now + validity, ca_not_after)`: when it cannot be read, is not valid
/// yet, or is inside its renewal window (the boundary included) and a
/// replacement would end later than it does.
///
/// A certificate never outlives its CA, so one that already ends with the CA
/// is kept even inside its window (a CA that expires sooner than the window:
/// a user-supplied CA valid for a few days, or a generated one in its last
/// weeks). Replacing it would change nothing; done on every reconcile it was
/// a loop of re-issues. The CA's own expiry is reported separately
/// ([`ca_expiring`]).
pub fn needs_rotation(cert_pem: &str, now: OffsetDateTime, renewal: Renewal, ca_not_after: OffsetDateTime) -> bool {
    let Ok(info) = inspect(cert_pem) else { return true };
    if now < info.not_before {
        return true;
    }
    if now < info.not_after - renewal.renew_before {
        return false;
    }
    // Certificates hold whole seconds: compare in whole seconds, or a CA
    // generated a moment ago (sub-second expiry in memory) looks later.
    let replacement_not_after = (now + renewal.validity).min(ca_not_after).unix_timestamp();
    replacement_not_after > info.not_after.unix_timestamp()
}

/// Whether the CA expires within `window` of `now` (the boundary included):
/// certificates it signs are then cut short at its expiry and cannot be
/// renewed past it. The operator never replaces a CA; it says so
/// (`CAExpiring` condition, `iop_operator_ca_expiring`).
pub fn ca_expiring(ca_not_after: OffsetDateTime, now: OffsetDateTime, window: Duration) -> bool {
    now >= ca_not_after - window
}

/// The certificate authority that signs the Edge and node certificates.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    not_after: OffsetDateTime,
}

impl fmt::Debug for Ca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ca").field("not_after", &self.not_after).field("key", &"[redacted]").finish()
    }
}

fn dn(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

impl Ca {
    /// A new self-signed CA valid from `now` for `validity`. It signs leaf
    /// certificates only (path length 0).
    pub fn generate(common_name: &str, now: OffsetDateTime, validity: Duration) -> Result<Self, CertError> {
        if validity < Duration::from_secs(60) {
            return Err(CertError::Validity);
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        params.not_before = now - BACKDATE;
        params.not_after = now + validity;
        let key = KeyPair::generate().map_err(generate)?;
        let cert = params.self_signed(&key).map_err(generate)?;
        let not_after = params.not_after;
        Ok(Self { issuer: Issuer::new(params, key), cert_pem: cert.pem(), not_after })
    }

    /// A user-supplied CA: the first certificate of `cert_pem` must be a CA
    /// valid at `now`, and the key (PKCS#8 PEM) must be its own.
    pub fn from_pem(cert_pem: &str, key: &PrivateKeyPem, now: OffsetDateTime) -> Result<Self, CertError> {
        let der = first_der(cert_pem, "CA certificate")?;
        let (_, cert) =
            x509_parser::parse_x509_certificate(&der).map_err(|_| CertError::Certificate { what: "CA certificate" })?;
        if !cert.is_ca() {
            return Err(CertError::NotACa);
        }
        let (not_before, not_after) =
            (cert.validity().not_before.to_datetime(), cert.validity().not_after.to_datetime());
        if now < not_before || now >= not_after {
            return Err(CertError::CaNotCurrent { not_before, not_after });
        }
        let key_pair = KeyPair::from_pem(key.expose()).map_err(|_| CertError::CaKey)?;
        if key_pair.subject_public_key_info() != cert.public_key().raw {
            return Err(CertError::CaKeyMismatch);
        }
        let issuer =
            Issuer::from_ca_cert_der(&der, key_pair).map_err(|_| CertError::Certificate { what: "CA certificate" })?;
        // Kept verbatim: a bundle with the CA's own issuers stays a bundle.
        Ok(Self { issuer, cert_pem: cert_pem.to_string(), not_after })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn key_pem(&self) -> PrivateKeyPem {
        PrivateKeyPem(self.issuer.key().serialize_pem())
    }

    pub fn not_after(&self) -> OffsetDateTime {
        self.not_after
    }

    pub(crate) fn key_pair(&self) -> &KeyPair {
        self.issuer.key()
    }

    pub(crate) fn issuer(&self) -> &Issuer<'static, KeyPair> {
        &self.issuer
    }

    fn issue(
        &self,
        mut params: CertificateParams,
        now: OffsetDateTime,
        validity: Duration,
    ) -> Result<CertifiedKey, CertError> {
        if validity < Duration::from_secs(60) {
            return Err(CertError::Validity);
        }
        params.not_before = now - BACKDATE;
        params.not_after = (now + validity).min(self.not_after);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().map_err(generate)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(generate)?;
        Ok(CertifiedKey { cert_pem: cert.pem(), key: PrivateKeyPem(key.serialize_pem()) })
    }

    /// The Edge's server certificate for `names` (DNS names, or IP addresses).
    pub fn edge_server_cert(
        &self,
        names: &[String],
        now: OffsetDateTime,
        validity: Duration,
    ) -> Result<CertifiedKey, CertError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn("iop-edge");
        params.subject_alt_names = names
            .iter()
            .map(|n| match n.parse::<IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => rustls_pki_types::DnsName::try_from(n.as_str())
                    .ok()
                    .and_then(|_| n.as_str().try_into().ok())
                    .map(SanType::DnsName)
                    .ok_or_else(|| CertError::InvalidName(n.clone())),
            })
            .collect::<Result<_, _>>()?;
        if params.subject_alt_names.is_empty() {
            return Err(CertError::InvalidName(String::new()));
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params, now, validity)
    }

    /// A node's client certificate (X509-SVID).
    pub fn node_client_cert(
        &self,
        node: &NodeIdentity,
        now: OffsetDateTime,
        validity: Duration,
    ) -> Result<CertifiedKey, CertError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(&node.name);
        let uri = node.uri().try_into().map_err(|_| CertError::InvalidName(node.uri()))?;
        params.subject_alt_names = vec![SanType::URI(uri)];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params, now, validity)
    }
}

#[cfg(test)]
mod tests;
