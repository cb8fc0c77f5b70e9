//! Managed provider credentials: the secrets live only here (files named by
//! `credentials[]`, mounted Secrets in Kubernetes). For every execution on a
//! provider with `credential: {profile}` the Edge seals a single-use lease to
//! the key its node generated for the current connection
//! (`iop_proto::lease`); the node opens it right before the provider call.
//!
//! Failing closed: a disabled profile or a node that sent no lease key ends
//! the attempt with `credential_rejected`, which is never retried elsewhere
//! (`gate::retryable`). A credential never appears in logs, metrics, admin
//! output or error messages: errors name the profile or the file only.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use iop_proto::config::{EdgeConfig, ProviderEntry};
use iop_proto::lease::MAX_CREDENTIAL_BYTES;
use iop_proto::pb::{self, FailureKind};
use zeroize::Zeroizing;

use crate::EdgeState;
use crate::admission::Lease;

/// How long a lease may be opened after it was sealed. It is sealed right
/// before dispatch and opened right after, so this only has to cover the
/// transit and the clock difference between the cluster and a Mac.
pub const LEASE_TTL: Duration = Duration::from_secs(120);

/// One loaded profile.
struct Profile {
    secret: Zeroizing<Vec<u8>>,
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

impl Credentials {
    /// Reads every profile's file (already resolved against the config's
    /// directory). The error names the profile and file, never the content.
    pub fn load(config: &EdgeConfig) -> Result<Self, String> {
        let mut profiles = HashMap::new();
        for (i, c) in config.credentials.iter().enumerate() {
            let at = format!("credentials[{i}].file");
            let bytes = Zeroizing::new(
                std::fs::read(&c.file).map_err(|e| format!("{at}: cannot read {}: {e}", c.file.display()))?,
            );
            let secret = bytes.trim_ascii();
            if secret.is_empty() || secret.len() > MAX_CREDENTIAL_BYTES {
                return Err(format!("{at}: {} must hold 1 to {MAX_CREDENTIAL_BYTES} bytes", c.file.display()));
            }
            // It becomes an `Authorization: Bearer` value on the node.
            if secret.iter().any(|b| !b.is_ascii_graphic()) {
                return Err(format!("{at}: {} must hold printable ASCII without spaces", c.file.display()));
            }
            let profile =
                Profile { secret: Zeroizing::new(secret.to_vec()), revision: c.revision, disabled: c.disabled };
            profiles.insert(c.profile.clone(), profile);
        }
        Ok(Self { profiles })
    }

    /// The files whose content a reload watches.
    pub fn files(config: &EdgeConfig) -> impl Iterator<Item = &PathBuf> {
        config.credentials.iter().map(|c| &c.file)
    }
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

/// What a lease is sealed for besides the slot lease: who asked for what.
pub struct LeaseScope<'a> {
    pub principal: &'a str,
    pub route: &'a str,
}

/// The lease for the execution `lease` on `provider`, or `None` when the
/// provider has no managed credential.
pub fn lease_for(
    state: &EdgeState,
    scope: &LeaseScope<'_>,
    provider: Option<&ProviderEntry>,
    lease: &Lease,
) -> Result<Option<pb::SealedLease>, pb::ExecutionFailure> {
    let Some((provider, credential)) = provider.and_then(|p| p.credential.as_ref().map(|c| (p, c))) else {
        return Ok(None);
    };
    let rejected = |reason: &'static str| {
        state.metrics.reason(&state.metrics.lease_refusals, reason);
        pb::ExecutionFailure::new(
            FailureKind::CredentialRejected,
            format!("the provider's managed credential could not be leased ({reason})"),
        )
    };
    let secrets = state.config.secrets();
    let profile = secrets.credentials.profiles.get(&credential.profile).ok_or_else(|| rejected("unknown_profile"))?;
    if profile.disabled {
        return Err(rejected("disabled"));
    }
    let key = match state.registry.lease_key(lease.node(), lease.generation()) {
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
    let identity = iop_proto::identity::NodeIdentity::new(state.config.current().trust_domain.clone(), lease.node())
        .map_err(|_| rejected("invalid_node"))?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let fault = state.lease_fault;
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
    let mut sealed = iop_proto::lease::seal(&recipient, &identity.uri(), &binding, &profile.secret)
        .map_err(|_| rejected("seal_failed"))?;
    match fault {
        Some(LeaseFault::Tamper) => sealed.ciphertext[0] ^= 1,
        Some(LeaseFault::Replay) => sealed = state.first_lease.get_or_init(|| sealed.clone()).clone(),
        _ => {}
    }
    state.metrics.leases_sealed.inc();
    Ok(Some(sealed))
}
