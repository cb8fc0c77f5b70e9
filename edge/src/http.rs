//! HTTP ingress (axum): the client APIs, health, metrics and admin snapshots.
//! Handlers are thin: parse with `ingress::*`, pick a provider with `route`,
//! run it with `dispatch`, render with `ingress::*`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::stream;
use iop_proto::pb::{self, run_event::Event};
use serde_json::json;

use crate::EdgeState;
use crate::dispatch::{self, RunStream};
use crate::ingress::error::ApiError;
use crate::ingress::openai_chat::{self, ChunkRenderer, CompletionAggregator, ResponseMeta};
use crate::metrics::{Api, ApiLabels, EdgeMetrics, RequestLabels};
use crate::node::commands::CommandError;
use crate::node::registry::health_label;
use crate::route;

const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

pub fn router(state: Arc<EdgeState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/admin/v1/nodes", get(admin_nodes))
        .route("/admin/v1/nodes/{name}/commands/{command}", post(admin_node_command))
        .route("/admin/v1/providers", get(admin_providers))
        .with_state(state)
}

fn openai_error(err: &ApiError) -> Response {
    let mut response = (err.status(), axum::Json(err.openai_body())).into_response();
    if let Some(secs) = err.retry_after_secs() {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Records one client request's outcome and duration exactly once, when the
/// response (streaming or not) is done or abandoned.
struct RequestRecord {
    metrics: Arc<EdgeMetrics>,
    api: Api,
    started: Instant,
    outcome: &'static str,
}

impl RequestRecord {
    fn new(metrics: Arc<EdgeMetrics>, api: Api) -> Self {
        // Until the response finishes, a drop means the client went away.
        Self { metrics, api, started: Instant::now(), outcome: "client_disconnected" }
    }
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        self.metrics.http_requests.get_or_create(&RequestLabels { api: self.api, outcome: self.outcome }).inc();
        self.metrics
            .http_request_duration
            .get_or_create(&ApiLabels { api: self.api })
            .observe(self.started.elapsed().as_secs_f64());
    }
}

async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|_| ApiError::PayloadTooLarge { limit })
}

/// Picks the first dispatchable provider for `model` and starts the run there.
async fn start(state: &Arc<EdgeState>, model: &str, mut request: pb::RunRequest) -> Result<RunStream, ApiError> {
    let candidates =
        route::candidates(&state.config, model).ok_or_else(|| ApiError::ModelNotFound(model.to_string()))?;
    let (provider, session) = candidates
        .iter()
        .find_map(|p| state.registry.ready_for(&p.node, &p.id).map(|s| (*p, s)))
        .ok_or_else(|| ApiError::NoProviderAvailable(model.to_string()))?;
    request.run_id = uuid::Uuid::new_v4().simple().to_string();
    request.provider_id = provider.id.clone();
    request.adapter = pb::AdapterKind::from(provider.adapter).into();
    request.target_model = provider.target.model.clone();
    request.response_stall_timeout_ms = provider.response_stall_timeout_ms;
    dispatch::start_run(&state.runs, &state.metrics, &provider.node, session, request)
        .await
        .map_err(ApiError::Execution)
}

async fn chat_completions(State(state): State<Arc<EdgeState>>, body: Body) -> Response {
    let mut record = RequestRecord::new(state.metrics.clone(), Api::chat_completions);
    let result = chat_completions_inner(&state, body).await;
    match result {
        Ok(ChatReply::Complete(body)) => {
            record.outcome = "ok";
            axum::Json(body).into_response()
        }
        Ok(ChatReply::Stream(stream)) => {
            let (first, run, renderer) = *stream;
            sse_response(first, run, renderer, record)
        }
        Err(err) => {
            record.outcome = err.code();
            openai_error(&err)
        }
    }
}

enum ChatReply {
    Complete(serde_json::Value),
    Stream(Box<(Event, RunStream, ChunkRenderer)>),
}

async fn chat_completions_inner(state: &Arc<EdgeState>, body: Body) -> Result<ChatReply, ApiError> {
    let bytes = read_body(body, state.config.limits.max_body_bytes).await?;
    let request = openai_chat::parse_request(&bytes)?;
    let run_request = pb::RunRequest {
        messages: request.messages,
        tools: request.tools,
        options: Some(request.options),
        stream: request.stream,
        ..Default::default()
    };
    let mut run = start(state, &request.model, run_request).await?;
    let meta = ResponseMeta::new(request.model, unix_now());
    if !request.stream {
        let mut aggregator = CompletionAggregator::new(meta);
        while let Some(event) = run.next().await {
            aggregator.push(&event);
        }
        return aggregator.finish().map(ChatReply::Complete);
    }
    // Nothing is committed to the client until the first event: a failure
    // before it is still an ordinary HTTP error.
    match run.next().await {
        Some(Event::Failed(failed)) => Err(ApiError::Execution(failed.failure.unwrap_or_default())),
        Some(first) => Ok(ChatReply::Stream(Box::new((first, run, ChunkRenderer::new(meta, request.include_usage))))),
        None => Err(ApiError::Internal),
    }
}

/// State of one SSE response body.
struct SseState {
    run: RunStream,
    renderer: ChunkRenderer,
    pending: VecDeque<Bytes>,
    first: Option<Event>,
    done: bool,
    record: RequestRecord,
}

