use std::time::Duration;

use super::*;
use crate::reconcile::fixtures::node;

/// 2026-11-01T12:00:00Z
const NOW: OffsetDateTime = match OffsetDateTime::from_unix_timestamp(1_793_534_400) {
    Ok(t) => t,
    Err(_) => panic!(),
};
const DAY: Duration = Duration::from_secs(86_400);

fn ca() -> Ca {
    Ca::generate("iop test CA", NOW, 3650 * DAY).unwrap()
}

/// `ca` as the only CA (no rotation under way).
fn single(ca: &Ca) -> Authority {
    Authority::single(Ca::from_pem(ca.cert_pem(), &ca.key_pem(), NOW).unwrap())
}

fn names() -> Vec<String> {
    vec!["iop-edge-grpc.iop.svc".to_string(), "10.0.0.7".to_string()]
}

#[test]
fn ca_secret_round_trips_and_a_tls_secret_is_accepted() {
    let ca = ca();
    let s = ca_secret("iop", &ca);
    assert_eq!(s.metadata.name.as_deref(), Some(CA_SECRET));
    assert_eq!(s.data.as_ref().unwrap().keys().collect::<Vec<_>>(), [CA_KEY_KEY, CA_CERT_KEY]);
    assert_eq!(load_ca(&s, NOW + DAY).unwrap().cert_pem(), ca.cert_pem());

    // A user-supplied kubernetes.io/tls Secret, written with stringData.
    let user = Secret {
        string_data: Some(BTreeMap::from([
            ("tls.crt".to_string(), ca.cert_pem().to_string()),
            ("tls.key".to_string(), ca.key_pem().expose().to_string()),
        ])),
        ..Default::default()
    };
    assert_eq!(load_ca(&user, NOW).unwrap().cert_pem(), ca.cert_pem());

    assert_eq!(load_ca(&Secret::default(), NOW).unwrap_err(), CaSecretError::MissingKeys);
    let mut broken = ca_secret("iop", &ca);
    broken.data.as_mut().unwrap().insert(CA_KEY_KEY.to_string(), ByteString(b"garbage".to_vec()));
    assert_eq!(load_ca(&broken, NOW).unwrap_err(), CaSecretError::Invalid(CertError::CaKey));
    // The error never carries key material.
    assert!(!format!("{:?}", load_ca(&broken, NOW)).contains("PRIVATE KEY"));
}

#[test]
fn edge_secret_is_kept_until_something_changes() {
    let ca = ca();
    assert_eq!(edge_reissue(None, &single(&ca), &names(), NOW), Some(Reissue::Missing));

    let issued = ca.edge_server_cert(&names(), NOW, EDGE_VALIDITY).unwrap();
    let s = edge_tls_secret("iop", &single(&ca), &issued);
    assert_eq!(s.metadata.name.as_deref(), Some(EDGE_TLS_SECRET));
    assert_eq!(s.data.as_ref().unwrap().keys().collect::<Vec<_>>(), [CA_CERT_KEY, EDGE_KEY_KEY, EDGE_CERT_KEY]);
    assert_eq!(edge_reissue(Some(&s), &single(&ca), &names(), NOW), None);
    // Names in another order are the same names.
    let reversed: Vec<String> = names().into_iter().rev().collect();
    assert_eq!(edge_reissue(Some(&s), &single(&ca), &reversed, NOW), None);

    // Rotation window: 30 days before the 90-day expiry.
    assert_eq!(edge_reissue(Some(&s), &single(&ca), &names(), NOW + 59 * DAY), None);
    assert_eq!(edge_reissue(Some(&s), &single(&ca), &names(), NOW + 60 * DAY), Some(Reissue::Rotation));

    let more = [names(), vec!["edge.example.com".to_string()]].concat();
    assert_eq!(edge_reissue(Some(&s), &single(&ca), &more, NOW), Some(Reissue::Mismatch));

    let other = Ca::generate("other", NOW, 3650 * DAY).unwrap();
    assert_eq!(edge_reissue(Some(&s), &single(&other), &names(), NOW), Some(Reissue::CaChanged));

    // Someone swapped the key.
    let mut swapped = s.clone();
    let stranger = ca.edge_server_cert(&names(), NOW, EDGE_VALIDITY).unwrap();
    swapped.data.as_mut().unwrap().insert(EDGE_KEY_KEY.to_string(), ByteString(stranger.key.expose().into()));
    assert_eq!(edge_reissue(Some(&swapped), &single(&ca), &names(), NOW), Some(Reissue::Mismatch));

    let mut partial = s;
    partial.data.as_mut().unwrap().remove(EDGE_CERT_KEY);
    assert_eq!(edge_reissue(Some(&partial), &single(&ca), &names(), NOW), Some(Reissue::Missing));
}

