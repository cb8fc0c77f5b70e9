//! Managed credential leases on the node: the key pair of the current
//! connection, and the decision whether a lease may be used for the
//! execution about to call its provider.
//!
//! A lease is opened only after the execution was validated, immediately
//! before the provider call, and checked against everything the node knows:
//! its own identity and current generation, the execution id, the provider's
//! exact target and credential profile, the expiry, lease ids already used
//! (remembered until they expire) and the newest credential revision seen per
//! profile (a lease with an older one is revoked). Any failure is a typed
//! `credential_rejected` terminal: no provider call, no other credential.
//! The credential is injected as `Authorization: Bearer` (a sensitive
//! header value); the opened plaintext and the bytes built from it are
//! zeroized when dropped. The header value itself lives until the HTTP
//! client has written the request, the [`SecretScrubber`] that keeps it out
//! of the provider's answer until the execution ends. It is never stored,
//! logged or counted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use iop_proto::lease::LeaseKey;
use iop_proto::pb;
use reqwest::header::HeaderValue;
use zeroize::Zeroizing;

use crate::adapter::ProviderTarget;
use crate::execution::handles::Observer;
use crate::scrub::SecretScrubber;

/// An opened lease, for one execution: the header to send, and the scrubber
/// for everything the provider answers.
pub struct Credential {
    pub authorization: HeaderValue,
    pub scrubber: SecretScrubber,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential([redacted])")
    }
}

/// The parts of an optional credential as the provider call takes them.
pub fn split(credential: Option<Credential>) -> (Option<HeaderValue>, Option<SecretScrubber>) {
    credential.map_or((None, None), |c| (Some(c.authorization), Some(c.scrubber)))
}

/// How often spent lease ids past their expiry are forgotten.
const PRUNE_EVERY_MS: u64 = 10_000;

/// Why a lease was refused; the closed metric label and the reason in the
/// terminal's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseRejection {
    /// The provider's credential is managed but the execution carries none.
    Missing,
    /// A lease for a provider whose credential is not managed.
    Unexpected,
    /// Not sealed to this connection's key for this node, or altered.
    Unopenable,
    Expired,
    /// A lease id already used.
    Replayed,
    /// Sealed for another connection generation of this node.
    StaleGeneration,
    /// Sealed for another node.
    WrongNode,
    /// Another execution, provider, target or profile.
    Mismatched,
    /// An older credential revision than one already seen for the profile.
    Revoked,
}

impl LeaseRejection {
    pub fn label(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Unexpected => "unexpected",
            Self::Unopenable => "unopenable",
            Self::Expired => "expired",
            Self::Replayed => "replayed",
            Self::StaleGeneration => "stale_generation",
            Self::WrongNode => "wrong_node",
            Self::Mismatched => "mismatched",
            Self::Revoked => "revoked",
        }
    }

    pub fn to_failure(self) -> pb::ExecutionFailure {
        pb::ExecutionFailure::new(
            pb::FailureKind::CredentialRejected,
            format!("the node refused the credential lease ({})", self.label()),
        )
    }
}

/// Spent lease ids and revisions, for the whole node process (a lease of an
/// earlier connection is refused by its generation anyway).
#[derive(Debug, Default)]
pub struct LeaseLedger {
    state: Mutex<LedgerState>,
}

#[derive(Debug, Default)]
struct LedgerState {
    /// Lease id -> its expiry (unix ms).
    spent: HashMap<String, u64>,
    /// Profile -> newest credential revision seen.
    revisions: HashMap<String, u64>,
    next_prune_ms: u64,
}

/// What one connection needs to open leases.
#[derive(Debug)]
pub struct SessionLeases {
    pub key: LeaseKey,
    /// This node's SPIFFE identity and name, as the Edge registered it.
    pub identity: String,
    pub node: String,
    pub generation: u64,
    pub ledger: Arc<LeaseLedger>,
}

/// The execution a lease must be for.
pub struct Expected<'a> {
    pub execution_id: &'a str,
    pub target: &'a ProviderTarget,
}

