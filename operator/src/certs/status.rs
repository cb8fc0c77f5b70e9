//! The `NodeCatalog.status` fields the certificate writer owns (field
//! manager `iop-operator/certs`), as pure functions: `certificate` (serial
//! and expiry of the node's current certificate) and the `CAExpiring`
//! condition. Written only when they differ from the object's status.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use time::OffsetDateTime;

use super::{CA_SECRET, ca_expiring};
use crate::crd::NodeCatalogStatus;
use crate::crd::node_catalog::CertificateStatus;
use crate::reconcile::conditions::{self, Status};

/// Condition of every NodeCatalog in the Edge config: `True` while the CA
/// expires within the renewal window, so node certificates end with the CA
/// and are not renewed past it.
pub const CA_EXPIRING: &str = "CAExpiring";
/// Reasons of [`CA_EXPIRING`].
pub const REASON_WITHIN_WINDOW: &str = "WithinRenewalWindow";
pub const REASON_VALID: &str = "Valid";

/// Condition of a NodeCatalog whose Secret `iop-node-<name>` exists but was
/// not made by the operator: `False`, reason [`REASON_SECRET_NOT_OWNED`];
/// no certificate is issued into it. Absent otherwise.
pub const CERTIFICATE_ISSUED: &str = "CertificateIssued";
pub const REASON_SECRET_NOT_OWNED: &str = "SecretNotOwned";

/// The CA's expiry and the window in which it counts as expiring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaExpiry {
    pub not_after: OffsetDateTime,
    /// The longest renewal window of the certificates the CA signs.
    pub window: Duration,
}

impl CaExpiry {
    pub fn expiring(&self, now: OffsetDateTime) -> bool {
        ca_expiring(self.not_after, now, self.window)
    }

    /// The `CAExpiring` condition at `now`, given the object's current ones
    /// (`lastTransitionTime` moves only when the status flips).
    pub fn condition(&self, current: &[Condition], now: OffsetDateTime, timestamp: Timestamp) -> Condition {
        let until = self.not_after.unix_timestamp();
        let until = Timestamp::from_second(until).map_or_else(|_| until.to_string(), |t| t.to_string());
        let days = self.window.as_secs() / 86_400;
        if self.expiring(now) {
            conditions::next(
                current,
                CA_EXPIRING,
                Status::True,
                REASON_WITHIN_WINDOW,
                format!(
                    "the CA in Secret {CA_SECRET} expires at {until}, within the {days}-day renewal window: \
                     certificates it signs end with it and cannot be renewed past it; replace the CA"
                ),
                None,
                timestamp,
            )
        } else {
            conditions::next(
                current,
                CA_EXPIRING,
                Status::False,
                REASON_VALID,
                format!("the CA in Secret {CA_SECRET} is valid until {until}"),
                None,
                timestamp,
            )
        }
    }
}

/// The status to apply for a node whose current certificate is
/// `certificate`, or `None` when its status already says all of it.
pub fn node_update(
    current: Option<&NodeCatalogStatus>,
    certificate: CertificateStatus,
    ca: &CaExpiry,
    now: OffsetDateTime,
    timestamp: Timestamp,
) -> Option<NodeCatalogStatus> {
    let conditions = current.map_or(&[][..], |s| &s.conditions[..]);
    let condition = ca.condition(conditions, now, timestamp);
    let refused_before = conditions.iter().any(|c| c.type_ == CERTIFICATE_ISSUED);
    let unchanged = current.and_then(|s| s.certificate.as_ref()) == Some(&certificate)
        && conditions.contains(&condition)
        && !refused_before;
    // Applied without `CertificateIssued`: server-side apply removes one it wrote before.
    (!unchanged).then(|| NodeCatalogStatus {
        certificate: Some(certificate),
        conditions: vec![condition],
        ..Default::default()
    })
}

