//! The tower layer in front of the `NodeGateway` service that applies a
//! node's limits (`super::limits`) to every call: it counts the call
//! against the node's stream limit, reads each message's gRPC length prefix
//! as the body passes, refuses a message larger than its method accepts
//! and reserves the announced length in the node's in-transit budget until
//! the message's last byte has reached tonic's decoder.
//!
//! Written here rather than taken from tonic: tonic's
//! `max_decoding_message_size` is one limit per service (the generated
//! server has no per-method setting, and one service carries all four
//! calls), and tonic reserves a message's announced length when it reads
//! the prefix, so a limit must be checked before tonic sees the prefix.
//! tower's `ConcurrencyLimit` is per connection, not per client identity.
//!
//! A refusal ends the call with `RESOURCE_EXHAUSTED` (counted in
//! `iop_edge_node_limit_refusals_total{node,limit}` and logged): at the
//! call's start as its only answer; mid-call as the trailers of its answer
//! stream, whatever the handler made of the failed read.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::Frame;
use tonic::Status;
use tonic::body::Body;

use super::limits::{LimitRefusal, NodeLimits, NodeLoad, NodeMethod, StreamGuard};
use super::tls::NodePeer;
use crate::state::EdgeState;

/// One step of a request body's gRPC framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A message's prefix: its compressed flag and length.
    Announced { compressed: bool, len: usize },
    /// The last byte of a message of this length went by.
    Completed(usize),
}

/// Follows the gRPC framing of one request body (before each message a
/// one-byte compressed flag and a four-byte big-endian length), however
/// the body's chunks cut it.
#[derive(Debug, Default)]
pub struct Framing {
    header: [u8; 5],
    have: usize,
    /// Length of the message under way, and how much of it is still to come.
    message: Option<(usize, usize)>,
}

impl Framing {
    /// Feeds the next chunk; calls `step` for every message start and end
    /// in it, in order, and stops at its first error.
    pub fn feed<E>(&mut self, mut chunk: &[u8], mut step: impl FnMut(Step) -> Result<(), E>) -> Result<(), E> {
        while !chunk.is_empty() {
            if let Some((len, remaining)) = self.message {
                let n = chunk.len().min(remaining);
                chunk = &chunk[n..];
                if n == remaining {
                    self.message = None;
                    step(Step::Completed(len))?;
                } else {
                    self.message = Some((len, remaining - n));
                }
                continue;
            }
            let n = (self.header.len() - self.have).min(chunk.len());
            self.header[self.have..self.have + n].copy_from_slice(&chunk[..n]);
            self.have += n;
            chunk = &chunk[n..];
            if self.have == self.header.len() {
                self.have = 0;
                let len = u32::from_be_bytes([self.header[1], self.header[2], self.header[3], self.header[4]]) as usize;
                step(Step::Announced { compressed: self.header[0] != 0, len })?;
                if len == 0 {
                    step(Step::Completed(0))?;
                } else {
                    self.message = Some((len, len));
                }
            }
        }
        Ok(())
    }
}

/// What a call's request and answer bodies share: the node's count of the
/// call (released when both are gone) and the refusal that ended it.
struct Call {
    stream: StreamGuard,
    method: NodeMethod,
    refusal: Mutex<Option<LimitRefusal>>,
    /// The answer body, waiting for its inner stream, wakes on a refusal.
    answer: AtomicWaker,
}

impl Call {
    fn refuse(&self, refusal: LimitRefusal) {
        let mut slot = self.refusal.lock().unwrap();
        if slot.is_none() {
            *slot = Some(refusal);
            drop(slot);
            self.stream.load().refused(self.stream.node(), refusal, self.method.label());
            self.answer.wake();
        }
    }

    fn refusal(&self) -> Option<LimitRefusal> {
        *self.refusal.lock().unwrap()
    }
}

