//! The Edge's side of the workspace wire.
//!
//! [`admit`] resolves an opaque workspace ref through the config and freezes
//! what a request gets: the owner node, that node's ready connection
//! generation, and the authority (operation names, command ids, environment
//! names, limits). Nothing is re-selected later: a [`WorkspaceCall`] is bound
//! to that generation and fails closed when it is fenced.
//!
//! [`WorkspaceCall::start`] asks the node (`WorkspaceAssign` on the control
//! stream) to open the request's own `WorkspaceCalls` call; the gRPC service
//! binds the call here ([`WorkspaceCalls::attach`]) after checking node and
//! generation. Requests then go down that call and answers come back on it,
//! one at a time, each matched by its ids; an answer that matches nothing
//! pending is dropped and counted.

pub mod calls;
pub mod tools;

use std::sync::Arc;

use iop_proto::pb::{self, workspace_uplink::Msg as Up};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::metrics::EdgeMetrics;
use crate::state::EdgeState;
use calls::{Pending, WorkspaceCalls};

/// Why a workspace request could not be admitted or went on no further.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WorkspaceError {
    /// No workspace by that ref, or its node did not accept it. (Says
    /// nothing of node or path.)
    #[error("unknown workspace")]
    UnknownWorkspace,
    #[error("the workspace's node is not ready")]
    NodeNotReady,
    /// The connection the request was admitted on ended.
    #[error("the workspace's node connection changed")]
    Fenced,
    #[error("the node did not open the workspace call in time")]
    AttachTimeout,
    #[error("the node refused to open the workspace ({0})")]
    OpenRefused(&'static str),
    /// The call ended before the answer came.
    #[error("the workspace call ended")]
    CallEnded,
    #[error("the node answered out of protocol")]
    Protocol,
}

impl WorkspaceError {
    pub fn label(self) -> &'static str {
        match self {
            Self::UnknownWorkspace => "unknown_workspace",
            Self::NodeNotReady => "node_not_ready",
            Self::Fenced => "fenced_generation",
            Self::AttachTimeout => "attach_timeout",
            Self::OpenRefused(label) => label,
            Self::CallEnded => "call_ended",
            Self::Protocol => "protocol_error",
        }
    }
}

/// A cleanup's closed status as logs, metrics and JSON name it.
pub fn cleanup_label(status: i32) -> &'static str {
    use pb::WorkspaceCleanupStatus as S;
    match S::try_from(status) {
        Ok(S::Cleaned) => "cleaned",
        Ok(S::NothingToClean) => "nothing_to_clean",
        Ok(S::Partial) => "partial",
        Ok(S::Failed) => "failed",
        Ok(S::NotOpen) => "not_open",
        Ok(S::Unspecified) | Err(_) => "unknown_status",
    }
}

/// What admission froze for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Admitted {
    pub reference: String,
    pub node: String,
    pub generation: u64,
    pub authority: pb::WorkspaceAuthority,
    /// How a job runs on it (from the same config as the authority).
    pub stages: iop_proto::config::WorkspaceStages,
    /// Jobs that may run on it at once (`limits.max_concurrent_jobs`; the
    /// Edge's own, not part of the authority the node sees).
    pub max_concurrent_jobs: u32,
}

/// Resolves `reference` to its configured owner's current ready connection,
/// if the node accepted that workspace on it.
pub fn admit(state: &EdgeState, reference: &str) -> Result<Admitted, WorkspaceError> {
    let config = state.config.current();
    let entry = config.workspaces.iter().find(|w| w.reference == reference).ok_or(WorkspaceError::UnknownWorkspace)?;
    let generation = state.registry.ready_generation(&entry.node).ok_or(WorkspaceError::NodeNotReady)?;
    if state.registry.workspace_verdict(&entry.node, generation, reference) != Some("accepted") {
        return Err(WorkspaceError::UnknownWorkspace);
    }
    Ok(Admitted {
        reference: reference.to_string(),
        node: entry.node.clone(),
        generation,
        authority: entry.authority(),
        stages: entry.stages.clone(),
        max_concurrent_jobs: entry.limits.max_concurrent_jobs,
    })
}

