//! Images a client gave by URL, fetched by the node for a provider that
//! takes only image data (Ollama), when the node's owner allows it
//! (`images.fetch_urls`). Bounded: http(s) only, no credentials in the URL,
//! only public addresses, at most `MAX_IMAGE_BYTES` (`iop_proto::wire`), an
//! image answer, within [`FETCH_TIMEOUT`].
//!
//! "Only public addresses" holds for what the node connects to, not for how
//! the URL is spelled: a name is resolved first (hosts file, DNS, mDNS), it
//! is refused unless every address it resolves to is public, and the
//! connection goes to exactly those addresses ([`Checked`] is the HTTP
//! client's resolver), so a name that rebinds between the check and the
//! connect cannot reach the owner's network. Redirects pass the same check.
//! Every target refused or unreachable gets the one error [`UNREACHABLE`].

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use iop_proto::pb;
use iop_proto::wire::{IMAGE_MEDIA_TYPES, MAX_IMAGE_BYTES};

use super::error::AdapterError;
use super::http::read_capped;
use super::target::ProviderTarget;

pub const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

pub(super) fn any_url(request: &pb::RunRequest) -> bool {
    request.messages.iter().flat_map(|m| &m.images).any(|i| i.data.is_empty() && !i.url.is_empty())
}

/// Refuses a run with images for an Ollama model known not to take them:
/// `/api/show` lists the model's capabilities and `vision` is not among
/// them. Not knowing (an Ollama too old to list capabilities, a failed
/// call) is not refusing: the chat itself then decides. The refusal is the
/// one a provider's own gives (an HTTP 400 coded `unsupported_content`), so
/// the Edge answers it alike whoever said it first: the client's 400, tried
/// on another provider of the route, never held against this one.
pub(super) async fn ensure_ollama_takes_images(
    client: &reqwest::Client,
    target: &ProviderTarget,
) -> Result<(), AdapterError> {
    match ollama_capabilities(client, target).await {
        Some(capabilities) if ollama_image_input(&capabilities) == pb::ImageInput::Refused => {
            Err(AdapterError::HttpStatus {
                status: 400,
                retry_after_ms: None,
                message: format!(
                    "model `{}` does not accept images (Ollama lists its capabilities as: {})",
                    target.target_model,
                    capabilities.join(", ")
                ),
                context_length: false,
                code: Some(iop_proto::provider_error::UNSUPPORTED_CONTENT.into()),
            })
        }
        _ => Ok(()),
    }
}

/// The model's capabilities as Ollama's `/api/show` lists them (`None`: an
/// Ollama too old to list them, or no answer in its shape within
/// [`super::probe::PROBE_TIMEOUT`]). A read-only metadata call.
pub(crate) async fn ollama_capabilities(client: &reqwest::Client, target: &ProviderTarget) -> Option<Vec<String>> {
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
    tokio::time::timeout(super::probe::PROBE_TIMEOUT, show).await.ok().flatten()
}

/// Whether a model with Ollama's `capabilities` reads images (`vision`).
/// Pure; the one reading of them.
pub(crate) fn ollama_image_input(capabilities: &[String]) -> pb::ImageInput {
    match capabilities.iter().any(|c| c == "vision") {
        true => pb::ImageInput::Accepted,
        false => pb::ImageInput::Refused,
    }
}

/// Largest `/api/show` answer read (it carries the model's template and
/// parameters).
const SHOW_LIMIT: usize = 4 * 1024 * 1024;

/// A copy of `request` with every image URL replaced by the image's data.
pub(super) async fn fetch_urls(request: &pb::RunRequest) -> Result<pb::RunRequest, AdapterError> {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    let client = CLIENT.get_or_init(|| image_client(PUBLIC_ONLY, SystemLookup));
    fetch_urls_with(client, PUBLIC_ONLY, request).await
}

/// The one answer for an image URL the node will not or cannot reach: a
/// refused address (given literally, by a name that resolves to one, or by a
/// redirect), a name that does not resolve, a port that refuses or does not
/// answer in time. The same text and code for each, so a client cannot tell
/// an open port on the owner's network from a closed one, or a name that
/// resolves there from one that does not.
const UNREACHABLE: &str = "the image URL could not be fetched (only public http(s) addresses that answer are)";

/// Which addresses the node may fetch from ([`PUBLIC_ONLY`]; tests allow
/// loopback to reach their fake servers).
#[derive(Clone, Copy)]
struct Policy {
    allows: fn(IpAddr) -> bool,
}

const PUBLIC_ONLY: Policy = Policy { allows: is_public };

impl Policy {
    /// Whether `url`'s host may be tried: an address given literally must be
    /// allowed, `localhost` (with or without the root's trailing dot, and
    /// its subdomains) only where loopback is, and any other name is
    /// checked once it is resolved ([`Checked`]). Literal addresses never
    /// reach the resolver, so this is their only check.
    fn allows_host(self, url: &reqwest::Url) -> bool {
        // The URL parser has already normalized how an address is spelled
        // (`2130706433`, `0x7f.1` and `127.1` are `127.0.0.1`).
        let Some(host) = url.host_str() else { return false };
        match host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            Ok(ip) => (self.allows)(ip),
            Err(_) => {
                let name = host.trim_end_matches('.').to_ascii_lowercase();
                (self.allows)(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
                    || !(name == "localhost" || name.ends_with(".localhost"))
            }
        }
    }
}

