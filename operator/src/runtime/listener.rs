//! The operator's own HTTP listener (`IOP_METRICS_ADDR`, default
//! `0.0.0.0:9464`), on every replica, leader or not:
//!
//! - `GET /metrics`: the [`Metrics`] (OpenMetrics text, as the Edge serves them);
//! - `GET /healthz`: 200 while the process runs (liveness);
//! - `GET /readyz`: 200 once the IOP CRDs were found established, 503 before
//!   (readiness; a follower waiting for the Lease is ready too).
//!
//! axum, as the Edge: it is already in the operator's dependency tree (tonic's
//! router), so the listener adds no HTTP stack.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::metrics::Metrics;

pub const METRICS_PATH: &str = "/metrics";
pub const HEALTHZ_PATH: &str = "/healthz";
pub const READYZ_PATH: &str = "/readyz";

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether `/readyz` answers 200: set once, when the CRDs are established.
#[derive(Debug, Default)]
pub struct Readiness(AtomicBool);

impl Readiness {
    pub fn set_ready(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// What the listener serves.
#[derive(Clone)]
pub struct Endpoints {
    pub metrics: Arc<Metrics>,
    pub readiness: Arc<Readiness>,
}

pub fn router(endpoints: Endpoints) -> Router {
    Router::new()
        .route(METRICS_PATH, get(metrics))
        .route(HEALTHZ_PATH, get(|| async { "ok\n" }))
        .route(READYZ_PATH, get(readyz))
        .with_state(endpoints)
}

async fn metrics(State(e): State<Endpoints>) -> Response {
    ([(header::CONTENT_TYPE, OPENMETRICS)], e.metrics.encode()).into_response()
}

async fn readyz(State(e): State<Endpoints>) -> Response {
    if e.readiness.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "waiting for the IOP CRDs to be established\n").into_response()
    }
}

/// Binds the listener (before anything else starts, so a taken or invalid
/// port fails the process at once).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves until `shutdown`, then lets open requests finish.
pub async fn serve(listener: TcpListener, endpoints: Endpoints, shutdown: CancellationToken) -> std::io::Result<()> {
    axum::serve(listener, router(endpoints)).with_graceful_shutdown(async move { shutdown.cancelled().await }).await
}

#[cfg(test)]
mod tests;
