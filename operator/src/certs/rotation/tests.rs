use std::collections::BTreeMap;
use std::time::Duration;

use iop_proto::identity::NodeIdentity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};

use super::*;
use crate::certs::Authority;
use crate::certs::secrets::{ca_secret, load_authority, node_secret, value};
use crate::crd::node_catalog::CertificateStatus;
use crate::reconcile::fixtures::node;

/// 2026-11-01T12:00:00Z
const NOW: OffsetDateTime = match OffsetDateTime::from_unix_timestamp(1_793_534_400) {
    Ok(t) => t,
    Err(_) => panic!(),
};
const DAY: Duration = Duration::from_secs(86_400);

fn ca(name: &str) -> Ca {
    Ca::generate(name, NOW, 3650 * DAY).unwrap()
}

fn stored(secret: Secret) -> Secret {
    Secret { metadata: ObjectMeta { resource_version: Some("41".to_string()), ..secret.metadata }, ..secret }
}

#[test]
fn begin_keeps_the_secrets_type_and_keys_and_adds_the_retiring_ca() {
    let (old, new) = (ca("old"), ca("new"));
    // Created by the operator: Opaque, ca.pem + ca-key.pem.
    let current = stored(ca_secret("iop", &old));
    let rotating = begin(&current, &new, NOW).unwrap();
    assert_eq!(rotating.metadata.resource_version.as_deref(), Some("41"), "a guarded replace");
    assert_eq!(rotating.type_, current.type_);
    let keys: Vec<_> = rotating.data.as_ref().unwrap().keys().cloned().collect();
    assert_eq!(keys, [CA_KEY_KEY, CA_CERT_KEY, RETIRING_CA_KEY, RETIRING_CROSS_KEY]);
    let authority = load_authority(&rotating, NOW).unwrap();
    assert_eq!(authority.signer.cert_pem(), new.cert_pem());
    assert_eq!(authority.retiring.as_ref().unwrap().ca_pem, old.cert_pem());
    assert!(!format!("{rotating:?}").contains(old.key_pem().expose()), "the old key is not kept");

    // A user's kubernetes.io/tls Secret, written with stringData: the new CA
    // goes where the operator reads it, the type stays (it cannot change).
    let user = stored(Secret {
        type_: Some("kubernetes.io/tls".to_string()),
        string_data: Some(BTreeMap::from([
            ("tls.crt".to_string(), old.cert_pem().to_string()),
            ("tls.key".to_string(), old.key_pem().expose().to_string()),
        ])),
        ..Default::default()
    });
    let rotating = begin(&user, &new, NOW).unwrap();
    assert_eq!(rotating.type_.as_deref(), Some("kubernetes.io/tls"));
    assert!(rotating.string_data.is_none());
    assert_eq!(value(&rotating, "tls.crt").unwrap(), new.cert_pem());
    assert_eq!(load_authority(&rotating, NOW).unwrap().signer.cert_pem(), new.cert_pem());

    assert_eq!(begin(&rotating, &ca("newer"), NOW).unwrap_err(), RotationError::AlreadyRotating);
    assert_eq!(begin(&current, &old, NOW).unwrap_err(), RotationError::SameCa);
    assert!(matches!(begin(&Secret::default(), &new, NOW), Err(RotationError::CaSecret(_))));
}

#[test]
fn finish_removes_the_retiring_ca_only() {
    let (old, new) = (ca("old"), ca("new"));
    let current = stored(ca_secret("iop", &old));
    assert_eq!(finish(&current, NOW).unwrap_err(), RotationError::NotRotating);
    let done = finish(&begin(&current, &new, NOW).unwrap(), NOW).unwrap();
    let keys: Vec<_> = done.data.as_ref().unwrap().keys().cloned().collect();
    assert_eq!(keys, [CA_KEY_KEY, CA_CERT_KEY]);
    let authority = load_authority(&done, NOW).unwrap();
    assert_eq!(authority.signer.cert_pem(), new.cert_pem());
    assert!(authority.retiring.is_none());
}

fn condition(status: &str, reason: &str) -> Condition {
    Condition {
        type_: BUNDLE_CURRENT.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: "m".to_string(),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }
}

#[test]
fn the_overlap_may_end_once_every_mac_runs_a_bundle_of_the_new_ca() {
    let (old, new) = (ca("old"), ca("new"));
    let authority = Authority::single(Ca::from_pem(new.cert_pem(), &new.key_pem(), NOW).unwrap());
    let issue = |ca: &Ca, name: &str| {
        let id = NodeIdentity::new("iop.example", name).unwrap();
        ca.node_client_cert(&id, NOW, 30 * DAY).unwrap()
    };
    let with_status = |name: &str, cert: &str, bundle: Option<Condition>| {
        let mut n = node(name);
        let info = inspect(cert).unwrap();
        let status = n.status.get_or_insert_with(Default::default);
        status.certificate =
            Some(CertificateStatus { serial: info.serial, not_after: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH) });
        status.conditions.extend(bundle);
        n
    };
    let current = issue(&new, "current");
    let older = issue(&new, "older");
    let stale = issue(&old, "stale");
    let shown_old = issue(&new, "shown-old");
    let nodes = vec![
        with_status("current", &current.cert_pem, Some(condition("True", "Current"))),
        with_status("older", &older.cert_pem, Some(condition("False", "OlderBundle"))),
        with_status("stale", &stale.cert_pem, Some(condition("True", "Current"))),
        with_status("shown-old", &issue(&old, "x").cert_pem, Some(condition("True", "Current"))),
        node("missing"),
    ];
    let secrets: BTreeMap<String, Secret> =
        [("current", &current), ("older", &older), ("stale", &stale), ("shown-old", &shown_old)]
            .into_iter()
            .map(|(name, cert)| (name.to_string(), node_secret("iop", &node(name), &authority, cert)))
            .collect();
    let pending = pending(&authority.signer, &nodes, |name| secrets.get(name));
    let names: Vec<_> = pending.iter().map(|p| p.node.as_str()).collect();
    assert_eq!(names, ["older", "stale", "shown-old", "missing"]);
    assert!(pending[0].reason.contains("OlderBundle"), "{:?}", pending[0]);
    assert!(pending[1].reason.contains("not re-issued"), "{:?}", pending[1]);
    assert!(pending[2].reason.contains("status"), "{:?}", pending[2]);
}
