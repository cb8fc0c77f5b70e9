use super::*;
use std::net::IpAddr;

use crate::core::net::source_of;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
    SanType, date_time_ymd,
};

fn leaf(sans: Vec<SanType>) -> CertificateDer<'static> {
    let mut params = CertificateParams::default();
    params.subject_alt_names = sans;
    params.self_signed(&KeyPair::generate().unwrap()).unwrap().der().clone()
}

fn uri(u: &str) -> SanType {
    SanType::URI(u.try_into().unwrap())
}

fn allowed() -> BTreeSet<String> {
    BTreeSet::from(["mac-1".to_string()])
}

/// Issue 8 item 5, as issue 41 item 3 changed it: connections that never
/// finish their handshake occupy at most `max_handshakes` places; the
/// listener keeps accepting, and a new connection takes the place of the
/// oldest unfinished one, which is closed.
#[tokio::test]
async fn concurrent_handshakes_are_bounded_by_evicting_the_oldest() {
    crate::install_crypto_provider();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string()]).unwrap().self_signed(&key).unwrap();
    let key = PrivateKeyDer::try_from(key.serialize_der()).unwrap();
    let tls = ServerConfig::builder().with_no_client_auth().with_single_cert(vec![cert.der().clone()], key).unwrap();
    let rules = PolicyRules { tls: Arc::new(tls), trust_domain: "iop.local".into(), allowed_nodes: allowed() };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = EdgeMetrics::new();
    let profile = HandshakeProfile { max_handshakes: 2, ..patient() };
    let load = NodeLoad::new(metrics.clone());
    let (_incoming, task) = accept_loop(listener, Arc::new(AcceptPolicy::new(rules)), metrics.clone(), load, profile);
    let in_progress = || metrics.node_handshakes_in_progress.get();

    // Three connections that never send a ClientHello, one after another.
    let mut silent = Vec::new();
    for expected in [1, 2] {
        silent.push(TcpStream::connect(addr).await.unwrap());
        wait_for(|| in_progress() == expected).await;
    }
    silent.push(TcpStream::connect(addr).await.unwrap());
    wait_for(|| rejections(&metrics, HandshakeRejection::Evicted) == 1).await;
    // The first gave its place up: the Edge closed it; two stay under way.
    let mut first = silent.remove(0);
    let mut byte = [0u8; 1];
    assert_eq!(tokio::io::AsyncReadExt::read(&mut first, &mut byte).await.unwrap_or(0), 0);
    wait_for(|| in_progress() == 2).await;
    task.abort();
}

/// A profile whose deadlines never pass within a test.
fn patient() -> HandshakeProfile {
    let hour = Duration::from_secs(3600);
    HandshakeProfile { first_byte: hour, handshake: hour, ..HandshakeProfile::default() }
}

fn rejections(metrics: &EdgeMetrics, reason: HandshakeRejection) -> u64 {
    metrics.handshake_rejections.get_or_create(&crate::metrics::ReasonLabels { reason: reason.label() }).get()
}

/// A TCP connection to `addr` from the loopback address `from` (Linux
/// routes all of 127/8 to loopback), so a test has many sources.
async fn connect_from(from: [u8; 4], addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((from, 0))).unwrap();
    socket.connect(addr).await.unwrap()
}

/// The Edge's clock for node certificates in a test: set by hand
/// (`ServerConfig::time_provider`).
#[derive(Debug)]
struct TestClock(std::sync::atomic::AtomicU64);

impl TestClock {
    /// At the system's time.
    fn now() -> Arc<Self> {
        Arc::new(Self(UnixTime::now().as_secs().into()))
    }

    fn set(&self, unix_seconds: i64) {
        self.0.store(unix_seconds as u64, std::sync::atomic::Ordering::Relaxed);
    }
}

impl rustls::time_provider::TimeProvider for TestClock {
    fn current_time(&self) -> Option<UnixTime> {
        let secs = self.0.load(std::sync::atomic::Ordering::Relaxed);
        Some(UnixTime::since_unix_epoch(Duration::from_secs(secs)))
    }
}

/// An Edge listener with real mTLS for the nodes `nodes`, and the PKI.
struct Listener {
    pki: Pki,
    addr: SocketAddr,
    policy: Arc<AcceptPolicy>,
    metrics: Arc<EdgeMetrics>,
    incoming: mpsc::Receiver<Result<NodeConn, io::Error>>,
    task: tokio::task::JoinHandle<()>,
    /// The clock the listener judges certificates by.
    clock: Arc<TestClock>,
}

