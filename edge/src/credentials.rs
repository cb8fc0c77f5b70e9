//! Managed provider credentials: the secrets live only here (files named by
//! `credentials[]`, mounted Secrets in Kubernetes). For every execution on a
//! provider with `credential: {profile}` the Edge seals a single-use lease to
//! the key its node generated for the current connection
//! (`iop_proto::lease`); the node opens it right before the provider call.
//!
//! A profile whose file is unusable, or that is disabled, takes its
//! providers out of selection ([`CredentialHealth`], read by
//! `ProviderView`); a provider's 401/403 marks the value `rejected`. Failing
//! closed: a lease that cannot be sealed (a node that sent no lease key, a
//! profile disabled since admission) ends the attempt with
//! `credential_rejected`, which is never retried elsewhere
//! (`retry::retryable`). A credential never appears in logs, metrics, admin
//! output or error messages: errors name the profile or the file only.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use iop_proto::config::{EdgeConfig, ProviderEntry};
use iop_proto::lease::{CredentialValueError, check_credential};
use iop_proto::pb::{self, FailureKind};
use zeroize::Zeroizing;

use crate::core::credential::CredentialState;
use crate::core::lease::Lease;
use crate::metrics::EdgeMetrics;
use crate::node::registry::NodeRegistry;

/// How long a lease may be opened after it was sealed. It is sealed right
/// before dispatch and opened right after, so this only has to cover the
/// transit and the clock difference between the cluster and a Mac.
pub const LEASE_TTL: Duration = Duration::from_secs(120);

/// One configured profile: its secret when the file held a usable one.
struct Profile {
    /// Why not, when the file could not be read or its value is not
    /// usable: the profile is [`CredentialState::Invalid`] and nothing is
    /// leased.
    secret: Result<Zeroizing<Vec<u8>>, ValueProblem>,
    revision: u64,
    disabled: bool,
}

/// The loaded credentials of the current config.
#[derive(Default)]
pub struct Credentials {
    profiles: HashMap<String, Profile>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Profile names only: never a secret.
        f.debug_struct("Credentials").field("profiles", &self.profiles.keys().collect::<Vec<_>>()).finish()
    }
}

/// Why a profile's file gave no usable secret (the log field and the
/// problem `/admin/v1/providers` shows; never the content).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ValueProblem {
    #[error("the file cannot be read")]
    Unreadable,
    #[error("{0}")]
    InvalidValue(CredentialValueError),
}

impl Credentials {
    /// Reads every profile's file (already resolved against the config's
    /// directory). A file that cannot be read or holds an unusable value
    /// makes only its own profile [`CredentialState::Invalid`] (logged
    /// with the profile's name, never the content): one bad credential
    /// must not keep the rest of a reload (a revoked API key, say) from
    /// applying, nor the Edge from starting.
    pub fn load(config: &EdgeConfig) -> Self {
        let mut profiles = HashMap::new();
        for c in &config.credentials {
            let secret = match std::fs::read(&c.file).map(Zeroizing::new) {
                Ok(bytes) => {
                    check_credential(&bytes).map(|v| Zeroizing::new(v.to_vec())).map_err(ValueProblem::InvalidValue)
                }
                Err(_) => Err(ValueProblem::Unreadable),
            };
            if let Err(problem) = &secret {
                tracing::error!(profile = %c.profile, %problem, "a managed credential is unusable; its providers are unavailable until it is fixed");
            }
            profiles.insert(c.profile.clone(), Profile { secret, revision: c.revision, disabled: c.disabled });
        }
        Self { profiles }
    }

    /// The files whose content a reload watches.
    pub fn files(config: &EdgeConfig) -> impl Iterator<Item = &PathBuf> {
        config.credentials.iter().map(|c| &c.file)
    }

    /// What a profile's file gave: its state and, when usable, the
    /// fingerprint a provider's rejection is recorded against.
    fn loaded(&self, profile: &str) -> Loaded {
        match self.profiles.get(profile) {
            None => Loaded::Invalid(ValueProblem::Unreadable),
            Some(p) if p.disabled => Loaded::Disabled,
            Some(Profile { secret: Err(problem), .. }) => Loaded::Invalid(*problem),
            Some(Profile { secret: Ok(secret), revision, .. }) => {
                Loaded::Usable(Issued { value: fingerprint(secret), revision: *revision })
            }
        }
    }
}

/// A digest of a secret value: what a provider's rejection is recorded
/// against, so that a new value (a rotation) clears it.
type Fingerprint = [u8; 32];

fn fingerprint(secret: &[u8]) -> Fingerprint {
    crate::auth::sha256(secret)
}

/// One issued credential: its value and the revision it was leased with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Issued {
    value: Fingerprint,
    revision: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loaded {
    Usable(Issued),
    Disabled,
    Invalid(ValueProblem),
}

/// What the Edge knows about each profile's credential: what its file gave
/// (installed with every config), the providers' rejections of it and the
/// nodes' refusals of its leases. The one definition of
/// [`CredentialState`], shared by admission, the admin snapshot and the
/// metric.
#[derive(Debug, Default)]
pub struct CredentialHealth {
    inner: std::sync::Mutex<HealthInner>,
}

