//! The HTTP listeners (client and admin): a hyper-util serve loop (rather than
//! `axum::serve`, which has neither a connection cap nor read timeouts) so
//! that a slow or idle client cannot hold the Edge's resources:
//!
//! - at most `limits.max_http_connections` connections are open at once;
//!   past it the loop waits for one to close before accepting the next;
//! - a connection must start its request, and finish its request headers,
//!   within `limits.http_idle_timeout_ms` (this is also how long an idle
//!   keep-alive connection stays open);
//! - request bodies are read with the same bound between chunks
//!   (`read_body` in the handler), so a trickling body is cut too.
//!
//! Responses are never timed here: a stream waiting on a long prefill is
//! the request deadline's business.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use prometheus_client::metrics::gauge::Gauge;

/// Bounds of the client listener (from `limits`).
#[derive(Debug, Clone, Copy)]
pub struct ListenLimits {
    pub max_connections: usize,
    pub idle_timeout: Duration,
}

impl ListenLimits {
    pub fn of(limits: &iop_proto::config::Limits) -> Self {
        Self {
            max_connections: limits.max_http_connections,
            idle_timeout: Duration::from_millis(limits.http_idle_timeout_ms),
        }
    }
}

/// Serves `app` on `listener` until `stop` is cancelled, then lets open
/// connections finish (the caller bounds how long it waits for that).
/// `open` counts the listener's open connections.
pub async fn serve(listener: TcpListener, app: Router, limits: ListenLimits, open: Gauge, stop: CancellationToken) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.idle_timeout);
    builder.http2().timer(TokioTimer::new()).keep_alive_interval(limits.idle_timeout);
    let builder = Arc::new(builder);
    loop {
        let permit = tokio::select! {
            _ = stop.cancelled() => break,
            permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let tcp = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Typically out of file descriptors: back off, keep serving.
                    tracing::warn!(error = %e, "http listener accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Headers and body are written separately; without it a reused
        // connection waits on the client's delayed ACK (~40 ms).
        let _ = tcp.set_nodelay(true);
        // The address the connection reached, for the Host check
        // (`guard::local_host_only`).
        let local = tcp.local_addr().ok().map(super::guard::LocalAddr);
        let app = app.clone().map_request(move |mut request: axum::extract::Request<hyper::body::Incoming>| {
            if let Some(local) = local {
                request.extensions_mut().insert(local);
            }
            request
        });
        let (builder, open, service) = (builder.clone(), open.clone(), TowerToHyperService::new(app));
        let watcher = graceful.watcher();
        open.inc();
        tokio::spawn(async move {
            // hyper's protocol detection waits for the first bytes without
            // a bound: a connection that sends nothing is closed here.
            let mut first = [0u8; 1];
            if let Ok(Ok(n)) = tokio::time::timeout(limits.idle_timeout, tcp.peek(&mut first)).await
                && n > 0
            {
                let connection = builder.serve_connection(TokioIo::new(tcp), service);
                if let Err(e) = watcher.watch(connection).await {
                    tracing::debug!(error = %e, "http connection ended with an error");
                }
            }
            open.dec();
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
