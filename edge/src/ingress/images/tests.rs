use super::*;

#[test]
fn data_urls_decode_http_urls_pass_and_the_rest_is_refused() {
    let image = from_url("data:image/png;base64,aGk=", "p").unwrap();
    assert_eq!((image.media_type.as_str(), image.data.as_slice()), ("image/png", b"hi".as_slice()));
    assert_eq!(from_url("https://example.com/a.png", "p").unwrap().url, "https://example.com/a.png");
    for bad in ["file:///etc/passwd", "data:image/png,plain", "data:text/html;base64,aGk=", "data:image/png;base64,***"]
    {
        assert!(matches!(from_url(bad, "p"), Err(ApiError::InvalidRequest { .. })), "{bad}");
    }
    let huge = "A".repeat(MAX_IMAGE_BYTES / 3 * 4 + 8);
    assert!(from_base64("image/png", &huge, "p").is_err());
}
