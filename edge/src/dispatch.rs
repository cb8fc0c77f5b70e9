//! Dispatch: hand a run (normalized run or provider tunnel) to the node that
//! owns its provider and give the caller an ordered stream of its frames
//! that always ends in exactly one terminal.
//!
//! `RunTable` maps id -> where its frames must come from (node and
//! connection generation) and where they go (a bounded channel to the HTTP
//! handler). Frames flow node -> `RunEvents`/`TunnelFrames` gRPC stream ->
//! channel -> `RunStream`. The channel is bounded, so a slow client pushes
//! back on its own HTTP/2 stream only. Runs and tunnels share this code
//! through [`NodeFrame`]; only their frame types differ.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use iop_proto::pb::{self, FailureKind};
use iop_proto::wire::WireError;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::admission::LeaseGuard;
use crate::core::lease::ReleaseReason;
use crate::core::outlier::{self, Verdict};
use crate::metrics::{EdgeMetrics, OutcomeLabels};
use crate::node::registry::ControlSender;
use crate::overlay::StallHandoff;
use crate::usage::Account;

/// Events buffered per run between the node stream and the client.
const RUN_CHANNEL_CAPACITY: usize = 32;
/// How long handing a run to a node's control stream may take.
const DISPATCH_SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a run the Edge stopped reading (its client left, the Edge
/// gave up) is still read for the usage its node reports on cancelling.
const DRAIN_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A frame type a node streams for one run: normalized `RunEvent`s or
/// `ProviderTunnelFrame`s.
pub trait NodeFrame: Send + 'static {
    /// The run's request: in its assignment when small, else the first
    /// message down the run's own call.
    type Request: prost::Message + Send + 'static;
    /// The frame's payload as the client side consumes it.
    type Item: Send;
    /// The control message that assigns run `id`, carrying `request` when it
    /// is small enough to ride the control stream (see [`inline`]).
    fn assign(id: String, request: Option<Self::Request>) -> pb::edge_to_node::Msg;
    fn seq(&self) -> u64;
    fn is_terminal(&self) -> bool;
    fn validate(&self) -> Result<(), WireError>;
    /// The payload of a validated frame.
    fn into_item(self) -> Self::Item;
    /// A synthetic terminal failure (transport loss, protocol violation).
    fn failed(kind: FailureKind, message: String) -> Self::Item;
    /// `Some` for terminal items.
    fn outcome(item: &Self::Item) -> Option<RunOutcome>;
    /// The failure a terminal item carries.
    fn failure_mut(item: &mut Self::Item) -> Option<&mut pb::ExecutionFailure>;
    /// A tunnel's provider response head.
    fn response_head(_item: &Self::Item) -> Option<&pb::TunnelResponseHead> {
        None
    }
    /// The provider's response body bytes a tunnel's item carries.
    fn body(_item: &Self::Item) -> Option<&[u8]> {
        None
    }
    /// The token usage an item reports (mutable: the Edge bounds it in
    /// place, `usage::Account::bound`).
    fn usage_mut(_item: &mut Self::Item) -> Option<&mut pb::Usage> {
        None
    }
    /// Bytes of answer an item carries (what bounds its run's output
    /// tokens: `usage::Bounds`).
    fn relayed(item: &Self::Item) -> usize;
    /// Whether an item only reports usage: noted, never yielded by
    /// [`RunStream::next`].
    fn accounting_only(_item: &Self::Item) -> bool {
        false
    }
}