/// One request's workspace call, bound to the generation it was admitted on.
/// Dropping it ends the call; the node then cancels and cleans by itself.
pub struct WorkspaceCall {
    request_id: String,
    generation: u64,
    calls: Arc<WorkspaceCalls>,
    metrics: Arc<EdgeMetrics>,
    fence: CancellationToken,
    downlink: mpsc::Sender<Result<pb::WorkspaceDownlink, tonic::Status>>,
    uplink: mpsc::Receiver<pb::WorkspaceUplink>,
}

impl Drop for WorkspaceCall {
    fn drop(&mut self) {
        self.calls.calls.lock().unwrap().remove(&self.request_id);
    }
}

impl WorkspaceCall {
    /// Asks the admitted node to open the call of `request_id` and waits
    /// (one heartbeat wait at most) until it has.
    pub async fn start(state: &EdgeState, admitted: &Admitted, request_id: &str) -> Result<Self, WorkspaceError> {
        let control =
            state.registry.control_if_current(&admitted.node, admitted.generation).ok_or(WorkspaceError::Fenced)?;
        let fence = CancellationToken::new();
        let (attach, attached) = oneshot::channel();
        let pending = Pending {
            node: admitted.node.clone(),
            generation: admitted.generation,
            fence: fence.clone(),
            attach: Some(attach),
        };
        {
            let mut calls = state.link.workspace_calls.calls.lock().unwrap();
            if calls.contains_key(request_id) {
                return Err(WorkspaceError::Protocol);
            }
            calls.insert(request_id.to_string(), pending);
        }
        // Until the call attached, this guard removes the entry on every
        // return; then the `WorkspaceCall` does.
        let mut unregister = Unregister { calls: &state.link.workspace_calls, request_id, armed: true };
        // The session could have ended between the lookup and the insert.
        if !state.registry.is_current(&admitted.node, admitted.generation) {
            return Err(WorkspaceError::Fenced);
        }
        let assign = pb::edge_to_node::Msg::WorkspaceAssign(pb::WorkspaceAssign { request_id: request_id.to_string() });
        if control.try_send(Ok(pb::EdgeToNode { msg: Some(assign) })).is_err() {
            return Err(WorkspaceError::NodeNotReady);
        }
        let attached = tokio::select! {
            _ = fence.cancelled() => return Err(WorkspaceError::Fenced),
            attached = tokio::time::timeout(state.link.heartbeat.wait, attached) => match attached {
                Ok(Ok(attached)) => attached,
                Ok(Err(_)) => return Err(WorkspaceError::Fenced),
                Err(_) => return Err(WorkspaceError::AttachTimeout),
            },
        };
        unregister.armed = false;
        Ok(Self {
            request_id: request_id.to_string(),
            generation: admitted.generation,
            calls: state.link.workspace_calls.clone(),
            metrics: state.metrics.clone(),
            fence,
            downlink: attached.downlink,
            uplink: attached.uplink,
        })
    }

    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// Opens the workspace with the frozen authority; the node's answer is
    /// what it granted (never more).
    pub async fn open(
        &mut self,
        reference: &str,
        authority: &pb::WorkspaceAuthority,
    ) -> Result<pb::WorkspaceAuthority, WorkspaceError> {
        let open = pb::WorkspaceOpenRequest {
            request_id: self.request_id.clone(),
            generation: self.generation,
            r#ref: reference.to_string(),
            authority: Some(authority.clone()),
        };
        self.send(pb::workspace_downlink::Msg::Open(open)).await?;
        let id = self.request_id.clone();
        let response = self
            .receive(|msg| match msg {
                Up::Open(o) if o.request_id == id => Some(o),
                _ => None,
            })
            .await?;
        match iop_proto::wire::closed_enum::<pb::WorkspaceOpenStatus>("open.status", response.status) {
            Ok(pb::WorkspaceOpenStatus::Opened) => response.effective.ok_or(WorkspaceError::Protocol),
            Ok(pb::WorkspaceOpenStatus::UnknownWorkspace) => Err(WorkspaceError::UnknownWorkspace),
            Ok(pb::WorkspaceOpenStatus::StaleGeneration) => Err(WorkspaceError::Fenced),
            Ok(pb::WorkspaceOpenStatus::AlreadyOpen) => Err(WorkspaceError::OpenRefused("already_open")),
            Ok(pb::WorkspaceOpenStatus::InvalidRequest) => Err(WorkspaceError::OpenRefused("invalid_request")),
            Ok(pb::WorkspaceOpenStatus::Failed) => Err(WorkspaceError::OpenRefused("open_failed")),
            Ok(pb::WorkspaceOpenStatus::Unspecified) | Err(_) => Err(WorkspaceError::Protocol),
        }
    }

