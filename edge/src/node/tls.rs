//! The node-facing mTLS listener. TLS is terminated here with tokio-rustls
//! (not tonic's `ServerTlsConfig`) so that every refusal gets a typed reason,
//! a log line and a metric, and so the node identity is parsed once per
//! connection and handed to the gRPC service as connection info.
//!
//! It also keeps the certificate expiry gauges: the notAfter of the
//! certificate each node presented at its last accepted handshake (until a
//! reload unlists the node) and of the Edge's own serving certificate.

use std::collections::BTreeSet;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use iop_proto::identity::NodeIdentity;
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tonic::transport::server::Connected;

use crate::metrics::{EdgeMetrics, NodeLabels};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Node TLS handshakes under way at once. Past it the accept loop waits for
/// one to finish (each is bounded by `HANDSHAKE_TIMEOUT`), so a flood of
/// connections that never finish their handshake costs bounded memory and
/// tasks, and nodes are served as handshakes complete.
pub const MAX_CONCURRENT_HANDSHAKES: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("{field}: cannot read {path}: {source}")]
    Read { field: &'static str, path: String, source: io::Error },
    #[error("{field}: {path} holds no usable PEM {what}")]
    Pem { field: &'static str, path: String, what: &'static str },
    #[error("tls: {0}")]
    Rustls(String),
}

fn read(field: &'static str, path: &Path) -> Result<Vec<u8>, TlsSetupError> {
    std::fs::read(path).map_err(|source| TlsSetupError::Read { field, path: path.display().to_string(), source })
}

pub fn load_certs(field: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let pem = read(field, path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem).filter_map(Result::ok).collect();
    if certs.is_empty() {
        return Err(TlsSetupError::Pem { field, path: path.display().to_string(), what: "certificate" });
    }
    Ok(certs)
}

