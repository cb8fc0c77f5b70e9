//! The node-facing mTLS listener. TLS is terminated here with tokio-rustls
//! (not tonic's `ServerTlsConfig`) so that every refusal gets a typed reason,
//! a log line and a metric, and so the node identity is parsed once per
//! connection and handed to the gRPC service as connection info.
//!
//! Who may connect is decided once per identity by [`admit`]: at the
//! handshake, and again for the connections already open when a reload
//! changes the rules. A node the config no longer lists loses its open
//! connections at that reload, not only its session, so a node that kept
//! its connection cannot open new calls on it ([`AcceptPolicy::cut_off`]).
//!
//! It also keeps the certificate expiry gauges: the notAfter of the
//! certificate each node presented at its last accepted handshake (until a
//! reload unlists the node) and of the Edge's own serving certificate.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
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
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;

use super::limits::{ConnectionGuard, MAX_CONNECTIONS_PER_NODE, NodeLoad};
use crate::metrics::{EdgeMetrics, NodeLabels};

/// How the node listener treats connections before they are identified.
/// The defaults serve production; tests shorten the times
/// (`EdgeBuilder::handshake_profile`).
///
/// Nobody is authenticated before the handshake ends, so what one source
/// can hold is bounded: its connection must start its ClientHello within
/// `first_byte` and finish the handshake within `handshake`, and it may
/// have `max_per_source` handshakes under way (more are closed at once).
/// `max_handshakes` bounds all of them together (past it the accept loop
/// waits for one to end); it is far above what a fleet of reconnecting
/// nodes needs, since a node's handshake takes a round trip or two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeProfile {
    pub first_byte: Duration,
    pub handshake: Duration,
    pub max_handshakes: usize,
    /// Per source address: an IPv4 address or an IPv6 /64 (`source_of`).
    /// Behind a load balancer that rewrites source addresses (Kubernetes
    /// `externalTrafficPolicy: Cluster`) the source is the balancer's, so
    /// keep client addresses (`Local`) for this bound to mean a client.
    pub max_per_source: usize,
}

impl Default for HandshakeProfile {
    fn default() -> Self {
        Self {
            first_byte: Duration::from_secs(2),
            handshake: Duration::from_secs(10),
            max_handshakes: 512,
            max_per_source: 16,
        }
    }
}

/// The source a per-source bound counts by: the IPv4 address (also when
/// it arrives mapped into IPv6), or the /64 of an IPv6 address (one host
/// commonly has a whole /64).
pub fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

/// Handshakes under way per source.
#[derive(Debug, Default)]
struct Sources {
    busy: Mutex<HashMap<IpAddr, usize>>,
}

impl Sources {
    /// A handshake slot of `source`, unless it has `max` under way.
    fn claim(self: &Arc<Self>, source: IpAddr, max: usize) -> Option<SourceSlot> {
        let mut busy = self.busy.lock().unwrap();
        let held = busy.entry(source).or_default();
        if *held >= max {
            return None;
        }
        *held += 1;
        Some(SourceSlot { sources: self.clone(), source })
    }
}

struct SourceSlot {
    sources: Arc<Sources>,
    source: IpAddr,
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut busy = self.sources.busy.lock().unwrap();
        if let Some(held) = busy.get_mut(&self.source) {
            *held -= 1;
            if *held == 0 {
                busy.remove(&self.source);
            }
        }
    }
}

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
    #[error("no TLS bytes arrived in time")]
    FirstByteTimeout,
    #[error("the source address has as many handshakes under way as it may")]
    SourceBusy,
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
            Self::FirstByteTimeout => "first_byte_timeout",
            Self::SourceBusy => "source_busy",
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
    admit(&identity, trust_domain, allowed)?;
    Ok(Identified { identity, not_after: cert.validity().not_after.timestamp() })
}

/// Whether a node identity may use this Edge: its trust domain is the
/// configured one and the config lists its name. The one rule for a new
/// connection's handshake and for the connections a reload keeps open.
pub fn admit(
    identity: &NodeIdentity,
    trust_domain: &str,
    allowed: &BTreeSet<String>,
) -> Result<(), HandshakeRejection> {
    if identity.trust_domain != trust_domain {
        return Err(HandshakeRejection::ForeignTrustDomain);
    }
    if !allowed.contains(&identity.name) {
        return Err(HandshakeRejection::UnknownNode);
    }
    Ok(())
}

