//! Bounds a client cannot break (issue 8 items 5 and 6): slow or idle
//! HTTP clients are cut and cannot starve others, and streaming clients
//! hear keepalives while the gate has not committed yet.

mod common;

use common::*;
use iop_e2e::harness::wait_until;
use iop_proto::config::Limits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Waits until the server closes `socket` (EOF or reset), discarding what
/// it sends (e.g. a 408).
async fn closed_by_server(socket: &mut TcpStream) {
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(WAIT, async {
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the Edge kept a slow connection open");
}

/// Issue 8 item 5: clients that send their headers or body too slowly, or
/// nothing at all, are disconnected after `limits.http_idle_timeout_ms`;
/// with `limits.max_http_connections` of them open, a normal client is
/// still served (as soon as they are cut).
#[tokio::test]
async fn slow_clients_are_cut_and_cannot_starve_others() {
    let limits = Limits { max_http_connections: 3, http_idle_timeout_ms: 1_000, ..Limits::default() };
    let stack = Stack::start(StackOptions { limits: Some(limits), ..Default::default() }).await;

    let mut silent = TcpStream::connect(stack.http).await.unwrap();
    let mut slow_headers = TcpStream::connect(stack.http).await.unwrap();
    slow_headers.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: edge\r\n").await.unwrap();
    let mut slow_body = TcpStream::connect(stack.http).await.unwrap();
    slow_body
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: edge\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"model\":")
        .await
        .unwrap();

    // A fresh client (no pooled connection) gets its answer once a slot frees.
    let fresh = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let response = tokio::time::timeout(WAIT, fresh.get(stack.url("/healthz")).send()).await;
    assert_eq!(response.expect("served within the wait").unwrap().status(), 200);

    closed_by_server(&mut silent).await;
    closed_by_server(&mut slow_headers).await;
    closed_by_server(&mut slow_body).await;

    // And the API works as usual afterwards.
    let request = fresh
        .post(stack.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&chat_body("mock-ollama", "hi", false)).unwrap());
    let (status, body) = json_body(request.send().await.unwrap()).await;
    assert_eq!(status, 200, "{body}");
    wait_until("connections are counted down", WAIT, || async {
        stack.metric("iop_edge_http_connections").await <= 1.0
    })
    .await;
}