pub fn load_key(field: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsSetupError> {
    let pem = read(field, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|_| TlsSetupError::Pem {
        field,
        path: path.display().to_string(),
        what: "private key",
    })
}

/// notAfter of the Edge's serving certificate (the first of `cert_file`, the
/// leaf `server_config` serves) into
/// `iop_edge_server_certificate_expiry_timestamp_seconds`. Called at start
/// and by every applied reload; a file that cannot be read or parsed leaves
/// the gauge as it was (the config loaded it a moment before, so only a
/// racing rewrite can do that, and the next reload records it).
pub fn record_server_certificate(metrics: &EdgeMetrics, cert_file: &Path) {
    let leaf = load_certs("tls.cert_file", cert_file).map_err(|e| e.to_string()).and_then(|certs| {
        let (_, cert) = x509_parser::parse_x509_certificate(&certs[0]).map_err(|e| e.to_string())?;
        Ok(cert.validity().not_after.timestamp())
    });
    match leaf {
        Ok(not_after) => {
            metrics.server_certificate_expiry.set(not_after);
        }
        Err(error) => tracing::warn!(%error, "cannot read the expiry of the Edge's server certificate"),
    }
}

/// Server config that requires a client certificate chaining to `ca_file`.
pub fn server_config(ca_file: &Path, cert_file: &Path, key_file: &Path) -> Result<Arc<ServerConfig>, TlsSetupError> {
    let mut roots = RootCertStore::empty();
    for ca in load_certs("tls.ca_file", ca_file)? {
        roots.add(ca).map_err(|e| TlsSetupError::Rustls(format!("tls.ca_file: {e}")))?;
    }
    let verifier =
        WebPkiClientVerifier::builder(Arc::new(roots)).build().map_err(|e| TlsSetupError::Rustls(e.to_string()))?;
    let mut config = ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(load_certs("tls.cert_file", cert_file)?, load_key("tls.key_file", key_file)?)
        .map_err(|e| TlsSetupError::Rustls(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Why a node connection was refused before any gRPC call. The label is the
/// metric label and the log field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeRejection {
    #[error("no client certificate was presented")]
    NoClientCertificate,
    #[error("client certificate is not signed by the configured CA")]
    UntrustedIssuer,
    #[error("client certificate has expired")]
    Expired,
    #[error("client certificate is not valid yet")]
    NotYetValid,
    #[error("client certificate was revoked")]
    Revoked,
    #[error("client certificate was rejected")]
    BadCertificate,
    #[error("client certificate does not carry exactly one spiffe://<trust-domain>/node/<name> URI SAN")]
    MissingIdentity,
    #[error("client certificate belongs to another trust domain")]
    ForeignTrustDomain,
    #[error("node is not listed in the edge config")]
    UnknownNode,
    #[error("TLS handshake failed")]
    Tls,
    #[error("TLS handshake timed out")]
    Timeout,
}

impl HandshakeRejection {
    pub fn label(self) -> &'static str {
        match self {
            Self::NoClientCertificate => "no_client_certificate",
            Self::UntrustedIssuer => "untrusted_issuer",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::Revoked => "revoked",
            Self::BadCertificate => "bad_certificate",
            Self::MissingIdentity => "missing_identity",
            Self::ForeignTrustDomain => "foreign_trust_domain",
            Self::UnknownNode => "unknown_node",
            Self::Tls => "tls_error",
            Self::Timeout => "handshake_timeout",
        }
    }

    fn from_io(err: &io::Error) -> Self {
        let Some(tls) = err.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) else {
            return Self::Tls;
        };
        match tls {
            rustls::Error::NoCertificatesPresented => Self::NoClientCertificate,
            rustls::Error::InvalidCertificate(cert) => match cert {
                CertificateError::UnknownIssuer | CertificateError::BadSignature => Self::UntrustedIssuer,
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => Self::Expired,
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => Self::NotYetValid,
                CertificateError::Revoked => Self::Revoked,
                _ => Self::BadCertificate,
            },
            _ => Self::Tls,
        }
    }
}

/// Who is on the other end of an accepted node connection; available to every
/// gRPC call on it as `request.extensions().get::<NodePeer>()`.
#[derive(Debug, Clone)]
pub struct NodePeer {
    pub identity: NodeIdentity,
    pub remote: SocketAddr,
}

/// What the verified leaf certificate of an accepted node says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identified {
    pub identity: NodeIdentity,
    /// The certificate's notAfter, Unix seconds.
    pub not_after: i64,
}

/// Maps the verified leaf certificate to a listed node identity.
pub fn identify(
    leaf: &CertificateDer<'_>,
    trust_domain: &str,
    allowed: &BTreeSet<String>,
) -> Result<Identified, HandshakeRejection> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let (_, cert) = X509Certificate::from_der(leaf).map_err(|_| HandshakeRejection::BadCertificate)?;
    let san = cert
        .subject_alternative_name()
        .map_err(|_| HandshakeRejection::BadCertificate)?
        .ok_or(HandshakeRejection::MissingIdentity)?;
    let uris: Vec<&str> = san
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(uri) => Some(*uri),
            _ => None,
        })
        .collect();
    let [uri] = uris.as_slice() else {
        return Err(HandshakeRejection::MissingIdentity);
    };
    let identity = NodeIdentity::parse(uri).map_err(|_| HandshakeRejection::MissingIdentity)?;
    if identity.trust_domain != trust_domain {
        return Err(HandshakeRejection::ForeignTrustDomain);
    }
    if !allowed.contains(&identity.name) {
        return Err(HandshakeRejection::UnknownNode);
    }
    Ok(Identified { identity, not_after: cert.validity().not_after.timestamp() })
}

/// An accepted, verified and identified node connection.
pub struct NodeConn {
    stream: TlsStream<TcpStream>,
    peer: NodePeer,
    /// notAfter of the certificate the node presented (Unix seconds).
    not_after: i64,
}

impl Connected for NodeConn {
    type ConnectInfo = NodePeer;
    fn connect_info(&self) -> NodePeer {
        self.peer.clone()
    }
}

impl AsyncRead for NodeConn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for NodeConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// What the accept loop needs to decide who may connect.
pub struct PolicyRules {
    pub tls: Arc<ServerConfig>,
    pub trust_domain: String,
    pub allowed_nodes: BTreeSet<String>,
}

