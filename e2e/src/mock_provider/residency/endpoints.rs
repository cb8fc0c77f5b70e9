//! The residency endpoints in each server's shape, and the wait for a load
//! that a chat, responses or embeddings request makes: the part of
//! residency that reads the server's state ([`AppState`]).

use std::collections::BTreeSet;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Json, extract};
use http::StatusCode;
use serde_json::{Value, json};

use super::{MODEL_CONTEXT_LENGTH, MODEL_NAME, MODEL_SIZE_BYTES, ResidencyApi, base_model};
use crate::mock_provider::embeddings::fnv1a;
use crate::mock_provider::faults::sleep_ms;
use crate::mock_provider::state::AppState;

/// Ollama's default `keep_alive`: `/api/ps`'s `expires_at` is this far ahead.
const KEEP_ALIVE_S: i64 = 300;

/// Waits until the model is resident: at once when it is; otherwise the
/// first such request starts a load of `load_delay_ms` and every request
/// waits for that load to end. The load runs in its own task, so a client
/// that leaves does not cancel it (a real server keeps loading); the task
/// ends after the delay (or with the runtime).
pub(crate) async fn until_resident(state: &AppState) {
    let residency = &state.counters.residency;
    loop {
        let changed = residency.changed.notified();
        {
            let mut s = residency.state.lock().unwrap();
            if s.loaded {
                return;
            }
            if !s.loading {
                s.loading = true;
                let delay = s.load_delay_ms;
                let counters = state.counters.clone();
                tracing::debug!(delay_ms = delay, "loading the model");
                tokio::spawn(async move {
                    sleep_ms(Some(delay)).await;
                    counters.residency.finish_load();
                });
            }
        }
        tokio::select! {
            _ = changed => {}
            _ = state.until_stopping() => return,
        }
    }
}

/// The 404 of a server without that endpoint.
fn absent() -> Response {
    StatusCode::NOT_FOUND.into_response()
}

/// How Ollama names a model in its listings: with its tag, `:latest` when
/// none was given.
fn ollama_name(name: &str) -> String {
    if name.contains(':') { name.to_owned() } else { format!("{name}:latest") }
}

