//! The dialer against a real gRPC server over real mTLS (tokio-rustls in
//! front of tonic, as the Edge serves), which accepts the node or refuses it
//! with an alert, or closes after the handshake without one.

use std::path::Path;
use std::sync::Arc;

use iop_proto::pb::node_gateway_server::NodeGatewayServer;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName as Dn, SignatureScheme};
use time::{Duration, OffsetDateTime};
use tokio_stream::StreamExt;

use crate::config::NodeConfig;
use crate::transport::fake_edge::FakeEdge;
use crate::transport::refusal::Refusal;
use crate::transport::{Dialer, TransportError, tls};

struct Ca(CertifiedIssuer<'static, KeyPair>);

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        Self(CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap())
    }

    /// A leaf for `san`, valid from `not_before` to `not_after`: (cert, key) PEM.
    fn issue(
        &self,
        san: SanType,
        usage: ExtendedKeyUsagePurpose,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    ) -> (String, String) {
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![san];
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        (params.not_before, params.not_after) = (not_before, not_after);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.0).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn roots(&self) -> Arc<rustls::RootCertStore> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.0.der().clone()).unwrap();
        Arc::new(roots)
    }
}

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

/// Refuses every certificate the chain accepts as the Edge refuses a node
/// it does not list (`access_denied`).
#[derive(Debug)]
struct Unlisted(Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for Unlisted {
    fn root_hint_subjects(&self) -> &[Dn] {
        self.0.root_hint_subjects()
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0.verify_client_cert(end_entity, intermediates, now)?;
        Err(rustls::Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure))
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// What the stand-in Edge does with a connection.
enum Serve {
    /// Serves gRPC on it (every call `unimplemented`).
    Grpc,
    /// Closes it once the handshake is done.
    Close,
}

/// The node's files, and an Edge certificate of the same CA.
struct Setup {
    dir: tempfile::TempDir,
    ca: Ca,
}

impl Setup {
    fn new() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Self { dir: tempfile::tempdir().unwrap(), ca: Ca::new("IOP test CA") }
    }

    /// A stand-in Edge on loopback, verifying client certificates with
    /// `verifier`.
    async fn edge(&self, verifier: Arc<dyn ClientCertVerifier>, serve: Serve) -> std::net::SocketAddr {
        let (cert, key) = self.ca.issue(
            SanType::DnsName("localhost".try_into().unwrap()),
            ExtendedKeyUsagePurpose::ServerAuth,
            now() - Duration::hours(1),
            now() + Duration::days(1),
        );
        let key = tls::parse_key(&tls::KeyPem::new(key.into_bytes())).unwrap();
        let mut config = rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(tls::parse_certs(cert.as_bytes()), key)
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener)
            .then(move |tcp| {
                let acceptor = acceptor.clone();
                async move { acceptor.accept(tcp?).await }
            })
            // A refused handshake ends that connection, not the server.
            .filter(Result::is_ok);
        match serve {
            Serve::Grpc => {
                let service = NodeGatewayServer::new(crate::transport::fake_edge::Gateway(Unimplemented));
                let server = tonic::transport::Server::builder().add_service(service);
                tokio::spawn(server.serve_with_incoming(incoming));
            }
            Serve::Close => {
                tokio::spawn(async move {
                    let mut incoming = std::pin::pin!(incoming);
                    while let Some(stream) = incoming.next().await {
                        drop(stream);
                    }
                });
            }
        }
        addr
    }

    /// A dialer for `addr` with a node certificate valid from `not_before`
    /// to `not_after`, signed by `ca`.
    fn dialer(
        &self,
        addr: std::net::SocketAddr,
        ca: &Ca,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    ) -> Dialer {
        let san = SanType::URI("spiffe://iop.local/node/mac-1".try_into().unwrap());
        let (cert, key) = ca.issue(san, ExtendedKeyUsagePurpose::ClientAuth, not_before, not_after);
        let path = |name: &str| self.dir.path().join(name);
        std::fs::write(path("ca.pem"), self.ca.0.pem()).unwrap();
        std::fs::write(path("node.pem"), cert).unwrap();
        std::fs::write(path("node-key.pem"), key).unwrap();
        let show = |p: &Path| p.display().to_string();
        let yaml = format!(
            "edge: {{ url: \"https://{addr}\", server_name: localhost }}\n\
             tls: {{ ca_file: \"{}\", cert_file: \"{}\", key_file: \"{}\" }}\n",
            show(&path("ca.pem")),
            show(&path("node.pem")),
            show(&path("node-key.pem")),
        );
        Dialer::new(&NodeConfig::from_yaml(&yaml).unwrap()).unwrap()
    }

    fn current_dialer(&self, addr: std::net::SocketAddr) -> Dialer {
        self.dialer(addr, &self.ca, now() - Duration::hours(1), now() + Duration::days(1))
    }

    fn chain(&self, ca: &Ca) -> Arc<dyn ClientCertVerifier> {
        WebPkiClientVerifier::builder(ca.roots()).build().unwrap()
    }
}

struct Unimplemented;

impl FakeEdge for Unimplemented {}

async fn refusal(dialer: &Dialer) -> Option<Refusal> {
    match dialer.connect().await {
        Err(TransportError::Refused(refusal)) => Some(refusal),
        Err(other) => panic!("not a refusal: {other}"),
        Ok(_) => None,
    }
}

/// An accepted node speaks gRPC over the connection whose first bytes the
/// dialer read: the call reaches the server and gets its answer.
#[tokio::test]
async fn an_accepted_node_speaks_grpc_after_the_edges_first_bytes() {
    let setup = Setup::new();
    let addr = setup.edge(setup.chain(&setup.ca), Serve::Grpc).await;
    let mut client = setup.current_dialer(addr).connect().await.unwrap();
    let (_out, rx) = tokio::sync::mpsc::channel(1);
    let status = client.control(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
}

/// Each refusal is this dial's error, with the reason the alert gave.
#[tokio::test]
async fn a_refused_handshake_is_the_dials_error_with_its_reason() {
    let setup = Setup::new();
    let listed = setup.edge(Arc::new(Unlisted(setup.chain(&setup.ca))), Serve::Grpc).await;
    assert_eq!(refusal(&setup.current_dialer(listed)).await, Some(Refusal::NotAdmitted));

    let addr = setup.edge(setup.chain(&setup.ca), Serve::Grpc).await;
    let rogue = Ca::new("rogue CA");
    let foreign = setup.dialer(addr, &rogue, now() - Duration::hours(1), now() + Duration::days(1));
    assert_eq!(refusal(&foreign).await, Some(Refusal::UntrustedIssuer));

    let expired = setup.dialer(addr, &setup.ca, now() - Duration::days(2), now() - Duration::days(1));
    assert_eq!(refusal(&expired).await, Some(Refusal::Expired));
    // The same alert; by this machine's clock the certificate has not begun.
    let early = setup.dialer(addr, &setup.ca, now() + Duration::days(1), now() + Duration::days(2));
    assert_eq!(refusal(&early).await, Some(Refusal::NotYetValid));
}

/// An Edge that closes the connection after the handshake without a word
/// (a node over its connection limit; an Edge older than the alerts)
/// fails the dial without a refusal.
#[tokio::test]
async fn a_connection_closed_after_the_handshake_is_a_failed_dial() {
    let setup = Setup::new();
    let addr = setup.edge(setup.chain(&setup.ca), Serve::Close).await;
    match setup.current_dialer(addr).connect().await {
        Err(TransportError::Connect(reason)) => assert!(reason.contains("without a word"), "{reason}"),
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("connected"),
    }
}
