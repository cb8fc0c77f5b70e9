//! One connection's control session: Register, apply the provider config,
//! check every provider answers, NodeReady, then heartbeats, run and tunnel
//! assignment, workspace requests, cancel and commands until the connection
//! ends. Runs and tunnels share one id space (`Cancel.run_id` names either);
//! those started on a session are cancelled when it ends: their generation
//! is fenced at the Edge anyway. Its workspace requests are cancelled and
//! cleaned.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::future::join_all;
use iop_proto::identity::NodeIdentity;
use iop_proto::lease::LeaseKey;
use iop_proto::liveness::HeartbeatMonitor;
use iop_proto::liveness::HeartbeatProfile;
use iop_proto::pb::{self, edge_to_node::Msg, node_gateway_client::NodeGatewayClient};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use super::replicas::{ReplicaClaim, ReplicaHold, Replicas};
use super::sequence::SessionSequence;
use crate::adapter::probe::probe;
use crate::adapter::{ProviderTarget, Providers};
use crate::capacity::LocalAdmission;
use crate::config::NodeConfig;
use crate::execution::ExecutionContext;
use crate::execution::handles::{Cancel, Observer};
use crate::health::{HealthMonitor, HealthSchedule, provider_status};
use crate::lease::{LeaseLedger, SessionLeases};
use crate::metrics::NodeMetrics;
use crate::residency::ResidencyMonitor;
use crate::workspace::runtime::WorkspaceRuntime;
use crate::workspace::sandbox::CommandEnvironment;
// The module only: `crate::run` is also a function.
use crate::run::{self};
use crate::{commands, tunnel};

#[derive(Debug)]
pub enum SessionEnd {
    Shutdown,
    ConnectFailed(String),
    Closed {
        was_ready: bool,
        reason: String,
    },
    /// The replica that answered is held by another session.
    Duplicate,
}

/// What every session of the node process shares.
#[derive(Clone)]
pub struct Shared {
    /// Spent lease ids and credential revisions outlive each connection.
    pub ledger: Arc<LeaseLedger>,
    /// Which Edge replica each session holds.
    pub replicas: Replicas,
    /// Provider capacity across the sessions.
    pub admission: LocalAdmission,
    /// How workspace commands run on this machine.
    pub commands: Arc<CommandEnvironment>,
    /// Where spans go (`crate::trace`).
    pub tracer: iop_telemetry::Tracer,
}

/// One session's place among the node's sessions.
pub struct Ours {
    /// Unique in the node process (the generation is the Edge's to give).
    pub id: u64,
    /// Told once the replica that answered is known (dropped unsent when
    /// the session ends before).
    pub registered: tokio::sync::oneshot::Sender<ReplicaClaim>,
    pub shared: Shared,
}

fn closed(was_ready: bool, reason: impl Into<String>) -> SessionEnd {
    SessionEnd::Closed { was_ready, reason: reason.into() }
}

pub fn apply_config(payload: &pb::NodeConfigPayload, config: &NodeConfig) -> Providers {
    payload
        .providers
        .iter()
        .map(|a| {
            let target = ProviderTarget::from_assignment(a)
                .map(|mut t| {
                    t.fetch_image_urls = config.images.fetch_urls;
                    crate::keep_warm::apply(&mut t, a.keep_warm, config.models.allow_keep_warm);
                    t
                })
                .map_err(|e| e.to_string());
            (a.provider_id.clone(), target)
        })
        .collect()
}

/// Probes every provider concurrently (the one definition of healthy,
/// [`probe`]); an assignment that failed validation is unavailable. With a
/// `sequence`, each verdict carries the session's next health observation
/// sequence once it is final (CAPABILITIES); readiness has none.
pub async fn probe_all(
    http: &reqwest::Client,
    providers: &Providers,
    sequence: Option<&SessionSequence>,
) -> Vec<pb::ProviderStatus> {
    let checks = providers.iter().map(|(id, target)| async move {
        let health = match target {
            Err(_) => pb::ProviderHealth::Unavailable,
            Ok(target) => {
                let verdict = probe(http, target).await;
                if let Some(failure) = &verdict.failure {
                    tracing::warn!(provider = %id, reason = failure.label(), detail = %failure, "provider check failed");
                }
                verdict.health
            }
        };
        provider_status(id, target.as_ref().ok(), health, sequence.map(SessionSequence::next))
    });
    let mut statuses = join_all(checks).await;
    statuses.sort_by(|a, b| a.provider_id.cmp(&b.provider_id));
    statuses
}