impl NodeFrame for pb::RunEvent {
    type Request = pb::RunRequest;
    type Item = pb::run_event::Event;
    fn assign(run_id: String, request: Option<pb::RunRequest>) -> pb::edge_to_node::Msg {
        pb::edge_to_node::Msg::RunAssign(pb::RunAssign { run_id, request })
    }
    fn seq(&self) -> u64 {
        self.seq
    }
    fn is_terminal(&self) -> bool {
        pb::RunEvent::is_terminal(self)
    }
    fn validate(&self) -> Result<(), WireError> {
        pb::RunEvent::validate(self)
    }
    fn into_item(self) -> Self::Item {
        self.event.expect("validated")
    }
    fn failed(kind: FailureKind, message: String) -> Self::Item {
        pb::run_event::Event::Failed(pb::RunFailed { failure: Some(pb::ExecutionFailure::new(kind, message)) })
    }
    fn failure_mut(item: &mut Self::Item) -> Option<&mut pb::ExecutionFailure> {
        match item {
            pb::run_event::Event::Failed(f) => f.failure.as_mut(),
            _ => None,
        }
    }
    fn usage_mut(item: &mut Self::Item) -> Option<&mut pb::Usage> {
        match item {
            pb::run_event::Event::Usage(usage) => Some(usage),
            _ => None,
        }
    }
    fn relayed(item: &Self::Item) -> usize {
        use pb::run_event::Event;
        match item {
            Event::Text(t) => t.text.len(),
            Event::Reasoning(r) => r.text.len(),
            Event::ToolCall(c) => c.id.len() + c.name.len() + c.arguments_delta.len(),
            _ => 0,
        }
    }
    fn outcome(item: &Self::Item) -> Option<RunOutcome> {
        use pb::run_event::Event;
        match item {
            Event::Completed(_) => Some(RunOutcome::Completed),
            Event::Failed(f) => Some(RunOutcome::of_failure(f)),
            Event::Cancelled(_) => Some(RunOutcome::Cancelled),
            _ => None,
        }
    }
}

impl NodeFrame for pb::ProviderTunnelFrame {
    type Request = pb::ProviderTunnelRequest;
    type Item = pb::provider_tunnel_frame::Frame;
    fn assign(tunnel_id: String, request: Option<pb::ProviderTunnelRequest>) -> pb::edge_to_node::Msg {
        pb::edge_to_node::Msg::TunnelAssign(pb::TunnelAssign { tunnel_id, request })
    }
    fn seq(&self) -> u64 {
        self.seq
    }
    fn is_terminal(&self) -> bool {
        pb::ProviderTunnelFrame::is_terminal(self)
    }
    fn validate(&self) -> Result<(), WireError> {
        pb::ProviderTunnelFrame::validate(self)
    }
    fn into_item(self) -> Self::Item {
        self.frame.expect("validated")
    }
    fn failed(kind: FailureKind, message: String) -> Self::Item {
        pb::provider_tunnel_frame::Frame::Failed(pb::RunFailed {
            failure: Some(pb::ExecutionFailure::new(kind, message)),
        })
    }
    fn failure_mut(item: &mut Self::Item) -> Option<&mut pb::ExecutionFailure> {
        match item {
            pb::provider_tunnel_frame::Frame::Failed(f) => f.failure.as_mut(),
            _ => None,
        }
    }
    fn response_head(item: &Self::Item) -> Option<&pb::TunnelResponseHead> {
        match item {
            pb::provider_tunnel_frame::Frame::Head(h) => Some(h),
            _ => None,
        }
    }
    fn body(item: &Self::Item) -> Option<&[u8]> {
        match item {
            pb::provider_tunnel_frame::Frame::Body(bytes) => Some(bytes),
            _ => None,
        }
    }
    fn usage_mut(item: &mut Self::Item) -> Option<&mut pb::Usage> {
        match item {
            pb::provider_tunnel_frame::Frame::End(end) => end.usage.as_mut(),
            pb::provider_tunnel_frame::Frame::Usage(usage) => Some(usage),
            _ => None,
        }
    }
    fn accounting_only(item: &Self::Item) -> bool {
        matches!(item, pb::provider_tunnel_frame::Frame::Usage(_))
    }
    fn relayed(item: &Self::Item) -> usize {
        match item {
            pb::provider_tunnel_frame::Frame::Body(bytes) => bytes.len(),
            _ => 0,
        }
    }
    fn outcome(item: &Self::Item) -> Option<RunOutcome> {
        use pb::provider_tunnel_frame::Frame;
        match item {
            Frame::End(_) => Some(RunOutcome::Completed),
            Frame::Failed(f) => Some(RunOutcome::of_failure(f)),
            Frame::Cancelled(_) => Some(RunOutcome::Cancelled),
            Frame::Head(_) | Frame::Body(_) | Frame::Usage(_) => None,
        }
    }
}

/// How much of a provider's error answer is read to decide about it
/// (enough for its error object whole).
pub const ERROR_BODY_READ: usize = 64 * 1024;