impl SseState {
    fn push_event(&mut self, event: &Event) {
        for payload in self.renderer.render(event) {
            self.pending.push_back(Bytes::from(format!("data: {payload}\n\n")));
        }
        match event {
            Event::Completed(_) => {
                self.pending.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                self.record.outcome = "ok";
                self.done = true;
            }
            Event::Failed(f) => {
                self.record.outcome = ApiError::Execution(f.failure.clone().unwrap_or_default()).code();
                self.done = true;
            }
            Event::Cancelled(_) => self.done = true,
            _ => {}
        }
    }
}

fn sse_response(first: Event, run: RunStream, renderer: ChunkRenderer, record: RequestRecord) -> Response {
    let state = SseState { run, renderer, pending: VecDeque::new(), first: Some(first), done: false, record };
    let body = stream::unfold(state, |mut s| async move {
        loop {
            if let Some(chunk) = s.pending.pop_front() {
                return Some((Ok::<_, std::convert::Infallible>(chunk), s));
            }
            if s.done {
                return None;
            }
            let event = match s.first.take() {
                Some(first) => first,
                None => s.run.next().await?,
            };
            s.push_event(&event);
        }
    });
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

async fn models(State(state): State<Arc<EdgeState>>) -> Response {
    let data: Vec<_> = route::public_models(&state.config)
        .into_iter()
        .map(|id| json!({ "id": id, "object": "model", "created": 0, "owned_by": "iop" }))
        .collect();
    axum::Json(json!({ "object": "list", "data": data })).into_response()
}

async fn readyz(State(state): State<Arc<EdgeState>>) -> Response {
    // Ready means the listeners are serving; nodes come and go and are
    // reported, not required (an Edge with no node must still accept them).
    axum::Json(json!({ "status": "ready", "ready_nodes": state.registry.ready_count() })).into_response()
}

async fn metrics(State(state): State<Arc<EdgeState>>) -> Response {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], state.metrics.encode())
        .into_response()
}

async fn admin_nodes(State(state): State<Arc<EdgeState>>) -> Response {
    let names: Vec<String> = state.config.nodes.iter().map(|n| n.name.clone()).collect();
    axum::Json(json!({ "nodes": state.registry.snapshot(&names) })).into_response()
}

async fn admin_providers(State(state): State<Arc<EdgeState>>) -> Response {
    let nodes = state.registry.snapshot(&state.config.nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>());
    let providers: Vec<_> = state
        .config
        .providers
        .iter()
        .map(|p| {
            let node = nodes.iter().find(|n| n.name == p.node);
            let node_ready = node.is_some_and(|n| n.phase == Some(crate::node::registry::SessionPhase::Ready));
            let health = node.and_then(|n| n.providers.get(&p.id).copied()).unwrap_or(health_label(pb::ProviderHealth::Unknown));
            json!({
                "id": p.id,
                "node": p.node,
                "adapter": p.adapter,
                "target_model": p.target.model,
                "models": p.models.iter().map(|m| json!({ "name": m.name, "priority": m.priority })).collect::<Vec<_>>(),
                "node_ready": node_ready,
                "health": health,
                "dispatchable": state.registry.ready_for(&p.node, &p.id).is_some(),
            })
        })
        .collect();
    axum::Json(json!({ "providers": providers, "in_flight_runs": state.runs.in_flight() })).into_response()
}

/// Runs CAPABILITIES or TRANSPORT_STATUS on a node and returns its answer.
async fn admin_node_command(
    State(state): State<Arc<EdgeState>>,
    Path((name, command)): Path<(String, String)>,
) -> Response {
    let kind = match command.as_str() {
        "capabilities" => pb::CommandKind::Capabilities,
        "transport_status" => pb::CommandKind::TransportStatus,
        _ => {
            return (
                StatusCode::NOT_FOUND,
                axum::Json(json!({ "error": "command must be capabilities or transport_status" })),
            )
                .into_response();
        }
    };
    let Some(control) = state.registry.control_of(&name) else {
        return (StatusCode::NOT_FOUND, axum::Json(json!({ "error": CommandError::NotConnected.to_string() })))
            .into_response();
    };
    match state.commands.send(&control, kind, COMMAND_TIMEOUT).await {
        Ok(result) => axum::Json(command_json(&result)).into_response(),
        Err(e) => (StatusCode::GATEWAY_TIMEOUT, axum::Json(json!({ "error": e.to_string() }))).into_response(),
    }
}

fn command_json(result: &pb::NodeCommandResult) -> serde_json::Value {
    use pb::node_command_result::Result as R;
    match &result.result {
        Some(R::Capabilities(c)) => json!({
            "providers": c.providers.iter().map(|p| json!({
                "provider_id": p.provider_id,
                "health": health_label(p.health()),
            })).collect::<Vec<_>>()
        }),
        Some(R::TransportStatus(t)) => json!({
            "generation": t.generation,
            "active_runs": t.active_runs,
            "connected_for_ms": t.connected_for_ms,
        }),
        Some(R::Error(e)) => json!({ "error": e.message, "code": e.code().as_str_name() }),
        None => json!({ "error": "empty result" }),
    }
}