/// Ends a node's connection once a reload stops admitting the node
/// ([`AcceptPolicy::cut_off`]): from then on every read and write of the
/// connection fails, so the gRPC server closes it with every call on it.
struct Revocation {
    token: CancellationToken,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl Revocation {
    fn new(token: CancellationToken) -> Self {
        Self { cancelled: Box::pin(token.clone().cancelled_owned()), token }
    }

    /// The error to end the connection with, once revoked; until then it
    /// wakes the task of the read or write that asked.
    fn poll(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        // The future is not polled again once it completed.
        let revoked = self.token.is_cancelled() || self.cancelled.as_mut().poll(cx).is_ready();
        revoked.then(|| io::Error::new(io::ErrorKind::ConnectionAborted, "the edge config no longer admits this node"))
    }
}

/// An accepted, verified and identified node connection.
pub struct NodeConn {
    stream: TlsStream<TcpStream>,
    peer: NodePeer,
    revoked: Revocation,
    /// Counts the connection against its node's limit while it is open.
    _held: ConnectionGuard,
}

/// A connection whose handshake and identity check passed.
struct Handshaken {
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
        if let Some(revoked) = self.revoked.poll(cx) {
            return Poll::Ready(Err(revoked));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for NodeConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if let Some(revoked) = self.revoked.poll(cx) {
            return Poll::Ready(Err(revoked));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(revoked) = self.revoked.poll(cx) {
            return Poll::Ready(Err(revoked));
        }
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
        if let Some(revoked) = self.revoked.poll(cx) {
            return Poll::Ready(Err(revoked));
        }
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

impl PolicyRules {
    pub fn admits(&self, identity: &NodeIdentity) -> Result<(), HandshakeRejection> {
        admit(identity, &self.trust_domain, &self.allowed_nodes)
    }
}

/// The current rules; a config reload replaces them. New connections are
/// judged by the rules of the moment; the open connections of a node the
/// new rules no longer admit are ended by [`AcceptPolicy::cut_off`].
pub struct AcceptPolicy {
    rules: std::sync::RwLock<Arc<PolicyRules>>,
    /// One token per node identity admitted since it was last cut off,
    /// shared by its connections: cancelling it ends them all. Bounded by
    /// the identities the config lists.
    admitted: Mutex<HashMap<NodeIdentity, CancellationToken>>,
}

impl AcceptPolicy {
    pub fn new(rules: PolicyRules) -> Self {
        Self { rules: std::sync::RwLock::new(Arc::new(rules)), admitted: Mutex::default() }
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

    /// Admits a connection of `identity` whose handshake passed, if the
    /// current rules still admit it (a reload may have come in between),
    /// and records the notAfter of the certificate it presented (the series
    /// stays after the node disconnects). Returns the token that ends the
    /// connection when a reload stops admitting the node.
    ///
    /// Done under the read lock, while `replace` writes under the write
    /// lock and `cut_off` runs after it, so a handshake that ends while a
    /// reload unlists its node leaves neither a series nor a connection
    /// behind: either it is admitted before `replace` (and `cut_off` ends
    /// it), or it sees the new rules and is refused.
    fn admit_connection(
        &self,
        metrics: &EdgeMetrics,
        identity: &NodeIdentity,
        not_after: i64,
    ) -> Result<CancellationToken, HandshakeRejection> {
        let rules = self.rules.read().unwrap();
        rules.admits(identity)?;
        let node = NodeLabels { node: identity.name.clone() };
        metrics.node_certificate_expiry.get_or_create(&node).set(not_after);
        Ok(self.admitted.lock().unwrap().entry(identity.clone()).or_default().clone())
    }

    /// Ends every open connection of the nodes the current rules no longer
    /// admit (removed from `nodes`, or of another trust domain); returns
    /// their names. A reload calls it after `replace`, once it has closed
    /// those nodes' sessions (so they end as `config_changed`).
    pub fn cut_off(&self) -> Vec<String> {
        let rules = self.rules.read().unwrap();
        let mut admitted = self.admitted.lock().unwrap();
        let mut cut = Vec::new();
        admitted.retain(|identity, token| {
            let keep = rules.admits(identity).is_ok();
            if !keep {
                token.cancel();
                cut.push(identity.name.clone());
            }
            keep
        });
        cut
    }
}

/// Accepts TCP connections, runs the handshake and identity check off the
/// accept loop (bounded by `profile`), counts each identified connection
/// against its node's limit (`load`), and yields them to the gRPC server.
pub fn accept_loop(
    listener: TcpListener,
    policy: Arc<AcceptPolicy>,
    metrics: Arc<EdgeMetrics>,
    load: Arc<NodeLoad>,
    profile: HandshakeProfile,
) -> (mpsc::Receiver<Result<NodeConn, io::Error>>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(16);
    let slots = Arc::new(tokio::sync::Semaphore::new(profile.max_handshakes));
    let sources = Arc::new(Sources::default());
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
            let Some(source_slot) = sources.claim(source_of(remote.ip()), profile.max_per_source) else {
                // Closed at once, without a log line per connection: a
                // flood would otherwise turn into a flood of logs.
                metrics.reason(&metrics.handshake_rejections, HandshakeRejection::SourceBusy.label());
                tracing::debug!(%remote, "node connection refused: {}", HandshakeRejection::SourceBusy);
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let rules = policy.current();
            let acceptor = TlsAcceptor::from(rules.tls.clone());
            let (policy, metrics, load, tx) = (policy.clone(), metrics.clone(), load.clone(), tx.clone());
            metrics.node_handshakes_in_progress.inc();
            tokio::spawn(async move {
                let result = handshake(&acceptor, tcp, remote, &rules, &profile).await;
                metrics.node_handshakes_in_progress.dec();
                drop((permit, source_slot));
                let admitted = result.and_then(|shaken| {
                    let token = policy.admit_connection(&metrics, &shaken.peer.identity, shaken.not_after)?;
                    Ok((shaken, token))
                });
                match admitted {
                    Ok((Handshaken { stream, peer, not_after: _ }, token)) => {
                        let node = peer.identity.name.clone();
                        let held = match load.open_connection(&node, MAX_CONNECTIONS_PER_NODE) {
                            Ok(held) => held,
                            Err(refusal) => return load.refused(&node, refusal, "connection"),
                        };
                        tracing::info!(%node, %remote, "node connection accepted");
                        let conn = NodeConn { stream, peer, revoked: Revocation::new(token), _held: held };
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Err(HandshakeRejection::FirstByteTimeout) => {
                        let reason = HandshakeRejection::FirstByteTimeout;
                        metrics.reason(&metrics.handshake_rejections, reason.label());
                        tracing::debug!(reason = reason.label(), %remote, "node connection refused: {reason}");
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

/// Waits for the connection's first byte without reading it.
async fn first_byte(tcp: &TcpStream) -> Result<(), HandshakeRejection> {
    match tcp.peek(&mut [0u8; 1]).await {
        Ok(0) | Err(_) => Err(HandshakeRejection::Tls),
        Ok(_) => Ok(()),
    }
}

async fn handshake(
    acceptor: &TlsAcceptor,
    tcp: TcpStream,
    remote: SocketAddr,
    policy: &PolicyRules,
    profile: &HandshakeProfile,
) -> Result<Handshaken, HandshakeRejection> {
    let started = tokio::time::Instant::now();
    tokio::time::timeout(profile.first_byte, first_byte(&tcp))
        .await
        .map_err(|_| HandshakeRejection::FirstByteTimeout)??;
    let stream = tokio::time::timeout_at(started + profile.handshake, acceptor.accept(tcp))
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
    Ok(Handshaken { stream, peer: NodePeer { identity, remote }, not_after })
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
        let profile = HandshakeProfile { max_handshakes: 2, ..patient() };
        let load = NodeLoad::new(metrics.clone());
        let (_incoming, task) =
            accept_loop(listener, Arc::new(AcceptPolicy::new(rules)), metrics.clone(), load, profile);
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

    /// An Edge listener with real mTLS for the nodes `nodes`, and the PKI.
    struct Listener {
        pki: Pki,
        addr: SocketAddr,
        policy: Arc<AcceptPolicy>,
        metrics: Arc<EdgeMetrics>,
        incoming: mpsc::Receiver<Result<NodeConn, io::Error>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Listener {
        async fn start(nodes: &[&str], profile: HandshakeProfile) -> Self {
            crate::install_crypto_provider();
            let pki = Pki::new();
            let dns = SanType::DnsName("localhost".try_into().unwrap());
            pki.issue("edge", dns, ExtendedKeyUsagePurpose::ServerAuth, 2091);
            let policy = Arc::new(AcceptPolicy::new(node_rules(pki.server_config(), nodes)));
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let metrics = EdgeMetrics::new();
            let load = NodeLoad::new(metrics.clone());
            let (incoming, task) = accept_loop(listener, policy.clone(), metrics.clone(), load, profile);
            Self { pki, addr, policy, metrics, incoming, task }
        }

        /// A node `name` completes its mTLS handshake from `from`.
        async fn node(&self, name: &str, from: [u8; 4]) -> tokio_rustls::client::TlsStream<TcpStream> {
            let san = uri(&format!("spiffe://iop.local/node/{name}"));
            let (cert, key) = self.pki.issue(name, san, ExtendedKeyUsagePurpose::ClientAuth, 2092);
            let mut roots = RootCertStore::empty();
            roots.add(self.pki.ca.der().clone()).unwrap();
            let client = rustls::ClientConfig::builder()
                .with_root_certificates(roots)
                .with_client_auth_cert(vec![cert], key)
                .unwrap();
            let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
            let server = rustls_pki_types::ServerName::try_from("localhost").unwrap();
            connector.connect(server, connect_from(from, self.addr).await).await.unwrap()
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
        let expected =
            [format!(r#"iop_edge_node_certificate_expiry_timestamp_seconds{{node="mac-1"}} {}"#, jan_1(2092))];
        assert_eq!(node_expiry_lines(&metrics), expected);

        drop((conn, client));
        assert_eq!(node_expiry_lines(&metrics), expected, "kept after the node disconnects");
        policy.replace(node_rules(tls.clone(), &["mac-1"]), &metrics);
        assert_eq!(node_expiry_lines(&metrics), expected, "a reload that keeps the node keeps it");
        policy.replace(node_rules(tls, &["mac-2"]), &metrics);
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

        edge.policy.replace(node_rules(edge.pki.server_config(), &["mac-2"]), &edge.metrics);
        assert_eq!(edge.policy.cut_off(), ["mac-1"]);
        for read in reads {
            let (mut client, mut conn, read) =
                tokio::time::timeout(Duration::from_secs(10), read).await.unwrap().unwrap();
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
