use std::sync::Arc;
use std::time::Duration;

use iop_proto::identity::NodeIdentity;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, RootCertStore};

use super::*;

/// 2026-11-01T12:00:00Z
const NOW: OffsetDateTime = match OffsetDateTime::from_unix_timestamp(1_793_534_400) {
    Ok(t) => t,
    Err(_) => panic!(),
};
const DAY: Duration = Duration::from_secs(86_400);
/// The operator's generated CAs all carry this name: the old and the new CA
/// of a rotation have the same subject, the case a verifier finds hardest.
const SAME_NAME: &str = "iop operator CA";
const EDGE_NAME: &str = "iop-edge-grpc";

fn ders(pem: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes()).map(Result::unwrap).collect()
}

fn roots(trust_pem: &str) -> Arc<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for der in ders(trust_pem) {
        roots.add(der).unwrap();
    }
    Arc::new(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn at(t: OffsetDateTime) -> UnixTime {
    UnixTime::since_unix_epoch(Duration::from_secs(t.unix_timestamp() as u64))
}

/// A node's check of what the Edge serves (`chain`: leaf, then intermediates),
/// with `trust_pem` as its bundle's `ca.pem`.
fn node_accepts(trust_pem: &str, chain: &str) -> Result<(), rustls::Error> {
    let verifier = WebPkiServerVerifier::builder_with_provider(roots(trust_pem), provider()).build().unwrap();
    let chain = ders(chain);
    let name = ServerName::try_from(EDGE_NAME).unwrap();
    verifier.verify_server_cert(&chain[0], &chain[1..], &name, &[], at(NOW + DAY)).map(|_| ())
}

/// The Edge's check of a node certificate, with `trust_pem` as its `ca.pem`.
fn edge_accepts(trust_pem: &str, node_cert: &str) -> Result<(), rustls::Error> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(trust_pem), provider()).build().unwrap();
    verifier.verify_client_cert(&ders(node_cert)[0], &[], at(NOW + DAY)).map(|_| ())
}

fn node_cert(ca: &Ca) -> String {
    ca.node_client_cert(&NodeIdentity::new("iop.example", "mac-1").unwrap(), NOW, 30 * DAY).unwrap().cert_pem
}

fn edge_leaf(ca: &Ca) -> String {
    ca.edge_server_cert(&[EDGE_NAME.to_string()], NOW, 90 * DAY).unwrap().cert_pem
}

struct Rotation {
    old: Ca,
    overlap: Authority,
}

fn rotation(old_name: &str, new_name: &str) -> Rotation {
    let old = Ca::generate(old_name, NOW - 400 * DAY, 3650 * DAY).unwrap();
    let new = Ca::generate(new_name, NOW, 3650 * DAY).unwrap();
    let retiring = Retiring { ca_pem: old.cert_pem().to_string(), cross_pem: old.cross_sign(&new, NOW).unwrap() };
    Rotation { old, overlap: Authority::rotating(new, retiring).unwrap() }
}

#[test]
fn during_the_overlap_old_and_new_bundles_both_work_both_ways() {
    for (old_name, new_name) in [(SAME_NAME, SAME_NAME), ("iop CA 2025", "iop CA 2026")] {
        let Rotation { old, overlap } = rotation(old_name, new_name);
        let old_bundle = old.cert_pem();
        let new_bundle = overlap.trust_pem();
        let served = overlap.serving_chain(&edge_leaf(&overlap.signer));
        // A node on its old bundle verifies the Edge's new certificate
        // through the cross-signed CA; a new bundle directly.
        node_accepts(old_bundle, &served).unwrap_or_else(|e| panic!("{old_name} -> {new_name}: {e}"));
        node_accepts(&new_bundle, &served).unwrap();
        // A new bundle also accepts an Edge that has not reloaded yet.
        node_accepts(&new_bundle, &edge_leaf(&old)).unwrap();
        // The Edge accepts node certificates of either CA.
        edge_accepts(&new_bundle, &node_cert(&old)).unwrap();
        edge_accepts(&new_bundle, &node_cert(&overlap.signer)).unwrap();
    }
}

