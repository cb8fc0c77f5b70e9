//! Client API keys end to end: a real `iop-edge` process with a keys file,
//! keys made with its own `new-key` / `hash-key` commands, every client API's
//! 401/403 shape, model filtering, disabled principals, reloads of the keys
//! file, and the admin API off the client listener.

mod common;

use std::io::Write;
use std::process::Stdio;

use common::*;
use iop_e2e::harness::{bin, wait_until};
use serde_json::{Value, json};

/// `printf %s KEY | iop-edge hash-key`.
fn hash_key(key: &str) -> String {
    let mut child = std::process::Command::new(bin("iop-edge"))
        .arg("hash-key")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(key.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

const OLLAMA_ONLY_KEY: &str = "sk-ollama-only-0123456789";
const DISABLED_KEY: &str = "sk-disabled-0123456789";

/// Three principals: `all` (from `new-key`, every model), `ollama-only`
/// (`mock-ollama` only) and a disabled one. Returns (keys file, all's key).
fn keys_file() -> (String, String) {
    let (all_key, all_entry) = new_key("all", &[]);
    let text = format!(
        "principals:\n{all_entry}\n  - {{ name: ollama-only, key_sha256: {}, models: [\"mock-oll*\"] }}\n  - {{ name: off, key_sha256: {}, models: [\"*\"], disabled: true }}\n",
        hash_key(OLLAMA_ONLY_KEY),
        hash_key(DISABLED_KEY),
    );
    (text, all_key)
}

/// The three client APIs: (path, body for `model`, header carrying the key).
fn apis(model: &str) -> [(&'static str, Value, &'static str); 3] {
    let messages = json!([{ "role": "user", "content": "hi" }]);
    [
        ("/v1/chat/completions", json!({ "model": model, "messages": messages }), "authorization"),
        ("/v1/responses", json!({ "model": model, "input": "hi" }), "api-key"),
        ("/v1/messages", json!({ "model": model, "max_tokens": 16, "messages": messages }), "x-api-key"),
    ]
}

async fn call(stack: &Stack, path: &str, body: &Value, header: &str, key: Option<&str>) -> (u16, Value) {
    let mut request = stack
        .client
        .post(stack.url(path))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap());
    if let Some(key) = key {
        let value = if header == "authorization" { format!("Bearer {key}") } else { key.to_string() };
        request = request.header(header, value);
    }
    json_body(request.send().await.unwrap()).await
}

/// (type, code) of an error body in the API's own shape.
fn error_kind(path: &str, body: &Value) -> (String, String) {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    if path == "/v1/messages" {
        assert_eq!(body["type"], "error", "{body}");
        // Anthropic's shape has no code: the message says which failure it was.
        (text(&body["error"]["type"]), text(&body["error"]["message"]))
    } else {
        (text(&body["error"]["type"]), text(&body["error"]["code"]))
    }
}

#[tokio::test]
async fn api_keys_decide_who_may_call_which_model_in_each_apis_shape() {
    let (keys, all_key) = keys_file();
    let stack = Stack::start(StackOptions { keys: Some(keys), ..Default::default() }).await;
    let before = stack.mock_stats().await["requests_total"].as_u64().unwrap();

    for (path, body, header) in apis("mock-openai") {
        let cases = [
            (None, 401, "authentication_error", "missing_api_key", "missing API key"),
            (Some("sk-nobody"), 401, "authentication_error", "invalid_api_key", "invalid API key"),
            (Some(DISABLED_KEY), 401, "authentication_error", "api_key_disabled", "this API key is disabled"),
            (Some(OLLAMA_ONLY_KEY), 403, "permission_error", "model_not_allowed", "may not use the model"),
        ];
        for (key, status, kind, code, message) in cases {
            let (got, error) = call(&stack, path, &body, header, key).await;
            assert_eq!(got, status, "{path} with {key:?}: {error}");
            let (got_kind, detail) = error_kind(path, &error);
            assert_eq!(got_kind, kind, "{path} with {key:?}: {error}");
            let expected = if path == "/v1/messages" { message } else { code };
            assert!(detail.contains(expected), "{path} with {key:?}: {error}");
            // No key or hash ever comes back in an answer.
            assert!(!error.to_string().contains("sk-"), "{error}");
        }
    }
    // A model outside the principal's list is refused even when it does not
    // exist: whether it does is not the caller's business.
    let (status, _) =
        call(&stack, "/v1/chat/completions", &chat_body("nope", "hi", false), "authorization", Some(OLLAMA_ONLY_KEY))
            .await;
    assert_eq!(status, 403);
    let (status, _) =
        call(&stack, "/v1/chat/completions", &chat_body("nope", "hi", false), "authorization", Some(&all_key)).await;
    assert_eq!(status, 404);
    // Nothing refused reached the provider.
    assert_eq!(stack.mock_stats().await["requests_total"].as_u64().unwrap(), before);

    // Allowed: each API, each header form.
    for (path, body, header) in apis("mock-ollama") {
        let (status, answer) = call(&stack, path, &body, header, Some(OLLAMA_ONLY_KEY)).await;
        assert_eq!(status, 200, "{path}: {answer}");
    }
    for (path, body, header) in apis("mock-openai") {
        let (status, answer) = call(&stack, path, &body, header, Some(&all_key)).await;
        assert_eq!(status, 200, "{path}: {answer}");
    }

    // /v1/models lists only what the caller may use.
    let models = |key: Option<&'static str>| {
        let request = stack.client.get(stack.url("/v1/models"));
        let request = match key {
            Some(key) => request.bearer_auth(key),
            None => request,
        };
        async move { json_body(request.send().await.unwrap()).await }
    };
    let ids = |list: &Value| -> Vec<String> {
        list["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_string()).collect()
    };
    let (status, list) = models(Some(OLLAMA_ONLY_KEY)).await;
    assert_eq!((status, ids(&list)), (200, vec!["mock-ollama".to_string()]));
    let all = stack.client.get(stack.url("/v1/models")).header("x-api-key", &all_key).send().await.unwrap();
    let (status, list) = json_body(all).await;
    assert_eq!((status, ids(&list)), (200, vec!["mock-ollama".to_string(), "mock-openai".to_string()]));
    let (status, error) = models(None).await;
    assert_eq!((status, error["error"]["code"].as_str()), (401, Some("missing_api_key")));
    // One model: only a model the key may use; another is "not found".
    let one = |id: &str| stack.client.get(stack.url(&format!("/v1/models/{id}"))).bearer_auth(OLLAMA_ONLY_KEY).send();
    assert_eq!(one("mock-ollama").await.unwrap().status(), 200);
    assert_eq!(one("mock-openai").await.unwrap().status(), 404);

    // Per principal and per refusal reason, never a key.
    assert!(stack.metric("iop_edge_principal_requests_total{principal=\"ollama-only\"}").await >= 3.0);
    assert!(stack.metric("iop_edge_auth_rejections_total{reason=\"missing_api_key\"}").await >= 3.0);
    assert!(stack.metric("iop_edge_auth_rejections_total{reason=\"api_key_disabled\"}").await >= 3.0);
    let metrics = stack.client.get(stack.admin_url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(!metrics.contains("sk-") && !metrics.contains(&all_key));
}

#[tokio::test]
async fn admin_and_metrics_live_only_on_the_admin_listener() {
    let stack = Stack::start(StackOptions { start_node: false, ..Default::default() }).await;
    for path in ["/admin/v1/nodes", "/admin/v1/providers", "/admin/v1/config", "/metrics"] {
        let on_client = stack.client.get(stack.url(path)).send().await.unwrap();
        assert_eq!(on_client.status(), 404, "{path} on the client listener");
        let on_admin = stack.client.get(stack.admin_url(path)).send().await.unwrap();
        assert_eq!(on_admin.status(), 200, "{path} on the admin listener");
    }
    let command = stack.client.post(stack.url(&format!("/admin/v1/nodes/{NODE}/commands/capabilities"))).send().await;
    assert_eq!(command.unwrap().status(), 404);
    assert_eq!(stack.client.get(stack.url("/healthz")).send().await.unwrap().status(), 200);
    // Served here too; not ready while no node is (the startup grace).
    let (status, body) = json_body(stack.client.get(stack.url("/readyz")).send().await.unwrap()).await;
    assert_eq!((status, body["status"].as_str()), (503, Some("starting")));
}

async fn chat_status(stack: &Stack, key: &str) -> u16 {
    call(stack, "/v1/chat/completions", &chat_body("mock-ollama", "hi", false), "authorization", Some(key)).await.0
}

#[tokio::test]
async fn a_changed_keys_file_adds_and_revokes_keys_without_a_restart() {
    let entry = |name: &str, key: &str, disabled: bool| {
        format!("  - {{ name: {name}, key_sha256: {}, models: [\"*\"], disabled: {disabled} }}\n", hash_key(key))
    };
    let first = format!("principals:\n{}", entry("a", "sk-key-a", false));
    let stack = Stack::start(StackOptions { keys: Some(first), ..Default::default() }).await;
    let keys_path = stack.dir.path().join("keys.yaml");
    assert_eq!(chat_status(&stack, "sk-key-a").await, 200);
    assert_eq!(chat_status(&stack, "sk-key-b").await, 401);

    // b added, a disabled: applied as one reload.
    std::fs::write(
        &keys_path,
        format!("principals:\n{}{}", entry("a", "sk-key-a", true), entry("b", "sk-key-b", false)),
    )
    .unwrap();
    wait_until("the keys reload", WAIT, || async {
        stack.get_json("/admin/v1/config").await["config"]["revision"] == 2
    })
    .await;
    assert_eq!(chat_status(&stack, "sk-key-b").await, 200);
    assert_eq!(chat_status(&stack, "sk-key-a").await, 401);

    // A broken keys file is rejected as a whole: the keys in force stay.
    std::fs::write(&keys_path, "principals: [ { name: b, key_sha256: nothex, models: ['*'] } ]\n").unwrap();
    wait_until("the rejected reload", WAIT, || async {
        stack.get_json("/admin/v1/config").await["config"]["last_error"].is_string()
    })
    .await;
    let error = stack.get_json("/admin/v1/config").await["config"]["last_error"].as_str().unwrap().to_string();
    assert!(error.contains("principals[0].key_sha256"), "{error}");
    assert_eq!(stack.get_json("/admin/v1/config").await["config"]["revision"], 2);
    assert_eq!(chat_status(&stack, "sk-key-b").await, 200);
    assert_eq!(chat_status(&stack, "sk-key-a").await, 401);
}

/// Cross-site protection with keys (issue 24 item 4): a body that is not
/// JSON is `415` in each API's own shape before the key is even looked at,
/// while a real client that reaches the Edge by any name (an Ingress, a
/// Service) is served: the `Host` check is only for `auth.mode: disabled`.
#[tokio::test]
async fn with_keys_only_json_bodies_pass_and_any_host_name_is_served() {
    let (keys, all_key) = keys_file();
    let stack = Stack::start(StackOptions { keys: Some(keys), ..Default::default() }).await;
    let body = chat_body("mock-ollama", "hi", false).to_string();
    let send = |path: &'static str, content_type: Option<&'static str>, host: Option<&'static str>| {
        let mut request = stack.client.post(stack.url(path)).bearer_auth(&all_key).body(body.clone());
        if let Some(value) = content_type {
            request = request.header("content-type", value);
        }
        if let Some(host) = host {
            request = request.header("host", host);
        }
        async move { json_body(request.send().await.unwrap()).await }
    };
    for content_type in [None, Some("text/plain"), Some("application/x-www-form-urlencoded")] {
        let (status, answer) = send("/v1/chat/completions", content_type, None).await;
        assert_eq!((status, answer["error"]["code"].as_str()), (415, Some("unsupported_media_type")), "{answer}");
        let (status, answer) = send("/v1/messages", content_type, None).await;
        assert_eq!((status, answer["type"].as_str()), (415, Some("error")), "{answer}");
    }
    let (status, answer) = send("/v1/chat/completions", Some("Application/JSON; charset=utf-8"), None).await;
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = send("/v1/chat/completions", Some("application/json"), Some("api.example.com")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(stack.metric("iop_edge_http_refusals_total{reason=\"not_json\"}").await, 6.0);
}

/// No web page may use the admin listener (any `Origin` is `403`), and
/// without keys neither listener answers a name that is not this machine's
/// (DNS rebinding); the client listener serves pages of a matching Host,
/// and the admin listener the Prometheus that scrapes its address.
#[tokio::test]
async fn the_admin_listener_serves_no_web_page_and_no_foreign_host_without_keys() {
    let stack = Stack::start(StackOptions { start_node: false, ..Default::default() }).await;
    let get = |url: String, header: Option<(&'static str, &'static str)>| {
        let mut request = stack.client.get(url);
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    for path in ["/metrics", "/admin/v1/nodes", "/healthz"] {
        assert_eq!(get(stack.admin_url(path), Some(("origin", "http://localhost:3000"))).await, 403, "{path}");
        assert_eq!(get(stack.admin_url(path), Some(("host", "rebound.example:8081"))).await, 403, "{path}");
        assert_eq!(get(stack.admin_url(path), None).await, 200, "{path}");
    }
    assert_eq!(get(stack.url("/v1/models"), Some(("origin", "http://localhost:3000"))).await, 200);
    assert_eq!(get(stack.url("/v1/models"), Some(("host", "rebound.example"))).await, 403);
    assert_eq!(get(stack.url("/v1/models"), Some(("host", "localhost"))).await, 200);
    assert_eq!(stack.metric("iop_edge_http_refusals_total{reason=\"browser_origin\"}").await, 3.0);
    // No Host at all is no browser: a load balancer's HTTP/1.0 health
    // check (HAProxy `option httpchk`) is served on both listeners.
    for addr in [stack.http, stack.admin] {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        socket.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").await.unwrap();
        let mut answer = Vec::new();
        socket.read_to_end(&mut answer).await.unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"), "{addr}: {answer}");
    }
}

/// The admin listener has no keys of its own, so with keys required on the
/// client listener it still answers only the names it was given (issue 41
/// item 5): a rebound `Host` is `403`, as is a name merely ending like a
/// listed one, while its own address, `localhost`, a listed Service name and
/// a name below a listed `*.` parent are served. The client listener, with
/// keys, serves any name.
#[tokio::test]
async fn with_keys_the_admin_listener_still_answers_only_its_own_names() {
    let (keys, all_key) = keys_file();
    let stack = Stack::start(StackOptions {
        keys: Some(keys),
        start_node: false,
        admin_hosts: vec!["iop-edge-admin.iop.svc", "*.iop-edge-replicas.iop.svc"],
        ..Default::default()
    })
    .await;
    let get = |url: String, host: String| {
        let request = stack.client.get(url).header("host", host).bearer_auth(&all_key);
        async move { request.send().await.unwrap().status().as_u16() }
    };
    let own = stack.admin.to_string();
    for path in ["/metrics", "/admin/v1/nodes", "/admin/v1/usage"] {
        for host in ["evil.example", "rebound.example:8081", "xiop-edge-admin.iop.svc", "iop-edge-replicas.iop.svc"] {
            assert_eq!(get(stack.admin_url(path), host.into()).await, 403, "{path} {host}");
        }
        for host in [&own, "localhost:8081", "IOP-EDGE-ADMIN.iop.svc:8081", "edge-0.iop-edge-replicas.iop.svc"] {
            assert_eq!(get(stack.admin_url(path), host.into()).await, 200, "{path} {host}");
        }
    }
    assert_eq!(stack.metric("iop_edge_http_refusals_total{reason=\"foreign_host\"}").await, 12.0);
    assert_eq!(get(stack.url("/v1/models"), "api.example.com".into()).await, 200);
}

/// A context fallback is a model like any other (issue 25 item 7): a
/// principal allowed only the small model whose request overflows it gets
/// the small model's context error, never an answer from the fallback it
/// may not use; a principal allowed both is moved as before.
#[tokio::test]
async fn a_context_fallback_is_taken_only_when_the_principal_may_use_its_model() {
    const SMALL_ONLY_KEY: &str = "sk-small-only-0123456789";
    const BOTH_KEY: &str = "sk-small-and-large-0123456789";
    let keys = format!(
        "principals:\n  - {{ name: small-only, key_sha256: {}, models: [mock-small] }}\n  - {{ name: both, key_sha256: {}, models: [mock-small, mock-large] }}\n",
        hash_key(SMALL_ONLY_KEY),
        hash_key(BOTH_KEY),
    );
    let small = provider("small", iop_proto::config::Adapter::Openai, "mock@context_window=5", "mock-small", "");
    let large = provider("large", iop_proto::config::Adapter::Ollama, "mock", "mock-large", "");
    let stack = Stack::start(StackOptions {
        keys: Some(keys),
        extra_providers: vec![small, large],
        context_fallbacks: vec![("mock-small", "mock-large")],
        ..Default::default()
    })
    .await;
    let long = chat_body("mock-small", "one two three four five six seven", false);
    for stream in [false, true] {
        let mut request = long.clone();
        request["stream"] = json!(stream);
        let (status, error) =
            call(&stack, "/v1/chat/completions", &request, "authorization", Some(SMALL_ONLY_KEY)).await;
        assert_eq!(status, 400, "the small model's own context error (stream={stream}): {error}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("maximum context length"), "{error}");
    }
    assert_eq!(stack.metric("iop_edge_attempts_total{provider=\"large\",outcome=\"committed\"}").await, 0.0);

    let (status, answer) = call(&stack, "/v1/chat/completions", &long, "authorization", Some(BOTH_KEY)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["model"], "mock", "the fallback answered a principal allowed to use it");
}

/// Writes `request` (head and body) on a plain TCP connection to `addr` in
/// a blocking thread, then reads the whole answer: what a client that sends
/// its body before reading (Python's `requests`, `http.client`) sees.
async fn send_then_read(addr: std::net::SocketAddr, request: Vec<u8>) -> std::io::Result<String> {
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut stream = std::net::TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(WAIT))?;
        stream.write_all(&request)?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer)?;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    })
    .await
    .unwrap()
}

