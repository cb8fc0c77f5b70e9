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
//! Tokens are known only when an answer ends: a request is refused while
//! the tokens already charged fill the bucket, and one answer may take
//! it past full (it is charged whole, up to [`MAX_BACKLOG`] of debt),
//! which later requests then wait out.
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
            lock(meter).release();
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
            Ok(status) => Ok(Permit { meter: Some(meter), status: Some(status) }),
            Err((limit, retry_after, status)) => {
                let (share, configured) = match limit {
                    Limit::Requests => (shares.requests, limits.requests_per_minute),
                    Limit::Tokens => (shares.tokens, limits.tokens_per_minute),
                    Limit::Concurrency => (shares.concurrent, limits.max_concurrent_requests),
                };
                Err(Box::new(Refusal {
                    limit,
                    share: share.unwrap_or_default(),
                    configured: configured.unwrap_or_default(),
                    replicas: u32::try_from(replicas.max(1)).unwrap_or(u32::MAX),
                    retry_after,
                    status,
                }))
            }
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
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn shares(requests: Option<u32>, tokens: Option<u32>, concurrent: Option<u32>) -> Shares {
        Shares { requests, tokens, concurrent }
    }

    fn caller(name: &str, requests: Option<u32>, tokens: Option<u32>, concurrent: Option<u32>) -> Caller {
        let mut extra = String::new();
        for (field, value) in
            [("requests_per_minute", requests), ("tokens_per_minute", tokens), ("max_concurrent_requests", concurrent)]
        {
            if let Some(v) = value {
                extra.push_str(&format!(", {field}: {v}"));
            }
        }
        let hash = crate::auth::to_hex(&crate::auth::sha256(name.as_bytes()));
        let text = format!("principals:\n  - {{ name: {name}, key_sha256: {hash}, models: ['*']{extra} }}\n");
        let keys = crate::auth::Keys::parse(&text).unwrap();
        let mut headers = axum::http::HeaderMap::new();
        headers.insert("x-api-key", name.parse().unwrap());
        keys.authenticate(&headers).unwrap()
    }

    fn refusal(result: Result<Permit, Box<Refusal>>) -> Refusal {
        match result {
            Err(r) => *r,
            Ok(_) => panic!("expected a refusal, the request was admitted"),
        }
    }

    #[test]
    fn shares_round_up_and_their_sum_is_bounded() {
        // (limit, replicas, share)
        let cases =
            [(10, 1, 10), (10, 2, 5), (10, 3, 4), (1, 3, 1), (7, 0, 7), (100, 7, 15), (1_000_000, 1, 1_000_000)];
        for (limit, replicas, want) in cases {
            assert_eq!(share(limit, replicas), want, "{limit}/{replicas}");
            let n = replicas.max(1) as u32;
            assert!(
                want * n >= limit && want * n < limit + n,
                "the error bound (<= limit + replicas - 1): {limit}/{replicas}"
            );
        }
        let limits =
            PrincipalLimits { requests_per_minute: Some(9), tokens_per_minute: None, max_concurrent_requests: Some(1) };
        assert_eq!(Shares::of(limits, 2), shares(Some(5), None, Some(1)));
    }

    /// Requests per minute: under, at and over the share, the Retry-After,
    /// and the refill (one request back every 60 s / share; all after a
    /// minute).
    #[test]
    fn requests_per_minute_under_at_over_and_refill() {
        let t0 = Instant::now();
        let s = shares(Some(3), None, None);
        let mut m = Meter::new(t0);
        // (offset ms, admitted, remaining or retry ms)
        let steps: [(u64, bool, u64); 7] = [
            (0, true, 2),
            (0, true, 1),
            (0, true, 0),
            (0, false, 20_000), // over: the first of the three is paid back in 20 s
            (19_999, false, 1),
            (20_000, true, 0), // one came back
            (80_000, true, 2), // a minute later all are back (this one counted)
        ];
        for (at, admitted, n) in steps {
            let now = t0 + Duration::from_millis(at);
            match m.admit(s, now) {
                Ok(status) => {
                    assert!(admitted, "at {at} ms: admitted");
                    assert_eq!(status.requests.unwrap().remaining, n as u32, "at {at} ms");
                    m.release();
                }
                Err((limit, wait, status)) => {
                    assert!(!admitted, "at {at} ms: refused");
                    assert_eq!((limit, wait), (Limit::Requests, Duration::from_millis(n)), "at {at} ms");
                    assert_eq!(status.requests.unwrap().remaining, 0);
                }
            }
        }
    }

    #[test]
    fn a_refused_request_counts_nothing() {
        let t0 = Instant::now();
        let mut m = Meter::new(t0);
        let s = shares(Some(1), None, None);
        m.admit(s, t0).unwrap();
        m.release();
        for _ in 0..5 {
            assert!(m.admit(s, t0 + secs(30)).is_err());
        }
        assert!(m.admit(s, t0 + secs(60)).is_ok(), "the refusals did not push the refill back");
    }

    /// Headers' numbers: limit is the share, reset the time until the
    /// bucket is full again.
    #[test]
    fn status_says_limit_remaining_and_reset() {
        let t0 = Instant::now();
        let mut m = Meter::new(t0);
        let s = shares(Some(4), Some(1000), None);
        let status = m.admit(s, t0).unwrap();
        assert_eq!(status.requests, Some(Bucket { limit: 4, remaining: 3, reset: secs(15) }));
        assert_eq!(status.tokens, Some(Bucket { limit: 1000, remaining: 1000, reset: Duration::ZERO }));
        m.charge(250, t0);
        let status = m.status(s, t0 + secs(5));
        assert_eq!(status.requests, Some(Bucket { limit: 4, remaining: 3, reset: secs(10) }));
        assert_eq!(status.tokens, Some(Bucket { limit: 1000, remaining: 833, reset: secs(10) }));
    }

    /// Tokens per minute: refused while the tokens charged fill the bucket;
    /// one answer may overshoot, and the debt is waited out.
    #[test]
    fn tokens_per_minute_refuse_once_full_and_an_answer_may_overshoot() {
        let t0 = Instant::now();
        let mut m = Meter::new(t0);
        let s = shares(None, Some(600), None); // 100 ms per token
        m.admit(s, t0).unwrap();
        m.charge(599, t0);
        assert!(m.admit(s, t0).is_ok(), "one token left: admitted");
        m.charge(1, t0);
        let (limit, wait, status) = m.admit(s, t0).unwrap_err();
        assert_eq!((limit, status.tokens.unwrap().remaining), (Limit::Tokens, 0));
        assert!(wait > Duration::ZERO && wait < Duration::from_millis(1), "{wait:?}");
        assert!(m.admit(s, t0 + Duration::from_millis(100)).is_ok(), "a token came back");
        // An answer far over the share: charged whole, waited out.
        m.charge(1200, t0 + Duration::from_millis(100));
        let (_, wait, _) = m.admit(s, t0 + Duration::from_millis(100)).unwrap_err();
        assert_eq!(wait, Duration::from_millis(119_900) + Duration::from_nanos(1));
        let refusal = Refusal {
            limit: Limit::Tokens,
            share: 600,
            configured: 600,
            replicas: 1,
            retry_after: wait,
            status: Status::default(),
        };
        assert_eq!(refusal.retry_after_secs(), 120);
        assert!(m.admit(s, t0 + Duration::from_millis(100) + secs(120)).is_ok());
        // The debt is bounded.
        m.charge(u64::MAX, t0);
        assert!(m.status(s, t0).tokens.unwrap().reset <= MAX_BACKLOG);
    }

    #[test]
    fn concurrency_is_held_until_release() {
        let t0 = Instant::now();
        let mut m = Meter::new(t0);
        let s = shares(None, None, Some(2));
        m.admit(s, t0).unwrap();
        m.admit(s, t0).unwrap();
        let (limit, wait, status) = m.admit(s, t0).unwrap_err();
        assert_eq!((limit, wait, status), (Limit::Concurrency, CONCURRENCY_RETRY, Status::default()));
        m.release();
        assert!(m.admit(s, t0).is_ok());
        assert!(!m.idle(t0 + secs(3600)), "two in flight");
    }

    /// Several limits over: the one with the longest wait is named.
    #[test]
    fn the_longest_wait_names_the_refusal() {
        let t0 = Instant::now();
        let mut m = Meter::new(t0);
        let s = shares(Some(1), Some(60), Some(1));
        m.admit(s, t0).unwrap();
        m.charge(600, t0); // ten minutes of tokens
        let (limit, wait, _) = m.admit(s, t0).unwrap_err();
        assert_eq!(limit, Limit::Tokens, "{wait:?}");
    }

    #[test]
    fn permits_release_on_drop_and_anonymous_callers_are_unlimited() {
        let limits = RateLimits::default();
        let t0 = Instant::now();
        for _ in 0..1000 {
            let permit = limits.admit_at(&Caller::Anonymous, 1, t0).unwrap();
            assert_eq!(permit.status(), None);
        }
        let unlimited = caller("free", None, None, None);
        limits.admit_at(&unlimited, 1, t0).unwrap();
        assert!(limits.is_empty(), "no meter for callers without limits");

        let c = caller("one-at-once", None, None, Some(1));
        let held = limits.admit_at(&c, 1, t0).unwrap();
        assert_eq!(held.status(), None, "concurrency alone has no headers");
        let refused = refusal(limits.admit_at(&c, 1, t0));
        assert_eq!((refused.limit, refused.retry_after_secs(), refused.share), (Limit::Concurrency, 1, 1));
        drop(held);
        assert!(limits.admit_at(&c, 1, t0).is_ok(), "the dropped permit gave its place back");
    }

    /// The refusal names the configured limit, this replica's share and
    /// the replica count; two replicas each admit their share.
    #[test]
    fn two_replicas_each_admit_their_share() {
        let t0 = Instant::now();
        let c = caller("team", Some(5), None, None);
        let (a, b) = (RateLimits::default(), RateLimits::default());
        let admitted = |limits: &RateLimits| (0..10).filter(|_| limits.admit_at(&c, 2, t0).is_ok()).count();
        assert_eq!((admitted(&a), admitted(&b)), (3, 3), "ceil(5 / 2) each: 6 <= 5 + 2 - 1");
        let refused = refusal(a.admit_at(&c, 2, t0));
        assert_eq!((refused.share, refused.configured, refused.replicas), (3, 5, 2));
        assert_eq!(refused.retry_after_secs(), 20);
    }

    /// A keys reload gives the principal a new `Arc` (and maybe new
    /// limits): its use is kept by name, as the fraction of the minute
    /// spent.
    #[test]
    fn a_reload_keeps_use_by_name_and_applies_new_limits() {
        let t0 = Instant::now();
        let limits = RateLimits::default();
        let before = caller("ci", Some(2), None, None);
        limits.admit_at(&before, 1, t0).unwrap();
        limits.admit_at(&before, 1, t0).unwrap();
        assert!(limits.admit_at(&before, 1, t0).is_err());
        let same = caller("ci", Some(2), None, None);
        assert!(limits.admit_at(&same, 1, t0).is_err(), "a new Arc, the same principal");
        let raised = caller("ci", Some(4), None, None);
        let permit = limits.admit_at(&raised, 1, t0).unwrap();
        // The two requests counted stay counted, at the new share's rate.
        assert_eq!(permit.status().unwrap().requests.unwrap(), Bucket { limit: 4, remaining: 1, reset: secs(45) });
        let lowered = caller("ci", Some(1), None, None);
        assert!(limits.admit_at(&lowered, 1, t0).is_err());
        assert!(limits.admit_at(&lowered, 1, t0 + secs(179)).is_err(), "three counted at one a minute");
        assert!(limits.admit_at(&lowered, 1, t0 + secs(180)).is_ok());
        let other = caller("other", Some(1), None, None);
        assert!(limits.admit_at(&other, 1, t0).is_ok(), "another principal is unaffected");
    }

    #[test]
    fn tokens_are_charged_to_the_principal_by_name() {
        let t0 = Instant::now();
        let limits = RateLimits::default();
        let c = caller("big", None, Some(100), None);
        drop(limits.admit_at(&c, 1, t0).unwrap());
        limits.charge_tokens_at("big", 100, t0);
        limits.charge_tokens_at("nobody", 100, t0);
        let refused = refusal(limits.admit_at(&c, 1, t0));
        assert_eq!(refused.limit, Limit::Tokens);
        assert_eq!(limits.len(), 1, "no meter for a name without limits");
    }

    /// Memory: idle meters go (a principal a reload removed, once its
    /// minute passed); busy ones stay.
    #[test]
    fn idle_meters_are_pruned() {
        let t0 = Instant::now();
        let limits = RateLimits::default();
        for i in 0..50 {
            drop(limits.admit_at(&caller(&format!("p{i}"), Some(10), None, None), 1, t0).unwrap());
        }
        let busy = caller("busy", None, None, Some(5));
        let held = limits.admit_at(&busy, 1, t0).unwrap();
        assert_eq!(limits.len(), 51);
        // Within the minute nothing is pruned; after it the idle ones are.
        limits.admit_at(&busy, 1, t0 + secs(30)).unwrap();
        assert_eq!(limits.len(), 51);
        let _again = limits.admit_at(&busy, 1, t0 + secs(61)).unwrap();
        assert_eq!(limits.len(), 1, "only the principal in flight is left");
        drop(held);
    }

    #[test]
    fn openai_and_anthropic_headers() {
        let status = Status {
            requests: Some(Bucket { limit: 60, remaining: 59, reset: secs(1) }),
            tokens: Some(Bucket { limit: 150_000, remaining: 149_984, reset: Duration::from_millis(6) }),
        };
        let now = SystemTime::UNIX_EPOCH + secs(1_700_000_000);
        let openai = headers(HeaderForm::OpenAi, &status, Some(Duration::from_millis(1500)), now);
        let want = [
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-remaining-requests", "59"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-limit-tokens", "150000"),
            ("x-ratelimit-remaining-tokens", "149984"),
            ("x-ratelimit-reset-tokens", "6ms"),
            ("retry-after-ms", "1500"),
        ];
        let got: Vec<(&str, &str)> = openai.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, want);
        let anthropic = headers(HeaderForm::Anthropic, &status, Some(secs(2)), now);
        let got: Vec<(&str, &str)> = anthropic.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            got,
            [
                ("anthropic-ratelimit-requests-limit", "60"),
                ("anthropic-ratelimit-requests-remaining", "59"),
                ("anthropic-ratelimit-requests-reset", "2023-11-14T22:13:21Z"),
                ("anthropic-ratelimit-tokens-limit", "150000"),
                ("anthropic-ratelimit-tokens-remaining", "149984"),
                ("anthropic-ratelimit-tokens-reset", "2023-11-14T22:13:21Z"),
            ]
        );
        let only_requests = Status { requests: status.requests, tokens: None };
        assert_eq!(headers(HeaderForm::OpenAi, &only_requests, None, now).len(), 3);
    }

    #[test]
    fn reset_durations_in_gos_form() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ms"),
            (Duration::from_millis(17), "17ms"),
            (Duration::from_millis(999), "999ms"),
            (secs(1), "1s"),
            (Duration::from_millis(1001), "2s"),
            (secs(59), "59s"),
            (secs(360), "6m0s"),
            (secs(3661), "1h1m1s"),
        ];
        for (d, want) in cases {
            assert_eq!(go_duration(d), want, "{d:?}");
        }
    }
}
