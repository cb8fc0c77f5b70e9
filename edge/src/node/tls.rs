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
//! The chain and the identity are both checked inside the handshake
//! ([`NodeVerifier`]), so a refused node receives a TLS alert naming the
//! kind of refusal (`certificate_expired`, `unknown_ca`, `access_denied`,
//! ...), which the node logs, instead of a connection dropped after it.
//! Every connection is verified whole: the listener resumes no TLS
//! session (a resumed session skips the verifier). A connection ends once
//! its certificate's notAfter has passed ([`validity_left`]), by the clock
//! of the server config (`ServerConfig::time_provider`: the system's, or a
//! test's), and its session with it (`certificate_expired`).
//!
//! It also keeps the certificate expiry gauges: the notAfter of the
//! certificate each node presented at its last accepted handshake (until a
//! reload unlists the node) and of the Edge's own serving certificate.

use std::cell::Cell;
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use iop_proto::identity::NodeIdentity;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{Acceptor, NoServerSessionStorage, WebPkiClientVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::LazyConfigAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::Connected;

use super::handshakes::{Decision, HandshakeLimits, HandshakeTable};
use super::limits::{ConnectionGuard, MAX_CONNECTIONS_PER_NODE, NodeLoad};
use crate::metrics::{EdgeMetrics, NodeLabels};

/// How the node listener treats connections before they are identified.
/// The defaults serve production; tests shorten the times
/// (`EdgeBuilder::handshake_profile`).
///
/// Nobody is authenticated before the handshake ends, so what one source
/// can hold is bounded: its connection must send its whole ClientHello
/// within `first_byte` and finish the handshake within `handshake`, and it may
/// have `max_per_source` handshakes under way (its network,
/// `max_per_network`; more are closed at once). `max_handshakes` bounds
/// all of them together: past it the oldest stranger's handshake gives its
/// place to the new one, and a node's address never gives its place
/// (`super::handshakes`). It is far above what a fleet of reconnecting
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
    /// Per network: an IPv4 /24 or an IPv6 /48 (`super::handshakes`).
    pub max_per_network: usize,
}