/// The failure a tunnelled error response stands for: the one reading of
/// it, for the retry decision, the client's error and outlier ejection.
pub fn http_failure(head: &pb::TunnelResponseHead, body: &[impl AsRef<[u8]>]) -> pb::ExecutionFailure {
    // Enough of the body to read the provider's error object whole.
    let whole: Vec<u8> = body.iter().flat_map(|b| b.as_ref().iter().copied()).take(ERROR_BODY_READ).collect();
    let text = &whole[..whole.len().min(512)];
    let mut failure = pb::ExecutionFailure::new(
        FailureKind::ProviderHttpStatus,
        format!("provider answered HTTP {}: {}", head.status, String::from_utf8_lossy(text)),
    );
    failure.provider_status = head.status;
    failure.context_length_exceeded =
        u16::try_from(head.status).is_ok_and(|s| iop_proto::provider_error::context_length_exceeded(s, &whole));
    failure.provider_code =
        u16::try_from(head.status).ok().and_then(|s| iop_proto::provider_error::code(s, &whole)).unwrap_or_default();
    failure.retry_after_ms = head
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("retry-after"))
        .and_then(|h| iop_proto::provider_error::retry_after_ms(&h.value))
        .unwrap_or(0);
    failure
}

struct RunEntry<F: NodeFrame> {
    node: String,
    generation: u64,
    /// The run's request (unless its assignment carried it) and the sender
    /// of its events, both handed to the run's call when the node opens it
    /// (`None` once attached). The table keeps no clone of the sender: when
    /// that call ends, the channel closes and the `RunStream` sees the end at
    /// once (a call that ends without a terminal fails the run instead of
    /// hanging until the request deadline).
    unattached: Option<(Option<F::Request>, mpsc::Sender<F>)>,
    /// Cancelled when the run's connection generation is fenced.
    fence: CancellationToken,
}

/// Why frames on a `RunEvents` stream were not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    #[error("run is unknown or already finished")]
    UnknownRun,
    #[error("run belongs to another node")]
    WrongNode,
    #[error("run was assigned on another connection generation")]
    FencedGeneration,
    #[error("run already has an event stream")]
    AlreadyAttached,
}

impl AttachError {
    pub fn label(self) -> &'static str {
        match self {
            Self::UnknownRun => "unknown_run",
            Self::WrongNode => "wrong_node",
            Self::FencedGeneration => "fenced_generation",
            Self::AlreadyAttached => "already_attached",
        }
    }
}

/// The node side's handle on an attached run.
pub struct AttachedRun<F: NodeFrame> {
    /// The run's request, sent down its call first; `None` when its
    /// assignment carried it.
    pub request: Option<F::Request>,
    pub events: mpsc::Sender<F>,
    pub fence: CancellationToken,
}

pub struct RunTable<F: NodeFrame> {
    runs: Mutex<HashMap<String, RunEntry<F>>>,
    /// Set when the Edge shuts down: runs ending from then on release their
    /// lease as `edge_shutdown`.
    shutting_down: std::sync::atomic::AtomicBool,
}

impl<F: NodeFrame> Default for RunTable<F> {
    fn default() -> Self {
        Self { runs: Mutex::new(HashMap::new()), shutting_down: Default::default() }
    }
}

impl<F: NodeFrame> RunTable<F> {
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, std::sync::atomic::Ordering::Release);
    }

    fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl<F: NodeFrame> RunTable<F> {
    /// Binds a `RunEvents` stream opened by `node` on `generation` to its run.
    pub fn attach(&self, run_id: &str, node: &str, generation: u64) -> Result<AttachedRun<F>, AttachError> {
        let mut runs = self.runs.lock().unwrap();
        let entry = runs.get_mut(run_id).ok_or(AttachError::UnknownRun)?;
        if entry.node != node {
            return Err(AttachError::WrongNode);
        }
        if entry.generation != generation || entry.fence.is_cancelled() {
            return Err(AttachError::FencedGeneration);
        }
        let (request, events) = entry.unattached.take().ok_or(AttachError::AlreadyAttached)?;
        Ok(AttachedRun { request, events, fence: entry.fence.clone() })
    }

    /// Fences every run bound to `node`'s `generation`: their streams end with
    /// a transport failure and later frames for them are dropped.
    pub fn fence_generation(&self, node: &str, generation: u64) -> usize {
        let mut runs = self.runs.lock().unwrap();
        let mut fenced = 0;
        runs.retain(|_, e| {
            if e.node == node && e.generation == generation {
                e.fence.cancel();
                fenced += 1;
                false
            } else {
                true
            }
        });
        fenced
    }

    pub fn in_flight(&self) -> usize {
        self.runs.lock().unwrap().len()
    }

    fn remove(&self, run_id: &str) {
        self.runs.lock().unwrap().remove(run_id);
    }
}

