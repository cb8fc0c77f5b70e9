//! Test-only fake provider servers: a real axum server on 127.0.0.1:0 that
//! answers every request with one canned reply and records what it received.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use axum::serve::ListenerExt;
use futures_util::StreamExt;
use iop_proto::pb;
use tokio::sync::{mpsc, oneshot};

use super::{AdapterError, AdapterKind, EventSink, ProviderTarget};
use crate::metrics::NodeMetrics;

/// A canned HTTP reply: status, headers, and the body as separate chunks
/// (written a millisecond apart so they tend to arrive as separate reads).
#[derive(Clone, Debug)]
pub(crate) struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    chunks: Vec<Vec<u8>>,
}

impl Reply {
    pub(crate) fn chunks<I, C>(status: u16, content_type: &str, chunks: I) -> Self
    where
        I: IntoIterator<Item = C>,
        C: Into<Vec<u8>>,
    {
        Self {
            status,
            headers: vec![("content-type".into(), content_type.into())],
            chunks: chunks.into_iter().map(Into::into).collect(),
        }
    }

    pub(crate) fn json(status: u16, body: &str) -> Self {
        Self::chunks(status, "application/json", [body])
    }

    pub(crate) fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    fn response(&self) -> Response {
        let mut builder = Response::builder().status(self.status);
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        let body = futures_util::stream::iter(self.chunks.clone()).then(|chunk| async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok::<_, Infallible>(chunk)
        });
        builder.body(Body::from_stream(body)).unwrap()
    }
}

/// What the fake server received.
#[derive(Debug)]
pub(crate) struct Captured {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub content_type: Option<String>,
    /// Every request header, names lowercase, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Captured {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("request body is JSON")
    }
}

pub(crate) struct FakeProvider {
    pub base_url: String,
    requests: mpsc::UnboundedReceiver<Captured>,
}

impl FakeProvider {
    /// The next request the server received.
    pub(crate) async fn request(&mut self) -> Captured {
        tokio::time::timeout(Duration::from_secs(5), self.requests.recv())
            .await
            .expect("fake provider got a request in time")
            .expect("fake provider is running")
    }

    /// A request the server already received, if any (does not wait).
    pub(crate) fn received(&mut self) -> Option<Captured> {
        self.requests.try_recv().ok()
    }
}

