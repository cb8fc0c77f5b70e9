//! `iop-fast-upstream`: the cheapest OpenAI-compatible upstream we can write,
//! for `scripts/bench`. Unlike `iop-mock-provider` it has no fault knobs, no
//! JSON parsing and no per-request allocation beyond hyper's own: the
//! benchmark should measure the gateway, not the mock.
//!
//! - `POST /v1/chat/completions`: a fixed `chat.completion` JSON object, or,
//!   when the body says `"stream": true`, a fixed short SSE stream (role and
//!   text chunks, a finish chunk, a usage chunk, `data: [DONE]`) in one write.
//! - `GET /v1/models`: a fixed listing (the node's OpenAI health probe).
//! - anything else: 404.
//!
//! Plain HTTP/1.1 with keep-alive and `TCP_NODELAY`. Prints
//! `iop-fast-upstream listening on http://ADDR` on stdout once bound.

use std::convert::Infallible;
use std::io::Write;
use std::process::ExitCode;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const MODELS: &str = r#"{"object":"list","data":[{"id":"bench-model","object":"model","owned_by":"bench"}]}"#;

const COMPLETION: &str = concat!(
    r#"{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench-model","#,
    r#""choices":[{"index":0,"message":{"role":"assistant","content":"Hello from the fast upstream."},"#,
    r#""finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":6,"total_tokens":11}}"#
);

const STREAM: &str = concat!(
    "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,",
    "\"model\":\"bench-model\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hello\"},",
    "\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,",
    "\"model\":\"bench-model\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" from the fast upstream.\"},",
    "\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,",
    "\"model\":\"bench-model\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,",
    "\"model\":\"bench-model\",\"choices\":[],",
    "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6,\"total_tokens\":11}}\n\n",
    "data: [DONE]\n\n"
);

#[tokio::main]
async fn main() -> ExitCode {
    let listen = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:0".to_string());
    let listener = match TcpListener::bind(&listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("iop-fast-upstream: cannot listen on {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match listener.local_addr() {
        Ok(addr) => println!("iop-fast-upstream listening on http://{addr}"),
        Err(e) => {
            eprintln!("iop-fast-upstream: no local address: {e}");
            return ExitCode::FAILURE;
        }
    }
    let _ = std::io::stdout().flush();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    eprintln!("iop-fast-upstream: accept: {e}");
                    continue;
                }
            },
            _ = tokio::signal::ctrl_c() => return ExitCode::SUCCESS,
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service_fn(answer)).await;
        });
    }
}

async fn answer(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, content_type: &'static str, body: &'static str| {
        let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *response.status_mut() = status;
        response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(content_type));
        Ok(response)
    };
    match (request.method(), request.uri().path()) {
        (&Method::POST, "/v1/chat/completions") => {
            let body = match request.into_body().collect().await {
                Ok(body) => body.to_bytes(),
                Err(_) => return reply(StatusCode::BAD_REQUEST, "text/plain", "unreadable body"),
            };
            if wants_stream(&body) {
                reply(StatusCode::OK, "text/event-stream", STREAM)
            } else {
                reply(StatusCode::OK, "application/json", COMPLETION)
            }
        }
        (&Method::GET, "/v1/models") => reply(StatusCode::OK, "application/json", MODELS),
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found"),
    }
}

/// True when the JSON body has `"stream"` followed by `: true` (a byte scan,
/// not a parse: the bench sends well-formed bodies).
fn wants_stream(body: &[u8]) -> bool {
    const KEY: &[u8] = b"\"stream\"";
    let mut rest = body;
    while let Some(at) = rest.windows(KEY.len()).position(|w| w == KEY) {
        let after = &rest[at + KEY.len()..];
        let value = after.iter().position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b':'));
        if let Some(value) = value
            && after[value..].starts_with(b"true")
        {
            return true;
        }
        rest = after;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::wants_stream;

    #[test]
    fn finds_the_stream_flag_only() {
        assert!(wants_stream(br#"{"model":"m","stream":true}"#));
        assert!(wants_stream(br#"{"stream" : true,"stream_options":{"include_usage":true}}"#));
        assert!(!wants_stream(br#"{"model":"m","stream":false,"stream_options":{"include_usage":true}}"#));
        assert!(!wants_stream(br#"{"model":"m"}"#));
    }
}
