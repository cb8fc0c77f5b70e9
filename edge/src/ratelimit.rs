//! Per-principal request limits: requests per minute, tokens per minute and
//! requests at once (`auth::PrincipalLimits`), each replica enforcing its
//! share of the replica set.
//!
//! `RateLimits::admit` is called once per client request after
//! authentication and before the body is parsed; the `Permit` it returns
//! lives as long as the request (the response body included).
//! `charge_tokens` is called once per finished answer with its input +
//! output tokens (`crate::usage`).
//!
//! # The algorithm: GCRA, a token bucket with a one-minute burst
//!
//! Each per-minute limit of `share` units is a bucket that holds `share`
//! units and refills continuously at `share` per minute: a fresh principal
//! may spend its whole minute at once, and from then on gets one unit every
//! `60 s / share`. It is kept as GCRA (the generic cell rate algorithm):
//! one instant per limit, the moment the units spent so far are paid back
//! ("drained"), so the state is O(1) per principal whatever the limit.
//! Why not the others:
//! - a fixed window (count per calendar minute) lets a client spend twice
//!   its limit across a window's edge, and makes every client retry at
//!   the same instant;
//! - a sliding log (one timestamp per request) is exact but holds up to
//!   the limit's worth of timestamps per principal (a million for a large
//!   tokens-per-minute limit);
//! - a sliding window counter approximates the log; the bucket is as
//!   cheap, needs no approximation, and recovers smoothly.
//!
//! It is also what Anthropic documents for its own limits (a continuously
//! replenished bucket), so its `anthropic-ratelimit-*-reset` (when the
//! bucket is full again) and OpenAI's `x-ratelimit-reset-*` (when the
//! limit is back to its initial state) are both the drain instant.
//!
//! Tokens are known only when an answer ends, so they are reserved, then
//! settled: once its body is read, a request reserves its input estimate
//! and its `max_tokens` (or `usage::DEFAULT_OUTPUT_RESERVE`), refused while
//! the tokens charged and reserved fill the bucket; when it ends the
//! reservation is given back, and each of its attempts was charged what it
//! used (`crate::usage`). Parallel requests therefore take the bucket past
//! full by at most one reservation, plus what answers in flight use
//! beyond theirs (an input estimate that fell short; output past the
//! default of a request without `max_tokens`). An answer is charged whole,
//! up to [`MAX_BACKLOG`] of debt, which later requests then wait out.
//!
//! # Replicas
//!
//! Each replica enforces `share = ceil(limit / replicas)` of every limit on
//! its own (no shared store): the sum of the shares is at most `limit +
//! replicas - 1`; a client pinned to one replica gets only its share; while
//! the replica set changes, replicas may briefly hold old and new shares.
//! A changed share (a keys reload, a replica-set change) keeps what was
//! counted: the units spent are paid back at the new share's rate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::auth::{Caller, PrincipalLimits};

/// What every per-minute limit counts over.
pub const WINDOW: Duration = Duration::from_secs(60);
/// When a client refused for concurrency is told to come back: nothing
/// says when one of its requests ends.
pub const CONCURRENCY_RETRY: Duration = Duration::from_secs(1);
/// The most debt one principal's tokens can run up (a day): bounds the
/// instants kept.
pub const MAX_BACKLOG: Duration = Duration::from_secs(24 * 3600);
/// How often meters of principals that are idle (nothing in flight,
/// buckets full) are dropped.
const PRUNE_EVERY: Duration = WINDOW;

/// Which limit refused a request (also the metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    Requests,
    Tokens,
    Concurrency,
}

impl Limit {
    pub fn label(self) -> &'static str {
        match self {
            Self::Requests => "requests",
            Self::Tokens => "tokens",
            Self::Concurrency => "concurrency",
        }
    }

    /// How the limit is named to clients.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Requests => "requests per minute",
            Self::Tokens => "tokens per minute",
            Self::Concurrency => "requests at once",
        }
    }
}

