//! What runs and tunnels share. Both are executions bound to the session that
//! assigned them (one id space): validated against the assigned providers,
//! given their own call to the Edge (the node's first frame names the
//! execution and its generation; the request came with the assignment when
//! small, else the Edge answers the call with it; later frames are numbered
//! from seq 1, exactly one terminal ends it), and ended
//! early by a `Cancel`, by the Edge ending the call, or by the session ending.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use iop_proto::pb::{self, node_gateway_client::NodeGatewayClient};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::adapters::Map;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::adapter::ProviderTarget;
use crate::adapter::Providers;
use crate::adapter::probe::probe;
use crate::lease::SessionLeases;
use crate::liveness::{self, FirstByte, Missed, Progress, StallWatchdog};
use crate::metrics::ExecutionKind;

pub mod handles;

use handles::{Cancel, Observer};

pub use iop_proto::liveness::MAX_RESPONSE_STALL_TIMEOUT_MS;
/// Frames buffered toward the Edge per execution; beyond this the HTTP/2
/// stream's own flow control pushes back on this execution only.
pub(crate) const UPLINK_CAPACITY: usize = 16;
/// How long to wait for the Edge to acknowledge a finished execution's stream.
const ACK_WAIT: Duration = Duration::from_secs(5);
/// How long the Edge may take to answer an execution's call with its request
/// (it sends it as soon as the call arrives; a large prompt takes transfer
/// time, bounded by the Edge's body limit).
const REQUEST_WAIT: Duration = Duration::from_secs(120);

/// What an execution needs from its session.
pub struct ExecutionContext {
    pub client: NodeGatewayClient<Channel>,
    pub http: reqwest::Client,
    pub providers: Arc<Providers>,
    pub generation: u64,
    pub observer: Observer,
    /// The connection's lease key; `None` only on paths bound to no
    /// connection (there, a provider with a managed credential is refused).
    pub leases: Option<Arc<SessionLeases>>,
    /// Provider capacity across all of the node's sessions.
    pub admission: crate::capacity::LocalAdmission,
    /// Where the execution's `provider call` span goes (`crate::trace`).
    pub tracer: iop_telemetry::Tracer,
}

// ------------------------------------------------------------ validation

/// The fields of a run or tunnel request that name its provider.
#[derive(Debug, Clone, Copy)]
pub struct Assigned<'r> {
    pub provider_id: &'r str,
    /// Wire `AdapterKind`.
    pub adapter: i32,
    pub target_model: &'r str,
    pub response_stall_timeout_ms: u64,
    pub first_byte_timeout_ms: u64,
}

impl<'r> From<&'r pb::RunRequest> for Assigned<'r> {
    fn from(r: &'r pb::RunRequest) -> Self {
        Self {
            provider_id: &r.provider_id,
            adapter: r.adapter,
            target_model: &r.target_model,
            response_stall_timeout_ms: r.response_stall_timeout_ms,
            first_byte_timeout_ms: r.first_byte_timeout_ms,
        }
    }
}

impl<'r> From<&'r pb::ProviderTunnelRequest> for Assigned<'r> {
    fn from(r: &'r pb::ProviderTunnelRequest) -> Self {
        Self {
            provider_id: &r.provider_id,
            adapter: r.adapter,
            target_model: &r.target_model,
            response_stall_timeout_ms: r.response_stall_timeout_ms,
            first_byte_timeout_ms: r.first_byte_timeout_ms,
        }
    }
}

/// Why a run or tunnel is refused before any provider call. Every message is
/// safe to put on the wire (no payload, no path or header values).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("provider `{0}` is not assigned to this node")]
    UnknownProvider(String),
    #[error("provider `{0}` has an invalid assignment")]
    InvalidAssignment(String),
    #[error("request does not match the provider's adapter or target")]
    TargetMismatch,
    #[error("{}", iop_proto::liveness::StallTimeoutOutOfRange(*.0))]
    InvalidStallTimeout(u64),
    #[error("{}", iop_proto::liveness::FirstByteTimeoutOutOfRange(*.0))]
    InvalidFirstByteTimeout(u64),
    /// Tunnels only: the HTTP method is not GET or POST.
    #[error("method `{0}` is not relayed (GET or POST only)")]
    UnsupportedMethod(String),
    /// Tunnels only: the path could leave the provider's base URL.
    #[error("path is not relayed: {0}")]
    InvalidPath(&'static str),
    /// Tunnels only: a header the provider request cannot carry.
    #[error("header `{0}` is not a valid HTTP header")]
    InvalidHeader(String),
}