/// Issue 25 item 12: a refusal decided before a large body was read (a bad
/// key, a body over the limit) still reaches a client that writes its whole
/// body before reading the answer, instead of a reset ("broken pipe").
#[tokio::test]
async fn a_refusal_before_a_large_body_is_read_reaches_a_client_that_sends_it_all() {
    let (keys, _) = keys_file();
    let limits = iop_proto::config::Limits { max_body_bytes: 64 << 20, ..Default::default() };
    let stack = Stack::start(StackOptions { keys: Some(keys), limits: Some(limits), ..Default::default() }).await;
    let limit = 64 << 20;
    let request = |key: &str, size: usize| {
        let mut request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAuthorization: Bearer {key}\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n",
            stack.http
        )
        .into_bytes();
        request.extend(std::iter::repeat_n(b' ', size));
        request
    };
    let answer = send_then_read(stack.http, request("sk-nobody", limit)).await.expect("the whole body is accepted");
    assert!(answer.starts_with("HTTP/1.1 401"), "{}", &answer[..answer.len().min(300)]);
    assert!(answer.contains("invalid_api_key"), "{answer}");
    let answer =
        send_then_read(stack.http, request(OLLAMA_ONLY_KEY, limit + 1)).await.expect("the whole body is accepted");
    assert!(answer.starts_with("HTTP/1.1 413"), "{}", &answer[..answer.len().min(300)]);
}
