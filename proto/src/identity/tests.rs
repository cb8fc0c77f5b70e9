use super::*;

#[test]
fn round_trips() {
    let id = NodeIdentity::new("iop.local", "mac-1").unwrap();
    assert_eq!(id.uri(), "spiffe://iop.local/node/mac-1");
    assert_eq!(NodeIdentity::parse(&id.uri()).unwrap(), id);
}

#[test]
fn rejects_non_node_uris() {
    assert!(matches!(NodeIdentity::parse("https://x/node/a"), Err(IdentityError::NotSpiffe(_))));
    assert!(matches!(NodeIdentity::parse("spiffe://x/edge/a"), Err(IdentityError::NotANode(_))));
    assert!(matches!(NodeIdentity::parse("spiffe:///node/a"), Err(IdentityError::NotANode(_))));
    assert!(matches!(NodeIdentity::parse("spiffe://x/node/A_b"), Err(IdentityError::InvalidName(_))));
    assert!(matches!(NodeIdentity::parse("spiffe://x/node/a/b"), Err(IdentityError::InvalidName(_))));
}

#[test]
fn trust_domains_are_lowercase_dns_like_names() {
    for ok in ["iop.local", "iop-edge.example.com", "a", &"a".repeat(255)] {
        assert_eq!(validate_trust_domain(ok), Ok(()), "{ok}");
    }
    for bad in ["", "IOP.local", "iop_local", "iop local", "spiffe://iop.local", &"a".repeat(256)] {
        assert!(matches!(validate_trust_domain(bad), Err(IdentityError::InvalidTrustDomain(_))), "{bad}");
    }
}