impl Listener {
    async fn start(nodes: &[&str], profile: HandshakeProfile) -> Self {
        crate::install_crypto_provider();
        let pki = Pki::new();
        let dns = SanType::DnsName("localhost".try_into().unwrap());
        pki.issue("edge", dns, ExtendedKeyUsagePurpose::ServerAuth, 2091);
        let clock = TestClock::now();
        let mut rules = pki.rules(nodes);
        let mut tls = Arc::try_unwrap(rules.tls).unwrap();
        tls.time_provider = clock.clone();
        rules.tls = Arc::new(tls);
        let policy = Arc::new(AcceptPolicy::new(rules));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = EdgeMetrics::new();
        let load = NodeLoad::new(metrics.clone());
        let (incoming, task) = accept_loop(listener, policy.clone(), metrics.clone(), load, profile);
        Self { pki, addr, policy, metrics, incoming, task, clock }
    }

    /// A node `name` completes its mTLS handshake from `from`.
    async fn node(&self, name: &str, from: [u8; 4]) -> tokio_rustls::client::TlsStream<TcpStream> {
        let client = self.client(&self.pki, &format!("spiffe://iop.local/node/{name}"));
        self.dial(&client, from).await.unwrap()
    }

    /// A node's TLS client config with a certificate for `uri` that `ca`
    /// signed, valid from 2020 to 2092, trusting this Edge.
    fn client(&self, ca: &Pki, uri_san: &str) -> Arc<rustls::ClientConfig> {
        let (cert, key) = ca.issue("node", uri(uri_san), ExtendedKeyUsagePurpose::ClientAuth, 2092);
        let mut roots = RootCertStore::empty();
        roots.add(self.pki.ca.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(vec![cert], key)
            .unwrap();
        Arc::new(client)
    }

    async fn dial(
        &self,
        client: &Arc<rustls::ClientConfig>,
        from: [u8; 4],
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let connector = tokio_rustls::TlsConnector::from(client.clone());
        let server = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        connector.connect(server, connect_from(from, self.addr).await).await
    }

    /// The alert the Edge refuses `client`'s connection with: TLS 1.3 ends
    /// the client's handshake before the Edge has verified its
    /// certificate, so the alert is what the client's first read gets.
    async fn refusal(&self, client: &Arc<rustls::ClientConfig>) -> Option<rustls::AlertDescription> {
        use tokio::io::AsyncReadExt;
        let read = match self.dial(client, [127, 0, 0, 1]).await {
            Ok(mut stream) => stream.read(&mut [0u8; 1]).await.map(drop),
            Err(e) => Err(e),
        };
        match read.err()?.get_ref()?.downcast_ref::<rustls::Error>()? {
            rustls::Error::AlertReceived(alert) => Some(*alert),
            _ => None,
        }
    }
}

/// Issue 25 item 2: idle connections from one source (they never send
/// a TLS byte) take at most `max_per_source` handshake slots; the rest
/// are closed at once and counted, and a node from another address
/// gets through while the flood stays connected. The deadlines are an
/// hour: the per-source bound alone lets the node in.
#[tokio::test]
async fn an_idle_flood_from_one_source_does_not_keep_a_node_out() {
    let profile = HandshakeProfile { max_handshakes: 16, max_per_source: 4, ..patient() };
    let mut edge = Listener::start(&["mac-1"], profile).await;
    let mut flood = Vec::new();
    for _ in 0..40 {
        flood.push(connect_from([127, 0, 0, 2], edge.addr).await);
    }
    let metrics = edge.metrics.clone();
    wait_for(|| rejections(&metrics, HandshakeRejection::SourceBusy) == 36).await;
    assert_eq!(metrics.node_handshakes_in_progress.get(), 4);

    let _node = edge.node("mac-1", [127, 0, 0, 1]).await;
    let conn = edge.incoming.recv().await.unwrap().unwrap();
    assert_eq!(conn.peer.identity.name, "mac-1");
    assert_eq!(metrics.node_handshakes_in_progress.get(), 4, "the flood is still connected");
    let text = metrics.encode();
    assert!(text.contains(r#"iop_edge_node_handshake_rejections_total{reason="source_busy"} 36"#), "{text}");
    drop(flood);
    edge.task.abort();
}

/// A connection that sends no byte is closed at the first-byte deadline
/// (`first_byte_timeout`); one that started its ClientHello and stalled
/// is closed at the handshake deadline (`handshake_timeout`).
#[tokio::test]
async fn silent_connections_end_at_the_first_byte_deadline_and_slow_ones_at_the_handshake_deadline() {
    let quick = HandshakeProfile { first_byte: Duration::from_millis(50), ..patient() };
    let edge = Listener::start(&["mac-1"], quick).await;
    let mut silent = TcpStream::connect(edge.addr).await.unwrap();
    let metrics = edge.metrics.clone();
    wait_for(|| rejections(&metrics, HandshakeRejection::FirstByteTimeout) == 1).await;
    let mut buf = [0u8; 1];
    assert_eq!(tokio::io::AsyncReadExt::read(&mut silent, &mut buf).await.unwrap_or(0), 0, "closed");
    assert_eq!(metrics.node_handshakes_in_progress.get(), 0);
    edge.task.abort();

    let slow = HandshakeProfile { handshake: Duration::from_millis(100), ..patient() };
    let edge = Listener::start(&["mac-1"], slow).await;
    let mut started = TcpStream::connect(edge.addr).await.unwrap();
    // The first byte of a TLS handshake record, and nothing more.
    tokio::io::AsyncWriteExt::write_all(&mut started, &[0x16]).await.unwrap();
    let metrics = edge.metrics.clone();
    wait_for(|| rejections(&metrics, HandshakeRejection::Timeout) == 1).await;
    assert_eq!(rejections(&metrics, HandshakeRejection::FirstByteTimeout), 0);
    edge.task.abort();
}

/// Issue 41 item 3: a ClientHello started within the first-byte window
/// must also be whole within it (`hello_timeout`), not hold its place for
/// the whole handshake deadline.
#[tokio::test]
async fn a_hello_started_and_never_finished_ends_at_the_first_byte_deadline() {
    let quick = HandshakeProfile { first_byte: Duration::from_millis(100), ..patient() };
    let edge = Listener::start(&["mac-1"], quick).await;
    let mut started = TcpStream::connect(edge.addr).await.unwrap();
    // A handshake record announcing 512 bytes, and 4 of them.
    tokio::io::AsyncWriteExt::write_all(&mut started, &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc])
        .await
        .unwrap();
    let metrics = edge.metrics.clone();
    wait_for(|| rejections(&metrics, HandshakeRejection::HelloTimeout) == 1).await;
    let mut buf = [0u8; 1];
    assert_eq!(tokio::io::AsyncReadExt::read(&mut started, &mut buf).await.unwrap_or(0), 0, "closed");
    assert_eq!(rejections(&metrics, HandshakeRejection::Timeout), 0);
    edge.task.abort();
}

/// Nodes reconnecting at once (an Edge restart) from their own
/// addresses are all let in by the default profile.
#[tokio::test]
async fn a_burst_of_reconnecting_nodes_is_not_refused() {
    let names: Vec<String> = (0..24).map(|i| format!("mac-{i}")).collect();
    let listed: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut edge = Listener::start(&listed, HandshakeProfile::default()).await;
    let clients = futures_util::future::join_all(
        names.iter().enumerate().map(|(i, name)| edge.node(name, [127, 0, 1, i as u8 + 1])),
    )
    .await;
    let mut seen = BTreeSet::new();
    for _ in &clients {
        seen.insert(edge.incoming.recv().await.unwrap().unwrap().peer.identity.name.clone());
    }
    assert_eq!(seen.len(), names.len());
    assert!(!edge.metrics.encode().contains("iop_edge_node_handshake_rejections_total{"));
    edge.task.abort();
}

/// Issue 25 item 1: a node holds at most MAX_CONNECTIONS_PER_NODE
/// connections; the next is closed after its handshake and counted,
/// and once one of them ends the node may connect again.
#[tokio::test]
async fn a_node_holds_a_bounded_number_of_connections() {
    let mut edge = Listener::start(&["mac-1"], patient()).await;
    let mut held = Vec::new();
    for _ in 0..MAX_CONNECTIONS_PER_NODE {
        let client = edge.node("mac-1", [127, 0, 0, 1]).await;
        held.push((client, edge.incoming.recv().await.unwrap().unwrap()));
    }
    let refusals = || {
        let labels = crate::metrics::NodeLimitLabels { node: "mac-1".into(), limit: "connections" };
        edge.metrics.node_limit_refusals.get_or_create(&labels).get()
    };
    let mut extra = edge.node("mac-1", [127, 0, 0, 1]).await;
    wait_for(|| refusals() == 1).await;
    let mut buf = [0u8; 1];
    assert_eq!(tokio::io::AsyncReadExt::read(&mut extra, &mut buf).await.unwrap_or(0), 0, "closed");
    assert!(edge.metrics.encode().contains(r#"iop_edge_node_connections{node="mac-1"} 4"#));

    drop(held.pop());
    let _again = edge.node("mac-1", [127, 0, 0, 1]).await;
    assert_eq!(edge.incoming.recv().await.unwrap().unwrap().peer.identity.name, "mac-1");
    assert_eq!(refusals(), 1);
    edge.task.abort();
}

#[test]
fn sources_are_addresses_and_ipv6_64s() {
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(source_of(ip("10.1.2.3")), ip("10.1.2.3"));
    assert_eq!(source_of(ip("::ffff:10.1.2.3")), ip("10.1.2.3"));
    assert_eq!(source_of(ip("2001:db8:1:2:aaaa:bbbb:cccc:dddd")), ip("2001:db8:1:2::"));
    assert_eq!(source_of(ip("2001:db8:1:2::1")), source_of(ip("2001:db8:1:2:ffff::9")));
    assert_ne!(source_of(ip("2001:db8:1:2::1")), source_of(ip("2001:db8:1:3::1")));
}

async fn wait_for(check: impl Fn() -> bool) {
    for _ in 0..2000 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out");
}

#[test]
fn a_listed_spiffe_node_is_identified() {
    let id = identify(&leaf(vec![uri("spiffe://iop.local/node/mac-1")]), "iop.local", &allowed()).unwrap();
    assert_eq!(id.identity.name, "mac-1");
}

/// A CA and the leaves it signs, real certificates written as PEM files.
struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Self {
        Self::named("rcgen self signed cert")
    }

    /// A CA whose subject's common name is `name`.
    fn named(name: &str) -> Self {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let pki = Self { ca, dir: tempfile::tempdir().unwrap() };
        std::fs::write(pki.path("ca.pem"), pki.ca.pem()).unwrap();
        pki
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    /// A leaf valid from 2020 to January 1st of `until`, written as
    /// `<name>.pem` and `<name>.key`; returns its DER and key.
    fn issue(
        &self,
        name: &str,
        san: SanType,
        usage: ExtendedKeyUsagePurpose,
        until: i32,
    ) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![san];
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.not_before = date_time_ymd(2020, 1, 1);
        params.not_after = date_time_ymd(until, 1, 1);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        std::fs::write(self.path(&format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(self.path(&format!("{name}.key")), key.serialize_pem()).unwrap();
        (cert.der().clone(), PrivateKeyDer::try_from(key.serialize_der()).unwrap())
    }

    /// The rules of the Edge with these files for `nodes`, as a reload
    /// loads them.
    fn rules(&self, nodes: &[&str]) -> PolicyRules {
        let allowed_nodes: BTreeSet<String> = nodes.iter().map(|n| n.to_string()).collect();
        let (ca, cert, key) = (self.path("ca.pem"), self.path("edge.pem"), self.path("edge.key"));
        let tls = server_config(&ca, &cert, &key, "iop.local", &allowed_nodes).unwrap();
        PolicyRules { tls, trust_domain: "iop.local".into(), allowed_nodes }
    }
}

fn jan_1(year: i32) -> i64 {
    date_time_ymd(year, 1, 1).unix_timestamp()
}

fn node_expiry_lines(metrics: &EdgeMetrics) -> Vec<String> {
    let text = metrics.encode();
    text.lines()
        .filter(|l| l.starts_with("iop_edge_node_certificate_expiry_timestamp_seconds{"))
        .map(str::to_string)
        .collect()
}

/// A real mTLS handshake through the accept loop records the notAfter of
/// the certificate the node presented; the series outlives the
/// connection and a reload that keeps the node, and goes with the
/// reload that unlists it. A handshake that ends after that records
/// nothing.
#[tokio::test]
async fn an_accepted_handshake_records_the_node_certificate_until_a_reload_unlists_the_node() {
    crate::install_crypto_provider();
    let pki = Pki::new();
    let dns = SanType::DnsName("localhost".try_into().unwrap());
    pki.issue("edge", dns, ExtendedKeyUsagePurpose::ServerAuth, 2091);
    let node = uri("spiffe://iop.local/node/mac-1");
    let (node_cert, node_key) = pki.issue("mac-1", node, ExtendedKeyUsagePurpose::ClientAuth, 2092);
    let policy = Arc::new(AcceptPolicy::new(pki.rules(&["mac-1", "mac-2"])));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = EdgeMetrics::new();
    let load = NodeLoad::new(metrics.clone());
    let (mut incoming, task) = accept_loop(listener, policy.clone(), metrics.clone(), load, patient());
    assert!(node_expiry_lines(&metrics).is_empty());

    let mut roots = RootCertStore::empty();
    roots.add(pki.ca.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(vec![node_cert], node_key)
        .unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let client = connector.connect(name, tcp).await.unwrap();
    let conn = incoming.recv().await.unwrap().unwrap();
    assert_eq!(conn.peer.identity.name, "mac-1");
    let expected = [format!(r#"iop_edge_node_certificate_expiry_timestamp_seconds{{node="mac-1"}} {}"#, jan_1(2092))];
    assert_eq!(node_expiry_lines(&metrics), expected);

    drop((conn, client));
    assert_eq!(node_expiry_lines(&metrics), expected, "kept after the node disconnects");
    policy.replace(pki.rules(&["mac-1"]), &metrics);
    assert_eq!(node_expiry_lines(&metrics), expected, "a reload that keeps the node keeps it");
    policy.replace(pki.rules(&["mac-2"]), &metrics);
    assert!(node_expiry_lines(&metrics).is_empty(), "a reload that unlists the node removes it");
    let identity = NodeIdentity::new("iop.local", "mac-1").unwrap();
    let late = policy.admit_connection(&metrics, &identity, jan_1(2092));
    assert_eq!(late.err(), Some(HandshakeRejection::UnknownNode), "a handshake that ends after the reload");
    assert!(node_expiry_lines(&metrics).is_empty(), "records nothing");
    task.abort();
}

/// The open connections of a node a reload no longer admits end at
/// `cut_off`, whatever is under way on them; a node the reload keeps
/// keeps its connection.
#[tokio::test]
async fn a_reload_that_unlists_a_node_ends_its_open_connections() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut edge = Listener::start(&["mac-1", "mac-2"], patient()).await;
    let mut gone = Vec::new();
    for _ in 0..2 {
        let client = edge.node("mac-1", [127, 0, 0, 1]).await;
        gone.push((client, edge.incoming.recv().await.unwrap().unwrap()));
    }
    let mut kept_client = edge.node("mac-2", [127, 0, 0, 1]).await;
    let mut kept = edge.incoming.recv().await.unwrap().unwrap();
    // A read under way on the Edge's side of each connection.
    let reads: Vec<_> = gone
        .into_iter()
        .map(|(client, mut conn)| {
            tokio::spawn(async move {
                let mut buf = [0u8; 8];
                let read = conn.read(&mut buf).await;
                (client, conn, read)
            })
        })
        .collect();
    assert!(edge.policy.cut_off().is_empty(), "the rules still admit every node");

    edge.policy.replace(edge.pki.rules(&["mac-2"]), &edge.metrics);
    assert_eq!(edge.policy.cut_off(), ["mac-1"]);
    for read in reads {
        let (mut client, mut conn, read) = tokio::time::timeout(Duration::from_secs(10), read).await.unwrap().unwrap();
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::ConnectionAborted);
        assert!(conn.write_all(b"x").await.is_err(), "no write either");
        drop(conn);
        let mut buf = [0u8; 1];
        assert!(matches!(client.read(&mut buf).await, Ok(0) | Err(_)), "the node sees its connection end");
    }
    assert!(edge.policy.cut_off().is_empty(), "once");

    kept_client.write_all(b"ping").await.unwrap();
    kept_client.flush().await.unwrap();
    let mut buf = [0u8; 4];
    kept.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping", "the node the reload keeps is untouched");
    edge.task.abort();
}

/// The serving certificate's notAfter, at start and after a reload
/// renewed the file; an unreadable file keeps the last value.
#[test]
fn the_server_certificate_expiry_follows_the_loaded_file() {
    let pki = Pki::new();
    let metrics = EdgeMetrics::new();
    let dns = || SanType::DnsName("localhost".try_into().unwrap());
    pki.issue("edge", dns(), ExtendedKeyUsagePurpose::ServerAuth, 2091);
    record_server_certificate(&metrics, &pki.path("edge.pem"));
    assert_eq!(metrics.server_certificate_expiry.get(), jan_1(2091));
    let line = format!("iop_edge_server_certificate_expiry_timestamp_seconds {}", jan_1(2091));
    assert!(metrics.encode().lines().any(|l| l == line), "{}", metrics.encode());
    pki.issue("edge", dns(), ExtendedKeyUsagePurpose::ServerAuth, 2093);
    record_server_certificate(&metrics, &pki.path("edge.pem"));
    assert_eq!(metrics.server_certificate_expiry.get(), jan_1(2093), "renewed");
    record_server_certificate(&metrics, &pki.path("missing.pem"));
    std::fs::write(pki.path("garbage.pem"), "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").unwrap();
    record_server_certificate(&metrics, &pki.path("garbage.pem"));
    assert_eq!(metrics.server_certificate_expiry.get(), jan_1(2093), "unchanged by a file it cannot read");
}

#[test]
fn identity_rules_are_enforced_with_typed_reasons() {
    let cases = [
        (vec![], HandshakeRejection::MissingIdentity),
        (vec![SanType::DnsName("mac-1".try_into().unwrap())], HandshakeRejection::MissingIdentity),
        (
            vec![uri("spiffe://iop.local/node/mac-1"), uri("spiffe://iop.local/node/mac-2")],
            HandshakeRejection::MissingIdentity,
        ),
        (vec![uri("spiffe://iop.local/edge/mac-1")], HandshakeRejection::MissingIdentity),
        (vec![uri("spiffe://other.domain/node/mac-1")], HandshakeRejection::ForeignTrustDomain),
        (vec![uri("spiffe://iop.local/node/mac-9")], HandshakeRejection::UnknownNode),
    ];
    for (sans, expected) in cases {
        assert_eq!(identify(&leaf(sans.clone()), "iop.local", &allowed()).err(), Some(expected), "{sans:?}");
    }
}

/// Issue 43 item 6: the Edge refuses inside the handshake, with the most
/// specific alert, so the node can tell why: a foreign CA is `unknown_ca`
/// (`decrypt_error` when it bears the name of the Edge's CA: the signature
/// does not verify), an expired certificate `certificate_expired`, a node
/// the config does not list and a foreign trust domain `access_denied`, a
/// certificate without a node identity `bad_certificate`. The Edge counts
/// its own, finer reason for each.
#[tokio::test]
async fn each_refused_handshake_sends_the_node_its_alert_and_counts_the_reason() {
    use rustls::AlertDescription as A;
    let edge = Listener::start(&["mac-1"], patient()).await;
    let (rogue, namesake) = (Pki::named("rogue CA"), Pki::new());
    let cases = [
        (edge.client(&rogue, "spiffe://iop.local/node/mac-1"), A::UnknownCA, HandshakeRejection::UntrustedIssuer),
        (edge.client(&namesake, "spiffe://iop.local/node/mac-1"), A::DecryptError, HandshakeRejection::UntrustedIssuer),
        (edge.client(&edge.pki, "spiffe://iop.local/node/mac-9"), A::AccessDenied, HandshakeRejection::UnknownNode),
        (
            edge.client(&edge.pki, "spiffe://other.domain/node/mac-1"),
            A::AccessDenied,
            HandshakeRejection::ForeignTrustDomain,
        ),
        (
            edge.client(&edge.pki, "spiffe://iop.local/edge/mac-1"),
            A::BadCertificate,
            HandshakeRejection::MissingIdentity,
        ),
    ];
    for (client, alert, reason) in cases {
        let before = rejections(&edge.metrics, reason);
        assert_eq!(edge.refusal(&client).await, Some(alert), "{reason:?}");
        let metrics = edge.metrics.clone();
        wait_for(|| rejections(&metrics, reason) == before + 1).await;
    }
    // The listed node with a good certificate, once the Edge's clock is
    // past its notAfter.
    let listed = edge.client(&edge.pki, "spiffe://iop.local/node/mac-1");
    edge.clock.set(jan_1(2092) + 1);
    assert_eq!(edge.refusal(&listed).await, Some(A::CertificateExpired));
    let metrics = edge.metrics.clone();
    wait_for(|| rejections(&metrics, HandshakeRejection::Expired) == 1).await;
    edge.task.abort();
}

/// No TLS session is resumed: a node that connected while its certificate
/// was valid and comes back with the session tickets of that connection
/// is verified again, and refused once the certificate has expired.
#[tokio::test]
async fn a_node_that_connected_before_its_certificate_expired_is_verified_again() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut edge = Listener::start(&["mac-1"], patient()).await;
    let client = edge.client(&edge.pki, "spiffe://iop.local/node/mac-1");
    let mut first = edge.dial(&client, [127, 0, 0, 1]).await.unwrap();
    let mut conn = edge.incoming.recv().await.unwrap().unwrap();
    assert_eq!(conn.peer.identity.name, "mac-1");
    // The node reads what the Edge sent, tickets (if any) included.
    conn.write_all(b"hi").await.unwrap();
    conn.flush().await.unwrap();
    let mut buf = [0u8; 2];
    first.read_exact(&mut buf).await.unwrap();
    drop((first, conn));

    edge.clock.set(jan_1(2092) + 1);
    assert_eq!(edge.refusal(&client).await, Some(rustls::AlertDescription::CertificateExpired));
    edge.task.abort();
}

/// Issue 43 item 6: an open connection ends when its certificate does.
/// The connection's `expired` token is cancelled first, then its reads and
/// writes fail; the node sees its connection end. (tokio's clock is paused
/// once the connection is open: the hour left passes at once.)
#[tokio::test]
async fn an_open_connection_ends_at_its_certificates_not_after() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut edge = Listener::start(&["mac-1"], patient()).await;
    // An hour and a second before the end: the notAfter second is valid.
    edge.clock.set(jan_1(2092) - 3600);
    let mut client = edge.node("mac-1", [127, 0, 0, 1]).await;
    let mut conn = edge.incoming.recv().await.unwrap().unwrap();
    assert_eq!(conn.peer.certificate.not_after, jan_1(2092));
    let expired = conn.peer.certificate.expired.clone();
    assert!(!expired.is_cancelled());

    tokio::time::pause();
    let started = tokio::time::Instant::now();
    let read = conn.read(&mut [0u8; 8]).await;
    assert_eq!(read.unwrap_err().kind(), io::ErrorKind::ConnectionAborted);
    let waited = started.elapsed();
    assert!(
        waited > Duration::from_secs(3600) && waited < Duration::from_secs(3602),
        "past the notAfter second: {waited:?}"
    );
    assert!(expired.is_cancelled(), "the session's token, before the read failed");
    assert!(conn.write_all(b"x").await.is_err(), "no write either");
    drop(conn);
    tokio::time::resume();
    let mut buf = [0u8; 1];
    assert!(matches!(client.read(&mut buf).await, Ok(0) | Err(_)), "the node sees its connection end");
    edge.task.abort();
}

#[test]
fn a_certificate_is_valid_through_its_not_after_second() {
    let at = |secs: u64| UnixTime::since_unix_epoch(Duration::from_secs(secs));
    assert_eq!(validity_left(1_000, at(400)), Some(Duration::from_secs(601)));
    assert_eq!(validity_left(1_000, at(1_000)), Some(Duration::from_secs(1)));
    assert_eq!(validity_left(1_000, at(1_001)), None);
    assert_eq!(validity_left(1_000, at(5_000)), None);
    assert_eq!(validity_left(-5, at(0)), None, "before the epoch");
}

/// The serial the Edge records is the one `iop_pki::inspect` (and so the
/// operator) reads from the same certificate.
#[test]
fn the_serial_is_written_as_iop_pki_writes_it() {
    let pki = Pki::new();
    let (der, _) = pki.issue("mac-1", uri("spiffe://iop.local/node/mac-1"), ExtendedKeyUsagePurpose::ClientAuth, 2092);
    let identified = identify(&der, "iop.local", &allowed()).unwrap();
    let pem = std::fs::read_to_string(pki.path("mac-1.pem")).unwrap();
    let expected = iop_pki::inspect(&pem).unwrap().serial;
    assert_eq!(identified.serial, expected);
    assert!(!expected.is_empty() && expected.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')), "{expected}");
}
