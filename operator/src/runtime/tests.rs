//! A mocked Kubernetes API for the runtime's tests: the code under test gets
//! a real `kube::Client` whose transport is a `tower-test` mock, and the test
//! plays the API server, one request at a time. Every step waits at most
//! [`STEP`] for the request, then asserts what it is (method, path, query,
//! content type, body) and answers it. [`ApiServer::done`] asserts nothing
//! else was sent.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use time::OffsetDateTime;
use tower_test::mock::{Handle, SendResponse};

use super::metrics::Metrics;
use super::{Clock, Context};
use crate::reconcile::fixtures::{NS, settings};

/// How long one scenario step waits for the request it expects.
pub(crate) const STEP: Duration = Duration::from_secs(1);

pub(crate) const APPLY_PATCH: &str = "application/apply-patch+yaml";
pub(crate) const MERGE_PATCH: &str = "application/merge-patch+json";

pub(crate) struct ApiServer {
    handle: Handle<Request<Body>, Response<Body>>,
}

pub(crate) fn mock() -> (Client, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, NS), ApiServer { handle })
}

/// 2026-11-01T12:00:00Z
pub(crate) const NOW: OffsetDateTime = match OffsetDateTime::from_unix_timestamp(1_793_534_400) {
    Ok(t) => t,
    Err(_) => panic!(),
};

pub(crate) struct FixedClock(pub OffsetDateTime);

impl Clock for FixedClock {
    fn now(&self) -> OffsetDateTime {
        self.0
    }
}

pub(crate) const EDGE_NAMES: [&str; 2] = ["iop-edge-grpc.iop.svc", "edge.example.com"];

pub(crate) fn context(client: Client, now: OffsetDateTime) -> Context {
    Context {
        client,
        namespace: NS.to_string(),
        settings: settings(),
        edge_server_names: EDGE_NAMES.iter().map(|s| s.to_string()).collect(),
        clock: Arc::new(FixedClock(now)),
        metrics: Metrics::new(),
    }
}

/// One request the code under test made, waiting for its answer.
pub(crate) struct Call {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub content_type: Option<String>,
    /// The `Accept` header (a metadata-only read asks for `PartialObjectMetadata`).
    pub accept: Option<String>,
    pub body: Value,
    send: SendResponse<Response<Body>>,
}

impl ApiServer {
    /// The next request (at most [`STEP`] away).
    pub(crate) async fn next(&mut self) -> Call {
        self.next_within(STEP).await
    }

    /// The next request, at most `within` away (a client that backs off).
    pub(crate) async fn next_within(&mut self, within: Duration) -> Call {
        let (request, send) = tokio::time::timeout(within, self.handle.next_request())
            .await
            .unwrap_or_else(|_| panic!("no request within {within:?}"))
            .expect("the client was dropped while a request was expected");
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.unwrap();
        let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).expect("a JSON body") };
        Call {
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            query: parts.uri.query().map(parse_query).unwrap_or_default(),
            content_type: parts.headers.get(http::header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_string()),
            accept: parts.headers.get(http::header::ACCEPT).map(|v| v.to_str().unwrap().to_string()),
            body,
            send,
        }
    }

    /// The next request, which must be `method path` with exactly `query`.
    pub(crate) async fn expect(&mut self, method: &str, path: &str, query: &[(&str, &str)]) -> Call {
        let call = self.next().await;
        assert_eq!((call.method.as_str(), call.path.as_str()), (method, path), "query {:?}", call.query);
        let want: BTreeMap<String, String> = query.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert_eq!(call.query, want, "query of {method} {path}");
        call
    }

    /// A server-side apply (`PATCH`, apply-patch content type, `force=true`)
    /// by `manager`.
    pub(crate) async fn expect_apply(&mut self, path: &str, manager: &str) -> Call {
        let call = self.expect("PATCH", path, &[("fieldManager", manager), ("force", "true")]).await;
        assert_eq!(call.content_type.as_deref(), Some(APPLY_PATCH), "content type of PATCH {path}");
        call
    }

    /// A merge patch by `manager`.
    pub(crate) async fn expect_merge(&mut self, path: &str, manager: &str) -> Call {
        let call = self.expect("PATCH", path, &[("fieldManager", manager)]).await;
        assert_eq!(call.content_type.as_deref(), Some(MERGE_PATCH), "content type of PATCH {path}");
        call
    }

    /// Nothing more is requested (the client must be dropped, or be idle).
    pub(crate) async fn done(mut self) {
        if let Ok(Some((request, _))) = tokio::time::timeout(STEP, self.handle.next_request()).await {
            panic!("unexpected request: {} {}", request.method(), request.uri());
        }
    }
}

impl Call {
    pub(crate) fn respond(self, status: u16, body: Value) {
        let response = Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap();
        self.send.send_response(response);
    }

    /// Answers 200 with the request's own body (what an apply returns, near enough).
    pub(crate) fn echo(self) {
        let body = self.body.clone();
        self.respond(200, body);
    }

