//! The stream gate: one request's attempts, from admission to the commit
//! point. This is the one place where a failed attempt is retried.
//!
//! Events of an attempt are buffered until the commit point: the first
//! content (text, tool call, or a completion) for a streaming client, the
//! terminal event for a non-streaming one. Nothing reaches the client before
//! that, so an attempt that fails before it is retried on another provider
//! (connect failure, transport loss, 5xx, 429, stall, protocol error) with the
//! same request. Client errors (other 4xx, invalid request) are never
//! retried. Attempts are bounded by `limits.max_attempts` and share one
//! deadline, `limits.request_timeout_ms`. Where a failed attempt goes next
//! is [`crate::retry::plan`]: an equal provider at once; before a lower
//! priority group, the same provider once after its `Retry-After` or a short
//! backoff when that fits `retry.same_provider_max_wait_ms`; with nothing
//! untried, the same provider(s) after `Retry-After` or an exponential
//! backoff, so the gate never loops tightly.
//!
//! An attempt on a provider in `tunnel` mode relays the client's request
//! byte-for-byte (only `model` is rewritten to the target, and a Chat
//! Completions stream is asked for its usage, which the node then leaves
//! out of the relayed stream: [`ask_for_usage`]) when the client's API has
//! a tunnel form; its commit point is the first body byte of a 2xx
//! response. A provider error response is retried like a failure when it is
//! retryable, and otherwise relayed to the client as the provider sent it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use iop_proto::config::ProviderMode;
use iop_proto::pb::{self, FailureKind, provider_tunnel_frame::Frame, run_event::Event};
use iop_proto::provider_error::{refuses_content, rejects_credential};
use tokio::time::Instant;

use crate::admission::LeaseGuard;
use crate::admission::{AdmitError, AdmitRequest};
use crate::auth::Caller;
use crate::core::selection::Candidate;
use crate::credentials::LeaseScope;
use crate::dispatch::{self, NodeFrame, RunStream};
use crate::ingress::error::ApiError;
use crate::metrics::{AttemptLabels, RecoveryLabels, RetryPathLabels};
use crate::retry::{self, RetryInput, RetryPlan, context_fallback, retryable, same_credential};
use crate::state::EdgeState;
use crate::usage::Account;

/// Where the client-visible response starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitPoint {
    /// Streaming: at the first content event.
    FirstContent,
    /// Non-streaming: at the terminal event.
    Terminal,
}

/// The client's request as a provider would receive it in tunnel mode.
#[derive(Debug, Clone)]
pub struct TunnelForm {
    /// Path of the same API at the provider, e.g. `/v1/chat/completions`.
    pub path: &'static str,
    /// The client's JSON body, as sent.
    pub body: Bytes,
    /// Client headers that may cross a tunnel (`wire::relayable_request_header`).
    pub headers: Vec<pb::HttpHeader>,
}

/// A request whose answering attempt reached its commit point.
pub struct Committed {
    /// The provider target that answered (the response's `model`).
    pub target_model: String,
    pub answer: Answer,
    /// The answering provider's context window, when providers of the
    /// route whose windows the prompt exceeds were left out
    /// ([`crate::route::fit_context`]; the response's
    /// `iop-context-window` header).
    pub context_window: Option<u32>,
}

pub enum Answer {
    Normalized {
        /// Events up to and including the commit event.
        buffered: Vec<Event>,
        /// The rest of the run, unless `buffered` already ends with its terminal.
        rest: Option<LiveRun<pb::RunEvent>>,
    },
    Tunnel {
        head: pb::TunnelResponseHead,
        /// Body bytes received before the commit.
        buffered: Vec<Bytes>,
        /// The rest of the body, unless the tunnel already ended.
        rest: Option<LiveRun<pb::ProviderTunnelFrame>>,
    },
}

/// The committed run's remaining items, bounded by the request deadline.
pub struct LiveRun<F: NodeFrame> {
    run: RunStream<F>,
    deadline: Instant,
    /// The committed attempt's span (`crate::trace`): it lasts as long as
    /// the answer, and notes its usage and failure.
    span: iop_telemetry::Span,
}

impl<F: NodeFrame> LiveRun<F> {
    fn new(run: RunStream<F>, deadline: Instant) -> Self {
        Self { run, deadline, span: iop_telemetry::Span::none() }
    }

    pub async fn next(&mut self) -> Option<F::Item> {
        let mut item = match tokio::time::timeout_at(self.deadline, self.run.next()).await {
            Ok(item) => item,
            // Dropping the run cancels it on the node and frees its slot.
            Err(_) => Some(deadline_failure::<F>()),
        };
        if self.span.context().is_some()
            && let Some(item) = &mut item
        {
            if let Some(usage) = F::usage_mut(item) {
                crate::trace::set_usage(&mut self.span, usage);
            }
            if let Some(failure) = F::failure_mut(item) {
                self.span.fail(ApiError::Execution(failure.clone()).code());
            }
        }
        item
    }