impl Rejection {
    pub fn to_failure(&self) -> pb::ExecutionFailure {
        pb::ExecutionFailure::new(pb::FailureKind::InvalidRequest, self.to_string())
    }
}

/// The effective liveness timeouts of one execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Response-stall timeout (wire 0 means the 300 s default, or the
    /// provider's learned one: `crate::pace`).
    pub stall: Duration,
    /// The request left the stall timeout to the node (wire 0).
    pub stall_default: bool,
    /// First-byte timeout (wire 0 means the 60 s default).
    pub first_byte: Duration,
}

/// Checks a request against the assigned providers; returns its target and
/// its effective timeouts.
pub fn validate<'a>(
    providers: &'a Providers,
    request: Assigned<'_>,
) -> Result<(&'a ProviderTarget, Timeouts), Rejection> {
    let target = match providers.get(request.provider_id) {
        None => return Err(Rejection::UnknownProvider(request.provider_id.to_owned())),
        Some(Err(_)) => return Err(Rejection::InvalidAssignment(request.provider_id.to_owned())),
        Some(Ok(target)) => target,
    };
    if request.adapter != i32::from(target.adapter.to_wire()) || request.target_model != target.target_model {
        return Err(Rejection::TargetMismatch);
    }
    // The same rule as the Edge config's.
    let stall = iop_proto::liveness::response_stall_timeout(request.response_stall_timeout_ms)
        .map_err(|e| Rejection::InvalidStallTimeout(e.0))?;
    let first_byte = iop_proto::liveness::first_byte_timeout(request.first_byte_timeout_ms)
        .map_err(|e| Rejection::InvalidFirstByteTimeout(e.0))?;
    Ok((target, Timeouts { stall, stall_default: request.response_stall_timeout_ms == 0, first_byte }))
}

// ---------------------------------------------------------------- uplink

/// One frame type of a per-execution call (`RunUplink`, `TunnelUplink`).
pub(crate) trait UplinkFrame: std::fmt::Debug + Send + 'static {
    /// What the producer emits; the uplink adds the seq.
    type Item: Send + 'static;
    fn open(id: &str, generation: u64) -> Self;
    fn numbered(seq: u64, item: Self::Item) -> Self;
    /// Appends `next` to `pending` when both are pieces of one content
    /// stream (see [`Coalescer`]) and gives back `None`; otherwise gives
    /// `next` back untouched.
    fn merge(pending: &mut Self::Item, next: Self::Item) -> Option<Self::Item> {
        let _ = pending;
        Some(next)
    }
    /// Notes what the span learns from an item going up (`crate::trace`).
    fn observe(item: &Self::Item);
    /// Whether an item is a piece of the answer itself (ends the
    /// first-token deadline), not headers or metadata.
    fn is_content(item: &Self::Item) -> bool;
    /// What the execution is charged by, kept by its [`Uplink`].
    type Meter: Default + Send;
    /// Counts `item` as the provider produced it (before any coalescing).
    fn meter(meter: &mut Self::Meter, item: &Self::Item);
}

impl UplinkFrame for pb::RunUplink {
    type Item = pb::run_event::Event;
    type Meter = crate::usage::RunMeter;

    fn meter(meter: &mut Self::Meter, event: &Self::Item) {
        meter.observe(event);
    }

    fn is_content(event: &Self::Item) -> bool {
        use pb::run_event::Event;
        matches!(event, Event::Text(_) | Event::Reasoning(_) | Event::ToolCall(_) | Event::Embeddings(_))
    }

    fn open(id: &str, generation: u64) -> Self {
        Self { frame: Some(pb::run_uplink::Frame::Open(pb::RunOpen { run_id: id.to_owned(), generation })) }
    }

    fn numbered(seq: u64, event: Self::Item) -> Self {
        Self { frame: Some(pb::run_uplink::Frame::Event(pb::RunEvent { seq, event: Some(event) })) }
    }

