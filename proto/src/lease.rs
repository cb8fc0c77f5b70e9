//! Managed credential leases: one definition of how the Edge seals a
//! provider credential for one execution and how the node opens it.
//!
//! HPKE (RFC 9180) base mode with DHKEM(X25519, HKDF-SHA256), HKDF-SHA256 and
//! ChaCha20-Poly1305 (the `hpke` crate). The recipient key is one the node
//! generated for its current connection ([`LeaseKey`]); `info` names the
//! recipient node identity, so a lease for one node cannot be opened as
//! another's even with the same key; the associated data is the encoded
//! [`pb::LeaseBinding`], so its fields cannot be changed without the open
//! failing. The sender is authenticated by the mTLS channel the lease
//! travels on, not by HPKE.
//!
//! What a binding must match is the node's decision (`iop_node::lease`);
//! here is only the cryptography and its encoding.

use hpke::kem::X25519HkdfSha256;
use hpke::{Deserializable, Kem as _, OpModeR, OpModeS, Serializable};
use prost::Message;

use crate::pb;

type Kem = X25519HkdfSha256;
type Aead = hpke::aead::ChaCha20Poly1305;
type Kdf = hpke::kdf::HkdfSha256;

/// Length of an encoded lease public key.
pub const PUBLIC_KEY_LEN: usize = 32;
/// Largest credential the Edge seals (an API key or bearer token).
pub const MAX_CREDENTIAL_BYTES: usize = 8 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LeaseCryptoError {
    #[error("the lease public key is not a valid X25519 key")]
    InvalidPublicKey,
    #[error("the lease could not be sealed")]
    Seal,
    /// Wrong recipient (another key or node), or altered in transit.
    #[error("the lease could not be opened")]
    Open,
    #[error("the lease binding is not a valid message")]
    Binding,
}

/// Why a credential value cannot be used. Secret-free: it never carries the
/// value or any part of it, so it may be logged and shown in status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CredentialValueError {
    /// Nothing but whitespace.
    #[error("the value is empty")]
    Empty,
    /// Longer than [`MAX_CREDENTIAL_BYTES`] after trimming.
    #[error("the value is longer than {MAX_CREDENTIAL_BYTES} bytes")]
    TooLong,
    /// A space, a control byte or a non-ASCII byte inside: it becomes an
    /// `Authorization: Bearer` value on the node, which such bytes break.
    #[error("the value must be printable ASCII without spaces")]
    NotPrintable,
}

impl CredentialValueError {
    /// Stable names (metric labels, condition reasons' details).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::TooLong => "too_long",
            Self::NotPrintable => "not_printable",
        }
    }
}

/// The one rule for a managed credential's value (the Edge loading a
/// profile's file, the operator copying a Secret's key): surrounding ASCII
/// whitespace is trimmed (a file's trailing newline), and what is left must
/// be 1..=[`MAX_CREDENTIAL_BYTES`] bytes of printable ASCII without spaces.
/// Returns the trimmed value.
pub fn check_credential(value: &[u8]) -> Result<&[u8], CredentialValueError> {
    let trimmed = value.trim_ascii();
    if trimmed.is_empty() {
        return Err(CredentialValueError::Empty);
    }
    if trimmed.len() > MAX_CREDENTIAL_BYTES {
        return Err(CredentialValueError::TooLong);
    }
    if trimmed.iter().any(|b| !b.is_ascii_graphic()) {
        return Err(CredentialValueError::NotPrintable);
    }
    Ok(trimmed)
}

fn info(node_identity: &str) -> Vec<u8> {
    let mut info = b"iop.v1 credential lease for ".to_vec();
    info.extend_from_slice(node_identity.as_bytes());
    info
}

/// Seals `credential` for `binding` to the node key `recipient`
/// (`Register.lease_public_key`) of node `node_identity` (its SPIFFE URI).
pub fn seal(
    recipient: &[u8],
    node_identity: &str,
    binding: &pb::LeaseBinding,
    credential: &[u8],
) -> Result<pb::SealedLease, LeaseCryptoError> {
    let recipient =
        <Kem as hpke::Kem>::PublicKey::from_bytes(recipient).map_err(|_| LeaseCryptoError::InvalidPublicKey)?;
    let binding = binding.encode_to_vec();
    let (encapped, ciphertext) = hpke::single_shot_seal::<Aead, Kdf, Kem>(
        &OpModeS::Base,
        &recipient,
        &info(node_identity),
        credential,
        &binding,
    )
    .map_err(|_| LeaseCryptoError::Seal)?;
    Ok(pb::SealedLease { binding, encapped_key: encapped.to_bytes().to_vec(), ciphertext })
}

/// The node's key pair for one connection. Dropping it forgets the private
/// key (the `hpke` key types zeroize themselves).
pub struct LeaseKey {
    private: <Kem as hpke::Kem>::PrivateKey,
    public: Vec<u8>,
}

impl std::fmt::Debug for LeaseKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseKey").finish_non_exhaustive()
    }
}

/// An opened lease: its (authenticated) binding and the credential. The
/// credential is wiped from memory when this is dropped.
pub struct Opened {
    pub binding: pb::LeaseBinding,
    pub credential: zeroize::Zeroizing<Vec<u8>>,
}

impl LeaseKey {
    /// A fresh key pair from the operating system's random source.
    pub fn generate() -> Self {
        let (private, public) = Kem::gen_keypair();
        Self { private, public: public.to_bytes().to_vec() }
    }

    /// For `Register.lease_public_key`.
    pub fn public_key(&self) -> &[u8] {
        &self.public
    }

    /// Opens a lease sealed to this key for node `node_identity`.
    pub fn open(&self, node_identity: &str, sealed: &pb::SealedLease) -> Result<Opened, LeaseCryptoError> {
        let encapped =
            <Kem as hpke::Kem>::EncappedKey::from_bytes(&sealed.encapped_key).map_err(|_| LeaseCryptoError::Open)?;
        let credential = hpke::single_shot_open::<Aead, Kdf, Kem>(
            &OpModeR::Base,
            &self.private,
            &encapped,
            &info(node_identity),
            &sealed.ciphertext,
            &sealed.binding,
        )
        .map(zeroize::Zeroizing::new)
        .map_err(|_| LeaseCryptoError::Open)?;
        // Authenticated above: decoding can only fail for a sender bug.
        let binding = pb::LeaseBinding::decode(sealed.binding.as_slice()).map_err(|_| LeaseCryptoError::Binding)?;
        Ok(Opened { binding, credential })
    }
}

#[cfg(test)]
mod tests;

/// A node's refusal of a lease: the closed label (metrics, logs, the Edge's
/// admin API) and the terminal the execution ends with.
impl pb::LeaseRefusal {
    pub fn label(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
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

    /// The `credential_rejected` terminal that carries this refusal.
    pub fn to_failure(self) -> pb::ExecutionFailure {
        pb::ExecutionFailure {
            lease_refusal: self.into(),
            ..pb::ExecutionFailure::new(
                pb::FailureKind::CredentialRejected,
                format!("the node refused the credential lease ({})", self.label()),
            )
        }
    }
}