    /// The provider the run is on (its lease's).
    pub fn provider_id(&self) -> &str {
        self.run.lease().provider_id()
    }

    /// Gives up on the run (see [`RunStream::stop`]).
    pub fn stop(mut self, reason: crate::core::lease::ReleaseReason) {
        self.run.stop(reason);
    }

    /// When the request's time budget runs out.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
}

impl Committed {
    /// Keeps the attempt's span open while the answer streams, or ends it
    /// now when the answer is complete (noting the usage it holds).
    fn attach_span(&mut self, mut span: iop_telemetry::Span) {
        match &mut self.answer {
            Answer::Normalized { rest: Some(live), .. } => live.span = span,
            Answer::Tunnel { rest: Some(live), .. } => live.span = span,
            Answer::Normalized { buffered, rest: None } => {
                for event in buffered.iter() {
                    if let Event::Usage(usage) = event {
                        crate::trace::set_usage(&mut span, usage);
                    }
                }
            }
            Answer::Tunnel { rest: None, .. } => {}
        }
    }
}

/// What a run of [`execute_in`] may use besides the request's route.
#[derive(Debug, Default)]
pub struct Scope {
    /// The request's deadline, when it started earlier (a continuation);
    /// else `limits.request_timeout_ms` from now.
    pub deadline: Option<Instant>,
    /// Only providers that continue prefills (see `crate::continuation`).
    pub continuation_only: bool,
    /// Providers tried last (`true`) or not at all (`false`), as after a
    /// failed attempt.
    pub avoid: HashMap<String, bool>,
}

/// How much of an answer the Edge holds in memory for one request
/// (`limits.max_response_bytes`): a non-streaming answer until its terminal,
/// or the output a Responses stream repeats in its final event. Pure.
#[derive(Debug, Clone, Copy)]
pub struct AnswerBudget {
    limit: usize,
    used: usize,
}

impl AnswerBudget {
    pub fn new(limit: usize) -> Self {
        Self { limit, used: 0 }
    }

    /// Counts `event`'s content; past the limit, the `response_too_large`
    /// failure the request ends with.
    pub fn charge(&mut self, event: &Event) -> Result<(), pb::ExecutionFailure> {
        self.used = self.used.saturating_add(held_bytes(event));
        if self.used > self.limit {
            return Err(pb::ExecutionFailure::new(
                FailureKind::ResponseTooLarge,
                format!("the provider's answer exceeds the limit of {} bytes", self.limit),
            ));
        }
        Ok(())
    }
}

/// Bytes of content an event adds to a held answer.
fn held_bytes(event: &Event) -> usize {
    match event {
        Event::Text(t) => t.text.len(),
        Event::Reasoning(r) => r.text.len(),
        Event::Embeddings(e) => e.embeddings.iter().map(|v| v.values.len() * 4).sum(),
        Event::ToolCall(d) => d.id.len() + d.name.len() + d.arguments_delta.len(),
        Event::Started(s) => s.model.len(),
        Event::Failed(f) => f.failure.as_ref().map_or(0, |f| f.message.len()),
        Event::Usage(_) | Event::Completed(_) | Event::Cancelled(_) => 0,
    }
}

fn deadline_failure<F: NodeFrame>() -> F::Item {
    F::failed(FailureKind::DeadlineExceeded, "the request's time budget ran out".into())
}

/// A lease for `request`: on `only` alone when a same-provider retry names
/// it and it has a free slot now, else on any candidate (queued up to
/// `wait`, behind at most `queue_depth` others).
async fn admit_attempt(
    state: &EdgeState,
    request: AdmitRequest,
    only: Option<Candidate>,
    queue_depth: usize,
    wait: Duration,
) -> Result<LeaseGuard, AdmitError> {
    if let Some(candidate) = only {
        let restricted =
            AdmitRequest { candidates: Arc::from(vec![candidate]), avoid: HashMap::new(), ..request.clone() };
        if let Ok(lease) = state.routing.admission.admit(restricted, 0, Duration::ZERO).await {
            return Ok(lease);
        }
    }
    state.routing.admission.admit(request, queue_depth, wait).await
}

/// Counts and logs a stall before the first byte, and whether the request
/// may still be replayed elsewhere (`eligible`).
fn observe_stall(state: &EdgeState, provider_id: &str, failure: &pb::ExecutionFailure, eligible: bool) {
    let label = if eligible { "eligible" } else { "attempts_exhausted" };
    state.metrics.recovery_eligibility.get_or_create(&RecoveryLabels { result: label }).inc();
    tracing::info!(
        target: "edge_liveness_recovery_observation",
        provider = %provider_id,
        stage = if failure.first_byte_timeout { "first_byte" } else { "stall" },
        eligibility = label,
        provider_health = failure.provider_health().as_str_name(),
        handoff = failure.recovery_handoff().as_str_name(),
        "stall before the first byte"
    );
}