/// This replica's share of a limit shared by `replicas` replicas (at least 1).
pub fn share(limit: u32, replicas: usize) -> u32 {
    let replicas = u32::try_from(replicas.max(1)).unwrap_or(u32::MAX);
    limit.div_ceil(replicas)
}

/// A principal's limits as this replica enforces them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shares {
    pub requests: Option<u32>,
    pub tokens: Option<u32>,
    pub concurrent: Option<u32>,
}

impl Shares {
    pub fn of(limits: PrincipalLimits, replicas: usize) -> Self {
        let of = |limit: Option<u32>| limit.map(|l| share(l, replicas));
        Self {
            requests: of(limits.requests_per_minute),
            tokens: of(limits.tokens_per_minute),
            concurrent: of(limits.max_concurrent_requests),
        }
    }

    fn any(&self) -> bool {
        self.requests.is_some() || self.tokens.is_some() || self.concurrent.is_some()
    }
}

/// One per-minute limit as a client sees it (the rate-limit headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// This replica's share.
    pub limit: u32,
    /// Units left now.
    pub remaining: u32,
    /// Until the bucket is full again.
    pub reset: Duration,
}

/// The per-minute limits of a principal right after its request was
/// admitted (or refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Status {
    pub requests: Option<Bucket>,
    pub tokens: Option<Bucket>,
}

/// Why a request was refused, and when to retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub limit: Limit,
    /// This replica's share of the limit.
    pub share: u32,
    /// The limit the keys file sets.
    pub configured: u32,
    pub replicas: u32,
    pub retry_after: Duration,
    pub status: Status,
}

impl Refusal {
    /// `Retry-After` in whole seconds, at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        ceil_secs(self.retry_after).max(1)
    }
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn ceil_millis(d: Duration) -> u128 {
    d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000))
}

/// What one unit (a request, a token) costs of a bucket of `share` per
/// minute, and what the bucket holds (`share` units: at most [`WINDOW`]).
fn unit(share: u32) -> (Duration, Duration) {
    let unit = WINDOW / share.max(1);
    (unit, unit * share.max(1))
}

fn cost(share: u32, units: u64) -> Duration {
    let nanos = unit(share).0.as_nanos().saturating_mul(u128::from(units));
    if nanos >= MAX_BACKLOG.as_nanos() { MAX_BACKLOG } else { Duration::from_nanos(nanos as u64) }
}

/// `drained_at` of units counted at share `from`, counted at share `to`.
fn rescale(drained_at: Instant, from: Option<u32>, to: Option<u32>, now: Instant) -> Instant {
    let (Some(from), Some(to)) = (from, to) else { return drained_at };
    if from == to || drained_at <= now {
        return drained_at;
    }
    let backlog = (drained_at - now).as_nanos() * u128::from(from) / u128::from(to.max(1));
    now + Duration::from_nanos(backlog.min(MAX_BACKLOG.as_nanos()) as u64)
}

/// A bucket's state: the instant everything spent is paid back.
fn bucket(share: u32, drained_at: Instant, now: Instant) -> Bucket {
    let backlog = drained_at.saturating_duration_since(now);
    let (unit, capacity) = unit(share);
    let left = capacity.saturating_sub(backlog);
    let remaining = u32::try_from(left.as_nanos() / unit.as_nanos()).unwrap_or(u32::MAX);
    Bucket { limit: share, remaining, reset: backlog }
}

/// One principal's use on this replica (the pure core: every call takes
/// `now`).
#[derive(Debug, Clone)]
pub struct Meter {
    /// When the requests counted so far are paid back.
    requests: Instant,
    /// The requests share `requests` is counted in.
    request_share: Option<u32>,
    /// When the tokens charged so far are paid back.
    tokens: Instant,
    /// The tokens share `tokens` is counted in (the last admission's:
    /// what `charge` counts in).
    token_share: Option<u32>,
    /// Requests admitted and not yet finished.
    in_flight: u32,
}

impl Meter {
    pub fn new(now: Instant) -> Self {
        Self { requests: now, request_share: None, tokens: now, token_share: None, in_flight: 0 }
    }

