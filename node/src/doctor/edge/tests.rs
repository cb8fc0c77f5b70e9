use rustls::AlertDescription;

use super::*;
use crate::doctor::Level;

#[test]
fn each_outcome_names_its_cause() {
    let t = Duration::from_secs(5);
    let check = |o: TlsOutcome| tls_check(&o, "edge.example", t);
    assert_eq!(check(TlsOutcome::Accepted).level, Level::Ok);
    let unknown_ca = check(TlsOutcome::Rustls {
        error: rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
        after_handshake: false,
    });
    assert!(unknown_ca.detail.starts_with("unknown CA"), "{}", unknown_ca.detail);
    assert!(unknown_ca.fix.unwrap().contains("tls.ca_file"));
    let mismatch = check(TlsOutcome::Rustls {
        error: rustls::Error::InvalidCertificate(CertificateError::NotValidForName),
        after_handshake: false,
    });
    assert!(mismatch.detail.starts_with("hostname mismatch") && mismatch.detail.contains("`edge.example`"));
    assert!(mismatch.fix.unwrap().contains("edge.server_name"));
    let refused = check(TlsOutcome::Rustls {
        error: rustls::Error::AlertReceived(AlertDescription::UnknownCA),
        after_handshake: true,
    });
    assert!(refused.detail.starts_with("the Edge refused this node's certificate"), "{}", refused.detail);
    let unlisted = check(TlsOutcome::Closed { after_handshake: true });
    assert!(unlisted.detail.contains("identity"), "{}", unlisted.detail);
    assert_eq!(check(TlsOutcome::TimedOut { after_handshake: true }).level, Level::Warn);
    for failed in [
        TlsOutcome::NoH2,
        TlsOutcome::Closed { after_handshake: false },
        TlsOutcome::TimedOut { after_handshake: false },
        TlsOutcome::Io("boom".into()),
    ] {
        assert_eq!(check(failed.clone()).level, Level::Fail, "{failed:?}");
    }
}

#[test]
fn io_errors_are_classified() {
    let eof = io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed connection");
    assert_eq!(classify(&eof, true), TlsOutcome::Closed { after_handshake: true });
    let slow = io::Error::new(io::ErrorKind::WouldBlock, "timed out");
    assert_eq!(classify(&slow, false), TlsOutcome::TimedOut { after_handshake: false });
    let alert =
        io::Error::new(io::ErrorKind::InvalidData, rustls::Error::AlertReceived(AlertDescription::CertificateExpired));
    assert_eq!(
        classify(&alert, true),
        TlsOutcome::Rustls {
            error: rustls::Error::AlertReceived(AlertDescription::CertificateExpired),
            after_handshake: true
        }
    );
}