/// The status to apply for a node whose Secret `secret` is not the
/// operator's ([`super::secrets::node_secret_is_ours`]): no `certificate`
/// (the operator does not vouch for what is there; applied without it,
/// the field is removed), and `CertificateIssued=False`. `None` when its
/// status already says so.
pub fn node_refused(
    current: Option<&NodeCatalogStatus>,
    secret: &str,
    ca: &CaExpiry,
    now: OffsetDateTime,
    timestamp: Timestamp,
) -> Option<NodeCatalogStatus> {
    let conditions = current.map_or(&[][..], |s| &s.conditions[..]);
    let refused = conditions::next(
        conditions,
        CERTIFICATE_ISSUED,
        Status::False,
        REASON_SECRET_NOT_OWNED,
        format!(
            "Secret {secret} exists but was not created by the operator for this node (no \
             app.kubernetes.io/managed-by: iop-operator and iop.dev/node labels, or no owner reference to this \
             NodeCatalog); it is left as it is and no certificate is issued: delete or rename it"
        ),
        None,
        timestamp,
    );
    let wanted = vec![ca.condition(conditions, now, timestamp), refused];
    let unchanged = current.is_some_and(|s| s.certificate.is_none()) && wanted.iter().all(|c| conditions.contains(c));
    (!unchanged).then(|| NodeCatalogStatus { conditions: wanted, ..Default::default() })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    /// 2026-11-01T12:00:00Z
    const NOW: OffsetDateTime = match OffsetDateTime::from_unix_timestamp(1_793_534_400) {
        Ok(t) => t,
        Err(_) => panic!(),
    };
    const DAY: Duration = Duration::from_secs(86_400);

    fn ts(t: OffsetDateTime) -> Timestamp {
        Timestamp::from_second(t.unix_timestamp()).unwrap()
    }

    fn cert(serial: &str) -> CertificateStatus {
        CertificateStatus { serial: serial.to_string(), not_after: Time(ts(NOW + 5 * DAY)) }
    }

    #[test]
    fn written_once_per_change_of_certificate_or_ca_verdict() {
        let ca = CaExpiry { not_after: NOW + 5 * DAY, window: 30 * DAY };
        let first = node_update(None, cert("01"), &ca, NOW, ts(NOW)).expect("nothing written yet");
        let c = &first.conditions[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            (CA_EXPIRING, "True", REASON_WITHIN_WINDOW)
        );
        assert!(c.message.contains("2026-11-06T12:00:00Z"), "{}", c.message);
        assert_eq!(c.last_transition_time, Time(ts(NOW)));

        // Written: the next reconciles (an hour, a day later) write nothing.
        for later in [NOW + Duration::from_secs(3600), NOW + DAY] {
            assert_eq!(node_update(Some(&first), cert("01"), &ca, later, ts(later)), None);
        }
        // Other conditions (the reconcile's) do not matter.
        let mut with_ready = first.clone();
        with_ready.conditions.insert(0, conditions::next(&[], "Ready", Status::True, "Accepted", "", Some(1), ts(NOW)));
        assert_eq!(node_update(Some(&with_ready), cert("01"), &ca, NOW + DAY, ts(NOW + DAY)), None);

        // A new certificate: written, the condition keeps its transition time.
        let renewed = node_update(Some(&first), cert("02"), &ca, NOW + DAY, ts(NOW + DAY)).unwrap();
        assert_eq!(renewed.conditions[0].last_transition_time, Time(ts(NOW)));

        // The CA was replaced by a long one: flips to False, once.
        let long = CaExpiry { not_after: NOW + 3650 * DAY, window: 30 * DAY };
        let replaced = node_update(Some(&renewed), cert("03"), &long, NOW + 2 * DAY, ts(NOW + 2 * DAY)).unwrap();
        let c = &replaced.conditions[0];
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", REASON_VALID));
        assert_eq!(c.last_transition_time, Time(ts(NOW + 2 * DAY)));
        assert_eq!(node_update(Some(&replaced), cert("03"), &long, NOW + 3 * DAY, ts(NOW + 3 * DAY)), None);
    }
}
