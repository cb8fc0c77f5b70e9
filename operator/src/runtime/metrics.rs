//! Prometheus metrics of the operator (`iop_operator_*`), served on
//! `/metrics` by [`super::listener`]. Every label value comes from a closed enum
//! below: never an object name, namespace, path or error text, so the number
//! of series is fixed. Every series exists from the start (at 0), so a rate
//! is defined before the first event.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::Error;
use super::admin::AdminError;
use crate::crd::{NodeCatalog, Provider, WorkspaceTemplate};
use crate::reconcile::{FIELD_MANAGER_CERTS, FIELD_MANAGER_CONFIG, FIELD_MANAGER_STATUS};

/// A closed set of label values: `ALL` lists them (tests check every
/// exported value against it), `as_str` is the exported value.
macro_rules! closed_label {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $value:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $value),+
                }
            }
        }

        impl EncodeLabelValue for $name {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
                std::fmt::Write::write_str(encoder, self.as_str())
            }
        }
    };
}

closed_label! {
    /// How a namespace reconcile ended.
    ReconcileResult {
        Ok => "ok",
        /// An error other than a timeout ([`Error::label`] in the log says which).
        Failed => "failed",
        /// The reconcile, or one of its bounded steps (a status write), timed out.
        Timeout => "timeout",
    }
}

impl ReconcileResult {
    pub fn of(result: &Result<(), Error>) -> Self {
        match result {
            Ok(()) => Self::Ok,
            Err(Error::Timeout(_)) => Self::Timeout,
            Err(_) => Self::Failed,
        }
    }
}

closed_label! {
    /// The custom resource whose status is written.
    StatusKind {
        Provider => "provider",
        NodeCatalog => "nodecatalog",
        WorkspaceTemplate => "workspacetemplate",
    }
}

/// The [`StatusKind`] of a custom resource, known at compile time.
pub trait HasStatusKind {
    const STATUS_KIND: StatusKind;
}

impl HasStatusKind for Provider {
    const STATUS_KIND: StatusKind = StatusKind::Provider;
}

impl HasStatusKind for NodeCatalog {
    const STATUS_KIND: StatusKind = StatusKind::NodeCatalog;
}

impl HasStatusKind for WorkspaceTemplate {
    const STATUS_KIND: StatusKind = StatusKind::WorkspaceTemplate;
}

closed_label! {
    /// Who writes a status: one writer per set of fields, each with its own
    /// field manager.
    Writer {
        /// Conditions and `observedGeneration` (`iop-operator/config`).
        Reconcile => "reconcile",
        /// Health and connection state from the Edge (`iop-operator/status`).
        Mirror => "mirror",
        /// `NodeCatalog.status.certificate` (`iop-operator/certs`).
        Certs => "certs",
    }
}

impl Writer {
    /// The server-side apply field manager of this writer.
    pub fn field_manager(self) -> &'static str {
        match self {
            Self::Reconcile => FIELD_MANAGER_CONFIG,
            Self::Mirror => FIELD_MANAGER_STATUS,
            Self::Certs => FIELD_MANAGER_CERTS,
        }
    }
}

closed_label! {
    /// How one status write ended.
    WriteResult {
        Ok => "ok",
        Failed => "failed",
        /// No answer within the write's bound, or abandoned when the enclosing
        /// reconcile or mirror round ran out of time.
        Timeout => "timeout",
    }
}

closed_label! {
    /// How one poll of the Edge admin API ended: `ok` or an
    /// [`AdminError::label`].
    PollResult {
        Ok => "ok",
        Timeout => "timeout",
        Request => "request",
        Status => "status",
        Body => "body",
        Decode => "decode",
    }
}

impl PollResult {
    pub fn of<T>(result: &Result<T, AdminError>) -> Self {
        match result {
            Ok(_) => Self::Ok,
            Err(AdminError::Timeout(_)) => Self::Timeout,
            Err(AdminError::Request(_)) => Self::Request,
            Err(AdminError::Status(_)) => Self::Status,
            Err(AdminError::Body(_)) => Self::Body,
            Err(AdminError::Decode(_)) => Self::Decode,
        }
    }
}

