//! HTTP ingress (axum): the client APIs and health on the client listener;
//! admin snapshots, node commands and metrics on the admin listener.
//! Handlers are thin: authenticate with `auth`, parse with `ingress::*`, hand
//! the run to the `gate` (route, admission, retries, `dispatch`), render with
//! `ingress::*` (the layers: `docs/architecture.md`).

mod admin;
pub mod body;
pub mod connections;
pub mod guard;
pub mod listener;
mod respond;
mod surface;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::stream;
use iop_proto::pb::{self, run_event::Event};
use iop_proto::wire::{relayable_request_header, relayable_response_header};
use serde_json::json;

use crate::auth::Caller;
use crate::gate::{self, Answer, CommitPoint, LiveRun, TunnelForm};
use crate::ingress::error::ApiError;
use crate::ingress::hosted_tools;
use crate::metrics::{Api, ApiLabels, ApiRouteLabels, PrincipalLabels, RateLimitedLabels, RequestLabels};
use crate::route;
use crate::state::EdgeState;
use iop_proto::config::HostedTools;
use respond::{error_response, set_limit_headers};
use surface::{ChatCompletions, Messages, Responses, Surface};

/// The client listener (`listen.http`): what API keys buy, and probes.
pub fn router(state: Arc<EdgeState>) -> Router {
    let guard = guard::Guard { state: state.clone(), listener: guard::Listener::Client };
    Router::new()
        .route("/v1/chat/completions", post(api::<ChatCompletions>))
        .route("/v1/responses", post(api::<Responses>))
        .route("/v1/messages", post(api::<Messages>))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models::<ChatCompletions>))
        // Model names may contain `/` (e.g. `qwen/qwen2.5-7b`).
        .route("/v1/models/{*id}", get(model::<ChatCompletions>))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
        .layer(from_fn_with_state(guard.clone(), guard::json_only))
        .layer(from_fn_with_state(guard, guard::local_host_only))
}

/// The admin listener (`listen.admin`): for the operator and Prometheus,
/// never for clients (it has no authentication of its own).
pub fn admin_router(state: Arc<EdgeState>) -> Router {
    let guard = guard::Guard { state: state.clone(), listener: guard::Listener::Admin };
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/admin/v1/nodes", get(admin::nodes))
        .route("/admin/v1/nodes/{name}/commands/{command}", post(admin::node_command))
        .route("/admin/v1/providers", get(admin::providers))
        .route("/admin/v1/config", get(admin::config))
        .route("/admin/v1/usage", get(admin::usage))
        .route("/admin/v1/providers/{id}/ollama/{call}", get(admin::ollama_api))
        .route("/admin/v1/workspaces/{reference}/calls", post(admin::workspace_calls))
        .with_state(state)
        .layer(from_fn_with_state(guard.clone(), guard::json_only))
        .layer(from_fn_with_state(guard.clone(), guard::no_browser_origin))
        .layer(from_fn_with_state(guard, guard::local_host_only))
}

/// Records one client request's outcome, time to first byte and duration
/// exactly once, when the response (streaming or not) is done or abandoned.
struct RequestRecord {
    state: Arc<EdgeState>,
    api: Api,
    /// Set once the request was authenticated.
    caller: Option<Caller>,
    /// The answer's token usage, as the last usage event (or a tunnel's
    /// end) reported it, for the request's span. Tokens are charged per
    /// attempt by the attempt's run (`crate::dispatch`, `crate::usage`).
    usage: Option<pb::Usage>,
    /// The answering provider's context window, when the route's providers
    /// too small for the prompt were left out (`gate::Committed`).
    context_window: Option<u32>,
    /// The answering node relays only the answer's first tool call
    /// (`RunStarted.first_tool_call_only`; [`PARALLEL_TOOL_CALLS_HEADER`]).
    first_tool_call_only: bool,
    /// The caller's place in its concurrency limit, held until the
    /// response is done (`crate::ratelimit`).
    permit: Option<crate::ratelimit::Permit>,
    /// The body's share of the Edge's body budget, held until the
    /// response is done (`body::BodyBudget`).
    body: Option<body::BodyPermit>,
    /// Set once the request named a configured model.
    route: Option<String>,
    started: Instant,
    first_byte: bool,
    outcome: &'static str,
    /// Body bytes sent to the client so far (streamed responses).
    bytes_sent: u64,
    /// The stream's failure after its start was logged ([`Self::stream_failed`]).
    failure_logged: bool,
    /// The request's `ingress` span (`crate::trace`), ended with the record.
    span: iop_telemetry::Span,
}

impl RequestRecord {
    fn new(state: Arc<EdgeState>, api: Api) -> Self {
        // Until the response finishes, a drop means the client went away.
        Self {
            state,
            api,
            caller: None,
            usage: None,
            context_window: None,
            first_tool_call_only: false,
            permit: None,
            body: None,
            route: None,
            started: Instant::now(),
            first_byte: false,
            outcome: "client_disconnected",
            bytes_sent: 0,
            failure_logged: false,
            span: iop_telemetry::Span::none(),
        }
    }

    /// Starts the request's `ingress` span: a child of the client's
    /// `traceparent` when it sent a valid one.
    fn traced(mut self, headers: &HeaderMap) -> Self {
        let parent = crate::trace::client_parent(headers);
        let mut span = self.state.tracer.start("ingress", iop_telemetry::Kind::Server, parent);
        span.set("gen_ai.operation.name", crate::trace::operation(self.api));
        span.set("iop.api", crate::trace::api_name(self.api));
        self.span = span;
        self
    }