/// Whether `request` rides its assignment on the control stream (at most
/// [`iop_proto::wire::MAX_INLINE_REQUEST_BYTES`] encoded). Pure.
pub fn inline<R: prost::Message>(request: &R) -> bool {
    request.encoded_len() <= iop_proto::wire::MAX_INLINE_REQUEST_BYTES
}

/// Starts a run under `lease`: sends the assignment (the lease's run id, and
/// `request` when it is small) to the node session behind `control` (which
/// must belong to the lease's node and generation); a larger request is kept
/// for the run's own call.
/// `account` is charged the run's usage when it ends (none for a run that
/// generates nothing, a token count).
#[allow(clippy::too_many_arguments)]
pub async fn start_run<F: NodeFrame>(
    table: &Arc<RunTable<F>>,
    metrics: &Arc<EdgeMetrics>,
    handoff: &Arc<StallHandoff>,
    lease: LeaseGuard,
    control: ControlSender,
    request: F::Request,
    account: Option<Account>,
) -> Result<RunStream<F>, pb::ExecutionFailure> {
    let run_id = lease.lease().run_id().to_string();
    let (events, rx) = mpsc::channel(RUN_CHANNEL_CAPACITY);
    let fence = CancellationToken::new();
    let (assigned, request) = if inline(&request) { (Some(request), None) } else { (None, Some(request)) };
    table.runs.lock().unwrap().insert(
        run_id.clone(),
        RunEntry {
            node: lease.lease().node().to_string(),
            generation: lease.lease().generation(),
            unattached: Some((request, events)),
            fence: fence.clone(),
        },
    );
    let mut stream = RunStream {
        run_id,
        rx,
        fence,
        table: table.clone(),
        metrics: metrics.clone(),
        control: control.clone(),
        handoff: handoff.clone(),
        lease,
        next_seq: 1,
        finished: false,
        response_head: None,
        error_body: Vec::new(),
        account,
        seen: Seen::default(),
    };
    let assign = pb::EdgeToNode { msg: Some(F::assign(stream.run_id.clone(), assigned)) };
    // Bounded: a node that stopped reading is about to be fenced anyway.
    let sent = tokio::time::timeout(DISPATCH_SEND_TIMEOUT, control.send(Ok(assign))).await;
    if !matches!(sent, Ok(Ok(()))) {
        stream.finish(RunOutcome::TransportLost);
        return Err(pb::ExecutionFailure::new(FailureKind::TransportLost, "node connection closed before dispatch"));
    }
    Ok(stream)
}

/// The client side of one run. Yields items in order and always ends with
/// exactly one terminal. Dropping it before the terminal cancels the run on
/// the node.
pub struct RunStream<F: NodeFrame> {
    run_id: String,
    rx: mpsc::Receiver<F>,
    fence: CancellationToken,
    table: Arc<RunTable<F>>,
    metrics: Arc<EdgeMetrics>,
    control: ControlSender,
    handoff: Arc<StallHandoff>,
    /// The provider slot this run holds; returned when the stream ends.
    lease: LeaseGuard,
    next_seq: u64,
    /// The run's outcome is settled (its terminal came, or the Edge gave up).
    finished: bool,
    /// A tunnel's provider response head, once it arrived.
    response_head: Option<pb::TunnelResponseHead>,
    /// The start of a tunnel's error answer (a status other than 2xx), to
    /// classify it ([`ERROR_BODY_READ`] bytes at most).
    error_body: Vec<u8>,
    /// Charged when the run's terminal comes, or by its [`Drain`] (taken
    /// once charged).
    account: Option<Account>,
    seen: Seen,
}

