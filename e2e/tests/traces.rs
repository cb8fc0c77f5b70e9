//! OpenTelemetry traces across real processes: an `iop-edge`, an `iop-node`
//! and the mock provider export to an OTLP/HTTP collector in this test
//! (decoding what they send with `opentelemetry-proto`). A request through
//! the official `openai` SDK with its own `traceparent` is one trace from
//! the client's span through the Edge's `ingress` and `attempt` to the
//! node's `provider call`, with the GenAI attributes and token counts, and
//! nothing in any attribute is the prompt or the API key; a tunnelled
//! request is traced the same way; a malformed `traceparent` starts a new
//! trace and is no error; a client span that is not sampled records
//! nothing anywhere; and what is queued when the processes stop is
//! sent before they exit.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use common::*;
use iop_e2e::harness::{ProviderSpec, wait_until};
use iop_proto::config::{Adapter, ProviderMode, TelemetryConfig};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// One exported span and the `service.name` of the process that sent it.
#[derive(Debug, Clone)]
struct Collected {
    service: String,
    span: Span,
}

type Spans = Arc<Mutex<Vec<Collected>>>;

async fn export(State(spans): State<Spans>, body: Bytes) -> &'static str {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf export");
    let mut spans = spans.lock().unwrap();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|a| a.key == "service.name")
            .and_then(|a| string(a.value.as_ref()?.value.as_ref()?))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            spans.extend(scope.spans.into_iter().map(|span| Collected { service: service.clone(), span }));
        }
    }
    ""
}

