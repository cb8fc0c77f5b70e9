//! Executes one assigned run: validate it, open its own `RunEvents` stream to
//! the Edge, drive the adapter, and forward its events in order with exactly
//! one terminal. The run ends early when the Edge cancels it (a `Cancel`, or
//! the Edge ending the stream) or the session ends; dropping the adapter
//! future closes the provider request.

use std::sync::Arc;
use std::time::Duration;

use iop_proto::liveness::DEFAULT_RESPONSE_STALL_TIMEOUT_MS;
use iop_proto::pb::{self, FailureKind, node_gateway_client::NodeGatewayClient, run_event::Event, run_uplink::Frame};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::adapter::{self, ProviderTarget};
use crate::transport::session::Providers;

/// Largest accepted `response_stall_timeout_ms` (one hour).
const MAX_RESPONSE_STALL_TIMEOUT_MS: u64 = 3_600_000;
/// Frames buffered toward the Edge per run; beyond this the HTTP/2 stream's
/// own flow control pushes back on this run only.
const UPLINK_CAPACITY: usize = 16;
/// How long to wait for the Edge to acknowledge a finished run's stream.
const ACK_WAIT: Duration = Duration::from_secs(5);

pub struct RunContext {
    pub client: NodeGatewayClient<Channel>,
    pub http: reqwest::Client,
    pub providers: Arc<Providers>,
    pub generation: u64,
}

/// Why a run request is refused before any adapter call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunRejection {
    #[error("provider `{0}` is not assigned to this node")]
    UnknownProvider(String),
    #[error("provider `{0}` has an invalid assignment")]
    InvalidAssignment(String),
    #[error("run does not match the provider's adapter or target")]
    TargetMismatch,
    #[error(
        "response_stall_timeout_ms {0} is out of range (0 for the default, or up to {MAX_RESPONSE_STALL_TIMEOUT_MS})"
    )]
    InvalidStallTimeout(u64),
}

/// Checks a run against the assigned providers; returns its target and the
/// effective response-stall timeout (wire 0 means the 300 s default).
pub fn validate<'a>(
    providers: &'a Providers,
    request: &pb::RunRequest,
) -> Result<(&'a ProviderTarget, Duration), RunRejection> {
    let target = match providers.get(&request.provider_id) {
        None => return Err(RunRejection::UnknownProvider(request.provider_id.clone())),
        Some(Err(_)) => return Err(RunRejection::InvalidAssignment(request.provider_id.clone())),
        Some(Ok(target)) => target,
    };
    if request.adapter != i32::from(target.adapter.to_wire()) || request.target_model != target.target_model {
        return Err(RunRejection::TargetMismatch);
    }
    let stall_ms = match request.response_stall_timeout_ms {
        0 => DEFAULT_RESPONSE_STALL_TIMEOUT_MS,
        ms if ms <= MAX_RESPONSE_STALL_TIMEOUT_MS => ms,
        ms => return Err(RunRejection::InvalidStallTimeout(ms)),
    };
    Ok((target, Duration::from_millis(stall_ms)))
}

/// Numbers events and sends them up the run's stream.
struct Uplink {
    tx: mpsc::Sender<pb::RunUplink>,
    seq: u64,
}

impl Uplink {
    async fn send(&mut self, event: Event) -> bool {
        self.seq += 1;
        let frame = pb::RunUplink { frame: Some(Frame::Event(pb::RunEvent { seq: self.seq, event: Some(event) })) };
        self.tx.send(frame).await.is_ok()
    }
}

enum Outcome {
    Finished(Result<pb::FinishReason, adapter::AdapterError>),
    Rejected(RunRejection),
    Cancelled,
    /// The Edge ended the stream (client gone or generation fenced).
    EdgeGone,
}

pub async fn execute(mut ctx: RunContext, request: pb::RunRequest, cancel: CancellationToken) {
    let (tx, rx) = mpsc::channel(UPLINK_CAPACITY);
    let open = pb::RunUplink {
        frame: Some(Frame::Open(pb::RunOpen { run_id: request.run_id.clone(), generation: ctx.generation })),
    };
    let _ = tx.send(open).await;
    // The call must be polled for frames to flow, independently of the adapter.
    let mut call = tokio::spawn(async move { ctx.client.run_events(ReceiverStream::new(rx)).await });
    let mut uplink = Uplink { tx, seq: 0 };

    let outcome = match validate(&ctx.providers, &request) {
        Err(rejection) => Outcome::Rejected(rejection),
        Ok((target, _stall_timeout)) => drive(&ctx.http, target, &request, &mut uplink, &cancel, &mut call).await,
    };
    let terminal = match outcome {
        Outcome::Finished(Ok(finish)) => Event::Completed(pb::RunCompleted { finish_reason: finish.into() }),
        Outcome::Finished(Err(e)) => Event::Failed(pb::RunFailed { failure: Some(e.to_failure()) }),
        Outcome::Rejected(r) => Event::Failed(pb::RunFailed {
            failure: Some(pb::ExecutionFailure::new(FailureKind::InvalidRequest, r.to_string())),
        }),
        Outcome::Cancelled => {
            Event::Cancelled(pb::RunCancelled { reason: pb::CancelReason::ClientDisconnected.into() })
        }
        Outcome::EdgeGone => {
            tracing::debug!(run_id = %request.run_id, "edge ended the run stream");
            return;
        }
    };
    uplink.send(terminal).await;
    drop(uplink);
    match tokio::time::timeout(ACK_WAIT, call).await {
        Ok(Ok(Ok(_))) => {}
        Ok(Ok(Err(status))) => tracing::debug!(run_id = %request.run_id, code = ?status.code(), "run stream refused"),
        _ => tracing::debug!(run_id = %request.run_id, "run stream not acknowledged"),
    }
}

/// Runs the adapter while forwarding its events, until it finishes, the run
/// is cancelled, or the Edge ends the stream. Returning drops the adapter
/// future, which aborts the provider HTTP request.
async fn drive(
    http: &reqwest::Client,
    target: &ProviderTarget,
    request: &pb::RunRequest,
    uplink: &mut Uplink,
    cancel: &CancellationToken,
    call: &mut tokio::task::JoinHandle<Result<tonic::Response<pb::RunEventsAck>, tonic::Status>>,
) -> Outcome {
    let (sink, mut events) = mpsc::channel(UPLINK_CAPACITY);
    let adapter = adapter::execute(http, target, request, &sink);
    tokio::pin!(adapter);
    loop {
        tokio::select! {
            // Events produced before the adapter's result are forwarded first.
            biased;
            _ = cancel.cancelled() => return Outcome::Cancelled,
            _ = &mut *call => return Outcome::EdgeGone,
            Some(event) = events.recv() => {
                let sent = tokio::select! {
                    sent = uplink.send(event) => sent,
                    _ = cancel.cancelled() => return Outcome::Cancelled,
                };
                if !sent {
                    return Outcome::EdgeGone;
                }
            }
            finished = &mut adapter => {
                while let Ok(event) = events.try_recv() {
                    if !uplink.send(event).await {
                        return Outcome::EdgeGone;
                    }
                }
                return Outcome::Finished(finished);
            }
        }
    }
}
