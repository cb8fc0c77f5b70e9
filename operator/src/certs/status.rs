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
            "Secret {secret} exists but was not created by the operator for this node (no controller owner \
             reference to this NodeCatalog); it is left as it is and no certificate is issued: delete or rename it"
        ),
        None,
        timestamp,
    );
    let wanted = vec![ca.condition(conditions, now, timestamp), refused];
    let unchanged = current.is_some_and(|s| s.certificate.is_none()) && wanted.iter().all(|c| conditions.contains(c));
    (!unchanged).then(|| NodeCatalogStatus { conditions: wanted, ..Default::default() })
}

#[cfg(test)]
mod tests;