    /// Runs one tool call and returns its typed answer. When `cancel` fires
    /// first, the node is told to cancel the call (a command's process group
    /// ends) and its answer, then cancelled, is still awaited.
    pub async fn tool(
        &mut self,
        stage_id: &str,
        tool_call_id: &str,
        op: pb::workspace_tool_request::Op,
        cancel: &CancellationToken,
    ) -> Result<pb::WorkspaceToolResponse, WorkspaceError> {
        let call = pb::WorkspaceToolRequest {
            request_id: self.request_id.clone(),
            stage_id: stage_id.to_string(),
            tool_call_id: tool_call_id.to_string(),
            op: Some(op),
        };
        self.send(pb::workspace_downlink::Msg::Tool(call)).await?;
        let (id, stage, tool) = (self.request_id.clone(), stage_id.to_string(), tool_call_id.to_string());
        let matches = |msg: Up| match msg {
            Up::Tool(t) if t.request_id == id && t.stage_id == stage && t.tool_call_id == tool => Some(t),
            _ => None,
        };
        tokio::select! {
            answer = self.receive(&matches) => return answer,
            _ = cancel.cancelled() => {}
        }
        let cancel = pb::WorkspaceCancelRequest { request_id: self.request_id.clone(), tool_call_id: tool.clone() };
        self.send(pb::workspace_downlink::Msg::Cancel(cancel)).await?;
        // The cancel's acknowledgement (before or after the answer) is
        // passed over by `receive`.
        self.receive(&matches).await
    }

    /// Ends the request: the node cancels what runs, removes the request's
    /// state, answers, and closes the call.
    pub async fn cleanup(mut self) -> Result<pb::WorkspaceCleanupResponse, WorkspaceError> {
        let cleanup = pb::WorkspaceCleanupRequest { request_id: self.request_id.clone() };
        self.send(pb::workspace_downlink::Msg::Cleanup(cleanup)).await?;
        let id = self.request_id.clone();
        self.receive(|msg| match msg {
            Up::Cleanup(c) if c.request_id == id => Some(c),
            _ => None,
        })
        .await
    }

    async fn send(&self, msg: pb::workspace_downlink::Msg) -> Result<(), WorkspaceError> {
        if self.fence.is_cancelled() {
            return Err(WorkspaceError::Fenced);
        }
        let message = Ok(pb::WorkspaceDownlink { msg: Some(msg) });
        tokio::select! {
            _ = self.fence.cancelled() => Err(WorkspaceError::Fenced),
            sent = self.downlink.send(message) => sent.map_err(|_| WorkspaceError::CallEnded),
        }
    }

    /// The next answer `pick` accepts; every other answer is dropped and
    /// counted (a stale or repeated identity). A cancel's acknowledgement
    /// carries nothing a caller waits for: the cancelled call's answer does.
    async fn receive<T>(&mut self, pick: impl Fn(Up) -> Option<T>) -> Result<T, WorkspaceError> {
        loop {
            let message = tokio::select! {
                biased;
                _ = self.fence.cancelled() => return Err(WorkspaceError::Fenced),
                message = self.uplink.recv() => message.ok_or(WorkspaceError::CallEnded)?,
            };
            let Some(msg) = message.msg else {
                self.metrics.reason(&self.metrics.workspace_dropped, "empty_message");
                continue;
            };
            if matches!(msg, Up::Cancel(_)) {
                continue;
            }
            match pick(msg) {
                Some(answer) => return Ok(answer),
                None => self.metrics.reason(&self.metrics.workspace_dropped, "unexpected_answer"),
            }
        }
    }
}

/// Removes a pending call that never attached.
struct Unregister<'a> {
    calls: &'a WorkspaceCalls,
    request_id: &'a str,
    armed: bool,
}

impl Drop for Unregister<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.calls.calls.lock().unwrap().remove(self.request_id);
        }
    }
}

#[cfg(test)]
mod tests;
