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
    let renewal = Renewal { validity: 30 * DAY, renew_before: 10 * DAY };
    let due = NOW + 20 * DAY;
    let second = Duration::from_secs(1);
    let rotates = |pem: &str, at: OffsetDateTime, renewal: Renewal| needs_rotation(pem, at, renewal, ca.not_after());
    assert!(!rotates(&node.cert_pem, NOW, renewal));
    assert!(!rotates(&node.cert_pem, due - second, renewal));
    assert!(rotates(&node.cert_pem, due, renewal), "the boundary itself rotates");
    assert!(rotates(&node.cert_pem, NOW + 31 * DAY, renewal), "expired");
    assert!(rotates(&node.cert_pem, NOW - BACKDATE - second, renewal), "not valid yet");
    let no_window = Renewal { renew_before: Duration::ZERO, ..renewal };
    assert!(!rotates(&node.cert_pem, NOW + 30 * DAY - second, no_window));
    assert!(rotates("not a certificate", NOW, renewal), "unreadable");
}

#[test]
fn a_certificate_that_ends_with_its_ca_is_not_rotated() {
    let second = Duration::from_secs(1);
    let renewal = Renewal { validity: 30 * DAY, renew_before: 10 * DAY };
    // A CA valid 5 days: the node certificate ends with it, inside its window at once.
    let short = Ca::generate("short", NOW, 5 * DAY).unwrap();
    let node = short.node_client_cert(&node_id("mac"), NOW, 30 * DAY).unwrap();
    for at in [NOW, NOW + DAY, NOW + 5 * DAY - second] {
        assert!(!needs_rotation(&node.cert_pem, at, renewal, short.not_after()), "{at}");
    }
    // The same CA, loaded back from its PEM (whole seconds), decides the same.
    let loaded = Ca::from_pem(short.cert_pem(), &short.key_pem(), NOW).unwrap();
    assert!(!needs_rotation(&node.cert_pem, NOW, renewal, loaded.not_after()));
    // Expired with the CA still valid (the CA was replaced by a longer one): rotates.
    assert!(needs_rotation(&node.cert_pem, NOW + 5 * DAY, renewal, NOW + 3650 * DAY));

    // A CA in its last 20 days: a certificate issued 15 days ago ends in 15
    // days. In its window (from day 5) one more issue reaches the CA's end,
    // then it holds.
    let ca_end = NOW + 20 * DAY;
    let earlier = Ca::generate("ending", NOW - 3000 * DAY, 3020 * DAY).unwrap();
    assert_eq!(earlier.not_after().unix_timestamp(), ca_end.unix_timestamp());
    let old = earlier.node_client_cert(&node_id("mac"), NOW - 15 * DAY, 30 * DAY).unwrap();
    assert!(!needs_rotation(&old.cert_pem, NOW, renewal, earlier.not_after()), "not in its window yet");
    let in_window = NOW + 6 * DAY;
    assert!(needs_rotation(&old.cert_pem, in_window, renewal, earlier.not_after()), "ends before the CA: once");
    let new = earlier.node_client_cert(&node_id("mac"), in_window, 30 * DAY).unwrap();
    assert_eq!(inspect(&new.cert_pem).unwrap().not_after.unix_timestamp(), ca_end.unix_timestamp());
    for at in [in_window, NOW + 10 * DAY, ca_end - second] {
        assert!(!needs_rotation(&new.cert_pem, at, renewal, earlier.not_after()), "{at}");
    }
}

#[test]
fn a_ca_is_expiring_within_the_window() {
    let window = 30 * DAY;
    let ca_end = NOW + 40 * DAY;
    assert!(!ca_expiring(ca_end, NOW, window));
    assert!(!ca_expiring(ca_end, NOW + 10 * DAY - Duration::from_secs(1), window));
    assert!(ca_expiring(ca_end, NOW + 10 * DAY, window), "the boundary is inside");
    assert!(ca_expiring(ca_end, NOW + 39 * DAY, window));
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
}

#[test]
fn inspect_lists_the_names_a_certificate_is_for() {
    let ca = ca();
    let names = ["edge.example.lan".to_string(), "192.168.1.10".to_string(), "2001:db8::7".to_string()];
    let edge = ca.edge_server_cert(&names, NOW, DAY).unwrap();
    assert_eq!(inspect(&edge.cert_pem).unwrap().names, names);
    let node = ca.node_client_cert(&node_id("mac"), NOW, DAY).unwrap();
    assert_eq!(inspect(&node.cert_pem).unwrap().names, ["spiffe://iop.example/node/mac"]);
    assert!(inspect(ca.cert_pem()).unwrap().names.is_empty());
}
