//! Edge-Node transport end to end: handshake to Ready, refusal of wrong
//! certificates, Ready-gated dispatch, heartbeat timeout with generation
//! fencing and reconnect, late frames for a fenced generation, Edge restart.

mod common;

use common::fake_node::*;
use common::*;
use iop_e2e::harness::wait_until;
use iop_e2e::pki::{DevCa, Validity};
use iop_node::transport::TransportError;
use iop_proto::pb::{self, edge_to_node::Msg, node_to_edge, run_event, run_uplink::Frame};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

#[tokio::test]
async fn node_handshakes_to_ready_and_serves() {
    let stack = Stack::start(StackOptions::default()).await;
    let node = stack.node(NODE).await;
    assert_eq!(node["connected"], true);
    assert_eq!(node["providers"]["ollama-mock"], "available");
    assert_eq!(node["providers"]["openai-mock"], "available");
    assert_eq!(stack.metric("iop_edge_ready_nodes").await, 1.0);

    let (status, body) =
        json_body(stack.post("/v1/chat/completions", &chat_body("mock-ollama", "hi", false)).await).await;
    assert_eq!(status, 200, "{body}");

    let providers = stack.get_json("/admin/v1/providers").await;
    assert_eq!(providers["providers"][0]["dispatchable"], true);
    let status =
        stack.client.post(stack.admin_url("/admin/v1/nodes/mac-1/commands/transport_status")).send().await.unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.bytes().await.unwrap()).unwrap();
    assert_eq!(status["generation"], node["generation"]);
    let caps = stack.client.post(stack.admin_url("/admin/v1/nodes/mac-1/commands/capabilities")).send().await.unwrap();
    let caps: serde_json::Value = serde_json::from_slice(&caps.bytes().await.unwrap()).unwrap();
    assert_eq!(caps["providers"].as_array().unwrap().len(), 2, "{caps}");
}

/// Each refused certificate: the node process keeps retrying, the Edge counts
/// the typed reason, and nothing is registered. The node learns the reason
/// from the Edge's TLS alert: it logs it as `refused` (`node_says`) with what
/// to do, and counts its dials as `refused`.
async fn assert_refused(
    stack: &Stack,
    pair: iop_e2e::pki::PairFiles,
    ca_file: &std::path::Path,
    reason: &str,
    node_says: &str,
) {
    let (_node, node_metrics) = stack.spawn_node(&pair, ca_file).await;
    stack.wait_metric_at_least(&format!("iop_edge_node_handshake_rejections_total{{reason=\"{reason}\"}}"), 1.0).await;
    let log = pair.cert.file_stem().unwrap().to_str().unwrap().to_string();
    let field = format!("refused=\"{node_says}\"");
    wait_until(&format!("the node logs {field}"), WAIT, || async { stack.log(&log).contains(&field) }).await;
    let line = stack.log(&log).lines().find(|l| l.contains(&field)).unwrap().to_string();
    assert!(line.contains("the Edge refused this node"), "{line}");
    assert!(!line.contains(pair.cert.to_str().unwrap()) && !line.contains("BEGIN"), "no paths or keys: {line}");
    let refused = stack.metric_at(&node_metrics, "iop_node_edge_dials_total{outcome=\"refused\"}").await;
    assert!(refused >= 1.0, "the node counts the refused dial ({refused})");
    let node = stack.node(NODE).await;
    assert_eq!(node["connected"], false, "{node}");
    assert_eq!(stack.get_json("/readyz").await["ready_nodes"], 0);
}

fn refusal_stack() -> StackOptions {
    StackOptions { start_node: false, capture_logs: true, ..Default::default() }
}

#[tokio::test]
async fn certificate_from_another_ca_is_refused() {
    let stack = Stack::start(refusal_stack()).await;
    let rogue = DevCa::new("rogue CA");
    let identity = iop_proto::identity::NodeIdentity::new(iop_e2e::harness::TRUST_DOMAIN, NODE).unwrap();
    let pair = rogue.node_cert(&identity, Validity::Current).write(stack.dir.path(), "rogue").unwrap();
    assert_refused(&stack, pair, &stack.pki.ca_file, "untrusted_issuer", "untrusted_issuer").await;
}

