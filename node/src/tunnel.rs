//! Relays one provider tunnel: an HTTP request the Edge passes through as-is
//! to the provider (no translation), answered as a response head, the body
//! chunk by chunk as it arrives, and exactly one terminal. Like a run it has
//! its own `TunnelFrames` call (first frame `TunnelOpen`), is validated
//! against the assigned providers, and ends early on a `Cancel` (terminal
//! `Cancelled`), the Edge ending the call (no terminal), or the session
//! ending; dropping the relay drops the provider response, so the provider
//! sees the connection close.
//!
//! The node only ever talks to its configured base URL: the method is GET or
//! POST, the path is relative to the base URL and cannot climb out of it,
//! and only the allowlisted headers cross, in each direction
//! (`wire::RELAYED_REQUEST_HEADERS`, `wire::RELAYED_RESPONSE_HEADERS`; the
//! Edge already filtered, this is defense in depth). With a managed
//! credential the answer is scrubbed of it (`crate::scrub`). Any provider
//! status, 4xx/5xx included, is relayed as head + body + end: the Edge
//! decides about retries.

use bytes::Bytes;

use crate::capacity::LocalAdmission;
use iop_proto::pb::{self, provider_tunnel_frame::Frame};
use iop_proto::wire::{relayable_request_header, relayable_response_header};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::sync::mpsc;

use crate::adapter::Providers;
use crate::adapter::{self, AdapterError, ProviderTarget};
use crate::execution::handles::{Cancel, Observer};
use crate::execution::{self, ExecutionContext, Producer, Rejection, Settled, Uplink, Watched};
use crate::lease::{self, SessionLeases};
use crate::liveness::FirstByte;
use crate::metrics::ExecutionKind;
use crate::scrub::SecretScrubber;
use crate::usage::{TunnelUsage, UsageChunkFilter};

/// Largest body frame; bigger provider chunks are split so that one frame
/// stays small on the shared connection.
pub const MAX_BODY_FRAME: usize = 64 * 1024;
/// Frames buffered between the provider read and the uplink. With
/// [`MAX_BODY_FRAME`] this bounds what one tunnel holds in memory: a slow
/// Edge stops the provider read instead of buffering the body.
const RELAY_CAPACITY: usize = 4;
/// Longest method name quoted back in a rejection.
const METHOD_CHARS: usize = 16;

/// Relays `tunnel_id` on its own `TunnelFrames` call: takes its request from
/// the assignment (`assigned`) or else receives it there, then streams the
/// provider's answer until its terminal is sent (and acknowledged, bounded)
/// or the Edge ends the call.
pub async fn execute(
    ctx: ExecutionContext,
    tunnel_id: String,
    assigned: Option<pb::ProviderTunnelRequest>,
    cancel: Cancel,
) {
    let mut client = ctx.client.clone();
    let (mut uplink, call) =
        execution::open(&tunnel_id, ctx.generation, |frames| async move { client.tunnel_frames(frames).await });
    let Some((mut request, mut downlink)) = execution::request(assigned, call, &cancel, "tunnel", &tunnel_id).await
    else {
        return;
    };
    let edge_gone = downlink.ended();
    let leases = ctx.leases.as_deref();
    let providers = (&*ctx.providers, &ctx.admission);
    let traceparent = std::mem::take(&mut request.traceparent);
    let (adapter, provider_id, target_model) =
        (request.adapter, request.provider_id.clone(), request.target_model.clone());
    let call = crate::trace::Call {
        kind: ExecutionKind::tunnel,
        traceparent: &traceparent,
        operation: "chat",
        adapter,
        provider_id: &provider_id,
        target_model: &target_model,
    };
    let served = serve(&ctx.http, providers, leases, request, &mut uplink, &cancel, edge_gone, &ctx.observer);
    if crate::trace::provider_call(&ctx.tracer, call, served).await {
        execution::await_ack(uplink, downlink, "tunnel", &tunnel_id).await;
    }
}

