use super::*;
use crate::export::DEFAULT_SCHEDULE_DELAY;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN: &str = "00f067aa0ba902b7";

#[test]
fn traceparent_parse_table() {
    let valid = format!("00-{TRACE}-{SPAN}-01");
    let cases: Vec<(String, Option<bool>)> = vec![
        (valid.clone(), Some(true)),
        (format!("00-{TRACE}-{SPAN}-00"), Some(false)),
        // Other flag bits are kept out of "sampled".
        (format!("00-{TRACE}-{SPAN}-02"), Some(false)),
        // A later version may append fields.
        (format!("01-{TRACE}-{SPAN}-01-extra"), Some(true)),
        (format!("00-{TRACE}-{SPAN}-01-extra"), None),
        (format!("ff-{TRACE}-{SPAN}-01"), None),
        (format!("00-{}-{SPAN}-01", TRACE.to_uppercase()), None),
        (format!("00-{}-{SPAN}-01", "0".repeat(32)), None),
        (format!("00-{TRACE}-{}-01", "0".repeat(16)), None),
        (format!("00-{TRACE}-{SPAN}-0x"), None),
        (format!("00_{TRACE}-{SPAN}-01"), None),
        (format!("00-{TRACE}-{SPAN}-1"), None),
        (format!("00-{TRACE}-{SPAN}-01 "), None),
        (format!("01-{TRACE}-{SPAN}-01{}", "-x".repeat(300)), None),
        (format!("00-{}é-{SPAN}-01", &TRACE[..30]), None),
        (String::new(), None),
        ("garbage".into(), None),
    ];
    for (input, sampled) in cases {
        assert_eq!(SpanContext::parse(&input).map(|c| c.sampled), sampled, "{input:?}");
    }
    let parsed = SpanContext::parse(&valid).unwrap();
    assert_eq!(parsed.traceparent(), valid);
    assert_eq!(parsed.span_id, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
}

#[test]
fn off_tracer_spans_are_inert() {
    let tracer = Tracer::off();
    let mut span = tracer.start("ingress", Kind::Server, None);
    span.set("gen_ai.request.model", "m");
    assert_eq!(span.context(), None);
    assert_eq!(span.traceparent(), "");
    assert!(!span.has("gen_ai.request.model"));
}

fn config() -> ExporterConfig {
    ExporterConfig {
        endpoint: "http://127.0.0.1:1".into(),
        service_name: "iop-test",
        service_version: "0",
        schedule_delay: DEFAULT_SCHEDULE_DELAY,
    }
}

#[tokio::test]
async fn spans_are_children_of_their_parent_and_encode() {
    let (queue, mut spans) = tokio::sync::mpsc::channel(16);
    let sink = Arc::new(export::Sink { queue, dropped: Default::default() });
    let tracer = Tracer { exporter: Some(sink) };
    let client = SpanContext::parse(&format!("00-{TRACE}-{SPAN}-01")).unwrap();
    let mut root = tracer.start("ingress", Kind::Server, Some(client));
    root.set("gen_ai.usage.input_tokens", 7u32);
    root.set("gen_ai.usage.input_tokens", 8u32);
    let child = tracer.start_remote("provider call", Kind::Client, &root.traceparent());
    let root_id = root.context().unwrap().span_id;
    root.fail("deadline_exceeded");
    drop(child);
    root.end();
    let (child, child_end) = spans.recv().await.unwrap();
    let (root, root_end) = spans.recv().await.unwrap();
    assert_eq!(child.parent, Some(root_id));
    assert!(child.remote_parent);
    assert_eq!(root.parent, Some(client.span_id));
    assert_eq!(root.context.trace_id, client.trace_id);
    let request = export::encode(&config(), &[(root, root_end), (child, child_end)]);
    let spans = &request.resource_spans[0].scope_spans[0].spans;
    assert_eq!(spans[0].parent_span_id, client.span_id.to_vec());
    assert_eq!(spans[0].status.as_ref().unwrap().code, 2);
    let tokens: Vec<_> = spans[0].attributes.iter().filter(|a| a.key == "gen_ai.usage.input_tokens").collect();
    assert_eq!(tokens.len(), 1);
    assert_eq!(tokens[0].value.as_ref().unwrap().value, Some(otlp::any_value::Value::IntValue(8)));
    assert_eq!(spans[1].flags & otlp::FLAGS_REMOTE_PARENT, otlp::FLAGS_REMOTE_PARENT);
    assert!(!prost::Message::encode_to_vec(&request).is_empty());
}

#[tokio::test]
async fn an_unsampled_parent_records_nothing_but_propagates() {
    let (queue, mut spans) = tokio::sync::mpsc::channel(16);
    let sink = Arc::new(export::Sink { queue, dropped: Default::default() });
    let tracer = Tracer { exporter: Some(sink) };
    let span = tracer.start_remote("ingress", Kind::Server, &format!("00-{TRACE}-{SPAN}-00"));
    assert!(span.traceparent().ends_with("-00"));
    assert!(span.traceparent().contains(TRACE));
    drop(span);
    drop(tracer);
    assert!(spans.recv().await.is_none());
}

#[test]
fn schedule_delay_and_url() {
    assert_eq!(export::schedule_delay(None), DEFAULT_SCHEDULE_DELAY);
    assert_eq!(export::schedule_delay(Some("200")), std::time::Duration::from_millis(200));
    assert_eq!(export::schedule_delay(Some("0")), DEFAULT_SCHEDULE_DELAY);
    assert_eq!(export::schedule_delay(Some("x")), DEFAULT_SCHEDULE_DELAY);
    assert_eq!(export::traces_url("http://c:4318/"), "http://c:4318/v1/traces");
    assert_eq!(export::traces_url("http://c:4318"), "http://c:4318/v1/traces");
}

/// A collector on loopback that keeps every export it receives.
async fn collector() -> (String, std::sync::Arc<std::sync::Mutex<Vec<otlp::ExportTraceServiceRequest>>>) {
    use prost::Message;
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let keep = keep.clone();
            async move {
                keep.lock().unwrap().push(otlp::ExportTraceServiceRequest::decode(body).unwrap());
                ""
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, got)
}

#[tokio::test]
async fn shutdown_sends_what_is_queued_before_the_schedule() {
    let (endpoint, got) = collector().await;
    let config = ExporterConfig {
        endpoint,
        service_name: "iop-test",
        service_version: "0",
        // Far past the test: only the shutdown can send.
        schedule_delay: std::time::Duration::from_secs(3600),
    };
    let (tracer, exporter) = Exporter::start(config);
    // The schedule's first tick (at start) finds nothing to send.
    tokio::task::yield_now().await;
    for _ in 0..3 {
        tracer.start("ingress", Kind::Server, None).end();
    }
    exporter.shutdown(std::time::Duration::from_secs(10)).await;
    let got = got.lock().unwrap();
    let spans: usize =
        got.iter().flat_map(|r| &r.resource_spans).flat_map(|r| &r.scope_spans).map(|s| s.spans.len()).sum();
    assert_eq!(spans, 3, "{got:?}");
    let resource = got[0].resource_spans[0].resource.as_ref().unwrap();
    assert_eq!(resource.attributes[0].key, "service.name");
    // After the shutdown the tracer drops spans (nothing to send them).
    tracer.start("late", Kind::Internal, None).end();
}
