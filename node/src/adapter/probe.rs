//! The one definition of "is this provider healthy?", used by every check the
//! node makes: readiness, the periodic health monitor, the exact-target probe
//! after a stall or an unreachable provider, and CAPABILITIES.
//!
//! A probe is one metadata call, never a generation, so it never loads a
//! model:
//!
//! | adapter            | call                                   | healthy when |
//! |--------------------|----------------------------------------|--------------|
//! | Ollama             | `POST /api/show {"model": <target>}`   | 2xx: the server runs and has this exact tag |
//! | OpenAI-compatible  | `GET /v1/models`                       | 2xx          |
//!
//! The OpenAI-compatible check deliberately does not require the target in
//! the listing: many servers (llama.cpp's, LM Studio with JIT loading) serve
//! a model they do not list, or ignore the model name altogether, and a probe
//! must never be stricter than the provider itself. Any other status or a
//! failed connection is `Unavailable`; a probe that does not answer within
//! [`PROBE_TIMEOUT`] is `Unknown`.
//!
//! A provider whose credential the Edge manages is probed without one (the
//! node holds credentials only for the call a lease is for), so for it a
//! `401` or `403` means "the server is up and wants its key": available.
//! Whether the key itself is good shows in the runs.

use std::fmt;
use std::time::Duration;

use iop_proto::pb;

use super::error::error_chain;
use super::target::{AdapterKind, ProviderTarget};

/// Upper bound of one probe.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a probe did not find the provider available (for logs; closed set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeFailure {
    /// No HTTP answer: refused, reset, DNS, TLS.
    Unreachable(String),
    /// The metadata call answered with a non-2xx status.
    Status(u16),
    TimedOut,
}

impl ProbeFailure {
    /// A closed label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Unreachable(_) => "unreachable",
            Self::Status(_) => "status",
            Self::TimedOut => "timed_out",
        }
    }
}

impl fmt::Display for ProbeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreachable(why) => write!(f, "metadata call failed: {why}"),
            Self::Status(status) => write!(f, "metadata call answered HTTP {status}"),
            Self::TimedOut => write!(f, "no answer within {} s", PROBE_TIMEOUT.as_secs()),
        }
    }
}

/// The verdict of one probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub health: pb::ProviderHealth,
    /// Why it is not available; `None` when it is.
    pub failure: Option<ProbeFailure>,
}

impl Probe {
    fn available() -> Self {
        Self { health: pb::ProviderHealth::Available, failure: None }
    }

    fn failed(failure: ProbeFailure) -> Self {
        let health = match failure {
            ProbeFailure::TimedOut => pb::ProviderHealth::Unknown,
            ProbeFailure::Unreachable(_) | ProbeFailure::Status(_) => pb::ProviderHealth::Unavailable,
        };
        Self { health, failure: Some(failure) }
    }
}

/// Probes `target` once, bounded by [`PROBE_TIMEOUT`].
pub async fn probe(client: &reqwest::Client, target: &ProviderTarget) -> Probe {
    let request = match target.adapter {
        AdapterKind::Ollama => ollama_show(client, target),
        AdapterKind::OpenAi => client.get(target.url("/v1/models")),
    };
    match tokio::time::timeout(PROBE_TIMEOUT, request.send()).await {
        Err(_) => Probe::failed(ProbeFailure::TimedOut),
        Ok(Err(e)) if e.is_timeout() => Probe::failed(ProbeFailure::TimedOut),
        // The node's logs may name the provider, never its address.
        Ok(Err(e)) => Probe::failed(ProbeFailure::Unreachable(error_chain(&e.without_url()))),
        Ok(Ok(response)) if response.status().is_success() => Probe::available(),
        Ok(Ok(response)) if target.credential_profile.is_some() && matches!(response.status().as_u16(), 401 | 403) => {
            Probe::available()
        }
        Ok(Ok(response)) => Probe::failed(ProbeFailure::Status(response.status().as_u16())),
    }
}

/// Ollama's metadata call for the exact target: `POST /api/show`.
pub(super) fn ollama_show(client: &reqwest::Client, target: &ProviderTarget) -> reqwest::RequestBuilder {
    client
        .post(target.url("/api/show"))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(serde_json::json!({ "model": target.target_model }).to_string())
}

#[cfg(test)]
mod tests;
