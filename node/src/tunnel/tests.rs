//! Tunnel tests against real sockets: a fake provider (adapter/fake.rs) and,
//! for the gRPC wrapper, a fake Edge serving `TunnelFrames` over plain h2.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::*;
use crate::adapter::AdapterKind;
use crate::adapter::fake::{self, Reply};
use crate::transport::fake_edge::{self, Downlink};

const TEST_WAIT: Duration = Duration::from_secs(5);

fn providers(base_url: &str) -> Providers {
    Providers::from([("p1".to_owned(), Ok(fake::target(AdapterKind::OpenAi, base_url)))])
}

fn header(name: &str, value: &str) -> pb::HttpHeader {
    pb::HttpHeader { name: name.into(), value: value.into() }
}

fn tunnel_request(method: &str, path: &str) -> pb::ProviderTunnelRequest {
    pb::ProviderTunnelRequest {
        tunnel_id: "t1".into(),
        provider_id: "p1".into(),
        adapter: pb::AdapterKind::Openai.into(),
        target_model: "test-model".into(),
        method: method.into(),
        path: path.into(),
        headers: vec![header("content-type", "application/json")],
        body: br#"{"model":"test-model","stream":true}"#.to_vec(),
        response_stall_timeout_ms: 0,
        first_byte_timeout_ms: 0,
        lease: None,
        traceparent: String::new(),
        strip_usage_chunk: false,
    }
}

/// A running `serve` whose uplink frames the test reads one by one.
struct Relay {
    frames: mpsc::Receiver<Box<pb::TunnelUplink>>,
    done: tokio::task::JoinHandle<bool>,
}

impl Relay {
    fn start(
        providers: Providers,
        request: pb::ProviderTunnelRequest,
        cancel: Cancel,
        edge_gone: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        Self::start_with(LocalAdmission::default(), providers, request, cancel, edge_gone)
    }

    fn start_with(
        admission: LocalAdmission,
        providers: Providers,
        request: pb::ProviderTunnelRequest,
        cancel: Cancel,
        edge_gone: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        let (tx, frames) = mpsc::channel(8);
        let done = tokio::spawn(async move {
            let mut uplink = Uplink::new(tx);
            let http = adapter::http_client();
            let observer = Observer::unbound();
            serve(&http, (&providers, &admission), None, request, &mut uplink, &cancel, edge_gone, &observer).await
        });
        Self { frames, done }
    }

    async fn next(&mut self) -> Option<pb::ProviderTunnelFrame> {
        let uplink = tokio::time::timeout(TEST_WAIT, self.frames.recv()).await.expect("a frame in time")?;
        match uplink.msg {
            Some(pb::tunnel_uplink::Msg::Frame(frame)) => Some(frame),
            other => panic!("serve sends frames only, got {other:?}"),
        }
    }

    /// Every frame until the uplink closes, plus whether a terminal was sent.
    async fn finish(mut self) -> (Vec<pb::ProviderTunnelFrame>, bool) {
        let mut frames = Vec::new();
        while let Some(frame) = self.next().await {
            frames.push(frame);
        }
        (frames, tokio::time::timeout(TEST_WAIT, self.done).await.expect("serve ended in time").unwrap())
    }
}

/// Runs a whole tunnel; the Edge never ends the call.
async fn relay_all(providers: Providers, request: pb::ProviderTunnelRequest) -> Vec<pb::ProviderTunnelFrame> {
    let (frames, terminal_sent) =
        Relay::start(providers, request, Cancel::new(), std::future::pending()).finish().await;
    assert!(terminal_sent);
    assert_well_formed(&frames);
    frames
}

/// seq 1.. without gaps, every frame valid, exactly one terminal and it is
/// last, and a head (if any) comes first.
fn assert_well_formed(frames: &[pb::ProviderTunnelFrame]) {
    for (i, frame) in frames.iter().enumerate() {
        assert_eq!(frame.seq, i as u64 + 1, "{frames:?}");
        frame.validate().unwrap();
        assert_eq!(frame.is_terminal(), i + 1 == frames.len(), "{frames:?}");
        if matches!(frame.frame, Some(Frame::Head(_))) {
            assert_eq!(i, 0, "head comes first: {frames:?}");
        }
    }
}

fn head(frames: &[pb::ProviderTunnelFrame]) -> &pb::TunnelResponseHead {
    match &frames[0].frame {
        Some(Frame::Head(head)) => head,
        other => panic!("expected a head, got {other:?}"),
    }
}

fn head_header<'h>(head: &'h pb::TunnelResponseHead, name: &str) -> Option<&'h str> {
    head.headers.iter().find(|h| h.name == name).map(|h| h.value.as_str())
}