fn is_commit(event: &Event, point: CommitPoint) -> bool {
    match point {
        // Reasoning is content: it reaches the client as it comes.
        CommitPoint::FirstContent => {
            matches!(event, Event::Text(_) | Event::Reasoning(_) | Event::ToolCall(_) | Event::Completed(_))
        }
        CommitPoint::Terminal => matches!(event, Event::Completed(_)),
    }
}

/// Runs `request` of `caller` for public model `model` until an attempt
/// commits.
pub async fn execute(
    state: &Arc<EdgeState>,
    caller: &Caller,
    model: &str,
    request: pb::RunRequest,
    tunnel: Option<TunnelForm>,
    point: CommitPoint,
) -> Result<Committed, ApiError> {
    execute_in(state, caller, model, request, tunnel, point, Scope::default()).await
}

/// [`execute`] within `scope`.
pub async fn execute_in(
    state: &Arc<EdgeState>,
    caller: &Caller,
    model: &str,
    request: pb::RunRequest,
    tunnel: Option<TunnelForm>,
    point: CommitPoint,
    scope: Scope,
) -> Result<Committed, ApiError> {
    let config = state.config.current();
    // Within a route, only providers that can read the request's images (a
    // token count reads none).
    let images = request.carries_images() && !request.count_tokens;
    let accepts_images = |c: &Candidate| state.routing.residency.accepts_images(&state.registry, &c.provider);
    let readable = |all| crate::route::fit_inputs(all, images, accepts_images);
    let candidates_of = |model| {
        let all = readable(crate::route::admission_candidates(&config, model)?)?;
        if !scope.continuation_only {
            return Some(all);
        }
        let continues = |c: &&Candidate| state.routing.residency.continues(&state.registry, &c.provider);
        let capable: Arc<[Candidate]> = all.iter().filter(continues).cloned().collect();
        (!capable.is_empty()).then_some(capable)
    };
    // Within a route, only providers whose context window fits the prompt
    // (a token count asks for no generation).
    let prompt = iop_proto::usage::estimate_request_input(&request);
    let window = |p: &iop_proto::config::ProviderEntry| state.routing.residency.context_window(&state.registry, p);
    let fit = |all: Arc<[Candidate]>| match request.count_tokens {
        true => (all, false),
        false => crate::route::fit_context(&all, prompt, |c| window(&c.provider)),
    };
    // None for the client's model: no route, or none of it reads the images.
    let none_for = |model: &str| match crate::route::admission_candidates(&config, model).map(readable) {
        Some(None) => ApiError::ImagesNotAccepted(model.to_string()),
        _ => ApiError::ModelNotFound(model.to_string()),
    };
    let (mut candidates, mut context_fitted) = fit(candidates_of(model).ok_or_else(|| none_for(model))?);
    // The route being tried: the client's model, or its context fallback.
    let mut route = model;
    let limits = &config.limits;
    let deadline = scope.deadline.unwrap_or_else(|| Instant::now() + Duration::from_millis(limits.request_timeout_ms));
    let queue_timeout = Duration::from_millis(limits.queue_timeout_ms);
    // Refusals for capacity other replicas hold at the node wait like the
    // queue does, until then.
    let queued_until = Instant::now() + queue_timeout;
    let mut avoid: HashMap<String, bool> = scope.avoid.clone();
    let mut last_failure: Option<pb::ExecutionFailure> = None;
    // The provider whose stall this request is being replayed for, if any.
    let mut replaying_stall_of: Option<String> = None;
    // Providers this request already retried after a wait of their own,
    // and the one the next admission is restricted to.
    let mut same_retried: HashSet<String> = HashSet::new();
    let mut only: Option<Candidate> = None;
    // Providers that sent nothing at all by their first-byte deadline in
    // this request: a second miss is not replayed on them again.
    let mut missed_first_byte: HashSet<String> = HashSet::new();

    // Who pays for each attempt (a token count generates nothing).
    let body_bytes = tunnel.as_ref().map_or(0, |t| t.body.len());
    let account = (!request.count_tokens)
        .then(|| state.routing.usage.account(caller, model, crate::usage::Bounds::of(&request, body_bytes)));
    // The request's span, if traced: each admission and attempt is its child.
    let parent = crate::trace::current();
    let mut max_attempts = limits.max_attempts;
    let mut attempt = 0;
    while attempt < max_attempts {
        attempt += 1;
        let admit = AdmitRequest {
            route: route.to_string(),
            run_id: crate::ids::new_uuid().simple().to_string(),
            candidates: candidates.clone(),
            avoid: avoid.clone(),
        };
        let wait = queue_timeout.min(deadline.saturating_duration_since(Instant::now()));
        // A token count takes a free slot or none: it never waits behind
        // generations (the caller answers an estimate instead).
        let queue_depth = if request.count_tokens { 0 } else { limits.queue_depth };
        let mut waiting = state.tracer.start("admission wait", iop_telemetry::Kind::Internal, parent);
        let lease = match admit_attempt(state, admit, only.take(), queue_depth, wait).await {
            Ok(lease) => lease,
            // After a failed attempt, the provider's own answer says more
            // than "nothing else is available".
            Err(e) => {
                waiting.fail(admit_error(e.clone(), route).code());
                return Err(last_failure.map(ApiError::Execution).unwrap_or_else(|| admit_error(e, route)));
            }
        };
        drop(waiting);
        let mut span = attempt_span(state, parent, attempt, route, lease.lease());
        let provider_id = lease.lease().provider_id().to_string();
        let provider = candidates.iter().map(|c| &c.provider).find(|p| p.id == provider_id);
        let scope = LeaseScope { principal: caller.name(), route };
        let leased = state.seal(&scope, provider, lease.lease());
        let used = leased.as_ref().ok().and_then(Option::as_ref).map(|s| s.used.clone());
        let sealed = leased.map(|s| s.map(|s| s.lease));
        let outcome = match (sealed, provider.map(|p| p.mode), &tunnel) {
            // No lease, no dispatch: the attempt fails closed (not retried).
            (Err(failure), _, _) => failed(failure),
            (Ok(sealed), Some(ProviderMode::Tunnel), Some(form)) => {
                let traceparent = span.traceparent();
                attempt_tunnel(state, provider, lease, form, sealed, deadline, traceparent, account.clone()).await
            }
            (Ok(sealed), _, _) => {
                let request = pb::RunRequest { lease: sealed, traceparent: span.traceparent(), ..request.clone() };
                let max_response_bytes = limits.max_response_bytes;
                attempt_run(state, provider, lease, request, point, deadline, max_response_bytes, account.clone()).await
            }
        };
        let count = |span: &mut iop_telemetry::Span, outcome| {
            span.set("iop.attempt.outcome", outcome);
            let labels = AttemptLabels { provider: provider_id.clone(), outcome };
            state.metrics.attempts.get_or_create(&labels).inc();
        };
        let (failure, relay, run) = match outcome {
            Attempt::Committed(mut committed) => {
                count(&mut span, "committed");
                if context_fitted {
                    committed.context_window = provider.and_then(window);
                }
                committed.attach_span(span);
                if let Some(used) = &used {
                    state.config.credential_health().record_acceptance(used);
                }
                if let Some(stalled) = &replaying_stall_of {
                    let result = if *stalled == provider_id { "answered_by_avoided" } else { "answered_by_alternate" };
                    recovery_result(state, result);
                }
                return Ok(*committed);
            }
            Attempt::Failed { failure, relay, run } => {
                if span.context().is_some() {
                    span.fail(ApiError::Execution(failure.clone()).code());
                }
                (failure, relay, run)
            }
        };
        // The provider refused its own credential: evidence that the
        // credential is broken, never retried with the same credential, and
        // answered as the Edge's 502 (a tunnel's relayed 401 would read as
        // the client's bad key).
        let credential_refused =
            failure.kind() == FailureKind::ProviderHttpStatus && rejects_credential(failure.provider_status);
        // The node refused the lease itself (no provider was called): the
        // provider is shown unavailable there until the node opens one.
        if failure.kind() == FailureKind::CredentialRejected
            && let Ok(refusal) = pb::LeaseRefusal::try_from(failure.lease_refusal)
            && refusal != pb::LeaseRefusal::Unspecified
            && let Some(used) = &used
        {
            state.config.credential_health().record_refusal(used, refusal);
        }
        // The model cannot read the request's content: never this provider
        // again in this request; another of the route may read it.
        let content_refused = refuses_content(&failure);
        if content_refused {
            avoid.insert(provider_id.clone(), false);
        }
        let relay = if credential_refused {
            if let Some(used) = &used {
                state.config.credential_health().record_rejection(used);
            }
            for other in same_credential(&candidates, provider) {
                avoid.insert(other.to_string(), false);
            }
            None
        } else if content_refused {
            // The model cannot read the content: the client's 400 in its
            // API's shape (a relayed llama.cpp 500 reads as temporary, and
            // clients retry it).
            None
        } else {
            relay
        };
        // Too long for this model's context window: the route's larger
        // model, with an attempt of its own (one hop: only from the
        // client's own model).
        if let Some(next) = context_fallback(&config, caller, route, &failure).filter(|_| route == model)
            && let Some(next_candidates) = candidates_of(next)
        {
            count(&mut span, "context_fallback");
            settle(run, true, &failure);
            tracing::info!(provider = %provider_id, "the request exceeds the model's context window; trying its fallback");
            route = next;
            (candidates, context_fitted) = fit(next_candidates);
            avoid.clear();
            max_attempts += 1;
            last_failure = Some(failure);
            continue;
        }
        if failure.kind() == FailureKind::CapacityExhausted && Instant::now() < queued_until {
            max_attempts += 1;
        }
        let stalled = failure.kind() == FailureKind::ResponseStalled;
        // Nothing untried: a refused credential is not worth a backoff.
        let exhausted =
            (credential_refused || content_refused) && candidates.iter().all(|c| avoid.contains_key(&c.provider.id));
        let last = !retryable(&failure) || attempt == max_attempts || exhausted;
        if stalled {
            observe_stall(state, &provider_id, &failure, !last && Instant::now() < deadline);
        }
        if replaying_stall_of.is_some() && last {
            recovery_result(state, "exhausted");
        }
        if last {
            retry_path(state, RetryPlan::GiveUp);
            settle(run, false, &failure);
            // A tunnel relays the provider's own error response, already in
            // the client's API shape.
            return match relay {
                Some(committed) => {
                    count(&mut span, "relayed_error");
                    Ok(*committed)
                }
                None => {
                    count(&mut span, "failed");
                    Err(ApiError::Execution(failure))
                }
            };
        }
        // After a stall the provider may be re-selected (when no alternate
        // is eligible) only on probe-backed `available` evidence: the
        // provider is fine, only this request stalled.
        // A second first-byte miss on the same provider is not replayed on it again.
        let missed_again = failure.first_byte_timeout && !missed_first_byte.insert(provider_id.clone());
        let fallback = !credential_refused
            && !content_refused
            && (!stalled || failure.provider_health() == pb::ProviderHealth::Available)
            && !missed_again;
        if stalled {
            replaying_stall_of = Some(provider_id.clone());
        }
        avoid.insert(provider_id.clone(), fallback);
        let failed_candidate = candidates.iter().find(|c| c.provider.id == provider_id);
        let untried: Vec<u32> = candidates
            .iter()
            .filter(|c| !avoid.contains_key(&c.provider.id) && state.routing.admission.dispatchable(&c.provider))
            .map(|c| c.priority)
            .collect();
        let plan = retry::plan(&RetryInput {
            failure: &failure,
            failed_priority: failed_candidate.map_or(u32::MAX, |c| c.priority),
            untried: &untried,
            same_provider_used: same_retried.contains(&provider_id),
            failed_ejected: state
                .routing
                .admission
                .outlier_status(&provider_id, std::time::Instant::now())
                .ejected_until
                .is_some(),
            attempt,
            attempts_left: max_attempts - attempt,
            remaining: deadline.saturating_duration_since(Instant::now()),
            max_wait: config.retry.same_provider_max_wait(route),
        });
        retry_path(state, plan);
        let delay = match plan {
            RetryPlan::SameProviderAfter(wait) => {
                same_retried.insert(provider_id.clone());
                only = failed_candidate.cloned();
                wait
            }
            RetryPlan::Alone(delay) => delay,
            RetryPlan::Equal | RetryPlan::LowerPriority | RetryPlan::GiveUp => Duration::ZERO,
        };
        if plan == RetryPlan::GiveUp || Instant::now() + delay >= deadline {
            count(&mut span, "failed");
            settle(run, false, &failure);
            return Err(ApiError::Execution(failure));
        }
        count(&mut span, "retried");
        drop(span);
        settle(run, true, &failure);
        tracing::info!(
            provider = %provider_id,
            attempt,
            kind = ?failure.kind(),
            path = plan.label(),
            delay_ms = delay.as_millis() as u64,
            "attempt failed before the first byte; retrying"
        );
        tokio::time::sleep(delay).await;
        last_failure = Some(failure);
    }
    Err(last_failure.map(ApiError::Execution).unwrap_or(ApiError::Internal))
}