#[tokio::test]
async fn unknown_node_identity_is_refused() {
    let stack = Stack::start(refusal_stack()).await;
    let pair = stack.pki.node_cert("stranger", Validity::Current).unwrap();
    assert_refused(&stack, pair, &stack.pki.ca_file, "unknown_node", "not_admitted").await;
}

#[tokio::test]
async fn expired_certificate_is_refused() {
    let stack = Stack::start(refusal_stack()).await;
    let pair = stack.pki.node_cert(NODE, Validity::Expired).unwrap();
    assert_refused(&stack, pair, &stack.pki.ca_file, "expired", "expired").await;
    let line = stack.log("node-mac-1").lines().find(|l| l.contains("refused=\"expired\"")).unwrap().to_string();
    assert!(line.contains("it has expired") && line.contains("new bundle"), "says what to do: {line}");
}

/// Issue 43 item 6: a session does not outlive its certificate. The node
/// connects with a certificate that expires seconds later; at its notAfter
/// the Edge ends the connection and the session with the typed reason
/// (counted, logged with the node's name), and the node's next dial is
/// refused as `expired`, which the node reads from the Edge's TLS alert.
#[tokio::test]
async fn a_session_ends_when_its_certificate_expires() {
    let stack = Stack::start(refusal_stack()).await;
    let not_after = time::OffsetDateTime::now_utc() + time::Duration::seconds(3);
    let pair = stack.pki.node_cert(NODE, Validity::Until(not_after)).unwrap();
    let mut fake = FakeNode::register_with(&stack, &pair).await;
    assert_eq!(stack.node(NODE).await["connected"], true);

    // The control stream ends (the connection under it is gone) without
    // the test doing anything but answering heartbeats.
    let ended = tokio::time::timeout(WAIT, async {
        loop {
            match fake.inbound.message().await {
                Ok(Some(pb::EdgeToNode { msg: Some(Msg::Heartbeat(hb)) })) => {
                    let ack = node_to_edge::Msg::HeartbeatAck(pb::HeartbeatAck { seq: hb.seq });
                    let _ = fake.out.send(msg(ack)).await;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    });
    ended.await.expect("the session ends at the certificate's notAfter");
    assert!(time::OffsetDateTime::now_utc() >= not_after, "not before the notAfter");
    stack.wait_metric_at_least("iop_edge_node_sessions_closed_total{reason=\"certificate_expired\"}", 1.0).await;
    assert_eq!(stack.node(NODE).await["connected"], false);
    let edge = stack.log("edge");
    let line = edge.lines().find(|l| l.contains("certificate_expired")).expect("the Edge logs the close");
    assert!(line.contains(NODE), "{line}");
    assert!(!line.contains(stack.dir.path().to_str().unwrap()), "no paths: {line}");

    // The node dials again, as it does (its TLS client config, with what it
    // kept of the first connection): refused at the handshake as expired,
    // and the node's dialer says so.
    match fake.dialer.connect().await {
        Err(TransportError::Refused(refusal)) => assert_eq!(refusal.label(), "expired", "{refusal}"),
        Err(other) => panic!("not a refusal: {other}"),
        Ok(_) => panic!("the Edge let an expired certificate in again"),
    }
    stack.wait_metric_at_least("iop_edge_node_handshake_rejections_total{reason=\"expired\"}", 1.0).await;
}

#[tokio::test]
async fn request_before_ready_is_refused_and_never_reaches_the_node() {
    let stack = Stack::start(StackOptions { start_node: false, ..Default::default() }).await;
    let mut fake = FakeNode::register(&stack).await;
    assert_eq!(stack.node(NODE).await["phase"], "registered");

    let (status, body) =
        json_body(stack.post("/v1/chat/completions", &chat_body("mock-ollama", "hi", false)).await).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "no_provider_available");

    // Anything the Edge had queued for this node arrives before the ready
    // response, in order: no run may be among it.
    let before_ready = fake.ready().await;
    assert!(!before_ready.iter().any(|m| matches!(m, Msg::RunAssign(_))), "{before_ready:?}");
    assert_eq!(stack.mock_stats().await["requests_total"], 0);
}

#[tokio::test]
async fn heartbeat_timeout_fences_and_node_reconnects_with_new_generation() {
    let stack = Stack::start(StackOptions { heartbeat: Some(FAST_HEARTBEAT), ..Default::default() }).await;
    let first = stack.wait_node_ready(NODE).await;

    stack.nodes[0].pause();
    stack.wait_metric_at_least("iop_edge_node_sessions_closed_total{reason=\"heartbeat_timeout\"}", 1.0).await;
    assert_eq!(stack.node(NODE).await["connected"], false);
    let (status, _) = json_body(stack.post("/v1/chat/completions", &chat_body("mock-ollama", "hi", false)).await).await;
    assert_eq!(status, 503, "a fenced node gets no work");

    stack.nodes[0].resume();
    let second = stack.wait_node_ready_after(NODE, first).await;
    assert!(second > first);
    let (status, body) =
        json_body(stack.post("/v1/chat/completions", &chat_body("mock-ollama", "again", false)).await).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn frames_for_a_fenced_generation_are_dropped_and_counted() {
    let stack =
        Stack::start(StackOptions { heartbeat: Some(FAST_HEARTBEAT), start_node: false, ..Default::default() }).await;
    let mut fake = FakeNode::register(&stack).await;
    // Answer heartbeats until ready, then go silent.
    fake.ready().await;

    let request = tokio::spawn({
        let (client, url) = (stack.client.clone(), stack.url("/v1/chat/completions"));
        async move {
            let body = serde_json::to_vec(&chat_body("mock-ollama", "hi", false)).unwrap();
            let response = client.post(url).header("content-type", "application/json").body(body).send().await.unwrap();
            json_body(response).await
        }
    });
    let run = fake.next_run().await;
    let (tx, rx) = mpsc::channel(16);
    tx.send(pb::RunUplink {
        frame: Some(Frame::Open(pb::RunOpen { run_id: run.run_id.clone(), generation: fake.generation })),
    })
    .await
    .unwrap();
    tx.send(event(1, run_event::Event::Started(pb::RunStarted { model: "mock".into(), ..Default::default() })))
        .await
        .unwrap();
    let mut events_client = fake.client.clone();
    let mut downlink = events_client.run_events(ReceiverStream::new(rx)).await.unwrap().into_inner();
    // A small request rides the assignment (issue 9); the call's answer
    // carries nothing.
    let assigned = run.request.expect("a small request rides the assignment");
    assert_eq!(assigned.run_id, run.run_id);
    assert_eq!(assigned.messages.last().unwrap().content, "hi");
    let uplink = tokio::spawn(async move { while let Ok(Some(_)) = downlink.message().await {} });

    // The fake never acknowledges heartbeats: the Edge closes the session.
    let closed = loop {
        match fake.inbound.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("control stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(closed.message(), "heartbeat_timeout");

    // The in-flight run ends with a typed transport failure.
    let (status, body) = request.await.unwrap();
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["error"]["code"], "transport_lost");

    // Frames that still arrive for the fenced generation are dropped and counted.
    let sample = "iop_edge_fenced_frames_total{reason=\"fenced_generation\"}";
    let before = stack.metric(sample).await;
    tx.send(event(2, run_event::Event::Text(pb::TextDelta { text: "late".into() }))).await.unwrap();
    stack.wait_metric_at_least(sample, before + 1.0).await;
    drop(tx);
    let _ = uplink.await;
}

#[tokio::test]
async fn node_reconnects_on_its_own_after_an_edge_restart() {
    let mut stack = Stack::start(StackOptions::default()).await;
    let first = stack.wait_node_ready(NODE).await;
    let status = stack.edge.take().unwrap().terminate().await;
    assert!(status.success(), "edge exits cleanly on SIGTERM: {status:?}");

    stack.start_edge().await;
    let second = stack.wait_node_ready_after(NODE, 0).await;
    assert!(second > first, "generations are unique across edge restarts ({first} -> {second})");
    wait_until("a request succeeds after the restart", WAIT, || async {
        stack.post("/v1/chat/completions", &chat_body("mock-ollama", "hi", false)).await.status() == 200
    })
    .await;
}

#[tokio::test]
async fn config_reload_applies_valid_changes_keeps_the_old_config_on_errors_and_drops_removed_nodes() {
    let stack = Stack::start(StackOptions::default()).await;
    let original = std::fs::read_to_string(&stack.edge_config).unwrap();
    assert_eq!(stack.get_json("/admin/v1/config").await["config"]["revision"], 1);

    // A valid change: a new public model on an existing provider.
    let mut config = iop_proto::config::EdgeConfig::from_yaml(&original).unwrap();
    config.providers[0].models.push(iop_proto::config::PublicModel { name: "added-model".into(), priority: 0 });
    std::fs::write(&stack.edge_config, config.to_yaml()).unwrap();
    wait_until("the reload is applied", WAIT, || async {
        stack.get_json("/admin/v1/config").await["config"]["revision"] == 2
    })
    .await;
    let (status, _) = json_body(stack.post("/v1/chat/completions", &chat_body("added-model", "hi", false)).await).await;
    assert_eq!(status, 200, "the new route serves at once; the node was not disturbed");
    assert_eq!(stack.metric("iop_edge_config_revision").await, 2.0);

    // A renewed server certificate (same file names) is picked up as well.
    let renewed = stack.pki.ca.server_cert(&["localhost"]);
    std::fs::write(&stack.pki.edge.cert, &renewed.cert_pem).unwrap();
    std::fs::write(&stack.pki.edge.key, &renewed.key_pem).unwrap();
    wait_until("the certificate reload is applied", WAIT, || async {
        stack.get_json("/admin/v1/config").await["config"]["revision"] == 3
    })
    .await;

    // An invalid file is rejected and the previous config keeps serving.
    std::fs::write(&stack.edge_config, original.replace("adapter: ollama", "adapter: nonsense")).unwrap();
    wait_until("the reload is rejected", WAIT, || async {
        stack.get_json("/admin/v1/config").await["config"]["last_error"].is_string()
    })
    .await;
    assert_eq!(stack.get_json("/admin/v1/config").await["config"]["revision"], 3);
    let (status, _) = json_body(stack.post("/v1/chat/completions", &chat_body("added-model", "hi", false)).await).await;
    assert_eq!(status, 200);

    // Removing the node's identity closes its session and refuses it.
    let mut config = iop_proto::config::EdgeConfig::from_yaml(&original).unwrap();
    config.providers.clear();
    config.nodes.clear();
    std::fs::write(&stack.edge_config, config.to_yaml()).unwrap();
    stack.wait_metric_at_least("iop_edge_node_sessions_closed_total{reason=\"config_changed\"}", 1.0).await;
    stack.wait_metric_at_least("iop_edge_node_handshake_rejections_total{reason=\"unknown_node\"}", 1.0).await;
    assert_eq!(stack.get_json("/readyz").await["ready_nodes"], 0);
}

/// Removing a node from `nodes` cuts it off, not only its session: a node
/// that keeps its open connection after the reload (a modified binary; the
/// real one dials anew and is refused at the handshake) and opens a new
/// Control call on it is not registered again, and the connection itself
/// is gone.
#[tokio::test]
async fn a_removed_node_cannot_register_again_on_the_connection_it_kept() {
    let stack = Stack::start(StackOptions { start_node: false, ..Default::default() }).await;
    let mut fake = FakeNode::register(&stack).await;
    let connections = format!("iop_edge_node_connections{{node=\"{NODE}\"}}");
    assert_eq!(stack.metric(&connections).await, 1.0);

    let mut config =
        iop_proto::config::EdgeConfig::from_yaml(&std::fs::read_to_string(&stack.edge_config).unwrap()).unwrap();
    config.nodes.clear();
    config.providers.clear();
    std::fs::write(&stack.edge_config, config.to_yaml()).unwrap();
    // The session ends (with `config_changed`, or the connection under it).
    while let Ok(Some(_)) = tokio::time::timeout(WAIT, fake.inbound.message()).await.expect("the session ends") {}
    stack.wait_metric_at_least("iop_edge_node_sessions_closed_total{reason=\"config_changed\"}", 1.0).await;

    // The same client again: a new Control call with a Register.
    let (out, rx) = mpsc::channel(16);
    out.send(msg(node_to_edge::Msg::Register(pb::Register { node_version: "fake".into(), ..Default::default() })))
        .await
        .unwrap();
    let answer = async {
        let mut inbound = fake.client.control(ReceiverStream::new(rx)).await?.into_inner();
        inbound.message().await
    };
    match tokio::time::timeout(WAIT, answer).await.expect("an answer to the second Register") {
        Ok(Some(pb::EdgeToNode { msg: Some(Msg::RegisterResponse(r)) })) => {
            panic!("a removed node registered again (generation {})", r.generation)
        }
        other => assert!(other.is_err(), "refused with a status: {other:?}"),
    }
    wait_until("the removed node's connection is closed", WAIT, || async { stack.metric(&connections).await == 0.0 })
        .await;
}

/// A large prompt travels on its run's own call: while 32 MiB sit unread in
/// transit there, the control stream keeps carrying heartbeats and other
/// runs' assignments, and the prompt arrives intact once read.
// Multi-threaded: the test's own 32 MiB upload must not starve the fake
// node's heartbeat answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_prompt_in_transit_does_not_hold_up_the_control_stream() {
    let limits = iop_proto::config::Limits { max_body_bytes: 32 * 1024 * 1024, ..Default::default() };
    let stack = Stack::start(StackOptions {
        // Heartbeats every 100 ms; a session is fenced after 5 s without
        // one. A control stream held up behind the prompt stops them for
        // good, which fails the test either way; the 5 s only keep a
        // machine busy with other tests (and this test's 32 MiB copies in
        // debug builds) from fencing a healthy session: CI saw the 400 ms
        // of FAST_HEARTBEAT run out, and three CPU hogs the next 2 s.
        heartbeat: Some("100,5000"),
        start_node: false,
        limits: Some(limits),
        ..Default::default()
    })
    .await;
    let prompt = "a".repeat(32 * 1024 * 1024 - 1024);
    let big_body = serde_json::to_vec(&chat_body("mock-ollama", &prompt, false)).unwrap();
    let mut fake = FakeNode::register(&stack).await;
    fake.ready().await;

    let post = |body: Vec<u8>| {
        let (client, url) = (stack.client.clone(), stack.url("/v1/chat/completions"));
        tokio::spawn(async move { client.post(url).header("content-type", "application/json").body(body).send().await })
    };
    let small_body = |text: &str| serde_json::to_vec(&chat_body("mock-openai", text, false)).unwrap();
    let _big = post(big_body);
    let big = fake.next_run_answering_heartbeats().await;
    assert_eq!(big.request, None, "only a small request rides the control stream");
    // Open the big run's call and leave its answer unread: HTTP/2 flow
    // control holds the rest of the prompt on the Edge.
    let (tx, rx) = mpsc::channel(16);
    tx.send(pb::RunUplink {
        frame: Some(Frame::Open(pb::RunOpen { run_id: big.run_id.clone(), generation: fake.generation })),
    })
    .await
    .unwrap();
    let mut big_call = fake
        .client
        .clone()
        .max_decoding_message_size(iop_proto::wire::MAX_RUN_REQUEST_MESSAGE_BYTES)
        .run_events(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();

    // Heartbeats keep flowing both ways (the Edge would fence a session
    // whose heartbeats stopped), and so do other runs.
    let mut answered = 0;
    while answered < 5 {
        if let Msg::Heartbeat(hb) = fake.inbound.message().await.unwrap().unwrap().msg.unwrap() {
            fake.out.send(msg(node_to_edge::Msg::HeartbeatAck(pb::HeartbeatAck { seq: hb.seq }))).await.unwrap();
            answered += 1;
        }
    }
    let _small = post(small_body("small"));
    let small = fake.next_run_answering_heartbeats().await;
    assert_ne!(small.run_id, big.run_id, "another run's assignment arrived");
    assert!(small.request.is_some(), "with its small request");
    assert_eq!(stack.node(NODE).await["phase"], "ready");

    match big_call.message().await.unwrap().and_then(|d| d.msg) {
        Some(pb::run_downlink::Msg::Request(request)) => {
            assert_eq!(request.run_id, big.run_id);
            assert_eq!(request.messages.last().unwrap().content.len(), prompt.len(), "the prompt arrived intact");
        }
        None => panic!("the call's first answer is the request"),
    }
    drop(tx);
}
