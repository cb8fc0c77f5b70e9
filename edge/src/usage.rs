//! Usage accounting: every finished model request (chat, responses,
//! messages, embeddings; jobs included) is counted once, when its response
//! is done or abandoned, by principal, public model and outcome, with the
//! tokens its answer reported:
//!
//! - in the metrics `iop_edge_tokens_total{principal,model,kind}` and
//!   `iop_edge_principal_errors_total{principal}`;
//! - in the totals since start `GET /admin/v1/usage` shows (this replica's;
//!   a Prometheus query sums the replicas);
//! - against the principal's tokens per minute (`crate::ratelimit`).
//!
//! Tokens are the usage the answer reported: a normalized run's usage event
//! (a continued stream's is one for the whole answer), a tunnel's as the
//! node read it from the relayed body (`TunnelEnd.usage`). An answer that
//! reported none (a provider that omits usage, a stream the client left
//! before its end) counts as a request without tokens. `input` is the
//! prompt, `output` every generated token, `reasoning` the part of `output`
//! the provider reports as reasoning.
//!
//! Labels are closed: principals are the keys file's (`anonymous` with
//! authentication off), models the config's public names (`unknown` for a
//! request that named none).

use std::collections::BTreeMap;
use std::sync::Mutex;

use iop_proto::pb;
use serde::Serialize;

use crate::auth::Caller;
use crate::metrics::{EdgeMetrics, PrincipalLabels, TokenLabels};
use crate::ratelimit::RateLimits;

/// Outcomes that are not the gateway's or the provider's error.
const NOT_ERRORS: [&str; 2] = ["ok", "client_disconnected"];

/// Per-principal totals since this replica started.
#[derive(Debug)]
pub struct UsageLedger {
    since: time::OffsetDateTime,
    principals: Mutex<BTreeMap<String, PrincipalUsage>>,
}

impl Default for UsageLedger {
    fn default() -> Self {
        Self { since: time::OffsetDateTime::now_utc(), principals: Mutex::default() }
    }
}

/// One principal's totals, and the same per public model.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct PrincipalUsage {
    #[serde(flatten)]
    pub totals: Totals,
    pub models: BTreeMap<String, Totals>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub requests: u64,
    pub errors: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
}

impl Totals {
    fn add(&mut self, error: bool, usage: &Tokens) {
        self.requests += 1;
        self.errors += u64::from(error);
        self.input_tokens += usage.input;
        self.output_tokens += usage.output;
        self.reasoning_tokens += usage.reasoning;
    }
}

/// An answer's tokens by kind (reasoning is part of output).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
    pub reasoning: u64,
}

impl Tokens {
    /// The one reading of a usage report. A reasoning count above the
    /// output count (a provider's inconsistency) is capped at it.
    pub fn of(usage: Option<&pb::Usage>) -> Self {
        usage.map_or_else(Self::default, |u| Self {
            input: u64::from(u.prompt_tokens),
            output: u64::from(u.completion_tokens),
            reasoning: u64::from(u.reasoning_tokens.min(u.completion_tokens)),
        })
    }

    /// What counts against tokens per minute: input + output.
    pub fn billed(&self) -> u64 {
        self.input + self.output
    }
}

impl UsageLedger {
    /// Adds one finished request.
    pub fn add(&self, principal: &str, model: &str, error: bool, tokens: &Tokens) {
        let mut principals = self.principals.lock().expect("usage ledger lock");
        let entry = principals.entry(principal.to_string()).or_default();
        entry.totals.add(error, tokens);
        entry.models.entry(model.to_string()).or_default().add(error, tokens);
    }

    /// `GET /admin/v1/usage`: every principal's totals since start.
    pub fn snapshot(&self) -> serde_json::Value {
        let principals = self.principals.lock().expect("usage ledger lock").clone();
        let since = self.since.format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
        serde_json::json!({ "since": since, "principals": principals })
    }
}

/// Accounts one finished request of `caller` on `model` (`unknown` when it
/// named none), that ended as `outcome`, with the usage its answer reported.
pub fn finished(
    ledger: &UsageLedger,
    rate_limits: &RateLimits,
    metrics: &EdgeMetrics,
    caller: &Caller,
    model: &str,
    outcome: &str,
    usage: Option<&pb::Usage>,
) {
    let principal = caller.name();
    let tokens = Tokens::of(usage);
    let error = !NOT_ERRORS.contains(&outcome);
    ledger.add(principal, model, error, &tokens);
    if error {
        metrics.principal_errors.get_or_create(&PrincipalLabels { principal: principal.to_string() }).inc();
    }
    for (kind, n) in [("input", tokens.input), ("output", tokens.output), ("reasoning", tokens.reasoning)] {
        let labels = TokenLabels { principal: principal.to_string(), model: model.to_string(), kind };
        // Created even at 0, so every principal's series exist once it asked.
        metrics.tokens.get_or_create(&labels).inc_by(n);
    }
    if tokens.billed() > 0 {
        rate_limits.charge_tokens(principal, tokens.billed());
    }
}

#[cfg(test)]
mod tests;