/// What a run reported and relayed so far: its charge when it ends.
#[derive(Debug, Default)]
struct Seen {
    /// The last usage the node reported.
    usage: Option<pb::Usage>,
    /// Bytes of answer relayed.
    relayed: u64,
}

impl Seen {
    /// Notes `item` of the run on `node`; a usage it reports is first
    /// bounded by `account` (so the client, the ledger and the limits all
    /// see the bounded figures).
    fn note<F: NodeFrame>(&mut self, item: &mut F::Item, account: Option<&Account>, node: &str) {
        self.relayed += F::relayed(item) as u64;
        if let Some(usage) = F::usage_mut(item) {
            if let Some(account) = account {
                account.bound(node, usage, self.relayed);
            }
            self.usage = Some(*usage);
        }
    }
}

impl<F: NodeFrame> RunStream<F> {
    pub fn lease(&self) -> &crate::core::lease::Lease {
        self.lease.lease()
    }

    /// The run failed before the first byte and the request moves to another
    /// attempt: its slot is released as `retried`.
    pub fn mark_retried(&mut self) {
        self.lease.set_reason(ReleaseReason::Retried);
    }

    pub async fn next(&mut self) -> Option<F::Item> {
        loop {
            let item = self.next_frame().await?;
            if !F::accounting_only(&item) {
                return Some(item);
            }
        }
    }

    /// The next item, accounting-only ones included.
    async fn next_frame(&mut self) -> Option<F::Item> {
        if self.finished {
            return None;
        }
        let mut item = tokio::select! {
            biased;
            received = self.rx.recv() => match received {
                Some(frame) if frame.seq() == self.next_seq => {
                    self.next_seq += 1;
                    match frame.validate() {
                        Ok(()) => frame.into_item(),
                        Err(e) => F::failed(FailureKind::ProviderProtocol, format!("node sent an invalid frame: {e}")),
                    }
                }
                Some(frame) => F::failed(
                    FailureKind::ProviderProtocol,
                    format!("node sent frame {} where {} was expected", frame.seq(), self.next_seq),
                ),
                None => F::failed(FailureKind::TransportLost, "node stream ended before a terminal frame".into()),
            },
            _ = self.fence.cancelled() => F::failed(FailureKind::TransportLost, "node connection closed during the run".into()),
        };
        if let Some(failure) = F::failure_mut(&mut item) {
            // Stall evidence from this run's own reception stream.
            self.handoff.apply(self.lease.lease(), failure);
        }
        if let Some(head) = F::response_head(&item) {
            self.response_head = Some(head.clone());
        }
        if let Some(bytes) = F::body(&item)
            && self.response_head.as_ref().is_some_and(|h| !(200..300).contains(&h.status))
        {
            let room = ERROR_BODY_READ.saturating_sub(self.error_body.len());
            self.error_body.extend_from_slice(&bytes[..bytes.len().min(room)]);
        }
        self.seen.note::<F>(&mut item, self.account.as_ref(), self.lease.lease().node());
        if let Some(outcome) = F::outcome(&item) {
            if let Some(account) = self.account.take() {
                account.charge(self.seen.usage.as_ref(), self.seen.relayed);
            }
            // Every generation's end, before or after the commit, passes
            // here once: the one place outlier ejection learns outcomes.
            // (A run the Edge gives up on itself, `stop`, says nothing
            // about the provider: its deadline, its answer's size, or a
            // node that went quiet.)
            let verdict = match outcome {
                // A tunnel's error answer is read as the gate reads it.
                RunOutcome::Completed => match &self.response_head {
                    Some(head) if !(200..300).contains(&head.status) => {
                        outlier::verdict(Some(&http_failure(head, &[&self.error_body])), None)
                    }
                    head => outlier::verdict(None, head.as_ref().map(|h| h.status)),
                },
                RunOutcome::Failed | RunOutcome::TransportLost => {
                    F::failure_mut(&mut item).map_or(Verdict::Neutral, |f| outlier::verdict(Some(f), None))
                }
                RunOutcome::Cancelled | RunOutcome::ClientDisconnected => Verdict::Neutral,
            };
            self.lease.record_generation(verdict);
            self.finish(outcome);
        }
        Some(item)
    }