fn send(out: &mpsc::Sender<pb::NodeToEdge>, msg: pb::node_to_edge::Msg) -> bool {
    // A full outbound queue means the Edge stopped reading; the heartbeat
    // wait ends such a connection, so never block the loop on it.
    out.try_send(pb::NodeToEdge { msg: Some(msg) }).is_ok()
}

pub async fn run(
    mut client: NodeGatewayClient<Channel>,
    http: reqwest::Client,
    metrics: Arc<NodeMetrics>,
    heartbeat: HeartbeatProfile,
    config: &NodeConfig,
    shutdown: CancellationToken,
    ours: Ours,
) -> SessionEnd {
    let (out, out_rx) = mpsc::channel(64);
    let Ours { id, registered: verdict, shared } = ours;
    // A key pair for this connection only: leases sealed to it die with it.
    let key = LeaseKey::generate();
    send(
        &out,
        pb::node_to_edge::Msg::Register(pb::Register {
            node_version: env!("CARGO_PKG_VERSION").to_string(),
            lease_public_key: key.public_key().to_vec(),
            held_replicas: shared.replicas.held(),
            command_sandbox: shared.commands.wire().into(),
            sandbox_gaps: shared.commands.wire_gaps(),
        }),
    );
    let mut inbound = match client.control(ReceiverStream::new(out_rx)).await {
        Ok(response) => response.into_inner(),
        Err(status) => return SessionEnd::ConnectFailed(format!("control stream refused: {}", status.message())),
    };

    // RegisterResponse within one heartbeat wait.
    let registered = match tokio::time::timeout(heartbeat.wait, inbound.message()).await {
        Ok(Ok(Some(pb::EdgeToNode { msg: Some(Msg::RegisterResponse(r)) }))) => r,
        Ok(Ok(Some(_))) => return closed(false, "protocol_error: expected RegisterResponse"),
        Ok(Ok(None)) => return closed(false, "edge closed the control stream"),
        Ok(Err(status)) => {
            return SessionEnd::ConnectFailed(format!("edge refused registration: {}", status.message()));
        }
        Err(_) => return closed(false, "no RegisterResponse within the heartbeat wait"),
    };
    // The Edge found the replica held already, or (a race) another session
    // claimed it meanwhile.
    let claimed = (!registered.duplicate)
        .then(|| shared.replicas.claim(&registered.replica_id, id, &registered.replicas))
        .flatten();
    let Some(hold) = claimed else {
        let _ = verdict.send(ReplicaClaim::Duplicate);
        return SessionEnd::Duplicate;
    };
    let _ = verdict.send(ReplicaClaim::Held);
    let generation = registered.generation;
    let node = match NodeIdentity::parse(&registered.node_identity) {
        Ok(identity) => identity.name,
        Err(_) => return closed(false, "protocol_error: RegisterResponse without a valid node identity"),
    };
    let ledger = shared.ledger.clone();
    let leases = Arc::new(SessionLeases { key, identity: registered.node_identity, node, generation, ledger });
    let payload = registered.config.unwrap_or_default();
    let providers = Arc::new(apply_config(&payload, config));
    shared.admission.set_capacities(payload.providers.iter().map(|a| (a.provider_id.clone(), a.capacity)));
    let assigned_workspaces = payload.workspaces;
    let replica = hold.replica().to_string();
    tracing::info!(generation, %replica, providers = providers.len(), "registered with the edge; checking providers");
    let statuses = probe_all(&http, &providers, None).await;
    let readiness = statuses
        .iter()
        .filter(|s| providers.get(&s.provider_id).is_some_and(Result::is_ok))
        .map(|s| (s.provider_id.clone(), s.health()));
    let health = HealthMonitor::new(HealthSchedule::new(config.health.clone(), readiness, Instant::now()));
    let residency = ResidencyMonitor::new(config.health.idle_interval());
    // Held until this connection ends: the executors work beneath them.
    let allowed = crate::workspace::resolve_allowed_roots(&config.workspaces.allowed_roots);
    let node_files = |root: &std::path::Path| shared.commands.overlaps_node_files(root);
    let (catalog, workspace_statuses) = crate::workspace::admit(&allowed, &node_files, &assigned_workspaces);
    tracing::info!(generation, accepted = catalog.len(), declared = workspace_statuses.len(), "workspaces checked");
    let workspaces = WorkspaceRuntime::new(generation, catalog, metrics.clone(), shared.commands.clone());
    send(
        &out,
        pb::node_to_edge::Msg::Ready(pb::NodeReady { generation, providers: statuses, workspaces: workspace_statuses }),
    );

    let session = Session {
        generation,
        connected_at: Instant::now(),
        providers,
        http,
        client,
        executions: Executions::default(),
        sequence: Arc::new(SessionSequence::default()),
        metrics,
        health,
        residency,
        leases,
        workspaces,
        hold,
        admission: shared.admission.clone(),
        tracer: shared.tracer.clone(),
    };
    let end = session.serve(&mut inbound, &out, heartbeat, &shutdown).await;
    // Runs and tunnels are bound to this connection; the Edge has fenced
    // them already, so their terminal's reason is never looked at.
    for cancel in session.executions.drain() {
        cancel.cancel(pb::CancelReason::ClientDisconnected);
    }
    // Workspace requests of this generation: cancelled and cleaned here,
    // before the root handles close.
    session.workspaces.close().await;
    end
}