/// The current rules; a config reload replaces them (new connections only).
pub struct AcceptPolicy {
    rules: std::sync::RwLock<Arc<PolicyRules>>,
}

impl AcceptPolicy {
    pub fn new(rules: PolicyRules) -> Self {
        Self { rules: std::sync::RwLock::new(Arc::new(rules)) }
    }

    pub fn current(&self) -> Arc<PolicyRules> {
        self.rules.read().unwrap().clone()
    }

    /// Replaces the rules and removes the certificate expiry series of the
    /// nodes they no longer list, under the write lock (see
    /// [`AcceptPolicy::record_node_certificate`]).
    pub fn replace(&self, rules: PolicyRules, metrics: &EdgeMetrics) {
        let mut current = self.rules.write().unwrap();
        for node in current.allowed_nodes.difference(&rules.allowed_nodes) {
            metrics.node_certificate_expiry.remove(&NodeLabels { node: node.clone() });
        }
        *current = Arc::new(rules);
    }

    /// Records the notAfter of the certificate `node` presented at an
    /// accepted handshake, if the current rules still list it. The series
    /// stays after the node disconnects. It is set under the read lock and
    /// removed under the write lock of `replace`, so a handshake that ends
    /// while a reload unlists its node leaves no series behind: either it
    /// sets the series before `replace` removes it, or it sees the new rules.
    fn record_node_certificate(&self, metrics: &EdgeMetrics, node: &str, not_after: i64) {
        let rules = self.rules.read().unwrap();
        if rules.allowed_nodes.contains(node) {
            metrics.node_certificate_expiry.get_or_create(&NodeLabels { node: node.to_string() }).set(not_after);
        }
    }
}

/// Accepts TCP connections, runs the handshake and identity check off the
/// accept loop, and yields identified connections to the gRPC server.
pub fn accept_loop(
    listener: TcpListener,
    policy: Arc<AcceptPolicy>,
    metrics: Arc<EdgeMetrics>,
) -> (mpsc::Receiver<Result<NodeConn, io::Error>>, tokio::task::JoinHandle<()>) {
    accept_loop_with(listener, policy, metrics, MAX_CONCURRENT_HANDSHAKES)
}

