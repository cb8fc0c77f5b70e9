use super::super::fake::{self, Reply};
use super::*;
use crate::adapter::AdapterKind;

fn with_url(url: &str) -> pb::RunRequest {
    let image = pb::Image { url: url.into(), ..Default::default() };
    let message = pb::ChatMessage { role: pb::Role::User.into(), images: vec![image], ..Default::default() };
    pb::RunRequest { messages: vec![message], ..Default::default() }
}

/// Loopback too: tests fetch from their own fake servers.
const LOOPBACK_TOO: Policy = Policy { allows: |ip| ip.is_loopback() || is_public(ip) };

/// Names from a table (a hosts file the test writes), else "not found".
struct Table(Vec<(&'static str, Vec<IpAddr>)>);

impl Lookup for Table {
    fn lookup(&self, name: &str) -> futures_util::future::BoxFuture<'static, std::io::Result<Vec<IpAddr>>> {
        let found = self.0.iter().find(|(n, _)| *n == name).map(|(_, addrs)| addrs.clone());
        Box::pin(async move { found.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such name")) })
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn unreachable_error(result: Result<pb::RunRequest, AdapterError>) -> String {
    match result {
        Err(AdapterError::InvalidRequest(message)) => message,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_fetched_image_replaces_its_url_and_bad_answers_are_refused() {
    let client = image_client(LOOPBACK_TOO, SystemLookup);
    let server = fake::serve(Reply::chunks(200, "image/png", ["\u{89}PNG"])).await;
    let request = with_url(&format!("{}/cat.png", server.base_url));
    assert!(any_url(&request));
    let fetched = fetch_urls_with(&client, LOOPBACK_TOO, &request).await.unwrap();
    let image = &fetched.messages[0].images[0];
    assert_eq!((image.media_type.as_str(), image.url.as_str()), ("image/png", ""));
    assert_eq!(image.data, "\u{89}PNG".as_bytes());
    assert!(!any_url(&fetched));

    let html = fake::serve(Reply::chunks(200, "text/html", ["<html>"])).await;
    let refused = fetch_urls_with(&client, LOOPBACK_TOO, &with_url(&format!("{}/x", html.base_url))).await;
    assert!(matches!(refused, Err(AdapterError::InvalidRequest(m)) if m.contains("png, jpeg")));
    let missing = fake::serve(Reply::chunks(404, "image/png", [""])).await;
    let refused = fetch_urls_with(&client, LOOPBACK_TOO, &with_url(&format!("{}/x", missing.base_url))).await;
    assert!(matches!(refused, Err(AdapterError::InvalidRequest(m)) if m.contains("404")));
    // The real rule refuses this machine.
    let refused = fetch_urls(&request).await;
    assert_eq!(unreachable_error(refused), format!("messages[0].images[0]: {UNREACHABLE}"));
}

/// Issue 25 item 9: this machine under a name (`localhost.` with the
/// root's dot, resolved by the system), an open port and a closed one,
/// and a name that does not resolve all get the same error, and the
/// open port is never contacted.
#[tokio::test]
async fn every_refused_or_unreachable_target_gets_the_same_error() {
    let mut open = fake::serve(Reply::chunks(200, "image/png", ["\u{89}PNG"])).await;
    let open_port = open.base_url.rsplit(':').next().unwrap().to_owned();
    let closed = fake::refused_base_url().await;
    let closed_port = closed.rsplit(':').next().unwrap().to_owned();
    let mut errors = Vec::new();
    for url in [
        format!("http://localhost.:{open_port}/cat.png"),
        format!("http://localhost.:{closed_port}/cat.png"),
        format!("http://LocalHost:{open_port}/cat.png"),
        format!("http://app.localhost.:{open_port}/cat.png"),
        format!("http://127.0.0.1:{open_port}/cat.png"),
        format!("http://127.1:{open_port}/cat.png"),
        format!("http://2130706433:{open_port}/cat.png"),
        format!("http://[::ffff:127.0.0.1]:{open_port}/cat.png"),
        "http://name-that-does-not-resolve.invalid/cat.png".to_owned(),
    ] {
        errors.push((url.clone(), unreachable_error(fetch_urls(&with_url(&url)).await)));
    }
    for (url, error) in &errors {
        assert_eq!(error, &format!("messages[0].images[0]: {UNREACHABLE}"), "{url}");
    }
    assert!(open.received().is_none(), "the open port was contacted");
}

/// The client's resolver itself, with the system's lookup: `localhost`,
/// a hosts-file name, resolves to this machine and is refused there,
/// whatever the URL rule said (`localhost.` with the root's dot resolves
/// the same way on macOS; glibc does not resolve it at all).
#[tokio::test]
async fn the_system_resolver_refuses_a_name_for_this_machine() {
    use reqwest::dns::Resolve;
    let addrs = SystemLookup.lookup("localhost").await.unwrap();
    assert!(!addrs.is_empty() && addrs.iter().all(IpAddr::is_loopback), "{addrs:?}");
    let checked = Checked { policy: PUBLIC_ONLY, lookup: SystemLookup };
    assert!(checked.resolve("localhost".parse().unwrap()).await.is_err());
    assert!(checked.resolve("localhost.".parse().unwrap()).await.is_err());
    let loopback_too = Checked { policy: LOOPBACK_TOO, lookup: SystemLookup };
    let resolved: Vec<SocketAddr> = loopback_too.resolve("localhost".parse().unwrap()).await.unwrap().collect();
    assert!(!resolved.is_empty() && resolved.iter().all(|a| a.ip().is_loopback()), "{resolved:?}");
}

#[tokio::test]
async fn a_name_is_fetched_only_if_every_address_it_resolves_to_is_allowed() {
    let mut server = fake::serve(Reply::chunks(200, "image/png", ["\u{89}PNG"])).await;
    let port = server.base_url.rsplit(':').next().unwrap().to_owned();
    let table = Table(vec![
        ("images.test", vec![ip("127.0.0.1")]),
        ("printer.local", vec![ip("192.168.1.20")]),
        ("intranet.test", vec![ip("127.0.0.1"), ip("10.0.0.7")]),
        ("mapped.test", vec![ip("::ffff:10.0.0.7")]),
        ("empty.test", vec![]),
    ]);
    let client = image_client(LOOPBACK_TOO, table);
    let fetch = |name: &str| with_url(&format!("http://{name}:{port}/cat.png"));
    let fetched = fetch_urls_with(&client, LOOPBACK_TOO, &fetch("images.test")).await.unwrap();
    assert_eq!(fetched.messages[0].images[0].data, "\u{89}PNG".as_bytes(), "an allowed name is fetched");
    server.request().await;
    for name in ["printer.local", "intranet.test", "mapped.test", "empty.test", "unknown.test"] {
        let refused = fetch_urls_with(&client, LOOPBACK_TOO, &fetch(name)).await;
        assert_eq!(unreachable_error(refused), format!("messages[0].images[0]: {UNREACHABLE}"), "{name}");
    }
    assert!(server.received().is_none(), "a refused name reached the server");

    // A redirect is checked like the first URL: to a refused name or
    // address it fails as unreachable, not as the redirect's status.
    for target in [format!("http://printer.local:{port}/cat.png"), "http://10.0.0.7/cat.png".to_owned()] {
        let bounce = fake::serve(Reply::chunks(302, "text/plain", [""]).header("location", &target)).await;
        let refused = fetch_urls_with(&client, LOOPBACK_TOO, &with_url(&format!("{}/x", bounce.base_url))).await;
        assert_eq!(unreachable_error(refused), format!("messages[0].images[0]: {UNREACHABLE}"), "{target}");
    }
}

#[tokio::test]
async fn an_ollama_model_without_vision_refuses_images_and_not_knowing_does_not() {
    let client = crate::adapter::http::http_client();
    let text_only = r#"{"capabilities":["completion","tools"]}"#;
    let server = fake::serve(Reply::json(200, text_only)).await;
    let refused = ensure_ollama_takes_images(&client, &fake::target(AdapterKind::Ollama, &server.base_url)).await;
    let failure = refused.expect_err("a text-only model").to_failure();
    assert!(iop_proto::provider_error::refuses_content(&failure), "the Edge reads it as a refusal of the content");
    assert_eq!(failure.provider_status, 400);
    assert_eq!(
        failure.message,
        "provider answered HTTP 400: model `test-model` does not accept images (Ollama lists its capabilities as: completion, tools)"
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
fn only_http_urls_without_credentials_are_tried_and_only_public_addresses_allowed() {
    for refused in ["file:///etc/passwd", "ftp://example.com/a.png", "http://user:pw@example.com/a.png", "nope"] {
        assert!(parse_url(refused).is_err(), "{refused}");
    }
    for ok in ["https://example.com/cat.png", "http://93.184.216.34/a.png", "https://[2606:4700::1]/a.png"] {
        assert!(PUBLIC_ONLY.allows_host(&parse_url(ok).unwrap()), "{ok}");
    }
    for refused in [
        "http://localhost:11434/api/tags",
        "http://localhost.:11434/api/tags",
        "http://app.localhost/a.png",
        "http://127.0.0.1/a.png",
        "http://0x7f.1/a.png",
        "http://0/a.png",
        "http://10.0.0.5/a.png",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/a.png",
        "http://[::ffff:127.0.0.1]/a.png",
    ] {
        assert!(!PUBLIC_ONLY.allows_host(&parse_url(refused).unwrap()), "{refused}");
    }
    for public in ["93.184.216.34", "8.8.8.8", "2606:4700::1", "2a00:1450::1", "64:ff9b::808:808", "2002:808:808::1"] {
        assert!(is_public(ip(public)), "{public}");
    }
    for private in [
        "0.0.0.0",
        "0.1.2.3",
        "127.0.0.1",
        "127.255.0.9",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "100.127.255.254",
        "192.0.0.8",
        "198.18.0.1",
        "224.0.0.251",
        "239.255.255.250",
        "240.0.0.1",
        "255.255.255.255",
        "::",
        "::1",
        "::ffff:10.0.0.1",
        "::ffff:169.254.169.254",
        "::10.0.0.1",
        "64:ff9b::a00:1",
        "2002:a00:1::1",
        "fc00::1",
        "fd12:3456::1",
        "fe80::1",
        "fec0::1",
        "ff02::fb",
        "100::1",
        "2001:0:4136:e378::1",
    ] {
        assert!(!is_public(ip(private)), "{private}");
    }
}
