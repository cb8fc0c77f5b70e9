//! Usage accounting: what a team bills and budgets from.
//!
//! - **Requests** are counted once each, when the response is done or
//!   abandoned, by principal, public model and outcome
//!   ([`Accounting::finished`]).
//! - **Tokens** are charged per attempt, when the attempt's run ends,
//!   however it ends: finished, failed, cut, stalled, continued, or
//!   abandoned by its client (the Edge then keeps reading the cancelled
//!   run until its node says what it used; `crate::dispatch`). An attempt
//!   is charged the last usage its node reported: the provider's own
//!   counts where it gave them, else the node's (output: the streamed
//!   deltas it relayed; input: an estimate from the request's size, once
//!   the provider had the prompt), marked in `source`.
//! - A node's report is **bounded** by what the attempt could have used
//!   ([`Bounds::clamp`]): a hostile or broken node moves a principal's
//!   figures by at most its request's bound.
//!
//! Charges reach, each once: the totals since start `GET /admin/v1/usage`
//! shows (this replica's; a Prometheus query sums the replicas), the
//! metrics `iop_edge_tokens_total{principal,model,kind,source}`, and the
//! principal's tokens per minute (`crate::ratelimit`, which reserved an
//! estimate at admission and gives it back when the request ends).
//!
//! Labels are closed: principals are the keys file's (`anonymous` with
//! authentication off), models the config's public names (`unknown` for a
//! request that named none), nodes the config's.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iop_proto::pb;
use serde::Serialize;

use crate::auth::Caller;
use crate::metrics::{EdgeMetrics, NodeLabels, PrincipalLabels, TokenLabels};
use crate::ratelimit::RateLimits;

/// Outcomes that are not the gateway's or the provider's error.
const NOT_ERRORS: [&str; 2] = ["ok", "client_disconnected"];
/// What a provider adds to a prompt besides the request's own bytes (its
/// chat template, a system prompt of its own): part of an attempt's input
/// bound.
pub const PROMPT_FRAMING: u64 = 1024;
/// Tokens an answer may hold beyond one per byte it relayed (special
/// tokens that print nothing).
pub const OUTPUT_SLACK: u64 = 16;
/// Output tokens reserved at admission for a request that sets no
/// `max_tokens` (`crate::ratelimit`).
pub const DEFAULT_OUTPUT_RESERVE: u64 = 1024;
/// How often a node's out-of-bounds reports are logged (each counted).
const REJECTION_LOG_EVERY: Duration = Duration::from_secs(60);

/// How a count was obtained (the metric label `source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The provider reported it.
    Provider,
    /// The node counted the deltas it relayed.
    Counted,
    /// Estimated from the request's size.
    Estimated,
}

impl Source {
    pub fn label(self) -> &'static str {
        match self {
            Self::Provider => "provider",
            Self::Counted => "counted",
            Self::Estimated => "estimated",
        }
    }

    fn of(wire: pb::UsageSource) -> Self {
        match wire {
            pb::UsageSource::Unspecified | pb::UsageSource::Provider => Self::Provider,
            pb::UsageSource::Counted => Self::Counted,
            pb::UsageSource::Estimated => Self::Estimated,
        }
    }
}

/// What one attempt is charged (reasoning is part of output).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub input: u64,
    pub output: u64,
    pub reasoning: u64,
    pub input_source: Source,
    pub output_source: Source,
}

impl Charge {
    /// What counts against tokens per minute: input + output.
    pub fn billed(&self) -> u64 {
        self.input + self.output
    }
}

/// The most one attempt of a request may be charged, whatever its node
/// reports: every byte of the request a prompt token plus
/// [`PROMPT_FRAMING`]; at most the request's `max_tokens` of output, and
/// at most one token per byte of answer the node relayed plus
/// [`OUTPUT_SLACK`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub input: u64,
    pub max_output: Option<u64>,
}

impl Bounds {
    /// The bounds of `request`, sent as `body_bytes` (a tunnel's body, or
    /// the request's encoded size).
    pub fn of(request: &pb::RunRequest, body_bytes: usize) -> Self {
        let bytes = body_bytes.max(prost::Message::encoded_len(request)) as u64;
        let max_output = request.options.as_ref().and_then(|o| o.max_tokens).map(u64::from);
        Self { input: bytes.saturating_add(PROMPT_FRAMING), max_output }
    }