    pub(crate) fn ok(self, object: &impl serde::Serialize) {
        self.respond(200, serde_json::to_value(object).unwrap());
    }

    pub(crate) fn fail(self, code: u16, reason: &str) {
        self.respond(
            code,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": reason, "reason": reason, "code": code}),
        );
    }

    pub(crate) fn not_found(self) {
        self.fail(404, "NotFound");
    }

    pub(crate) fn conflict(self) {
        self.fail(409, "Conflict");
    }
}

fn parse_query(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).expect("a percent escape"));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

/// One sample of the OpenMetrics text: name, labels (in order), value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// Every sample of an OpenMetrics exposition (comments skipped).
pub(crate) fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line}"));
            let (name, labels) = match series.split_once('{') {
                None => (series, Vec::new()),
                Some((name, rest)) => {
                    let body = rest.strip_suffix('}').unwrap_or_else(|| panic!("unclosed labels: {line}"));
                    let labels = body
                        .split(',')
                        .filter(|kv| !kv.is_empty())
                        .map(|kv| {
                            let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("label without =: {line}"));
                            (k.to_string(), v.trim_matches('"').to_string())
                        })
                        .collect();
                    (name, labels)
                }
            };
            Sample { name: name.to_string(), labels, value: value.parse().unwrap_or_else(|_| panic!("{line}")) }
        })
        .collect()
}

/// The value of one series, read through the registry's exposition; a
/// series that is not exported fails the test.
pub(crate) fn value(metrics: &Metrics, name: &str, labels: &[(&str, &str)]) -> f64 {
    let want: Vec<(String, String)> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    samples(&metrics.encode())
        .into_iter()
        .find(|s| s.name == name && s.labels == want)
        .unwrap_or_else(|| panic!("no series {name}{labels:?}"))
        .value
}

/// `iop_operator_status_writes_total{kind, writer, result}`.
pub(crate) fn status_writes(metrics: &Metrics, kind: &str, writer: &str, result: &str) -> f64 {
    value(metrics, "iop_operator_status_writes_total", &[("kind", kind), ("writer", writer), ("result", result)])
}

#[test]
fn query_decoding() {
    assert_eq!(
        parse_query("&fieldManager=iop-operator%2Fconfig&force=true"),
        BTreeMap::from([
            ("fieldManager".to_string(), "iop-operator/config".to_string()),
            ("force".to_string(), "true".to_string())
        ])
    );
}

/// At SIGTERM the shutdown token, the leader tasks' end and the elector's
/// step-down all become ready together; the stop must be clean every time
/// (it used to exit 1 with "a leader task ended unexpectedly" at random).
#[tokio::test]
async fn a_shutdown_ends_the_leader_term_cleanly_even_when_everything_ends_at_once() {
    use super::{TermEnd, term_end};
    use tokio::sync::watch;
    use tokio_util::sync::CancellationToken;

    for _ in 0..200 {
        let shutdown = CancellationToken::new();
        let (leading_tx, mut leading) = watch::channel(true);
        let mut tasks = tokio::task::JoinSet::new();
        let (done_tx, done) = tokio::sync::oneshot::channel();
        tasks.spawn(async move {
            let _ = done_tx.send(());
        });
        done.await.unwrap();
        leading_tx.send_replace(false);
        shutdown.cancel();
        assert_eq!(term_end(&shutdown, &mut leading, &mut tasks).await, TermEnd::Shutdown);
    }

    // Without a shutdown, each on its own.
    let shutdown = CancellationToken::new();
    let (leading_tx, mut leading) = watch::channel(true);
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(std::future::pending::<()>());
    leading_tx.send_replace(false);
    assert_eq!(term_end(&shutdown, &mut leading, &mut tasks).await, TermEnd::LostLeadership);
    leading_tx.send_replace(true);
    tasks.spawn(async {});
    assert_eq!(term_end(&shutdown, &mut leading, &mut tasks).await, TermEnd::TaskEnded);
}

/// Every request carries `User-Agent: iop-operator/<version>`: a real
/// client over a real socket, against a one-shot HTTP server.
#[tokio::test]
async fn requests_carry_the_operators_user_agent() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url: http::Uri = format!("http://{}", listener.local_addr().unwrap()).parse().unwrap();
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut buf).await.unwrap();
            assert!(n > 0, "the request ended early");
            head.extend_from_slice(&buf[..n]);
        }
        let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#;
        let response = format!(
            "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(response.as_bytes()).await.unwrap();
        String::from_utf8(head).unwrap()
    });
    let mut config = kube::Config::new(url);
    config.default_namespace = NS.to_string();
    super::identify(&mut config);
    let client = Client::try_from(config).unwrap();
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(client, NS);
    assert!(api.get_opt("iop-edge-config").await.unwrap().is_none());
    let head = server.await.unwrap().to_ascii_lowercase();
    let expected = format!("user-agent: iop-operator/{}\r\n", env!("CARGO_PKG_VERSION"));
    assert!(head.contains(&expected), "{head}");
    assert_eq!(head.matches("user-agent:").count(), 1);
}