#[derive(Debug, Default)]
struct HealthInner {
    loaded: HashMap<String, Loaded>,
    /// Profile -> the value a provider rejected.
    rejected: HashMap<String, Fingerprint>,
    /// (profile, node) -> the issue that node refused to open, and why. Per
    /// node: a node's refusal (a revision older than one it has seen, say)
    /// says nothing of the profile's providers on other nodes.
    refused: HashMap<(String, String), (Issued, pb::LeaseRefusal)>,
}

impl CredentialHealth {
    /// Takes the profiles of a newly applied config. A provider's rejection
    /// stays only while the profile still holds the rejected value; a node's
    /// refusal only while it holds the refused value and revision (a new
    /// revision is what a node that refused an older one takes).
    pub fn install(&self, credentials: &Credentials) {
        let mut inner = self.inner.lock().unwrap();
        inner.loaded = credentials.profiles.keys().map(|p| (p.clone(), credentials.loaded(p))).collect();
        let HealthInner { loaded, rejected, refused } = &mut *inner;
        rejected.retain(|profile, value| matches!(loaded.get(profile), Some(Loaded::Usable(i)) if i.value == *value));
        refused.retain(|(profile, _), (issued, _)| loaded.get(profile) == Some(&Loaded::Usable(*issued)));
    }

    /// The state of `profile` as used by providers on `node`.
    pub fn state(&self, profile: &str, node: &str) -> CredentialState {
        let inner = self.inner.lock().unwrap();
        match inner.loaded.get(profile) {
            None | Some(Loaded::Invalid(_)) => CredentialState::Invalid,
            Some(Loaded::Disabled) => CredentialState::Disabled,
            Some(Loaded::Usable(issued)) => {
                if inner.refused.get(&(profile.to_string(), node.to_string())).is_some_and(|(i, _)| i == issued) {
                    CredentialState::RefusedByNode
                } else if inner.rejected.get(profile) == Some(&issued.value) {
                    CredentialState::Rejected
                } else {
                    CredentialState::Ok
                }
            }
        }
    }

    /// The state of `provider`'s managed credential; `None` without one.
    pub fn of_provider(&self, provider: &ProviderEntry) -> Option<CredentialState> {
        provider.credential.as_ref().map(|c| self.state(&c.profile, &provider.node))
    }

    /// Why a profile is invalid, for the admin snapshot.
    pub fn problem(&self, profile: &str) -> Option<ValueProblem> {
        match self.inner.lock().unwrap().loaded.get(profile) {
            Some(Loaded::Invalid(problem)) => Some(*problem),
            None => Some(ValueProblem::Unreadable),
            _ => None,
        }
    }

    /// Why `node` refused the leases of `profile`, while it does.
    pub fn refusal(&self, profile: &str, node: &str) -> Option<pb::LeaseRefusal> {
        let inner = self.inner.lock().unwrap();
        inner.refused.get(&(profile.to_string(), node.to_string())).map(|(_, reason)| *reason)
    }

    /// A provider answered 401/403 to a run sealed with `used`.
    pub fn record_rejection(&self, used: &CredentialUse) {
        let value = used.issued.value;
        let newly = self.inner.lock().unwrap().rejected.insert(used.profile.clone(), value) != Some(value);
        if newly {
            tracing::warn!(profile = %used.profile, "a provider rejected its managed credential (HTTP 401/403)");
        }
    }

    /// The node refused to open a lease of `used` (`reason`, its own closed
    /// reason): no provider was called.
    pub fn record_refusal(&self, used: &CredentialUse, reason: pb::LeaseRefusal) {
        let key = (used.profile.clone(), used.node.clone());
        let newly =
            self.inner.lock().unwrap().refused.insert(key, (used.issued, reason)) != Some((used.issued, reason));
        if newly {
            tracing::warn!(
                profile = %used.profile,
                node = %used.node,
                revision = used.issued.revision,
                reason = reason.label(),
                "a node refused the leases of a managed credential; its providers there are unavailable \
                 until the node accepts one or the credential's revision changes"
            );
        }
    }

    /// A provider accepted a run sealed with `used` (so its node opened the
    /// lease): a rejection of that same value, and the node's refusal of it,
    /// are over.
    pub fn record_acceptance(&self, used: &CredentialUse) {
        let mut inner = self.inner.lock().unwrap();
        if inner.rejected.get(&used.profile) == Some(&used.issued.value) {
            inner.rejected.remove(&used.profile);
            tracing::info!(profile = %used.profile, "a provider accepted its managed credential again");
        }
        if inner.refused.remove(&(used.profile.clone(), used.node.clone())).is_some() {
            tracing::info!(profile = %used.profile, node = %used.node, "a node opened a managed credential's lease again");
        }
    }
}

/// Which credential a lease carried, to which node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialUse {
    pub profile: String,
    pub node: String,
    issued: Issued,
}

