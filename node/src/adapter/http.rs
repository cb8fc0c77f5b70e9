//! The HTTP side the adapters share: the client, the POST of a request body
//! and the status check of its answer, and capped body reads.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};

use super::error::{AdapterError, error_chain, provider_error_message, transport_error};

/// Most of a non-2xx body we read looking for the provider's error message.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// The HTTP client the adapters share: no overall timeout (responses stream
/// for as long as the model generates; the caller owns the stall timeout).
pub fn http_client() -> reqwest::Client {
    // `rustls-no-provider`: reqwest panics at build time unless a process
    // default crypto provider is installed. Err means one already is.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let builder = || {
        reqwest::Client::builder()
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(90))
    };
    match builder().build() {
        Ok(client) => client,
        Err(e) => {
            // Typically: no CA certificates on this system. Plain-HTTP
            // providers (the common local case) still work; HTTPS ones will
            // fail certificate verification and report Unreachable.
            tracing::warn!(
                error = %error_chain(&e),
                "TLS setup with the platform's root certificates failed; HTTPS providers will be unreachable"
            );
            builder()
                .tls_backend_preconfigured(fallback_tls_config())
                .build()
                .expect("an HTTP client with a preconfigured rustls config always builds")
        }
    }
}

pub(super) fn fallback_tls_config() -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config
}

pub(super) async fn post_json(
    client: &reqwest::Client,
    url: reqwest::Url,
    body: Vec<u8>,
    authorization: Option<HeaderValue>,
) -> Result<reqwest::Response, AdapterError> {
    let mut request = client.post(url).header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(value) = authorization {
        request = request.header(reqwest::header::AUTHORIZATION, value);
    }
    let response = request
        .body(body)
        .send()
        .await
        // The message reaches the client: it never names the provider's
        // (internal) address.
        .map_err(|e| transport_error("sending the request to the provider", e))?;
    // The response headers are the provider's first byte (for the
    // execution's first-byte deadline).
    crate::liveness::FirstByte::mark();
    check_status(response).await
}

/// Passes 2xx responses through; turns anything else into `HttpStatus`.
async fn check_status(response: reqwest::Response) -> Result<reqwest::Response, AdapterError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let retry_after_ms = response.headers().get(RETRY_AFTER).and_then(parse_retry_after);
    // A transport error here only costs us the message.
    let (body, _) = read_capped(response, ERROR_BODY_LIMIT).await;
    let message = provider_error_message(&body)
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("unrecognized status").to_owned());
    let context_length = iop_proto::provider_error::context_length_exceeded(status.as_u16(), &body);
    let code = iop_proto::provider_error::code(status.as_u16(), &body);
    Err(AdapterError::HttpStatus { status: status.as_u16(), retry_after_ms, message, context_length, code })
}

/// `Retry-After` in milliseconds, read as the Edge reads a tunnel's.
fn parse_retry_after(value: &HeaderValue) -> Option<u64> {
    iop_proto::provider_error::retry_after_ms(value.to_str().ok()?)
}

/// Reads at most `cap` bytes of the body, then drops the response (which
/// closes the connection if more was coming). Returns what was read and the
/// transport error that ended the read early, if one did.
pub(crate) async fn read_capped(mut response: reqwest::Response, cap: usize) -> (Vec<u8>, Option<reqwest::Error>) {
    let mut body = Vec::new();
    while body.len() < cap {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let take = chunk.len().min(cap - body.len());
                body.extend_from_slice(&chunk[..take]);
            }
            Ok(None) => break,
            Err(e) => return (body, Some(e)),
        }
    }
    (body, None)
}

#[cfg(test)]
mod tests;