#[test]
fn node_secret_is_owned_by_its_node_and_checked_against_its_identity() {
    let ca = ca();
    let n = node("mac-1");
    let id = NodeIdentity::new("iop.example", "mac-1").unwrap();
    let issued = ca.node_client_cert(&id, NOW, 30 * DAY).unwrap();
    let s = node_secret("iop", &n, &single(&ca), &issued);
    assert_eq!(s.metadata.name.as_deref(), Some("iop-node-mac-1"));
    assert_eq!(s.metadata.labels.as_ref().unwrap()["iop.dev/node"], "mac-1");
    let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str(), owner.controller),
        ("NodeCatalog", "mac-1", "uid-mac-1", Some(true))
    );

    let renew_before = Renewal { validity: 30 * DAY, renew_before: 10 * DAY };
    assert_eq!(node_reissue(Some(&s), &single(&ca), &id, NOW, renew_before), None);
    assert_eq!(node_reissue(Some(&s), &single(&ca), &id, NOW + 20 * DAY - Duration::from_secs(1), renew_before), None);
    assert_eq!(node_reissue(Some(&s), &single(&ca), &id, NOW + 20 * DAY, renew_before), Some(Reissue::Rotation));

    let other_domain = NodeIdentity::new("other.example", "mac-1").unwrap();
    assert_eq!(node_reissue(Some(&s), &single(&ca), &other_domain, NOW, renew_before), Some(Reissue::Mismatch));
    assert_eq!(node_reissue(None, &single(&ca), &id, NOW, renew_before), Some(Reissue::Missing));
}

/// Issue 43 item 6: ownership is the controller owner reference, not the
/// labels: a label removed by someone does not make the operator abandon its
/// own Secret; labels copied onto someone else's Secret do not make it ours.
#[test]
fn a_node_secret_is_ours_by_its_owner_reference() {
    let ca = ca();
    let n = node("mac-1");
    let id = NodeIdentity::new("iop.example", "mac-1").unwrap();
    let ours = node_secret("iop", &n, &single(&ca), &ca.node_client_cert(&id, NOW, 30 * DAY).unwrap());
    assert!(node_secret_is_ours(&ours, "mac-1"));
    assert!(!node_secret_is_ours(&ours, "mac-2"), "another node's");
    let mut unlabelled = ours.clone();
    unlabelled.metadata.labels.as_mut().unwrap().remove("iop.dev/node");
    assert!(node_secret_is_ours(&unlabelled, "mac-1"));
    let mut unowned = ours.clone();
    unowned.metadata.owner_references = None;
    assert!(!node_secret_is_ours(&unowned, "mac-1"));
    let mut not_controller = ours;
    not_controller.metadata.owner_references.as_mut().unwrap()[0].controller = None;
    assert!(!node_secret_is_ours(&not_controller, "mac-1"));
}

/// A CA that ends inside the renewal window (a user-supplied CA valid for 5
/// days, or a generated one in its last 30): the certificates it signs end
/// with it, so issuing again changes nothing. Issued once, then kept: never
/// a loop of re-issues.
#[test]
fn a_ca_ending_inside_the_window_issues_once_then_keeps_the_certificates() {
    let short = Ca::generate("short", NOW, 5 * DAY).unwrap();
    let edge = short.edge_server_cert(&names(), NOW, EDGE_VALIDITY).unwrap();
    let s = edge_tls_secret("iop", &single(&short), &edge);
    for later in [NOW, NOW + DAY, NOW + 4 * DAY] {
        assert_eq!(edge_reissue(Some(&s), &single(&short), &names(), later), None, "{later}");
    }

    let id = NodeIdentity::new("iop.example", "mac-1").unwrap();
    let issued = short.node_client_cert(&id, NOW, 30 * DAY).unwrap();
    let n = node_secret("iop", &node("mac-1"), &single(&short), &issued);
    for later in [NOW, NOW + 2 * DAY] {
        assert_eq!(
            node_reissue(Some(&n), &single(&short), &id, later, Renewal { validity: 30 * DAY, renew_before: 10 * DAY }),
            None,
            "{later}"
        );
    }
}

