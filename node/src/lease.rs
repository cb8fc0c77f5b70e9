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
use iop_proto::pb::LeaseRefusal;
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
    ) -> Result<Option<Credential>, LeaseRefusal> {
        let profile = expected.target.credential_profile.as_deref();
        let sealed = match (profile, lease) {
            (None, None) => return Ok(None),
            (None, Some(_)) => return Err(LeaseRefusal::Unexpected),
            (Some(_), None) => return Err(LeaseRefusal::Missing),
            (Some(_), Some(sealed)) => sealed,
        };
        let opened = self.key.open(&self.identity, sealed).map_err(|_| LeaseRefusal::Unopenable)?;
        let b = &opened.binding;
        if b.expires_at_unix_ms <= now_ms {
            return Err(LeaseRefusal::Expired);
        }
        self.ledger.spend(&b.lease_id, b.expires_at_unix_ms, now_ms)?;
        if b.generation != self.generation {
            return Err(LeaseRefusal::StaleGeneration);
        }
        if b.node != self.node {
            return Err(LeaseRefusal::WrongNode);
        }
        let t = expected.target;
        let matches = b.execution_id == expected.execution_id
            && b.provider_id == t.provider_id
            && b.adapter == i32::from(t.adapter.to_wire())
            && b.target_model == t.target_model
            && b.base_url.trim_end_matches('/') == t.base_url
            && Some(b.profile.as_str()) == profile;
        if !matches {
            return Err(LeaseRefusal::Mismatched);
        }
        self.ledger.accept_revision(&b.profile, b.credential_revision)?;
        let mut value = Zeroizing::new(b"Bearer ".to_vec());
        value.extend_from_slice(&opened.credential);
        let mut header = HeaderValue::from_bytes(&value).map_err(|_| LeaseRefusal::Unopenable)?;
        header.set_sensitive(true);
        Ok(Some(Credential { authorization: header, scrubber: SecretScrubber::new(&opened.credential) }))
    }
}

impl LeaseLedger {
    /// Records `lease_id` as used; refuses one used before.
    fn spend(&self, lease_id: &str, expires_at_ms: u64, now_ms: u64) -> Result<(), LeaseRefusal> {
        let mut state = self.state.lock().unwrap();
        if now_ms >= state.next_prune_ms {
            state.spent.retain(|_, expiry| *expiry > now_ms);
            state.next_prune_ms = now_ms + PRUNE_EVERY_MS;
        }
        if state.spent.insert(lease_id.to_string(), expires_at_ms).is_some() {
            return Err(LeaseRefusal::Replayed);
        }
        Ok(())
    }

    /// Refuses a revision older than the newest seen for `profile`.
    fn accept_revision(&self, profile: &str, revision: u64) -> Result<(), LeaseRefusal> {
        let mut state = self.state.lock().unwrap();
        let newest = state.revisions.entry(profile.to_string()).or_insert(revision);
        if revision < *newest {
            return Err(LeaseRefusal::Revoked);
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
        None => Err(LeaseRefusal::Unopenable),
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
mod tests;