/// Running runs and tunnels by id (one id space). An id belongs to the first
/// execution that claimed it until that execution ends.
#[derive(Clone, Default)]
struct Executions(Arc<Mutex<HashMap<String, Cancel>>>);

impl Executions {
    /// A cancel handle for a new execution `id`; `None` while `id` runs.
    fn claim(&self, id: &str) -> Option<Cancel> {
        match self.0.lock().unwrap().entry(id.to_owned()) {
            std::collections::hash_map::Entry::Occupied(_) => None,
            std::collections::hash_map::Entry::Vacant(slot) => Some(slot.insert(Cancel::new()).clone()),
        }
    }

    fn cancel(&self, id: &str, reason: pb::CancelReason) {
        if let Some(execution) = self.0.lock().unwrap().remove(id) {
            execution.cancel(reason);
        }
    }

    /// The execution holding `cancel` ended: frees its id (only its own).
    fn finished(&self, id: &str, cancel: &Cancel) {
        let mut executions = self.0.lock().unwrap();
        if executions.get(id).is_some_and(|c| c.same(cancel)) {
            executions.remove(id);
        }
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn drain(&self) -> Vec<Cancel> {
        self.0.lock().unwrap().drain().map(|(_, cancel)| cancel).collect()
    }
}

/// An execution's hold on its id, freed when the execution's task ends,
/// however it ends (a panic in the provider code it polls included).
struct Claim {
    executions: Executions,
    id: String,
    cancel: Cancel,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.executions.finished(&self.id, &self.cancel);
    }
}

struct Session {
    generation: u64,
    connected_at: Instant,
    providers: Arc<Providers>,
    http: reqwest::Client,
    client: NodeGatewayClient<Channel>,
    /// Running runs and tunnels by id (one id space).
    executions: Executions,
    /// Source of `health_observation_seq` for this connection.
    sequence: Arc<SessionSequence>,
    metrics: Arc<NodeMetrics>,
    /// Probes the providers again while the connection is Ready.
    health: Arc<HealthMonitor>,
    /// Observes the providers' model residency while the connection is Ready.
    residency: Arc<ResidencyMonitor>,
    /// This connection's lease key and what leases must match.
    leases: Arc<SessionLeases>,
    /// The accepted workspaces and their requests.
    workspaces: Arc<WorkspaceRuntime>,
    /// This session's Edge replica, freed when the session ends.
    hold: ReplicaHold,
    admission: LocalAdmission,
    tracer: iop_telemetry::Tracer,
}

