//! Per-principal request limits: requests per minute, tokens per minute and
//! requests at once (`auth::PrincipalLimits`), each replica enforcing its
//! share of the replica set.
//!
//! CONTRACT (issue 30): `RateLimits::admit` is called once per client
//! request after authentication and before the body is parsed; the
//! `Permit` it returns lives as long as the request (the response body
//! included). `charge_tokens` is called once per finished answer with its
//! input + output tokens (`crate::usage`). Until the limits lane lands,
//! every request is admitted.

use crate::auth::Caller;
use crate::ingress::error::ApiError;

/// Every principal's recent requests and tokens on this replica.
#[derive(Debug, Default)]
pub struct RateLimits {}

/// A request's place in its principal's concurrency limit, given back on drop.
#[derive(Debug)]
pub struct Permit {}

impl RateLimits {
    /// Admits one request of `caller`, or says which limit it is over and
    /// when to retry. `replicas`: how many replicas share the limits.
    pub fn admit(&self, caller: &Caller, replicas: usize) -> Result<Permit, ApiError> {
        let _ = (caller, replicas);
        Ok(Permit {})
    }

    /// Counts a finished answer's tokens against `principal`'s tokens per minute.
    pub fn charge_tokens(&self, principal: &str, tokens: u64) {
        let _ = (principal, tokens);
    }
}
