//! The Edge's node-facing limits (docs/security.md "Node-facing limits").
//!
//! Issue 25 item 2: idle connections that never send a TLS byte, from one
//! address, do not keep a real node from becoming ready.
//!
//! Issue 25 item 1: a node certificate cannot exhaust the Edge's memory.
//! A hostile but authenticated node (real mTLS, a configured identity with
//! no providers) announces huge messages and stalls, opens more calls and
//! connections than its providers explain: the Edge refuses each with
//! RESOURCE_EXHAUSTED, counts it per node and limit, keeps its budget of
//! bytes in transit, and a well-behaved node keeps serving.
//!
//! The Edge's resident memory before and after the attack is printed
//! (`--nocapture`), never asserted.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use hyper::body::Frame;
use iop_e2e::harness::{rss_kib, wait_until};
use iop_e2e::pki::Validity;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::Service;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const ROGUE: &str = "rogue";
const MIB: usize = 1024 * 1024;
/// `NodeLimits::of` for a node without providers or workspaces.
const ROGUE_STREAMS: usize = 4 + 16;
const ROGUE_BUDGET: usize = 4 * MIB + 32 * MIB;
// One 30 MiB message fits the rogue's budget, a second does not.
const _: () = assert!(30 * MIB <= ROGUE_BUDGET && 2 * 30 * MIB > ROGUE_BUDGET);

type BodySender = mpsc::Sender<Result<Frame<Bytes>, std::convert::Infallible>>;

