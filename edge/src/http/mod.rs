//! HTTP ingress (axum): the client APIs, health, metrics and admin snapshots.
//! Handlers are thin: parse with `ingress::*`, pick a provider with `route`,
//! run it with `dispatch`, render with `ingress::*`.

mod surface;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
use crate::gate::{self, CommitPoint, LiveRun};
use crate::ingress::error::ApiError;
use crate::metrics::{Api, ApiLabels, EdgeMetrics, RequestLabels};
use crate::node::commands::CommandError;
use crate::node::registry::health_label;
use crate::route;
use surface::{ChatCompletions, Messages, Responses, Surface};

const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

pub fn router(state: Arc<EdgeState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(api::<ChatCompletions>))
        .route("/v1/responses", post(api::<Responses>))
        .route("/v1/messages", post(api::<Messages>))
        .route("/v1/models", get(models))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/admin/v1/nodes", get(admin_nodes))
        .route("/admin/v1/nodes/{name}/commands/{command}", post(admin_node_command))
        .route("/admin/v1/providers", get(admin_providers))
        .with_state(state)
}

fn error_response<S: Surface>(err: &ApiError) -> Response {
    let mut response = (err.status(), axum::Json(S::error_body(err))).into_response();
    if let Some(secs) = err.retry_after_secs() {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// Records one client request's outcome, time to first byte and duration
/// exactly once, when the response (streaming or not) is done or abandoned.
struct RequestRecord {
    metrics: Arc<EdgeMetrics>,
    api: Api,
    started: Instant,
    first_byte: bool,
    outcome: &'static str,
}

impl RequestRecord {
    fn new(metrics: Arc<EdgeMetrics>, api: Api) -> Self {
        // Until the response finishes, a drop means the client went away.
        Self { metrics, api, started: Instant::now(), first_byte: false, outcome: "client_disconnected" }
    }

    fn first_byte(&mut self) {
        if !self.first_byte {
            self.first_byte = true;
            let labels = ApiLabels { api: self.api };
            self.metrics.time_to_first_byte.get_or_create(&labels).observe(self.started.elapsed().as_secs_f64());
        }
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

/// One handler for every client API: parse, run through the gate, render.
async fn api<S: Surface>(State(state): State<Arc<EdgeState>>, body: Body) -> Response {
    let mut record = RequestRecord::new(state.metrics.clone(), S::API);
    match serve::<S>(&state, body).await {
        Ok(Reply::Complete(body)) => {
            record.outcome = "ok";
            record.first_byte();
            axum::Json(body).into_response()
        }
        Ok(Reply::Stream(stream)) => sse_response::<S>(*stream, record),
        Err(err) => {
            record.outcome = err.code();
            record.first_byte();
            error_response::<S>(&err)
        }
    }
}

enum Reply<S: Surface> {
    Complete(serde_json::Value),
    Stream(Box<SseStream<S>>),
}

async fn serve<S: Surface>(state: &Arc<EdgeState>, body: Body) -> Result<Reply<S>, ApiError> {
    let bytes = read_body(body, state.config.limits.max_body_bytes).await?;
    let parsed = S::parse(&bytes)?;
    let point = if parsed.stream { CommitPoint::FirstContent } else { CommitPoint::Terminal };
    let committed = gate::execute(state, &parsed.model, parsed.run, point).await?;
    if !parsed.stream {
        let mut collector = S::collector(parsed.context, committed.target_model);
        for event in &committed.buffered {
            S::collect(&mut collector, event);
        }
        return S::finish(collector).map(Reply::Complete);
    }
    Ok(Reply::Stream(Box::new(SseStream {
        streamer: S::streamer(parsed.context, committed.target_model),
        events: committed.buffered.into(),
        rest: committed.rest,
        frames: VecDeque::new(),
        done: false,
    })))
}

/// A committed streaming response: buffered events first, then the live run.
struct SseStream<S: Surface> {
    streamer: S::Streamer,
    events: VecDeque<Event>,
    rest: Option<LiveRun>,
    frames: VecDeque<Bytes>,
    done: bool,
}

impl<S: Surface> SseStream<S> {
    async fn next_event(&mut self) -> Option<Event> {
        match self.events.pop_front() {
            Some(event) => Some(event),
            None => self.rest.as_mut()?.next().await,
        }
    }
}

fn sse_response<S: Surface>(stream: SseStream<S>, record: RequestRecord) -> Response {
    let body = stream::unfold((stream, record), |(mut s, mut record)| async move {
        loop {
            if let Some(frame) = s.frames.pop_front() {
                record.first_byte();
                return Some((Ok::<_, std::convert::Infallible>(frame), (s, record)));
            }
            if s.done {
                return None;
            }
            let event = s.next_event().await?;
            s.frames.extend(S::stream(&mut s.streamer, &event));
            match &event {
                Event::Completed(_) => {
                    record.outcome = "ok";
                    s.done = true;
                }
                Event::Failed(f) => {
                    record.outcome = ApiError::Execution(f.failure.clone().unwrap_or_default()).code();
                    s.done = true;
                }
                Event::Cancelled(_) => s.done = true,
                _ => {}
            }
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
    let load = state.admission.snapshot();
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
                "capacity": p.capacity,
                "in_flight": load.providers.get(&p.id).map_or(0, |l| l.in_flight),
            })
        })
        .collect();
    axum::Json(json!({
        "providers": providers,
        "queued": load.queued,
        "in_flight_runs": state.runs.in_flight(),
        "leases": { "acquired": load.acquired, "released": load.released, "double_releases": load.double_releases },
    }))
    .into_response()
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
