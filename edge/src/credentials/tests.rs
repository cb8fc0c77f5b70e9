use iop_proto::config::CredentialProfile;

use super::*;

/// Profiles `good`, `spaced` (a space inside), `control` (a control
/// byte), `missing` (no file) and `off` (disabled) in `dir`.
fn config(dir: &std::path::Path) -> EdgeConfig {
    let mut config = crate::testing::one_provider_config("n1");
    let mut profile = |name: &str, content: Option<&[u8]>, disabled: bool| {
        let file = dir.join(name);
        if let Some(content) = content {
            std::fs::write(&file, content).unwrap();
        }
        config.credentials.push(CredentialProfile { profile: name.into(), file, revision: 1, disabled });
    };
    profile("good", Some(b"sk-good\n"), false);
    profile("spaced", Some(b"sk bad"), false);
    profile("control", Some(b"sk-\x07bad"), false);
    profile("missing", None, false);
    profile("off", Some(b"sk-off"), true);
    config
}

/// A lease of `value` at `revision` of `profile`, sealed for `node`.
fn usage(profile: &str, node: &str, value: &[u8], revision: u64) -> CredentialUse {
    CredentialUse { profile: profile.into(), node: node.into(), issued: Issued { value: fingerprint(value), revision } }
}

#[test]
fn an_unusable_value_makes_only_its_own_profile_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let credentials = Credentials::load(&config(dir.path()));
    let health = CredentialHealth::default();
    health.install(&credentials);
    let states: Vec<_> =
        ["good", "spaced", "control", "missing", "off", "unknown"].map(|p| (p, health.state(p, "n1").label())).to_vec();
    assert_eq!(
        states,
        [
            ("good", "ok"),
            ("spaced", "invalid"),
            ("control", "invalid"),
            ("missing", "invalid"),
            ("off", "disabled"),
            ("unknown", "invalid")
        ]
    );
    assert_eq!(health.problem("spaced"), Some(ValueProblem::InvalidValue(CredentialValueError::NotPrintable)));
    assert_eq!(health.problem("missing"), Some(ValueProblem::Unreadable));
    assert_eq!(health.problem("good"), None);
    assert!(!format!("{credentials:?}").contains("sk-"), "Debug names profiles only");
}

#[test]
fn a_rejection_lasts_until_an_acceptance_or_a_new_value() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    let health = CredentialHealth::default();
    health.install(&Credentials::load(&config));
    let used = usage("good", "n1", b"sk-good", 1);
    health.record_rejection(&used);
    assert_eq!(health.state("good", "n1"), CredentialState::Rejected);
    assert!(CredentialState::Rejected.leasable() && !CredentialState::Invalid.leasable());
    // A reload with the same value keeps it; an acceptance of another
    // (older) value does not clear it.
    health.install(&Credentials::load(&config));
    assert_eq!(health.state("good", "n1"), CredentialState::Rejected);
    health.record_acceptance(&usage("good", "n1", b"sk-older", 1));
    assert_eq!(health.state("good", "n1"), CredentialState::Rejected);
    health.record_acceptance(&used);
    assert_eq!(health.state("good", "n1"), CredentialState::Ok);
    // A new value clears a rejection of the old one.
    health.record_rejection(&used);
    std::fs::write(dir.path().join("good"), "sk-rotated").unwrap();
    config.credentials[0].revision = 2;
    health.install(&Credentials::load(&config));
    assert_eq!(health.state("good", "n1"), CredentialState::Ok);
}

#[test]
fn a_node_refusal_lasts_until_the_node_opens_a_lease_or_a_new_revision() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    let health = CredentialHealth::default();
    health.install(&Credentials::load(&config));
    let used = usage("good", "n1", b"sk-good", 1);
    health.record_refusal(&used, pb::LeaseRefusal::Revoked);
    assert_eq!(health.state("good", "n1"), CredentialState::RefusedByNode);
    assert_eq!(health.refusal("good", "n1"), Some(pb::LeaseRefusal::Revoked));
    assert!(CredentialState::RefusedByNode.leasable() && CredentialState::RefusedByNode.last_resort());
    // Only that node: the profile's providers elsewhere are fine.
    assert_eq!(health.state("good", "n2"), CredentialState::Ok);
    // A reload with the same value and revision keeps it; a lease the node
    // opens ends it.
    health.install(&Credentials::load(&config));
    assert_eq!(health.state("good", "n1"), CredentialState::RefusedByNode);
    health.record_acceptance(&used);
    assert_eq!(health.state("good", "n1"), CredentialState::Ok);
    assert_eq!(health.refusal("good", "n1"), None);
    // The same value at a new revision (the operator raised it) clears it.
    health.record_refusal(&used, pb::LeaseRefusal::Revoked);
    config.credentials[0].revision = 2;
    health.install(&Credentials::load(&config));
    assert_eq!(health.state("good", "n1"), CredentialState::Ok);
    // A refusal shows before a provider's rejection of the same value.
    let used = usage("good", "n1", b"sk-good", 2);
    health.record_rejection(&used);
    health.record_refusal(&used, pb::LeaseRefusal::Expired);
    assert_eq!(health.state("good", "n1"), CredentialState::RefusedByNode);
}
