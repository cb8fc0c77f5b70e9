//! Images a client gave by URL, fetched by the node for a provider that
//! takes only image data (Ollama), when the node's owner allows it
//! (`images.fetch_urls`). Bounded: http(s) only, no credentials in the URL,
//! never a loopback, private or link-local address given literally or as
//! `localhost`, at most `MAX_IMAGE_BYTES` (`iop_proto::wire`), an image answer, within
//! [`FETCH_TIMEOUT`]. (A name that resolves to a private address is not
//! caught here: the owner's switch is the consent to that risk.)

use std::net::IpAddr;
use std::time::Duration;

use iop_proto::pb;
use iop_proto::wire::{IMAGE_MEDIA_TYPES, MAX_IMAGE_BYTES};

use super::{AdapterError, ProviderTarget, read_capped};

pub const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

pub(super) fn any_url(request: &pb::RunRequest) -> bool {
    request.messages.iter().flat_map(|m| &m.images).any(|i| i.data.is_empty() && !i.url.is_empty())
}

pub(super) fn any_image(request: &pb::RunRequest) -> bool {
    request.messages.iter().any(|m| !m.images.is_empty())
}

/// Refuses a run with images for an Ollama model known not to take them:
/// `/api/show` lists the model's capabilities and `vision` is not among
/// them. Not knowing (an Ollama too old to list capabilities, a failed
/// call) is not refusing: the chat itself then decides.
pub(super) async fn ensure_ollama_takes_images(
    client: &reqwest::Client,
    target: &ProviderTarget,
) -> Result<(), AdapterError> {
    #[derive(serde::Deserialize)]
    struct Show {
        capabilities: Option<Vec<String>>,
    }
    let show = async {
        let response = super::probe::ollama_show(client, target).send().await.ok()?.error_for_status().ok()?;
        let (body, error) = read_capped(response, SHOW_LIMIT).await;
        if error.is_some() {
            return None;
        }
        serde_json::from_slice::<Show>(&body).ok()?.capabilities
    };
    match tokio::time::timeout(super::probe::PROBE_TIMEOUT, show).await {
        Ok(Some(capabilities)) if !capabilities.iter().any(|c| c == "vision") => {
            Err(AdapterError::InvalidRequest(format!(
                "model `{}` does not accept images (Ollama lists its capabilities as: {})",
                target.target_model,
                capabilities.join(", ")
            )))
        }
        _ => Ok(()),
    }
}

/// Largest `/api/show` answer read (it carries the model's template and
/// parameters).
const SHOW_LIMIT: usize = 4 * 1024 * 1024;

/// A copy of `request` with every image URL replaced by the image's data.
pub(super) async fn fetch_urls(request: &pb::RunRequest) -> Result<pb::RunRequest, AdapterError> {
    fetch_urls_checked(image_client(), request, allowed_url).await
}

/// A client of its own: a redirect is followed (at most 5) only to a URL
/// the same rule allows, so a public URL cannot bounce the node onto its
/// own network.
fn image_client() -> &'static reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT.get_or_init(|| {
        let policy = reqwest::redirect::Policy::custom(|attempt| {
            if attempt.previous().len() >= 5 || allowed_url(attempt.url().as_str()).is_err() {
                attempt.stop()
            } else {
                attempt.follow()
            }
        });
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::builder()
            .redirect(policy)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_else(|_| reqwest::Client::new())
    })
}

/// [`fetch_urls`] with the URL rule passed in (tests fetch from loopback).
async fn fetch_urls_checked(
    client: &reqwest::Client,
    request: &pb::RunRequest,
    allowed_url: fn(&str) -> Result<reqwest::Url, &'static str>,
) -> Result<pb::RunRequest, AdapterError> {
    let mut fetched = request.clone();
    for (i, message) in fetched.messages.iter_mut().enumerate() {
        for (j, image) in message.images.iter_mut().filter(|i| i.data.is_empty()).enumerate() {
            let refuse = |why: &str| AdapterError::InvalidRequest(format!("messages[{i}].images[{j}]: {why}"));
            let url = allowed_url(&image.url).map_err(&refuse)?;
            let response = tokio::time::timeout(FETCH_TIMEOUT, client.get(url).send())
                .await
                .map_err(|_| refuse("the image URL did not answer in time"))?
                .map_err(|_| refuse("the image URL could not be fetched"))?;
            if !response.status().is_success() {
                return Err(refuse(&format!("the image URL answered HTTP {}", response.status().as_u16())));
            }
            let media_type = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
                .unwrap_or_default();
            if !IMAGE_MEDIA_TYPES.contains(&media_type.as_str()) {
                return Err(refuse("the image URL did not answer with a png, jpeg, gif or webp image"));
            }
            let (data, error) = read_capped(response, MAX_IMAGE_BYTES + 1).await;
            if error.is_some() || data.len() > MAX_IMAGE_BYTES {
                return Err(refuse("the image could not be read whole (or is larger than 20 MiB)"));
            }
            *image = pb::Image { media_type, data, url: String::new() };
        }
    }
    Ok(fetched)
}

