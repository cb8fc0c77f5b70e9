//! Reading a request body, bounded so that holding bodies costs a client
//! more than it costs the Edge:
//!
//! - in size: at most `limits.max_body_bytes` (`413`);
//! - in time: each chunk within `limits.http_idle_timeout_ms` of the one
//!   before, and the whole at `limits.min_body_bytes_per_s` on average
//!   once the first idle bound has passed (a body trickled a byte at a time
//!   is cut: `408 request_body_timeout`);
//! - in memory across requests: the bodies being read or held by requests
//!   in flight share `limits.max_body_bytes_in_flight` ([`BodyBudget`]);
//!   a body that does not fit is refused at once (`503 overloaded`, with
//!   `Retry-After`). A body with a `Content-Length` takes its share before
//!   the first byte is read and is read into a buffer of exactly its size.
//!
//! The caller's key and limits are checked before any of this
//! (`super::authenticated_body`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::time::Instant;

use crate::ingress::error::ApiError;

pub type BodyChunks = axum::body::BodyDataStream;

/// The bounds a body is read under (from `limits`, at its start).
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    pub max_bytes: usize,
    pub idle: Duration,
    /// Bytes per second on average after the first `idle`; 0: no minimum.
    pub min_rate: u64,
    pub in_flight: usize,
}

impl BodyLimits {
    pub fn of(limits: &iop_proto::config::Limits) -> Self {
        Self {
            max_bytes: limits.max_body_bytes,
            idle: Duration::from_millis(limits.http_idle_timeout_ms),
            min_rate: limits.min_body_bytes_per_s,
            in_flight: limits.max_body_bytes_in_flight,
        }
    }
}

/// When the next chunk of a body must have arrived (pure): within `idle` of
/// the `last` one, and by `started + idle + received / min_rate`.
pub fn next_chunk_by(started: Instant, last: Instant, received: usize, limits: BodyLimits) -> Instant {
    let by_idle = last + limits.idle;
    if limits.min_rate == 0 {
        return by_idle;
    }
    let earned = Duration::from_secs_f64(received as f64 / limits.min_rate as f64);
    by_idle.min(started + limits.idle + earned)
}

/// The request body bytes held by requests in flight, across the Edge.
#[derive(Debug, Default)]
pub struct BodyBudget {
    held: AtomicUsize,
}

/// A request's share of the [`BodyBudget`], given back when dropped (with
/// the request's response).
#[derive(Debug)]
pub struct BodyPermit {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl BodyBudget {
    /// An empty share of the budget, to grow as the body arrives.
    pub fn permit(self: &Arc<Self>) -> BodyPermit {
        BodyPermit { budget: self.clone(), bytes: 0 }
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

impl BodyPermit {
    /// Grows the share by `bytes` if the budget of `limit` has room.
    fn grow(&mut self, bytes: usize, limit: usize) -> bool {
        let grown = self.budget.held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            held.checked_add(bytes).filter(|total| *total <= limit)
        });
        if grown.is_ok() {
            self.bytes += bytes;
        }
        grown.is_ok()
    }
}

impl Drop for BodyPermit {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// The request body and its share of the budget. `content_length` is the
/// request's own (a body longer than it is refused as malformed).
pub async fn read(
    chunks: &mut BodyChunks,
    content_length: Option<usize>,
    limits: BodyLimits,
    budget: &Arc<BodyBudget>,
) -> Result<(Bytes, BodyPermit), ApiError> {
    let mut permit = budget.permit();
    let expected = match content_length {
        Some(length) if length > limits.max_bytes => return Err(ApiError::PayloadTooLarge { limit: limits.max_bytes }),
        Some(length) if !permit.grow(length, limits.in_flight) => return Err(ApiError::Overloaded),
        Some(length) => Some(length),
        None => None,
    };
    let mut out = Vec::with_capacity(expected.unwrap_or(0));
    let started = Instant::now();
    let mut last = started;
    loop {
        let by = next_chunk_by(started, last, out.len(), limits);
        match tokio::time::timeout_at(by, chunks.next()).await {
            Err(_) => return Err(ApiError::BodyTimeout),
            Ok(None) => return Ok((out.into(), permit)),
            Ok(Some(Err(_))) => return Err(ApiError::invalid("the request body could not be read")),
            Ok(Some(Ok(chunk))) => {
                let total = out.len() + chunk.len();
                if total > limits.max_bytes {
                    return Err(ApiError::PayloadTooLarge { limit: limits.max_bytes });
                }
                match expected {
                    Some(length) if total > length => {
                        return Err(ApiError::invalid("the request body is longer than its Content-Length"));
                    }
                    Some(_) => {}
                    None if !permit.grow(chunk.len(), limits.in_flight) => return Err(ApiError::Overloaded),
                    None => {}
                }
                out.extend_from_slice(&chunk);
                last = Instant::now();
            }
        }
    }
}

/// Reads and drops what is left of a refused request's body, up to
/// `limit` more bytes (each chunk within `idle`), before the refusal is
/// answered. A client that writes its whole body before reading (Python's
/// `requests` and `http.client`) would otherwise meet a connection the
/// server closed with its data unread, a reset, and report "broken pipe"
/// instead of the 401 or 413. Nothing is kept, so an unauthenticated
/// client costs bandwidth, never memory; past the bound the connection
/// closes as before.
pub async fn discard(chunks: &mut BodyChunks, limit: usize, idle: Duration) {
    let mut read = 0;
    while read <= limit {
        match tokio::time::timeout(idle, chunks.next()).await {
            Ok(Some(Ok(chunk))) => read += chunk.len(),
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests;
