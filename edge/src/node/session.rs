//! One node control session: Register -> RegisterResponse(+config) ->
//! NodeReady -> NodeReadyResponse, then heartbeats, run assignment (sent by
//! dispatch through the same outbound channel), cancels and commands. When
//! the session ends for any reason its generation is fenced.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use iop_proto::admin::SessionPhase;
use iop_proto::liveness::HeartbeatMonitor;
use iop_proto::pb::{self, node_to_edge::Msg};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};

use super::health;
use super::registry::{CloseReason, ControlSender, Session};
use super::tls::NodePeer;
use crate::core::health::Source;
use crate::state::EdgeState;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

pub(crate) fn send_now(out: &ControlSender, msg: pb::edge_to_node::Msg) {
    // Never block the session loop on a node that stopped reading: a full
    // outbound queue is exactly what the heartbeat wait will detect.
    let _ = out.try_send(Ok(pb::EdgeToNode { msg: Some(msg) }));
}

/// Providers of `node` in the current config, as the node must run them.
pub fn config_payload(config: &iop_proto::config::EdgeConfig, node: &str) -> pb::NodeConfigPayload {
    pb::NodeConfigPayload {
        providers: config
            .providers
            .iter()
            .filter(|p| p.node == node)
            .map(|p| pb::ProviderAssignment {
                provider_id: p.id.clone(),
                adapter: pb::AdapterKind::from(p.adapter).into(),
                target_model: p.target.model.clone(),
                base_url: p.target.base_url.clone(),
                response_stall_timeout_ms: p.response_stall_timeout_ms,
                credential_profile: p.credential.as_ref().map(|c| c.profile.clone()).unwrap_or_default(),
                capacity: p.capacity,
                keep_warm: p.keep_warm,
            })
            .collect(),
        workspaces: config
            .workspaces
            .iter()
            .filter(|w| w.node == node)
            .map(iop_proto::config::WorkspaceEntry::assignment)
            .collect(),
    }
}

pub async fn run(state: Arc<EdgeState>, peer: NodePeer, mut inbound: Streaming<pb::NodeToEdge>, out: ControlSender) {
    let node = peer.identity.name.clone();
    let profile = state.link.heartbeat;

    // Register must come first, within one heartbeat wait.
    let register = match tokio::time::timeout(profile.wait, inbound.message()).await {
        Ok(Ok(Some(pb::NodeToEdge { msg: Some(Msg::Register(r)) }))) => r,
        other => {
            let reason = match other {
                Err(_) => CloseReason::HeartbeatTimeout,
                Ok(Err(_)) => CloseReason::TransportError,
                Ok(Ok(None)) => CloseReason::NodeClosed,
                Ok(Ok(Some(_))) => CloseReason::ProtocolError,
            };
            state.metrics.reason(&state.metrics.sessions_closed, reason.label());
            tracing::warn!(%node, reason = reason.label(), "node session ended before Register");
            let _ = out.try_send(Err(Status::failed_precondition(reason.label())));
            return;
        }
    };

    if register.held_replicas.contains(&state.replica.id) {
        // The load balancer brought the node here again: the session it
        // holds with this replica stays registered.
        let config = state.config.current();
        let answer = pb::RegisterResponse {
            duplicate: true,
            replica_id: state.replica.id.clone(),
            replicas: state.replica_set(&config),
            ..Default::default()
        };
        send_now(&out, pb::edge_to_node::Msg::RegisterResponse(answer));
        state.metrics.reason(&state.metrics.sessions_closed, CloseReason::Duplicate.label());
        tracing::debug!(%node, "a second session to this replica; answered as a duplicate");
        return;
    }

    let generation = state.link.generations.next();
    let close = CancellationToken::new();
    let close_reason: Arc<std::sync::OnceLock<CloseReason>> = Default::default();
    let sandbox_gaps = sandbox_gap_labels(&register.sandbox_gaps);
    let session = Session {
        generation,
        phase: SessionPhase::Registered,
        connected_at_ms: now_ms(),
        // Bounded: it reaches admin output and the operator's status.
        node_version: register.node_version.chars().take(64).collect(),
        control: out.clone(),
        close: close.clone(),
        close_reason: close_reason.clone(),
        lease_key: (register.lease_public_key.len() == iop_proto::lease::PUBLIC_KEY_LEN)
            .then(|| Arc::from(register.lease_public_key.as_slice())),
        workspaces: Default::default(),
        command_sandbox: command_sandbox_label(register.command_sandbox),
        sandbox_gaps: sandbox_gaps.clone(),
        certificate_serial: peer.certificate.serial.clone(),
    };
    if let Some(previous) = state.registry.register(&node, session) {
        previous.close.cancel();
    }
    tracing::info!(
        %node,
        generation,
        version = %register.node_version,
        command_sandbox = command_sandbox_label(register.command_sandbox),
        sandbox_gaps = ?sandbox_gaps,
        "node registered"
    );
    let config = state.config.current();
    send_now(
        &out,
        pb::edge_to_node::Msg::RegisterResponse(pb::RegisterResponse {
            generation,
            config: Some(config_payload(&config, &node)),
            node_identity: peer.identity.uri(),
            replica_id: state.replica.id.clone(),
            replicas: state.replica_set(&config),
            duplicate: false,
        }),
    );
    drop(config);
    // A replica that drains takes no new work, from a late node neither.
    if state.replica.draining.is_cancelled() {
        send_now(&out, pb::edge_to_node::Msg::Draining(pb::Draining {}));
    }

    let ends = Ends { close: &close, close_reason: &close_reason, expired: &peer.certificate.expired };
    let reason = serve(&state, &node, generation, &mut inbound, &out, ends).await;

    state.registry.remove(&node, generation);
    let fenced = state.link.runs.fence_generation(&node, generation)
        + state.link.tunnels.fence_generation(&node, generation)
        + state.link.workspace_calls.fence_generation(&node, generation);
    state.metrics.ready_nodes.set(state.registry.ready_count() as i64);
    // Waiters queued for this node's providers fail fast or move elsewhere.
    state.routing.admission.drain_queues();
    state.metrics.reason(&state.metrics.sessions_closed, reason.label());
    if reason.orderly() && fenced == 0 {
        tracing::info!(%node, generation, reason = reason.label(), "node session closed; generation fenced");
    } else {
        tracing::warn!(%node, generation, reason = reason.label(), fenced_runs = fenced, "node session closed; generation fenced");
    }
    let _ = out.try_send(Err(Status::unavailable(reason.label())));
}