/// The URL, if the node may fetch it.
fn allowed_url(raw: &str) -> Result<reqwest::Url, &'static str> {
    let url = reqwest::Url::parse(raw).map_err(|_| "the image URL is not a valid URL")?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("only http(s) image URLs are fetched");
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("the image URL carries credentials");
    }
    let local = match url.host_str().map(|h| h.trim_start_matches('[').trim_end_matches(']')) {
        None => true,
        Some(host) => match host.parse::<IpAddr>() {
            Ok(ip) => !is_public(ip),
            Err(_) => host.eq_ignore_ascii_case("localhost") || host.to_ascii_lowercase().ends_with(".localhost"),
        },
    };
    if local {
        return Err("the image URL points at this machine or its private network");
    }
    Ok(url)
}

fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.octets()[0] == 100 && (64..128).contains(&v4.octets()[1]))
        }
        IpAddr::V6(v6) => {
            let mapped = v6.to_ipv4_mapped().map(|v4| is_public(IpAddr::V4(v4)));
            mapped.unwrap_or(
                !(v6.is_loopback()
                    || v6.is_unspecified()
                    || (v6.segments()[0] & 0xfe00) == 0xfc00
                    || (v6.segments()[0] & 0xffc0) == 0xfe80),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::{self, Reply};
    use super::*;
    use crate::adapter::AdapterKind;

    fn with_url(url: &str) -> pb::RunRequest {
        let image = pb::Image { url: url.into(), ..Default::default() };
        let message = pb::ChatMessage { role: pb::Role::User.into(), images: vec![image], ..Default::default() };
        pb::RunRequest { messages: vec![message], ..Default::default() }
    }

    fn any(raw: &str) -> Result<reqwest::Url, &'static str> {
        reqwest::Url::parse(raw).map_err(|_| "bad")
    }

    #[tokio::test]
    async fn a_fetched_image_replaces_its_url_and_bad_answers_are_refused() {
        let client = super::super::http_client();
        let server = fake::serve(Reply::chunks(200, "image/png", ["\u{89}PNG"])).await;
        let request = with_url(&format!("{}/cat.png", server.base_url));
        assert!(any_url(&request));
        let fetched = fetch_urls_checked(&client, &request, any).await.unwrap();
        let image = &fetched.messages[0].images[0];
        assert_eq!((image.media_type.as_str(), image.url.as_str()), ("image/png", ""));
        assert_eq!(image.data, "\u{89}PNG".as_bytes());
        assert!(!any_url(&fetched));

        let html = fake::serve(Reply::chunks(200, "text/html", ["<html>"])).await;
        let refused = fetch_urls_checked(&client, &with_url(&format!("{}/x", html.base_url)), any).await;
        assert!(matches!(refused, Err(AdapterError::InvalidRequest(m)) if m.contains("png, jpeg")));
        let missing = fake::serve(Reply::chunks(404, "image/png", [""])).await;
        let refused = fetch_urls_checked(&client, &with_url(&format!("{}/x", missing.base_url)), any).await;
        assert!(matches!(refused, Err(AdapterError::InvalidRequest(m)) if m.contains("404")));
        // The real rule refuses this machine.
        let refused = fetch_urls(&request).await;
        assert!(matches!(refused, Err(AdapterError::InvalidRequest(m)) if m.contains("this machine")));
    }

    #[tokio::test]
    async fn an_ollama_model_without_vision_refuses_images_and_not_knowing_does_not() {
        let client = crate::adapter::http_client();
        let text_only = r#"{"capabilities":["completion","tools"]}"#;
        let server = fake::serve(Reply::json(200, text_only)).await;
        let refused = ensure_ollama_takes_images(&client, &fake::target(AdapterKind::Ollama, &server.base_url)).await;
        assert!(
            matches!(&refused, Err(AdapterError::InvalidRequest(m)) if m == "model `test-model` does not accept images (Ollama lists its capabilities as: completion, tools)"),
            "{refused:?}"
        );
        for answer in [
            Reply::json(200, r#"{"capabilities":["completion","vision"]}"#),
            Reply::json(200, r#"{"details":{}}"#),
            Reply::json(500, r#"{"error":"boom"}"#),
            Reply::json(200, "not json"),
        ] {
            let server = fake::serve(answer).await;
            let target = fake::target(AdapterKind::Ollama, &server.base_url);
            assert!(ensure_ollama_takes_images(&client, &target).await.is_ok());
        }
    }

    #[test]
    fn only_public_http_urls_are_fetched() {
        for ok in ["https://example.com/cat.png", "http://93.184.216.34/a.png", "https://[2606:4700::1]/a.png"] {
            assert!(allowed_url(ok).is_ok(), "{ok}");
        }
        for refused in [
            "file:///etc/passwd",
            "ftp://example.com/a.png",
            "http://localhost:11434/api/tags",
            "http://app.localhost/a.png",
            "http://127.0.0.1/a.png",
            "http://10.0.0.5/a.png",
            "http://192.168.1.1/a.png",
            "http://169.254.169.254/latest/meta-data",
            "http://100.64.0.1/a.png",
            "http://[::1]/a.png",
            "http://[fd00::1]/a.png",
            "http://[::ffff:127.0.0.1]/a.png",
            "http://user:pw@example.com/a.png",
        ] {
            assert!(allowed_url(refused).is_err(), "{refused}");
        }
    }
}
