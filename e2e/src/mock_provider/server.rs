//! The server: its configuration ([`MockConfig`]), [`start`] and [`serve`],
//! the router with the request log, the API key and the metadata gates in
//! front of every route, and the provider routes that hand a request to its
//! API's handler.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::answer::{chat, embed};
use super::api::{Api, ChatMessage};
use super::control::{
    logged_requests, release, reset_requests, reset_scripts, set_api_key, set_faults, set_health, stats,
};
use super::embeddings::tokenize;
use super::faults::Faults;
use super::residency::{self, ResidencyConfig};
use super::scripts::Scripts;
use super::state::{AppState, Counters, LoggedRequest, MockStats, RecordedRequest};
use super::{ollama, openai};

/// Like real model servers, accept the largest prompt an Edge may send.
const BODY_LIMIT: usize = iop_proto::wire::MAX_RUN_REQUEST_MESSAGE_BYTES;

/// Process-wide configuration.
#[derive(Debug, Clone, Default)]
pub struct MockConfig {
    /// Knobs applied to every chat request (requests can override them).
    pub defaults: Faults,
    /// When set, every API call (chat and metadata, not `/mock/*` or
    /// `/healthz`) needs `Authorization: Bearer <key>`, else `401`, like a
    /// keyed LM Studio or vLLM. Replaced at runtime by `POST /mock/api-key`.
    pub api_key: Option<String>,
    /// Scripted turns selected by `iop-mock-script:<name>` markers
    /// (`--script-file`, [`Scripts::load`]); `None`: every marker is a 400.
    pub scripts: Option<Scripts>,
    /// Whether the model is resident, how long a load takes, which
    /// residency endpoints answer (see *Residency*).
    pub residency: ResidencyConfig,
}

/// A running mock server (see [`start`]). Dropping it starts a graceful
/// shutdown in the background; [`MockHandle::shutdown`] also waits for it.
#[derive(Debug)]
pub struct MockHandle {
    pub addr: SocketAddr,
    counters: Arc<Counters>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<io::Result<()>>,
}

impl MockHandle {
    /// `http://ADDR`, without a trailing slash.
    #[must_use]
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The same counters as `GET /mock/stats`, read in-process.
    #[must_use]
    pub fn stats(&self) -> MockStats {
        self.counters.snapshot()
    }

    /// The same request log as `GET /mock/requests`, read in-process.
    #[must_use]
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.counters.logged_requests()
    }

    /// Stops accepting, ends stalled/held responses and waits for the server task.
    pub async fn shutdown(self) {
        let MockHandle { stop, task, .. } = self;
        drop(stop);
        if let Err(e) = task.await {
            tracing::warn!("mock provider task failed: {e}");
        }
    }
}

/// Spawns the server on `listener` and returns at once.
///
/// # Panics
/// If the listener has no local address (it always has once bound).
pub async fn start(listener: TcpListener, config: MockConfig) -> MockHandle {
    let addr = listener.local_addr().expect("mock provider listener has a local address");
    let counters = Arc::new(Counters::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let signal = async move {
        // Fires on an explicit stop and when the handle is dropped.
        let _ = stopped.await;
    };
    let task = tokio::spawn(serve_with(listener, config, counters.clone(), signal));
    MockHandle { addr, counters, stop, task }
}

/// Serves until `shutdown` completes, then shuts down gracefully (stalled and
/// held responses are ended so that this returns promptly).
///
/// # Errors
/// Only what `axum::serve` reports (in practice none).
pub async fn serve(
    listener: TcpListener,
    config: MockConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_with(listener, config, Arc::default(), shutdown).await
}

async fn serve_with(
    listener: TcpListener,
    config: MockConfig,
    counters: Arc<Counters>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let (stopping_tx, stopping) = watch::channel(false);
    counters.residency.configure(&config.residency);
    let state = AppState {
        defaults: Arc::new(RwLock::new(config.defaults)),
        api_key: Arc::new(RwLock::new(config.api_key)),
        scripts: config.scripts.map(Arc::new),
        counters,
        stopping,
    };
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("failed to set TCP_NODELAY: {e}");
        }
    });
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move {
            shutdown.await;
            let _ = stopping_tx.send(true);
        })
        .await
}

fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/api/tags", get(|| async { Json(ollama::tags()) }))
        // The read-only metadata calls the Edge's OLLAMA_API command may make.
        .route("/api/ps", get(residency::endpoints::ollama_ps))
        .route("/props", get(residency::endpoints::llama_props))
        .route("/api/v0/models", get(residency::endpoints::lm_studio_models))
        .route("/api/v0/models/{*model}", get(residency::endpoints::lm_studio_model_one))
        .route("/mock/residency", post(residency::endpoints::set_residency))
        .route("/api/version", get(|| async { Json(serde_json::json!({ "version": "0.0.0-mock" })) }))
        .route("/api/show", post(ollama_show))
        .route("/mock/health", post(set_health))
        .route("/mock/faults", post(set_faults))
        .route("/api/chat", post(ollama_chat))
        .route("/v1/models", get(list_models))
        .route("/v1/chat/completions", post(openai_chat))
        .route("/v1/responses", post(openai_responses))
        .route("/mock/stats", get(stats))
        .route("/mock/release/{name}", post(release))
        .route("/mock/api-key", post(set_api_key))
        .route("/mock/scripts/reset", post(reset_scripts))
        .route("/api/embed", post(ollama_embed))
        .route("/v1/embeddings", post(openai_embeddings))
        .route("/apply-template", post(apply_template))
        .route("/tokenize", post(tokenize_text))
        .route("/mock/requests", get(logged_requests))
        .route("/mock/requests/reset", post(reset_requests))
        .layer(axum::middleware::from_fn_with_state(state.clone(), metadata_gate))
        .layer(axum::middleware::from_fn_with_state(state.clone(), key_gate))
        .layer(axum::middleware::from_fn_with_state(state.clone(), log_request))
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