    fn observe(event: &Self::Item) {
        use pb::run_event::Event;
        match event {
            Event::Usage(usage) => crate::trace::note_usage(usage),
            Event::Failed(pb::RunFailed { failure: Some(failure) }) => crate::trace::note_failure(failure),
            _ => {}
        }
    }

    /// Consecutive text deltas; argument deltas of the same tool call (a
    /// later delta names no new id or name). Bounded by [`COALESCE_BYTES`].
    fn merge(pending: &mut Self::Item, next: Self::Item) -> Option<Self::Item> {
        use pb::run_event::Event;
        match (pending, next) {
            (Event::Text(held), Event::Text(more)) if held.text.len() < COALESCE_BYTES => {
                held.text.push_str(&more.text);
                None
            }
            (Event::ToolCall(held), Event::ToolCall(more))
                if held.index == more.index
                    && more.id.is_empty()
                    && more.name.is_empty()
                    && held.arguments_delta.len() < COALESCE_BYTES =>
            {
                held.arguments_delta.push_str(&more.arguments_delta);
                None
            }
            (_, next) => Some(next),
        }
    }
}

impl UplinkFrame for pb::TunnelUplink {
    type Item = pb::provider_tunnel_frame::Frame;
    type Meter = ();

    fn meter((): &mut (), _frame: &Self::Item) {}

    /// A body chunk (for a stream, its first events).
    fn is_content(frame: &Self::Item) -> bool {
        matches!(frame, pb::provider_tunnel_frame::Frame::Body(_))
    }

    fn open(id: &str, generation: u64) -> Self {
        Self { msg: Some(pb::tunnel_uplink::Msg::Open(pb::TunnelOpen { tunnel_id: id.to_owned(), generation })) }
    }

    fn numbered(seq: u64, frame: Self::Item) -> Self {
        Self { msg: Some(pb::tunnel_uplink::Msg::Frame(pb::ProviderTunnelFrame { seq, frame: Some(frame) })) }
    }

    fn observe(frame: &Self::Item) {
        use pb::provider_tunnel_frame::Frame;
        match frame {
            Frame::End(pb::TunnelEnd { usage: Some(usage) }) => crate::trace::note_usage(usage),
            Frame::Failed(pb::RunFailed { failure: Some(failure) }) => crate::trace::note_failure(failure),
            _ => {}
        }
    }
}

/// Numbers frames (seq 1, 2, ...) and sends them up the execution's call.
/// Frames are boxed in the channel: a tokio mpsc allocates a block of 32
/// slots up front, and with the ~110-byte frame inline that block was
/// about 3.5 KiB of every open execution (`cargo bench --bench overhead`).
pub(crate) struct Uplink<U: UplinkFrame> {
    tx: mpsc::Sender<Box<U>>,
    seq: u64,
    meter: U::Meter,
}

impl<U: UplinkFrame> Uplink<U> {
    pub(crate) fn new(tx: mpsc::Sender<Box<U>>) -> Self {
        Self { tx, seq: 0, meter: U::Meter::default() }
    }

    /// Counts an item the provider produced, sent or not.
    fn count(&mut self, item: &U::Item) {
        U::meter(&mut self.meter, item);
    }

    /// What the execution relayed so far.
    pub(crate) fn meter(&self) -> &U::Meter {
        &self.meter
    }

    /// False when the call is gone (the Edge ended it).
    pub(crate) async fn send(&mut self, item: U::Item) -> bool {
        U::observe(&item);
        self.seq += 1;
        self.tx.send(Box::new(U::numbered(self.seq, item))).await.is_ok()
    }

    /// `send`, abandoned when `cancel` fires first (the Edge may have stopped
    /// reading while keeping the call open).
    pub(crate) async fn send_unless_cancelled(&mut self, item: U::Item, cancel: &Cancel) -> Option<bool> {
        tokio::select! {
            sent = self.send(item) => Some(sent),
            _ = cancel.cancelled() => None,
        }
    }
}

/// Up to this much text (or tool-call arguments) is merged into one frame
/// for a client that does not stream.
pub(crate) const COALESCE_BYTES: usize = 16 * 1024;