/// The tunnel without its gRPC call: validates, relays the provider's answer
/// into `uplink`, and sends the terminal. Returns whether the terminal was
/// sent (false when the Edge ended the call first).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve(
    http: &reqwest::Client,
    (providers, admission): (&Providers, &LocalAdmission),
    leases: Option<&SessionLeases>,
    mut request: pb::ProviderTunnelRequest,
    uplink: &mut Uplink<pb::TunnelUplink>,
    cancel: &Cancel,
    edge_gone: impl Future<Output = ()>,
    observer: &Observer,
) -> bool {
    let admitted = prepare(providers, &request).map_err(|r| r.to_failure()).and_then(|mut prepared| {
        // Before the lease: a refused tunnel spends none.
        let permit = admission.admit(&prepared.target.provider_id)?;
        let lease = request.lease.as_ref();
        // After the client's headers: a client's Authorization never crosses
        // (`relayable_request_header`), the lease's is the only one.
        let (authorization, scrubber) =
            lease::split(lease::admit(leases, &request.tunnel_id, &prepared.target, lease, observer)?);
        if let Some(value) = authorization {
            prepared.headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        Ok((prepared, scrubber, permit))
    });
    // The prompt's estimate: its size, about four bytes a token (a GET
    // generates nothing).
    let prompt = if request.method == "POST" { request.body.len().div_ceil(4) as u64 } else { 0 };
    let (outcome, usage) = match admitted {
        Err(failure) => (Settled::Finished(Err(failure)), None),
        Ok((prepared, scrubber, _permit)) => {
            let body = Bytes::from(std::mem::take(&mut request.body));
            let strip = request.strip_usage_chunk;
            let (sink, mut frames) = mpsc::channel(RELAY_CAPACITY);
            let (target, timeouts) = (prepared.target.clone(), prepared.timeouts);
            let relay_scrubber = scrubber.clone();
            // The response head is the first frame: progress, so the first
            // byte; marked too, so a tunnel that loads the model is measured.
            let first_byte = FirstByte::default();
            let usage = UsageSlot::default();
            let relay_usage = usage.clone();
            let producer =
                Producer::new(first_byte.clone().scope(async move {
                    relay(http, (prepared, body, strip), relay_scrubber, &sink, &relay_usage).await
                }));
            let watched = Watched {
                http,
                target: &target,
                timeouts,
                first_byte,
                observer,
                kind: ExecutionKind::tunnel,
                prompt_tokens: prompt,
            };
            let mut settled = execution::drive(producer, &mut frames, uplink, cancel, edge_gone, watched, false).await;
            if let (Settled::Finished(Err(failure)), Some(scrubber)) = (&mut settled, &scrubber) {
                scrubber.scrub_failure(failure);
            }
            let usage = usage.usage(&settled, prompt);
            (settled, usage)
        }
    };
    // A tunnel that did not finish reports its usage before its terminal.
    if let (Some(usage), Settled::Finished(Err(_)) | Settled::Cancelled) = (usage, &outcome)
        && !uplink.send(Frame::Usage(usage)).await
    {
        return false;
    }
    let terminal = match outcome {
        Settled::Finished(Ok(())) => Frame::End(pb::TunnelEnd { usage }),
        Settled::Finished(Err(failure)) => Frame::Failed(pb::RunFailed { failure: Some(failure) }),
        Settled::Cancelled => Frame::Cancelled(pb::RunCancelled { reason: cancel.reason().into() }),
        Settled::EdgeGone => {
            tracing::debug!(tunnel_id = %request.tunnel_id, "edge ended the tunnel stream");
            return false;
        }
    };
    uplink.send(terminal).await
}

/// A validated tunnel request, ready to send.
#[derive(Debug)]
struct Prepared {
    target: ProviderTarget,
    method: reqwest::Method,
    url: reqwest::Url,
    headers: HeaderMap,
    timeouts: execution::Timeouts,
}

fn prepare(providers: &Providers, request: &pb::ProviderTunnelRequest) -> Result<Prepared, Rejection> {
    let (target, timeouts) = execution::validate(providers, request.into())?;
    let method = match request.method.as_str() {
        "GET" => reqwest::Method::GET,
        "POST" => reqwest::Method::POST,
        other => return Err(Rejection::UnsupportedMethod(other.chars().take(METHOD_CHARS).collect())),
    };
    let url = provider_url(&target.base_url, &request.path)?;
    let mut headers = HeaderMap::new();
    for header in request.headers.iter().filter(|h| relayable_request_header(&h.name)) {
        let invalid = || Rejection::InvalidHeader(header.name.chars().take(64).collect());
        let name = HeaderName::from_bytes(header.name.as_bytes()).map_err(|_| invalid())?;
        let value = HeaderValue::from_str(&header.value).map_err(|_| invalid())?;
        headers.append(name, value);
    }
    // An uncompressed answer: the managed credential's scrubber reads it.
    headers.insert(reqwest::header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    Ok(Prepared { target: target.clone(), method, url, headers, timeouts })
}

/// `{base_url}{path}`, for a `path` that cannot leave the base URL: it starts
/// with a single `/`, names no scheme, has no dot segments, no backslash, no
/// fragment and no whitespace or control characters. The joined URL is
/// checked to keep the base's origin and path prefix.
fn provider_url(base_url: &str, path: &str) -> Result<reqwest::Url, Rejection> {
    if !path.starts_with('/') {
        return Err(Rejection::InvalidPath("it must start with `/`"));
    }
    if path.starts_with("//") {
        return Err(Rejection::InvalidPath("it must not start with `//`"));
    }
    if path.contains("://") {
        return Err(Rejection::InvalidPath("it must not name a scheme"));
    }
    if path.contains('#') {
        return Err(Rejection::InvalidPath("it must not have a fragment"));
    }
    if path.contains('\\') || path.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Rejection::InvalidPath("it has a backslash, whitespace or control character"));
    }
    let path_only = path.split_once('?').map_or(path, |(p, _)| p);
    if path_only.split('/').any(is_dot_segment) {
        return Err(Rejection::InvalidPath("it must not have `.` or `..` segments"));
    }
    let base = reqwest::Url::parse(base_url).map_err(|_| Rejection::InvalidPath("the base URL does not parse"))?;
    let url = reqwest::Url::parse(&format!("{base_url}{path}"))
        .map_err(|_| Rejection::InvalidPath("it does not form a valid URL"))?;
    let base_path = base.path().trim_end_matches('/');
    let stays_under_base = url.path().strip_prefix(base_path).is_some_and(|rest| rest.starts_with('/'));
    if url.origin() != base.origin() || !stays_under_base {
        return Err(Rejection::InvalidPath("it leaves the provider's base URL"));
    }
    Ok(url)
}

