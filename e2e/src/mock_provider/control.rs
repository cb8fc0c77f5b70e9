//! The mock's own control routes (`/mock/*` in the [`super`] docs' table):
//! the metadata endpoints' health, the default knobs, the API key, the
//! release of held requests, the request log, the script cursors and the stats.

use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::Value;

use super::faults::parse_faults;
use super::state::{AppState, MockStats, RecordedRequest};

/// `POST /mock/health {"healthy": bool}`: takes the metadata endpoints down
/// or brings them back.
pub(super) async fn set_health(State(state): State<AppState>, body: Bytes) -> Response {
    match serde_json::from_slice::<Value>(&body).ok().and_then(|v| v["healthy"].as_bool()) {
        Some(healthy) => {
            state.counters.metadata_down.store(!healthy, Ordering::Relaxed);
            StatusCode::NO_CONTENT.into_response()
        }
        None => (StatusCode::BAD_REQUEST, "body must be {\"healthy\": true|false}").into_response(),
    }
}

/// `POST /mock/faults` with a `k=v,k=v` body: replaces the process default
/// knobs (an empty body clears them), so a test can fault a provider whose
/// target name it cannot change, e.g. in a sequence of faults or a soak.
pub(super) async fn set_faults(State(state): State<AppState>, body: Bytes) -> Response {
    match std::str::from_utf8(&body).map_err(|e| e.to_string()).and_then(|s| parse_faults(s).map_err(|e| e.to_string()))
    {
        Ok(faults) => {
            *state.defaults.write().expect("fault defaults lock") = faults;
            StatusCode::NO_CONTENT.into_response()
        }
        Err(message) => (StatusCode::BAD_REQUEST, message).into_response(),
    }
}

/// `POST /mock/api-key` with the new key as the body (empty: no key needed).
pub(super) async fn set_api_key(State(state): State<AppState>, body: Bytes) -> Response {
    let key = String::from_utf8_lossy(&body).trim().to_string();
    *state.api_key.write().unwrap() = Some(key).filter(|k| !k.is_empty());
    StatusCode::NO_CONTENT.into_response()
}

/// `POST /mock/release/NAME`: lets every request held with `hold=NAME` go
/// on (and any later one with that name pass at once).
pub(super) async fn release(
    State(state): State<AppState>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> StatusCode {
    state.counters.released.lock().unwrap().insert(name);
    state.counters.release.notify_waiters();
    StatusCode::NO_CONTENT
}

/// `GET /mock/requests`: the request log, oldest first.
pub(super) async fn logged_requests(State(state): State<AppState>) -> Json<Vec<RecordedRequest>> {
    Json(state.counters.logged_requests())
}

/// `POST /mock/requests/reset`: empties the request log.
pub(super) async fn reset_requests(State(state): State<AppState>) -> StatusCode {
    state.counters.request_log.lock().unwrap().clear();
    StatusCode::NO_CONTENT
}

/// `POST /mock/scripts/reset`: every script starts again at its first turn.
pub(super) async fn reset_scripts(State(state): State<AppState>) -> StatusCode {
    state.counters.script_cursors.lock().unwrap().clear();
    StatusCode::NO_CONTENT
}

pub(super) async fn stats(State(state): State<AppState>) -> Json<MockStats> {
    Json(state.counters.snapshot())
}
