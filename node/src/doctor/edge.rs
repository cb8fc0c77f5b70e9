//! The Edge checks: a TCP connection to `edge.url`, then a real TLS
//! handshake with the node's client certificate and the config's CA and
//! server name. Blocking I/O with socket timeouts (the doctor runs it on a
//! blocking thread); the verdicts are pure functions of the outcome.
//!
//! The doctor never registers: a `Register` would replace the running
//! node's session at the Edge. It reads what the Edge sends first after the
//! handshake instead: the Edge hands a connection to its HTTP/2 server only
//! once it accepted the node's certificate and identity, and an HTTP/2
//! server speaks first (its SETTINGS). An alert there is the Edge refusing
//! the certificate or the identity ([`Refusal`]); a close without one is an
//! Edge older than those alerts refusing the identity.

use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use rustls::CertificateError;
use rustls::pki_types::ServerName;

use super::check::Check;
use crate::transport::refusal::Refusal;
use crate::transport::tls::ALPN_H2;

/// What became of the TLS attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum TlsOutcome {
    /// Handshake done, h2 agreed, and the Edge spoke first: accepted.
    Accepted,
    /// Handshake done but the server did not agree to HTTP/2.
    NoH2,
    /// A TLS error, ours (e.g. the Edge's certificate) or the peer's alert.
    Rustls {
        error: rustls::Error,
        after_handshake: bool,
    },
    /// The peer closed without an alert.
    Closed {
        after_handshake: bool,
    },
    /// No answer within the timeout.
    TimedOut {
        after_handshake: bool,
    },
    Io(String),
}

/// Resolves and connects to `host:port`, one address after the other.
pub fn connect(host: &str, port: u16, timeout: Duration) -> (Check, Option<TcpStream>) {
    let shown = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
    let reach_fix = "check edge.url, and that this machine reaches the Edge's node gRPC address \
                     (LoadBalancer or NodePort of the iop-edge-grpc Service, firewall, VPN)";
    let addrs: Vec<SocketAddr> = match (host, port).to_socket_addrs() {
        Ok(addrs) => addrs.collect(),
        Err(e) => {
            let detail = format!("cannot resolve {host}: {e}");
            return (Check::fail("edge tcp", detail, "check edge.url and this machine's DNS"), None);
        }
    };
    let mut errors = Vec::new();
    for addr in &addrs {
        match TcpStream::connect_timeout(addr, timeout) {
            Ok(stream) => {
                let detail = if addr.ip().to_string() == host {
                    format!("connected to {shown}")
                } else {
                    format!("connected to {shown} ({addr})")
                };
                return (Check::ok("edge tcp", detail), Some(stream));
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock) => {
                errors.push(format!("{addr}: no answer within {} s", timeout.as_secs_f32()))
            }
            Err(e) => errors.push(format!("{addr}: {e}")),
        }
    }
    if errors.is_empty() {
        errors.push("the name has no address".into());
    }
    (Check::fail("edge tcp", format!("cannot connect to {shown}: {}", errors.join("; ")), reach_fix), None)
}

/// The handshake on an open connection.
pub fn handshake(
    mut tcp: TcpStream,
    config: Arc<rustls::ClientConfig>,
    server_name: ServerName<'static>,
    timeout: Duration,
) -> TlsOutcome {
    if let Err(e) = tcp.set_read_timeout(Some(timeout)).and_then(|()| tcp.set_write_timeout(Some(timeout))) {
        return TlsOutcome::Io(e.to_string());
    }
    let mut conn = match rustls::ClientConnection::new(config, server_name) {
        Ok(conn) => conn,
        Err(error) => return TlsOutcome::Rustls { error, after_handshake: false },
    };
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut tcp) {
            return classify(&e, false);
        }
    }
    if conn.alpn_protocol() != Some(ALPN_H2) {
        return TlsOutcome::NoH2;
    }
    let mut first = [0u8; 64];
    let outcome = match rustls::Stream::new(&mut conn, &mut tcp).read(&mut first) {
        Ok(0) => TlsOutcome::Closed { after_handshake: true },
        Ok(_) => TlsOutcome::Accepted,
        Err(e) => classify(&e, true),
    };
    conn.send_close_notify();
    let _ = conn.write_tls(&mut tcp);
    outcome
}

