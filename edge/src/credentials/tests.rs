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

#[test]
fn an_unusable_value_makes_only_its_own_profile_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let credentials = Credentials::load(&config(dir.path()));
    let health = CredentialHealth::default();
    health.install(&credentials);
    let states: Vec<_> =
        ["good", "spaced", "control", "missing", "off", "unknown"].map(|p| (p, health.state(p).label())).to_vec();
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
    let used = CredentialUse { profile: "good".into(), value: fingerprint(b"sk-good") };
    health.record_rejection(&used);
    assert_eq!(health.state("good"), CredentialState::Rejected);
    assert!(CredentialState::Rejected.leasable() && !CredentialState::Invalid.leasable());
    // A reload with the same value keeps it; an acceptance of another
    // (older) value does not clear it.
    health.install(&Credentials::load(&config));
    assert_eq!(health.state("good"), CredentialState::Rejected);
    health.record_acceptance(&CredentialUse { profile: "good".into(), value: fingerprint(b"sk-older") });
    assert_eq!(health.state("good"), CredentialState::Rejected);
    health.record_acceptance(&used);
    assert_eq!(health.state("good"), CredentialState::Ok);
    // A new value clears a rejection of the old one.
    health.record_rejection(&used);
    std::fs::write(dir.path().join("good"), "sk-rotated").unwrap();
    config.credentials[0].revision = 2;
    health.install(&Credentials::load(&config));
    assert_eq!(health.state("good"), CredentialState::Ok);
}