    /// `usage` within the bounds, for an attempt that relayed `relayed`
    /// bytes of answer; and whether anything was cut. Pure.
    pub fn clamp(&self, usage: &pb::Usage, relayed: u64) -> (Charge, bool) {
        let output_bound = relayed.saturating_add(OUTPUT_SLACK).min(self.max_output.unwrap_or(u64::MAX));
        let (reported_input, reported_output) = (u64::from(usage.prompt_tokens), u64::from(usage.completion_tokens));
        let input = reported_input.min(self.input);
        let output = reported_output.min(output_bound);
        let charge = Charge {
            input,
            output,
            reasoning: u64::from(usage.reasoning_tokens).min(output),
            input_source: Source::of(usage.input_source()),
            output_source: Source::of(usage.output_source()),
        };
        (charge, input < reported_input || output < reported_output)
    }
}

/// What a request reserves of its principal's tokens per minute at
/// admission (`crate::ratelimit`): its input estimate and its
/// `max_tokens`, else [`DEFAULT_OUTPUT_RESERVE`] (none for an embedding).
pub fn reservation(request: &pb::RunRequest) -> u64 {
    let output = match (&request.embed, request.options.as_ref().and_then(|o| o.max_tokens)) {
        (Some(_), _) => 0,
        (None, Some(max_tokens)) => u64::from(max_tokens),
        (None, None) => DEFAULT_OUTPUT_RESERVE,
    };
    iop_proto::usage::estimate_request_input(request) + output
}

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
    /// Of `input_tokens`, those no provider reported (estimated).
    pub input_tokens_unreported: u64,
    /// Of `output_tokens`, those no provider reported (the node's count).
    pub output_tokens_unreported: u64,
}

impl Totals {
    fn charge(&mut self, charge: &Charge) {
        self.input_tokens += charge.input;
        self.output_tokens += charge.output;
        self.reasoning_tokens += charge.reasoning;
        if charge.input_source != Source::Provider {
            self.input_tokens_unreported += charge.input;
        }
        if charge.output_source != Source::Provider {
            self.output_tokens_unreported += charge.output;
        }
    }
}

impl UsageLedger {
    fn with(&self, principal: &str, model: &str, update: impl Fn(&mut Totals)) {
        let mut principals = self.principals.lock().expect("usage ledger lock");
        let entry = principals.entry(principal.to_string()).or_default();
        update(&mut entry.totals);
        update(entry.models.entry(model.to_string()).or_default());
    }

    /// Counts one finished request.
    pub fn request(&self, principal: &str, model: &str, error: bool) {
        self.with(principal, model, |t| {
            t.requests += 1;
            t.errors += u64::from(error);
        });
    }

    /// Adds one attempt's charge.
    pub fn charge(&self, principal: &str, model: &str, charge: &Charge) {
        self.with(principal, model, |t| t.charge(charge));
    }

    /// `GET /admin/v1/usage`: every principal's totals since start.
    pub fn snapshot(&self) -> serde_json::Value {
        let principals = self.principals.lock().expect("usage ledger lock").clone();
        let since = self.since.format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
        serde_json::json!({ "since": since, "principals": principals })
    }
}

/// Where requests and charges go: the ledger, the metrics and the
/// principals' token limits.
pub struct Accounting {
    pub ledger: UsageLedger,
    rate_limits: Arc<RateLimits>,
    metrics: Arc<EdgeMetrics>,
    /// When each node's out-of-bounds report was last logged.
    rejections_logged: Mutex<HashMap<String, Instant>>,
}

impl Accounting {
    pub fn new(rate_limits: Arc<RateLimits>, metrics: Arc<EdgeMetrics>) -> Arc<Self> {
        Arc::new(Self { ledger: UsageLedger::default(), rate_limits, metrics, rejections_logged: Mutex::default() })
    }