#[test]
fn once_the_overlap_ends_an_old_bundle_is_refused() {
    for (old_name, new_name) in [(SAME_NAME, SAME_NAME), ("iop CA 2025", "iop CA 2026")] {
        let Rotation { old, overlap } = rotation(old_name, new_name);
        let overlap_bundle = overlap.trust_pem();
        let done = Authority::single(overlap.signer);
        let served = done.serving_chain(&edge_leaf(&done.signer));
        assert_eq!(ders(&served).len(), 1, "no cross-signed certificate is served");
        let refused = [node_accepts(old.cert_pem(), &served), edge_accepts(&done.trust_pem(), &node_cert(&old))];
        for refusal in refused {
            let Err(rustls::Error::InvalidCertificate(e)) = refusal else { panic!("accepted: {refusal:?}") };
            // CAs of one name are told apart by their signatures only: the
            // operator names each CA it makes after its creation time.
            if old_name != new_name {
                assert_eq!(e, CertificateError::UnknownIssuer);
            }
        }
        // A bundle made during the overlap keeps working.
        node_accepts(&overlap_bundle, &served).unwrap();
        edge_accepts(&done.trust_pem(), &node_cert(&done.signer)).unwrap();
    }
}

#[test]
fn the_cross_signed_certificate_ends_with_the_earlier_ca() {
    let old = Ca::generate(SAME_NAME, NOW - 3000 * DAY, 3100 * DAY).unwrap();
    let new = Ca::generate(SAME_NAME, NOW, 3650 * DAY).unwrap();
    let cross = crate::inspect(&old.cross_sign(&new, NOW).unwrap()).unwrap();
    assert_eq!(cross.not_after.unix_timestamp(), old.not_after().unix_timestamp());
    assert_eq!(cross.not_before, NOW - BACKDATE);
}

#[test]
fn a_retiring_ca_that_does_not_belong_is_refused() {
    let Rotation { old, overlap } = rotation(SAME_NAME, SAME_NAME);
    let stranger = Ca::generate(SAME_NAME, NOW, 3650 * DAY).unwrap();
    let retiring = overlap.retiring.clone().unwrap();
    let signer = || Ca::from_pem(overlap.signer.cert_pem(), &overlap.signer.key_pem(), NOW).unwrap();
    // Cross-signed for another CA's key.
    let other = Retiring { cross_pem: old.cross_sign(&stranger, NOW).unwrap(), ..retiring.clone() };
    assert_eq!(Authority::rotating(signer(), other).unwrap_err(), CertError::CrossMismatch);
    // Cross-signed by a CA other than the retiring one.
    let other = Retiring { ca_pem: stranger.cert_pem().to_string(), ..retiring.clone() };
    assert_eq!(Authority::rotating(signer(), other).unwrap_err(), CertError::CrossMismatch);
    // A leaf is no CA.
    let other = Retiring { ca_pem: node_cert(&old), ..retiring };
    assert_eq!(Authority::rotating(overlap.signer, other).unwrap_err(), CertError::NotACa);
}

#[test]
fn bundles_and_chains_are_the_same_text_however_often_they_are_made() {
    let Rotation { overlap, .. } = rotation(SAME_NAME, SAME_NAME);
    let leaf = edge_leaf(&overlap.signer);
    let served = overlap.serving_chain(&leaf);
    assert_eq!(overlap.serving_chain(&served), served, "a served chain's leaf is its first block");
    assert_eq!(first_pem_block(&served).trim_end(), leaf.trim_end());
    assert_eq!(ders(&overlap.trust_pem()).len(), 2);
    assert!(overlap.trust_pem().starts_with(overlap.signer.cert_pem().trim_end()), "the signer comes first");
}
