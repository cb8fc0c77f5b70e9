//! The HTTP listeners (client and admin): a hyper-util serve loop (rather than
//! `axum::serve`, which has neither a connection cap nor read timeouts) so
//! that a slow or idle client cannot hold the Edge's resources:
//!
//! - the connection slots are kept by a [`ConnectionTable`]: at most
//!   `limits.max_http_connections` open at once and
//!   `limits.max_http_connections_per_source` per source; when full, the
//!   connection idle the longest gives its slot to a new one, and only
//!   when every connection is answering something does the loop wait;
//! - a connection must send its first bytes, and each request's headers,
//!   within `limits.http_header_timeout_ms`;
//! - a connection that answers nothing (between keep-alive requests, an
//!   HTTP/2 connection without a stream, PINGs or not) for
//!   `limits.http_idle_timeout_ms` is closed;
//! - request bodies are read with the idle bound between chunks
//!   (`read_body` in the handler), so a trickling body is cut too.
//!
//! Responses are never timed here: a stream waiting on a long prefill is
//! the request deadline's business.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

use super::connections::{Busy, ConnectionLimits, ConnectionTable, Slot, source_of};
use crate::metrics::ReasonLabels;

/// The most a request's headers may take, HTTP/1 (hyper's read buffer,
/// about 400 KiB by default) and HTTP/2 (16 MiB by default) alike: what
/// an unauthenticated connection can make the Edge hold before its
/// request is even read (`431` past it). Clients send a few KiB.
const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Bounds of a listener (from `limits`).
#[derive(Debug, Clone, Copy)]
pub struct ListenLimits {
    pub connections: ConnectionLimits,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
}

impl ListenLimits {
    pub fn of(limits: &iop_proto::config::Limits) -> Self {
        Self {
            connections: ConnectionLimits {
                max_connections: limits.max_http_connections,
                max_per_source: limits.max_http_connections_per_source,
            },
            header_timeout: Duration::from_millis(limits.http_header_timeout_ms),
            idle_timeout: Duration::from_millis(limits.http_idle_timeout_ms),
        }
    }
}

/// Serves `app` on `listener` until `stop` is cancelled, then lets open
/// connections finish (the caller bounds how long it waits for that).
/// `open` counts the listener's open connections, `refused` the
/// connections refused or shed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ListenLimits,
    open: Gauge,
    refused: Family<ReasonLabels, Counter>,
    stop: CancellationToken,
) {
    let table = ConnectionTable::new(limits.connections, refused);
    let connections = TaskTracker::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).max_buf_size(MAX_HEADER_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.idle_timeout)
        .max_header_list_size(MAX_HEADER_BYTES as u32);
    let builder = Arc::new(builder);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Typically out of file descriptors: back off, keep serving.
                    tracing::warn!(error = %e, "http listener accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let slot = tokio::select! {
            _ = stop.cancelled() => break,
            slot = table.enter(source_of(peer.ip())) => slot,
        };
        // Refused: its source's share is full (counted by the table).
        let Some(slot) = slot else { continue };
        // Headers and body are written separately; without it a reused
        // connection waits on the client's delayed ACK (~40 ms).
        let _ = tcp.set_nodelay(true);
        let slot = Arc::new(slot);
        // The address the connection reached, for the Host check
        // (`guard::local_host_only`); and the connection is busy while a
        // request on it is answered, its response body included.
        let local = tcp.local_addr().ok().map(super::guard::LocalAddr);
        let (router, on_request) = (app.clone(), slot.clone());
        let app = tower::service_fn(move |mut request: axum::extract::Request<hyper::body::Incoming>| {
            let busy = on_request.busy();
            if let Some(local) = local {
                request.extensions_mut().insert(local);
            }
            let router = router.clone();
            async move {
                let response = router.oneshot(request).await?;
                Ok::<_, Infallible>(response.map(|inner| Body::new(BusyBody { inner, _busy: busy })))
            }
        });
        let (builder, open) = (builder.clone(), open.clone());
        let (service, stop) = (TowerToHyperService::new(app), stop.clone());
        open.inc();
        connections.spawn(async move {
            serve_connection(&builder, tcp, service, &slot, limits, &stop).await;
            open.dec();
            drop(slot);
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// Serves one connection until it ends, closing it gracefully once it is
/// shed for a newer one, idle too long, or the listener stops.
async fn serve_connection<S>(
    builder: &auto::Builder<TokioExecutor>,
    tcp: TcpStream,
    service: S,
    slot: &Slot,
    limits: ListenLimits,
    stop: &CancellationToken,
) where
    S: hyper::service::Service<hyper::Request<hyper::body::Incoming>, Response = axum::response::Response>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // hyper's protocol detection waits for the first bytes without a
    // bound: a connection that sends nothing in time is closed here.
    let mut first = [0u8; 1];
    let sent = tokio::select! {
        peeked = tokio::time::timeout(limits.header_timeout, tcp.peek(&mut first)) => matches!(peeked, Ok(Ok(n)) if n > 0),
        () = slot.shed.cancelled() => false,
        () = stop.cancelled() => false,
    };
    if !sent {
        return;
    }
    let connection = builder.serve_connection(TokioIo::new(tcp), service);
    tokio::pin!(connection);
    let mut closing = false;
    // When an idle connection is closed, how long its peer has to take the
    // GOAWAY (HTTP/2 waits for a PING answer a silent peer never sends).
    let mut hard_close: Option<tokio::time::Instant> = None;
    loop {
        let grace_over = async {
            match hard_close {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let idle = tokio::select! {
            ended = connection.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "http connection ended with an error");
                }
                return;
            }
            () = grace_over => return,
            () = slot.shed.cancelled(), if !closing => true,
            () = slot.idle_for(limits.idle_timeout), if !closing => true,
            // Requests in flight finish: the caller bounds the drain.
            () = stop.cancelled(), if !closing => false,
        };
        closing = true;
        if idle {
            hard_close = Some(tokio::time::Instant::now() + CLOSE_GRACE);
        }
        connection.as_mut().graceful_shutdown();
    }
}

/// How long an idle connection being closed has to go on its own.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// A response body that keeps its connection busy until it is sent or
/// dropped ([`Slot::busy`]).
struct BusyBody {
    inner: Body,
    _busy: Busy,
}

impl http_body::Body for BusyBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