/// [`accept_loop`] with at most `max_handshakes` handshakes at once.
pub fn accept_loop_with(
    listener: TcpListener,
    policy: Arc<AcceptPolicy>,
    metrics: Arc<EdgeMetrics>,
    max_handshakes: usize,
) -> (mpsc::Receiver<Result<NodeConn, io::Error>>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(16);
    let slots = Arc::new(tokio::sync::Semaphore::new(max_handshakes));
    let task = tokio::spawn(async move {
        loop {
            let permit = slots.clone().acquire_owned().await.expect("the semaphore is never closed");
            let (tcp, remote) = match listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "node listener accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let rules = policy.current();
            let acceptor = TlsAcceptor::from(rules.tls.clone());
            let (policy, metrics, tx) = (policy.clone(), metrics.clone(), tx.clone());
            metrics.node_handshakes_in_progress.inc();
            tokio::spawn(async move {
                let result = handshake(&acceptor, tcp, remote, &rules).await;
                metrics.node_handshakes_in_progress.dec();
                drop(permit);
                match result {
                    Ok(conn) => {
                        policy.record_node_certificate(&metrics, &conn.peer.identity.name, conn.not_after);
                        tracing::info!(node = %conn.peer.identity.name, %remote, "node connection accepted");
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Err(reason) => {
                        metrics.reason(&metrics.handshake_rejections, reason.label());
                        tracing::warn!(reason = reason.label(), %remote, "node connection refused: {reason}");
                    }
                }
            });
        }
    });
    (rx, task)
}

async fn handshake(
    acceptor: &TlsAcceptor,
    tcp: TcpStream,
    remote: SocketAddr,
    policy: &PolicyRules,
) -> Result<NodeConn, HandshakeRejection> {
    let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
        .await
        .map_err(|_| HandshakeRejection::Timeout)?
        .map_err(|e| HandshakeRejection::from_io(&e))?;
    let leaf = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .ok_or(HandshakeRejection::NoClientCertificate)?;
    let Identified { identity, not_after } = identify(leaf, &policy.trust_domain, &policy.allowed_nodes)?;
    Ok(NodeConn { stream, peer: NodePeer { identity, remote }, not_after })
}

#[cfg(test)]
mod tests {
    use super::*;
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

    /// Issue 8 item 5: connections that never finish their handshake occupy
    /// at most `max_handshakes` slots; the next waits to be accepted until
    /// one ends.
    #[tokio::test]
    async fn concurrent_handshakes_are_bounded() {
        crate::install_crypto_provider();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_string()]).unwrap().self_signed(&key).unwrap();
        let key = PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        let tls =
            ServerConfig::builder().with_no_client_auth().with_single_cert(vec![cert.der().clone()], key).unwrap();
        let rules = PolicyRules { tls: Arc::new(tls), trust_domain: "iop.local".into(), allowed_nodes: allowed() };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = EdgeMetrics::new();
        let (_incoming, task) = accept_loop_with(listener, Arc::new(AcceptPolicy::new(rules)), metrics.clone(), 2);
        let in_progress = || metrics.node_handshakes_in_progress.get();

        // Three connections that never send a ClientHello.
        let mut silent = Vec::new();
        for _ in 0..3 {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
        wait_for(|| in_progress() == 2).await;
        // The third stays in the backlog, however long we look (a slow
        // machine can only make this pass, never fail wrongly).
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(in_progress(), 2);
        // One gives up: its handshake fails and the third is taken up.
        drop(silent.remove(0));
        let rejected = || {
            let labels = crate::metrics::ReasonLabels { reason: HandshakeRejection::Tls.label() };
            metrics.handshake_rejections.get_or_create(&labels).get()
        };
        wait_for(|| rejected() >= 1).await;
        wait_for(|| in_progress() == 2).await;
        task.abort();
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
            let mut params = CertificateParams::default();
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

        /// The Edge's server config from the files, as a reload loads it.
        fn server_config(&self) -> Arc<ServerConfig> {
            server_config(&self.path("ca.pem"), &self.path("edge.pem"), &self.path("edge.key")).unwrap()
        }
    }

    fn jan_1(year: i32) -> i64 {
        date_time_ymd(year, 1, 1).unix_timestamp()
    }

    fn node_rules(tls: Arc<ServerConfig>, nodes: &[&str]) -> PolicyRules {
        let allowed_nodes = nodes.iter().map(|n| n.to_string()).collect();
        PolicyRules { tls, trust_domain: "iop.local".into(), allowed_nodes }
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
        let tls = pki.server_config();
        let policy = Arc::new(AcceptPolicy::new(node_rules(tls.clone(), &["mac-1", "mac-2"])));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = EdgeMetrics::new();
        let (mut incoming, task) = accept_loop_with(listener, policy.clone(), metrics.clone(), 4);
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
        let expected =
            [format!(r#"iop_edge_node_certificate_expiry_timestamp_seconds{{node="mac-1"}} {}"#, jan_1(2092))];
        assert_eq!(node_expiry_lines(&metrics), expected);

        drop((conn, client));
        assert_eq!(node_expiry_lines(&metrics), expected, "kept after the node disconnects");
        policy.replace(node_rules(tls.clone(), &["mac-1"]), &metrics);
        assert_eq!(node_expiry_lines(&metrics), expected, "a reload that keeps the node keeps it");
        policy.replace(node_rules(tls, &["mac-2"]), &metrics);
        assert!(node_expiry_lines(&metrics).is_empty(), "a reload that unlists the node removes it");
        policy.record_node_certificate(&metrics, "mac-1", jan_1(2092));
        assert!(node_expiry_lines(&metrics).is_empty(), "a handshake that ends after the reload records nothing");
        task.abort();
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
        std::fs::write(pki.path("garbage.pem"), "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
            .unwrap();
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
}
