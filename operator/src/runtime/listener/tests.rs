//! The listener on a real local socket.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::*;
use crate::runtime::metrics::{StatusKind, WriteResult, Writer};

async fn get(addr: SocketAddr, path: &str) -> (u16, Option<String>, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let uri: axum::http::Uri = format!("http://{addr}{path}").parse().unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), client.get(uri)).await.unwrap().unwrap();
    let status = response.status().as_u16();
    let content_type = response.headers().get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_string());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, content_type, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn serves_metrics_health_and_readiness_until_shutdown() {
    let metrics = Metrics::new();
    let readiness = Arc::new(Readiness::default());
    let socket = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = socket.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let endpoints = Endpoints { metrics: metrics.clone(), readiness: readiness.clone() };
    let server = tokio::spawn(serve(socket, endpoints, shutdown.clone()));

    assert_eq!(get(addr, HEALTHZ_PATH).await.0, 200);
    // Before the CRDs are established: alive, not ready.
    let (status, _, body) = get(addr, READYZ_PATH).await;
    assert_eq!((status, body.as_str()), (503, "waiting for the IOP CRDs to be established\n"));
    readiness.set_ready();
    assert_eq!(get(addr, READYZ_PATH).await.0, 200);

    metrics.set_leader(true);
    metrics.status_write(StatusKind::NodeCatalog, Writer::Certs).finish(WriteResult::Ok);
    let (status, content_type, body) = get(addr, METRICS_PATH).await;
    assert_eq!(status, 200);
    assert_eq!(content_type.as_deref(), Some(OPENMETRICS));
    assert!(body.contains("\niop_operator_leader 1\n"), "{body}");
    assert!(
        body.contains("iop_operator_status_writes_total{kind=\"nodecatalog\",writer=\"certs\",result=\"ok\"} 1\n"),
        "{body}"
    );
    crate::runtime::metrics::tests::assert_closed(&body);

    assert_eq!(get(addr, "/admin/v1/providers").await.0, 404);

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), server).await.unwrap().unwrap().unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "the port is closed after shutdown");
}

#[tokio::test]
async fn a_taken_port_fails_to_bind() {
    let taken = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    assert!(bind(taken.local_addr().unwrap()).await.is_err());
}
