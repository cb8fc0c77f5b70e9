use rustls::CertificateError;

use super::*;

#[test]
fn each_alert_is_a_closed_reason() {
    use AlertDescription as A;
    let cases = [
        (A::CertificateExpired, Refusal::Expired, "expired"),
        (A::UnknownCA, Refusal::UntrustedIssuer, "untrusted_issuer"),
        (A::DecryptError, Refusal::UntrustedIssuer, "untrusted_issuer"),
        (A::CertificateRevoked, Refusal::Revoked, "revoked"),
        (A::AccessDenied, Refusal::NotAdmitted, "not_admitted"),
        (A::BadCertificate, Refusal::BadCertificate, "bad_certificate"),
        (A::UnsupportedCertificate, Refusal::BadCertificate, "bad_certificate"),
        (A::CertificateUnknown, Refusal::BadCertificate, "bad_certificate"),
        (A::CertificateRequired, Refusal::NoClientCertificate, "no_client_certificate"),
        (A::HandshakeFailure, Refusal::Other(A::HandshakeFailure), "tls_alert"),
    ];
    for (alert, refusal, label) in cases {
        let found = Refusal::from_alert(alert, Some(0), 1_000);
        assert_eq!(found, refusal, "{alert:?}");
        assert_eq!(found.label(), label);
        assert!(found.to_string().starts_with("the Edge refused this node"), "{found}");
    }
}

/// TLS says `certificate_expired` for a certificate not valid yet too;
/// the node's own notBefore tells them apart (unknown: expired).
#[test]
fn a_certificate_not_valid_yet_by_this_machines_clock_is_told_apart() {
    let expired = AlertDescription::CertificateExpired;
    assert_eq!(Refusal::from_alert(expired, Some(2_000), 1_000), Refusal::NotYetValid);
    assert_eq!(Refusal::from_alert(expired, Some(1_000), 1_000), Refusal::Expired);
    assert_eq!(Refusal::from_alert(expired, None, 1_000), Refusal::Expired);
    assert!(Refusal::NotYetValid.to_string().contains("clocks"));
}

#[test]
fn each_message_says_what_to_do() {
    let expired = Refusal::Expired.to_string();
    assert!(expired.starts_with("the Edge refused this node's certificate: it has expired; make a new bundle"));
    assert!(expired.contains("iop-operator node-bundle") && expired.contains("restart iop-node"), "{expired}");
    let unlisted = Refusal::NotAdmitted.to_string();
    assert!(unlisted.contains("does not list this node") && unlisted.contains("NodeCatalog"), "{unlisted}");
    assert!(Refusal::UntrustedIssuer.to_string().contains("another Edge"));
}

#[derive(Debug)]
struct Wrapper(Box<dyn Error + Send + Sync>);

impl fmt::Display for Wrapper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("transport error")
    }
}

impl Error for Wrapper {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(self.0.as_ref())
    }
}

/// The alert is found under the layers a dial's error has (tonic's, a boxed
/// connector error, tokio-rustls's I/O error wrapping rustls's).
#[test]
fn the_alert_is_found_anywhere_in_the_chain() {
    let alert = || rustls::Error::AlertReceived(AlertDescription::AccessDenied);
    let io = || io::Error::new(io::ErrorKind::InvalidData, alert());
    assert_eq!(alert_in(&alert()), Some(AlertDescription::AccessDenied));
    assert_eq!(alert_in(&io()), Some(AlertDescription::AccessDenied));
    let deep = Wrapper(Box::new(Wrapper(Box::new(io()))));
    assert_eq!(alert_in(&deep), Some(AlertDescription::AccessDenied));

    // Not an alert of the peer: rustls's own verdict on the Edge's certificate.
    let ours = io::Error::new(io::ErrorKind::InvalidData, rustls::Error::InvalidCertificate(CertificateError::Expired));
    assert_eq!(alert_in(&Wrapper(Box::new(ours))), None);
    let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "connection refused");
    assert_eq!(alert_in(&Wrapper(Box::new(refused))), None);
}

/// The node's own verdict on the Edge's certificate (a CA rotation ended
/// while this bundle trusts only the old CA): typed, with what to do.
#[test]
fn the_nodes_distrust_of_the_edge_is_typed() {
    let ours = |e: CertificateError| {
        Wrapper(Box::new(io::Error::new(io::ErrorKind::InvalidData, rustls::Error::InvalidCertificate(e))))
    };
    let found = edge_distrust_in(&ours(CertificateError::UnknownIssuer)).unwrap();
    assert_eq!((found, found.label()), (EdgeDistrust::UntrustedIssuer, "untrusted_issuer"));
    assert!(found.to_string().contains("make a new bundle"), "{found}");
    assert_eq!(edge_distrust_in(&ours(CertificateError::Expired)), Some(EdgeDistrust::Expired));
    assert_eq!(edge_distrust_in(&ours(CertificateError::NotValidForName)), Some(EdgeDistrust::WrongName));
    // The Edge's alert is the Edge's refusal, not this.
    let alert = io::Error::new(io::ErrorKind::InvalidData, rustls::Error::AlertReceived(AlertDescription::UnknownCA));
    assert_eq!(edge_distrust_in(&alert), None);
}
