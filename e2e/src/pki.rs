//! A throwaway development PKI (rcgen): one CA, the Edge's server
//! certificate and SPIFFE node client certificates. Used by `iop-dev`, the
//! end-to-end tests and the benchmark; production certificates come from the
//! operator.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use iop_proto::identity::NodeIdentity;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

/// A certificate and its private key, PEM-encoded.
pub struct CertPair {
    pub cert_pem: String,
    pub key_pem: String,
}

/// When a leaf certificate is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// Valid from an hour ago for 30 days.
    Current,
    /// Expired an hour ago.
    Expired,
    /// Valid from an hour ago until this instant (a certificate that
    /// expires while a test runs; X.509 keeps whole seconds).
    Until(OffsetDateTime),
}

pub struct DevCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

fn dn(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

impl DevCa {
    pub fn new(common_name: &str) -> Self {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::hours(1);
        params.not_after = now + Duration::days(365);
        let key = KeyPair::generate().expect("generating a CA key");
        Self { issuer: CertifiedIssuer::self_signed(params, key).expect("self-signing the dev CA") }
    }

    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    fn issue(&self, mut params: CertificateParams, validity: Validity) -> CertPair {
        let now = OffsetDateTime::now_utc();
        (params.not_before, params.not_after) = match validity {
            Validity::Current => (now - Duration::hours(1), now + Duration::days(30)),
            Validity::Expired => (now - Duration::days(2), now - Duration::hours(1)),
            Validity::Until(not_after) => (now - Duration::hours(1), not_after),
        };
        params.is_ca = IsCa::NoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().expect("generating a leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("signing a leaf certificate");
        CertPair { cert_pem: cert.pem(), key_pem: key.serialize_pem() }
    }

    /// The Edge's gRPC server certificate for `dns_names` and loopback.
    pub fn server_cert(&self, dns_names: &[&str]) -> CertPair {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn("iop-edge");
        params.subject_alt_names = dns_names
            .iter()
            .map(|n| SanType::DnsName((*n).try_into().expect("valid DNS name")))
            .chain([SanType::IpAddress(IpAddr::from([127, 0, 0, 1]))])
            .collect();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params, Validity::Current)
    }

    /// A node client certificate (X509-SVID): exactly one URI SAN.
    pub fn node_cert(&self, identity: &NodeIdentity, validity: Validity) -> CertPair {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(&identity.name);
        params.subject_alt_names = vec![SanType::URI(identity.uri().try_into().expect("valid URI"))];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params, validity)
    }
}

/// Paths of a written certificate pair.
#[derive(Debug, Clone)]
pub struct PairFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertPair {
    pub fn write(&self, dir: &Path, stem: &str) -> std::io::Result<PairFiles> {
        let files = PairFiles { cert: dir.join(format!("{stem}.pem")), key: dir.join(format!("{stem}-key.pem")) };
        std::fs::write(&files.cert, &self.cert_pem)?;
        write_private(&files.key, &self.key_pem)?;
        Ok(files)
    }
}

fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(0o600);
    options.open(path)?.write_all(contents.as_bytes())
}
