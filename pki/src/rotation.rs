//! Replacing a CA with an overlap, as pure functions.
//!
//! Nodes sit on Macs and take a new bundle when their owner installs it, so a
//! new CA cannot be switched to at once: for a while some nodes trust only
//! the old CA and present certificates it signed, others the new one. During
//! that overlap ([`Authority::retiring`] is set):
//!
//! - everything issued is signed by the new CA (the signer);
//! - the trust bundle written beside every certificate (`ca.pem`) holds the
//!   new CA and the old one, so the Edge accepts node certificates of both
//!   and a new bundle accepts an Edge certificate of either;
//! - the Edge serves its certificate followed by the new CA's certificate
//!   *cross-signed* by the old CA ([`Ca::cross_sign`]), so a node that
//!   trusts only the old CA still verifies it (leaf -> new CA, signed by
//!   the old key -> the old CA it trusts).
//!
//! Ending the overlap drops the old CA and the cross-signed certificate;
//! nodes still on an old bundle are then refused (`untrusted_issuer`).

use rcgen::string::{BmpString, UniversalString};
use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, DnValue, IsCa, KeyUsagePurpose};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::x509::X509Name;

use crate::{BACKDATE, Ca, CertError};

/// The CA being replaced, while the overlap lasts: its certificate (still
/// trusted) and the signer's certificate cross-signed by it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retiring {
    pub ca_pem: String,
    pub cross_pem: String,
}

/// The CA that signs, and the one it replaces while a rotation is under way.
#[derive(Debug)]
pub struct Authority {
    pub signer: Ca,
    pub retiring: Option<Retiring>,
}

/// `pem` ending in exactly one newline, so PEM texts concatenate.
fn line(pem: &str) -> String {
    format!("{}\n", pem.trim_end())
}

impl Authority {
    /// No rotation under way.
    pub fn single(signer: Ca) -> Self {
        Self { signer, retiring: None }
    }

    /// Checks that `retiring` belongs to `signer`: its CA parses as a CA and
    /// the cross-signed certificate carries the signer's key, signed by the
    /// retiring CA.
    pub fn rotating(signer: Ca, retiring: Retiring) -> Result<Self, CertError> {
        let old = first_der(&retiring.ca_pem, "retiring CA certificate")?;
        let (_, old) =
            X509Certificate::from_der(&old).map_err(|_| CertError::Certificate { what: "retiring CA certificate" })?;
        if !old.is_ca() {
            return Err(CertError::NotACa);
        }
        let cross = first_der(&retiring.cross_pem, "cross-signed CA certificate")?;
        let (_, cross) = X509Certificate::from_der(&cross)
            .map_err(|_| CertError::Certificate { what: "cross-signed CA certificate" })?;
        let signer_der = first_der(signer.cert_pem(), "CA certificate")?;
        let (_, signer_cert) =
            X509Certificate::from_der(&signer_der).map_err(|_| CertError::Certificate { what: "CA certificate" })?;
        if cross.public_key().raw != signer_cert.public_key().raw
            || cross.verify_signature(Some(old.public_key())).is_err()
        {
            return Err(CertError::CrossMismatch);
        }
        Ok(Self { signer, retiring: Some(retiring) })
    }

    /// What every issued Secret and bundle carries as `ca.pem`: the signer,
    /// then the retiring CA.
    pub fn trust_pem(&self) -> String {
        let mut pem = line(self.signer.cert_pem());
        if let Some(retiring) = &self.retiring {
            pem.push_str(&line(&retiring.ca_pem));
        }
        pem
    }

    /// What the Edge serves: its leaf, then the cross-signed signer while
    /// the overlap lasts.
    pub fn serving_chain(&self, leaf_pem: &str) -> String {
        let mut pem = line(first_pem_block(leaf_pem));
        if let Some(retiring) = &self.retiring {
            pem.push_str(&line(&retiring.cross_pem));
        }
        pem
    }
}

/// The first PEM block of `pem` (a leaf, without the chain after it).
pub fn first_pem_block(pem: &str) -> &str {
    const END: &str = "-----END CERTIFICATE-----";
    pem.find(END).map_or(pem, |at| &pem[..at + END.len()])
}

fn first_der(pem: &str, what: &'static str) -> Result<CertificateDer<'static>, CertError> {
    CertificateDer::pem_slice_iter(pem.as_bytes()).next().and_then(Result::ok).ok_or(CertError::Certificate { what })
}

/// A certificate's subject as rcgen encodes an issuer read from a
/// certificate (`Issuer::from_ca_cert_der`), attribute by attribute with its
/// string type: the cross-signed certificate's subject must equal, byte for
/// byte, the issuer name of the leaves the signer issued, or no verifier
/// links them. rcgen keeps its own conversion private, hence this one.
fn subject_of(name: &X509Name<'_>) -> Result<DistinguishedName, CertError> {
    use x509_parser::der_parser::asn1_rs::Tag;
    let unsupported = || CertError::Certificate { what: "CA certificate subject" };
    let mut dn = DistinguishedName::new();
    for rdn in name.iter() {
        let [attr] = rdn.iter().collect::<Vec<_>>()[..] else { return Err(unsupported()) };
        let oid: Vec<u64> = attr.attr_type().iter().ok_or_else(unsupported)?.collect();
        let data = attr.attr_value().data;
        let text = || std::str::from_utf8(data).map_err(|_| unsupported());
        let value = match attr.attr_value().header.tag() {
            Tag::Utf8String => DnValue::Utf8String(text()?.to_string()),
            Tag::PrintableString => DnValue::PrintableString(text()?.try_into().map_err(|_| unsupported())?),
            Tag::Ia5String => DnValue::Ia5String(text()?.try_into().map_err(|_| unsupported())?),
            Tag::T61String => DnValue::TeletexString(text()?.try_into().map_err(|_| unsupported())?),
            Tag::BmpString => DnValue::BmpString(BmpString::from_utf16be(data.to_vec()).map_err(|_| unsupported())?),
            Tag::UniversalString => {
                DnValue::UniversalString(UniversalString::from_utf32be(data.to_vec()).map_err(|_| unsupported())?)
            }
            _ => return Err(unsupported()),
        };
        dn.push(DnType::from_oid(&oid), value);
    }
    Ok(dn)
}

impl Ca {
    /// `successor`'s certificate signed by this CA: the same subject and
    /// key, so whatever the successor signs also chains to this CA. Valid
    /// from `now` until the earlier of the two CAs' expiries.
    pub fn cross_sign(&self, successor: &Ca, now: OffsetDateTime) -> Result<String, CertError> {
        let der = first_der(successor.cert_pem(), "CA certificate")?;
        let (_, cert) =
            X509Certificate::from_der(&der).map_err(|_| CertError::Certificate { what: "CA certificate" })?;
        let mut params = CertificateParams::default();
        params.distinguished_name = subject_of(cert.subject())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        params.not_before = now - BACKDATE;
        params.not_after = successor.not_after().min(self.not_after());
        params.use_authority_key_identifier_extension = true;
        let cross =
            params.signed_by(successor.key_pair(), self.issuer()).map_err(|e| CertError::Generate(e.to_string()))?;
        Ok(cross.pem())
    }
}

#[cfg(test)]
mod tests;