/// Serves `reply` to every request.
pub(crate) async fn serve(reply: Reply) -> FakeProvider {
    let (tx, requests) = mpsc::unbounded_channel();
    let reply = Arc::new(reply);
    let app = Router::new().fallback(move |req: Request| {
        let tx = tx.clone();
        let reply = reply.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
            let _ = tx.send(Captured {
                method: parts.method.to_string(),
                path: parts.uri.path().to_owned(),
                query: parts.uri.query().map(str::to_owned),
                content_type: parts.headers.get("content-type").and_then(|v| v.to_str().ok()).map(str::to_owned),
                headers: parts
                    .headers
                    .iter()
                    .map(|(n, v)| (n.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
                    .collect(),
                body: body.to_vec(),
            });
            reply.response()
        }
    });
    FakeProvider { base_url: serve_router(app).await, requests }
}

/// Serves a 200 whose body sends `first` and then never ends; the receiver
/// fires when the server drops that body (i.e. the client went away).
pub(crate) async fn serve_hanging(content_type: &'static str, first: &'static str) -> (String, oneshot::Receiver<()>) {
    struct DropSignal(Option<oneshot::Sender<()>>);
    impl Drop for DropSignal {
        fn drop(&mut self) {
            if let Some(tx) = self.0.take() {
                let _ = tx.send(());
            }
        }
    }
    let (tx, rx) = oneshot::channel();
    let signal = Arc::new(std::sync::Mutex::new(Some(DropSignal(Some(tx)))));
    let app = Router::new().fallback(move || {
        let guard = signal.lock().unwrap().take();
        async move {
            let body = futures_util::stream::once(async move { Ok::<_, Infallible>(first.as_bytes().to_vec()) })
                .chain(futures_util::stream::pending())
                .map(move |chunk| {
                    let _keep_alive_until_dropped = &guard;
                    chunk
                });
            Response::builder().status(200).header("content-type", content_type).body(Body::from_stream(body)).unwrap()
        }
    });
    (serve_router(app).await, rx)
}

/// Accepts requests and never answers them (not even headers); the receiver
/// fires when a request's handler is dropped (the client went away).
pub(crate) async fn serve_hanging_headers() -> (String, oneshot::Receiver<()>) {
    let (tx, rx) = oneshot::channel::<()>();
    let tx = Arc::new(std::sync::Mutex::new(Some(tx)));
    let app = Router::new().fallback(move || {
        let tx = tx.lock().unwrap().take();
        async move {
            let _fires_on_drop = tx;
            futures_util::future::pending::<()>().await;
        }
    });
    (serve_router(app).await, rx)
}

pub(crate) async fn serve_router(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// A base URL nothing listens on.
pub(crate) async fn refused_base_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

pub(crate) fn assignment(adapter: i32, model: &str, base_url: &str) -> pb::ProviderAssignment {
    pb::ProviderAssignment {
        provider_id: "p1".into(),
        adapter,
        target_model: model.into(),
        base_url: base_url.into(),
        response_stall_timeout_ms: 0,
        credential_profile: String::new(),
        capacity: 0,
        keep_warm: false,
    }
}

pub(crate) fn target(adapter: AdapterKind, base_url: &str) -> ProviderTarget {
    ProviderTarget::new("p1", adapter, "test-model", base_url).expect("a valid test base URL")
}

pub(crate) fn user(text: &str) -> pb::ChatMessage {
    pb::ChatMessage { role: pb::Role::User.into(), content: text.into(), ..Default::default() }
}

pub(crate) fn request(messages: Vec<pb::ChatMessage>) -> pb::RunRequest {
    pb::RunRequest { run_id: "run-1".into(), provider_id: "p1".into(), messages, ..Default::default() }
}

/// Runs `execute` to completion and returns its result plus every event it sent.
pub(crate) async fn run(
    target: &ProviderTarget,
    request: &pb::RunRequest,
) -> (Result<pb::FinishReason, AdapterError>, Vec<pb::run_event::Event>) {
    run_counted(target, request, &NodeMetrics::new()).await
}

/// [`run`] counting into `metrics`.
pub(crate) async fn run_counted(
    target: &ProviderTarget,
    request: &pb::RunRequest,
    metrics: &NodeMetrics,
) -> (Result<pb::FinishReason, AdapterError>, Vec<pb::run_event::Event>) {
    let client = super::http_client();
    let (tx, mut rx): (EventSink, _) = mpsc::channel(1024);
    let result =
        tokio::time::timeout(Duration::from_secs(10), super::execute(&client, target, request, None, &tx, metrics))
            .await
            .expect("execute finished in time");
    drop(tx);
    let mut events = Vec::new();
    while let Some(event) = rx.recv().await {
        events.push(event);
    }
    (result, events)
}

/// Asserts that dropping a running `execute` future closes the provider
/// connection (the server sees its response body dropped).
pub(crate) async fn assert_drop_closes_connection(
    adapter: AdapterKind,
    content_type: &'static str,
    first: &'static str,
) {
    let (base_url, dropped) = serve_hanging(content_type, first).await;
    let target = target(adapter, &base_url);
    let request = request(vec![user("hi")]);
    let client = super::http_client();
    let (tx, mut rx) = mpsc::channel(16);
    let metrics = NodeMetrics::new();
    let mut run = Box::pin(super::execute(&client, &target, &request, None, &tx, &metrics));
    // Drive the run until its first event arrives: the response is in flight.
    tokio::select! {
        result = &mut run => panic!("run ended early: {result:?}"),
        event = rx.recv() => assert!(matches!(event, Some(pb::run_event::Event::Started(_)))),
    }
    // Not vacuous: while the run is alive, the provider keeps its body.
    let mut dropped = dropped;
    assert!(
        tokio::time::timeout(Duration::from_millis(20), &mut dropped).await.is_err(),
        "the provider body stays open while the run is alive"
    );
    drop(run);
    tokio::time::timeout(Duration::from_secs(5), dropped)
        .await
        .expect("provider saw the connection close")
        .expect("drop signal sent");
}
