//! The workspace calls in flight: each request's call waiting for, or bound
//! to, its node's call (the owner [`crate::state::EdgeState`] holds; the
//! request's end is [`super::WorkspaceCall`]).

use std::collections::HashMap;
use std::sync::Mutex;

use iop_proto::pb;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::dispatch::AttachError;

/// Answers buffered from a node per workspace call.
const UPLINK_CAPACITY: usize = 4;

/// The Edge's end of an attached call.
pub(super) struct Attached {
    pub(super) downlink: mpsc::Sender<Result<pb::WorkspaceDownlink, tonic::Status>>,
    pub(super) uplink: mpsc::Receiver<pb::WorkspaceUplink>,
}

pub(super) struct Pending {
    pub(super) node: String,
    pub(super) generation: u64,
    pub(super) fence: CancellationToken,
    pub(super) attach: Option<oneshot::Sender<Attached>>,
}

/// Workspace calls waiting for, or bound to, their node's call.
#[derive(Default)]
pub struct WorkspaceCalls {
    pub(super) calls: Mutex<HashMap<String, Pending>>,
}

/// The gRPC service's end of an attached call.
pub struct AttachedCall {
    pub downlink: mpsc::Receiver<Result<pb::WorkspaceDownlink, tonic::Status>>,
    pub uplink: mpsc::Sender<pb::WorkspaceUplink>,
    pub fence: CancellationToken,
}

impl WorkspaceCalls {
    /// Binds a node's call for `request_id` (same node, same generation,
    /// once).
    pub fn attach(&self, request_id: &str, node: &str, generation: u64) -> Result<AttachedCall, AttachError> {
        let mut calls = self.calls.lock().unwrap();
        let pending = calls.get_mut(request_id).ok_or(AttachError::UnknownRun)?;
        if pending.node != node {
            return Err(AttachError::WrongNode);
        }
        if pending.generation != generation || pending.fence.is_cancelled() {
            return Err(AttachError::FencedGeneration);
        }
        let attach = pending.attach.take().ok_or(AttachError::AlreadyAttached)?;
        let (downlink_tx, downlink) = mpsc::channel(2);
        let (uplink, uplink_rx) = mpsc::channel(UPLINK_CAPACITY);
        attach.send(Attached { downlink: downlink_tx, uplink: uplink_rx }).map_err(|_| AttachError::UnknownRun)?;
        Ok(AttachedCall { downlink, uplink, fence: pending.fence.clone() })
    }

    /// Fences every call bound to `node`'s `generation`.
    pub fn fence_generation(&self, node: &str, generation: u64) -> usize {
        let mut calls = self.calls.lock().unwrap();
        let before = calls.len();
        calls.retain(|_, c| {
            let fenced = c.node == node && c.generation == generation;
            if fenced {
                c.fence.cancel();
            }
            !fenced
        });
        before - calls.len()
    }

    pub fn in_flight(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
}