/// The span of attempt number `attempt` on `lease` for `route`.
fn attempt_span(
    state: &EdgeState,
    parent: Option<iop_telemetry::SpanContext>,
    attempt: u32,
    route: &str,
    lease: &crate::core::lease::Lease,
) -> iop_telemetry::Span {
    let mut span = state.tracer.start("attempt", iop_telemetry::Kind::Client, parent);
    if span.context().is_some() {
        span.set("iop.attempt", attempt);
        span.set("iop.provider.id", lease.provider_id().to_string());
        span.set("iop.node", lease.node().to_string());
        span.set("gen_ai.provider.name", crate::trace::provider_name(lease.adapter()));
        span.set("gen_ai.request.model", route.to_string());
        span.set("gen_ai.response.model", lease.target_model().to_string());
    }
    span
}

fn retry_path(state: &EdgeState, plan: RetryPlan) {
    state.metrics.retry_paths.get_or_create(&RetryPathLabels { path: plan.label() }).inc();
}

fn recovery_result(state: &EdgeState, result: &'static str) {
    state.metrics.recovery_results.get_or_create(&RecoveryLabels { result }).inc();
    tracing::info!(target: "edge_liveness_recovery_observation", result, "stall replay finished");
}

enum Attempt {
    Committed(Box<Committed>),
    Failed {
        failure: pb::ExecutionFailure,
        /// For a tunnel: the provider's error response, relayed as-is if the
        /// request does not move on.
        relay: Option<Box<Committed>>,
        /// The attempt's run, released once the gate knows whether the
        /// request moves on (so its slot is recorded with the real reason).
        run: Option<Box<dyn FailedRun>>,
    },
}

