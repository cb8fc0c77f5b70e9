//! The doctor against real files: certificates issued by a throwaway CA
//! (rcgen), a real TLS listener standing in for the Edge (rustls on a
//! thread, requiring a client certificate as the Edge does), and a fake
//! provider. The clock for certificate validity is injected.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
    SanType, date_time_ymd,
};
use rustls::server::WebPkiClientVerifier;

use super::*;
use crate::adapter::fake::{self, Reply};

/// 2099-01-01T00:00:00Z: every leaf below ends then.
const LEAF_END: u64 = 4_070_908_800;
const DAY: u64 = 86_400;

struct Ca(CertifiedIssuer<'static, KeyPair>);

struct Pair {
    cert: String,
    key: String,
}

impl Ca {
    fn new() -> Self {
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        Self(CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap())
    }

    fn pem(&self) -> String {
        self.0.pem()
    }

    fn issue(&self, sans: Vec<SanType>, eku: ExtendedKeyUsagePurpose) -> Pair {
        let mut params = CertificateParams::default();
        params.subject_alt_names = sans;
        params.extended_key_usages = vec![eku];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.not_before = date_time_ymd(2020, 1, 1);
        params.not_after = date_time_ymd(2099, 1, 1);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.0).unwrap();
        Pair { cert: cert.pem(), key: key.serialize_pem() }
    }

    fn node(&self) -> Pair {
        self.issue(
            vec![SanType::URI("spiffe://iop.local/node/mac-1".try_into().unwrap())],
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    fn edge(&self) -> Pair {
        self.issue(vec![SanType::DnsName("localhost".try_into().unwrap())], ExtendedKeyUsagePurpose::ServerAuth)
    }
}

/// What the stand-in Edge does once the handshake is done.
#[derive(Clone, Copy)]
enum After {
    /// Speaks first, as the Edge's HTTP/2 server does (an empty SETTINGS frame).
    Speak,
    /// Drops the connection, as the Edge does with an unlisted node.
    Drop,
}

struct Edge {
    addr: SocketAddr,
    thread: JoinHandle<()>,
}

impl Edge {
    /// One connection, TLS with `server` as its certificate, requiring a
    /// client certificate that chains to `client_ca`.
    fn serve(server: &Pair, client_ca: &Ca, after: After) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(tls::parse_certs(client_ca.pem().as_bytes()));
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build().unwrap();
        let key = tls::parse_key(&KeyPem::new(server.key.clone().into_bytes())).unwrap();
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(tls::parse_certs(server.cert.as_bytes()), key)
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let thread = std::thread::spawn(move || {
            let (mut tcp, _) = listener.accept().unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut conn = rustls::ServerConnection::new(config).unwrap();
            while conn.is_handshaking() {
                if conn.complete_io(&mut tcp).is_err() {
                    return; // rustls sent its alert
                }
            }
            if let After::Speak = after {
                let mut stream = rustls::Stream::new(&mut conn, &mut tcp);
                stream.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
                let _ = stream.read(&mut [0u8; 64]); // until the doctor closes
            }
        });
        Self { addr, thread }
    }

    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Waits for the connection to be served. A connection of our own
    /// first, so that a doctor that never connected fails the test rather
    /// than hanging it in `accept`.
    fn join(self) {
        drop(std::net::TcpStream::connect(self.addr));
        self.thread.join().unwrap();
    }
}

struct Setup {
    dir: tempfile::TempDir,
    ca: Ca,
    node: Pair,
}

impl Setup {
    fn new() -> Self {
        let ca = Ca::new();
        let node = ca.node();
        let setup = Self { dir: tempfile::tempdir().unwrap(), ca, node };
        write(&setup.path("ca.pem"), &setup.ca.pem(), 0o644);
        write(&setup.path("node.pem"), &setup.node.cert, 0o644);
        write(&setup.path("node-key.pem"), &setup.node.key, 0o600);
        setup
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The node config, dialing `url` and verifying `server_name`.
    fn config(&self, url: &str, server_name: &str) -> PathBuf {
        let path = self.path("node.yaml");
        let yaml = format!(
            "edge: {{ url: \"{url}\", server_name: \"{server_name}\" }}\n\
             tls: {{ ca_file: ca.pem, cert_file: node.pem, key_file: node-key.pem }}\n"
        );
        write(&path, &yaml, 0o644);
        path
    }

    /// Runs the doctor against an Edge serving `edge_cert` and trusting `client_ca`.
    async fn against(&self, edge_cert: &Pair, client_ca: &Ca, after: After, server_name: &str) -> Report {
        let edge = Edge::serve(edge_cert, client_ca, after);
        let report = run(&self.config(&edge.url(), server_name), &options()).await;
        edge.join();
        report
    }
}

fn write(path: &Path, contents: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, contents).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn options() -> Options {
    Options { providers: Vec::new(), now: SystemTime::now(), edge_timeout: Duration::from_secs(5) }
}

fn at(unix: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(unix)
}

async fn unreachable_url() -> String {
    fake::refused_base_url().await.replace("http://", "https://")
}

fn level(report: &Report, name: &str) -> Level {
    report.get(name).unwrap_or_else(|| panic!("no `{name}` check in\n{report}")).level
}

fn detail<'r>(report: &'r Report, name: &str) -> &'r str {
    &report.get(name).unwrap_or_else(|| panic!("no `{name}` check in\n{report}")).detail
}