    /// Admits one request under `shares`, counting it, or says which
    /// limit refuses it (the one with the longest wait when several do)
    /// and counts nothing.
    pub fn admit(&mut self, shares: Shares, now: Instant) -> Result<Status, (Limit, Duration, Status)> {
        // A changed share (a keys reload, a replica-set change): what was
        // counted stays counted, paid back at the new share's rate.
        self.requests = rescale(self.requests, self.request_share, shares.requests, now);
        self.tokens = rescale(self.tokens, self.token_share, shares.tokens, now);
        (self.request_share, self.token_share) = (shares.requests, shares.tokens);
        let mut refused: Option<(Limit, Duration)> = None;
        let mut refuse = |limit, wait| {
            if refused.is_none_or(|(_, longest)| wait > longest) {
                refused = Some((limit, wait));
            }
        };
        if let Some(share) = shares.requests {
            let (unit, capacity) = unit(share);
            let after = self.requests.saturating_duration_since(now) + unit;
            if after > capacity {
                refuse(Limit::Requests, after - capacity);
            }
        }
        if let Some(share) = shares.tokens {
            let (_, capacity) = unit(share);
            let backlog = self.tokens.saturating_duration_since(now);
            if backlog >= capacity {
                // Until the bucket holds a token again.
                refuse(Limit::Tokens, backlog - capacity + Duration::from_nanos(1));
            }
        }
        if shares.concurrent.is_some_and(|share| self.in_flight >= share) {
            refuse(Limit::Concurrency, CONCURRENCY_RETRY);
        }
        if let Some((limit, wait)) = refused {
            return Err((limit, wait, self.status(shares, now)));
        }
        if let Some(share) = shares.requests {
            self.requests = self.requests.max(now) + unit(share).0;
        }
        self.in_flight += 1;
        Ok(self.status(shares, now))
    }

    /// Reserves `tokens` for a request admitted under `shares` (its input
    /// estimate and `max_tokens`), refused while the tokens already charged
    /// and reserved fill the bucket: parallel requests take the bucket past
    /// full by at most one reservation. Given back by [`Self::refund`] when
    /// the request ends; its attempts are charged what they used meanwhile.
    pub fn reserve(&mut self, shares: Shares, tokens: u64, now: Instant) -> Result<Status, (Duration, Status)> {
        let Some(share) = shares.tokens else { return Ok(self.status(shares, now)) };
        let (_, capacity) = unit(share);
        let backlog = self.tokens.saturating_duration_since(now);
        if backlog >= capacity {
            return Err((backlog - capacity + Duration::from_nanos(1), self.status(shares, now)));
        }
        self.charge(tokens, now);
        Ok(self.status(shares, now))
    }

    /// Gives back a reservation of `tokens` (never below empty).
    pub fn refund(&mut self, tokens: u64, now: Instant) {
        let Some(share) = self.token_share else { return };
        self.tokens = self.tokens.checked_sub(cost(share, tokens)).map_or(now, |t| t.max(now));
    }

    /// Charges a finished answer's tokens (nothing without a tokens limit).
    pub fn charge(&mut self, tokens: u64, now: Instant) {
        let Some(share) = self.token_share else { return };
        let start = self.tokens.max(now);
        let backlog = (start - now + cost(share, tokens)).min(MAX_BACKLOG);
        self.tokens = now + backlog;
    }

