use super::*;

#[test]
fn retry_after_headers_are_read_as_delta_seconds() {
    let parse = |s: &'static str| parse_retry_after(&HeaderValue::from_static(s));
    assert_eq!(parse("2"), Some(2000));
    assert_eq!(parse("Wed, 21 Oct 2015 07:28:00 GMT"), None);
    assert_eq!(parse_retry_after(&HeaderValue::from_bytes(b"\xff").unwrap()), None, "not text");
}

#[test]
fn http_client_builds() {
    let _client = http_client();
    let _again = http_client(); // provider already installed: still fine
    // The fallback used when the platform has no root certificates.
    reqwest::Client::builder().tls_backend_preconfigured(fallback_tls_config()).build().unwrap();
}