/// Holds back the last item for a client that only wants the final answer,
/// so that deltas it would only concatenate cross the wire as one frame
/// (about one frame per [`COALESCE_BYTES`] of content instead of one per
/// provider chunk). It sits after the stall watchdog: every provider chunk
/// still counts as progress. With `enabled` false every item passes at once.
pub(crate) struct Coalescer<T> {
    enabled: bool,
    pending: Option<T>,
}

impl<T> Coalescer<T> {
    pub(crate) fn new(enabled: bool) -> Self {
        Self { enabled, pending: None }
    }

    /// Takes `item`; returns what is ready to send.
    pub(crate) fn push<U: UplinkFrame<Item = T>>(&mut self, item: T) -> Option<T> {
        if !self.enabled {
            return Some(item);
        }
        let Some(pending) = &mut self.pending else {
            self.pending = Some(item);
            return None;
        };
        let next = U::merge(pending, item)?;
        self.pending.replace(next)
    }

    /// What is held back, once no more items will come.
    pub(crate) fn flush(&mut self) -> Option<T> {
        self.pending.take()
    }
}

/// The answer of a per-execution call (`RunDownlink`, `TunnelDownlink`).
pub(crate) trait DownlinkMessage: Send + 'static {
    type Request: Send + 'static;
    fn into_request(self) -> Option<Self::Request>;
    /// The execution id the request names.
    fn id(request: &Self::Request) -> &str;
}

impl DownlinkMessage for pb::RunDownlink {
    type Request = pb::RunRequest;
    fn into_request(self) -> Option<pb::RunRequest> {
        self.msg.map(|pb::run_downlink::Msg::Request(r)| r)
    }
    fn id(request: &pb::RunRequest) -> &str {
        &request.run_id
    }
}

impl DownlinkMessage for pb::TunnelDownlink {
    type Request = pb::ProviderTunnelRequest;
    fn into_request(self) -> Option<pb::ProviderTunnelRequest> {
        self.msg.map(|pb::tunnel_downlink::Msg::Request(r)| r)
    }
    fn id(request: &pb::ProviderTunnelRequest) -> &str {
        &request.tunnel_id
    }
}

/// A per-execution call; it completes when the Edge answers with the
/// response head of its downlink. Awaited in place, not spawned: once its
/// request head is out, hyper's connection task streams the uplink frames
/// whether or not anything polls this future.
pub(crate) type Call<D> =
    std::pin::Pin<Box<dyn Future<Output = Result<tonic::Response<tonic::Streaming<D>>, tonic::Status>> + Send>>;

/// Opens an execution's call: queues the open frame and starts `start` on
/// the frame stream.
pub(crate) fn open<U, D, F, Fut>(id: &str, generation: u64, start: F) -> (Uplink<U>, Call<D>)
where
    U: UplinkFrame,
    D: DownlinkMessage,
    F: FnOnce(UplinkStream<U>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<tonic::Streaming<D>>, tonic::Status>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(UPLINK_CAPACITY);
    tx.try_send(Box::new(U::open(id, generation))).expect("a fresh uplink has room for its open frame");
    let unbox: fn(Box<U>) -> U = |frame| *frame;
    (Uplink::new(tx), Box::pin(start(ReceiverStream::new(rx).map(unbox))))
}

/// The frames of an execution's call as tonic sends them.
pub(crate) type UplinkStream<U> = Map<ReceiverStream<Box<U>>, fn(Box<U>) -> U>;

/// The request of execution `id` and the Edge's side of its call: the
/// request its assignment carried (`assigned`), or else the Edge's answer to
/// the call. `None` (logged) when the Edge refused the call, the request did
/// not come within [`REQUEST_WAIT`], it named another execution, or `cancel`
/// fired. The execution then ends without frames; the Edge sees its call end.
pub(crate) async fn request<D: DownlinkMessage>(
    assigned: Option<D::Request>,
    call: Call<D>,
    cancel: &Cancel,
    what: &'static str,
    id: &str,
) -> Option<(D::Request, Downlink<D>)> {
    let outcome = match assigned {
        // The call is answered later, while the provider already works.
        Some(request) => Ok(Some((request, Downlink::Pending(call)))),
        None => {
            let received = async {
                let mut downlink = call.await.ok()?.into_inner();
                let request = downlink.message().await.ok()??.into_request()?;
                Some((request, Downlink::Open(Box::new(downlink))))
            };
            tokio::select! {
                received = tokio::time::timeout(REQUEST_WAIT, received) => received,
                _ = cancel.cancelled() => return None,
            }
        }
    };
    match outcome {
        Ok(Some((request, downlink))) if D::id(&request) == id => Some((request, downlink)),
        Ok(Some(_)) => {
            tracing::warn!(id, "{what} answered with another execution's request");
            None
        }
        Ok(None) => {
            tracing::debug!(id, "{what} call refused before its request");
            None
        }
        Err(_) => {
            tracing::warn!(id, "{what} request did not arrive in time");
            None
        }
    }
}

