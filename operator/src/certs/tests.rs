use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, RootCertStore};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use super::*;

/// 2026-11-01T12:00:00Z
const NOW: OffsetDateTime = match OffsetDateTime::from_unix_timestamp(1_793_534_400) {
    Ok(t) => t,
    Err(_) => panic!(),
};
const DAY: Duration = Duration::from_secs(86_400);

fn ca() -> Ca {
    Ca::generate("iop test CA", NOW, 3650 * DAY).unwrap()
}

fn node_id(name: &str) -> NodeIdentity {
    NodeIdentity::new("iop.example", name).unwrap()
}

fn der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

fn unix(t: OffsetDateTime) -> UnixTime {
    UnixTime::since_unix_epoch(Duration::from_secs(t.unix_timestamp() as u64))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(ca_pem: &str) -> Arc<RootCertStore> {
    let mut roots = RootCertStore::empty();
    roots.add(der(ca_pem)).unwrap();
    Arc::new(roots)
}

/// The Edge's check of a node certificate (`edge/src/node/tls.rs` builds the same verifier).
fn verify_client(ca_pem: &str, cert_pem: &str, at: OffsetDateTime) -> Result<(), rustls::Error> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca_pem), provider()).build().unwrap();
    verifier.verify_client_cert(&der(cert_pem), &[], unix(at)).map(|_| ())
}

fn verify_server(ca_pem: &str, cert_pem: &str, name: &str, at: OffsetDateTime) -> Result<(), rustls::Error> {
    let verifier = WebPkiServerVerifier::builder_with_provider(roots(ca_pem), provider()).build().unwrap();
    let name = ServerName::try_from(name.to_string()).unwrap();
    verifier.verify_server_cert(&der(cert_pem), &[], &name, &[], unix(at)).map(|_| ())
}

#[test]
fn node_certificate_chains_to_the_ca() {
    let ca = ca();
    let node = ca.node_client_cert(&node_id("studio-mac"), NOW, 30 * DAY).unwrap();
    verify_client(ca.cert_pem(), &node.cert_pem, NOW).unwrap();

    let other = Ca::generate("another CA", NOW, 3650 * DAY).unwrap();
    assert!(matches!(
        verify_client(other.cert_pem(), &node.cert_pem, NOW),
        Err(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer | CertificateError::BadSignature))
    ));
}

#[test]
fn node_certificate_is_an_x509_svid() {
    let ca = ca();
    let node = ca.node_client_cert(&node_id("studio-mac"), NOW, 30 * DAY).unwrap();
    let der = der(&node.cert_pem);
    let (_, cert) = X509Certificate::from_der(&der).unwrap();

    let san = cert.subject_alternative_name().unwrap().unwrap();
    assert_eq!(
        san.value.general_names,
        [GeneralName::URI("spiffe://iop.example/node/studio-mac")],
        "exactly one URI SAN"
    );

    let bc = cert.basic_constraints().unwrap().expect("basicConstraints present");
    assert!(!bc.value.ca && bc.value.path_len_constraint.is_none());

    let ku = cert.key_usage().unwrap().expect("keyUsage present");
    assert!(ku.critical, "keyUsage is critical");
    assert!(ku.value.digital_signature() && !ku.value.key_cert_sign() && !ku.value.crl_sign());

    let eku = cert.extended_key_usage().unwrap().expect("extendedKeyUsage present");
    assert!(eku.value.client_auth && !eku.value.server_auth);
}

#[test]
fn validity_starts_backdated_and_never_outlives_the_ca() {
    let ca = ca();
    let node = ca.node_client_cert(&node_id("mac"), NOW, 30 * DAY).unwrap();
    let info = inspect(&node.cert_pem).unwrap();
    assert_eq!(info.not_before, NOW - BACKDATE);
    assert_eq!(info.not_after, NOW + 30 * DAY);
    verify_client(ca.cert_pem(), &node.cert_pem, NOW - BACKDATE).unwrap();
    assert!(matches!(
        verify_client(ca.cert_pem(), &node.cert_pem, NOW + 30 * DAY + Duration::from_secs(1)),
        Err(rustls::Error::InvalidCertificate(CertificateError::Expired | CertificateError::ExpiredContext { .. }))
    ));

    let short_ca = Ca::generate("short", NOW, 10 * DAY).unwrap();
    let node = short_ca.node_client_cert(&node_id("mac"), NOW, 30 * DAY).unwrap();
    assert_eq!(inspect(&node.cert_pem).unwrap().not_after, short_ca.not_after());

    assert_eq!(ca.node_client_cert(&node_id("mac"), NOW, Duration::from_secs(59)).unwrap_err(), CertError::Validity);
}