impl Default for HandshakeProfile {
    fn default() -> Self {
        Self {
            first_byte: Duration::from_secs(2),
            handshake: Duration::from_secs(10),
            max_handshakes: 512,
            max_per_source: 16,
            max_per_network: 64,
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

/// Server config that requires a client certificate chaining to `ca_file`
/// whose identity is a node of `trust_domain` listed in `allowed_nodes`
/// ([`NodeVerifier`]). It resumes no TLS session, so that every connection
/// presents its certificate to the verifier (a resumed session would skip
/// it: an expired certificate, or one of a CA no longer trusted, would get
/// in again on the strength of an earlier handshake).
pub fn server_config(
    ca_file: &Path,
    cert_file: &Path,
    key_file: &Path,
    trust_domain: &str,
    allowed_nodes: &BTreeSet<String>,
) -> Result<Arc<ServerConfig>, TlsSetupError> {
    let mut roots = RootCertStore::empty();
    for ca in load_certs("tls.ca_file", ca_file)? {
        roots.add(ca).map_err(|e| TlsSetupError::Rustls(format!("tls.ca_file: {e}")))?;
    }
    let chain =
        WebPkiClientVerifier::builder(Arc::new(roots)).build().map_err(|e| TlsSetupError::Rustls(e.to_string()))?;
    let verifier = NodeVerifier { chain, trust_domain: trust_domain.to_string(), allowed_nodes: allowed_nodes.clone() };
    let mut config = ServerConfig::builder()
        .with_client_cert_verifier(Arc::new(verifier))
        .with_single_cert(load_certs("tls.cert_file", cert_file)?, load_key("tls.key_file", key_file)?)
        .map_err(|e| TlsSetupError::Rustls(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

tokio::task_local! {
    /// Why [`NodeVerifier`] refused the certificate of the handshake this
    /// task runs: the error it returns to rustls carries only the alert to
    /// send (`access_denied` for a node not listed and for a foreign trust
    /// domain alike), the Edge's log and metric want the reason.
    static REFUSED: Cell<Option<HandshakeRejection>>;
}

/// The node listener's client certificate verifier: the chain (webpki,
/// against `tls.ca_file`, at the server config's clock), then the
/// identity rule ([`identify`]). Both refuse inside the handshake, with
/// the most specific alert: rustls's for the chain (`certificate_expired`,
/// `unknown_ca`, ...), and [`HandshakeRejection::alert`] for the identity.
#[derive(Debug)]
struct NodeVerifier {
    chain: Arc<dyn ClientCertVerifier>,
    trust_domain: String,
    allowed_nodes: BTreeSet<String>,
}

impl ClientCertVerifier for NodeVerifier {
    fn offer_client_auth(&self) -> bool {
        self.chain.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.chain.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.chain.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.chain.verify_client_cert(end_entity, intermediates, now)?;
        match identify(end_entity, &self.trust_domain, &self.allowed_nodes) {
            Ok(_) => Ok(verified),
            Err(reason) => {
                // Outside a handshake of the accept loop (no scope) there is
                // nobody to tell.
                let _ = REFUSED.try_with(|refused| refused.set(Some(reason)));
                Err(rustls::Error::InvalidCertificate(reason.alert()))
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
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
    #[error("the TLS ClientHello did not arrive whole in time")]
    HelloTimeout,
    #[error("the source address has as many handshakes under way as it may")]
    SourceBusy,
    #[error("the source's network has as many handshakes under way as it may")]
    NetworkBusy,
    #[error("every handshake place is held by a node's address")]
    Busy,
    #[error("a newer connection took the place of this unfinished handshake")]
    Evicted,
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
            Self::HelloTimeout => "hello_timeout",
            Self::SourceBusy => "source_busy",
            Self::NetworkBusy => "network_busy",
            Self::Busy => "busy",
            Self::Evicted => "evicted",
        }
    }

    /// What the verifier refuses an identity with, for the alert rustls
    /// sends the node: `access_denied` for a valid certificate whose
    /// identity this Edge does not admit (not listed, another trust
    /// domain), `bad_certificate` for one that names no node identity.
    /// Only the identity's reasons reach here; the chain's carry rustls's
    /// own errors.
    fn alert(self) -> CertificateError {
        match self {
            Self::ForeignTrustDomain | Self::UnknownNode => CertificateError::ApplicationVerificationFailure,
            _ => CertificateError::NotValidForName,
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
    /// The certificate the node presented on this connection.
    pub certificate: Presented,
}

/// The certificate a node presented on its connection.
#[derive(Debug, Clone)]
pub struct Presented {
    /// Its serial: the raw serial bytes in lowercase hex, no separators
    /// (as `iop_pki::inspect` and the operator show it).
    pub serial: String,
    /// Its notAfter, Unix seconds.
    pub not_after: i64,
    /// Cancelled when the connection ends at that notAfter, before its
    /// reads and writes fail: the session on it ends as
    /// `certificate_expired`, not as the transport error that follows.
    pub expired: CancellationToken,
}

/// What the verified leaf certificate of an accepted node says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identified {
    pub identity: NodeIdentity,
    /// The certificate's notAfter, Unix seconds.
    pub not_after: i64,
    /// The certificate's serial ([`Presented::serial`]).
    pub serial: String,
}

/// How long a certificate whose notAfter is `not_after` (Unix seconds)
/// stays valid at `now`; `None` once it is not. X.509 validity includes
/// the notAfter second itself, and webpki refuses a certificate only once
/// the time (in whole seconds) is past it: the end is one second after
/// the notAfter, so a node whose connection ended there is refused when it
/// dials again, never let in for what is left of that second. (The clock
/// counts whole seconds: a connection ends within a second after that.)
pub fn validity_left(not_after: i64, now: UnixTime) -> Option<Duration> {
    let end = u64::try_from(not_after).ok()?.checked_add(1)?;
    end.checked_sub(now.as_secs()).filter(|left| *left > 0).map(Duration::from_secs)
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
    let serial = cert.tbs_certificate.raw_serial().iter().map(|b| format!("{b:02x}")).collect();
    Ok(Identified { identity, not_after: cert.validity().not_after.timestamp(), serial })
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

/// The longest a connection's expiry timer is armed ahead: tokio's timers
/// reach about two years, a certificate may run for longer; the timer is
/// armed again each time it fires early.
const MAX_ARM: Duration = Duration::from_secs(30 * 24 * 3600);

/// Ends a node's connection once a reload stops admitting the node
/// ([`AcceptPolicy::cut_off`]) or the certificate it presented expires:
/// from then on every read and write of the connection fails, so the gRPC
/// server closes it with every call on it.
struct Ending {
    revoked: CancellationToken,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
    /// When the certificate stops being valid ([`validity_left`]).
    expires_at: tokio::time::Instant,
    timer: Pin<Box<tokio::time::Sleep>>,
    /// [`Presented::expired`], cancelled before the connection fails.
    expired: CancellationToken,
}

impl Ending {
    fn new(revoked: CancellationToken, validity_left: Duration, expired: CancellationToken) -> Self {
        let now = tokio::time::Instant::now();
        let expires_at = now + validity_left;
        Self {
            cancelled: Box::pin(revoked.clone().cancelled_owned()),
            revoked,
            expires_at,
            timer: Box::pin(tokio::time::sleep_until(expires_at.min(now + MAX_ARM))),
            expired,
        }
    }

    /// The error to end the connection with, once revoked or expired;
    /// until then it wakes the task of the read or write that asked.
    fn poll(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        // The future is not polled again once it completed.
        let revoked = self.revoked.is_cancelled() || self.cancelled.as_mut().poll(cx).is_ready();
        if revoked {
            return Some(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the edge config no longer admits this node",
            ));
        }
        self.expired(cx).then(|| io::Error::new(io::ErrorKind::ConnectionAborted, "the node's certificate expired"))
    }

    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.expired.is_cancelled() {
            return true;
        }
        while self.timer.as_mut().poll(cx).is_ready() {
            let now = tokio::time::Instant::now();
            if now >= self.expires_at {
                self.expired.cancel();
                return true;
            }
            self.timer.as_mut().reset(self.expires_at.min(now + MAX_ARM));
        }
        false
    }
}

/// An accepted, verified and identified node connection.
pub struct NodeConn {
    stream: TlsStream<TcpStream>,
    peer: NodePeer,
    ending: Ending,
    /// Counts the connection against its node's limit while it is open.
    _held: ConnectionGuard,
}

/// A connection whose handshake and identity check passed.
struct Handshaken {
    stream: TlsStream<TcpStream>,
    peer: NodePeer,
    /// How long its certificate stays valid ([`validity_left`]).
    validity_left: Duration,
}

impl Connected for NodeConn {
    type ConnectInfo = NodePeer;
    fn connect_info(&self) -> NodePeer {
        self.peer.clone()
    }
}

impl AsyncRead for NodeConn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if let Some(ended) = self.ending.poll(cx) {
            return Poll::Ready(Err(ended));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for NodeConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if let Some(ended) = self.ending.poll(cx) {
            return Poll::Ready(Err(ended));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(ended) = self.ending.poll(cx) {
            return Poll::Ready(Err(ended));
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
        if let Some(ended) = self.ending.poll(cx) {
            return Poll::Ready(Err(ended));
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
    let limits = HandshakeLimits {
        max_handshakes: profile.max_handshakes,
        max_per_source: profile.max_per_source,
        max_per_network: profile.max_per_network,
    };
    let table = HandshakeTable::new(limits);
    let task = tokio::spawn(async move {
        loop {
            // Never waiting for a place: a full backlog would keep a node
            // from even completing TCP.
            let (tcp, remote) = match listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "node listener accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let place = match table.enter(remote.ip()) {
                Ok(place) => place,
                Err(decision) => {
                    let reason = match decision {
                        Decision::NetworkBusy => HandshakeRejection::NetworkBusy,
                        Decision::Busy => HandshakeRejection::Busy,
                        _ => HandshakeRejection::SourceBusy,
                    };
                    // Closed at once, without a log line per connection: a
                    // flood would otherwise turn into a flood of logs.
                    metrics.reason(&metrics.handshake_rejections, reason.label());
                    tracing::debug!(%remote, "node connection refused: {reason}");
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let rules = policy.current();
            let (policy, metrics, load, tx) = (policy.clone(), metrics.clone(), load.clone(), tx.clone());
            let table = table.clone();
            metrics.node_handshakes_in_progress.inc();
            tokio::spawn(async move {
                let result = tokio::select! {
                    result = handshake(tcp, remote, &rules, &profile) => result,
                    () = place.evicted.cancelled() => Err(HandshakeRejection::Evicted),
                };
                metrics.node_handshakes_in_progress.dec();
                drop(place);
                if result.is_ok() {
                    // A valid node certificate: this address is a node's.
                    table.known_node(remote.ip());
                }
                let admitted = result.and_then(|shaken| {
                    let (identity, not_after) = (&shaken.peer.identity, shaken.peer.certificate.not_after);
                    let token = policy.admit_connection(&metrics, identity, not_after)?;
                    Ok((shaken, token))
                });
                match admitted {
                    Ok((Handshaken { stream, peer, validity_left }, token)) => {
                        let node = peer.identity.name.clone();
                        let held = match load.open_connection(&node, MAX_CONNECTIONS_PER_NODE) {
                            Ok(held) => held,
                            Err(refusal) => return load.refused(&node, refusal, "connection"),
                        };
                        tracing::info!(%node, %remote, "node connection accepted");
                        let ending = Ending::new(token, validity_left, peer.certificate.expired.clone());
                        let conn = NodeConn { stream, peer, ending, _held: held };
                        let _ = tx.send(Ok(conn)).await;
                    }
                    // What a scan or a flood produces by the thousand (connections
                    // that say nothing, give their place up, or are not TLS at
                    // all): counted, logged at debug only, so that a flood of
                    // connections is not a flood of log lines.
                    Err(
                        reason @ (HandshakeRejection::FirstByteTimeout
                        | HandshakeRejection::HelloTimeout
                        | HandshakeRejection::Evicted
                        | HandshakeRejection::Tls),
                    ) => {
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
    tcp: TcpStream,
    remote: SocketAddr,
    policy: &PolicyRules,
    profile: &HandshakeProfile,
) -> Result<Handshaken, HandshakeRejection> {
    let started = tokio::time::Instant::now();
    tokio::time::timeout(profile.first_byte, first_byte(&tcp))
        .await
        .map_err(|_| HandshakeRejection::FirstByteTimeout)??;
    // The whole ClientHello within the first-byte window too: a hello
    // started and never finished holds no place for the whole handshake.
    let (hello_by, handshake_by) = (started + profile.first_byte, started + profile.handshake);
    let late = if hello_by < handshake_by { HandshakeRejection::HelloTimeout } else { HandshakeRejection::Timeout };
    let hello = tokio::time::timeout_at(hello_by.min(handshake_by), LazyConfigAcceptor::new(Acceptor::default(), tcp))
        .await
        .map_err(|_| late)?
        .map_err(|e| HandshakeRejection::from_io(&e))?;
    let (shaken, refused) = REFUSED
        .scope(Cell::new(None), async {
            let shaken = tokio::time::timeout_at(handshake_by, hello.into_stream(policy.tls.clone())).await;
            (shaken, REFUSED.with(Cell::get))
        })
        .await;
    let stream = shaken
        .map_err(|_| HandshakeRejection::Timeout)?
        .map_err(|e| refused.unwrap_or_else(|| HandshakeRejection::from_io(&e)))?;
    let leaf = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .ok_or(HandshakeRejection::NoClientCertificate)?;
    let Identified { identity, not_after, serial } = identify(leaf, &policy.trust_domain, &policy.allowed_nodes)?;
    // The verifier judged the chain at this clock a moment ago; a
    // certificate past its end here can only be one that ended since.
    let now = policy.tls.time_provider.current_time().ok_or(HandshakeRejection::Tls)?;
    let validity_left = validity_left(not_after, now).ok_or(HandshakeRejection::Expired)?;
    let certificate = Presented { serial, not_after, expired: CancellationToken::new() };
    Ok(Handshaken { stream, peer: NodePeer { identity, remote, certificate }, validity_left })
}

#[cfg(test)]
mod tests;
