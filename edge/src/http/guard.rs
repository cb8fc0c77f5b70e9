//! Cross-site protection, one layer per rule, shared by both listeners:
//!
//! - [`json_only`]: a `POST` body must be `application/json` (parameters
//!   such as `; charset=utf-8` allowed, any case), else `415`. A browser can
//!   send `text/plain`, form or multipart bodies to any address without
//!   asking first; it needs a CORS preflight (which the Edge never grants)
//!   to send JSON. A `POST` without a body (the admin node commands) needs
//!   no type.
//! - [`no_browser_origin`] (admin listener): a request carrying `Origin`
//!   comes from a web page; no origin is allowed, so it is `403`.
//! - [`local_host_only`] (client listener, while `auth.mode` is
//!   `disabled`; admin listener, always): the `Host` must be the listener's
//!   own address (the one the connection reached), `localhost`, `127.0.0.1`
//!   or `[::1]` (any port), or on the admin listener one of
//!   `listen.admin_hosts`, else `403`. A page of a name that rebinds to
//!   127.0.0.1 (DNS rebinding) sends its own name; the admin listener needs
//!   it whatever the auth mode, since its API has no key. A request without
//!   `Host` (HTTP/1.0 health checks) is not a browser's and passes.
//!
//! Refusals come in the listener's error shape (the client API's own per
//! path, a small JSON error on the admin listener) and are counted in
//! `iop_edge_http_refusals_total{reason}`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::body::HttpBody as _;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::Response;
use iop_proto::config::AuthMode;

use crate::ingress::error::ApiError;
use crate::state::EdgeState;

/// The address a connection reached (its local socket address), set by the
/// listener on every request.
#[derive(Debug, Clone, Copy)]
pub struct LocalAddr(pub SocketAddr);

/// Which listener a guard protects (it decides the error shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    Client,
    Admin,
}

/// The state of a guard layer.
#[derive(Clone)]
pub struct Guard {
    pub state: Arc<EdgeState>,
    pub listener: Listener,
}

/// Why a request was refused before its handler (closed; the metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    NotJson,
    BrowserOrigin,
    ForeignHost,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Self::NotJson => "not_json",
            Self::BrowserOrigin => "browser_origin",
            Self::ForeignHost => "foreign_host",
        }
    }

    fn error(self) -> ApiError {
        match self {
            Self::NotJson => ApiError::UnsupportedMediaType,
            Self::BrowserOrigin => ApiError::OriginNotAllowed,
            Self::ForeignHost => ApiError::HostNotAllowed,
        }
    }
}

/// Whether a `Content-Type` value is `application/json`, with or without
/// parameters, in any case.
pub fn is_json(content_type: &HeaderValue) -> bool {
    let Ok(text) = content_type.to_str() else { return false };
    let essence = text.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

/// Whether a `Host` (`name[:port]`) names this machine: `localhost`,
/// `127.0.0.1`, `[::1]` or the address the connection reached (`local`).
pub fn is_local_host(host: &str, local: Option<SocketAddr>) -> bool {
    host_name(host).is_some_and(|name| is_local_name(&name, local))
}

/// The name of a `Host` (`name[:port]`), lowercase; `None` when the port
/// is not one.
fn host_name(host: &str) -> Option<String> {
    // `name` and what follows it: nothing, or `:` and the port.
    let (name, rest) = match host.strip_prefix('[') {
        Some(inner) => match inner.split_once(']') {
            Some((ip, rest)) => (format!("[{ip}]"), rest),
            None => return None,
        },
        None => match host.find(':') {
            Some(at) => (host[..at].to_string(), &host[at..]),
            None => (host.to_string(), ""),
        },
    };
    let port_ok = match rest.strip_prefix(':') {
        Some(digits) => !digits.is_empty() && digits.len() <= 5 && digits.bytes().all(|b| b.is_ascii_digit()),
        None => rest.is_empty(),
    };
    port_ok.then(|| name.to_ascii_lowercase())
}

/// Whether `name` (lowercase, no port) is this machine's.
fn is_local_name(name: &str, local: Option<SocketAddr>) -> bool {
    // A v4 client of a dual-stack listener reached `[::ffff:a.b.c.d]`.
    let own = local.map(|addr| match addr.ip().to_canonical() {
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) => format!("[{ip}]"),
    });
    matches!(name, "localhost" | "127.0.0.1" | "[::1]") || own.is_some_and(|own| own == name)
}

/// `415` for a `POST` whose body is not JSON.
pub async fn json_only(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    if request.method() == Method::POST {
        let json = match request.headers().get(header::CONTENT_TYPE) {
            Some(value) => is_json(value),
            // No type: only a request without a body passes.
            None => request.body().size_hint().exact() == Some(0),
        };
        if !json {
            return refuse(&guard, Refusal::NotJson, request.uri().path());
        }
    }
    next.run(request).await
}

/// `403` for a request a web page sent (it carries `Origin`).
pub async fn no_browser_origin(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    if request.headers().contains_key(header::ORIGIN) {
        return refuse(&guard, Refusal::BrowserOrigin, request.uri().path());
    }
    next.run(request).await
}

/// `403` for a request addressed to a name other than this machine's (or,
/// on the admin listener, one of `listen.admin_hosts`): on the client
/// listener while authentication is disabled, on the admin listener always.
pub async fn local_host_only(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    let config = guard.state.config.current();
    if guard.listener == Listener::Admin || config.auth.mode == AuthMode::Disabled {
        let host = match request.headers().get(header::HOST) {
            Some(value) => value.to_str().ok().map(str::to_string),
            // HTTP/2 carries it as the `:authority`.
            None => request.uri().authority().map(|a| a.as_str().to_string()),
        };
        let local = request.extensions().get::<LocalAddr>().map(|l| l.0);
        // No Host at all is no browser (a browser always sends one, which
        // is what a rebound name shows): an HTTP/1.0 health check, say
        // HAProxy's `option httpchk`, passes.
        let known = |name: String| {
            is_local_name(&name, local) || (guard.listener == Listener::Admin && config.listen.is_admin_host(&name))
        };
        if host.is_some_and(|host| !host_name(&host).is_some_and(known)) {
            return refuse(&guard, Refusal::ForeignHost, request.uri().path());
        }
    }
    next.run(request).await
}

fn refuse(guard: &Guard, refusal: Refusal, path: &str) -> Response {
    guard.state.metrics.reason(&guard.state.metrics.http_refusals, refusal.label());
    let error = refusal.error();
    match guard.listener {
        Listener::Admin => super::admin::admin_error(error.status(), error.code(), error.message()),
        // Each client API answers in its own shape.
        Listener::Client if path.starts_with("/v1/messages") => {
            super::respond::error_response::<super::surface::Messages>(&error)
        }
        Listener::Client => super::respond::error_response::<super::surface::ChatCompletions>(&error),
    }
}

#[cfg(test)]
mod tests;
