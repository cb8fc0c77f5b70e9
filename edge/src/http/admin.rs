//! Admin endpoints: JSON snapshots of nodes and providers, and node
//! commands (CAPABILITIES, TRANSPORT_STATUS, the read-only OLLAMA_API calls).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use iop_proto::config::Adapter;
use iop_proto::pb;
use serde_json::json;

use crate::EdgeState;
use crate::node::commands::CommandError;
use crate::overlay::{ProviderView, health_label};

const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

fn admin_error(status: StatusCode, code: &str, message: impl std::fmt::Display) -> Response {
    (status, axum::Json(json!({ "error": { "code": code, "message": message.to_string() } }))).into_response()
}

/// Runs one allowlisted, read-only Ollama API call on a provider's node:
/// `tags`, `ps`, `show` (for the provider's own target model) or `version`.
/// The loaded config's revision and the last rejected reload, if any.
pub async fn config(State(state): State<Arc<EdgeState>>) -> Response {
    axum::Json(json!({ "config": state.config.status() })).into_response()
}

pub async fn ollama_api(State(state): State<Arc<EdgeState>>, Path((id, call)): Path<(String, String)>) -> Response {
    let call = match call.as_str() {
        "tags" => pb::OllamaApiCall::Tags,
        "ps" => pb::OllamaApiCall::Ps,
        "show" => pb::OllamaApiCall::Show,
        "version" => pb::OllamaApiCall::Version,
        _ => {
            return admin_error(
                StatusCode::BAD_REQUEST,
                "unsupported_call",
                format!("`{call}` is not an allowed Ollama API call (tags, ps, show, version)"),
            );
        }
    };
    let Some(provider) = state.config.current().providers.iter().find(|p| p.id == id).cloned() else {
        return admin_error(StatusCode::NOT_FOUND, "unknown_provider", format!("no provider `{id}`"));
    };
    if provider.adapter != Adapter::Ollama {
        return admin_error(
            StatusCode::BAD_REQUEST,
            "invalid_target",
            format!("provider `{id}` does not use the ollama adapter"),
        );
    }
    let Some(control) = state.registry.control_of(&provider.node) else {
        return admin_error(StatusCode::SERVICE_UNAVAILABLE, "node_not_ready", CommandError::NotConnected);
    };
    let command = pb::NodeCommand {
        kind: pb::CommandKind::OllamaApi.into(),
        provider_id: id,
        ollama_call: call.into(),
        ..Default::default()
    };
    match state.commands.send(&control, command, COMMAND_TIMEOUT).await {
        Ok(pb::NodeCommandResult { result: Some(pb::node_command_result::Result::Error(e)), .. }) => {
            let status = match e.code() {
                pb::CommandErrorCode::InvalidTarget | pb::CommandErrorCode::Unsupported => StatusCode::BAD_REQUEST,
                _ => StatusCode::BAD_GATEWAY,
            };
            admin_error(status, &e.code().as_str_name().to_ascii_lowercase(), e.message)
        }
        Ok(result) => axum::Json(command_json(&result)).into_response(),
        Err(e) => admin_error(StatusCode::GATEWAY_TIMEOUT, "node_command_failed", e),
    }
}

pub async fn nodes(State(state): State<Arc<EdgeState>>) -> Response {
    let config = state.config.current();
    let names: Vec<String> = config.nodes.iter().map(|n| n.name.clone()).collect();
    let nodes: Vec<_> = state
        .registry
        .snapshot(&names)
        .into_iter()
        .map(|node| {
            // Each provider's effective health, as in `/admin/v1/providers`.
            let providers: BTreeMap<&str, &str> = config
                .providers
                .iter()
                .filter(|p| p.node == node.name)
                .map(|p| (p.id.as_str(), ProviderView::of(&state.registry, &state.overlay, p).health.label()))
                .collect();
            let mut value = json!(node);
            value["providers"] = json!(providers);
            value
        })
        .collect();
    axum::Json(json!({ "nodes": nodes })).into_response()
}

pub async fn providers(State(state): State<Arc<EdgeState>>) -> Response {
    let config = state.config.current();
    let nodes = state.registry.snapshot(&config.nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>());
    let load = state.admission.snapshot();
    let providers: Vec<_> = config
        .providers
        .iter()
        .map(|p| {
            let node = nodes.iter().find(|n| n.name == p.node);
            let node_ready = node.is_some_and(|n| n.phase == Some(crate::node::registry::SessionPhase::Ready));
            let view = ProviderView::of(&state.registry, &state.overlay, p);
            json!({
                "id": p.id,
                "node": p.node,
                "adapter": p.adapter,
                "target_model": p.target.model,
                "models": p.models.iter().map(|m| json!({ "name": m.name, "priority": m.priority })).collect::<Vec<_>>(),
                "node_ready": node_ready,
                // Effective health (config, readiness and overlay combined)
                // and the admission's own verdict.
                "health": view.health.label(),
                "dispatchable": view.dispatchable_on.is_some(),
                "capacity": p.capacity,
                // The runtime overlay (absent until evidence arrived).
                "overlay": state.overlay.get(&p.id),
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
pub async fn node_command(
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
    let command = pb::NodeCommand { kind: kind.into(), ..Default::default() };
    match state.commands.send(&control, command, COMMAND_TIMEOUT).await {
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
        Some(R::OllamaApi(o)) => json!({
            "status": o.status,
            // The provider's JSON answer, or its text when it is not JSON.
            "body": serde_json::from_slice::<serde_json::Value>(&o.body)
                .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&o.body).into_owned())),
        }),
        None => json!({ "error": "empty result" }),
    }
}
