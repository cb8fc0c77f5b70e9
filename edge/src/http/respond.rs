//! Responses in each API's own shape that the client listener's request
//! path and its guard both send: an error, and the per-key limit headers.
//! Below both, so that neither imports the other for them.

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::surface::Surface;
use crate::ingress::error::ApiError;
use crate::metrics::Api;

pub(super) fn error_response<S: Surface>(err: &ApiError) -> Response {
    let mut response = (err.status(), axum::Json(S::error_body(err))).into_response();
    if let Some(secs) = err.retry_after_secs() {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if let ApiError::RateLimited(refusal) = err {
        set_limit_headers(response.headers_mut(), S::API, &refusal.status, Some(refusal.retry_after));
    }
    response
}

/// The caller's per-key limits as the rate-limit headers its API's clients
/// read (`crate::ratelimit::headers`: Anthropic's for Messages, OpenAI's
/// for the others); they replace any a tunnelled provider answer carried.
pub(super) fn set_limit_headers(
    headers: &mut HeaderMap,
    api: Api,
    status: &crate::ratelimit::Status,
    retry_after: Option<std::time::Duration>,
) {
    use crate::ratelimit::{HEADER_PREFIXES, HeaderForm};
    let form = if api == Api::messages { HeaderForm::Anthropic } else { HeaderForm::OpenAi };
    let relayed: Vec<HeaderName> =
        headers.keys().filter(|name| HEADER_PREFIXES.iter().any(|p| name.as_str().starts_with(p))).cloned().collect();
    for name in relayed {
        headers.remove(name);
    }
    for (name, value) in crate::ratelimit::headers(form, status, retry_after, std::time::SystemTime::now()) {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
            headers.insert(name, value);
        }
    }
}