impl SessionLeases {
    /// The credential for the execution, `None` when the provider needs no
    /// managed credential, or why the lease is refused.
    pub fn admit(
        &self,
        expected: &Expected<'_>,
        lease: Option<&pb::SealedLease>,
        now_ms: u64,
    ) -> Result<Option<Credential>, LeaseRejection> {
        let profile = expected.target.credential_profile.as_deref();
        let sealed = match (profile, lease) {
            (None, None) => return Ok(None),
            (None, Some(_)) => return Err(LeaseRejection::Unexpected),
            (Some(_), None) => return Err(LeaseRejection::Missing),
            (Some(_), Some(sealed)) => sealed,
        };
        let opened = self.key.open(&self.identity, sealed).map_err(|_| LeaseRejection::Unopenable)?;
        let b = &opened.binding;
        if b.expires_at_unix_ms <= now_ms {
            return Err(LeaseRejection::Expired);
        }
        self.ledger.spend(&b.lease_id, b.expires_at_unix_ms, now_ms)?;
        if b.generation != self.generation {
            return Err(LeaseRejection::StaleGeneration);
        }
        if b.node != self.node {
            return Err(LeaseRejection::WrongNode);
        }
        let t = expected.target;
        let matches = b.execution_id == expected.execution_id
            && b.provider_id == t.provider_id
            && b.adapter == i32::from(t.adapter.to_wire())
            && b.target_model == t.target_model
            && b.base_url.trim_end_matches('/') == t.base_url
            && Some(b.profile.as_str()) == profile;
        if !matches {
            return Err(LeaseRejection::Mismatched);
        }
        self.ledger.accept_revision(&b.profile, b.credential_revision)?;
        let mut value = Zeroizing::new(b"Bearer ".to_vec());
        value.extend_from_slice(&opened.credential);
        let mut header = HeaderValue::from_bytes(&value).map_err(|_| LeaseRejection::Unopenable)?;
        header.set_sensitive(true);
        Ok(Some(Credential { authorization: header, scrubber: SecretScrubber::new(&opened.credential) }))
    }
}

impl LeaseLedger {
    /// Records `lease_id` as used; refuses one used before.
    fn spend(&self, lease_id: &str, expires_at_ms: u64, now_ms: u64) -> Result<(), LeaseRejection> {
        let mut state = self.state.lock().unwrap();
        if now_ms >= state.next_prune_ms {
            state.spent.retain(|_, expiry| *expiry > now_ms);
            state.next_prune_ms = now_ms + PRUNE_EVERY_MS;
        }
        if state.spent.insert(lease_id.to_string(), expires_at_ms).is_some() {
            return Err(LeaseRejection::Replayed);
        }
        Ok(())
    }

    /// Refuses a revision older than the newest seen for `profile`.
    fn accept_revision(&self, profile: &str, revision: u64) -> Result<(), LeaseRejection> {
        let mut state = self.state.lock().unwrap();
        let newest = state.revisions.entry(profile.to_string()).or_insert(revision);
        if revision < *newest {
            return Err(LeaseRejection::Revoked);
        }
        *newest = revision;
        Ok(())
    }
}

/// The lease decision for one execution as runs and tunnels make it: a
/// refusal is counted and becomes the execution's failure. Without a
/// connection (`leases` is `None`) a managed credential is refused.
pub fn admit(
    leases: Option<&SessionLeases>,
    execution_id: &str,
    target: &ProviderTarget,
    lease: Option<&pb::SealedLease>,
    observer: &Observer,
) -> Result<Option<Credential>, pb::ExecutionFailure> {
    let expected = Expected { execution_id, target };
    let decision = match leases {
        Some(leases) => leases.admit(&expected, lease, unix_now_ms()),
        None if target.credential_profile.is_none() && lease.is_none() => Ok(None),
        None => Err(LeaseRejection::Unopenable),
    };
    decision.map_err(|rejection| {
        observer.metrics.lease_refused(rejection.label());
        tracing::warn!(reason = rejection.label(), provider = %target.provider_id, "credential lease refused");
        rejection.to_failure()
    })
}

fn unix_now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A session and a lease binding that match each other, for the tests of
/// every module that opens leases.
#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    pub const IDENTITY: &str = "spiffe://iop.local/node/mac-1";

    /// Generation 7 of node `mac-1`, with a fresh key and an empty ledger.
    pub fn session() -> SessionLeases {
        SessionLeases {
            key: LeaseKey::generate(),
            identity: IDENTITY.into(),
            node: "mac-1".into(),
            generation: 7,
            ledger: Arc::default(),
        }
    }

    /// Lease `lease_id` of profile `key` (revision 2) for execution `r1` on
    /// provider `p1` (target model `m` at `http://127.0.0.1:1`) on
    /// [`session`]'s connection, valid until `expires_at_unix_ms`.
    pub fn binding(lease_id: &str, expires_at_unix_ms: u64) -> pb::LeaseBinding {
        pb::LeaseBinding {
            lease_id: lease_id.into(),
            principal: "ci-bot".into(),
            route: "chat".into(),
            slot: 0,
            profile: "key".into(),
            provider_id: "p1".into(),
            adapter: pb::AdapterKind::Openai.into(),
            target_model: "m".into(),
            base_url: "http://127.0.0.1:1".into(),
            node: "mac-1".into(),
            credential_revision: 2,
            generation: 7,
            expires_at_unix_ms,
            execution_id: "r1".into(),
        }
    }
}

