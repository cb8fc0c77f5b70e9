use super::*;
use axum::http::HeaderValue;

fn keys(entries: &str) -> Keys {
    Keys::parse(entries).unwrap()
}

fn hash(key: &str) -> String {
    to_hex(&sha256(key.as_bytes()))
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.insert(*name, HeaderValue::from_str(value).unwrap());
    }
    map
}

fn two_principals() -> Keys {
    keys(&format!(
        "principals:\n  - {{ name: ci-bot, key_sha256: {}, models: [\"llama*\", qwen2.5] }}\n  - {{ name: old, key_sha256: {}, models: [\"*\"], disabled: true }}\n",
        hash("k-ci"),
        hash("k-old")
    ))
}

#[test]
fn sha256_matches_the_published_test_vector() {
    assert_eq!(to_hex(&sha256(b"abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

#[test]
fn keys_arrive_in_any_of_the_three_headers() {
    let keys = two_principals();
    for h in [
        headers(&[("authorization", "Bearer k-ci")]),
        headers(&[("authorization", "bearer  k-ci ")]),
        headers(&[("x-api-key", "k-ci")]),
        headers(&[("api-key", "k-ci")]),
        // A non-bearer Authorization does not hide the Anthropic header.
        headers(&[("authorization", "Basic abc"), ("x-api-key", "k-ci")]),
    ] {
        assert_eq!(keys.authenticate(&h).unwrap().name(), "ci-bot");
    }
}

#[test]
fn missing_unknown_and_disabled_keys_are_told_apart() {
    let keys = two_principals();
    let fail = |h: HeaderMap| keys.authenticate(&h).unwrap_err();
    assert_eq!(fail(HeaderMap::new()), AuthFailure::Missing);
    assert_eq!(fail(headers(&[("authorization", "Bearer ")])), AuthFailure::Missing);
    assert_eq!(fail(headers(&[("authorization", "Basic k-ci")])), AuthFailure::Missing);
    assert_eq!(fail(headers(&[("authorization", "Bearer k-other")])), AuthFailure::Unknown);
    assert_eq!(fail(headers(&[("x-api-key", &"k".repeat(MAX_KEY_LEN + 1))])), AuthFailure::Unknown);
    assert_eq!(fail(headers(&[("x-api-key", "k-old")])), AuthFailure::Disabled);
}

#[test]
fn disabled_mode_lets_anyone_use_every_model() {
    let caller = Keys::Disabled.authenticate(&HeaderMap::new()).unwrap();
    assert_eq!(caller.name(), "anonymous");
    assert!(caller.may_use("anything"));
}

#[test]
fn model_patterns() {
    let cases = [
        ("llama*", "llama3.1:8b", true),
        ("llama*", "llama", true),
        ("llama*", "codellama", false),
        ("*-instruct", "qwen-instruct", true),
        ("*-instruct", "qwen-instruct-v2", false),
        ("a*b*c", "a-x-b-y-c", true),
        ("a*b*c", "acb", false),
        ("ab*ba", "aba", false),
        ("*", "", true),
        ("qwen2.5", "qwen2.5", true),
        ("qwen2.5", "qwen2.5-coder", false),
    ];
    for (pattern, model, expected) in cases {
        assert_eq!(NamePattern(pattern.into()).matches(model), expected, "{pattern} vs {model}");
    }
    let caller = two_principals().authenticate(&headers(&[("x-api-key", "k-ci")])).unwrap();
    assert!(caller.may_use("qwen2.5") && caller.may_use("llama3") && !caller.may_use("mistral"));
}

/// A principal may run jobs only in the workspaces its patterns name
/// (none by default); anonymous callers only in the refs the config
/// opens to them, exactly.
#[test]
fn workspace_grants() {
    let keys = keys(&format!(
        "principals:\n  - {{ name: plain, key_sha256: {}, models: [mock-ollama] }}\n  - {{ name: site, key_sha256: {}, models: ['*'], workspaces: [\"si*\", quick], max_concurrent_jobs: 2 }}\n",
        hash("k-plain"),
        hash("k-site")
    ));
    let plain = keys.authenticate(&headers(&[("x-api-key", "k-plain")])).unwrap();
    let site = keys.authenticate(&headers(&[("x-api-key", "k-site")])).unwrap();
    let open = ["site".to_string()];
    assert!(!plain.may_use_workspace("site", &open), "no workspaces unless listed; the anonymous list is not theirs");
    assert!(site.may_use_workspace("site", &[]) && site.may_use_workspace("sit", &[]));
    assert!(site.may_use_workspace("quick", &[]) && !site.may_use_workspace("quick2", &[]));
    assert!(!site.may_use_workspace("dev", &[]));
    assert_eq!((plain.max_concurrent_jobs(4), site.max_concurrent_jobs(4)), (4, 2));
    let anonymous = Keys::Disabled.authenticate(&HeaderMap::new()).unwrap();
    assert!(!anonymous.may_use_workspace("site", &[]), "closed unless the config opens it");
    assert!(anonymous.may_use_workspace("site", &open) && !anonymous.may_use_workspace("sit", &open));
    assert!(!anonymous.may_use_workspace("site", &["si*".to_string()]), "anonymous refs are exact, not patterns");
}

#[test]
fn invalid_keys_files_name_the_field() {
    let h = hash("k");
    let cases = [
        ("principals: [ { name: a, key_sha256: abc, models: [m] } ]".to_string(), "principals[0].key_sha256"),
        (format!("principals: [ {{ name: 'a b', key_sha256: {h}, models: [m] }} ]"), "principals[0].name"),
        (format!("principals: [ {{ name: a, key_sha256: {h}, models: [] }} ]"), "principals[0].models"),
        (
            format!(
                "principals: [ {{ name: a, key_sha256: {h}, models: [m] }}, {{ name: a, key_sha256: {}, models: [m] }} ]",
                hash("j")
            ),
            "principals[1].name",
        ),
        (
            format!(
                "principals: [ {{ name: a, key_sha256: {h}, models: [m] }}, {{ name: b, key_sha256: {h}, models: [m] }} ]"
            ),
            "principals[1].key_sha256",
        ),
        (format!("principals: [ {{ name: a, key_sha256: {h}, models: ['m x'] }} ]"), "principals[0].models[0]"),
        (format!("principals: [ {{ name: a, key_sha256: {h}, models: [m], extra: 1 }} ]"), "not a valid keys file"),
        (
            format!("principals: [ {{ name: a, key_sha256: {h}, models: [m], workspaces: ['a/b'] }} ]"),
            "principals[0].workspaces[0]",
        ),
        (
            format!("principals: [ {{ name: a, key_sha256: {h}, models: [m], workspaces: [''] }} ]"),
            "principals[0].workspaces[0]",
        ),
        (
            format!("principals: [ {{ name: a, key_sha256: {h}, models: [m], max_concurrent_jobs: 0 }} ]"),
            "principals[0].max_concurrent_jobs",
        ),
    ];
    for (text, field) in cases {
        let err = Keys::parse(&text).unwrap_err();
        assert!(err.contains(field), "{err} should name {field}");
    }
    // Upper-case hex is accepted and means the same key.
    let upper = keys(&format!("principals: [ {{ name: a, key_sha256: {}, models: [m] }} ]", h.to_uppercase()));
    assert_eq!(upper.authenticate(&headers(&[("api-key", "k")])).unwrap().name(), "a");
}

fn at(text: &str) -> OffsetDateTime {
    OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).unwrap()
}

/// A rotation: the principal holds the old key (until its own
/// `expires_at`) and the new one at once; both name the same principal
/// until the old one expires, and nothing else changes.
#[test]
fn several_keys_per_principal_rotate_without_downtime() {
    let keys = keys(&format!(
        "principals:\n  - name: team-a\n    keys:\n      - {{ sha256: {}, expires_at: '2027-01-31T00:00:00Z' }}\n      - {{ sha256: {} }}\n    models: ['*']\n",
        hash("k-old"),
        hash("k-new")
    ));
    let name = |key: &str, now: &str| {
        keys.authenticate_at(&headers(&[("x-api-key", key)]), at(now)).map(|c| c.name().to_string())
    };
    assert_eq!(name("k-old", "2027-01-30T23:59:59Z").unwrap(), "team-a");
    assert_eq!(name("k-new", "2027-01-30T23:59:59Z").unwrap(), "team-a");
    assert_eq!(name("k-old", "2027-01-31T00:00:00Z").unwrap_err(), AuthFailure::Expired, "expired at the instant");
    assert_eq!(name("k-new", "2030-01-01T00:00:00Z").unwrap(), "team-a", "a key without expiry never expires");
    assert_eq!(name("k-other", "2027-01-01T00:00:00Z").unwrap_err(), AuthFailure::Unknown);
}

/// The principal's `expires_at` stops every key it has, whichever of
/// the two times comes first; a disabled principal is `disabled`
/// whether or not it expired.
#[test]
fn a_principal_expires_with_all_its_keys() {
    let keys = keys(&format!(
        "principals:\n  - name: temp\n    key_sha256: {}\n    keys: [ {{ sha256: {}, expires_at: '2028-01-01T00:00:00Z' }} ]\n    expires_at: '2027-06-30T12:00:00+02:00'\n    models: ['*']\n  - {{ name: off, key_sha256: {}, models: ['*'], disabled: true, expires_at: '2020-01-01T00:00:00Z' }}\n",
        hash("k-a"),
        hash("k-b"),
        hash("k-off")
    ));
    let fail = |key: &str, now: &str| keys.authenticate_at(&headers(&[("x-api-key", key)]), at(now)).err();
    assert_eq!(fail("k-a", "2027-06-30T09:59:59Z"), None);
    assert_eq!(fail("k-a", "2027-06-30T10:00:00Z"), Some(AuthFailure::Expired), "the offset is honoured");
    assert_eq!(fail("k-b", "2027-06-30T10:00:00Z"), Some(AuthFailure::Expired), "the earlier time wins");
    assert_eq!(fail("k-off", "2019-01-01T00:00:00Z"), Some(AuthFailure::Disabled));
    assert_eq!(fail("k-off", "2021-01-01T00:00:00Z"), Some(AuthFailure::Disabled));
    assert_eq!(keys.expiring_soon(at("2027-06-25T00:00:00Z"), time::Duration::days(7)), vec!["temp"]);
    assert!(keys.expiring_soon(at("2027-06-01T00:00:00Z"), time::Duration::days(7)).is_empty());
    assert!(keys.expiring_soon(at("2027-07-01T00:00:00Z"), time::Duration::days(7)).is_empty(), "already expired");
}

#[test]
fn invalid_key_lists_and_times_name_the_field() {
    let (a, b) = (hash("a"), hash("b"));
    let many: Vec<String> =
        (0..=MAX_KEYS_PER_PRINCIPAL).map(|i| format!("{{ sha256: {} }}", hash(&i.to_string()))).collect();
    let cases = [
        ("principals: [ { name: a, models: [m] } ]".to_string(), "principals[0].keys"),
        ("principals: [ { name: a, keys: [], models: [m] } ]".to_string(), "principals[0].keys"),
        (
            format!("principals: [ {{ name: a, keys: [ {{ sha256: {a} }}, {{ sha256: x }} ], models: [m] }} ]"),
            "principals[0].keys[1]",
        ),
        (
            format!("principals: [ {{ name: a, key_sha256: {a}, keys: [ {{ sha256: {a} }} ], models: [m] }} ]"),
            "principals[0].keys[0]",
        ),
        (
            format!(
                "principals: [ {{ name: a, key_sha256: {a}, models: [m] }}, {{ name: b, keys: [ {{ sha256: {a} }} ], models: [m] }} ]"
            ),
            "principals[1].keys[0]",
        ),
        (
            format!("principals: [ {{ name: a, keys: [ {{ sha256: {a}, expires_at: tomorrow }} ], models: [m] }} ]"),
            "principals[0].keys[0].expires_at",
        ),
        (
            format!("principals: [ {{ name: a, key_sha256: {b}, expires_at: '2027-01-31', models: [m] }} ]"),
            "principals[0].expires_at",
        ),
        (
            format!("principals: [ {{ name: a, keys: [ {{ sha256: {a}, extra: 1 }} ], models: [m] }} ]"),
            "not a valid keys file",
        ),
        (format!("principals: [ {{ name: a, keys: [ {} ], models: [m] }} ]", many.join(", ")), "principals[0].keys"),
    ];
    for (text, field) in cases {
        let err = Keys::parse(&text).unwrap_err();
        assert!(err.contains(field), "{err} should name {field}");
    }
}

#[test]
fn the_example_keys_file_parses() {
    let keys = Keys::parse(include_str!("../../../examples/keys.yaml")).unwrap();
    let caller = keys.authenticate(&headers(&[("x-api-key", "iop-example-key-do-not-use")])).unwrap();
    assert_eq!(caller.name(), "example-client");
    assert!(caller.may_use("llama3.2") && !caller.may_use("mistral"));
}

#[test]
fn expires_in_takes_a_number_and_a_unit() {
    assert_eq!(parse_expires_in("90d").unwrap(), time::Duration::days(90));
    assert_eq!(parse_expires_in("12h").unwrap(), time::Duration::hours(12));
    assert_eq!(parse_expires_in("2w").unwrap(), time::Duration::weeks(2));
    assert_eq!(parse_expires_in("1m").unwrap(), time::Duration::minutes(1));
    for bad in ["", "d", "90", "90 d", "-1d", "1.5d", "30s", "11y", "4000d", "99999999999999999999d"] {
        assert!(parse_expires_in(bad).is_err(), "{bad}");
    }
}

#[test]
fn required_mode_needs_a_keys_file() {
    let auth = AuthConfig { mode: AuthMode::Required, ..Default::default() };
    assert!(Keys::load(&auth).unwrap_err().contains("auth.keys_file"));
    let auth =
        AuthConfig { mode: AuthMode::Required, keys_file: Some("/nonexistent/keys.yaml".into()), ..Default::default() };
    assert!(Keys::load(&auth).unwrap_err().contains("cannot read keys file"));
}
