use super::*;

fn values(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect()
}

const NOW: u64 = 1_764_900_000;

#[test]
fn revisions_rise_only_when_the_value_changes() {
    let first = values(&[("a", "k1"), ("b", "k2")]);
    let r1 = revisions(None, &[], &first, NOW);
    assert_eq!(r1, [("a".to_string(), NOW), ("b".to_string(), NOW)].into(), "a new profile: the time");
    let written = secret("iop", first.clone(), &r1);
    assert_eq!(revisions(Some(&written), &[], &first, NOW + 60), r1, "unchanged values keep their revision");

    let second = values(&[("a", "k1-rotated"), ("b", "k2"), ("c", "k3")]);
    let r2 = revisions(Some(&written), &[], &second, NOW);
    assert_eq!(r2, [("a".to_string(), NOW + 1), ("b".to_string(), NOW), ("c".to_string(), NOW)].into());
    let written = secret("iop", second, &r2);
    let profiles = profiles(&r2);
    assert_eq!(profiles[0].file, PathBuf::from("/etc/iop/credentials/a"));
    assert_eq!((profiles[0].revision, profiles[1].revision), (NOW + 1, NOW));
    // Other profiles leaving does not move a profile's revision.
    assert_eq!(revisions(Some(&written), &[], &values(&[("a", "k1-rotated")]), NOW + 5)["a"], NOW + 1);
    // A rotation later: the later time.
    let later = values(&[("a", "k1-again")]);
    assert_eq!(revisions(Some(&written), &[], &later, NOW + 3_600)["a"], NOW + 3_600);
}

/// Issue 43 D1: a revision never goes back, whatever is deleted. The
/// credentials Secret deleted (the Edge config remembers the revision), a
/// Provider deleted and re-created (nothing remembers it: the time is past
/// every revision given before), and a clock behind the last revision.
#[test]
fn revisions_never_go_back() {
    let value = values(&[("a", "k1")]);
    let remembered = profiles(&[("a".to_string(), 7)].into());
    assert_eq!(revisions(None, &remembered, &value, 0)["a"], 8, "one past what the config holds");
    assert_eq!(revisions(None, &remembered, &value, NOW)["a"], NOW);
    assert_eq!(revisions(None, &[], &value, NOW)["a"], NOW, "forgotten entirely: the time");
    let written = secret("iop", value.clone(), &[("a".to_string(), NOW + 100)].into());
    let rotated = values(&[("a", "k2")]);
    assert_eq!(revisions(Some(&written), &[], &rotated, NOW)["a"], NOW + 101, "a clock behind the revision");
    assert_eq!(revisions(None, &[], &value, 0)["a"], 1, "at least 1");
}

#[test]
fn only_a_labelled_secret_with_a_valid_value_gives_one() {
    let secret = |labelled: bool, pairs: &[(&str, &[u8])]| Secret {
        metadata: ObjectMeta {
            labels: labelled.then(|| [(CREDENTIAL_LABEL.to_string(), "true".to_string())].into()),
            ..Default::default()
        },
        data: Some(pairs.iter().map(|(k, v)| (k.to_string(), ByteString(v.to_vec()))).collect()),
        ..Default::default()
    };
    let pairs: &[(&str, &[u8])] =
        &[("api-key", b"sk-1\n"), ("blank", b" \n"), ("spaced", b"sk 1"), ("control", b"sk-\x1b")];
    let mut wrong_label = secret(true, pairs);
    wrong_label.metadata.labels = Some([(CREDENTIAL_LABEL.to_string(), "yes".to_string())].into());
    let secrets: BTreeMap<String, Secret> = [
        ("openai".to_string(), secret(true, pairs)),
        ("other-team".to_string(), secret(false, pairs)),
        ("wrong-label".to_string(), wrong_label),
    ]
    .into();
    let reference = |name: &str, key: &str| SecretKeyRef { name: name.into(), key: key.into() };
    assert_eq!(value(&secrets, &reference("openai", "api-key")), Ok(&b"sk-1"[..]), "trimmed as the Edge loads it");
    assert_eq!(value(&secrets, &reference("openai", "other")), Err(CredentialProblem::KeyMissing));
    assert_eq!(
        value(&secrets, &reference("openai", "blank")),
        Err(CredentialProblem::InvalidValue(CredentialValueError::Empty))
    );
    for key in ["spaced", "control"] {
        assert_eq!(
            value(&secrets, &reference("openai", key)),
            Err(CredentialProblem::InvalidValue(CredentialValueError::NotPrintable))
        );
    }
    assert_eq!(value(&secrets, &reference("nope", "api-key")), Err(CredentialProblem::SecretMissing));
    // Another Secret of the namespace, however good its value: not usable.
    assert_eq!(value(&secrets, &reference("other-team", "api-key")), Err(CredentialProblem::NotLabelled));
    assert_eq!(value(&secrets, &reference("wrong-label", "api-key")), Err(CredentialProblem::NotLabelled));
}