    /// The caller's per-minute limits after this request was counted, for
    /// the rate-limit headers (none for a caller without any).
    fn limit_status(&self) -> Option<crate::ratelimit::Status> {
        self.permit.as_ref().and_then(crate::ratelimit::Permit::status)
    }

    /// The response's HTTP status, on the span.
    fn status(&mut self, status: u16) {
        self.span.set("http.response.status_code", u32::from(status));
    }

    /// A body frame of `len` bytes went to the client.
    fn sent(&mut self, len: usize) {
        self.first_byte();
        self.bytes_sent += len as u64;
    }

    /// A committed stream failed: one warning per request, naming the
    /// provider, the closed code (and the provider's own code, sanitized,
    /// when it differs) and the bytes the client already got. Never the
    /// failure's message (a provider's words may quote the prompt).
    fn stream_failed(&mut self, provider: Option<&str>, error: &ApiError) {
        if std::mem::replace(&mut self.failure_logged, true) {
            return;
        }
        tracing::warn!(
            target: "edge_stream_failure",
            provider = %provider.unwrap_or("unknown"),
            api = ?self.api,
            route = %self.route.as_deref().unwrap_or("unknown"),
            code = error.code(),
            provider_code = error.provider_code().unwrap_or(""),
            bytes_sent = self.bytes_sent,
            "stream failed after it started"
        );
    }

    fn first_byte(&mut self) {
        if !self.first_byte {
            self.first_byte = true;
            let labels = ApiLabels { api: self.api };
            self.state.metrics.time_to_first_byte.get_or_create(&labels).observe(self.started.elapsed().as_secs_f64());
        }
    }
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        if self.span.context().is_some() {
            let span = &mut self.span;
            span.set("iop.outcome", self.outcome);
            if self.outcome != "ok" {
                span.fail(self.outcome);
            }
            if let Some(route) = &self.route {
                span.set("gen_ai.request.model", route.clone());
            }
            if let Some(usage) = &self.usage {
                crate::trace::set_usage(span, usage);
            }
        }
        let route = self.route.take().unwrap_or_else(|| "unknown".to_string());
        if let Some(caller) = &self.caller {
            self.state.routing.usage.finished(caller, &route, self.outcome);
        }
        let metrics = &self.state.metrics;
        let labels = ApiRouteLabels { api: self.api, route: route.clone() };
        metrics.http_request_duration.get_or_create(&labels).observe(self.started.elapsed().as_secs_f64());
        metrics.http_requests.get_or_create(&RequestLabels { api: self.api, route, outcome: self.outcome }).inc();
    }
}

/// What a request brought: who sent it, the config it runs under, its
/// body, and the body's share of the Edge's budget (held with the
/// response).
type Read = (Caller, Arc<iop_proto::config::EdgeConfig>, Bytes, body::BodyPermit);

/// The caller, the config the request runs under, and its body
/// ([`body::read`]): the caller is authenticated and `admit`ted (counted
/// against its limits) before the body is read, so a caller that is
/// unknown or over its limits costs no more than its headers.
async fn authenticated_body(
    state: &EdgeState,
    headers: &HeaderMap,
    request_body: Body,
    admit: impl FnOnce(&Caller, &iop_proto::config::EdgeConfig) -> Result<(), ApiError>,
) -> Result<Read, ApiError> {
    let config = state.config.current();
    let limits = body::BodyLimits::of(&config.limits);
    let mut chunks = request_body.into_data_stream();
    let caller = match authenticate(state, headers).and_then(|caller| admit(&caller, &config).map(|()| caller)) {
        Ok(caller) => caller,
        Err(refusal) => {
            body::discard(&mut chunks, limits.max_bytes, limits.idle).await;
            return Err(refusal);
        }
    };
    let content_length = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let (bytes, permit) = match body::read(&mut chunks, content_length, limits, &state.routing.body_budget).await {
        Err(refused @ (ApiError::PayloadTooLarge { .. } | ApiError::Overloaded)) => {
            body::discard(&mut chunks, limits.max_bytes, limits.idle).await;
            return Err(refused);
        }
        read => read?,
    };
    Ok((caller, config, bytes, permit))
}

/// Counts the request against its caller's limits (`crate::ratelimit`);
/// the record keeps the caller for usage accounting and the permit for
/// the response's life.
fn admit(
    state: &EdgeState,
    config: &iop_proto::config::EdgeConfig,
    caller: &Caller,
    record: &mut RequestRecord,
) -> Result<(), ApiError> {
    record.caller = Some(caller.clone());
    record.span.set("iop.principal", caller.name().to_string());
    record.permit = Some(limit(state, config, caller)?);
    Ok(())
}

/// A request of `caller` counted against its limits: the permit to hold
/// for the response's life, or the refusal (counted).
fn limit(
    state: &EdgeState,
    config: &iop_proto::config::EdgeConfig,
    caller: &Caller,
) -> Result<crate::ratelimit::Permit, ApiError> {
    let replicas = state.replica_set(config).len();
    state.routing.rate_limits.admit(caller, replicas).map_err(|refusal| refused(state, caller, refusal))
}

