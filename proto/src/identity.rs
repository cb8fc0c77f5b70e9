//! Node workload identity: exactly one URI SAN `spiffe://<trust-domain>/node/<name>`
//! in the node's client certificate (SPIFFE X509-SVID rules).

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeIdentity {
    pub trust_domain: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("identity `{0}` is not a spiffe:// URI")]
    NotSpiffe(String),
    #[error("identity `{0}` does not have the form spiffe://<trust-domain>/node/<name>")]
    NotANode(String),
    #[error("name `{0}` is not a valid node name (1-63 of a-z, 0-9, '-', starting with a letter or digit)")]
    InvalidName(String),
    #[error("trust domain `{0}` is not a lowercase DNS-like name (1-255 of a-z, 0-9, '.', '-')")]
    InvalidTrustDomain(String),
}

impl NodeIdentity {
    pub fn new(trust_domain: impl Into<String>, name: impl Into<String>) -> Result<Self, IdentityError> {
        let name = name.into();
        validate_name(&name)?;
        Ok(Self { trust_domain: trust_domain.into(), name })
    }

    pub fn uri(&self) -> String {
        format!("spiffe://{}/node/{}", self.trust_domain, self.name)
    }

    pub fn parse(uri: &str) -> Result<Self, IdentityError> {
        let rest = uri.strip_prefix("spiffe://").ok_or_else(|| IdentityError::NotSpiffe(uri.to_string()))?;
        let (trust_domain, path) = rest.split_once('/').ok_or_else(|| IdentityError::NotANode(uri.to_string()))?;
        let name = path.strip_prefix("node/").ok_or_else(|| IdentityError::NotANode(uri.to_string()))?;
        if trust_domain.is_empty() {
            return Err(IdentityError::NotANode(uri.to_string()));
        }
        Self::new(trust_domain, name)
    }
}

/// Node names are DNS-label-like so they are safe in URIs, Kubernetes object
/// names and log fields.
pub fn validate_name(name: &str) -> Result<(), IdentityError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok { Ok(()) } else { Err(IdentityError::InvalidName(name.to_string())) }
}

/// A trust domain is a lowercase DNS-like name: the Edge config's
/// `trust_domain`, the operator's `IOP_TRUST_DOMAIN` and `iop-edge pki node
/// --trust-domain` all hold to this rule.
pub fn validate_trust_domain(trust_domain: &str) -> Result<(), IdentityError> {
    let ok = !trust_domain.is_empty()
        && trust_domain.len() <= 255
        && trust_domain.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if ok { Ok(()) } else { Err(IdentityError::InvalidTrustDomain(trust_domain.to_string())) }
}

impl fmt::Display for NodeIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.uri())
    }
}

#[cfg(test)]
mod tests;
