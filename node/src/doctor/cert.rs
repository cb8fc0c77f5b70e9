//! What the doctor reads from a certificate, and its judgements over those
//! facts (pure: the clock is a parameter).

use iop_proto::identity::NodeIdentity;
use rustls::pki_types::CertificateDer;

use super::check::{BUNDLE_SOURCES, Check, Level};

/// A certificate within this long of its end is a warning.
pub const EXPIRY_WARNING_SECS: i64 = 7 * 24 * 3600;

/// The parts of a certificate the checks look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFacts {
    /// Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
    pub uri_sans: Vec<String>,
    /// `None` when the certificate has no extended key usage extension.
    pub client_auth: Option<bool>,
    pub is_ca: bool,
}

/// Parses a DER certificate (x509-parser, as the Edge does for the same identity).
pub fn inspect(der: &CertificateDer<'_>) -> Result<CertFacts, String> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| format!("not a valid X.509 certificate: {e}"))?;
    let uri_sans = match cert.subject_alternative_name() {
        Ok(Some(san)) => san
            .value
            .general_names
            .iter()
            .filter_map(|n| match n {
                GeneralName::URI(uri) => Some((*uri).to_string()),
                _ => None,
            })
            .collect(),
        Ok(None) => Vec::new(),
        Err(e) => return Err(format!("unreadable subject alternative names: {e}")),
    };
    let client_auth = match cert.extended_key_usage() {
        Ok(eku) => eku.map(|e| e.value.client_auth || e.value.any),
        Err(e) => return Err(format!("unreadable extended key usage: {e}")),
    };
    let is_ca = match cert.basic_constraints() {
        Ok(bc) => bc.is_some_and(|b| b.value.ca),
        Err(e) => return Err(format!("unreadable basic constraints: {e}")),
    };
    Ok(CertFacts {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        uri_sans,
        client_auth,
        is_ca,
    })
}

/// FAIL when `now` is outside the validity window, WARN when it ends
/// within [`EXPIRY_WARNING_SECS`], OK otherwise. `what` names the
/// certificate in the message.
pub fn validity(what: &str, facts: &CertFacts, now: i64) -> (Level, String) {
    let until = format_utc(facts.not_after);
    if now < facts.not_before {
        let from = format_utc(facts.not_before);
        return (Level::Fail, format!("{what} is not valid before {from} (now {})", format_utc(now)));
    }
    if now >= facts.not_after {
        return (Level::Fail, format!("{what} expired {until} (now {})", format_utc(now)));
    }
    let left = facts.not_after - now;
    if left < EXPIRY_WARNING_SECS {
        return (Level::Warn, format!("{what} expires in {} (at {until})", format_left(left)));
    }
    (Level::Ok, format!("{what} is valid until {until} ({} left)", format_left(left)))
}

/// The node certificate's expiry as a check.
pub fn expiry_check(facts: &CertFacts, now: i64) -> Check {
    let (level, detail) = validity("the node certificate", facts, now);
    let fix = match level {
        Level::Ok | Level::Skip => None,
        _ if now < facts.not_before => Some("check this machine's clock".to_string()),
        _ => Some(format!(
            "get a fresh certificate from a new bundle ({BUNDLE_SOURCES}; in Kubernetes the operator renews \
             the Secret iop-node-<node> by itself), copy its node.pem and node-key.pem over the old ones and \
             restart the node"
        )),
    };
    Check { name: "certificate".into(), level, detail, fix }
}

/// The node identity the certificate presents: exactly one URI SAN
/// `spiffe://<trust-domain>/node/<name>`, client authentication allowed,
/// not a CA (what the Edge requires; docs/configuration.md).
pub fn identity_check(facts: &CertFacts) -> Check {
    let reissue = format!(
        "issue the node a certificate with exactly one URI SAN spiffe://<trust-domain>/node/<name> and the \
         client-auth EKU: a node bundle ({BUNDLE_SOURCES}), or see docs/configuration.md"
    );
    let fail = |detail: String| Check::fail("identity", detail, reissue.clone());
    let [uri] = facts.uri_sans.as_slice() else {
        return fail(format!(
            "the node certificate carries {} URI SANs ({}); the Edge requires exactly one \
             spiffe://<trust-domain>/node/<name>",
            facts.uri_sans.len(),
            facts.uri_sans.join(", ")
        ));
    };
    let identity = match NodeIdentity::parse(uri) {
        Ok(identity) => identity,
        Err(e) => return fail(format!("the node certificate's URI SAN: {e}")),
    };
    if facts.is_ca {
        return fail(format!("{uri}: the certificate is a CA certificate; the Edge refuses it as a node identity"));
    }
    if facts.client_auth == Some(false) {
        return fail(format!("{uri}: the certificate's extended key usage does not allow client authentication"));
    }
    Check::ok(
        "identity",
        format!(
            "{uri} (node `{}`, trust domain `{}`); the node config names no identity, so the Edge decides: \
             its config must list `{}` under nodes (a NodeCatalog named `{}`) with trust_domain `{}`",
            identity.name, identity.trust_domain, identity.name, identity.name, identity.trust_domain
        ),
    )
}

/// `2099-01-01T00:00:00Z` (proleptic Gregorian, UTC).
pub fn format_utc(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn format_left(secs: i64) -> String {
    match secs {
        s if s >= 2 * 86_400 => format!("{} days", s / 86_400),
        s if s >= 2 * 3600 => format!("{} hours", s / 3600),
        s => format!("{} minutes", s / 60),
    }
}

#[cfg(test)]
mod tests;