/// Reserves the tokens `request` may use of its caller's tokens per
/// minute, held by the record's permit (`crate::ratelimit`).
fn reserve(
    state: &EdgeState,
    config: &iop_proto::config::EdgeConfig,
    caller: &Caller,
    record: &mut RequestRecord,
    request: &pb::RunRequest,
) -> Result<(), ApiError> {
    let Some(permit) = record.permit.as_mut() else { return Ok(()) };
    let (replicas, tokens) = (state.replica_set(config).len(), crate::usage::reservation(request));
    state
        .routing
        .rate_limits
        .reserve(permit, caller, replicas, tokens)
        .map_err(|refusal| refused(state, caller, refusal))
}

/// A request a per-key limit refused: counted, and its error.
fn refused(state: &EdgeState, caller: &Caller, refusal: Box<crate::ratelimit::Refusal>) -> ApiError {
    let labels = RateLimitedLabels { principal: caller.name().to_string(), limit: refusal.limit.label() };
    tracing::debug!(principal = %labels.principal, limit = labels.limit, "request refused by a per-key limit");
    state.metrics.rate_limited.get_or_create(&labels).inc();
    ApiError::RateLimited(refusal)
}

/// The request header that makes a request a single-request job.
pub const WORKSPACE_HEADER: &str = "iop-workspace";
/// The response header naming the job (for correlation in logs).
pub const JOB_ID_HEADER: &str = "iop-job-id";

/// One handler for every client API: parse, run through the gate (or as a
/// job), render.
async fn api<S: Surface>(State(state): State<Arc<EdgeState>>, headers: HeaderMap, body: Body) -> Response {
    let mut record = RequestRecord::new(state.clone(), S::API).traced(&headers);
    let job_id = headers.contains_key(WORKSPACE_HEADER).then(|| crate::ids::new_uuid().simple().to_string());
    let mut dropped_tools = String::new();
    let reply = serve::<S>(&state, headers, body, &mut record, job_id.clone(), &mut dropped_tools).await;
    let limits = record.limit_status();
    // A tunnel relays the client's body as it came: nothing was dropped.
    let relayed = matches!(reply, Ok(Reply::Tunnel(_)));
    let context_window = record.context_window;
    let first_tool_call_only = record.first_tool_call_only;
    let mut response = match reply {
        Ok(Reply::Complete(body)) => {
            record.outcome = "ok";
            record.first_byte();
            record.status(200);
            axum::Json(body).into_response()
        }
        Ok(Reply::Stream(stream)) => {
            record.status(200);
            sse_response::<S>(*stream, record)
        }
        Ok(Reply::Tunnel(tunnel)) => {
            let (head, buffered, rest) = *tunnel;
            tunnel_response(head, buffered, rest, record)
        }
        Ok(Reply::Early(early)) => {
            record.status(200);
            early_response::<S>(*early, record)
        }
        Err(err) => {
            record.outcome = err.code();
            record.first_byte();
            record.status(err.status().as_u16());
            error_response::<S>(&err)
        }
    };
    if let Some(id) = job_id.and_then(|id| HeaderValue::from_str(&id).ok()) {
        response.headers_mut().insert(JOB_ID_HEADER, id);
    }
    if !dropped_tools.is_empty() && !relayed {
        // Kinds from a closed list: always a valid header value.
        if let Ok(value) = HeaderValue::from_str(&dropped_tools) {
            response.headers_mut().insert(hosted_tools::DROPPED_TOOLS_HEADER, value);
        }
    }
    if let Some(window) = context_window {
        response.headers_mut().insert(CONTEXT_WINDOW_HEADER, HeaderValue::from(window));
    }
    if first_tool_call_only {
        response.headers_mut().insert(PARALLEL_TOOL_CALLS_HEADER, HeaderValue::from_static(FIRST_KEPT));
    }
    with_limit_headers(response, S::API, limits)
}

/// The response header naming the answering provider's context window (in
/// tokens) when the prompt was too long for other providers of its model
/// and went to one whose window fits.
pub const CONTEXT_WINDOW_HEADER: &str = "iop-context-window";

/// The response header saying how `parallel_tool_calls: false` (Messages:
/// `disable_parallel_tool_use`) was enforced when the provider cannot be told
/// (Ollama): [`FIRST_KEPT`], the answer's first tool call was relayed and any
/// others dropped. Set from the run's start, so on every committed answer;
/// absent on a stream whose head went out before its commit point
/// (`limits.stream_keepalive_ms`), since headers cannot follow a head.
pub const PARALLEL_TOOL_CALLS_HEADER: &str = "iop-parallel-tool-calls";
pub const FIRST_KEPT: &str = "first-kept";

enum Reply<S: Surface> {
    Complete(serde_json::Value),
    Stream(Box<SseStream<S>>),
    Tunnel(Box<(pb::TunnelResponseHead, Vec<Bytes>, Option<LiveRun<pb::ProviderTunnelFrame>>)>),
    /// A streaming request still before its commit point after
    /// `limits.stream_keepalive_ms`: the head goes out now, keepalives follow.
    Early(Box<Early<S>>),
}

type Execution = std::pin::Pin<Box<dyn std::future::Future<Output = Result<gate::Committed, ApiError>> + Send>>;