/// `.` or `..`, also once percent-decoded (`%2e`, and `%2f`/`%5c` taken as
/// separators), since servers and URL parsers normalize those.
fn is_dot_segment(segment: &str) -> bool {
    let decoded = percent_decode(segment);
    decoded.split(['/', '\\']).any(|part| part == "." || part == "..")
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match hex.filter(|_| bytes[i] == b'%').and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What `relay` read of the answer, shared with the tunnel's end: the usage
/// the provider reported, or the deltas it relayed, however the tunnel
/// ends.
#[derive(Debug, Clone, Default)]
struct UsageSlot(std::sync::Arc<std::sync::Mutex<Answered>>);

#[derive(Debug, Default)]
enum Answered {
    /// No response head yet (the provider may be reading the prompt).
    #[default]
    NotYet,
    /// An error status: the provider refused the request.
    Refused,
    /// A 2xx answer, read as it passes.
    Answer(TunnelUsage),
}

impl UsageSlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Answered> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn answered(&self, status: u32, content_type: Option<&str>) {
        *self.lock() = if status < 300 { Answered::Answer(TunnelUsage::new(content_type)) } else { Answered::Refused };
    }

    fn push(&self, chunk: &[u8]) {
        if let Answered::Answer(reader) = &mut *self.lock() {
            reader.push(chunk);
        }
    }

    /// The usage of a tunnel that ended as `outcome`, whose request's
    /// prompt is estimated at `prompt`: the provider's report, else the
    /// deltas counted and the estimate once the provider had the prompt.
    fn usage<T>(&self, outcome: &Settled<T>, prompt: u64) -> Option<pb::Usage> {
        match &mut *self.lock() {
            Answered::Refused => None,
            Answered::NotYet => crate::usage::unreported(prompt, execution::prompt_spent(outcome), 0),
            Answered::Answer(reader) => reader
                .finish()
                .or_else(|| crate::usage::unreported(prompt, execution::prompt_spent(outcome), reader.deltas())),
        }
    }
}