fn failed(failure: pb::ExecutionFailure) -> Attempt {
    Attempt::Failed { failure, relay: None, run: None }
}

/// A failed attempt whose run is still held.
fn failed_run<F: NodeFrame>(failure: pb::ExecutionFailure, run: RunStream<F>) -> Attempt {
    Attempt::Failed { failure, relay: None, run: Some(Box::new(run)) }
}

/// A failed attempt's run, as the gate releases it.
trait FailedRun: Send {
    /// Releases the slot as `retried` when the request moves on; otherwise
    /// the run's own terminal reason stands (a run the Edge gave up on
    /// before its terminal is stopped as `deadline` or `provider_error`).
    fn release(self: Box<Self>, retried: bool, failure: &pb::ExecutionFailure);
}

impl<F: NodeFrame> FailedRun for RunStream<F>
where
    F::Item: Send,
{
    fn release(mut self: Box<Self>, retried: bool, failure: &pb::ExecutionFailure) {
        use crate::core::lease::ReleaseReason;
        let reason = match failure.kind() {
            _ if retried => ReleaseReason::Retried,
            FailureKind::DeadlineExceeded => ReleaseReason::Deadline,
            _ => ReleaseReason::ProviderError,
        };
        self.stop(reason);
        if retried {
            self.mark_retried();
        }
    }
}