/// What ends a session besides the node and its heartbeats.
struct Ends<'a> {
    /// Cancelled to close it (`Session::close`), for `close_reason`.
    close: &'a CancellationToken,
    close_reason: &'a std::sync::OnceLock<CloseReason>,
    /// The connection's certificate expired (`tls::Presented::expired`).
    expired: &'a CancellationToken,
}

async fn serve(
    state: &Arc<EdgeState>,
    node: &str,
    generation: u64,
    inbound: &mut Streaming<pb::NodeToEdge>,
    out: &ControlSender,
    Ends { close, close_reason, expired }: Ends<'_>,
) -> CloseReason {
    let mut monitor = HeartbeatMonitor::new(state.link.heartbeat, Instant::now());
    let mut ticker = tokio::time::interval(state.link.heartbeat.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut phase = SessionPhase::Registered;
    loop {
        tokio::select! {
            // A close comes first: a reload closes a session and then ends
            // its connection (`reload::apply`), and the session ends for the
            // reason it was closed, not as the transport error that follows.
            biased;
            _ = close.cancelled() => {
                return match close_reason.get() {
                    Some(reason) => *reason,
                    None if state.replica.shutting_down.is_cancelled() => CloseReason::EdgeShutdown,
                    None => CloseReason::Replaced,
                };
            }
            // Before the inbound stream: the connection fails right after.
            _ = expired.cancelled() => return CloseReason::CertificateExpired,
            _ = tokio::time::sleep_until(monitor.deadline()) => {
                if monitor.expired(Instant::now()) {
                    return CloseReason::HeartbeatTimeout;
                }
            }
            _ = ticker.tick() => {
                send_now(out, pb::edge_to_node::Msg::Heartbeat(pb::Heartbeat { seq: monitor.next_ping() }));
            }
            message = inbound.message() => {
                let msg = match message {
                    Ok(Some(pb::NodeToEdge { msg: Some(msg) })) => msg,
                    Ok(Some(_)) => return CloseReason::ProtocolError,
                    Ok(None) => return CloseReason::NodeClosed,
                    Err(_) => return CloseReason::TransportError,
                };
                monitor.heard(Instant::now());
                match (phase, msg) {
                    (_, Msg::Heartbeat(hb)) => send_now(out, pb::edge_to_node::Msg::HeartbeatAck(pb::HeartbeatAck { seq: hb.seq })),
                    (_, Msg::HeartbeatAck(_)) => {}
                    (SessionPhase::Registered, Msg::Ready(ready)) if ready.generation == generation => {
                        // Health first: the connection is dispatchable only
                        // with its readiness evidence in the overlay.
                        health::apply_statuses(state, node, generation, Source::Readiness, &ready.providers);
                        let assigned = config_payload(&state.config.current(), node).workspaces;
                        let verdicts = workspace_verdicts(&assigned, &ready.workspaces);
                        state.registry.set_workspaces(node, generation, verdicts);
                        if !state.registry.mark_ready(node, generation) {
                            return CloseReason::Replaced;
                        }
                        phase = SessionPhase::Ready;
                        state.metrics.ready_nodes.set(state.registry.ready_count() as i64);
                        tracing::info!(%node, generation, "node ready");
                        // The last node this replica waited for makes it
                        // ready now, not at the next `/readyz`.
                        state.readiness();
                        state.routing.admission.drain_queues();
                        // A reconnect is a chance to recover lowered providers.
                        state.routing.recovery.notify_one();
                        send_now(out, pb::edge_to_node::Msg::ReadyResponse(pb::NodeReadyResponse { generation }));
                    }
                    (SessionPhase::Ready, Msg::CommandResult(result)) => {
                        state.link.commands.complete(result);
                    }
                    (SessionPhase::Ready, Msg::ResidencyReport(report)) => {
                        // Advisory: changes selection and first-byte deadlines, never health.
                        let config = state.config.current();
                        state.routing.residency.apply(&config, &state.registry, node, generation, &report.providers);
                    }
                    (SessionPhase::Ready, Msg::HealthReport(report)) => {
                        if health::apply_statuses(state, node, generation, Source::Probe, &report.providers) {
                            state.routing.admission.drain_queues();
                        }
                    }
                    (_, other) => {
                        tracing::warn!(%node, generation, message = message_name(&other), "unexpected control message");
                        return CloseReason::ProtocolError;
                    }
                }
            }
        }
    }
}

/// What the node said of each workspace assigned to it: `accepted` or the
/// closed reason. A ref it did not report is `not_reported`; one it was not
/// assigned is ignored; a status it cannot have meant is `unknown_status`.
pub fn workspace_verdicts(
    assigned: &[pb::WorkspaceAssignment],
    reported: &[pb::WorkspaceStatus],
) -> std::collections::BTreeMap<String, &'static str> {
    use pb::WorkspaceState as S;
    assigned
        .iter()
        .map(|a| {
            let state = reported.iter().find(|r| r.r#ref == a.r#ref).map(|r| S::try_from(r.state));
            let verdict = match state {
                None => "not_reported",
                Some(Ok(S::Accepted)) => "accepted",
                Some(Ok(S::OutsideAllowedRoots)) => "outside_allowed_roots",
                Some(Ok(S::NotFound)) => "not_found",
                Some(Ok(S::NotADirectory)) => "not_a_directory",
                Some(Ok(S::Symlink)) => "symlink",
                Some(Ok(S::InvalidPath)) => "invalid_path",
                Some(Ok(S::Unreadable)) => "unreadable",
                Some(Ok(S::NodeFiles)) => "node_files",
                Some(Ok(S::Unspecified) | Err(_)) => "unknown_status",
            };
            (a.r#ref.clone(), verdict)
        })
        .collect()
}

/// How a node runs workspace commands, as `/admin/v1/nodes` shows it.
pub fn command_sandbox_label(value: i32) -> &'static str {
    use pb::CommandSandbox as C;
    match C::try_from(value) {
        Ok(C::Landlock) => "landlock",
        Ok(C::Seatbelt) => "seatbelt",
        Ok(C::Unsandboxed) => "unsandboxed",
        Ok(C::Unavailable) => "unavailable",
        Ok(C::Unspecified) | Err(_) => "unknown",
    }
}

/// The gaps a node reported, as closed labels, each once (a value this
/// Edge does not know is `unknown`; a node cannot grow the list).
pub fn sandbox_gap_labels(values: &[i32]) -> Vec<&'static str> {
    let labels: std::collections::BTreeSet<&'static str> = values
        .iter()
        .map(|v| pb::SandboxGap::try_from(*v).map_or("unknown", |gap| gap.label()))
        .filter(|label| *label != "unspecified")
        .collect();
    labels.into_iter().collect()
}

fn message_name(msg: &Msg) -> &'static str {
    match msg {
        Msg::Register(_) => "register",
        Msg::Ready(_) => "ready",
        Msg::Heartbeat(_) => "heartbeat",
        Msg::HeartbeatAck(_) => "heartbeat_ack",
        Msg::CommandResult(_) => "command_result",
        Msg::HealthReport(_) => "health_report",
        Msg::ResidencyReport(_) => "residency_report",
    }
}

#[cfg(test)]
mod tests;