/// Where names resolve: the system's resolver (hosts file, DNS, mDNS for
/// `.local`), or a table in tests.
trait Lookup: Send + Sync + 'static {
    fn lookup(&self, name: &str) -> futures_util::future::BoxFuture<'static, std::io::Result<Vec<IpAddr>>>;
}

struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup(&self, name: &str) -> futures_util::future::BoxFuture<'static, std::io::Result<Vec<IpAddr>>> {
        let name = name.to_owned();
        Box::pin(async move { Ok(tokio::net::lookup_host((name.as_str(), 0)).await?.map(|a| a.ip()).collect()) })
    }
}

/// The image client's resolver: a name is usable only if it resolves and
/// every address it resolves to is allowed, and the client then connects to
/// exactly those addresses (no second lookup a rebinding name could answer
/// differently).
struct Checked<L> {
    policy: Policy,
    lookup: L,
}

impl<L: Lookup> reqwest::dns::Resolve for Checked<L> {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let (policy, looked_up) = (self.policy, self.lookup.lookup(name.as_str()));
        Box::pin(async move {
            let addrs = looked_up.await?;
            check_resolved(policy, &addrs)?;
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

/// Every resolved address allowed, and at least one.
fn check_resolved(policy: Policy, addrs: &[IpAddr]) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if addrs.is_empty() || !addrs.iter().all(|ip| (policy.allows)(*ip)) {
        return Err("refused address".into());
    }
    Ok(())
}

/// A client of its own: names resolve through [`Checked`], no proxy (a
/// proxy would resolve names itself), and a redirect is followed (at most 5)
/// only to a host the same policy allows, else the fetch fails like an
/// unreachable one.
fn image_client(policy: Policy, lookup: impl Lookup) -> reqwest::Client {
    let redirects = move || {
        reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= 5 || !policy.allows_host(attempt.url()) {
                attempt.error("redirect refused")
            } else {
                attempt.follow()
            }
        })
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let resolver = Arc::new(Checked { policy, lookup });
    let builder = || {
        reqwest::Client::builder()
            .redirect(redirects())
            .no_proxy()
            .connect_timeout(Duration::from_secs(10))
            .dns_resolver(resolver.clone())
    };
    // Without the platform's root certificates only http:// URLs work.
    builder().build().unwrap_or_else(|_| {
        builder().tls_backend_preconfigured(super::http::fallback_tls_config()).build().expect("an image client builds")
    })
}

/// [`fetch_urls`] with the client and policy passed in.
async fn fetch_urls_with(
    client: &reqwest::Client,
    policy: Policy,
    request: &pb::RunRequest,
) -> Result<pb::RunRequest, AdapterError> {
    let mut fetched = request.clone();
    for (i, message) in fetched.messages.iter_mut().enumerate() {
        for (j, image) in message.images.iter_mut().filter(|i| i.data.is_empty()).enumerate() {
            let refuse = |why: &str| AdapterError::InvalidRequest(format!("messages[{i}].images[{j}]: {why}"));
            let url = parse_url(&image.url).map_err(&refuse)?;
            if !policy.allows_host(&url) {
                return Err(refuse(UNREACHABLE));
            }
            let response = tokio::time::timeout(FETCH_TIMEOUT, client.get(url).send())
                .await
                .map_err(|_| refuse(UNREACHABLE))?
                .map_err(|_| refuse(UNREACHABLE))?;
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

/// The URL, if it is one the node would try: http(s), with a host and
/// without credentials. Where it points is the [`Policy`]'s to say.
fn parse_url(raw: &str) -> Result<reqwest::Url, &'static str> {
    let url = reqwest::Url::parse(raw).map_err(|_| "the image URL is not a valid URL")?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("only http(s) image URLs are fetched");
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("the image URL carries credentials");
    }
    if url.host().is_none() {
        return Err("the image URL has no host");
    }
    Ok(url)
}

/// Whether the node may fetch from `ip`: not this machine, a private or
/// shared network, link-local, multicast, broadcast or a reserved block, in
/// IPv4 or IPv6, and not one of those embedded in an IPv6 address
/// (IPv4-mapped and -compatible, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`).
fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            !(v4.is_unspecified()
                || a == 0
                || v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_broadcast()
                || v4.is_multicast()
                || a >= 240
                || (a == 100 && (64..128).contains(&b))
                || (a == 192 && b == 0 && c == 0)
                || (a == 198 && (18..20).contains(&b)))
        }
        IpAddr::V6(v6) => {
            let segments = v6.segments();
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            if segments[..6] == [0; 6] {
                // `::`, `::1` and the deprecated IPv4-compatible `::a.b.c.d`.
                return !v6.is_unspecified() && !v6.is_loopback() && is_public(IpAddr::V4(embedded_v4(&segments[6..])));
            }
            if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                return is_public(IpAddr::V4(embedded_v4(&segments[6..])));
            }
            if segments[0] == 0x2002 {
                return is_public(IpAddr::V4(embedded_v4(&segments[1..3])));
            }
            !(v6.is_multicast()
                || (segments[0] & 0xfe00) == 0xfc00
                || (segments[0] & 0xffc0) == 0xfe80
                || (segments[0] & 0xffc0) == 0xfec0
                || segments[..4] == [0x100, 0, 0, 0]
                || (segments[0] == 0x2001 && segments[1] == 0))
        }
    }
}

fn embedded_v4(segments: &[u16]) -> std::net::Ipv4Addr {
    let bits = (u32::from(segments[0]) << 16) | u32::from(segments[1]);
    std::net::Ipv4Addr::from(bits)
}

#[cfg(test)]
mod tests;