/// RFC 3339 in whole seconds, UTC.
fn rfc3339(unix_s: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(unix_s).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

fn now_unix_s() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// `GET /api/ps` (Ollama): while resident, every model a request named,
/// as Ollama lists a loaded model; nothing while not.
pub(crate) async fn ollama_ps(State(state): State<AppState>) -> Response {
    let residency = &state.counters.residency;
    if !residency.api().answers(ResidencyApi::Ollama) {
        return absent();
    }
    let models: BTreeSet<String> =
        if residency.loaded() { residency.models().iter().map(|m| ollama_name(m)).collect() } else { BTreeSet::new() };
    let expires_at = rfc3339(now_unix_s() + KEEP_ALIVE_S);
    let models: Vec<Value> = models
        .iter()
        .map(|name| {
            let hash = fnv1a(name.as_bytes());
            json!({
                "name": name,
                "model": name,
                "size": MODEL_SIZE_BYTES,
                "digest": format!("{hash:016x}{hash:016x}{hash:016x}{hash:016x}"),
                "details": {
                    "parent_model": "",
                    "format": "gguf",
                    "family": "mock",
                    "families": ["mock"],
                    "parameter_size": "3.2B",
                    "quantization_level": "Q4_K_M",
                },
                "expires_at": expires_at,
                "size_vram": MODEL_SIZE_BYTES,
                "context_length": MODEL_CONTEXT_LENGTH,
            })
        })
        .collect();
    Json(json!({ "models": models })).into_response()
}

/// `GET /props` (llama.cpp's server, one model): its settings while
/// resident; `503 Loading model` while not (a llama-server answers so
/// while it loads).
pub(crate) async fn llama_props(State(state): State<AppState>) -> Response {
    let residency = &state.counters.residency;
    if !residency.api().answers(ResidencyApi::LlamaCpp) {
        return absent();
    }
    if !residency.loaded() {
        let error = json!({ "error": { "code": 503, "message": "Loading model", "type": "unavailable_error" } });
        return (StatusCode::SERVICE_UNAVAILABLE, Json(error)).into_response();
    }
    // One model per llama.cpp server: it reads images unless one it was
    // asked for does not (the knobs of a name are not in the models learned).
    let vision = residency.models().iter().all(|m| reads_images(&state, m));
    Json(json!({
        "default_generation_settings": {
            "id": 0,
            "id_task": -1,
            "n_ctx": MODEL_CONTEXT_LENGTH,
            "speculative": false,
            "is_processing": false,
            "params": { "n_predict": -1, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05 },
        },
        "total_slots": 1,
        "model_path": format!("/models/{MODEL_NAME}-Q4_K_M.gguf"),
        "chat_template": "{% for message in messages %}{{ message.content }}\n{% endfor %}",
        "modalities": { "vision": vision, "audio": false },
        "build_info": "b0000-mock",
    }))
    .into_response()
}

/// Whether the mock's model `model` (with its knobs) reads images, under
/// the fault defaults now ([`crate::mock_provider::faults::reads_images`]).
pub(crate) fn reads_images(state: &AppState, model: &str) -> bool {
    let defaults = state.defaults.read().expect("fault defaults lock");
    crate::mock_provider::faults::reads_images(&defaults, model)
}

/// One LM Studio model object (`/api/v0/models`): `name` with its knobs.
fn lm_studio_model(state: &AppState, name: &str, loaded: bool) -> Value {
    let mut model = json!({
        "id": base_model(name),
        "object": "model",
        "type": if reads_images(state, name) { "vlm" } else { "llm" },
        "publisher": "iop-mock",
        "arch": "mock",
        "compatibility_type": "gguf",
        "quantization": "Q4_K_M",
        "state": if loaded { "loaded" } else { "not-loaded" },
        "max_context_length": MODEL_CONTEXT_LENGTH,
    });
    if loaded {
        model["loaded_context_length"] = json!(MODEL_CONTEXT_LENGTH);
    }
    model
}

/// `GET /api/v0/models` (LM Studio): every model a request named, with its `state`.
pub(crate) async fn lm_studio_models(State(state): State<AppState>) -> Response {
    let residency = &state.counters.residency;
    if !residency.api().answers(ResidencyApi::LmStudio) {
        return absent();
    }
    let loaded = residency.loaded();
    let data: Vec<Value> = residency.models().iter().map(|m| lm_studio_model(&state, m, loaded)).collect();
    Json(json!({ "object": "list", "data": data })).into_response()
}

/// `GET /api/v0/models/{model}` (LM Studio): any name, which is learned.
pub(crate) async fn lm_studio_model_one(
    State(state): State<AppState>,
    extract::Path(model): extract::Path<String>,
) -> Response {
    let residency = &state.counters.residency;
    if !residency.api().answers(ResidencyApi::LmStudio) {
        return absent();
    }
    residency.learn(&model);
    Json(lm_studio_model(&state, &model, residency.loaded())).into_response()
}

/// `POST /mock/residency {"loaded": bool, "load_delay_ms": N?}`.
pub(crate) async fn set_residency(State(state): State<AppState>, body: Bytes) -> Response {
    let parsed = serde_json::from_slice::<Value>(&body).ok().and_then(|v| {
        let loaded = v.get("loaded")?.as_bool()?;
        let delay = match v.get("load_delay_ms") {
            None | Some(Value::Null) => None,
            Some(ms) => Some(ms.as_u64()?),
        };
        Some((loaded, delay))
    });
    match parsed {
        Some((loaded, delay)) => {
            state.counters.residency.set(loaded, delay);
            StatusCode::NO_CONTENT.into_response()
        }
        None => {
            (StatusCode::BAD_REQUEST, "body must be {\"loaded\": true|false, \"load_delay_ms\"?: N}").into_response()
        }
    }
}