#[test]
fn rotation_window_boundaries() {
    let ca = ca();
    let node = ca.node_client_cert(&node_id("mac"), NOW, 30 * DAY).unwrap();
    let renew_before = 10 * DAY;
    let due = NOW + 20 * DAY;
    let second = Duration::from_secs(1);
    assert!(!needs_rotation(&node.cert_pem, NOW, renew_before));
    assert!(!needs_rotation(&node.cert_pem, due - second, renew_before));
    assert!(needs_rotation(&node.cert_pem, due, renew_before), "the boundary itself rotates");
    assert!(needs_rotation(&node.cert_pem, NOW + 31 * DAY, renew_before), "expired");
    assert!(needs_rotation(&node.cert_pem, NOW - BACKDATE - second, renew_before), "not valid yet");
    assert!(!needs_rotation(&node.cert_pem, NOW + 30 * DAY - second, Duration::ZERO));
    assert!(needs_rotation("not a certificate", NOW, renew_before), "unreadable");
}

#[test]
fn edge_server_certificate_verifies_for_its_names() {
    let ca = ca();
    let names = vec!["iop-edge.iop.svc".to_string(), "iop.example.com".to_string(), "10.0.0.7".to_string()];
    let edge = ca.edge_server_cert(&names, NOW, 90 * DAY).unwrap();
    verify_server(ca.cert_pem(), &edge.cert_pem, "iop.example.com", NOW).unwrap();
    verify_server(ca.cert_pem(), &edge.cert_pem, "iop-edge.iop.svc", NOW).unwrap();
    verify_server(ca.cert_pem(), &edge.cert_pem, "10.0.0.7", NOW).unwrap();
    assert!(verify_server(ca.cert_pem(), &edge.cert_pem, "elsewhere.example.com", NOW).is_err());

    let edge_der = der(&edge.cert_pem);
    let (_, cert) = X509Certificate::from_der(&edge_der).unwrap();
    assert!(cert.extended_key_usage().unwrap().unwrap().value.server_auth);
    assert!(!cert.is_ca());

    assert!(matches!(ca.edge_server_cert(&["bad name!".to_string()], NOW, DAY), Err(CertError::InvalidName(_))));
    assert!(matches!(ca.edge_server_cert(&[], NOW, DAY), Err(CertError::InvalidName(_))));
}

#[test]
fn a_stored_ca_loads_and_keeps_signing() {
    let ca = ca();
    let loaded = Ca::from_pem(ca.cert_pem(), &ca.key_pem(), NOW + DAY).unwrap();
    assert_eq!(loaded.cert_pem(), ca.cert_pem());
    assert_eq!(loaded.not_after(), ca.not_after());
    let node = loaded.node_client_cert(&node_id("mac"), NOW + DAY, 30 * DAY).unwrap();
    verify_client(ca.cert_pem(), &node.cert_pem, NOW + DAY).unwrap();
}

#[test]
fn a_user_supplied_ca_is_checked() {
    let ca = ca();
    let other = Ca::generate("other", NOW, DAY * 365).unwrap();
    assert_eq!(Ca::from_pem(ca.cert_pem(), &other.key_pem(), NOW).unwrap_err(), CertError::CaKeyMismatch);
    assert_eq!(Ca::from_pem(ca.cert_pem(), &PrivateKeyPem::new("garbage"), NOW).unwrap_err(), CertError::CaKey);
    assert!(matches!(Ca::from_pem("garbage", &ca.key_pem(), NOW), Err(CertError::Certificate { .. })));
    assert!(matches!(
        Ca::from_pem(ca.cert_pem(), &ca.key_pem(), NOW + 3651 * DAY),
        Err(CertError::CaNotCurrent { .. })
    ));

    // A leaf is not a CA, even with its own key.
    let leaf = ca.node_client_cert(&node_id("mac"), NOW, DAY).unwrap();
    assert_eq!(Ca::from_pem(&leaf.cert_pem, &leaf.key, NOW).unwrap_err(), CertError::NotACa);
}

#[test]
fn private_keys_never_print() {
    let ca = ca();
    let node = ca.node_client_cert(&node_id("mac"), NOW, DAY).unwrap();
    assert!(node.key.expose().contains("PRIVATE KEY"));
    for shown in [format!("{:?}", node.key), node.key.to_string(), format!("{node:?}"), format!("{ca:?}")] {
        assert!(!shown.contains("PRIVATE KEY") && !shown.contains(node.key.expose()), "{shown}");
    }
    assert_eq!(node.key.to_string(), "[redacted]");
    assert!(format!("{node:?}").contains("[redacted]"));
}

#[test]
fn serials_are_hex_and_distinct() {
    let ca = ca();
    let a = inspect(&ca.node_client_cert(&node_id("mac"), NOW, DAY).unwrap().cert_pem).unwrap();
    let b = inspect(&ca.node_client_cert(&node_id("mac"), NOW, DAY).unwrap().cert_pem).unwrap();
    assert_ne!(a.serial, b.serial);
    assert!(a.serial.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()) && !a.serial.is_empty());
    assert_eq!(node_secret_name("studio-mac"), "iop-node-studio-mac");
}