#[tokio::test]
async fn a_valid_setup_is_all_ok_and_prints_no_key_material() {
    let s = Setup::new();
    let mut provider = fake::serve(Reply::json(200, r#"{"details":{}}"#)).await;
    let edge = Edge::serve(&s.ca.edge(), &s.ca, After::Speak);
    let mut opts = options();
    opts.providers = vec![format!("ollama,{},llama3.2", provider.base_url).parse().unwrap()];
    let report = run(&s.config(&edge.url(), "localhost"), &opts).await;
    edge.join();

    let names: Vec<&str> = report.checks.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "config",
            "tls.ca_file",
            "certificate",
            "identity",
            "tls.key_file",
            "key pair",
            "edge tcp",
            "edge tls",
            "provider ollama"
        ]
    );
    assert!(report.checks.iter().all(|c| c.level == Level::Ok), "{report}");
    assert_eq!(report.exit_code(), 0);
    assert!(detail(&report, "identity").starts_with("spiffe://iop.local/node/mac-1"), "{report}");
    assert!(detail(&report, "certificate").contains("2099-01-01T00:00:00Z"), "{report}");
    assert!(detail(&report, "edge tls").contains("accepted"), "{report}");
    let probe = provider.request().await;
    assert_eq!((probe.method.as_str(), probe.path.as_str()), ("POST", "/api/show"));
    assert_eq!(probe.json()["model"], "llama3.2");

    let text = report.to_string();
    assert!(text.ends_with("9 OK, 0 WARN, 0 FAIL, 0 SKIP"), "{text}");
    let key_body: Vec<&str> = s.node.key.lines().filter(|l| !l.starts_with("-----")).collect();
    assert!(!text.contains("PRIVATE KEY"), "{text}");
    assert!(key_body.iter().all(|line| !text.contains(line)), "{text}");
}

#[tokio::test]
async fn expiry_is_judged_with_the_injected_clock() {
    let s = Setup::new();
    let edge = Edge::serve(&s.ca.edge(), &s.ca, After::Speak);
    let mut soon = options();
    soon.now = at(LEAF_END - 3 * DAY);
    let report = run(&s.config(&edge.url(), "localhost"), &soon).await;
    edge.join();
    assert_eq!(level(&report, "certificate"), Level::Warn, "{report}");
    assert!(detail(&report, "certificate").contains("expires in 3 days"), "{report}");
    assert_eq!(report.exit_code(), 0, "a warning alone passes:\n{report}");

    let mut later = options();
    later.now = at(LEAF_END + 1);
    let report = run(&s.config(&unreachable_url().await, "localhost"), &later).await;
    assert_eq!(level(&report, "certificate"), Level::Fail, "{report}");
    assert!(detail(&report, "certificate").contains("expired 2099-01-01T00:00:00Z"), "{report}");
    let fix = report.get("certificate").unwrap().fix.clone().unwrap();
    assert!(fix.contains("iop-operator node-bundle") && fix.contains("iop-edge pki node"), "both ways: {fix}");
    assert_eq!(report.exit_code(), 1);
}

#[tokio::test]
async fn a_missing_key_file_fails_naming_it() {
    let s = Setup::new();
    std::fs::remove_file(s.path("node-key.pem")).unwrap();
    let report = run(&s.config(&unreachable_url().await, "localhost"), &options()).await;
    let key = report.get("tls.key_file").unwrap();
    assert_eq!(key.level, Level::Fail, "{report}");
    let shown = s.path("node-key.pem").display().to_string();
    assert!(key.detail.contains(&shown) && key.detail.contains("No such file"), "{report}");
    assert_eq!(level(&report, "key pair"), Level::Skip);
    assert_eq!(level(&report, "edge tls"), Level::Skip);
    assert_eq!(level(&report, "certificate"), Level::Ok, "the other files are still checked:\n{report}");
    assert_eq!(report.exit_code(), 1);
}