closed_label! {
    /// Which certificate was issued.
    CertKind {
        Ca => "ca",
        Edge => "edge",
        Node => "node",
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: ReconcileResult,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusWriteLabels {
    pub kind: StatusKind,
    pub writer: Writer,
    pub result: WriteResult,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PollLabels {
    pub result: PollResult,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertLabels {
    pub kind: CertKind,
}

/// The status writes that exist: (kind, writer).
pub const STATUS_WRITERS: [(StatusKind, Writer); 6] = [
    (StatusKind::Provider, Writer::Reconcile),
    (StatusKind::NodeCatalog, Writer::Reconcile),
    (StatusKind::WorkspaceTemplate, Writer::Reconcile),
    (StatusKind::Provider, Writer::Mirror),
    (StatusKind::NodeCatalog, Writer::Mirror),
    (StatusKind::NodeCatalog, Writer::Certs),
];

pub struct Metrics {
    registry: Registry,
    pub reconciles: Family<ResultLabels, Counter>,
    pub reconcile_duration: Histogram,
    pub status_writes: Family<StatusWriteLabels, Counter>,
    pub mirror_polls: Family<PollLabels, Counter>,
    pub certificates_issued: Family<CertLabels, Counter>,
    pub leader: Gauge,
    /// Expiry of the CA in `iop-ca` (Unix seconds; 0 until it is loaded).
    pub ca_expiry: Gauge,
    /// 1 while the CA expires within the renewal window.
    pub ca_expiring: Gauge,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("iop_operator");
        let reconciles = Family::<ResultLabels, Counter>::default();
        registry.register("reconciles", "Namespace reconciles, by result", reconciles.clone());
        // 50 ms .. ~102 s: the reconcile is bounded at 60 s.
        let reconcile_duration = Histogram::new(exponential_buckets(0.05, 2.0, 12));
        registry.register(
            "reconcile_duration_seconds",
            "Duration of namespace reconciles (every result)",
            reconcile_duration.clone(),
        );
        let status_writes = Family::<StatusWriteLabels, Counter>::default();
        registry.register(
            "status_writes",
            "Status subresource writes (only made when the fields changed), by kind, writer and result",
            status_writes.clone(),
        );
        let mirror_polls = Family::<PollLabels, Counter>::default();
        registry.register("mirror_polls", "Polls of the Edge admin API by the status mirror", mirror_polls.clone());
        let certificates_issued = Family::<CertLabels, Counter>::default();
        registry.register("certificates_issued", "Certificates issued, by kind", certificates_issued.clone());
        let leader = Gauge::default();
        registry.register("leader", "1 while this replica holds the leader Lease", leader.clone());
        let ca_expiry = Gauge::default();
        registry.register(
            "ca_expiry_timestamp_seconds",
            "Expiry of the CA (Secret iop-ca), Unix seconds; 0 until the leader loaded it",
            ca_expiry.clone(),
        );
        let ca_expiring = Gauge::default();
        registry.register(
            "ca_expiring",
            "1 while the CA expires within the certificates' renewal window (they end with it; replace the CA)",
            ca_expiring.clone(),
        );

        for &result in ReconcileResult::ALL {
            let _ = reconciles.get_or_create(&ResultLabels { result });
        }
        for (kind, writer) in STATUS_WRITERS {
            for &result in WriteResult::ALL {
                let _ = status_writes.get_or_create(&StatusWriteLabels { kind, writer, result });
            }
        }
        for &result in PollResult::ALL {
            let _ = mirror_polls.get_or_create(&PollLabels { result });
        }
        for &kind in CertKind::ALL {
            let _ = certificates_issued.get_or_create(&CertLabels { kind });
        }
        Arc::new(Self {
            registry,
            reconciles,
            reconcile_duration,
            status_writes,
            mirror_polls,
            certificates_issued,
            leader,
            ca_expiry,
            ca_expiring,
        })
    }

    pub fn reconciled(&self, result: &Result<(), Error>, took: Duration) {
        self.reconciles.get_or_create(&ResultLabels { result: ReconcileResult::of(result) }).inc();
        self.reconcile_duration.observe(took.as_secs_f64());
    }

    pub fn polled<T>(&self, result: &Result<T, AdminError>) {
        self.mirror_polls.get_or_create(&PollLabels { result: PollResult::of(result) }).inc();
    }

    pub fn issued(&self, kind: CertKind) {
        self.certificates_issued.get_or_create(&CertLabels { kind }).inc();
    }

    /// Records the CA's expiry and whether it is expiring; returns whether
    /// the latter changed.
    pub fn set_ca(&self, not_after: time::OffsetDateTime, expiring: bool) -> bool {
        self.ca_expiry.set(not_after.unix_timestamp());
        self.ca_expiring.set(i64::from(expiring)) != i64::from(expiring)
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Starts counting one status write; see [`PendingWrite`].
    pub fn status_write(&self, kind: StatusKind, writer: Writer) -> PendingWrite<'_> {
        PendingWrite { metrics: self, kind, writer, finished: false }
    }

    /// OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// One status write being made. [`PendingWrite::finish`] counts its result;
/// dropped unfinished (the enclosing reconcile or mirror round timed out and
/// abandoned it), it counts as `timeout`, so no write goes uncounted.
#[must_use = "finish() counts the result; dropping counts a timeout"]
pub struct PendingWrite<'a> {
    metrics: &'a Metrics,
    kind: StatusKind,
    writer: Writer,
    finished: bool,
}

impl PendingWrite<'_> {
    pub fn finish(mut self, result: WriteResult) {
        self.count(result);
    }

    fn count(&mut self, result: WriteResult) {
        self.finished = true;
        let labels = StatusWriteLabels { kind: self.kind, writer: self.writer, result };
        self.metrics.status_writes.get_or_create(&labels).inc();
    }
}

impl Drop for PendingWrite<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.count(WriteResult::Timeout);
        }
    }
}

/// Which closed set each label of each metric takes its values from
/// (`le` of the histogram aside): what the closed-label test checks every
/// exported sample against.
pub fn closed_sets() -> Vec<(&'static str, &'static str, Vec<&'static str>)> {
    fn values<T: Copy>(all: &[T], f: fn(T) -> &'static str) -> Vec<&'static str> {
        all.iter().map(|v| f(*v)).collect()
    }
    vec![
        ("iop_operator_reconciles_total", "result", values(ReconcileResult::ALL, ReconcileResult::as_str)),
        ("iop_operator_status_writes_total", "kind", values(StatusKind::ALL, StatusKind::as_str)),
        ("iop_operator_status_writes_total", "writer", values(Writer::ALL, Writer::as_str)),
        ("iop_operator_status_writes_total", "result", values(WriteResult::ALL, WriteResult::as_str)),
        ("iop_operator_mirror_polls_total", "result", values(PollResult::ALL, PollResult::as_str)),
        ("iop_operator_certificates_issued_total", "kind", values(CertKind::ALL, CertKind::as_str)),
    ]
}

#[cfg(test)]
pub(crate) mod tests;