fn body(frames: &[pb::ProviderTunnelFrame]) -> Vec<u8> {
    frames
        .iter()
        .filter_map(|f| match &f.frame {
            Some(Frame::Body(bytes)) => Some(bytes.as_slice()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .concat()
}

fn failure(frame: &pb::ProviderTunnelFrame) -> &pb::ExecutionFailure {
    match &frame.frame {
        Some(Frame::Failed(pb::RunFailed { failure: Some(failure) })) => failure,
        other => panic!("expected a failure, got {other:?}"),
    }
}

// ------------------------------------------------------------- relaying

#[tokio::test]
async fn streamed_sse_is_relayed_byte_for_byte_as_head_body_end() {
    let chunks = ["data: {\"id\":1,\"text\":\"Hel\"}\n\n", "data: {\"id\":2,\"text\":\"lo\"}\n\n", "data: [DONE]\n\n"];
    let mut provider = fake::serve(Reply::chunks(200, "text/event-stream", chunks)).await;
    let mut request = tunnel_request("POST", "/v1/chat/completions?trace=1");
    request.headers.push(header("x-request-id", "r-42"));
    let frames = relay_all(providers(&provider.base_url), request.clone()).await;

    assert_eq!(head(&frames).status, 200);
    assert_eq!(head_header(head(&frames), "content-type"), Some("text/event-stream"));
    assert_eq!(body(&frames), chunks.concat().as_bytes());
    assert!(matches!(frames.last().unwrap().frame, Some(Frame::End(_))));

    let seen = provider.request().await;
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str(), seen.query.as_deref()),
        ("POST", "/v1/chat/completions", Some("trace=1"))
    );
    assert_eq!(seen.body, request.body);
    assert_eq!(seen.header("content-type"), Some("application/json"));
    assert_eq!(seen.header("x-request-id"), Some("r-42"));
}

fn end_usage(frames: &[pb::ProviderTunnelFrame]) -> Option<pb::Usage> {
    match &frames.last().unwrap().frame {
        Some(Frame::End(end)) => end.usage,
        other => panic!("expected an end, got {other:?}"),
    }
}

/// The end of a 2xx tunnel carries the usage the answer reported (stream
/// or JSON body), for the Edge's accounting; an error answer's does not
/// count, and an answer without usage has none.
#[tokio::test]
async fn the_end_carries_the_usage_the_answer_reported() {
    let chunks = [
        "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5,\"completion_tokens_details\":{\"reasoning_tokens\":2}}}\n\ndata: [DONE]\n\n",
    ];
    let provider = fake::serve(Reply::chunks(200, "text/event-stream", chunks)).await;
    let frames = relay_all(providers(&provider.base_url), tunnel_request("POST", "/v1/chat/completions")).await;
    assert_eq!(body(&frames), chunks.concat().as_bytes(), "read as it passes, relayed unchanged");
    assert_eq!(end_usage(&frames), Some(pb::Usage::provider(12, 5, 2)));

    let answer = r#"{"type":"message","usage":{"input_tokens":8,"output_tokens":3}}"#;
    let provider = fake::serve(Reply::json(200, answer)).await;
    let frames = relay_all(providers(&provider.base_url), tunnel_request("POST", "/v1/messages")).await;
    assert_eq!(end_usage(&frames), Some(pb::Usage::provider(8, 3, 0)));

    let refused = r#"{"error":{"message":"no"},"usage":{"prompt_tokens":8}}"#;
    let provider = fake::serve(Reply::json(400, refused)).await;
    let frames = relay_all(providers(&provider.base_url), tunnel_request("POST", "/v1/chat/completions")).await;
    assert_eq!(end_usage(&frames), None);

    let provider = fake::serve(Reply::json(200, r#"{"data":[]}"#)).await;
    let frames = relay_all(providers(&provider.base_url), tunnel_request("GET", "/v1/models")).await;
    assert_eq!(end_usage(&frames), None);
}

/// The usage chunk the Edge asked for on the client's behalf is read for
/// the end and left out of the relayed stream; a stream the provider ends
/// without usage is charged its deltas and its prompt's estimate.
#[tokio::test]
async fn a_usage_chunk_the_client_did_not_ask_for_is_read_and_left_out() {
    let text = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
    let usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5}}\n\n";
    let provider = fake::serve(Reply::chunks(200, "text/event-stream", [text, usage, "data: [DONE]\n\n"])).await;
    let request =
        pb::ProviderTunnelRequest { strip_usage_chunk: true, ..tunnel_request("POST", "/v1/chat/completions") };
    let frames = relay_all(providers(&provider.base_url), request).await;
    assert_eq!(body(&frames), format!("{text}data: [DONE]\n\n").as_bytes());
    assert_eq!(end_usage(&frames), Some(pb::Usage::provider(12, 5, 0)));

    let provider = fake::serve(Reply::chunks(200, "text/event-stream", [text, text, "data: [DONE]\n\n"])).await;
    let request = tunnel_request("POST", "/v1/chat/completions");
    let estimate = request.body.len().div_ceil(4) as u32;
    let frames = relay_all(providers(&provider.base_url), request).await;
    let usage = end_usage(&frames).unwrap();
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (estimate, 2));
    assert_eq!((usage.input_source(), usage.output_source()), (pb::UsageSource::Estimated, pb::UsageSource::Counted));
}