/// A test-only way to make the Edge send bad leases, so that end-to-end
/// tests can show the node refusing each (`iop-edge --test-lease-fault`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LeaseFault {
    /// One ciphertext byte flipped.
    Tamper,
    /// Sealed to a key that is not the node's.
    OtherKey,
    /// Bound to the connection generation before the current one.
    StaleGeneration,
    /// Already expired when sealed.
    Expired,
    /// Every lease after the first is a copy of the first.
    Replay,
}

/// The test-only lease fault of one Edge process (`iop-edge
/// --test-lease-fault`), and the lease a [`LeaseFault::Replay`] repeats.
#[derive(Debug, Default)]
pub struct LeaseFaults {
    pub fault: Option<LeaseFault>,
    pub first: std::sync::OnceLock<pb::SealedLease>,
}

/// What a lease is sealed for besides the slot lease: who asked for what.
pub struct LeaseScope<'a> {
    pub principal: &'a str,
    pub route: &'a str,
}

/// A sealed lease and the credential value it carries.
pub struct Sealed {
    pub lease: pb::SealedLease,
    pub used: CredentialUse,
}

/// What sealing a lease reads: the current credentials and trust domain,
/// the node's lease key, where refusals are counted, and the test faults.
pub struct Sealer<'a> {
    pub credentials: &'a Credentials,
    pub trust_domain: &'a str,
    pub registry: &'a NodeRegistry,
    pub metrics: &'a EdgeMetrics,
    pub faults: &'a LeaseFaults,
}

impl Sealer<'_> {
    /// The lease for the execution `lease` on `provider`, or `None` when the
    /// provider has no managed credential.
    pub fn lease_for(
        &self,
        scope: &LeaseScope<'_>,
        provider: Option<&ProviderEntry>,
        lease: &Lease,
    ) -> Result<Option<Sealed>, pb::ExecutionFailure> {
        let Some((provider, credential)) = provider.and_then(|p| p.credential.as_ref().map(|c| (p, c))) else {
            return Ok(None);
        };
        let rejected = |reason: &'static str| {
            self.metrics.reason(&self.metrics.lease_refusals, reason);
            pb::ExecutionFailure::new(
                FailureKind::CredentialRejected,
                format!("the provider's managed credential could not be leased ({reason})"),
            )
        };
        let profile = self.credentials.profiles.get(&credential.profile).ok_or_else(|| rejected("unknown_profile"))?;
        if profile.disabled {
            return Err(rejected("disabled"));
        }
        let Ok(secret) = profile.secret.as_ref() else {
            return Err(rejected("invalid_value"));
        };
        let key = match self.registry.lease_key(lease.node(), lease.generation()) {
            Some(Some(key)) => key,
            Some(None) => return Err(rejected("no_node_key")),
            // The connection ended since admission: the same (retryable) failure
            // dispatching on it would have given.
            None => {
                return Err(pb::ExecutionFailure::new(
                    FailureKind::TransportLost,
                    "node connection closed before dispatch",
                ));
            }
        };
        let identity = iop_proto::identity::NodeIdentity::new(self.trust_domain.to_string(), lease.node())
            .map_err(|_| rejected("invalid_node"))?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let fault = self.faults.fault;
        let mut binding = pb::LeaseBinding {
            lease_id: crate::ids::new_uuid().simple().to_string(),
            principal: scope.principal.to_string(),
            route: scope.route.to_string(),
            slot: lease.slot(),
            profile: credential.profile.clone(),
            provider_id: provider.id.clone(),
            adapter: pb::AdapterKind::from(provider.adapter).into(),
            target_model: provider.target.model.clone(),
            base_url: provider.target.base_url.clone(),
            node: lease.node().to_string(),
            credential_revision: profile.revision,
            generation: lease.generation(),
            expires_at_unix_ms: (now + LEASE_TTL).as_millis() as u64,
            execution_id: lease.run_id().to_string(),
        };
        match fault {
            Some(LeaseFault::StaleGeneration) => binding.generation = binding.generation.saturating_sub(1),
            Some(LeaseFault::Expired) => binding.expires_at_unix_ms = (now.as_millis() as u64).saturating_sub(1),
            _ => {}
        }
        let recipient = match fault {
            Some(LeaseFault::OtherKey) => iop_proto::lease::LeaseKey::generate().public_key().to_vec(),
            _ => key.to_vec(),
        };
        let mut sealed = iop_proto::lease::seal(&recipient, &identity.uri(), &binding, secret)
            .map_err(|_| rejected("seal_failed"))?;
        match fault {
            Some(LeaseFault::Tamper) => sealed.ciphertext[0] ^= 1,
            Some(LeaseFault::Replay) => sealed = self.faults.first.get_or_init(|| sealed.clone()).clone(),
            _ => {}
        }
        self.metrics.leases_sealed.inc();
        let used = CredentialUse {
            profile: credential.profile.clone(),
            node: lease.node().to_string(),
            issued: Issued { value: fingerprint(secret), revision: profile.revision },
        };
        Ok(Some(Sealed { lease: sealed, used }))
    }
}

#[cfg(test)]
mod tests;