    /// A request admitted by [`Self::admit`] ended.
    pub fn release(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Nothing in flight and every bucket full: the meter can go.
    pub fn idle(&self, now: Instant) -> bool {
        self.in_flight == 0 && self.requests <= now && self.tokens <= now
    }

    pub fn status(&self, shares: Shares, now: Instant) -> Status {
        Status {
            requests: shares.requests.map(|share| bucket(share, self.requests, now)),
            tokens: shares.tokens.map(|share| bucket(share, self.tokens, now)),
        }
    }
}

type SharedMeter = Arc<Mutex<Meter>>;

#[derive(Debug, Default)]
struct Table {
    /// By principal name: a principal whose entry (and `Arc`) a keys
    /// reload replaced keeps its use.
    meters: HashMap<String, SharedMeter>,
    pruned_at: Option<Instant>,
}

/// Every principal's recent requests and tokens on this replica. Only
/// principals with limits have a meter; idle ones are dropped (so are
/// principals a reload removed, once idle).
#[derive(Debug, Default)]
pub struct RateLimits {
    table: Mutex<Table>,
}

/// A request's place in its principal's limits: given back on drop. Also
/// what the rate-limit headers of a successful answer say.
#[derive(Debug, Default)]
pub struct Permit {
    meter: Option<SharedMeter>,
    status: Option<Status>,
    /// Tokens reserved for the request ([`RateLimits::reserve`]).
    reserved: u64,
}

impl Permit {
    /// The principal's per-minute limits after this request was counted
    /// (`None` for a caller without any).
    pub fn status(&self) -> Option<Status> {
        self.status.filter(|s| s.requests.is_some() || s.tokens.is_some())
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(meter) = &self.meter {
            let mut meter = lock(meter);
            meter.refund(self.reserved, Instant::now());
            meter.release();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl RateLimits {
    /// Admits one request of `caller`, or says which limit it is over and
    /// when to retry (a domain [`Refusal`]; the HTTP layer maps it once, to
    /// `ApiError::RateLimited`). `replicas`: how many replicas share the limits.
    pub fn admit(&self, caller: &Caller, replicas: usize) -> Result<Permit, Box<Refusal>> {
        self.admit_at(caller, replicas, Instant::now())
    }

    /// [`Self::admit`] at `now`.
    pub fn admit_at(&self, caller: &Caller, replicas: usize, now: Instant) -> Result<Permit, Box<Refusal>> {
        let limits = caller.limits();
        let shares = Shares::of(limits, replicas);
        if !shares.any() {
            return Ok(Permit::default());
        }
        let meter = {
            let mut table = lock(&self.table);
            table.prune(now);
            // Looked up by `&str`: a name is copied once, for a new meter.
            match table.meters.get(caller.name()) {
                Some(meter) => meter.clone(),
                None => {
                    let meter = Arc::new(Mutex::new(Meter::new(now)));
                    table.meters.insert(caller.name().to_string(), meter.clone());
                    meter
                }
            }
        };
        let admitted = lock(&meter).admit(shares, now);
        match admitted {
            Ok(status) => Ok(Permit { meter: Some(meter), status: Some(status), reserved: 0 }),
            Err((limit, retry_after, status)) => Err(refusal(limit, limits, replicas, retry_after, status)),
        }
    }

    /// Reserves `tokens` of `caller`'s tokens per minute for the request
    /// `permit` admitted (see [`Meter::reserve`]); refused with
    /// [`Limit::Tokens`] while the bucket is full.
    pub fn reserve(
        &self,
        permit: &mut Permit,
        caller: &Caller,
        replicas: usize,
        tokens: u64,
    ) -> Result<(), Box<Refusal>> {
        self.reserve_at(permit, caller, replicas, tokens, Instant::now())
    }

    /// [`Self::reserve`] at `now`.
    pub fn reserve_at(
        &self,
        permit: &mut Permit,
        caller: &Caller,
        replicas: usize,
        tokens: u64,
        now: Instant,
    ) -> Result<(), Box<Refusal>> {
        let Some(meter) = &permit.meter else { return Ok(()) };
        let limits = caller.limits();
        let reserved = lock(meter).reserve(Shares::of(limits, replicas), tokens, now);
        match reserved {
            Ok(status) => {
                permit.reserved += tokens;
                permit.status = Some(status);
                Ok(())
            }
            Err((retry_after, status)) => Err(refusal(Limit::Tokens, limits, replicas, retry_after, status)),
        }
    }

    /// Counts a finished answer's tokens against `principal`'s tokens per minute.
    pub fn charge_tokens(&self, principal: &str, tokens: u64) {
        self.charge_tokens_at(principal, tokens, Instant::now());
    }

    /// [`Self::charge_tokens`] at `now`.
    pub fn charge_tokens_at(&self, principal: &str, tokens: u64, now: Instant) {
        let meter = lock(&self.table).meters.get(principal).cloned();
        if let Some(meter) = meter {
            lock(&meter).charge(tokens, now);
        }
    }

    /// How many principals have a meter (bounded memory; for the tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.table).meters.len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The refusal of `limit`, one of `limits`, shared by `replicas`.
fn refusal(
    limit: Limit,
    limits: PrincipalLimits,
    replicas: usize,
    retry_after: Duration,
    status: Status,
) -> Box<Refusal> {
    let configured = match limit {
        Limit::Requests => limits.requests_per_minute,
        Limit::Tokens => limits.tokens_per_minute,
        Limit::Concurrency => limits.max_concurrent_requests,
    };
    let configured = configured.unwrap_or_default();
    Box::new(Refusal {
        limit,
        share: share(configured, replicas),
        configured,
        replicas: u32::try_from(replicas.max(1)).unwrap_or(u32::MAX),
        retry_after,
        status,
    })
}

impl Table {
    /// Drops idle meters, at most once per [`PRUNE_EVERY`].
    fn prune(&mut self, now: Instant) {
        if self.pruned_at.is_some_and(|at| now.saturating_duration_since(at) < PRUNE_EVERY) {
            return;
        }
        self.pruned_at = Some(now);
        // A meter a permit holds is never idle (it counts the request in flight).
        self.meters.retain(|_, meter| !lock(meter).idle(now));
    }
}

/// Which API's rate-limit headers a response carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderForm {
    /// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, `retry-after-ms`.
    OpenAi,
    /// `anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`.
    Anthropic,
}

/// Prefixes of the rate-limit headers (a provider's, relayed through a
/// tunnel, give way to IOP's for a principal that has limits).
pub const HEADER_PREFIXES: &[&str] = &["x-ratelimit-", "anthropic-ratelimit-"];

/// The rate-limit headers for `status` (and `retry-after-ms` for a
/// refusal, OpenAI form; `Retry-After` is the error's own). `now`: the
/// wall clock, for Anthropic's RFC 3339 reset instants.
pub fn headers(
    form: HeaderForm,
    status: &Status,
    retry_after: Option<Duration>,
    now: SystemTime,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (kind, bucket) in [("requests", status.requests), ("tokens", status.tokens)] {
        let Some(b) = bucket else { continue };
        match form {
            HeaderForm::OpenAi => {
                out.push((format!("x-ratelimit-limit-{kind}"), b.limit.to_string()));
                out.push((format!("x-ratelimit-remaining-{kind}"), b.remaining.to_string()));
                out.push((format!("x-ratelimit-reset-{kind}"), go_duration(b.reset)));
            }
            HeaderForm::Anthropic => {
                out.push((format!("anthropic-ratelimit-{kind}-limit"), b.limit.to_string()));
                out.push((format!("anthropic-ratelimit-{kind}-remaining"), b.remaining.to_string()));
                out.push((format!("anthropic-ratelimit-{kind}-reset"), rfc3339(now + b.reset)));
            }
        }
    }
    if let (HeaderForm::OpenAi, Some(retry)) = (form, retry_after) {
        out.push(("retry-after-ms".to_string(), ceil_millis(retry).max(1).to_string()));
    }
    out
}

/// A duration as OpenAI's reset headers write it (Go's form, rounded up):
/// `0s`, `17ms`, `1s`, `6m0s`, `1h0m0s`.
pub fn go_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".to_string();
    }
    if d < Duration::from_secs(1) {
        return format!("{}ms", ceil_millis(d));
    }
    let secs = ceil_secs(d);
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

/// An instant as RFC 3339 in UTC, rounded up to whole seconds.
fn rfc3339(at: SystemTime) -> String {
    let unix = at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = i64::try_from(ceil_secs(unix)).unwrap_or(i64::MAX);
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