/// Issue 43 D4: a CA rotation. Under way, every certificate is issued by
/// the new CA and `ca.pem` holds both; once it ends, the Secrets are written
/// again around the same certificates (no new serial, no new bundle).
#[test]
fn a_rotation_reissues_once_and_its_end_rewrites_the_trust_only() {
    let old = ca();
    let new = Ca::generate(&ca_common_name(NOW), NOW, 3650 * DAY).unwrap();
    let later = NOW + 2 * DAY;
    let retiring = Retiring { ca_pem: old.cert_pem().to_string(), cross_pem: old.cross_sign(&new, NOW).unwrap() };
    let overlap = Authority::rotating(single(&new).signer, retiring).unwrap();
    let done = single(&new);
    let id = NodeIdentity::new("iop.example", "mac-1").unwrap();
    let renewal = Renewal { validity: 30 * DAY, renew_before: 10 * DAY };

    let edge = edge_tls_secret("iop", &single(&old), &old.edge_server_cert(&names(), NOW, EDGE_VALIDITY).unwrap());
    let node_s = node_secret("iop", &node("mac-1"), &single(&old), &old.node_client_cert(&id, NOW, 30 * DAY).unwrap());
    assert_eq!(edge_reissue(Some(&edge), &overlap, &names(), later), Some(Reissue::CaChanged));
    assert_eq!(node_reissue(Some(&node_s), &overlap, &id, later, renewal), Some(Reissue::CaChanged));

    let leaf = overlap.signer.edge_server_cert(&names(), later, EDGE_VALIDITY).unwrap();
    let edge = edge_tls_secret("iop", &overlap, &leaf);
    assert_eq!(value(&edge, EDGE_CERT_KEY).unwrap().matches("BEGIN CERTIFICATE").count(), 2, "leaf + cross");
    assert_eq!(value(&edge, CA_CERT_KEY).unwrap().matches("BEGIN CERTIFICATE").count(), 2, "new + old");
    let node_s =
        node_secret("iop", &node("mac-1"), &overlap, &overlap.signer.node_client_cert(&id, later, 30 * DAY).unwrap());
    assert_eq!(edge_reissue(Some(&edge), &overlap, &names(), later), None);
    assert_eq!(node_reissue(Some(&node_s), &overlap, &id, later, renewal), None);

    // The rotation ends: same certificates, new trust.
    assert_eq!(edge_reissue(Some(&edge), &done, &names(), later), Some(Reissue::Trust));
    assert_eq!(node_reissue(Some(&node_s), &done, &id, later, renewal), Some(Reissue::Trust));
    let kept = stored_cert(&edge, EDGE_CERT_KEY, EDGE_KEY_KEY).unwrap();
    let edge = edge_tls_secret("iop", &done, &kept);
    assert_eq!(value(&edge, EDGE_CERT_KEY).unwrap().trim_end(), leaf.cert_pem.trim_end(), "the leaf alone");
    assert_eq!(edge_reissue(Some(&edge), &done, &names(), later), None);
    let kept = stored_cert(&node_s, NODE_CERT_KEY, NODE_KEY_KEY).unwrap();
    assert_eq!(node_reissue(Some(&node_secret("iop", &node("mac-1"), &done, &kept)), &done, &id, later, renewal), None);
}

#[test]
fn a_ca_secret_during_a_rotation_loads_only_whole() {
    let old = ca();
    let new = Ca::generate("new", NOW, 3650 * DAY).unwrap();
    let mut s = ca_secret("iop", &new);
    assert!(load_authority(&s, NOW).unwrap().retiring.is_none());
    let data = s.data.as_mut().unwrap();
    data.insert(RETIRING_CA_KEY.to_string(), ByteString(old.cert_pem().into()));
    assert_eq!(load_authority(&s, NOW).unwrap_err(), CaSecretError::RetiringIncomplete);
    let stranger = Ca::generate("stranger", NOW, 3650 * DAY).unwrap();
    let wrong = old.cross_sign(&stranger, NOW).unwrap();
    s.data.as_mut().unwrap().insert(RETIRING_CROSS_KEY.to_string(), ByteString(wrong.into()));
    assert_eq!(load_authority(&s, NOW).unwrap_err(), CaSecretError::Invalid(CertError::CrossMismatch));
    let cross = old.cross_sign(&new, NOW).unwrap();
    s.data.as_mut().unwrap().insert(RETIRING_CROSS_KEY.to_string(), ByteString(cross.into()));
    let authority = load_authority(&s, NOW).unwrap();
    assert_eq!(authority.retiring.unwrap().ca_pem, old.cert_pem());
}

#[test]
fn generated_cas_are_named_after_their_creation() {
    assert_eq!(ca_common_name(NOW), "iop operator CA 20261101T120000Z");
    assert_ne!(ca_common_name(NOW), ca_common_name(NOW + Duration::from_secs(1)));
}
