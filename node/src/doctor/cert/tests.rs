use super::*;

fn facts(uris: &[&str]) -> CertFacts {
    CertFacts {
        not_before: 1_600_000_000,
        not_after: 4_070_908_800, // 2099-01-01
        uri_sans: uris.iter().map(|u| u.to_string()).collect(),
        client_auth: Some(true),
        is_ca: false,
    }
}

#[test]
fn dates_are_formatted_in_utc() {
    assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
    assert_eq!(format_utc(4_070_908_800), "2099-01-01T00:00:00Z");
    assert_eq!(format_utc(951_782_400 + 3661), "2000-02-29T01:01:01Z");
    assert_eq!(format_utc(-86_400), "1969-12-31T00:00:00Z");
}

#[test]
fn expiry_is_judged_against_the_given_clock() {
    let f = facts(&[]);
    let day = 86_400;
    assert_eq!(expiry_check(&f, f.not_after - 30 * day).level, Level::Ok);
    let soon = expiry_check(&f, f.not_after - 3 * day);
    assert_eq!(soon.level, Level::Warn);
    assert!(soon.detail.contains("expires in 3 days"), "{}", soon.detail);
    assert_eq!(expiry_check(&f, f.not_after - 7 * day + 1).level, Level::Warn);
    assert_eq!(expiry_check(&f, f.not_after - 7 * day).level, Level::Ok);
    let expired = expiry_check(&f, f.not_after);
    assert_eq!(expired.level, Level::Fail);
    assert!(expired.detail.contains("expired 2099-01-01T00:00:00Z"), "{}", expired.detail);
    let early = expiry_check(&f, f.not_before - 1);
    assert_eq!(early.level, Level::Fail);
    assert!(early.fix.unwrap().contains("clock"));
}

#[test]
fn identity_rules() {
    let ok = identity_check(&facts(&["spiffe://iop.local/node/mac-1"]));
    assert_eq!(ok.level, Level::Ok);
    assert!(ok.detail.contains("node `mac-1`") && ok.detail.contains("trust domain `iop.local`"), "{}", ok.detail);
    for uris in [&[][..], &["spiffe://iop.local/node/a", "spiffe://iop.local/node/b"][..]] {
        assert_eq!(identity_check(&facts(uris)).level, Level::Fail, "{uris:?}");
    }
    let edge = identity_check(&facts(&["spiffe://iop.local/edge/x"]));
    assert_eq!(edge.level, Level::Fail);
    assert!(edge.detail.contains("spiffe://<trust-domain>/node/<name>"), "{}", edge.detail);
    let mut ca = facts(&["spiffe://iop.local/node/mac-1"]);
    ca.is_ca = true;
    assert_eq!(identity_check(&ca).level, Level::Fail);
    let mut server_only = facts(&["spiffe://iop.local/node/mac-1"]);
    server_only.client_auth = Some(false);
    assert_eq!(identity_check(&server_only).level, Level::Fail);
    let mut no_eku = facts(&["spiffe://iop.local/node/mac-1"]);
    no_eku.client_auth = None;
    assert_eq!(identity_check(&no_eku).level, Level::Ok);
}