    /// Counts one finished request of `caller` on `model` (`unknown` when
    /// it named none) that ended as `outcome`. Its tokens are its
    /// attempts' ([`Account`]).
    pub fn finished(&self, caller: &Caller, model: &str, outcome: &str) {
        let principal = caller.name();
        let error = !NOT_ERRORS.contains(&outcome);
        self.ledger.request(principal, model, error);
        if error {
            self.metrics.principal_errors.get_or_create(&PrincipalLabels { principal: principal.to_string() }).inc();
        }
        // Created even at 0, so every principal's series exist once it asked.
        for kind in ["input", "output", "reasoning"] {
            let labels = TokenLabels {
                principal: principal.to_string(),
                model: model.to_string(),
                kind,
                source: Source::Provider.label(),
            };
            self.metrics.tokens.get_or_create(&labels).inc_by(0);
        }
    }

    /// Who pays for the attempts of a request of `caller` on `model`, each
    /// within `bounds`.
    pub fn account(self: &Arc<Self>, caller: &Caller, model: &str, bounds: Bounds) -> Account {
        Account { accounting: self.clone(), principal: caller.name().to_string(), model: model.to_string(), bounds }
    }

    fn charge(&self, account: &Account, usage: &pb::Usage, relayed: u64) {
        // Bounded as it arrived (`Account::bound`): here the clamp only
        // reads it into a charge.
        let (charge, _) = account.bounds.clamp(usage, relayed);
        let (principal, model) = (&account.principal, &account.model);
        self.ledger.charge(principal, model, &charge);
        for (kind, n, source) in [
            ("input", charge.input, charge.input_source),
            ("output", charge.output, charge.output_source),
            ("reasoning", charge.reasoning, charge.output_source),
        ] {
            if n == 0 {
                continue;
            }
            let labels =
                TokenLabels { principal: principal.clone(), model: model.clone(), kind, source: source.label() };
            self.metrics.tokens.get_or_create(&labels).inc_by(n);
        }
        if charge.billed() > 0 {
            self.rate_limits.charge_tokens(principal, charge.billed());
        }
    }

    /// A node reported more than an attempt could have used: counted each
    /// time, logged once a minute per node.
    fn rejected(&self, node: &str, usage: &pb::Usage, bounds: &Bounds, relayed: u64) {
        self.metrics.node_usage_rejected.get_or_create(&NodeLabels { node: node.to_string() }).inc();
        let now = Instant::now();
        let mut logged = self.rejections_logged.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if logged.get(node).is_some_and(|at| now.duration_since(*at) < REJECTION_LOG_EVERY) {
            return;
        }
        logged.insert(node.to_string(), now);
        tracing::warn!(
            node,
            prompt_tokens = usage.prompt_tokens,
            completion_tokens = usage.completion_tokens,
            input_bound = bounds.input,
            max_output = bounds.max_output,
            relayed_bytes = relayed,
            "a node reported more tokens than its run could have used; charged the bound"
        );
    }
}

/// Who pays for one request's attempts, and the most each may be charged.
/// Each attempt's run charges it once, when the run ends
/// (`crate::dispatch`).
#[derive(Clone)]
pub struct Account {
    accounting: Arc<Accounting>,
    principal: String,
    model: String,
    bounds: Bounds,
}

impl Account {
    /// Bounds a `usage` the run on `node` reported, having relayed
    /// `relayed` bytes of answer so far: counted and logged when it had to.
    pub fn bound(&self, node: &str, usage: &mut pb::Usage, relayed: u64) {
        let (charge, clamped) = self.bounds.clamp(usage, relayed);
        if !clamped {
            return;
        }
        self.accounting.rejected(node, usage, &self.bounds, relayed);
        let to_u32 = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        usage.prompt_tokens = to_u32(charge.input);
        usage.completion_tokens = to_u32(charge.output);
        usage.reasoning_tokens = to_u32(charge.reasoning);
    }

    /// Charges one attempt the last `usage` its run reported (nothing
    /// without one), having relayed `relayed` bytes of answer.
    pub fn charge(&self, usage: Option<&pb::Usage>, relayed: u64) {
        if let Some(usage) = usage {
            self.accounting.charge(self, usage, relayed);
        }
    }
}

#[cfg(test)]
mod tests;