fn settle(run: Option<Box<dyn FailedRun>>, retried: bool, failure: &pb::ExecutionFailure) {
    if let Some(run) = run {
        run.release(retried, failure);
    }
}

/// The lease's node connection, if it is still the one admission saw.
fn control_for(
    state: &EdgeState,
    lease: &LeaseGuard,
) -> Result<crate::node::registry::ControlSender, pb::ExecutionFailure> {
    let l = lease.lease();
    state
        .registry
        .control_if_current(l.node(), l.generation())
        .ok_or_else(|| pb::ExecutionFailure::new(FailureKind::TransportLost, "node connection closed before dispatch"))
}

#[allow(clippy::too_many_arguments)]
async fn attempt_run(
    state: &Arc<EdgeState>,
    provider: Option<&iop_proto::config::ProviderEntry>,
    lease: LeaseGuard,
    mut request: pb::RunRequest,
    point: CommitPoint,
    deadline: Instant,
    max_response_bytes: usize,
    account: Option<Account>,
) -> Attempt {
    let control = match control_for(state, &lease) {
        Ok(control) => control,
        Err(failure) => return failed(failure),
    };
    let l = lease.lease();
    address_run(&mut request, provider, l, &state.routing.residency);
    let target_model = l.target_model().to_string();
    let stall = stall_timeout(provider);

    let mut run = match start(state, &state.link.runs, lease, control, request, account).await {
        Ok(run) => run,
        Err(failure) => return failed(failure),
    };
    let mut buffered = Vec::new();
    let mut budget = AnswerBudget::new(max_response_bytes);
    loop {
        let event = match next_before_commit(&mut run, deadline, stall).await {
            Ok(event) => event,
            Err(failure) => return failed_run(failure, run),
        };
        if let Event::Failed(_) | Event::Cancelled(_) = &event {
            return failed_run(failure_of(&event), run);
        }
        if let Err(failure) = budget.charge(&event) {
            run.stop(crate::core::lease::ReleaseReason::ProviderError);
            return failed(failure);
        }
        let commit = is_commit(&event, point);
        let terminal = matches!(event, Event::Completed(_));
        buffered.push(event);
        if commit {
            let rest = (!terminal).then_some(LiveRun::new(run, deadline));
            return Attempt::Committed(Box::new(Committed {
                target_model,
                answer: Answer::Normalized { buffered, rest },
                context_window: None,
            }));
        }
    }
}

/// Starts an attempt's run (or tunnel) in `table`, charged to `account`.
async fn start<F: NodeFrame>(
    state: &EdgeState,
    table: &Arc<dispatch::RunTable<F>>,
    lease: LeaseGuard,
    control: crate::node::registry::ControlSender,
    request: F::Request,
    account: Option<Account>,
) -> Result<RunStream<F>, pb::ExecutionFailure> {
    dispatch::start_run(table, &state.metrics, &state.routing.handoff, lease, control, request, account).await
}

/// The Edge's own bound on silence before the first byte: the provider's
/// response-stall timeout (0 in config means the default) plus the time the
/// node needs to claim the stall and join its evidence, so the node's typed
/// stall normally arrives first; this only catches a node that went quiet.
fn stall_timeout(provider: Option<&iop_proto::config::ProviderEntry>) -> Duration {
    let timeout = iop_proto::liveness::response_stall_timeout(provider.map_or(0, |p| p.response_stall_timeout_ms))
        .unwrap_or(Duration::from_millis(iop_proto::liveness::DEFAULT_RESPONSE_STALL_TIMEOUT_MS));
    timeout + NODE_STALL_EVIDENCE_BUDGET
}