/// A connection of `name`, with the certificate the PKI issues it.
async fn connect(stack: &Stack, name: &str) -> Result<Channel, tonic::transport::Error> {
    let pair = stack.pki.node_cert(name, Validity::Current).unwrap();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(&stack.pki.ca_file).unwrap()))
        .identity(Identity::from_pem(std::fs::read(&pair.cert).unwrap(), std::fs::read(&pair.key).unwrap()))
        .domain_name("localhost");
    Endpoint::from_shared(format!("https://127.0.0.1:{}", stack.grpc.port()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
}

/// A call of `method` whose request body the test writes by hand (raw gRPC
/// framing) through the returned sender, once the channel is ready.
async fn ready_call(channel: &mut Channel, method: &str) -> (http::Request<tonic::body::Body>, BodySender) {
    let (tx, rx) = mpsc::channel(4);
    let body = tonic::body::Body::new(http_body_util::StreamBody::new(ReceiverStream::new(rx)));
    let request = http::Request::post(format!("/iop.v1.NodeGateway/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .unwrap();
    std::future::poll_fn(|cx| channel.poll_ready(cx)).await.unwrap();
    (request, tx)
}

/// Opens `method` (see [`ready_call`]), returning the answer's head and the
/// body's sender.
async fn open(channel: &mut Channel, method: &str) -> (http::Response<tonic::body::Body>, BodySender) {
    let (request, tx) = ready_call(channel, method).await;
    (channel.call(request).await.unwrap(), tx)
}

/// As [`open`], for a method whose handler answers only after the first
/// message: the call runs on its own task.
async fn open_spawned(
    channel: &mut Channel,
    method: &str,
) -> (tokio::task::JoinHandle<http::Response<tonic::body::Body>>, BodySender) {
    let (request, tx) = ready_call(channel, method).await;
    let call = channel.call(request);
    (tokio::spawn(async move { call.await.unwrap() }), tx)
}

/// A message prefix announcing `len` bytes, followed by `sent` of them.
fn announce(len: usize, sent: usize) -> Frame<Bytes> {
    let mut data = vec![0u8];
    data.extend_from_slice(&(len as u32).to_be_bytes());
    data.resize(5 + sent, 0);
    Frame::data(Bytes::from(data))
}

/// The call's gRPC status code: from the head of a trailers-only answer,
/// else from the trailers at its end.
async fn status_code(response: http::Response<tonic::body::Body>) -> i32 {
    if let Some(status) = tonic::Status::from_header_map(response.headers()) {
        return status.code() as i32;
    }
    let collected = http_body_util::BodyExt::collect(response.into_body()).await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    tonic::Status::from_header_map(&trailers).map(|s| s.code() as i32).unwrap_or(0)
}

fn refusals(limit: &str) -> String {
    format!("iop_edge_node_limit_refusals_total{{node=\"{ROGUE}\",limit=\"{limit}\"}}")
}

/// 200 connections from 127.0.0.2 that never send a byte stay open while a
/// real `iop-node` (from 127.0.0.1) connects: at most 16 of them hold a
/// handshake slot, the rest are closed at once, and the node becomes
/// ready. (Before the per-source bound, 64 of them held every slot for
/// 10 s each, and the node's connection waited behind the rest.)
#[tokio::test]
async fn an_idle_flood_does_not_keep_a_node_from_becoming_ready() {
    let mut stack = Stack::start(StackOptions { start_node: false, ..Default::default() }).await;
    let mut flood = Vec::new();
    for _ in 0..200 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        flood.push(socket.connect(stack.grpc).await.unwrap());
    }
    let pair = stack.pki.node_cert(NODE, Validity::Current).unwrap();
    let (node, _) = stack.spawn_node(&pair, &stack.pki.ca_file.clone()).await;
    stack.nodes.push(node);
    stack.wait_node_ready(NODE).await;
    let busy = r#"iop_edge_node_handshake_rejections_total{reason="source_busy"}"#;
    assert!(stack.metric(busy).await >= 1.0);
    assert!(stack.metric("iop_edge_node_handshakes_in_progress").await <= 16.0);
    drop(flood);
}

#[tokio::test]
async fn a_hostile_node_is_refused_past_its_limits_and_a_good_node_keeps_serving() {
    let mut stack =
        Stack::start(StackOptions { start_node: false, extra_nodes: vec![ROGUE], ..Default::default() }).await;
    let pair = stack.pki.node_cert(NODE, Validity::Current).unwrap();
    let (node, _) = stack.spawn_node(&pair, &stack.pki.ca_file.clone()).await;
    stack.nodes.push(node);
    stack.wait_node_ready(NODE).await;
    let edge_pid = stack.edge.as_ref().unwrap().pid();
    let rss_before = rss_kib(edge_pid);
    let mut rogue = connect(&stack, ROGUE).await.unwrap();
    let resource_exhausted = tonic::Code::ResourceExhausted as i32;

    // A control message larger than the control call takes: refused on its
    // prefix, before any of it is buffered.
    let (answer, _control) = open(&mut rogue, "Control").await;
    _control.send(Ok(announce(64 * MIB, 64 * 1024))).await.unwrap();
    assert_eq!(status_code(answer).await, resource_exhausted);
    assert_eq!(stack.metric(&refusals("message_size")).await, 1.0);

    // Six run calls each announce 30 MiB (within a run event's bound), send
    // 1 MiB of it and stall: the first fits the node's budget and is held;
    // the other five would exceed it and are refused.
    let mut stalled = Vec::new();
    let (answer, body) = open(&mut rogue, "RunEvents").await;
    body.send(Ok(announce(30 * MIB, MIB))).await.unwrap();
    stalled.push((answer, body));
    let held = format!("iop_edge_node_in_transit_bytes{{node=\"{ROGUE}\"}}");
    stack.wait_metric_at_least(&held, (30 * MIB) as f64).await;
    for _ in 0..5 {
        let (answer, body) = open(&mut rogue, "RunEvents").await;
        body.send(Ok(announce(30 * MIB, MIB))).await.unwrap();
        assert_eq!(status_code(answer).await, resource_exhausted);
    }
    assert_eq!(stack.metric(&refusals("in_transit")).await, 5.0);
    assert_eq!(stack.metric(&held).await, (30 * MIB) as f64, "only the held message's bytes");

    // Calls past the node's stream limit are refused as they open.
    let streams = format!("iop_edge_node_streams{{node=\"{ROGUE}\"}}");
    wait_until("the refused calls to close", WAIT, || async { stack.metric(&streams).await == 1.0 }).await;
    let mut open_calls = Vec::new();
    let mut refused = 0;
    for _ in 0..40 {
        let (answer, body) = open(&mut rogue, "RunEvents").await;
        match tonic::Status::from_header_map(answer.headers()) {
            Some(status) => {
                assert_eq!(status.code() as i32, resource_exhausted);
                refused += 1;
            }
            None => open_calls.push((answer, body)),
        }
    }
    assert_eq!(open_calls.len(), ROGUE_STREAMS - 1, "one call is the held run");
    assert_eq!(refused, 40 - (ROGUE_STREAMS - 1));
    assert_eq!(stack.metric(&refusals("streams")).await, refused as f64);
    assert_eq!(stack.metric(&streams).await, ROGUE_STREAMS as f64);

    // Connections past the per-node bound (4) are closed after the
    // handshake (the client may or may not see its handshake fail).
    let mut extra = Vec::new();
    for _ in 0..4 {
        extra.push(tokio::time::timeout(Duration::from_secs(5), connect(&stack, ROGUE)).await);
    }
    stack.wait_metric_at_least(&refusals("connections"), 1.0).await;
    assert_eq!(stack.metric(&format!("iop_edge_node_connections{{node=\"{ROGUE}\"}}")).await, 4.0);

    // The well-behaved node is untouched.
    let (status, body) =
        json_body(stack.post("/v1/chat/completions", &chat_body("mock-ollama", "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(stack.node(NODE).await["phase"], "ready");
    let rss_during = rss_kib(edge_pid);

    // Everything the rogue held is given back when it goes away.
    drop((stalled, open_calls, rogue, extra));
    wait_until("the rogue's calls to be released", WAIT, || async {
        stack.metric(&streams).await == 0.0 && stack.metric(&held).await == 0.0
    })
    .await;
    println!("edge RSS: {rss_before} KiB before, {rss_during} KiB under attack, {} KiB after", rss_kib(edge_pid));
}

/// A measurement, not a test (`--ignored --nocapture`): the issue's attack,
/// six workspace calls that each announce a 64 MiB message, send all but
/// the last MiB of it and stall, and the Edge's resident memory before and
/// after. Before the limits this took an Edge from ~26 MB to ~409 MB.
#[tokio::test]
#[ignore]
async fn measure_edge_memory_under_stalled_large_messages() {
    let stack = Stack::start(StackOptions { start_node: false, extra_nodes: vec![ROGUE], ..Default::default() }).await;
    let edge_pid = stack.edge.as_ref().unwrap().pid();
    let mut rogue = connect(&stack, ROGUE).await.unwrap();
    let before = rss_kib(edge_pid);
    let mut calls = Vec::new();
    for _ in 0..6 {
        let (answer, body) = open_spawned(&mut rogue, "WorkspaceCalls").await;
        let len = 64 * MIB;
        let _ = body.send(Ok(announce(len, 0))).await;
        for _ in 0..63 {
            if body.send(Ok(Frame::data(Bytes::from(vec![0u8; MIB])))).await.is_err() {
                break;
            }
        }
        calls.push((answer, body));
    }
    // Wait for the Edge to take in what it accepts: its answers to the
    // refused calls, or its flow-control credit for the rest.
    let refused = stack.metric(&refusals("in_transit")).await + stack.metric(&refusals("message_size")).await;
    println!(
        "edge RSS: {before} KiB before, {} KiB after six stalled 64 MiB messages ({refused} refused)",
        rss_kib(edge_pid)
    );
    drop(calls);
}
