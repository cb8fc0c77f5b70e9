//! Executes one assigned run: validate it, open its own `RunEvents` stream to
//! the Edge, drive the adapter, and forward its events in order with exactly
//! one terminal. The run ends early when the Edge cancels it (a `Cancel`, or
//! the Edge ending the stream) or the session ends; dropping the adapter
//! future closes the provider request. The machinery shared with tunnels
//! lives in [`crate::execution`].

use iop_proto::pb::{self, run_event::Event};
use tokio::sync::mpsc;

use crate::adapter;
use crate::adapter::Providers;
use crate::capacity::LocalAdmission;
use crate::execution::handles::{Cancel, Observer};
use crate::execution::{self, ExecutionContext, Producer, Settled, UPLINK_CAPACITY, Uplink, Watched};
use crate::lease::{self, SessionLeases};
use crate::liveness::FirstByte;
use crate::metrics::ExecutionKind;

pub use crate::execution::{Rejection as RunRejection, validate};

/// Runs `run_id` on its own `RunEvents` call: takes its request from the
/// assignment (`assigned`) or else receives it there, then streams its
/// events until its terminal is sent (and acknowledged, bounded) or the Edge
/// ends the call.
pub async fn execute(ctx: ExecutionContext, run_id: String, assigned: Option<pb::RunRequest>, cancel: Cancel) {
    let mut client = ctx.client.clone();
    let (mut uplink, call) =
        execution::open(&run_id, ctx.generation, |frames| async move { client.run_events(frames).await });
    let Some((request, mut downlink)) = execution::request(assigned, call, &cancel, "run", &run_id).await else {
        return;
    };
    let edge_gone = downlink.ended();
    let leases = ctx.leases.as_deref();
    let providers = (&*ctx.providers, &ctx.admission);
    let call = crate::trace::Call {
        kind: ExecutionKind::run,
        traceparent: &request.traceparent,
        operation: if request.embed.is_some() { "embeddings" } else { "chat" },
        adapter: request.adapter,
        provider_id: &request.provider_id,
        target_model: &request.target_model,
    };
    let served = serve(&ctx.http, providers, leases, &request, &mut uplink, &cancel, edge_gone, &ctx.observer);
    if crate::trace::provider_call(&ctx.tracer, call, served).await {
        execution::await_ack(uplink, downlink, "run", &run_id).await;
    }
}

/// The run without its gRPC call: validates, admits its credential lease,
/// drives the adapter into `uplink`, and sends the terminal. Returns whether
/// the terminal was sent (false when the Edge ended the call first).
#[allow(clippy::too_many_arguments)]
async fn serve(
    http: &reqwest::Client,
    (providers, admission): (&Providers, &LocalAdmission),
    leases: Option<&SessionLeases>,
    request: &pb::RunRequest,
    uplink: &mut Uplink<pb::RunUplink>,
    cancel: &Cancel,
    edge_gone: impl Future<Output = ()>,
    observer: &Observer,
) -> bool {
    let admitted = validate(providers, request.into()).map_err(|r| r.to_failure()).and_then(|(target, timeouts)| {
        // Before the lease: a refused run spends none.
        let permit = admission.admit(&target.provider_id)?;
        let credential = lease::admit(leases, &request.run_id, target, request.lease.as_ref(), observer)?;
        Ok((target, timeouts, credential, permit))
    });
    let (outcome, unreported) = match admitted {
        Err(failure) => (Settled::Finished(Err(failure)), None),
        Ok((target, timeouts, credential, _permit)) => {
            let (authorization, scrubber) = lease::split(credential);
            let counting = authorization.clone();
            let (sink, mut events) = mpsc::channel(UPLINK_CAPACITY);
            let metrics = &observer.metrics;
            // The adapter marks the provider's response headers as its first byte.
            let first_byte = FirstByte::default();
            let producer =
                Producer::new(first_byte.clone().scope(async move {
                    adapter::execute(http, target, request, authorization, &sink, metrics).await
                }));
            let prompt_tokens = iop_proto::usage::estimate_request_input(request);
            let kind = ExecutionKind::run;
            let watched = Watched { http, target, timeouts, first_byte, observer, kind, prompt_tokens };
            // A client that does not stream gets the answer as a whole: its
            // deltas need not cross the wire one by one.
            let mut settled =
                execution::drive(producer, &mut events, uplink, cancel, edge_gone, watched, !request.stream).await;
            // A provider's error text may quote the key it was sent.
            if let (Settled::Finished(Err(failure)), Some(scrubber)) = (&mut settled, &scrubber) {
                scrubber.scrub_failure(failure);
            }
            let unreported = unreported(http, target, request, counting, uplink.meter(), &settled).await;
            (settled, unreported)
        }
    };
    if let Some(usage) = unreported
        && !uplink.send(Event::Usage(usage)).await
    {
        return false;
    }
    let terminal = match outcome {
        Settled::Finished(Ok(finish)) => Event::Completed(pb::RunCompleted { finish_reason: finish.into() }),
        Settled::Finished(Err(failure)) => Event::Failed(pb::RunFailed { failure: Some(failure) }),
        Settled::Cancelled => Event::Cancelled(pb::RunCancelled { reason: cancel.reason().into() }),
        Settled::EdgeGone => {
            tracing::debug!(run_id = %request.run_id, "edge ended the run stream");
            return false;
        }
    };
    uplink.send(terminal).await
}

/// How long a run's end waits for its provider's tokenizer to count a
/// prompt the provider did not report.
const PROMPT_COUNT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// What a run that ended as `outcome` used and its provider did not report
/// (none for a token count, which generates nothing): the deltas `meter`
/// counted, and the prompt once the provider had it, by the provider's own
/// tokenizer where it has one (llama.cpp's; bounded by
/// [`PROMPT_COUNT_WAIT`]), else estimated from the request's size.
async fn unreported<T>(
    http: &reqwest::Client,
    target: &adapter::ProviderTarget,
    request: &pb::RunRequest,
    authorization: Option<reqwest::header::HeaderValue>,
    meter: &crate::usage::RunMeter,
    outcome: &Settled<T>,
) -> Option<pb::Usage> {
    if request.count_tokens || matches!(outcome, Settled::EdgeGone) {
        return None;
    }
    let estimate = iop_proto::usage::estimate_request_input(request);
    let mut usage = meter.unreported(estimate, execution::prompt_spent(outcome))?;
    if usage.prompt_tokens > 0 && request.embed.is_none() {
        let counted = adapter::count_prompt(http, target, request, authorization);
        if let Ok(Ok(prompt)) = tokio::time::timeout(PROMPT_COUNT_WAIT, counted).await {
            usage.prompt_tokens = prompt;
            usage.prompt_source = pb::UsageSource::Provider.into();
        }
    }
    Some(usage)
}