/// The Edge's side of an execution's call.
pub(crate) enum Downlink<D> {
    /// Not answered yet (the request came with the assignment).
    Pending(Call<D>),
    Open(Box<tonic::Streaming<D>>),
    /// The Edge refused the call or ended its answer.
    Ended,
}

impl<D: DownlinkMessage> Downlink<D> {
    /// Resolves when the Edge ends the call (it sends nothing after the
    /// request), or refuses it.
    pub(crate) async fn ended(&mut self) {
        if let Downlink::Pending(call) = self {
            *self = match call.await {
                Ok(response) => Downlink::Open(Box::new(response.into_inner())),
                Err(status) => {
                    tracing::debug!(code = ?status.code(), "execution call refused");
                    Downlink::Ended
                }
            };
        }
        if let Downlink::Open(stream) = self {
            while let Ok(Some(_)) = stream.message().await {}
        }
        *self = Downlink::Ended;
    }
}

/// Closes the uplink and waits (bounded) for the Edge to end the call.
pub(crate) async fn await_ack<U: UplinkFrame, D: DownlinkMessage>(
    uplink: Uplink<U>,
    mut downlink: Downlink<D>,
    what: &'static str,
    id: &str,
) {
    drop(uplink);
    if tokio::time::timeout(ACK_WAIT, downlink.ended()).await.is_err() {
        tracing::debug!(id, "{what} stream not acknowledged");
    }
}

/// The provider side of an execution (adapter or relay), polled in place by
/// [`forward`] rather than spawned: no task, no cross-thread wake-up and no
/// clone of the request per run. Dropping it drops the provider request, so
/// closing it is immediate.
pub(crate) struct Producer<'a, T>(std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>>);

impl<'a, T> Producer<'a, T> {
    pub(crate) fn new(work: impl Future<Output = T> + Send + 'a) -> Self {
        Self(Box::pin(work))
    }

    /// Tears the provider request down.
    pub(crate) async fn close(self) {
        drop(self);
    }
}

/// How [`forward`] ended.
pub(crate) enum Driven<'a, T> {
    /// The producer finished; everything it emitted was forwarded.
    Finished(T),
    Cancelled,
    /// The Edge ended the call (client gone or generation fenced).
    EdgeGone,
    /// The provider was silent for the response-stall timeout. The producer
    /// is handed back so its close can be confirmed within the close grace.
    Stalled {
        silent_for: Duration,
        /// Which deadline it was.
        missed: Missed,
        producer: Producer<'a, T>,
    },
}