/// A streaming request whose gate has not committed yet.
struct Early<S: Surface> {
    execution: Execution,
    period: std::time::Duration,
    context: Option<S::Context>,
    max_response_bytes: usize,
    again: Option<crate::continuation::Again>,
}

/// Bodies larger than this are parsed on the blocking pool: a large body is
/// where documents (a PDF's text layer: up to ~0.2 s each, 20 a request)
/// and big JSON are, and a runtime worker must not stall on them.
const PARSE_IN_PLACE_BYTES: usize = 256 * 1024;

async fn parse<T: Send + 'static>(bytes: &Bytes, parse: fn(&[u8]) -> Result<T, ApiError>) -> Result<T, ApiError> {
    if bytes.len() <= PARSE_IN_PLACE_BYTES {
        return parse(bytes);
    }
    let bytes = bytes.clone();
    match tokio::task::spawn_blocking(move || parse(&bytes)).await {
        Ok(parsed) => parsed,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

async fn serve<S: Surface>(
    state: &Arc<EdgeState>,
    headers: HeaderMap,
    body: Body,
    record: &mut RequestRecord,
    job_id: Option<String>,
    dropped_tools: &mut String,
) -> Result<Reply<S>, ApiError> {
    let admit = |caller: &Caller, config: &_| admit(state, config, caller, record);
    let (caller, config, bytes, held) = authenticated_body(state, &headers, body, admit).await?;
    record.body = Some(held);
    // Parsed even when tunnelled: bad input gets a 400 in the API's own shape.
    let parsed = parse(&bytes, S::parse).await?;
    if let Some(first) = parsed.dropped_tools.first() {
        if config.api.hosted_tools == HostedTools::Refuse {
            return Err(hosted_tools::refusal(first));
        }
        *dropped_tools = hosted_tools::header_value(&parsed.dropped_tools);
        tracing::info!(api = ?S::API, tools = %dropped_tools, "hosted tools dropped: no provider behind IOP offers them");
    }
    // Whether the model exists is not told to a caller who may not use it.
    if !caller.may_use(&parsed.model) {
        return Err(ApiError::ModelNotAllowed(parsed.model));
    }
    if route::candidates(&config, &parsed.model).is_some() {
        record.route = Some(parsed.model.clone());
    }
    reserve(state, &config, &caller, record, &parsed.run)?;
    let point = if parsed.stream { CommitPoint::FirstContent } else { CommitPoint::Terminal };
    // A stream that breaks after text may be continued (not a job's: its
    // runs are the job's own).
    // The gate's spans are children of the request's, wherever the
    // execution is polled (an early stream polls it in the response body).
    let parent = record.span.context();
    let again = (parsed.stream && job_id.is_none())
        .then(|| crate::continuation::Again::new(state, &caller, &parsed.model, &parsed.run).traced(parent));
    let mut execution: Execution = match job_id {
        Some(id) => {
            let spec = job_spec::<S>(state, &config, &headers, id, &caller, parsed.model.clone(), parsed.run)?;
            // Spawned within the scope, so that the job's task inherits it.
            let state = state.clone();
            Box::pin(crate::trace::scope(parent, async move { crate::job::spawn(state, spec).await }))
        }
        None => {
            let tunnel = S::TUNNEL_PATH.map(|path| TunnelForm {
                path,
                body: bytes.clone(),
                headers: headers
                    .iter()
                    .filter(|(name, _)| relayable_request_header(name.as_str()))
                    .filter_map(|(name, value)| {
                        Some(pb::HttpHeader { name: name.to_string(), value: value.to_str().ok()?.to_string() })
                    })
                    .collect(),
            });
            let (state, caller, model, run) = (state.clone(), caller.clone(), parsed.model.clone(), parsed.run);
            Box::pin(crate::trace::scope(parent, async move {
                gate::execute(&state, &caller, &model, run, tunnel, point).await
            }))
        }
    };
    let max_response_bytes = config.limits.max_response_bytes;
    let keepalive = config.limits.stream_keepalive_ms;
    let committed = if parsed.stream && keepalive > 0 {
        // Before the threshold nothing changes: an early failure is still an
        // ordinary HTTP error, an early commit an ordinary stream.
        let period = std::time::Duration::from_millis(keepalive);
        match tokio::time::timeout(period, &mut execution).await {
            Ok(result) => result?,
            Err(_) => {
                let context = Some(parsed.context);
                return Ok(Reply::Early(Box::new(Early { execution, period, context, max_response_bytes, again })));
            }
        }
    } else {
        execution.await?
    };
    if let Answer::Normalized { buffered, .. } = &committed.answer {
        record.usage = last_usage(buffered);
        record.first_tool_call_only = buffered.iter().any(|e| matches!(e, Event::Started(s) if s.first_tool_call_only));
    }
    record.context_window = committed.context_window;
    committed_reply::<S>(committed, parsed.stream, parsed.context, max_response_bytes, again)
}

/// Admits a job: the model must exist, the client may not bring tools (the
/// job owns the tool surface), the caller must be granted the workspace
/// (checked before the lookup: a forbidden ref is told apart from an
/// unknown one by nothing), the workspace must be one its node accepted on
/// its current ready connection (frozen here with the authority; never
/// another node), and neither it nor the caller may be at its job limit
/// (the slot is taken here, before any node call).
fn job_spec<S: Surface>(
    state: &Arc<EdgeState>,
    config: &iop_proto::config::EdgeConfig,
    headers: &HeaderMap,
    id: String,
    caller: &Caller,
    model: String,
    request: pb::RunRequest,
) -> Result<crate::job::JobSpec, ApiError> {
    use crate::workspace::WorkspaceError;
    let reference = headers
        .get(WORKSPACE_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|r| !r.is_empty())
        .ok_or_else(|| ApiError::invalid_param(WORKSPACE_HEADER, "must name a workspace"))?;
    if !request.tools.is_empty() {
        let message = "a workspace job brings its own tools: send no `tools` with `iop-workspace`";
        return Err(ApiError::invalid_param("tools", message));
    }
    if route::candidates(config, &model).is_none() {
        return Err(ApiError::ModelNotFound(model));
    }
    // The one rule a running job is judged by again (`job::standing`).
    if crate::job::standing::workspace_grant(caller, config, reference).is_err() {
        return Err(ApiError::WorkspaceNotFound(reference.to_string()));
    }
    let admitted = crate::workspace::admit(state, reference).map_err(|e| match e {
        WorkspaceError::UnknownWorkspace => ApiError::WorkspaceNotFound(reference.to_string()),
        _ => ApiError::WorkspaceUnavailable(reference.to_string()),
    })?;
    let principal_limit = caller.max_concurrent_jobs(config.limits.max_jobs_per_principal);
    let slot = state
        .link
        .job_slots
        .acquire(reference, admitted.max_concurrent_jobs, caller.name(), principal_limit)
        .map_err(ApiError::TooManyJobs)?;
    state.metrics.jobs.get_or_create(&ApiLabels { api: S::API }).inc();
    if S::API == Api::messages {
        state.metrics.anthropic_job_ingress.inc();
    }
    tracing::info!(job = %id, api = ?S::API, "job admitted");
    Ok(crate::job::JobSpec { id, caller: caller.clone(), model, request, admitted, slot })
}

/// How a committed request is answered.
fn committed_reply<S: Surface>(
    committed: gate::Committed,
    stream: bool,
    context: S::Context,
    max_response_bytes: usize,
    again: Option<crate::continuation::Again>,
) -> Result<Reply<S>, ApiError> {
    let (buffered, rest) = match committed.answer {
        Answer::Tunnel { head, buffered, rest } => return Ok(Reply::Tunnel(Box::new((head, buffered, rest)))),
        Answer::Normalized { buffered, rest } => (buffered, rest),
    };
    if !stream {
        let mut collector = S::collector(context, committed.target_model);
        for event in &buffered {
            S::collect(&mut collector, event);
        }
        return S::finish(collector).map(Reply::Complete);
    }
    let budget = S::HOLDS_STREAMED_OUTPUT.then(|| gate::AnswerBudget::new(max_response_bytes));
    Ok(Reply::Stream(Box::new(SseStream {
        streamer: S::streamer(context, committed.target_model),
        source: crate::continuation::Source::new(buffered, rest, again),
        budget,
        frames: VecDeque::new(),
        done: false,
    })))
}

/// What an early stream is doing.
enum Phase<S: Surface> {
    /// Keepalives until the gate commits or fails.
    Waiting(Box<Early<S>>, tokio::time::Interval),
    Sse(Box<SseStream<S>>),
    /// A committed 2xx tunnel: its body is relayed (the head went out already).
    Tunnel(Option<Box<LiveRun<pb::ProviderTunnelFrame>>>),
    Done,
}

/// The response of a streaming request past `limits.stream_keepalive_ms`
/// without a commit: `200 text/event-stream` at once, the API's keepalive
/// every period while the gate goes on (pre-first-content retries on other
/// providers included), then the stream as usual, or the API's error event
/// when the request fails.
fn early_response<S: Surface>(early: Early<S>, record: RequestRecord) -> Response {
    use pb::provider_tunnel_frame::Frame;
    let tick = tokio::time::interval(early.period);
    let state = (Phase::Waiting(Box::new(early), tick), record, VecDeque::<Bytes>::new());
    let body = stream::unfold(state, |(mut phase, mut record, mut pending)| async move {
        loop {
            if let Some(frame) = pending.pop_front() {
                record.sent(frame.len());
                return Some((Ok::<_, std::convert::Infallible>(frame), (phase, record, pending)));
            }
            phase = match phase {
                Phase::Done => return None,
                Phase::Waiting(mut early, mut tick) => {
                    tokio::select! {
                        biased;
                        result = &mut early.execution => {
                            let context = early.context.take().expect("taken once");
                            let again = early.again.take();
                            let reply = result.and_then(|c| committed_reply::<S>(c, true, context, early.max_response_bytes, again));
                            match reply {
                                Ok(Reply::Stream(sse)) => Phase::Sse(sse),
                                Ok(Reply::Tunnel(tunnel)) => {
                                    let (head, buffered, rest) = *tunnel;
                                    if (200..300).contains(&head.status) {
                                        record.outcome = "ok";
                                        pending.extend(buffered);
                                        Phase::Tunnel(rest.map(Box::new))
                                    } else {
                                        let error = ApiError::Execution(crate::dispatch::http_failure(&head, &buffered));
                                        record.outcome = error.code();
                                        pending.extend(S::stream_error(&error));
                                        Phase::Done
                                    }
                                }
                                Ok(Reply::Complete(_) | Reply::Early(_)) => Phase::Done,
                                Err(error) => {
                                    record.outcome = error.code();
                                    pending.extend(S::stream_error(&error));
                                    Phase::Done
                                }
                            }
                        }
                        _ = tick.tick() => {
                            pending.push_back(Bytes::from_static(S::KEEPALIVE));
                            Phase::Waiting(early, tick)
                        }
                    }
                }
                Phase::Sse(mut sse) => match sse_step::<S>(&mut sse, &mut record).await {
                    Some(frames) => {
                        pending.extend(frames);
                        Phase::Sse(sse)
                    }
                    None => Phase::Done,
                },
                Phase::Tunnel(mut rest) => match rest.as_mut()?.next().await? {
                    Frame::Body(bytes) => {
                        pending.push_back(Bytes::from(bytes));
                        Phase::Tunnel(rest)
                    }
                    Frame::Failed(failed) => {
                        let error = ApiError::Execution(failed.failure.unwrap_or_default());
                        record.outcome = error.code();
                        record.stream_failed(rest.as_deref().map(LiveRun::provider_id), &error);
                        pending.extend(S::stream_error(&error));
                        Phase::Done
                    }
                    Frame::End(end) => {
                        record.usage = end.usage;
                        Phase::Done
                    }
                    // (Usage frames are the run's own: `RunStream::next`.)
                    Frame::Cancelled(_) | Frame::Head(_) | Frame::Usage(_) => Phase::Done,
                },
            };
        }
    });
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// How long a tunnel whose client stopped reading waits for the node's End
/// frame ([`TunnelBody`]'s drop).
const TUNNEL_END_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// What relays a committed tunnel's body: its buffered bytes, the live run
/// and the request's record.
struct TunnelBody {
    buffered: VecDeque<Bytes>,
    rest: Option<LiveRun<pb::ProviderTunnelFrame>>,
    record: Option<RequestRecord>,
}

impl Drop for TunnelBody {
    /// The client stopped reading while the run was still open. It may
    /// have had every byte: an SDK closes at `[DONE]` or at the
    /// Content-Length, and the node's End frame, which carries the usage
    /// the node read, comes after the last body bytes. So the next frame is
    /// awaited briefly, off the client's path: an End completes the run (its
    /// lease released as completed, its usage charged by the run and noted
    /// on the span); anything else ends the run as a drop always did (the
    /// run then drains for its usage: `crate::dispatch`).
    fn drop(&mut self) {
        use pb::provider_tunnel_frame::Frame;
        let (Some(mut rest), Some(mut record)) = (self.rest.take(), self.record.take()) else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move {
            if let Ok(Some(Frame::End(end))) = tokio::time::timeout(TUNNEL_END_GRACE, rest.next()).await {
                record.usage = end.usage;
            }
            // Counted here, then the run ends (whole values: a field
            // capture would drop the record at once).
            drop(record);
            drop(rest);
        });
    }
}

/// Relays a committed provider tunnel: the provider's status, headers and
/// body bytes as they come. A failure after the commit aborts the body, so
/// the client sees a broken response, never a complete one.
fn tunnel_response(
    head: pb::TunnelResponseHead,
    buffered: Vec<Bytes>,
    rest: Option<LiveRun<pb::ProviderTunnelFrame>>,
    mut record: RequestRecord,
) -> Response {
    use pb::provider_tunnel_frame::Frame;
    record.outcome = if head.status < 400 { "ok" } else { "provider_http_status" };
    let status = StatusCode::from_u16(head.status as u16).unwrap_or(StatusCode::BAD_GATEWAY);
    record.status(status.as_u16());
    let state = TunnelBody { buffered: VecDeque::from(buffered), rest, record: Some(record) };
    let body = stream::unfold(state, |mut body| async move {
        let record = body.record.as_mut()?;
        if let Some(chunk) = body.buffered.pop_front() {
            record.sent(chunk.len());
            return Some((Ok(chunk), body));
        }
        let item = match body.rest.as_mut()?.next().await? {
            Frame::Body(bytes) => Ok(Bytes::from(bytes)),
            Frame::End(end) => {
                // For the span; the run charged it.
                record.usage = end.usage;
                // The run is over: nothing for the drop to wait for.
                drop(body.rest.take());
                return None;
            }
            Frame::Failed(failed) => {
                let error = ApiError::Execution(failed.failure.unwrap_or_default());
                record.outcome = error.code();
                record.stream_failed(body.rest.as_ref().map(LiveRun::provider_id), &error);
                Err(std::io::Error::other("provider tunnel failed after the response started"))
            }
            Frame::Cancelled(_) | Frame::Head(_) | Frame::Usage(_) => {
                Err(std::io::Error::other("provider tunnel broken"))
            }
        };
        record.sent(item.as_ref().map_or(0, Bytes::len));
        if item.is_err() {
            body.rest = None;
        }
        Some((item, body))
    });
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = status;
    for header in head.headers.iter().filter(|h| relayable_response_header(&h.name)) {
        if let (Ok(name), Ok(value)) =
            (HeaderName::try_from(header.name.as_str()), HeaderValue::try_from(header.value.as_str()))
        {
            response.headers_mut().append(name, value);
        }
    }
    response
}

/// A committed streaming response: buffered events first, then the live run
/// (continued where it may be: `crate::continuation`).
struct SseStream<S: Surface> {
    streamer: S::Streamer,
    source: crate::continuation::Source,
    /// Bounds what the streamer holds, for APIs whose final event repeats
    /// the whole output.
    budget: Option<gate::AnswerBudget>,
    frames: VecDeque<Bytes>,
    done: bool,
}

impl<S: Surface> SseStream<S> {
    async fn next_event(&mut self) -> Option<Event> {
        let event = self.source.next().await?;
        if let Some(budget) = &mut self.budget
            && let Err(failure) = budget.charge(&event)
        {
            self.source.stop(crate::core::lease::ReleaseReason::ProviderError);
            return Some(Event::Failed(pb::RunFailed { failure: Some(failure) }));
        }
        Some(event)
    }
}

/// The frames of a committed stream's next event; `None` once it ended.
async fn sse_step<S: Surface>(s: &mut SseStream<S>, record: &mut RequestRecord) -> Option<Vec<Bytes>> {
    if s.done {
        return None;
    }
    let event = s.next_event().await?;
    let frames = S::stream(&mut s.streamer, &event);
    match &event {
        Event::Usage(usage) => record.usage = Some(*usage),
        Event::Completed(_) => {
            record.outcome = "ok";
            s.done = true;
        }
        Event::Failed(f) => {
            let error = ApiError::Execution(f.failure.clone().unwrap_or_default());
            record.outcome = error.code();
            record.stream_failed(s.source.provider_id(), &error);
            s.done = true;
        }
        Event::Cancelled(_) => s.done = true,
        _ => {}
    }
    Some(frames)
}

fn sse_response<S: Surface>(stream: SseStream<S>, record: RequestRecord) -> Response {
    let body = stream::unfold((stream, record), |(mut s, mut record)| async move {
        loop {
            if let Some(frame) = s.frames.pop_front() {
                record.sent(frame.len());
                return Some((Ok::<_, std::convert::Infallible>(frame), (s, record)));
            }
            let frames = sse_step::<S>(&mut s, &mut record).await?;
            s.frames.extend(frames);
        }
    });
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// The caller a request's key names, counted by principal or by why it was
/// refused.
fn authenticate(state: &EdgeState, headers: &HeaderMap) -> Result<Caller, ApiError> {
    match state.config.secrets().keys.authenticate(headers) {
        Ok(caller) => {
            if let Caller::Principal(p, _) = &caller {
                state.metrics.principal_requests.get_or_create(&PrincipalLabels { principal: p.name.clone() }).inc();
            }
            Ok(caller)
        }
        Err(failure) => {
            state.metrics.reason(&state.metrics.auth_rejections, failure.label());
            Err(ApiError::Unauthenticated(failure))
        }
    }
}

/// The public models the caller may use (OpenAI's list shape).
async fn models<S: Surface>(State(state): State<Arc<EdgeState>>, headers: HeaderMap) -> Response {
    let caller = match authenticate(&state, &headers) {
        Ok(caller) => caller,
        Err(err) => return error_response::<S>(&err),
    };
    let config = state.config.current();
    let data: Vec<_> =
        route::public_models(&config).into_iter().filter(|model| caller.may_use(model)).map(model_object).collect();
    axum::Json(json!({ "object": "list", "data": data })).into_response()
}

/// `POST /v1/embeddings` (OpenAI's shape) through the same routing,
/// admission, credential leases and pre-first-byte retries as a chat: the
/// run carries the inputs, the node calls Ollama's `/api/embed` or the
/// provider's `/v1/embeddings`, and the vectors come back in input order.
async fn embeddings(State(state): State<Arc<EdgeState>>, headers: HeaderMap, body: Body) -> Response {
    let mut record = RequestRecord::new(state.clone(), Api::embeddings).traced(&headers);
    match embed(&state, &headers, body, &mut record).await {
        Ok(answer) => {
            record.outcome = "ok";
            record.first_byte();
            record.status(200);
            with_limit_headers(axum::Json(answer).into_response(), record.api, record.limit_status())
        }
        Err(err) => {
            record.outcome = err.code();
            record.first_byte();
            record.status(err.status().as_u16());
            with_limit_headers(error_response::<ChatCompletions>(&err), record.api, record.limit_status())
        }
    }
}

/// `response` with the rate-limit headers of `limits` (the caller's
/// per-minute limits, [`RequestRecord::limit_status`]), if any.
fn with_limit_headers(mut response: Response, api: Api, limits: Option<crate::ratelimit::Status>) -> Response {
    if let Some(status) = limits {
        set_limit_headers(response.headers_mut(), api, &status, None);
    }
    response
}

async fn embed(
    state: &Arc<EdgeState>,
    headers: &HeaderMap,
    body: Body,
    record: &mut RequestRecord,
) -> Result<serde_json::Value, ApiError> {
    let admit = |caller: &Caller, config: &_| admit(state, config, caller, record);
    let (caller, config, bytes, held) = authenticated_body(state, headers, body, admit).await?;
    record.body = Some(held);
    let request = crate::ingress::embeddings::parse_request(&bytes)?;
    if !caller.may_use(&request.model) {
        return Err(ApiError::ModelNotAllowed(request.model));
    }
    if route::candidates(&config, &request.model).is_some() {
        record.route = Some(request.model.clone());
    }
    let run = pb::RunRequest { embed: Some(request.embed.clone()), ..Default::default() };
    reserve(state, &config, &caller, record, &run)?;
    let execution = gate::execute(state, &caller, &request.model, run, None, CommitPoint::Terminal);
    let committed = crate::trace::scope(record.span.context(), execution).await?;
    let Answer::Normalized { buffered, .. } = committed.answer else { return Err(ApiError::Internal) };
    record.usage = last_usage(&buffered);
    crate::ingress::embeddings::answer(&request, &buffered)
}

/// The usage an answer's buffered events report (the last one counts).
fn last_usage(events: &[Event]) -> Option<pb::Usage> {
    events.iter().rev().find_map(|e| match e {
        Event::Usage(usage) => Some(*usage),
        _ => None,
    })
}

/// How `count_tokens` counted (the response header `iop-token-count`):
/// `exact` (the provider's own tokenizer) or `estimate`.
pub const TOKEN_COUNT_HEADER: &str = "iop-token-count";

/// `POST /v1/messages/count_tokens`: the request's input tokens, counted
/// by the route's provider where it can tokenize (a count run through the
/// same routing and credential leases as a chat, that never queues: it
/// takes a free slot or none), else estimated (about four characters per
/// token over every text, tool definition and tool call). The header
/// `iop-token-count` says which. A count is a request like any other for
/// the caller's limits: over them it is refused, and it holds a place in
/// its concurrency limit until answered.
async fn count_tokens(State(state): State<Arc<EdgeState>>, headers: HeaderMap, body: Body) -> Response {
    let mut permit = None;
    let admit = |caller: &Caller, config: &_| {
        permit = Some(limit(&state, config, caller)?);
        Ok(())
    };
    let (caller, config, bytes, held) = match authenticated_body(&state, &headers, body, admit).await {
        Ok(read) => read,
        Err(err) => return error_response::<Messages>(&err),
    };
    let request = match parse(&bytes, crate::ingress::anthropic_messages::parse_count_tokens_request).await {
        Ok(request) => request,
        Err(err) => return error_response::<Messages>(&err),
    };
    if !caller.may_use(&request.model) || route::candidates(&config, &request.model).is_none() {
        let err = if caller.may_use(&request.model) {
            ApiError::ModelNotFound(request.model)
        } else {
            ApiError::ModelNotAllowed(request.model)
        };
        return error_response::<Messages>(&err);
    }
    let run = pb::RunRequest {
        messages: request.messages.clone(),
        tools: request.tools.clone(),
        count_tokens: true,
        ..Default::default()
    };
    let counted = match gate::execute(&state, &caller, &request.model, run, None, CommitPoint::Terminal).await {
        Ok(gate::Committed { answer: Answer::Normalized { buffered, .. }, .. }) => {
            crate::ingress::anthropic_messages::counted_tokens(&buffered)
        }
        Ok(_) => None,
        Err(err) => {
            tracing::debug!(code = err.code(), "no provider count; answering the estimate");
            None
        }
    };
    let (tokens, how) = match counted {
        Some(tokens) => (tokens, "exact"),
        None => (iop_proto::usage::estimate_input_tokens(&request.messages, &request.tools), "estimate"),
    };
    let mut response = axum::Json(json!({ "input_tokens": tokens })).into_response();
    response.headers_mut().insert(TOKEN_COUNT_HEADER, HeaderValue::from_static(how));
    // The caller's place in its concurrency limit and the body's share of
    // the budget, held until answered.
    drop((permit, held));
    response
}

fn model_object(id: impl Into<String>) -> serde_json::Value {
    json!({ "id": id.into(), "object": "model", "created": 0, "owned_by": "iop" })
}

/// `GET /v1/models/{id}`: one model the caller may use, else 404 (a model
/// the caller may not use is not told apart from one that does not exist).
async fn model<S: Surface>(
    State(state): State<Arc<EdgeState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response {
    let caller = match authenticate(&state, &headers) {
        Ok(caller) => caller,
        Err(err) => return error_response::<S>(&err),
    };
    let config = state.config.current();
    let known = route::public_models(&config).into_iter().any(|m| m == id);
    if known && caller.may_use(&id) {
        axum::Json(model_object(id)).into_response()
    } else {
        error_response::<S>(&ApiError::ModelNotFound(id))
    }
}

async fn readyz(State(state): State<Arc<EdgeState>>) -> Response {
    // `EdgeState::readiness`: a replica that drains, or that starts and
    // does not hold every node yet (within the startup grace), sends load
    // balancers elsewhere; the reason says which.
    let (readiness, ready_nodes, nodes) = state.readiness();
    let body = json!({
        "status": readiness.status(),
        "ready_nodes": ready_nodes,
        "configured_nodes": nodes,
        "reason": readiness.reason(ready_nodes, nodes),
    });
    let status = if readiness.is_ready() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(body)).into_response()
}

async fn metrics(State(state): State<Arc<EdgeState>>) -> Response {
    crate::overlay::publish_health(
        &state.metrics,
        &state.registry,
        &state.overlay,
        state.config.credential_health(),
        &state.config.current().providers,
    );
    crate::residency::publish(
        &state.metrics,
        &state.registry,
        &state.routing.residency,
        &state.config.current().providers,
    );
    state.routing.admission.publish_ejections(std::time::Instant::now());
    state.metrics.http_body_bytes_in_flight.set(state.routing.body_budget.held() as i64);
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], state.metrics.encode())
        .into_response()
}
