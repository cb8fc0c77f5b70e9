//! Admin endpoints: JSON snapshots of nodes and providers (their types are
//! [`iop_proto::admin`]'s, which the operator reads), node commands
//! (CAPABILITIES, TRANSPORT_STATUS, the read-only OLLAMA_API calls), and,
//! when enabled, the workspace diagnostic.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use iop_proto::admin::{self, SessionPhase};
use iop_proto::config::Adapter;
use iop_proto::pb;
use serde_json::json;

use crate::core::credential::CredentialState;
use crate::core::health::{ProviderView, health_label};
use crate::core::residency::Figures;
use crate::node::commands::CommandError;
use crate::node::registry::NodeSnapshot;
use crate::state::EdgeState;
use crate::workspace::tools::{self, ToolCall};
use crate::workspace::{self, WorkspaceCall, WorkspaceError};

const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) fn admin_error(status: StatusCode, code: &str, message: impl std::fmt::Display) -> Response {
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
    match state.link.commands.send(&control, command, COMMAND_TIMEOUT).await {
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

/// `GET /admin/v1/nodes`: every configured node and this replica's session
/// with it ([`admin::NodesSnapshot`]).
pub async fn nodes(State(state): State<Arc<EdgeState>>) -> Response {
    let config = state.config.current();
    let names: Vec<String> = config.nodes.iter().map(|n| n.name.clone()).collect();
    let nodes = state
        .registry
        .snapshot(&names)
        .into_iter()
        .map(|node| {
            // Each provider's effective health, as in `/admin/v1/providers`.
            let providers = config
                .providers
                .iter()
                .filter(|p| p.node == node.name)
                .map(|p| {
                    let view = ProviderView::of(&state.registry, &state.overlay, state.config.credential_health(), p);
                    (p.id.clone(), view.health.into())
                })
                .collect();
            let NodeSnapshot {
                name,
                connected,
                phase,
                generation,
                connected_at_ms,
                version,
                workspaces,
                command_sandbox,
                sandbox_gaps,
                certificate_serial,
            } = node;
            admin::EdgeNode {
                command_sandbox: command_sandbox.map(str::to_string),
                certificate_serial,
                connected,
                connected_at_ms,
                generation,
                name,
                phase,
                providers,
                sandbox_gaps: sandbox_gaps.into_iter().map(str::to_string).collect(),
                version,
                workspaces: workspaces
                    .into_iter()
                    .map(|(reference, verdict)| (reference, verdict.to_string()))
                    .collect(),
            }
        })
        .collect();
    axum::Json(admin::NodesSnapshot { nodes }).into_response()
}

/// `GET /admin/v1/providers`: every configured provider as this replica
/// sees it, and its admission load ([`admin::ProvidersSnapshot`]).
pub async fn providers(State(state): State<Arc<EdgeState>>) -> Response {
    let config = state.config.current();
    let nodes = state.registry.snapshot(&config.nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>());
    let load = state.routing.admission.snapshot();
    let now = std::time::Instant::now();
    let providers = config
        .providers
        .iter()
        .map(|p| {
            let node = nodes.iter().find(|n| n.name == p.node);
            let node_ready = node.is_some_and(|n| n.phase == Some(SessionPhase::Ready));
            let view = ProviderView::of(&state.registry, &state.overlay, state.config.credential_health(), p);
            let outlier = state.routing.admission.outlier_status(&p.id, now);
            let credential = p.credential.as_ref().zip(view.credential).map(|(c, credential)| admin::EdgeCredential {
                problem: state.config.credential_health().problem(&c.profile).map(|p| p.to_string()),
                node_refusal: (credential == CredentialState::RefusedByNode)
                    .then(|| state.config.credential_health().refusal(&c.profile, &p.node))
                    .flatten()
                    .map(|r| r.label().to_string()),
                profile: c.profile.clone(),
                state: credential.into(),
            });
            let residency = state.routing.residency.of(&state.registry, p);
            let (last_load_seconds, last_load_at) = last_load(&residency);
            admin::EdgeProvider {
                accepts_images: state.routing.residency.accepts_images(&state.registry, p),
                adapter: Some(p.adapter),
                capacity: p.capacity,
                consecutive_failures: outlier.consecutive_failures,
                credential,
                dispatchable: view.dispatchable_on.is_some(),
                ejected_until: outlier.ejected_until.map(|until| rfc3339(until, now)),
                ejections: outlier.ejections,
                health: view.health.into(),
                id: p.id.clone(),
                in_flight: load.providers.get(&p.id).map_or(0, |l| l.in_flight),
                last_load_at,
                last_load_seconds,
                learned_stall_ms: Some(residency.learned_stall_ms).filter(|ms| *ms > 0),
                model_memory: model_memory(&residency),
                models: p
                    .models
                    .iter()
                    .map(|m| admin::ProviderModel { name: m.name.clone(), priority: m.priority })
                    .collect(),
                node: p.node.clone(),
                node_ready,
                on_trial: outlier.on_trial,
                overlay: state.overlay.get(&p.id).map(Into::into),
                prefill_ms_per_1k_tokens: Some(residency.prefill_ms_per_1k_tokens).filter(|ms| *ms > 0),
                residency: Some(residency.residency.into()),
                target_model: p.target.model.clone(),
            }
        })
        .collect();
    axum::Json(admin::ProvidersSnapshot {
        in_flight_runs: state.link.runs.in_flight() as u64,
        leases: admin::Leases {
            acquired: load.acquired,
            double_releases: load.double_releases,
            released: load.released,
        },
        providers,
        queued: load.queued.into_iter().map(|(model, waiting)| (model, waiting as u64)).collect(),
        workspace_calls: state.link.workspace_calls.in_flight() as u64,
    })
    .into_response()
}

/// A provider's `model_memory` ([`crate::residency`]): `None` when both
/// figures are 0.
fn model_memory(figures: &Figures) -> Option<admin::ModelMemory> {
    (figures.size_bytes > 0 || figures.vram_bytes > 0)
        .then_some(admin::ModelMemory { size_bytes: figures.size_bytes, vram_bytes: figures.vram_bytes })
}

/// The node's last measured load of a provider's model
/// ([`crate::residency`]): `(last_load_seconds, last_load_at)` (RFC 3339),
/// `None` when none.
fn last_load(figures: &Figures) -> (Option<f64>, Option<String>) {
    let measured = figures.last_load_ms > 0;
    let at = i128::from(figures.last_loaded_at_unix_ms) * 1_000_000;
    let at = (measured && figures.last_loaded_at_unix_ms > 0)
        .then(|| time::OffsetDateTime::from_unix_timestamp_nanos(at).ok())
        .flatten()
        .and_then(|at| at.format(&time::format_description::well_known::Rfc3339).ok());
    (measured.then(|| figures.last_load_ms as f64 / 1000.0), at)
}

/// `at` on the wall clock, as RFC 3339 in UTC (whole milliseconds).
fn rfc3339(at: std::time::Instant, now: std::time::Instant) -> String {
    let wall = std::time::SystemTime::now() + at.saturating_duration_since(now);
    let at = time::OffsetDateTime::from(wall);
    let at = at.replace_nanosecond(at.millisecond() as u32 * 1_000_000).unwrap_or(at);
    at.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
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
    match state.link.commands.send(&control, command, COMMAND_TIMEOUT).await {
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

/// Most tool calls one diagnostic request may carry.
const MAX_DIAGNOSTIC_CALLS: usize = 64;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceCallsBody {
    calls: Vec<ToolCall>,
}

/// `POST /admin/v1/workspaces/{ref}/calls` (only with `iop-edge
/// --admin-workspace-calls`): admits the workspace as a job would (its node's
/// current ready connection, the template as authority), opens it, runs the
/// calls in order, cleans up, and answers with every typed result. Bounded
/// by the workspace's `wall_clock_ms`; a caller that goes away ends the call
/// and the node cancels and cleans by itself.
pub async fn workspace_calls(
    State(state): State<Arc<EdgeState>>,
    Path(reference): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    if !state.replica.admin_workspace_calls {
        return admin_error(
            StatusCode::FORBIDDEN,
            "workspace_calls_disabled",
            "start iop-edge with --admin-workspace-calls to drive workspaces from the admin API",
        );
    }
    let body: WorkspaceCallsBody = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(e) => return admin_error(StatusCode::BAD_REQUEST, "invalid_request", e),
    };
    if body.calls.len() > MAX_DIAGNOSTIC_CALLS {
        let message = format!("at most {MAX_DIAGNOSTIC_CALLS} calls per request");
        return admin_error(StatusCode::BAD_REQUEST, "invalid_request", message);
    }
    let admitted = match workspace::admit(&state, &reference) {
        Ok(admitted) => admitted,
        Err(e @ WorkspaceError::UnknownWorkspace) => return admin_error(StatusCode::NOT_FOUND, e.label(), e),
        Err(e) => return admin_error(StatusCode::SERVICE_UNAVAILABLE, e.label(), e),
    };
    let limit = admitted.authority.limits.map_or(0, |l| l.wall_clock_ms);
    match tokio::time::timeout(Duration::from_millis(limit), drive_workspace(&state, &admitted, body.calls)).await {
        Ok(Ok(answer)) => axum::Json(answer).into_response(),
        Ok(Err(e)) => admin_error(StatusCode::BAD_GATEWAY, e.label(), e),
        Err(_) => admin_error(StatusCode::GATEWAY_TIMEOUT, "deadline_exceeded", "the workspace's wall clock ran out"),
    }
}

async fn drive_workspace(
    state: &EdgeState,
    admitted: &workspace::Admitted,
    calls: Vec<ToolCall>,
) -> Result<serde_json::Value, WorkspaceError> {
    let request_id = crate::ids::new_uuid().to_string();
    let mut call = WorkspaceCall::start(state, admitted, &request_id).await?;
    let effective = call.open(&admitted.reference, &admitted.authority).await?;
    let never = tokio_util::sync::CancellationToken::new();
    let mut results = Vec::with_capacity(calls.len());
    for (index, tool) in calls.into_iter().enumerate() {
        if !tool.allowed_by(&effective) {
            results.push(json!({ "result": "denied" }));
            continue;
        }
        let answer = call.tool("admin", &format!("call-{index}"), tool.into_wire(), &never).await?;
        results.push(tools::result_json(&answer));
    }
    let cleanup = call.cleanup().await?;
    Ok(json!({
        "request_id": request_id,
        "node": admitted.node,
        "effective": authority_json(&effective),
        "results": results,
        "cleanup": {
            "status": workspace::cleanup_label(cleanup.status),
            "removed": cleanup.removed,
            "refused": cleanup.refused,
        },
    }))
}

fn authority_json(authority: &pb::WorkspaceAuthority) -> serde_json::Value {
    let operations: Vec<&str> = authority
        .operations
        .iter()
        .filter_map(|op| pb::WorkspaceOperation::try_from(*op).ok())
        .map(|op| match op {
            pb::WorkspaceOperation::Read => "read",
            pb::WorkspaceOperation::List => "list",
            pb::WorkspaceOperation::Write => "write",
            pb::WorkspaceOperation::Delete => "delete",
            pb::WorkspaceOperation::Command => "command",
            pb::WorkspaceOperation::Unspecified => "unspecified",
        })
        .collect();
    let limits = authority.limits.unwrap_or_default();
    json!({
        "operations": operations,
        "command_ids": authority.command_ids,
        "env_names": authority.env_names,
        "limits": {
            "max_file_bytes": limits.max_file_bytes,
            "max_list_entries": limits.max_list_entries,
            "max_output_bytes": limits.max_output_bytes,
            "max_iterations": limits.max_iterations,
            "wall_clock_ms": limits.wall_clock_ms,
        },
    })
}

/// `GET /admin/v1/usage`: every principal's requests, errors and tokens
/// since this replica started, in total and per public model
/// (`crate::usage`).
pub(super) async fn usage(State(state): State<Arc<EdgeState>>) -> Response {
    axum::Json(state.routing.usage.ledger.snapshot()).into_response()
}

#[cfg(test)]
mod tests;