/// Sends the request to the provider and streams its answer into `sink`: one
/// head, then the body as it arrives in frames of at most [`MAX_BODY_FRAME`].
/// Ok once the body is complete; the caller sends the terminal. Dropping
/// this future drops the response, closing the provider connection. With a
/// managed credential (`scrubber`), the head's values and the body, error
/// or stream, pass through its scrubber: a provider quoting the key it was
/// sent does not hand it to the client.
async fn relay(
    http: &reqwest::Client,
    (prepared, body, strip_usage_chunk): (Prepared, Bytes, bool),
    scrubber: Option<SecretScrubber>,
    sink: &mpsc::Sender<Frame>,
    usage: &UsageSlot,
) -> Result<(), AdapterError> {
    let Prepared { method, url, headers, target, .. } = prepared;
    // Errors name neither the provider's address (internal) nor the path
    // and query (the client's): the message reaches the client.
    let context = format!("{method} to the provider");
    let mut builder = http.request(method, url).headers(headers);
    if !body.is_empty() {
        builder = builder.body(body);
    }
    let mut response = builder.send().await.map_err(|e| adapter::transport_error(&context, e))?;
    FirstByte::mark();
    let mut headers = response_headers(response.headers());
    if let Some(scrubber) = &scrubber {
        for header in &mut headers {
            header.value = scrubber.scrub_text(&header.value);
        }
    }
    let head = pb::TunnelResponseHead { status: u32::from(response.status().as_u16()), headers };
    log_error_head(&target.provider_id, head.status);
    let content_type = response.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    // Only a 2xx answer's usage is an answer's.
    usage.answered(head.status, content_type);
    let mut filter = (strip_usage_chunk && head.status < 300).then(UsageChunkFilter::default);
    emit(sink, Frame::Head(head)).await?;
    let mut scrub = scrubber.as_ref().map(SecretScrubber::stream);
    let mut pass = |chunk: Bytes, filter: &mut Option<UsageChunkFilter>| {
        let chunk = match filter {
            Some(filter) => Bytes::from(filter.push(&chunk)),
            None => chunk,
        };
        match &mut scrub {
            Some(scrub) => Bytes::from(scrub.push(&chunk)),
            None => chunk,
        }
    };
    while let Some(chunk) =
        response.chunk().await.map_err(|e| adapter::stream_cut("reading the provider's response", e))?
    {
        usage.push(&chunk);
        let chunk = pass(chunk, &mut filter);
        emit_body(sink, &chunk).await?;
    }
    let rest = filter.take().map(UsageChunkFilter::finish).unwrap_or_default();
    let rest = pass(Bytes::from(rest), &mut None);
    emit_body(sink, &rest).await?;
    if let Some(mut scrub) = scrub {
        emit_body(sink, &scrub.finish()).await?;
    }
    Ok(())
}

/// A tunnel relays a provider's error answer as it came (no failure), so
/// its 429s and 5xx are logged here, as a run's are
/// ([`execution::log_provider_failure`]): the provider and the status only.
fn log_error_head(provider: &str, status: u32) {
    let mut failure = pb::ExecutionFailure::new(pb::FailureKind::ProviderHttpStatus, "");
    failure.provider_status = status;
    execution::log_provider_failure(provider, crate::metrics::ExecutionKind::tunnel, &failure);
}

/// `body` in frames of at most [`MAX_BODY_FRAME`] (none when it is empty).
async fn emit_body(sink: &mpsc::Sender<Frame>, body: &[u8]) -> Result<(), AdapterError> {
    for piece in body.chunks(MAX_BODY_FRAME) {
        emit(sink, Frame::Body(piece.to_vec())).await?;
    }
    Ok(())
}

async fn emit(sink: &mpsc::Sender<Frame>, frame: Frame) -> Result<(), AdapterError> {
    sink.send(frame).await.map_err(|_| AdapterError::SinkClosed)
}

/// The provider's response headers that may cross the tunnel, in order
/// (repeated headers stay repeated). Values that are not text are dropped.
fn response_headers(headers: &HeaderMap) -> Vec<pb::HttpHeader> {
    headers
        .iter()
        .filter(|(name, _)| relayable_response_header(name.as_str()))
        .filter_map(|(name, value)| {
            let value = std::str::from_utf8(value.as_bytes()).ok()?;
            Some(pb::HttpHeader { name: name.as_str().to_owned(), value: value.to_owned() })
        })
        .collect()
}

#[cfg(test)]
mod tests;