fn string(value: &Any) -> Option<String> {
    match value {
        Any::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

/// An OTLP/HTTP collector on loopback; its base URL and what it received.
async fn collector() -> (String, Spans) {
    let spans = Spans::default();
    let app = axum::Router::new().route("/v1/traces", axum::routing::post(export)).with_state(spans.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, spans)
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Any> {
    span.attributes.iter().find(|a| a.key == key)?.value.as_ref()?.value.as_ref()
}

fn attr_str(span: &Span, key: &str) -> String {
    attr(span, key).and_then(string).unwrap_or_else(|| panic!("{} has no string {key}: {span:?}", span.name))
}

fn attr_int(span: &Span, key: &str) -> i64 {
    match attr(span, key) {
        Some(Any::IntValue(i)) => *i,
        other => panic!("{} has no int {key} ({other:?}): {span:?}", span.name),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn in_trace(spans: &Spans, trace: &str) -> Vec<Collected> {
    spans.lock().unwrap().iter().filter(|c| hex(&c.span.trace_id) == trace).cloned().collect()
}

fn one<'a>(spans: &'a [Collected], service: &str, name: &str) -> &'a Span {
    let found: Vec<_> = spans.iter().filter(|c| c.service == service && c.span.name == name).collect();
    assert_eq!(found.len(), 1, "one {service} `{name}` span in {spans:#?}");
    &found[0].span
}

const PROMPT: &str = "zebra-quartz-7781 tell me a secret";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
const TUNNEL_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const TUNNEL_CLIENT_SPAN: &str = "b7ad6b7169203331";
const UNSAMPLED_TRACE: &str = "11112222333344445555666677778888";

#[tokio::test]
#[cfg_attr(iop_absent_python_sdks, ignore = "needs the Python SDKs: scripts/test-deps")]
async fn one_trace_spans_the_client_the_edge_and_the_node() {
    let (endpoint, spans) = collector().await;
    let (key, entry) = new_key("team-traces", &[]);
    let mut tunnel = ProviderSpec { mode: ProviderMode::Tunnel, ..provider("tun", Adapter::Openai, "mock", "tun", "") };
    tunnel.base_url = String::new();
    let stack = Stack::start(StackOptions {
        keys: Some(format!("principals:\n{entry}\n")),
        extra_providers: vec![tunnel],
        telemetry: TelemetryConfig { otlp_endpoint: Some(endpoint) },
        ..Default::default()
    })
    .await;

    let base = format!("http://{}", stack.http);
    let traceparent = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    let tunnel_traceparent = format!("00-{TUNNEL_TRACE}-{TUNNEL_CLIENT_SPAN}-01");
    run_script("traces.py", &[&base, &key, "mock-openai", "tun", PROMPT, &traceparent, &tunnel_traceparent]).await;
    // Each process exports on its schedule (5 s by default): wait for the
    // chat's spans, bounded.
    let complete = |trace: &str| {
        let got = in_trace(&spans, trace);
        let has = |service: &str, name: &str| got.iter().any(|c| c.service == service && c.span.name == name);
        has("iop-edge", "ingress") && has("iop-edge", "attempt") && has("iop-node", "provider call")
    };
    wait_until("the chat's spans from both processes", Duration::from_secs(40), || std::future::ready(complete(TRACE)))
        .await;
    // A malformed traceparent is ignored: a new trace, never an error. Sent
    // just after an export, so its spans are still queued when the processes stop.
    let response = stack
        .client
        .post(stack.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .header("traceparent", "00-not-a-trace-01")
        .header("content-type", "application/json")
        .body(chat_body("mock-ollama", PROMPT, true).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let _ = response.bytes().await.unwrap();

    // A client span that is not sampled: nothing of its trace is recorded,
    // on the Edge or (told through the run's traceparent) on the node.
    let unsampled = format!("00-{UNSAMPLED_TRACE}-{CLIENT_SPAN}-00");
    let response = stack
        .client
        .post(stack.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .header("traceparent", unsampled)
        .header("content-type", "application/json")
        .body(chat_body("mock-openai", PROMPT, false).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    // Stopping sends what is queued: once both processes exited, every
    // span is in, without waiting for a schedule.
    let mut stack = stack;
    stack.edge.take().expect("the edge").terminate().await;
    for node in stack.nodes.drain(..) {
        node.terminate().await;
    }
    assert!(complete(TUNNEL_TRACE), "the tunnel's spans were flushed at exit: {:#?}", spans.lock().unwrap());
    let new_root = spans.lock().unwrap().iter().find_map(|c| {
        let fresh = c.span.name == "ingress"
            && c.span.parent_span_id.is_empty()
            && attr(&c.span, "gen_ai.request.model").and_then(string).as_deref() == Some("mock-ollama");
        fresh.then(|| hex(&c.span.trace_id))
    });
    let new_root = new_root.expect("a malformed traceparent starts a new trace");
    assert!(in_trace(&spans, UNSAMPLED_TRACE).is_empty(), "{:#?}", in_trace(&spans, UNSAMPLED_TRACE));
    // Every node span continues an Edge trace (the unsampled one too: no
    // new root on the node): four requests, three recorded calls.
    let calls: Vec<_> =
        spans.lock().unwrap().iter().filter(|c| c.span.name == "provider call").map(|c| c.span.clone()).collect();
    assert_eq!(calls.len(), 3, "{calls:#?}");
    assert!(calls.iter().all(|c| !c.parent_span_id.is_empty()), "{calls:#?}");
    assert!(complete(&new_root), "its spans were flushed at exit: {:#?}", in_trace(&spans, &new_root));

    // The chat: client span -> ingress -> admission wait, attempt -> provider call -> stream.
    let trace = in_trace(&spans, TRACE);
    let ingress = one(&trace, "iop-edge", "ingress");
    assert_eq!(hex(&ingress.parent_span_id), CLIENT_SPAN, "the Edge's root is the client span's child");
    assert_eq!(attr_str(ingress, "gen_ai.operation.name"), "chat");
    assert_eq!(attr_str(ingress, "gen_ai.request.model"), "mock-openai");
    assert_eq!(attr_str(ingress, "iop.principal"), "team-traces");
    assert_eq!(attr_str(ingress, "iop.outcome"), "ok");
    assert_eq!(attr_int(ingress, "http.response.status_code"), 200);
    assert!(attr_int(ingress, "gen_ai.usage.input_tokens") > 0);
    assert!(attr_int(ingress, "gen_ai.usage.output_tokens") > 0);
    let admission = one(&trace, "iop-edge", "admission wait");
    assert_eq!(admission.parent_span_id, ingress.span_id);
    let attempt = one(&trace, "iop-edge", "attempt");
    assert_eq!(attempt.parent_span_id, ingress.span_id);
    assert_eq!(attr_str(attempt, "iop.provider.id"), "openai-mock");
    assert_eq!(attr_str(attempt, "iop.node"), NODE);
    assert_eq!(attr_int(attempt, "iop.attempt"), 1);
    assert_eq!(attr_str(attempt, "iop.attempt.outcome"), "committed");
    assert_eq!(attr_str(attempt, "gen_ai.provider.name"), "openai");
    assert_eq!(attr_str(attempt, "gen_ai.request.model"), "mock-openai");
    assert_eq!(attr_str(attempt, "gen_ai.response.model"), "mock");
    assert!(attr_int(attempt, "gen_ai.usage.input_tokens") > 0);
    assert!(attr_int(attempt, "gen_ai.usage.output_tokens") > 0);
    let call = one(&trace, "iop-node", "provider call");
    assert_eq!(call.parent_span_id, attempt.span_id, "the node's call is the Edge attempt's child");
    assert_eq!(attr_str(call, "gen_ai.operation.name"), "chat");
    assert_eq!(attr_str(call, "gen_ai.provider.name"), "openai");
    assert_eq!(attr_str(call, "gen_ai.request.model"), "mock");
    assert_eq!(attr_str(call, "iop.execution"), "run");
    assert!(attr_int(call, "gen_ai.usage.input_tokens") > 0);
    assert!(attr_int(call, "gen_ai.usage.output_tokens") > 0);
    assert!(call.events.iter().any(|e| e.name == "first byte"), "{call:?}");
    let stream = one(&trace, "iop-node", "stream");
    assert_eq!(stream.parent_span_id, call.span_id);
    assert!(call.start_time_unix_nano <= stream.start_time_unix_nano);

    // The tunnel: the same chain, the node's call relays.
    let trace = in_trace(&spans, TUNNEL_TRACE);
    let ingress = one(&trace, "iop-edge", "ingress");
    assert_eq!(hex(&ingress.parent_span_id), TUNNEL_CLIENT_SPAN);
    let attempt = one(&trace, "iop-edge", "attempt");
    assert_eq!(attempt.parent_span_id, ingress.span_id);
    assert_eq!(attr_str(attempt, "iop.provider.id"), "tun");
    let call = one(&trace, "iop-node", "provider call");
    assert_eq!(call.parent_span_id, attempt.span_id);
    assert_eq!(attr_str(call, "iop.execution"), "tunnel");
    // The node read the tunnel's usage from the relayed body.
    assert!(attr_int(call, "gen_ai.usage.output_tokens") > 0);
    assert!(attr_int(attempt, "gen_ai.usage.output_tokens") > 0);
    assert!(attr_int(ingress, "gen_ai.usage.output_tokens") > 0);

    // Nothing exported carries the prompt or the key.
    for collected in spans.lock().unwrap().iter() {
        let span = &collected.span;
        let values = span.attributes.iter().filter_map(|a| a.value.as_ref()?.value.as_ref().and_then(string));
        for value in values.chain(std::iter::once(span.name.clone())) {
            assert!(!value.contains("zebra-quartz") && !value.contains(&key), "{span:?} leaks {value:?}");
        }
        let status = span.status.as_ref().map(|s| s.message.clone()).unwrap_or_default();
        assert!(!status.contains("zebra-quartz") && !status.contains(&key));
    }
}

/// A stream cut after text and continued on another provider: the broken
/// attempt and a `continuation` (with its own admission and attempt) are
/// children of the request's `ingress`, each attempt has the node's call
/// under it.
#[tokio::test]
async fn a_continued_stream_is_one_trace() {
    let (endpoint, spans) = collector().await;
    let on = |id: &str, adapter, target: &str, priority| ProviderSpec {
        priority,
        ..provider(id, adapter, target, "story", "")
    };
    let stack = Stack::start(StackOptions {
        extra_providers: vec![
            on("cuts", Adapter::Ollama, "mock@words=20,cut_after=6", 0),
            on("whole", Adapter::Openai, "mock@words=20", 1),
        ],
        telemetry: TelemetryConfig { otlp_endpoint: Some(endpoint) },
        ..Default::default()
    })
    .await;
    stack.declare_continuation(&["cuts", "whole"]).await;
    let response = stack
        .client
        .post(stack.url("/v1/chat/completions"))
        .header("traceparent", format!("00-{TRACE}-{CLIENT_SPAN}-01"))
        .header("content-type", "application/json")
        .body(chat_body("story", PROMPT, true).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    assert!(text.contains("w20"), "{text}");
    let mut stack = stack;
    stack.edge.take().expect("the edge").terminate().await;
    for node in stack.nodes.drain(..) {
        node.terminate().await;
    }

    let trace = in_trace(&spans, TRACE);
    let ingress = one(&trace, "iop-edge", "ingress");
    assert_eq!(attr_str(ingress, "iop.outcome"), "ok");
    let continuation = one(&trace, "iop-edge", "continuation");
    assert_eq!(continuation.parent_span_id, ingress.span_id);
    assert_eq!(attr_str(continuation, "iop.continuation.result"), "continued");
    let attempts: Vec<&Span> = trace.iter().filter(|c| c.span.name == "attempt").map(|c| &c.span).collect();
    assert_eq!(attempts.len(), 2, "{trace:#?}");
    let by_provider = |id: &str| *attempts.iter().find(|a| attr_str(a, "iop.provider.id") == id).expect(id);
    let broken = by_provider("cuts");
    assert_eq!(broken.parent_span_id, ingress.span_id);
    assert_eq!(attr_str(broken, "error.type"), "provider_stream_cut");
    let answering = by_provider("whole");
    assert_eq!(answering.parent_span_id, continuation.span_id);
    assert_eq!(attr_str(answering, "iop.attempt.outcome"), "committed");
    let calls: Vec<&Span> = trace.iter().filter(|c| c.span.name == "provider call").map(|c| &c.span).collect();
    assert_eq!(calls.len(), 2, "{trace:#?}");
    for attempt in [broken, answering] {
        assert!(calls.iter().any(|c| c.parent_span_id == attempt.span_id), "a node call under {attempt:?}");
    }
}