#[cfg(test)]
mod tests {
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

    fn admit(s: &SessionLeases, lease: Option<&pb::SealedLease>) -> Result<Option<HeaderValue>, LeaseRejection> {
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
        assert_eq!(admit(&s, Some(&lease)), Err(LeaseRejection::Replayed));
        let fresh = seal(&s, &binding("l2"));
        let target = target(Some("key"));
        let credential =
            s.admit(&Expected { execution_id: "r1", target: &target }, Some(&fresh), NOW).unwrap().unwrap();
        assert_eq!(credential.scrubber.scrub_text("echo: Bearer sk-1"), "echo: Bearer [credential redacted]");
        assert!(!format!("{credential:?}").contains("sk-1"));
    }

    #[test]
    fn every_mismatch_is_refused_with_its_reason() {
        let s = session();
        type Change = fn(&mut pb::LeaseBinding);
        let cases: [(Change, LeaseRejection); 9] = [
            (|b| b.expires_at_unix_ms = NOW, LeaseRejection::Expired),
            (|b| b.generation = 6, LeaseRejection::StaleGeneration),
            (|b| b.node = "mac-2".into(), LeaseRejection::WrongNode),
            (|b| b.execution_id = "r2".into(), LeaseRejection::Mismatched),
            (|b| b.provider_id = "p2".into(), LeaseRejection::Mismatched),
            (|b| b.adapter = pb::AdapterKind::Ollama.into(), LeaseRejection::Mismatched),
            (|b| b.target_model = "other".into(), LeaseRejection::Mismatched),
            (|b| b.base_url = "http://127.0.0.1:2".into(), LeaseRejection::Mismatched),
            (|b| b.profile = "other".into(), LeaseRejection::Mismatched),
        ];
        for (i, (change, reason)) in cases.into_iter().enumerate() {
            let mut b = binding(&format!("l{i}"));
            change(&mut b);
            assert_eq!(admit(&s, Some(&seal(&s, &b))), Err(reason), "case {i}");
        }
        // Not sealed to this connection's key, or for another node, or altered.
        let other = session();
        assert_eq!(admit(&s, Some(&seal(&other, &binding("x1")))), Err(LeaseRejection::Unopenable));
        let for_other_node =
            iop_proto::lease::seal(s.key.public_key(), "spiffe://iop.local/node/mac-2", &binding("x2"), b"k").unwrap();
        assert_eq!(admit(&s, Some(&for_other_node)), Err(LeaseRejection::Unopenable));
        let mut tampered = seal(&s, &binding("x3"));
        tampered.ciphertext[0] ^= 1;
        assert_eq!(admit(&s, Some(&tampered)), Err(LeaseRejection::Unopenable));
    }

    #[test]
    fn a_lease_is_needed_exactly_when_the_credential_is_managed() {
        let s = session();
        assert_eq!(admit(&s, None), Err(LeaseRejection::Missing));
        let plain = target(None);
        let expected = Expected { execution_id: "r1", target: &plain };
        assert!(matches!(s.admit(&expected, None, NOW), Ok(None)));
        let unexpected = s.admit(&expected, Some(&seal(&s, &binding("l1"))), NOW);
        assert!(matches!(unexpected, Err(LeaseRejection::Unexpected)));
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
        assert_eq!(admit(&s, Some(&with_revision("b", 2))), Err(LeaseRejection::Revoked));
        assert!(admit(&s, Some(&with_revision("c", 3))).is_ok());
        assert!(admit(&s, Some(&with_revision("d", 4))).is_ok());
        assert_eq!(admit(&s, Some(&with_revision("e", 3))), Err(LeaseRejection::Revoked));
    }

    #[test]
    fn spent_ids_are_forgotten_only_after_they_expire() {
        let ledger = LeaseLedger::default();
        ledger.spend("a", NOW + 5, NOW).unwrap();
        assert_eq!(ledger.spend("a", NOW + 5, NOW + 1), Err(LeaseRejection::Replayed));
        // Past its expiry (and the prune interval) the id is dropped; an
        // expired lease is refused before it reaches the ledger anyway.
        ledger.spend("b", NOW + PRUNE_EVERY_MS + 10, NOW + PRUNE_EVERY_MS).unwrap();
        assert!(!ledger.state.lock().unwrap().spent.contains_key("a"));
        assert!(ledger.state.lock().unwrap().spent.contains_key("b"));
    }
}