fn classify(err: &io::Error, after_handshake: bool) -> TlsOutcome {
    if let Some(error) = err.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        return TlsOutcome::Rustls { error: error.clone(), after_handshake };
    }
    match err.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => TlsOutcome::TimedOut { after_handshake },
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => TlsOutcome::Closed { after_handshake },
        _ => TlsOutcome::Io(err.to_string()),
    }
}

/// The verdict on a TLS outcome, with what to fix.
pub fn tls_check(outcome: &TlsOutcome, server_name: &str, timeout: Duration) -> Check {
    const NAME: &str = "edge tls";
    let bundle_ca = "set tls.ca_file to the CA that signed the Edge's certificate (ca.pem of the node bundle)";
    let secs = timeout.as_secs_f32();
    match outcome {
        TlsOutcome::Accepted => Check::ok(
            NAME,
            format!(
                "handshake with `{server_name}` verified against tls.ca_file; HTTP/2 agreed; the Edge accepted \
                 this node's certificate and identity"
            ),
        ),
        TlsOutcome::NoH2 => Check::fail(
            NAME,
            "the TLS server did not agree to HTTP/2 (ALPN h2), so it is not the Edge's node port".to_string(),
            "point edge.url at the Edge's node gRPC port; a load balancer in front must pass TLS through, not \
             terminate it",
        ),
        TlsOutcome::Rustls { error, .. } => rustls_check(error, server_name, bundle_ca),
        TlsOutcome::Closed { after_handshake: true } => Check::fail(
            NAME,
            "the Edge closed the connection right after the handshake, without a TLS alert: it verified the \
             certificate but does not accept this node's identity (a node name not listed in the Edge config, \
             or another trust domain)"
                .to_string(),
            "list the node in the Edge config (a NodeCatalog named after it) with the certificate's trust domain; \
             the Edge logs `node connection refused` with the reason",
        ),
        TlsOutcome::Closed { after_handshake: false } => Check::fail(
            NAME,
            "the server closed the connection during the TLS handshake".to_string(),
            "check that edge.url names the Edge's node gRPC port (TLS), not another service",
        ),
        TlsOutcome::TimedOut { after_handshake: true } => Check::warn(
            NAME,
            format!("the handshake completed but the server sent nothing within {secs} s; an IOP Edge speaks first"),
            "check that edge.url names the Edge's node gRPC port and nothing in between holds the connection",
        ),
        TlsOutcome::TimedOut { after_handshake: false } => Check::fail(
            NAME,
            format!("no TLS answer within {secs} s"),
            "check that edge.url names the Edge's node gRPC port (TLS), not another service",
        ),
        TlsOutcome::Io(e) => Check::fail(NAME, format!("TLS connection failed: {e}"), "check edge.url"),
    }
}

fn rustls_check(error: &rustls::Error, server_name: &str, bundle_ca: &str) -> Check {
    use rustls::Error as E;
    let (detail, fix): (String, String) = match error {
        E::InvalidCertificate(cert) => match cert {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                ("unknown CA: the Edge's certificate is not signed by the CA in tls.ca_file".into(), bundle_ca.into())
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => (
                format!("hostname mismatch: the Edge's certificate is not valid for `{server_name}`"),
                "set edge.server_name to a name on the Edge's certificate, or issue that certificate for this \
                 name (chart: edge.grpcService.publicUrl)"
                    .into(),
            ),
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => (
                "the Edge's certificate has expired".into(),
                "renew the Edge's certificate (the operator rotates iop-edge-tls: is it running?)".into(),
            ),
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                ("the Edge's certificate is not valid yet".into(), "check this machine's clock".into())
            }
            _ => ("the Edge's certificate was rejected".into(), bundle_ca.into()),
        },
        // The Edge's refusal, as the supervisor logs it; the doctor's own
        // certificate check says whether it is not valid yet.
        E::AlertReceived(alert) => {
            let refusal = Refusal::from_alert(*alert, None, 0);
            (refusal.what(), refusal.fix())
        }
        _ => ("TLS handshake failed".into(), "see the error; check edge.url and the tls.* files".into()),
    };
    // rustls's own text adds what was presented (names, alert); it never
    // holds key material.
    Check::fail("edge tls", format!("{detail} ({error})"), fix)
}

#[cfg(test)]
mod tests;
