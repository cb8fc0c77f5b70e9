//! Executes one assigned run: validate it, open its own `RunEvents` stream to
//! the Edge, drive the adapter, and forward its events in order with exactly
//! one terminal. The run ends early when the Edge cancels it (a `Cancel`, or
//! the Edge ending the stream) or the session ends; dropping the adapter
//! future closes the provider request. The machinery shared with tunnels
//! lives in [`crate::execution`].

use iop_proto::pb::{self, run_event::Event};
use tokio::sync::mpsc;

use crate::adapter;
use crate::execution::{self, Cancel, Driven, ExecutionContext, Observer, Producer, UPLINK_CAPACITY, Uplink};
use crate::liveness::StallWatchdog;
use crate::metrics::ExecutionKind;
use crate::transport::session::Providers;

pub use crate::execution::{Rejection as RunRejection, validate};

/// Runs `request` on its own `RunEvents` call until its terminal is sent (and
/// acknowledged, bounded) or the Edge ends the call.
pub async fn execute(ctx: ExecutionContext, request: pb::RunRequest, cancel: Cancel) {
    let mut client = ctx.client.clone();
    let (mut uplink, mut call) =
        execution::open(&request.run_id, ctx.generation, |frames| async move { client.run_events(frames).await });
    let edge_gone = async {
        let _ = (&mut call).await;
    };
    if serve(&ctx.http, &ctx.providers, &request, &mut uplink, &cancel, edge_gone, &ctx.observer).await {
        execution::await_ack(uplink, call, "run", &request.run_id).await;
    }
}

/// The run without its gRPC call: validates, drives the adapter into
/// `uplink`, and sends the terminal. Returns whether the terminal was sent
/// (false when the Edge ended the call first).
async fn serve(
    http: &reqwest::Client,
    providers: &Providers,
    request: &pb::RunRequest,
    uplink: &mut Uplink<pb::RunUplink>,
    cancel: &Cancel,
    edge_gone: impl Future<Output = ()>,
    observer: &Observer,
) -> bool {
    let outcome = match validate(providers, request.into()) {
        Err(rejection) => Driven::Finished(Err(rejection.to_failure())),
        Ok((target, stall_timeout)) => {
            let (sink, mut events) = mpsc::channel(UPLINK_CAPACITY);
            let producer = Producer::spawn({
                let (http, target, request) = (http.clone(), target.clone(), request.clone());
                async move { adapter::execute(&http, &target, &request, &sink).await }
            });
            let mut watchdog = StallWatchdog::new(stall_timeout, tokio::time::Instant::now());
            let fenced = || observer.metrics.fenced(ExecutionKind::run);
            match execution::forward(producer, &mut events, uplink, cancel, edge_gone, &mut watchdog, fenced).await {
                Driven::Finished(Ok(finish)) => Driven::Finished(Ok(finish)),
                Driven::Finished(Err(e)) => {
                    let mut failure = e.to_failure();
                    execution::unreachable_evidence(http, target, &mut failure, observer).await;
                    Driven::Finished(Err(failure))
                }
                Driven::Stalled { silent_for, producer } => {
                    let failure =
                        execution::stall_failure(http, target, producer, silent_for, observer, ExecutionKind::run)
                            .await;
                    Driven::Finished(Err(failure))
                }
                Driven::Cancelled => Driven::Cancelled,
                Driven::EdgeGone => Driven::EdgeGone,
            }
        }
    };
    let terminal = match outcome {
        Driven::Finished(Ok(finish)) => Event::Completed(pb::RunCompleted { finish_reason: finish.into() }),
        Driven::Finished(Err(failure)) => Event::Failed(pb::RunFailed { failure: Some(failure) }),
        Driven::Cancelled => Event::Cancelled(pb::RunCancelled { reason: cancel.reason().into() }),
        Driven::EdgeGone | Driven::Stalled { .. } => {
            tracing::debug!(run_id = %request.run_id, "edge ended the run stream");
            return false;
        }
    };
    uplink.send(terminal).await
}