/// Polls `producer` while forwarding the items it puts into `items` (through
/// `coalescer`), until it finishes, `cancel` fires, `edge_gone` resolves, or
/// `watchdog` claims a stall. Cancellation and the Edge ending the call take
/// precedence over a simultaneous stall. Items emitted before the producer's
/// result are forwarded first; items after a stall claim, and an item the
/// coalescer still holds then, are dropped (the run fails; a client that does
/// not stream never sees a failed attempt's content).
/// Time spent waiting on our own uplink (client backpressure) is not
/// provider silence.
// Each argument is one of the loop's independent inputs; bundling them
// would only rename them.
#[allow(clippy::too_many_arguments)]
async fn forward<'a, U: UplinkFrame, T>(
    producer: Producer<'a, T>,
    items: &mut mpsc::Receiver<U::Item>,
    uplink: &mut Uplink<U>,
    cancel: &Cancel,
    edge_gone: impl Future<Output = ()>,
    (watchdog, first_byte): (&mut StallWatchdog, &FirstByte),
    coalescer: &mut Coalescer<U::Item>,
    fenced: impl Fn(),
) -> Driven<'a, T> {
    let mut producer = producer;
    tokio::pin!(edge_gone);
    loop {
        let deadline = watchdog.deadline().unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return Driven::Cancelled,
            _ = &mut edge_gone => return Driven::EdgeGone,
            Some(item) = items.recv() => {
                uplink.count(&item);
                let now = tokio::time::Instant::now();
                if watchdog.progress(now) == Progress::Fenced {
                    fenced();
                    continue;
                }
                if U::is_content(&item) {
                    watchdog.content(now);
                }
                let Some(item) = coalescer.push::<U>(item) else { continue };
                match uplink.send_unless_cancelled(item, cancel).await {
                    None => return Driven::Cancelled,
                    Some(false) => return Driven::EdgeGone,
                    Some(true) => {
                        watchdog.progress(tokio::time::Instant::now());
                    }
                }
            }
            result = &mut producer.0 => {
                let mut rest = Vec::new();
                while let Ok(item) = items.try_recv() {
                    uplink.count(&item);
                    rest.extend(coalescer.push::<U>(item));
                }
                rest.extend(coalescer.flush());
                for item in rest {
                    match uplink.send_unless_cancelled(item, cancel).await {
                        None => return Driven::Cancelled,
                        Some(false) => return Driven::EdgeGone,
                        Some(true) => {}
                    }
                }
                watchdog.finish();
                return Driven::Finished(result);
            }
            _ = tokio::time::sleep_until(deadline) => {
                if first_byte.arrived() {
                    watchdog.first_byte();
                }
                if let Some(silent_for) = watchdog.claim(tokio::time::Instant::now()) {
                    while items.try_recv().is_ok() {
                        fenced();
                    }
                    let missed = watchdog.missed().unwrap_or(Missed::Stall);
                    return Driven::Stalled { silent_for, missed, producer };
                }
            }
        }
    }
}

/// How an execution ended once provider errors became wire failures.
pub(crate) enum Settled<T> {
    Finished(Result<T, pb::ExecutionFailure>),
    Cancelled,
    /// The Edge ended the call: no terminal is sent.
    EdgeGone,
}

/// The provider an execution drives, and where its observations go.
pub(crate) struct Watched<'a> {
    pub http: &'a reqwest::Client,
    pub target: &'a ProviderTarget,
    pub timeouts: Timeouts,
    /// Marked when the provider's response headers arrive (runs: by the
    /// adapter, inside [`FirstByte::scope`]); a tunnel's head frame is
    /// progress anyway.
    pub first_byte: FirstByte,
    pub observer: &'a Observer,
    pub kind: ExecutionKind,
    /// The prompt's size in tokens (estimated), for its first-token deadline.
    pub prompt_tokens: u64,
}

/// [`forward`] under a fresh [`StallWatchdog`], then settles the outcome the
/// same way for runs and tunnels: an adapter error becomes its wire failure
/// (an unreachable provider is probed for evidence), a stall becomes the
/// single `response_stalled` failure with its joined evidence.
pub(crate) async fn drive<U: UplinkFrame, T>(
    producer: Producer<'_, Result<T, crate::adapter::AdapterError>>,
    items: &mut mpsc::Receiver<U::Item>,
    uplink: &mut Uplink<U>,
    cancel: &Cancel,
    edge_gone: impl Future<Output = ()>,
    watched: Watched<'_>,
    coalesce: bool,
) -> Settled<T> {
    let Watched { http, target, timeouts, first_byte, observer, kind, prompt_tokens } = watched;
    let cold = observer.residency.as_ref().is_some_and(|r| r.cold(&target.provider_id));
    let started = tokio::time::Instant::now();
    // The deadlines this provider's pace asks for (`crate::pace`).
    let paces = crate::pace::PaceMemory::global();
    let (pace, profile) = (paces.get(&target.provider_id), paces.profile());
    let load = if cold { crate::residency::LoadMemory::global().last(&target.target_model).ms } else { 0 };
    let first_token = pace.first_token_deadline(prompt_tokens, Duration::from_millis(load), &profile);
    let stall = match timeouts.stall_default {
        true => pace.stall_deadline(timeouts.stall, &profile).unwrap_or(timeouts.stall),
        false => timeouts.stall,
    };
    let mut watchdog =
        StallWatchdog::new(stall, started).with_first_byte(timeouts.first_byte).with_first_token(first_token);
    let settled = drive_watched(
        producer,
        items,
        uplink,
        cancel,
        edge_gone,
        (http, target, &mut watchdog, &first_byte, observer, kind),
        coalesce,
    )
    .await;
    // A finished answer teaches the provider's pace.
    if let (Settled::Finished(Ok(_)), (Some(first), longest_gap)) = (&settled, watchdog.pace()) {
        paces.update(&target.provider_id, |pace| {
            pace.record_first_token(prompt_tokens, first);
            if let Some(gap) = longest_gap {
                pace.record_longest_gap(gap);
            }
        });
    }
    if let Some(at) = first_byte.arrived_at() {
        crate::trace::note_first_byte(at);
    }
    if let Some(residency) = &observer.residency {
        if let Some(at) = first_byte.arrived_at().filter(|_| cold) {
            let took = at.saturating_duration_since(started);
            crate::residency::LoadMemory::global().record(&target.target_model, took);
            observer.metrics.model_loaded(&target.provider_id, took);
        }
        residency.refresh(&target.provider_id);
    }
    settled
}