/// The request body as the node sends it, metered.
struct Metered {
    inner: Body,
    call: Arc<Call>,
    framing: Framing,
    /// Reserved for the message under way.
    reserved: usize,
    refused: bool,
}

impl Metered {
    fn meter(&mut self, data: &[u8]) -> Result<(), LimitRefusal> {
        let limit = self.call.method.max_message_bytes();
        let (stream, reserved) = (&self.call.stream, &mut self.reserved);
        self.framing.feed(data, |step| match step {
            Step::Announced { compressed: true, .. } => Err(LimitRefusal::Compressed),
            Step::Announced { len, .. } if len > limit => Err(LimitRefusal::MessageSize),
            Step::Announced { len, .. } => {
                stream.reserve(len)?;
                *reserved = len;
                Ok(())
            }
            Step::Completed(len) => {
                stream.release(len);
                *reserved = 0;
                Ok(())
            }
        })
    }
}

impl http_body::Body for Metered {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if this.refused {
            return Poll::Ready(None);
        }
        let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            other => return Poll::Ready(other),
        };
        if let Some(data) = frame.data_ref()
            && let Err(refusal) = this.meter(data)
        {
            this.refused = true;
            this.call.refuse(refusal);
            return Poll::Ready(Some(Err(refusal.status())));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.refused || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        self.call.stream.release(self.reserved);
    }
}

/// The call's answer stream: ends with the refusal's status once the
/// request body was refused.
struct Answer {
    inner: Body,
    call: Arc<Call>,
    done: bool,
}

impl Answer {
    fn refusal_trailers(&mut self) -> Option<Frame<Bytes>> {
        let refusal = self.call.refusal()?;
        self.done = true;
        let mut trailers = http::HeaderMap::new();
        let _ = refusal.status().add_header(&mut trailers);
        Some(Frame::trailers(trailers))
    }
}

impl http_body::Body for Answer {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(trailers) = this.refusal_trailers() {
            return Poll::Ready(Some(Ok(trailers)));
        }
        this.call.answer.register(cx.waker());
        if let Some(trailers) = this.refusal_trailers() {
            return Poll::Ready(Some(Ok(trailers)));
        }
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            Some(Ok(f)) if f.is_trailers() => this.done = true,
            Some(Err(_)) | None => this.done = true,
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }
}

/// Applies each node's limits to its calls (see the module doc).
#[derive(Clone)]
pub struct NodeLimitLayer {
    pub load: Arc<NodeLoad>,
    /// Its config says each node's limits.
    pub state: Arc<EdgeState>,
}

impl<S> tower::Layer<S> for NodeLimitLayer {
    type Service = NodeLimitService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        NodeLimitService { inner, load: self.load.clone(), state: self.state.clone() }
    }
}

#[derive(Clone)]
pub struct NodeLimitService<S> {
    inner: S,
    load: Arc<NodeLoad>,
    state: Arc<EdgeState>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> tower::Service<http::Request<Body>> for NodeLimitService<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<http::Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // Present on every connection the accept loop let through; the
        // service refuses a call without it.
        let Some(node) = request.extensions().get::<NodePeer>().map(|p| p.identity.name.clone()) else {
            return Box::pin(self.inner.call(request));
        };
        let method = NodeMethod::of_path(request.uri().path());
        let limits = NodeLimits::of(&self.state.config.current(), &node);
        let stream = match self.load.open_stream(&node, &limits) {
            Ok(stream) => stream,
            Err(refusal) => {
                self.load.refused(&node, refusal, method.label());
                return Box::pin(std::future::ready(Ok(refusal.status().into_http())));
            }
        };
        let call = Arc::new(Call { stream, method, refusal: Mutex::new(None), answer: AtomicWaker::new() });
        let metered = call.clone();
        let request = request.map(move |inner| {
            Body::new(Metered { inner, call: metered, framing: Framing::default(), reserved: 0, refused: false })
        });
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|inner| Body::new(Answer { inner, call, done: false })))
        })
    }
}

#[cfg(test)]
mod tests;