/// Addresses `request` to the provider `lease` admitted it to.
fn address_run(
    request: &mut pb::RunRequest,
    provider: Option<&iop_proto::config::ProviderEntry>,
    lease: &crate::core::lease::Lease,
    residency: &crate::residency::ResidencyTable,
) {
    request.run_id = lease.run_id().to_string();
    request.provider_id = lease.provider_id().to_string();
    request.adapter = pb::AdapterKind::from(lease.adapter()).into();
    request.target_model = lease.target_model().to_string();
    // The stall and first-byte timeouts travel with the request to whichever provider answers.
    request.response_stall_timeout_ms = provider.map_or(0, |p| p.response_stall_timeout_ms);
    request.first_byte_timeout_ms = first_byte_timeout_ms(provider, lease, residency);
}

/// The first-byte timeout sent with a request on `lease`: the provider's,
/// extended by its model's last measured load when the lease's connection
/// reports the model `not_loaded` ([`crate::core::residency::first_byte_timeout_ms`]).
fn first_byte_timeout_ms(
    provider: Option<&iop_proto::config::ProviderEntry>,
    lease: &crate::core::lease::Lease,
    residency: &crate::residency::ResidencyTable,
) -> u64 {
    let residency = residency.on(lease.provider_id(), lease.generation());
    crate::core::residency::first_byte_timeout_ms(provider.map_or(0, |p| p.first_byte_timeout_ms), &residency)
}

/// The Edge's own bound on a tunnel's first frame (its response head): the
/// first-byte timeout the request carries (0 means the default) plus the
/// node's evidence budget, as for [`stall_timeout`]. A run's first event may
/// legitimately come long after the provider's headers (a prefill the node
/// waits out under the stall timeout), so runs are bounded by the stall
/// timeout alone.
fn first_byte_timeout(ms: u64) -> Duration {
    let timeout = iop_proto::liveness::first_byte_timeout(ms)
        .unwrap_or(Duration::from_millis(iop_proto::liveness::DEFAULT_FIRST_BYTE_TIMEOUT_MS));
    timeout + NODE_STALL_EVIDENCE_BUDGET
}

/// Upper bound of the node's stall evidence join (close grace and probe run
/// concurrently, each under 5 s) plus transport slack.
const NODE_STALL_EVIDENCE_BUDGET: Duration = Duration::from_secs(7);

/// The next item of a run that has not committed yet. Nothing from the
/// provider for its response-stall timeout is a stall (retryable: nothing
/// reached the client); the request deadline bounds everything.
async fn next_before_commit<F: NodeFrame>(
    run: &mut RunStream<F>,
    deadline: Instant,
    stall: Duration,
) -> Result<F::Item, pb::ExecutionFailure> {
    let stall_at = Instant::now() + stall;
    let (until, timeout_failure) = if stall_at < deadline {
        (
            stall_at,
            pb::ExecutionFailure::new(
                FailureKind::ResponseStalled,
                "no progress from the provider within its response-stall timeout",
            ),
        )
    } else {
        (deadline, pb::ExecutionFailure::new(FailureKind::DeadlineExceeded, "the request's time budget ran out"))
    };
    match tokio::time::timeout_at(until, run.next()).await {
        Err(_) => Err(timeout_failure),
        Ok(Some(item)) => Ok(item),
        Ok(None) => Err(pb::ExecutionFailure::new(FailureKind::Internal, "run ended twice")),
    }
}

/// Largest provider error body kept to decide about (and relay) an error.
const MAX_ERROR_BODY: usize = 64 * 1024;