#[allow(clippy::type_complexity)]
async fn drive_watched<U: UplinkFrame, T>(
    producer: Producer<'_, Result<T, crate::adapter::AdapterError>>,
    items: &mut mpsc::Receiver<U::Item>,
    uplink: &mut Uplink<U>,
    cancel: &Cancel,
    edge_gone: impl Future<Output = ()>,
    (http, target, watchdog, first_byte, observer, kind): (
        &reqwest::Client,
        &ProviderTarget,
        &mut StallWatchdog,
        &FirstByte,
        &Observer,
        ExecutionKind,
    ),
    coalesce: bool,
) -> Settled<T> {
    let mut coalescer = Coalescer::new(coalesce);
    let fenced = || observer.metrics.fenced(kind);
    let watch = (watchdog, first_byte);
    match forward(producer, items, uplink, cancel, edge_gone, watch, &mut coalescer, fenced).await {
        Driven::Finished(Ok(done)) => Settled::Finished(Ok(done)),
        Driven::Finished(Err(e)) => {
            let mut failure = e.to_failure();
            log_provider_failure(&target.provider_id, kind, &failure);
            unreachable_evidence(http, target, &mut failure, observer).await;
            Settled::Finished(Err(failure))
        }
        Driven::Stalled { silent_for, missed, producer } => {
            let stall = Stall { silent_for, missed };
            Settled::Finished(Err(stall_failure(http, target, producer, stall, observer, kind).await))
        }
        Driven::Cancelled => Settled::Cancelled,
        Driven::EdgeGone => Settled::EdgeGone,
    }
}

/// Whether an execution that ended as `outcome` had its prompt read by the
/// provider: it answered, was cancelled or cut while working, or stalled;
/// not when the provider refused it (an HTTP error status) or could not
/// be reached. Pure.
pub(crate) fn prompt_spent<T>(outcome: &Settled<T>) -> bool {
    use pb::FailureKind;
    match outcome {
        Settled::Finished(Ok(_)) | Settled::Cancelled | Settled::EdgeGone => true,
        Settled::Finished(Err(failure)) => matches!(
            failure.kind(),
            FailureKind::ResponseStalled
                | FailureKind::ProviderStreamCut
                | FailureKind::ProviderProtocol
                | FailureKind::ResponseTooLarge
                | FailureKind::DeadlineExceeded
        ),
    }
}

/// Whether the provider's transport failed: refused or reset before its
/// response, or its stream cut after it started. Pure.
fn transport_failure(failure: &pb::ExecutionFailure) -> bool {
    matches!(failure.kind(), pb::FailureKind::ProviderUnreachable | pb::FailureKind::ProviderStreamCut)
}