/// The mock's own routes, open without a key and left out of the request log.
fn is_control_path(path: &str) -> bool {
    path == "/healthz" || path.starts_with("/mock/")
}

/// Logs every request to a provider route with its body (see *Request log*).
/// It runs before the key gate: the log shows what reached the provider.
async fn log_request(
    State(state): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if is_control_path(request.uri().path()) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, BODY_LIMIT).await {
        Ok(body) => body,
        Err(e) => {
            // The statuses axum's `Bytes` extractor gives.
            let too_large = std::error::Error::source(&e).is_some_and(|e| e.is::<http_body_util::LengthLimitError>());
            let status = if too_large { StatusCode::PAYLOAD_TOO_LARGE } else { StatusCode::BAD_REQUEST };
            return (status, format!("failed to buffer the request body: {e}")).into_response();
        }
    };
    // A copy: a slice would keep the whole read buffer alive in the log.
    let logged = Bytes::copy_from_slice(&body);
    state.counters.log_request(LoggedRequest {
        method: parts.method.clone(),
        path: parts.uri.path().to_owned(),
        headers: parts.headers.clone(),
        body: logged,
    });
    next.run(axum::extract::Request::from_parts(parts, Body::from(body))).await
}

/// With an API key set, refuses API calls without `Authorization: Bearer
/// <key>`. A refused chat request still counts in `requests_total`: tests
/// assert that nothing reached the provider, keyed or not.
async fn key_gate(
    State(state): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = request.uri().path();
    let expected = state.api_key.read().unwrap().clone();
    if let Some(key) = expected.filter(|_| !is_control_path(path)) {
        let presented = request.headers().get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        if presented != Some(format!("Bearer {key}").as_str()) {
            if matches!(path, "/api/chat" | "/v1/chat/completions" | "/v1/responses") {
                state.counters.requests_total.fetch_add(1, Ordering::Relaxed);
            }
            let error =
                serde_json::json!({ "error": { "message": "invalid api key", "type": "invalid_request_error" } });
            return (StatusCode::UNAUTHORIZED, Json(error)).into_response();
        }
    }
    next.run(request).await
}

/// 503 from every metadata endpoint while `/mock/health` says unhealthy.
async fn metadata_gate(
    State(state): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = request.uri().path();
    let metadata = matches!(path, "/api/tags" | "/api/show" | "/api/ps" | "/api/version" | "/v1/models" | "/props")
        || path.starts_with("/api/v0/models");
    if metadata && state.counters.metadata_down.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(serde_json::json!({ "error": "mock metadata is down" })))
            .into_response();
    }
    next.run(request).await
}

/// `GET /v1/models`: only the mock's own model, whatever chat requests ask
/// for (like llama.cpp's server, which ignores model names).
async fn list_models() -> Json<Value> {
    Json(openai::models())
}

/// `POST /api/show`: echoes which model was asked about.
async fn ollama_show(State(state): State<AppState>, body: Bytes) -> Response {
    match serde_json::from_slice::<Value>(&body).ok().and_then(|v| v["model"].as_str().map(str::to_string)) {
        Some(model) => {
            state.counters.residency.learn(&model);
            let capabilities: &[&str] = match residency::endpoints::reads_images(&state, &model) {
                true => &["completion", "tools", "vision"],
                false => &["completion", "tools"],
            };
            Json(json!({ "model": model, "details": { "family": "mock" }, "capabilities": capabilities }))
                .into_response()
        }
        None => (StatusCode::BAD_REQUEST, Json(serde_json::json!({ "error": "model is required" }))).into_response(),
    }
}

async fn ollama_chat(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    chat(Api::Ollama, state, headers, body).await
}

async fn openai_chat(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    chat(Api::OpenAi, state, headers, body).await
}

async fn openai_responses(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    chat(Api::Responses, state, headers, body).await
}

async fn ollama_embed(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    embed(Api::Ollama, state, headers, body).await
}

async fn openai_embeddings(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    embed(Api::OpenAi, state, headers, body).await
}

/// `POST /apply-template` (llama.cpp's server): an OpenAI chat body ->
/// `{"prompt": "..."}`, the messages' text joined by newlines.
async fn apply_template(body: Bytes) -> Response {
    #[derive(Deserialize)]
    struct Chat {
        messages: Vec<ChatMessage>,
    }
    match serde_json::from_slice::<Chat>(&body) {
        Ok(chat) => {
            let prompt = chat.messages.iter().map(ChatMessage::text).collect::<Vec<_>>().join("\n");
            Json(json!({ "prompt": prompt })).into_response()
        }
        Err(_) => Api::OpenAi.error(StatusCode::BAD_REQUEST, r#"the body must be a chat request with "messages""#),
    }
}

/// `POST /tokenize` (llama.cpp's server): `{"content": "..."}` -> `{"tokens": [..]}`.
async fn tokenize_text(body: Bytes) -> Response {
    let content = serde_json::from_slice::<Value>(&body).ok().and_then(|v| v.get("content")?.as_str().map(tokenize));
    match content {
        Some(tokens) => Json(json!({ "tokens": tokens })).into_response(),
        None => Api::OpenAi.error(StatusCode::BAD_REQUEST, r#"the body must be {"content": "<text>"}"#),
    }
}