#[allow(clippy::too_many_arguments)]
async fn attempt_tunnel(
    state: &Arc<EdgeState>,
    provider: Option<&iop_proto::config::ProviderEntry>,
    lease: LeaseGuard,
    form: &TunnelForm,
    sealed: Option<pb::SealedLease>,
    deadline: Instant,
    traceparent: String,
    account: Option<Account>,
) -> Attempt {
    let control = match control_for(state, &lease) {
        Ok(control) => control,
        Err(failure) => return failed(failure),
    };
    let l = lease.lease();
    let target_model = l.target_model().to_string();
    let (body, strip_usage_chunk) = match rewrite_model(&form.body, &target_model, form.path) {
        Ok(rewritten) => rewritten,
        Err(failure) => return failed(failure),
    };
    let request = pb::ProviderTunnelRequest {
        tunnel_id: l.run_id().to_string(),
        provider_id: l.provider_id().to_string(),
        adapter: pb::AdapterKind::from(l.adapter()).into(),
        target_model: target_model.clone(),
        method: "POST".into(),
        path: form.path.to_string(),
        headers: form.headers.clone(),
        body,
        response_stall_timeout_ms: provider.map_or(0, |p| p.response_stall_timeout_ms),
        first_byte_timeout_ms: first_byte_timeout_ms(provider, l, &state.routing.residency),
        lease: sealed,
        traceparent,
        strip_usage_chunk,
    };
    let stall = stall_timeout(provider);
    // The response head is the provider's first byte, relayed at once: the
    // first frame is bounded by the first-byte timeout too.
    let mut bound = first_byte_timeout(request.first_byte_timeout_ms).min(stall);
    let mut run = match start(state, &state.link.tunnels, lease, control, request, account).await {
        Ok(run) => run,
        Err(failure) => return failed(failure),
    };
    let mut head: Option<pb::TunnelResponseHead> = None;
    let mut buffered: Vec<Bytes> = Vec::new();
    let mut buffered_len = 0;
    loop {
        let frame = match next_before_commit(&mut run, deadline, bound).await {
            Ok(frame) => frame,
            Err(failure) => return failed_run(failure, run),
        };
        bound = stall;
        let commit = |head: pb::TunnelResponseHead, buffered, rest| {
            let answer = Answer::Tunnel { head, buffered, rest };
            Box::new(Committed { target_model: target_model.clone(), answer, context_window: None })
        };
        match (frame, head.take()) {
            (Frame::Head(h), None) => head = Some(h),
            (Frame::Body(bytes), Some(h)) if (200..300).contains(&h.status) => {
                buffered.push(Bytes::from(bytes));
                return Attempt::Committed(commit(h, buffered, Some(LiveRun::new(run, deadline))));
            }
            (Frame::End(_), Some(h)) if (200..300).contains(&h.status) => {
                return Attempt::Committed(commit(h, buffered, None));
            }
            // An error response: keep its (bounded) body to decide and relay.
            (Frame::Body(bytes), Some(h)) => {
                buffered_len += bytes.len();
                buffered.push(Bytes::from(bytes));
                if buffered_len > MAX_ERROR_BODY {
                    return Attempt::Committed(commit(h, buffered, Some(LiveRun::new(run, deadline))));
                }
                head = Some(h);
            }
            (Frame::End(_), Some(h)) => {
                let failure = crate::dispatch::http_failure(&h, &buffered);
                let relay = Some(commit(h, buffered, None));
                return Attempt::Failed { failure, relay, run: Some(Box::new(run)) };
            }
            (frame @ (Frame::Failed(_) | Frame::Cancelled(_)), _) => {
                return failed_run(failure_of_frame(&frame), run);
            }
            (_, _) => {
                let failure = pb::ExecutionFailure::new(FailureKind::ProviderProtocol, "tunnel frames out of order");
                return failed_run(failure, run);
            }
        }
    }
}

/// The client's JSON body with `model` set to the provider's target.
fn rewrite_model(body: &[u8], target_model: &str, path: &str) -> Result<(Vec<u8>, bool), pb::ExecutionFailure> {
    let mut value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|_| pb::ExecutionFailure::new(FailureKind::InvalidRequest, "request body is not JSON"))?;
    let object = value
        .as_object_mut()
        .ok_or_else(|| pb::ExecutionFailure::new(FailureKind::InvalidRequest, "request body is not a JSON object"))?;
    object.insert("model".into(), serde_json::Value::String(target_model.to_string()));
    let strip_usage = path == CHAT_COMPLETIONS_PATH && ask_for_usage(object);
    Ok((serde_json::to_vec(&value).expect("a JSON value serializes"), strip_usage))
}

/// The tunnel path whose streams report usage only when asked.
const CHAT_COMPLETIONS_PATH: &str = "/v1/chat/completions";

/// A Chat Completions stream that did not ask for usage
/// (`stream_options.include_usage`) is made to, so that its tokens are
/// charged; true when the client did not ask (the node then leaves the
/// usage chunk out of what it relays). Pure.
fn ask_for_usage(request: &mut serde_json::Map<String, serde_json::Value>) -> bool {
    use serde_json::Value;
    if request.get("stream") != Some(&Value::Bool(true)) {
        return false;
    }
    let options = request.entry("stream_options").or_insert(Value::Null);
    if options.is_null() {
        *options = Value::Object(Default::default());
    }
    let Value::Object(options) = options else { return false };
    if options.get("include_usage") == Some(&Value::Bool(true)) {
        return false;
    }
    options.insert("include_usage".into(), Value::Bool(true));
    true
}

fn failure_of_frame(frame: &Frame) -> pb::ExecutionFailure {
    match frame {
        Frame::Failed(f) => f.failure.clone().unwrap_or_else(|| pb::ExecutionFailure::new(FailureKind::Internal, "")),
        _ => pb::ExecutionFailure::new(FailureKind::Internal, "the node cancelled the tunnel"),
    }
}

fn failure_of(event: &Event) -> pb::ExecutionFailure {
    match event {
        Event::Failed(f) => f.failure.clone().unwrap_or_else(|| pb::ExecutionFailure::new(FailureKind::Internal, "")),
        Event::Cancelled(_) => pb::ExecutionFailure::new(FailureKind::Internal, "the node cancelled the run"),
        _ => pb::ExecutionFailure::new(FailureKind::Internal, "not a failure"),
    }
}

fn admit_error(error: AdmitError, model: &str) -> ApiError {
    match error {
        AdmitError::NoneEligible => ApiError::NoProviderAvailable(model.to_string()),
        AdmitError::QueueFull => ApiError::QueueFull(model.to_string()),
        AdmitError::QueueTimeout => ApiError::QueueTimeout(model.to_string()),
    }
}

#[cfg(test)]
mod tests;