#[tokio::test]
async fn get_requests_are_relayed_without_a_body() {
    let mut provider = fake::serve(Reply::json(200, r#"{"data":[]}"#)).await;
    let mut request = tunnel_request("GET", "/v1/models");
    request.body.clear();
    let frames = relay_all(providers(&provider.base_url), request).await;
    assert_eq!(body(&frames), br#"{"data":[]}"#);
    let seen = provider.request().await;
    assert_eq!((seen.method.as_str(), seen.path.as_str(), seen.body.len()), ("GET", "/v1/models", 0));
}

#[tokio::test]
async fn error_statuses_are_relayed_not_failed() {
    let error = r#"{"error":{"message":"overloaded"}}"#;
    let provider = fake::serve(Reply::json(503, error).header("retry-after", "2")).await;
    let frames = relay_all(providers(&provider.base_url), tunnel_request("POST", "/v1/chat/completions")).await;
    assert_eq!(head(&frames).status, 503);
    assert_eq!(head_header(head(&frames), "retry-after"), Some("2"));
    assert_eq!(body(&frames), error.as_bytes());
    assert!(matches!(frames.last().unwrap().frame, Some(Frame::End(_))));
}

#[tokio::test]
async fn only_allowlisted_headers_cross_in_either_direction() {
    let reply = Reply::chunks(200, "text/event-stream", ["data: 1\n\n", "data: 2\n\n"])
        .header("x-ratelimit-remaining-tokens", "99")
        .header("x-request-id", "req-1")
        .header("set-cookie", "session=provider-secret; HttpOnly")
        .header("openai-organization", "acme-corp")
        .header("x-provider", "yes")
        .header("keep-alive", "timeout=5")
        .header("proxy-authenticate", "Basic")
        .header("connection", "close");
    let mut provider = fake::serve(reply).await;
    let mut request = tunnel_request("POST", "/v1/chat/completions");
    for (name, value) in [
        ("Authorization", "Bearer client-secret"),
        ("x-api-key", "client-secret"),
        ("Cookie", "session=client-secret"),
        ("X-Forwarded-For", "10.0.0.1"),
        ("Forwarded", "for=10.0.0.1"),
        ("X-HTTP-Method-Override", "DELETE"),
        ("Metadata-Flavor", "Google"),
        ("X-aws-ec2-metadata-token", "client-token"),
        ("Accept-Encoding", "gzip"),
        ("Connection", "upgrade"),
        ("Upgrade", "websocket"),
        ("TE", "trailers"),
        ("Host", "evil.example"),
        ("Content-Length", "999"),
        ("Transfer-Encoding", "chunked"),
        ("OpenAI-Beta", "assistants=v2"),
        ("anthropic-version", "2023-06-01"),
    ] {
        request.headers.push(header(name, value));
    }
    let body_len = request.body.len();
    let frames = relay_all(providers(&provider.base_url), request).await;

    let seen = provider.request().await;
    for name in [
        "authorization",
        "x-api-key",
        "cookie",
        "x-forwarded-for",
        "forwarded",
        "x-http-method-override",
        "metadata-flavor",
        "x-aws-ec2-metadata-token",
        "upgrade",
        "te",
        "transfer-encoding",
    ] {
        assert_eq!(seen.header(name), None, "{name} reached the provider: {:?}", seen.headers);
    }
    assert!(!seen.headers.iter().any(|(_, v)| v.contains("client-")), "{:?}", seen.headers);
    assert_ne!(seen.header("host"), Some("evil.example"));
    assert_ne!(seen.header("connection"), Some("upgrade"));
    assert_eq!(seen.header("accept-encoding"), Some("identity"), "the node reads the answer uncompressed");
    assert_eq!(seen.header("content-length"), Some(body_len.to_string().as_str()));
    assert_eq!(seen.header("openai-beta"), Some("assistants=v2"));
    assert_eq!(seen.header("anthropic-version"), Some("2023-06-01"));

    let head = head(&frames);
    assert_eq!(head_header(head, "x-ratelimit-remaining-tokens"), Some("99"));
    assert_eq!(head_header(head, "x-request-id"), Some("req-1"));
    for name in [
        "set-cookie",
        "openai-organization",
        "x-provider",
        "keep-alive",
        "proxy-authenticate",
        "connection",
        "transfer-encoding",
        "content-length",
    ] {
        assert_eq!(head_header(head, name), None, "{name} crossed back: {:?}", head.headers);
    }
}

// ------------------------------------------------- managed credentials

const SECRET: &str = "sk-proj-Zq8vK2mN4pR7tW1xY5aB3cD6eF9gH0jL";
/// A connection's leases and a lease on it for tunnel `t1` to `base_url`.
fn leased(base_url: &str) -> (crate::lease::SessionLeases, pb::SealedLease) {
    use crate::lease::test_support::{IDENTITY, binding, session};
    let leases = session();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let binding = pb::LeaseBinding {
        target_model: "test-model".into(),
        base_url: base_url.into(),
        execution_id: "t1".into(),
        ..binding("l1", now + 60_000)
    };
    let sealed = iop_proto::lease::seal(leases.key.public_key(), IDENTITY, &binding, SECRET.as_bytes()).unwrap();
    (leases, sealed)
}

/// A whole tunnel to a provider whose credential is managed.
async fn relay_managed(reply: Reply) -> (Vec<pb::ProviderTunnelFrame>, fake::Captured) {
    let mut provider = fake::serve(reply).await;
    let mut target = fake::target(AdapterKind::OpenAi, &provider.base_url);
    target.credential_profile = Some("key".into());
    let providers = Providers::from([("p1".to_owned(), Ok(target))]);
    let (leases, sealed) = leased(&provider.base_url);
    let mut request = tunnel_request("POST", "/v1/chat/completions");
    request.lease = Some(sealed);
    let (tx, mut rx) = mpsc::channel(64);
    let mut uplink = Uplink::new(tx);
    let (http, observer, admission) = (adapter::http_client(), Observer::unbound(), LocalAdmission::default());
    let pending = std::future::pending();
    let sent =
        serve(&http, (&providers, &admission), Some(&leases), request, &mut uplink, &Cancel::new(), pending, &observer)
            .await;
    assert!(sent);
    drop(uplink);
    let mut frames = Vec::new();
    while let Some(uplink) = rx.recv().await {
        match uplink.msg {
            Some(pb::tunnel_uplink::Msg::Frame(frame)) => frames.push(frame),
            other => panic!("serve sends frames only, got {other:?}"),
        }
    }
    assert_well_formed(&frames);
    (frames, provider.request().await)
}

#[tokio::test]
async fn a_provider_echoing_the_managed_key_does_not_hand_it_to_the_client() {
    // An error body quoting the header it got, and a header doing the same.
    let error = format!(r#"{{"error":{{"message":"Incorrect API key provided: Bearer {SECRET}"}}}}"#);
    let reply = Reply::json(401, &error).header("x-request-id", &format!("echo {SECRET}"));
    let (frames, seen) = relay_managed(reply).await;
    assert_eq!(seen.header("authorization"), Some(format!("Bearer {SECRET}").as_str()), "the provider got the key");
    assert_eq!(head(&frames).status, 401);
    assert_eq!(head_header(head(&frames), "x-request-id"), Some("echo [credential redacted]"));
    let relayed = String::from_utf8(body(&frames)).unwrap();
    assert_eq!(relayed, error.replace(SECRET, crate::scrub::REDACTED));

    // A stream whose error event splits the key across two chunks.
    let (first, second) = SECRET.split_at(20);
    let chunks = [
        "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n".to_owned(),
        format!("data: {{\"error\":{{\"message\":\"key Bearer {first}"),
        format!("{second} was revoked\"}}}}\n\n"),
    ];
    let (frames, _) = relay_managed(Reply::chunks(200, "text/event-stream", chunks.clone())).await;
    let relayed = String::from_utf8(body(&frames)).unwrap();
    assert_eq!(relayed, chunks.concat().replace(SECRET, crate::scrub::REDACTED));
    assert!(!relayed.contains(&SECRET[..16]) && !relayed.contains(&SECRET[SECRET.len() - 16..]), "{relayed}");
}

#[tokio::test]
async fn large_provider_chunks_are_split_into_small_frames() {
    let blob: Vec<u8> = (0..200 * 1024).map(|i| (i % 251) as u8).collect();
    let provider = fake::serve(Reply::chunks(200, "application/octet-stream", [blob.clone()])).await;
    let frames = relay_all(providers(&provider.base_url), tunnel_request("POST", "/v1/files")).await;
    let bodies: Vec<usize> = frames
        .iter()
        .filter_map(|f| match &f.frame {
            Some(Frame::Body(b)) => Some(b.len()),
            _ => None,
        })
        .collect();
    assert!(bodies.len() >= 4 && bodies.iter().all(|&n| n > 0 && n <= MAX_BODY_FRAME), "{bodies:?}");
    assert_eq!(body(&frames), blob);
}

// ------------------------------------------------------------- failures

#[tokio::test]
async fn connection_refused_is_a_single_failed_terminal() {
    let base_url = fake::refused_base_url().await;
    let frames = relay_all(providers(&base_url), tunnel_request("POST", "/v1/x")).await;
    assert_eq!(frames.len(), 1, "{frames:?}");
    let failure = failure(&frames[0]);
    assert_eq!(failure.kind(), pb::FailureKind::ProviderUnreachable);
    assert!(!failure.message.contains("/v1/x"), "the path stays out of the message: {}", failure.message);
    // Issue 8 item 7: nor the provider's (internal) address.
    let host = base_url.trim_start_matches("http://");
    assert!(!failure.message.contains(host), "the address stays out of the message: {}", failure.message);
}

/// Another session's tunnel holds the provider's one slot: refused as
/// capacity exhausted before the provider is called; the slot freed, the
/// next one runs.
#[tokio::test]
async fn a_provider_at_capacity_across_sessions_refuses_before_calling() {
    let mut provider = fake::serve(Reply::json(200, "{}")).await;
    let full = providers(&provider.base_url);
    let admission = LocalAdmission::default();
    admission.set_capacities([("p1".to_string(), 1)]);
    let held = admission.admit("p1").unwrap();
    let relay = Relay::start_with(
        admission.clone(),
        full.clone(),
        tunnel_request("POST", "/v1/x"),
        Cancel::new(),
        std::future::pending(),
    );
    let (frames, terminal_sent) = relay.finish().await;
    assert!(terminal_sent);
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(failure(&frames[0]).kind(), pb::FailureKind::CapacityExhausted);

    drop(held);
    let relay = Relay::start_with(
        admission.clone(),
        full,
        tunnel_request("POST", "/v1/x"),
        Cancel::new(),
        std::future::pending(),
    );
    let (frames, _) = relay.finish().await;
    assert_eq!(head(&frames).status, 200);
    assert_eq!(provider.request().await.path, "/v1/x", "only the admitted tunnel reached the provider");
    assert_eq!(admission.running("p1"), 0, "the tunnel's slot is freed when it ends");
}

#[tokio::test]
async fn a_body_cut_short_is_a_failure_after_the_head() {
    // Promises 100 bytes, sends 5, closes: the body read fails mid-way.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buf = vec![0; 4096];
        let _ = socket.read(&mut buf).await;
        let _ = socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nhello").await;
    });
    let frames = relay_all(providers(&base_url), tunnel_request("GET", "/v1/models")).await;
    assert_eq!(head(&frames).status, 200);
    assert_eq!(failure(frames.last().unwrap()).kind(), pb::FailureKind::ProviderStreamCut);
}

#[tokio::test]
async fn invalid_requests_fail_without_reaching_the_provider() {
    let mut provider = fake::serve(Reply::json(200, "{}")).await;
    let with = |f: &dyn Fn(&mut pb::ProviderTunnelRequest)| {
        let mut request = tunnel_request("POST", "/v1/chat/completions");
        f(&mut request);
        request
    };
    let cases = [
        with(&|r| r.path = "//evil.example/x".into()),
        with(&|r| r.path = "/../x".into()),
        with(&|r| r.path = "http://evil.example/x".into()),
        with(&|r| r.method = "DELETE".into()),
        with(&|r| r.method = "get".into()),
        with(&|r| r.provider_id = "other".into()),
        with(&|r| r.target_model = "other-model".into()),
        with(&|r| r.adapter = pb::AdapterKind::Ollama.into()),
        with(&|r| r.response_stall_timeout_ms = u64::MAX),
        // A header outside the allowlist is dropped, whatever its name; an
        // allowed one must be valid.
        with(&|r| r.headers.push(header("accept", "line\nbreak"))),
        with(&|r| r.headers.push(header("X-Request-Id", "nul\0byte"))),
    ];
    for request in cases {
        let frames = relay_all(providers(&provider.base_url), request.clone()).await;
        assert_eq!(frames.len(), 1, "{request:?}: {frames:?}");
        let failure = failure(&frames[0]);
        assert_eq!(failure.kind(), pb::FailureKind::InvalidRequest, "{request:?}");
        assert!(!failure.message.contains("evil"), "{}", failure.message);
    }
    assert!(tokio::time::timeout(Duration::from_millis(20), provider.request()).await.is_err());
}

#[test]
fn paths_cannot_leave_the_base_url() {
    let bad = [
        "",
        "v1/models",
        "//evil",
        "//evil.example/v1",
        "/../x",
        "/v1/../../x",
        "/v1/..",
        "/./x",
        "/%2e%2E/x",
        "/.%2e/x",
        "/v1/%2e%2e%2Fadmin",
        "/v1/..%5cadmin",
        "http://x",
        "/v1?next=http://evil",
        "/v1#frag",
        "/\\evil",
        "/v1 /x",
        "/v1\r\nx: y",
    ];
    for path in bad {
        assert!(provider_url("http://127.0.0.1:11434", path).is_err(), "{path:?} accepted");
    }
    let ok = |base: &str, path: &str| provider_url(base, path).unwrap().to_string();
    assert_eq!(ok("http://127.0.0.1:11434", "/v1/models"), "http://127.0.0.1:11434/v1/models");
    assert_eq!(ok("http://127.0.0.1:11434", "/"), "http://127.0.0.1:11434/");
    assert_eq!(ok("http://h:1", "/api/tags?x=a..b&y=../z"), "http://h:1/api/tags?x=a..b&y=../z");
    assert_eq!(ok("https://llm.example/openai", "/v1/models"), "https://llm.example/openai/v1/models");
    assert_eq!(ok("http://h:1", "/v1/file..name"), "http://h:1/v1/file..name");
    assert_eq!(ok("http://h:1", "/v1/models/org%2FModel"), "http://h:1/v1/models/org%2FModel");
}

// ------------------------------------------------- cancel and edge gone

#[tokio::test]
async fn cancel_sends_cancelled_and_closes_the_provider_connection() {
    let (base_url, mut provider_closed) = fake::serve_hanging("text/event-stream", "data: 1\n\n").await;
    let cancel = Cancel::new();
    let mut relay =
        Relay::start(providers(&base_url), tunnel_request("POST", "/v1/x"), cancel.clone(), std::future::pending());
    assert!(matches!(relay.next().await.unwrap().frame, Some(Frame::Head(_))));
    assert_eq!(relay.next().await.unwrap().frame, Some(Frame::Body(b"data: 1\n\n".to_vec())));
    assert!(
        tokio::time::timeout(Duration::from_millis(20), &mut provider_closed).await.is_err(),
        "the provider body stays open while the tunnel is alive"
    );

    cancel.cancel(pb::CancelReason::Deadline);
    let (frames, terminal_sent) = relay.finish().await;
    assert!(terminal_sent);
    assert_eq!(frames.len(), 2, "{frames:?}");
    // The provider had the prompt and relayed no delta: the prompt's estimate.
    let Some(Frame::Usage(usage)) = &frames[0].frame else { panic!("{frames:?}") };
    let estimate = tunnel_request("POST", "/v1/x").body.len().div_ceil(4) as u32;
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (estimate, 0));
    assert_eq!(usage.input_source(), pb::UsageSource::Estimated);
    assert_eq!((frames[1].seq, &frames[1].frame), (4, &Some(Frame::Cancelled(pb::RunCancelled { reason: 3 }))));
    tokio::time::timeout(TEST_WAIT, provider_closed).await.expect("provider saw the close").unwrap();
}

#[tokio::test]
async fn the_edge_ending_the_call_stops_the_relay_without_a_terminal() {
    let (base_url, mut provider_closed) = fake::serve_hanging("text/event-stream", "data: 1\n\n").await;
    let (edge_gone_tx, edge_gone) = oneshot::channel::<()>();
    let edge_gone = async move {
        let _ = edge_gone.await;
    };
    let mut relay = Relay::start(providers(&base_url), tunnel_request("POST", "/v1/x"), Cancel::new(), edge_gone);
    assert!(matches!(relay.next().await.unwrap().frame, Some(Frame::Head(_))));
    assert!(matches!(relay.next().await.unwrap().frame, Some(Frame::Body(_))));
    assert!(tokio::time::timeout(Duration::from_millis(20), &mut provider_closed).await.is_err());

    drop(edge_gone_tx);
    let (frames, terminal_sent) = relay.finish().await;
    assert!(!terminal_sent);
    assert!(frames.is_empty(), "{frames:?}");
    tokio::time::timeout(TEST_WAIT, provider_closed).await.expect("provider saw the close").unwrap();
}

// ------------------------------------------------------ the gRPC wrapper

/// A fake Edge: answers each `TunnelFrames` call's open with `request`, then
/// records the call; ends it after the uplink ends, or after `answer_after`
/// messages (ending the call early).
struct FakeEdge {
    /// The answer to the open frame; `None` when the assignment carried it.
    request: Option<pb::ProviderTunnelRequest>,
    calls: mpsc::UnboundedSender<Vec<pb::TunnelUplink>>,
    answer_after: Option<usize>,
}

#[tonic::async_trait]
impl fake_edge::FakeEdge for FakeEdge {
    async fn tunnel_frames(
        &self,
        request: Request<Streaming<pb::TunnelUplink>>,
    ) -> Result<Response<Downlink<pb::TunnelDownlink>>, Status> {
        let mut stream = request.into_inner();
        let (downlink, rx) = mpsc::channel(1);
        let (calls, answer_after) = (self.calls.clone(), self.answer_after);
        let answer =
            self.request.clone().map(|r| pb::TunnelDownlink { msg: Some(pb::tunnel_downlink::Msg::Request(r)) });
        tokio::spawn(async move {
            let mut received = Vec::new();
            while Some(received.len()) != answer_after {
                match stream.message().await {
                    Ok(Some(message)) => {
                        if received.is_empty()
                            && let Some(answer) = answer.clone()
                        {
                            let _ = downlink.send(Ok(answer)).await;
                        }
                        received.push(message);
                    }
                    _ => break,
                }
            }
            let _ = calls.send(received);
            // Dropping `downlink` ends the call.
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

async fn fake_edge(
    request: Option<pb::ProviderTunnelRequest>,
    answer_after: Option<usize>,
) -> (NodeGatewayClient, mpsc::UnboundedReceiver<Vec<pb::TunnelUplink>>) {
    let (calls, received) = mpsc::unbounded_channel();
    (fake_edge::serve(FakeEdge { request, calls, answer_after }).await, received)
}

type NodeGatewayClient = pb::node_gateway_client::NodeGatewayClient<tonic::transport::Channel>;

fn context(client: NodeGatewayClient, providers: Providers) -> ExecutionContext {
    ExecutionContext {
        client,
        http: adapter::http_client(),
        providers: std::sync::Arc::new(providers),
        generation: 7,
        observer: Observer::unbound(),
        leases: None,
        admission: Default::default(),
        tracer: Default::default(),
    }
}

fn split_call(call: Vec<pb::TunnelUplink>) -> (pb::TunnelOpen, Vec<pb::ProviderTunnelFrame>) {
    let mut messages = call.into_iter().map(|m| m.msg.expect("a message"));
    let Some(pb::tunnel_uplink::Msg::Open(open)) = messages.next() else { panic!("the first message is the open") };
    let frames = messages
        .map(|m| match m {
            pb::tunnel_uplink::Msg::Frame(frame) => frame,
            other => panic!("only frames after the open: {other:?}"),
        })
        .collect();
    (open, frames)
}

/// The request either rode the assignment (issue 9) or is the Edge's
/// answer to the open frame; the tunnel is the same.
#[tokio::test]
async fn execute_opens_its_own_call_and_relays_through_it() {
    for inline in [false, true] {
        let provider = fake::serve(Reply::chunks(200, "text/event-stream", ["data: a\n\n", "data: b\n\n"])).await;
        let request = tunnel_request("POST", "/v1/chat/completions");
        let (answer, assigned) = if inline { (None, Some(request)) } else { (Some(request), None) };
        let (client, mut calls) = fake_edge(answer, None).await;
        let ctx = context(client, providers(&provider.base_url));
        let execution = execute(ctx, "t1".into(), assigned, Cancel::new());
        tokio::time::timeout(TEST_WAIT, execution).await.expect("tunnel ended in time");

        let (open, frames) = split_call(calls.recv().await.unwrap());
        assert_eq!(open, pb::TunnelOpen { tunnel_id: "t1".into(), generation: 7 });
        assert_well_formed(&frames);
        assert_eq!(head(&frames).status, 200);
        assert_eq!(body(&frames), b"data: a\n\ndata: b\n\n");
        assert!(matches!(frames.last().unwrap().frame, Some(Frame::End(_))));
    }
}

#[tokio::test]
async fn execute_stops_when_the_edge_ends_the_call() {
    let (base_url, provider_closed) = fake::serve_hanging("text/event-stream", "data: 1\n\n").await;
    // The Edge answers after the open and the head, then the call is over.
    let (client, mut calls) = fake_edge(Some(tunnel_request("POST", "/v1/x")), Some(2)).await;
    let ctx = context(client, providers(&base_url));
    tokio::time::timeout(TEST_WAIT, execute(ctx, "t1".into(), None, Cancel::new()))
        .await
        .expect("tunnel stopped once the edge ended the call");
    let (_, frames) = split_call(calls.recv().await.unwrap());
    assert!(matches!(frames[..], [pb::ProviderTunnelFrame { seq: 1, frame: Some(Frame::Head(_)) }]), "{frames:?}");
    tokio::time::timeout(TEST_WAIT, provider_closed).await.expect("provider saw the close").unwrap();
}

/// A tunnel that starts while its provider's model is not loaded and gets
/// its first byte is a load: measured from the request to the headers,
/// remembered, counted, and reported on the next residency report.
#[tokio::test]
async fn a_cold_tunnel_is_a_measured_load_and_reported() {
    use std::sync::atomic::{AtomicBool, Ordering};

    use crate::residency::ResidencyMonitor;

    const LOAD: Duration = Duration::from_millis(300);
    // LM Studio: not loaded until a chat has waited `LOAD` before its headers.
    let loaded = std::sync::Arc::new(AtomicBool::new(false));
    let (state, chat) = (loaded.clone(), loaded.clone());
    let app = axum::Router::new()
        .route(
            "/api/v0/models/test-model",
            axum::routing::get(move || {
                let state = if state.load(Ordering::SeqCst) { "loaded" } else { "not-loaded" };
                async move { axum::Json(serde_json::json!({ "id": "test-model", "state": state })) }
            }),
        )
        .route(
            "/v1/chat/completions",
            axum::routing::post(move || {
                let chat = chat.clone();
                async move {
                    tokio::time::sleep(LOAD).await;
                    chat.store(true, Ordering::SeqCst);
                    "data: a\n\n"
                }
            }),
        );
    let base_url = fake::serve_router(app).await;
    let target = fake::target(AdapterKind::OpenAi, &base_url);

    let monitor = ResidencyMonitor::new(Duration::from_secs(3600));
    let (out, mut reports) = mpsc::channel(8);
    let stop = tokio_util::sync::CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    tokio::spawn(monitor.clone().run(adapter::http_client(), vec![target], out, stop));
    let mut next_report = async || match tokio::time::timeout(TEST_WAIT, reports.recv()).await.unwrap().unwrap().msg {
        Some(pb::node_to_edge::Msg::ResidencyReport(r)) => r.providers,
        other => panic!("{other:?}"),
    };
    let first = next_report().await;
    assert_eq!((first[0].residency(), first[0].last_load_ms), (pb::ModelResidency::NotLoaded, 0));

    let (client, _calls) = fake_edge(Some(tunnel_request("POST", "/v1/chat/completions")), None).await;
    let mut ctx = context(client, providers(&base_url));
    ctx.observer.residency = Some(monitor.clone());
    let metrics = ctx.observer.metrics.clone();
    tokio::time::timeout(TEST_WAIT, execute(ctx, "t1".into(), None, Cancel::new())).await.expect("tunnel ended");

    let after = next_report().await;
    assert_eq!(after[0].residency(), pb::ModelResidency::Loaded);
    assert!(after[0].last_load_ms >= LOAD.as_millis() as u64, "{after:?}");
    assert!(after[0].last_loaded_at_unix_ms > 0);
    let text = metrics.encode();
    assert!(text.contains(r#"iop_node_model_loads_total{provider="p1"} 1"#), "{text}");
    assert!(text.contains(r#"iop_node_model_load_seconds_count{provider="p1"} 1"#), "{text}");
    assert_eq!(crate::residency::LoadMemory::global().last("test-model").ms, after[0].last_load_ms);

    // Warm now: the same wait before the headers is no load.
    let (client, _calls) = fake_edge(Some(tunnel_request("POST", "/v1/chat/completions")), None).await;
    let mut ctx = context(client, providers(&base_url));
    ctx.observer.residency = Some(monitor.clone());
    ctx.observer.metrics = metrics.clone();
    tokio::time::timeout(TEST_WAIT, execute(ctx, "t1".into(), None, Cancel::new())).await.expect("tunnel ended");
    assert!(metrics.encode().contains(r#"iop_node_model_loads_total{provider="p1"} 1"#));
}

// ------------------------------------------------- property tests

mod fuzz {
    use proptest::prelude::*;

    use super::*;

    /// The path a server that percent-decodes (`%2e`, `%2f`, `%5c`), takes
    /// `\` for `/` and resolves dot segments would serve.
    fn as_a_lenient_server_sees_it(path: &str) -> String {
        let bytes = path.as_bytes();
        let mut decoded = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            let hex = (bytes[i] == b'%').then(|| bytes.get(i + 1..i + 3)).flatten();
            match hex.and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()) {
                Some(b) => {
                    decoded.push(b);
                    i += 3;
                }
                None => {
                    decoded.push(bytes[i]);
                    i += 1;
                }
            }
        }
        let decoded = String::from_utf8_lossy(&decoded).replace('\\', "/");
        let mut stack: Vec<&str> = Vec::new();
        for segment in decoded.split('/') {
            match segment {
                "." => {}
                ".." => {
                    stack.pop();
                }
                s => stack.push(s),
            }
        }
        stack.join("/")
    }

    proptest! {
        /// Any path the Edge could relay is rejected, or names a URL on the
        /// provider's origin that stays under its base path, even for a
        /// server that decodes and normalizes the path before routing it.
        #[test]
        fn fuzz_tunnel_paths_stay_under_the_base_url(
            base in prop::sample::select(vec!["http://127.0.0.1:11434", "http://h:1/v1", "https://llm.example/a/b"]),
            pieces in prop::collection::vec(
                prop::sample::select(vec![
                    "/", "//", ".", "..", "%2e", "%2E", "%2f", "%5c", "\\", "?", "#", "a", "v1", "@", ":", "http:", "%",
                    "%zz", "\u{e9}", " ", "\t", "~", ";",
                ]),
                0..8,
            ),
            rooted in any::<bool>(),
        ) {
            // Half start with `/`, as every relayable path must.
            let path = if rooted { format!("/{}", pieces.concat()) } else { pieces.concat() };
            if let Ok(url) = provider_url(base, &path) {
                let base_url = reqwest::Url::parse(base).unwrap();
                prop_assert_eq!(url.origin(), base_url.origin());
                let base_path = base_url.path().trim_end_matches('/');
                let served = as_a_lenient_server_sees_it(url.path());
                prop_assert!(served.starts_with(&format!("{base_path}/")), "{path:?} -> {url} is served as {served:?}");
            }
        }
    }
}