    /// The Edge gives up on the run before its terminal (e.g. its answer grew
    /// past `limits.max_response_bytes`): the node is told to stop and the
    /// slot is released as `reason`.
    pub fn stop(&mut self, reason: ReleaseReason) {
        if self.finished {
            return;
        }
        self.send_cancel();
        self.finish(RunOutcome::Failed);
        self.lease.set_reason(reason);
    }

    fn send_cancel(&self) {
        let cancel = pb::EdgeToNode {
            msg: Some(pb::edge_to_node::Msg::Cancel(pb::Cancel {
                run_id: self.run_id.clone(),
                reason: pb::CancelReason::ClientDisconnected.into(),
            })),
        };
        let _ = self.control.try_send(Ok(cancel));
    }

    fn finish(&mut self, outcome: RunOutcome) {
        self.finished = true;
        let reason = match outcome {
            RunOutcome::Completed => ReleaseReason::Completed,
            _ if self.table.is_shutting_down() => ReleaseReason::EdgeShutdown,
            other => other.release_reason(),
        };
        self.lease.set_reason(reason);
        self.table.remove(&self.run_id);
        self.metrics.runs.get_or_create(&OutcomeLabels { outcome: outcome.label() }).inc();
    }
}

impl<F: NodeFrame> Drop for RunStream<F> {
    fn drop(&mut self) {
        if !self.finished {
            // The client went away (or the handler gave up) before a
            // terminal: tell the node to stop.
            self.send_cancel();
            self.finish(RunOutcome::ClientDisconnected);
        }
        let Some(account) = self.account.take() else { return };
        // The node reports what the run used when it cancels: read on
        // until its terminal (bounded) to charge it.
        let drain = Drain {
            rx: std::mem::replace(&mut self.rx, mpsc::channel(1).1),
            fence: self.fence.clone(),
            next_seq: self.next_seq,
            seen: std::mem::take(&mut self.seen),
            node: self.lease.lease().node().to_string(),
            account,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(drain.run())),
            Err(_) => drain.charge(),
        }
    }
}

/// The rest of a run nobody reads any more, read until its terminal, its
/// connection's fence, or [`DRAIN_WAIT`], for its charge. The run's call
/// stays open meanwhile (closing it would stop the node's report).
struct Drain<F: NodeFrame> {
    rx: mpsc::Receiver<F>,
    fence: CancellationToken,
    next_seq: u64,
    seen: Seen,
    node: String,
    account: Account,
}

impl<F: NodeFrame> Drain<F> {
    async fn run(mut self) {
        let deadline = tokio::time::Instant::now() + DRAIN_WAIT;
        loop {
            let frame = tokio::select! {
                frame = self.rx.recv() => frame,
                _ = self.fence.cancelled() => None,
                _ = tokio::time::sleep_until(deadline) => None,
            };
            // Out of order or invalid: the run's report cannot be trusted.
            let Some(frame) = frame.filter(|f| f.seq() == self.next_seq && f.validate().is_ok()) else { break };
            self.next_seq += 1;
            let terminal = frame.is_terminal();
            self.seen.note::<F>(&mut frame.into_item(), Some(&self.account), &self.node);
            if terminal {
                break;
            }
        }
        self.charge();
    }

    fn charge(self) {
        self.account.charge(self.seen.usage.as_ref(), self.seen.relayed);
    }
}

/// How a run ended, as far as the Edge is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    Completed,
    Failed,
    TransportLost,
    Cancelled,
    ClientDisconnected,
}

impl RunOutcome {
    fn of_failure(failed: &pb::RunFailed) -> Self {
        match failed.failure.as_ref().map(|f| f.kind()) {
            Some(FailureKind::TransportLost) => Self::TransportLost,
            _ => Self::Failed,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::TransportLost => "transport_lost",
            Self::Cancelled => "cancelled",
            Self::ClientDisconnected => "client_disconnected",
        }
    }

    fn release_reason(self) -> ReleaseReason {
        match self {
            Self::Completed => ReleaseReason::Completed,
            Self::Failed => ReleaseReason::ProviderError,
            Self::TransportLost => ReleaseReason::NodeDisconnected,
            Self::Cancelled | Self::ClientDisconnected => ReleaseReason::ClientDisconnected,
        }
    }
}

#[cfg(test)]
mod tests;
