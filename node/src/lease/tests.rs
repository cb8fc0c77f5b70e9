use super::*;
use crate::adapter::AdapterKind;

use super::test_support::{IDENTITY, session};

const NOW: u64 = 1_000_000;

fn target(profile: Option<&str>) -> ProviderTarget {
    let mut t = ProviderTarget::new("p1", AdapterKind::OpenAi, "m", "http://127.0.0.1:1").unwrap();
    t.credential_profile = profile.map(str::to_string);
    t
}

fn binding(lease_id: &str) -> pb::LeaseBinding {
    test_support::binding(lease_id, NOW + 60_000)
}

fn seal(s: &SessionLeases, b: &pb::LeaseBinding) -> pb::SealedLease {
    iop_proto::lease::seal(s.key.public_key(), IDENTITY, b, b"sk-1").unwrap()
}

fn admit(s: &SessionLeases, lease: Option<&pb::SealedLease>) -> Result<Option<HeaderValue>, LeaseRefusal> {
    let target = target(Some("key"));
    let admitted = s.admit(&Expected { execution_id: "r1", target: &target }, lease, NOW);
    admitted.map(|c| c.map(|c| c.authorization))
}

#[test]
fn a_good_lease_gives_the_bearer_header_once() {
    let s = session();
    let lease = seal(&s, &binding("l1"));
    let header = admit(&s, Some(&lease)).unwrap().unwrap();
    assert_eq!(header.as_bytes(), b"Bearer sk-1");
    assert!(header.is_sensitive());
    assert_eq!(admit(&s, Some(&lease)), Err(LeaseRefusal::Replayed));
    let fresh = seal(&s, &binding("l2"));
    let target = target(Some("key"));
    let credential = s.admit(&Expected { execution_id: "r1", target: &target }, Some(&fresh), NOW).unwrap().unwrap();
    assert_eq!(credential.scrubber.scrub_text("echo: Bearer sk-1"), "echo: Bearer [credential redacted]");
    assert!(!format!("{credential:?}").contains("sk-1"));
}

#[test]
fn every_mismatch_is_refused_with_its_reason() {
    let s = session();
    type Change = fn(&mut pb::LeaseBinding);
    let cases: [(Change, LeaseRefusal); 9] = [
        (|b| b.expires_at_unix_ms = NOW, LeaseRefusal::Expired),
        (|b| b.generation = 6, LeaseRefusal::StaleGeneration),
        (|b| b.node = "mac-2".into(), LeaseRefusal::WrongNode),
        (|b| b.execution_id = "r2".into(), LeaseRefusal::Mismatched),
        (|b| b.provider_id = "p2".into(), LeaseRefusal::Mismatched),
        (|b| b.adapter = pb::AdapterKind::Ollama.into(), LeaseRefusal::Mismatched),
        (|b| b.target_model = "other".into(), LeaseRefusal::Mismatched),
        (|b| b.base_url = "http://127.0.0.1:2".into(), LeaseRefusal::Mismatched),
        (|b| b.profile = "other".into(), LeaseRefusal::Mismatched),
    ];
    for (i, (change, reason)) in cases.into_iter().enumerate() {
        let mut b = binding(&format!("l{i}"));
        change(&mut b);
        assert_eq!(admit(&s, Some(&seal(&s, &b))), Err(reason), "case {i}");
    }
    // Not sealed to this connection's key, or for another node, or altered.
    let other = session();
    assert_eq!(admit(&s, Some(&seal(&other, &binding("x1")))), Err(LeaseRefusal::Unopenable));
    let for_other_node =
        iop_proto::lease::seal(s.key.public_key(), "spiffe://iop.local/node/mac-2", &binding("x2"), b"k").unwrap();
    assert_eq!(admit(&s, Some(&for_other_node)), Err(LeaseRefusal::Unopenable));
    let mut tampered = seal(&s, &binding("x3"));
    tampered.ciphertext[0] ^= 1;
    assert_eq!(admit(&s, Some(&tampered)), Err(LeaseRefusal::Unopenable));
}

#[test]
fn a_lease_is_needed_exactly_when_the_credential_is_managed() {
    let s = session();
    assert_eq!(admit(&s, None), Err(LeaseRefusal::Missing));
    let plain = target(None);
    let expected = Expected { execution_id: "r1", target: &plain };
    assert!(matches!(s.admit(&expected, None, NOW), Ok(None)));
    let unexpected = s.admit(&expected, Some(&seal(&s, &binding("l1"))), NOW);
    assert!(matches!(unexpected, Err(LeaseRefusal::Unexpected)));
}

#[test]
fn revisions_never_go_backwards_per_profile() {
    let s = session();
    let with_revision = |id: &str, revision| {
        let mut b = binding(id);
        b.credential_revision = revision;
        seal(&s, &b)
    };
    assert!(admit(&s, Some(&with_revision("a", 3))).is_ok());
    assert_eq!(admit(&s, Some(&with_revision("b", 2))), Err(LeaseRefusal::Revoked));
    assert!(admit(&s, Some(&with_revision("c", 3))).is_ok());
    assert!(admit(&s, Some(&with_revision("d", 4))).is_ok());
    assert_eq!(admit(&s, Some(&with_revision("e", 3))), Err(LeaseRefusal::Revoked));
}

#[test]
fn spent_ids_are_forgotten_only_after_they_expire() {
    let ledger = LeaseLedger::default();
    ledger.spend("a", NOW + 5, NOW).unwrap();
    assert_eq!(ledger.spend("a", NOW + 5, NOW + 1), Err(LeaseRefusal::Replayed));
    // Past its expiry (and the prune interval) the id is dropped; an
    // expired lease is refused before it reaches the ledger anyway.
    ledger.spend("b", NOW + PRUNE_EVERY_MS + 10, NOW + PRUNE_EVERY_MS).unwrap();
    assert!(!ledger.state.lock().unwrap().spent.contains_key("a"));
    assert!(ledger.state.lock().unwrap().spent.contains_key("b"));
}