impl Session {
    async fn serve(
        &self,
        inbound: &mut tonic::Streaming<pb::EdgeToNode>,
        out: &mpsc::Sender<pb::NodeToEdge>,
        heartbeat: HeartbeatProfile,
        shutdown: &CancellationToken,
    ) -> SessionEnd {
        let mut monitor = HeartbeatMonitor::new(heartbeat, Instant::now());
        let mut ticker = tokio::time::interval(heartbeat.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ready = false;
        // Stops the health monitor when this loop ends, however it ends.
        let monitor_stop = CancellationToken::new();
        let _stop_monitor = monitor_stop.clone().drop_guard();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return SessionEnd::Shutdown,
                _ = tokio::time::sleep_until(monitor.deadline()) => {
                    if monitor.expired(Instant::now()) {
                        return closed(ready, iop_proto::liveness::HEARTBEAT_TIMEOUT_REASON);
                    }
                }
                _ = ticker.tick() => {
                    send(out, pb::node_to_edge::Msg::Heartbeat(pb::Heartbeat { seq: monitor.next_ping() }));
                }
                message = inbound.message() => {
                    let msg = match message {
                        Ok(Some(pb::EdgeToNode { msg: Some(msg) })) => msg,
                        Ok(Some(_)) => return closed(ready, "protocol_error: empty control message"),
                        Ok(None) => return closed(ready, "edge closed the control stream"),
                        Err(status) => return closed(ready, format!("edge closed the session: {}", status.message())),
                    };
                    monitor.heard(Instant::now());
                    match msg {
                        Msg::Heartbeat(hb) => {
                            send(out, pb::node_to_edge::Msg::HeartbeatAck(pb::HeartbeatAck { seq: hb.seq }));
                        }
                        Msg::HeartbeatAck(_) => {}
                        Msg::ReadyResponse(r) if r.generation == self.generation && !ready => {
                            ready = true;
                            tracing::info!(generation = self.generation, "node ready");
                            let targets: Vec<_> = self.providers.values().filter_map(|t| t.as_ref().ok().cloned()).collect();
                            tokio::spawn(self.residency.clone().run(
                                self.http.clone(),
                                targets.clone(),
                                out.clone(),
                                monitor_stop.clone(),
                            ));
                            tokio::spawn(crate::keep_warm::run(
                                self.http.clone(),
                                targets.clone(),
                                crate::keep_warm::TOUCH_INTERVAL,
                                monitor_stop.clone(),
                            ));
                            tokio::spawn(self.health.clone().run(
                                self.http.clone(),
                                targets,
                                self.sequence.clone(),
                                out.clone(),
                                monitor_stop.clone(),
                            ));
                        }
                        // A large request comes on the execution's own call.
                        Msg::RunAssign(assign) if ready => {
                            let (id, request) = (assign.run_id, assign.request);
                            self.spawn_execution(id.clone(), |ctx, cancel| run::execute(ctx, id, request, cancel));
                        }
                        Msg::TunnelAssign(assign) if ready => {
                            let (id, request) = (assign.tunnel_id, assign.request);
                            self.spawn_execution(id.clone(), |ctx, cancel| tunnel::execute(ctx, id, request, cancel));
                        }
                        Msg::ReplicaSet(set) => self.hold.set_replicas(&set.replicas),
                        Msg::Capacities(update) => self.admission.set_capacities(update.capacity),
                        Msg::Draining(_) => {
                            tracing::info!(generation = self.generation, replica = self.hold.replica(), "the edge replica is draining");
                            self.hold.drain();
                        }
                        Msg::Cancel(cancel) => {
                            // An unknown reason still cancels.
                            let reason = iop_proto::wire::closed_enum("cancel.reason", cancel.reason)
                                .unwrap_or(pb::CancelReason::ClientDisconnected);
                            self.executions.cancel(&cancel.run_id, reason);
                        }
                        Msg::Command(command) if ready => self.answer(command, out),
                        Msg::WorkspaceAssign(assign) if ready => {
                            let client = self.client.clone()
                                .max_decoding_message_size(iop_proto::wire::MAX_WORKSPACE_MESSAGE_BYTES)
                                .max_encoding_message_size(iop_proto::wire::MAX_WORKSPACE_MESSAGE_BYTES);
                            self.workspaces.assign(client, assign.request_id);
                        }
                        other => {
                            return closed(ready, format!("protocol_error: unexpected {}", msg_name(&other)));
                        }
                    }
                }
            }
        }
    }

    /// Starts a run or tunnel under `id`, cancellable until it ends.
    fn spawn_execution<F, Fut>(&self, id: String, execute: F)
    where
        F: FnOnce(ExecutionContext, Cancel) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(cancel) = self.executions.claim(&id) else {
            // The id is running already: the first keeps it (and its cancel
            // handle); the duplicate is dropped.
            tracing::warn!(generation = self.generation, "refused an assignment whose id is already running");
            return;
        };
        let ctx = ExecutionContext {
            // A request may be as large as the Edge's body limit.
            client: self.client.clone().max_decoding_message_size(iop_proto::wire::MAX_RUN_REQUEST_MESSAGE_BYTES),
            http: self.http.clone(),
            providers: self.providers.clone(),
            generation: self.generation,
            leases: Some(self.leases.clone()),
            admission: self.admission.clone(),
            tracer: self.tracer.clone(),
            observer: Observer {
                sequence: Some(self.sequence.clone()),
                metrics: self.metrics.clone(),
                health: Some(self.health.clone()),
                residency: Some(self.residency.clone()),
            },
        };
        let execution = execute(ctx, cancel.clone());
        let claim = Claim { executions: self.executions.clone(), id, cancel };
        tokio::spawn(async move {
            execution.await;
            drop(claim);
        });
    }

    fn answer(&self, command: pb::NodeCommand, out: &mpsc::Sender<pb::NodeToEdge>) {
        use pb::node_command_result::Result as R;
        let kind = iop_proto::wire::closed_enum::<pb::CommandKind>("command.kind", command.kind);
        let out = out.clone();
        let (http, providers, sequence) = (self.http.clone(), self.providers.clone(), self.sequence.clone());
        let status = pb::TransportStatus {
            generation: self.generation,
            active_runs: self.executions.len() as u64,
            connected_for_ms: self.connected_at.elapsed().as_millis() as u64,
        };
        // Probes can take seconds: answer off the control loop.
        tokio::spawn(async move {
            let result = match kind {
                Ok(pb::CommandKind::Capabilities) => {
                    R::Capabilities(pb::Capabilities { providers: probe_all(&http, &providers, Some(&sequence)).await })
                }
                Ok(pb::CommandKind::TransportStatus) => R::TransportStatus(status),
                Ok(pb::CommandKind::OllamaApi) => {
                    commands::ollama_api(&http, &providers, &command.provider_id, command.ollama_call).await
                }
                Ok(pb::CommandKind::Unspecified) | Err(_) => R::Error(pb::CommandError {
                    code: pb::CommandErrorCode::Unsupported.into(),
                    message: format!("unsupported command kind {}", command.kind),
                }),
            };
            let result = pb::NodeCommandResult { command_id: command.command_id, result: Some(result) };
            let _ = out.send(pb::NodeToEdge { msg: Some(pb::node_to_edge::Msg::CommandResult(result)) }).await;
        });
    }
}

fn msg_name(msg: &Msg) -> &'static str {
    match msg {
        Msg::RegisterResponse(_) => "RegisterResponse",
        Msg::ReadyResponse(_) => "NodeReadyResponse",
        Msg::Heartbeat(_) => "Heartbeat",
        Msg::HeartbeatAck(_) => "HeartbeatAck",
        Msg::RunAssign(_) => "RunAssign before ready",
        Msg::Cancel(_) => "Cancel",
        Msg::Command(_) => "NodeCommand before ready",
        Msg::TunnelAssign(_) => "TunnelAssign before ready",
        Msg::WorkspaceAssign(_) => "WorkspaceAssign before ready",
        Msg::ReplicaSet(_) => "ReplicaSet",
        Msg::Capacities(_) => "ProviderCapacities",
        Msg::Draining(_) => "Draining",
    }
}

#[cfg(test)]
mod executions_tests;
#[cfg(test)]
mod tests;