#[tokio::test]
async fn a_key_of_another_certificate_fails_the_key_pair() {
    let s = Setup::new();
    write(&s.path("node-key.pem"), &s.ca.node().key, 0o644);
    let report = run(&s.config(&unreachable_url().await, "localhost"), &options()).await;
    assert_eq!(level(&report, "tls.key_file"), Level::Warn, "mode 644:\n{report}");
    assert!(report.get("tls.key_file").unwrap().fix.as_ref().unwrap().starts_with("chmod 600"));
    assert_eq!(level(&report, "key pair"), Level::Fail, "{report}");
    assert!(detail(&report, "key pair").contains("public keys differ"), "{report}");
}

#[tokio::test]
async fn an_unreachable_edge_fails() {
    let s = Setup::new();
    let report = run(&s.config(&unreachable_url().await, "localhost"), &options()).await;
    assert_eq!(level(&report, "edge tcp"), Level::Fail, "{report}");
    assert!(detail(&report, "edge tcp").contains("cannot connect to 127.0.0.1:"), "{report}");
    assert_eq!(level(&report, "edge tls"), Level::Skip);
    assert_eq!(report.exit_code(), 1);
}

#[tokio::test]
async fn tls_failures_name_their_cause() {
    let s = Setup::new();
    let other = Ca::new();

    let report = s.against(&other.edge(), &s.ca, After::Speak, "localhost").await;
    assert_eq!(level(&report, "edge tcp"), Level::Ok, "{report}");
    assert!(detail(&report, "edge tls").starts_with("unknown CA"), "{report}");

    let report = s.against(&s.ca.edge(), &s.ca, After::Speak, "edge.elsewhere").await;
    assert!(detail(&report, "edge tls").starts_with("hostname mismatch"), "{report}");
    assert!(detail(&report, "edge tls").contains("`edge.elsewhere`"), "{report}");

    let report = s.against(&s.ca.edge(), &other, After::Speak, "localhost").await;
    assert!(detail(&report, "edge tls").starts_with("the Edge refused this node's certificate"), "{report}");

    let report = s.against(&s.ca.edge(), &s.ca, After::Drop, "localhost").await;
    assert!(detail(&report, "edge tls").contains("does not accept this node's identity"), "{report}");
    assert_eq!(level(&report, "edge tls"), Level::Fail);
    assert_eq!(report.exit_code(), 1);
}

#[tokio::test]
async fn providers_are_probed_only_when_named() {
    let s = Setup::new();
    let config = s.config(&unreachable_url().await, "localhost");
    let report = run(&config, &options()).await;
    assert_eq!(level(&report, "providers"), Level::Skip);
    assert!(detail(&report, "providers").contains("the Edge assigns"), "{report}");

    let mut opts = options();
    let refused = fake::refused_base_url().await;
    let missing = fake::serve(Reply::json(404, r#"{"error":"model 'x' not found"}"#)).await;
    let keyed = fake::serve(Reply::json(401, r#"{"error":"unauthorized"}"#)).await;
    opts.providers = vec![
        format!("openai,{refused},qwen").parse().unwrap(),
        format!("ollama,{},x", missing.base_url).parse().unwrap(),
        "openai,ftp://example.com,m".parse().unwrap(),
        format!("openai,{},m", keyed.base_url).parse().unwrap(),
    ];
    let report = run(&config, &opts).await;
    let providers: Vec<&Check> = report.checks.iter().filter(|c| c.name.starts_with("provider ")).collect();
    assert_eq!(providers.len(), 4, "{report}");
    assert!(providers[..3].iter().all(|c| c.level == Level::Fail), "{report}");
    assert_eq!(providers[3].level, Level::Warn, "{report}");
    assert!(providers[3].detail.contains("wants an API key"), "{report}");
    assert!(providers[0].detail.contains("GET /v1/models"), "{report}");
    assert_eq!(providers[1].fix.as_deref(), Some("pull the model: `ollama pull x`"));
    assert!(providers[2].detail.contains("must use http or https"), "{report}");
}

#[tokio::test]
async fn a_config_that_does_not_load_is_one_failure() {
    let dir = tempfile::tempdir().unwrap();
    let report = run(&dir.path().join("missing.yaml"), &options()).await;
    assert_eq!(report.checks.len(), 1, "{report}");
    assert_eq!(level(&report, "config"), Level::Fail);
    assert!(detail(&report, "config").contains("missing.yaml"));
    assert_eq!(report.exit_code(), 1);
}

#[test]
fn provider_flags_parse() {
    let p: LocalProvider = "ollama, http://127.0.0.1:11434 ,llama3.2:8b".parse().unwrap();
    assert_eq!(
        p,
        LocalProvider {
            adapter: AdapterKind::Ollama,
            base_url: "http://127.0.0.1:11434".into(),
            model: "llama3.2:8b".into()
        }
    );
    assert!("vllm,http://x,m".parse::<LocalProvider>().unwrap_err().contains("unknown adapter `vllm`"));
    assert!("ollama,http://x".parse::<LocalProvider>().is_err());
    assert!("openai,,m".parse::<LocalProvider>().is_err());
}