/// Whether the node logs this provider failure ([`log_provider_failure`]):
/// resets, cuts, 429s and 5xx, what an operator acts on; not a model's
/// refusal of the request's content (llama.cpp's 500 to an image), which is
/// the client's. Pure.
pub(crate) fn logged_provider_failure(failure: &pb::ExecutionFailure) -> bool {
    transport_failure(failure)
        || (failure.kind() == pb::FailureKind::ProviderHttpStatus
            && (failure.provider_status == 429 || failure.provider_status >= 500)
            && !iop_proto::provider_error::refuses_content(failure))
}

/// One warning per logged provider failure, naming the provider: closed
/// fields only (the failure kind, the status, the sanitized provider code),
/// and the transport error for resets and cuts (ours, without the URL).
/// Never the provider's error message: it may quote the prompt.
pub(crate) fn log_provider_failure(provider: &str, kind: ExecutionKind, failure: &pb::ExecutionFailure) {
    if !logged_provider_failure(failure) {
        return;
    }
    let transport = transport_failure(failure);
    tracing::warn!(
        target: "node_provider_failure",
        provider = %provider,
        kind = kind.label(),
        failure = failure.kind().as_str_name(),
        status = failure.provider_status,
        retry_after_ms = failure.retry_after_ms,
        provider_code = failure.provider_code.as_str(),
        error = if transport { failure.message.as_str() } else { "" },
        "provider call failed"
    );
}

/// A provider that could not be reached, or whose stream was cut, is probed
/// (bounded) so the failure carries sequenced health evidence like a stall
/// does: a killed provider is classified unhealthy and the Edge takes it out
/// of rotation. The Edge records it under its own source (`unreachable`,
/// `stream_cut`), never as a stall.
async fn unreachable_evidence(
    http: &reqwest::Client,
    target: &ProviderTarget,
    failure: &mut pb::ExecutionFailure,
    observer: &Observer,
) {
    if !transport_failure(failure) {
        return;
    }
    let health = probe(http, target).await.health;
    failure.provider_health = health.into();
    failure.liveness_classification = iop_proto::wire::classify(health).into();
    failure.health_observation_seq = observer.observed(&target.provider_id, health);
}

/// A claimed stall: how long the provider was silent, and which deadline
/// it missed (a first-byte or first-token miss is stage `first_byte`).
#[derive(Debug, Clone, Copy)]
struct Stall {
    silent_for: Duration,
    missed: Missed,
}

/// After a stall claim: joins the close-grace fence on `producer` with the
/// exact-target probe, records the observation, and returns the single
/// `response_stalled` failure with its evidence and sequence.
async fn stall_failure<T>(
    http: &reqwest::Client,
    target: &ProviderTarget,
    producer: Producer<'_, T>,
    Stall { silent_for, missed }: Stall,
    observer: &Observer,
    kind: ExecutionKind,
) -> pb::ExecutionFailure {
    let first_byte = missed != Missed::Stall;
    let evidence = liveness::join_evidence(
        producer.close(),
        async { probe(http, target).await.health },
        liveness::CLOSE_GRACE,
        liveness::PROBE_TIMEOUT,
    )
    .await;
    let seq = observer.observed(&target.provider_id, evidence.health);
    observer.metrics.observe_stall(kind, &evidence, silent_for);
    if first_byte {
        observer.metrics.first_byte_timeout(kind);
    }
    tracing::warn!(
        target: "node_response_stall_observation",
        provider = %target.provider_id,
        kind = kind.label(),
        stage = match missed {
            Missed::FirstByte => "first_byte",
            Missed::FirstToken => "first_token",
            Missed::Stall => "stall",
        },
        provider_health = evidence.health.as_str_name(),
        liveness_classification = evidence.classification.as_str_name(),
        retryable = evidence.retryable,
        stalled_after_ms = silent_for.as_millis() as u64,
        health_observation_seq = seq,
        "response stalled"
    );
    let mut failure = evidence.to_failure(silent_for, seq);
    let ms = silent_for.as_millis();
    match missed {
        Missed::FirstByte => {
            failure.first_byte_timeout = true;
            failure.message = format!("nothing from the provider within its first-byte timeout ({ms} ms)");
        }
        Missed::FirstToken => {
            failure.first_byte_timeout = true;
            failure.message = format!("no token from the provider within its first-token deadline ({ms} ms)");
        }
        Missed::Stall => {}
    }
    failure
}

#[cfg(test)]
mod tests;
