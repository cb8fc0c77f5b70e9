//! The metric set itself: names, closed label values, the abandoned-write
//! rule.

use std::collections::BTreeSet;
use std::time::Duration;

use super::*;
use crate::runtime::tests::{samples, status_writes, value};

/// Every exported label value belongs to its closed set, and every metric
/// has exactly the labels it declares (`le` of the histogram aside).
pub(crate) fn assert_closed(text: &str) {
    let sets = closed_sets();
    let known: BTreeSet<&str> = sets.iter().map(|(metric, _, _)| *metric).collect();
    let unlabelled = [
        "iop_operator_leader",
        "iop_operator_ca_expiry_timestamp_seconds",
        "iop_operator_ca_expiring",
        "iop_operator_reconcile_duration_seconds_sum",
        "iop_operator_reconcile_duration_seconds_count",
        "iop_operator_reconcile_duration_seconds_bucket",
    ];
    let all = samples(text);
    assert!(!all.is_empty());
    for s in all {
        if unlabelled.contains(&s.name.as_str()) {
            let names: Vec<&str> = s.labels.iter().map(|(k, _)| k.as_str()).filter(|k| *k != "le").collect();
            assert!(names.is_empty(), "{} has labels {names:?}", s.name);
            continue;
        }
        assert!(known.contains(s.name.as_str()), "unexpected metric {}", s.name);
        let declared: BTreeSet<&str> =
            sets.iter().filter(|(metric, _, _)| *metric == s.name).map(|(_, label, _)| *label).collect();
        let exported: BTreeSet<&str> = s.labels.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(exported, declared, "labels of {}", s.name);
        for (label, v) in &s.labels {
            let (_, _, allowed) =
                sets.iter().find(|(metric, l, _)| *metric == s.name && l == label).expect("a declared label");
            assert!(
                allowed.contains(&v.as_str()),
                "{}{{{label}=\"{v}\"}} is outside its closed set {allowed:?}",
                s.name
            );
        }
    }
}

#[test]
fn every_series_exists_at_zero_with_closed_label_values() {
    let metrics = Metrics::new();
    let text = metrics.encode();
    assert_closed(&text);
    for &result in ReconcileResult::ALL {
        assert_eq!(value(&metrics, "iop_operator_reconciles_total", &[("result", result.as_str())]), 0.0);
    }
    for (kind, writer) in STATUS_WRITERS {
        for &result in WriteResult::ALL {
            assert_eq!(status_writes(&metrics, kind.as_str(), writer.as_str(), result.as_str()), 0.0);
        }
    }
    for &result in PollResult::ALL {
        assert_eq!(value(&metrics, "iop_operator_mirror_polls_total", &[("result", result.as_str())]), 0.0);
    }
    for &kind in CertKind::ALL {
        assert_eq!(value(&metrics, "iop_operator_certificates_issued_total", &[("kind", kind.as_str())]), 0.0);
    }
    assert_eq!(value(&metrics, "iop_operator_leader", &[]), 0.0);
    assert_eq!(value(&metrics, "iop_operator_reconcile_duration_seconds_count", &[]), 0.0);
    assert!(text.contains("# TYPE iop_operator_reconciles counter"), "{text}");
    assert!(text.ends_with("# EOF\n"));
}

#[test]
fn poll_results_are_the_admin_error_labels() {
    let errors: [fn() -> AdminError; 5] = [
        || AdminError::Timeout(Duration::from_secs(3)),
        || AdminError::Request("refused".into()),
        || AdminError::Status(503),
        || AdminError::Body("reset".into()),
        || AdminError::Decode("eof".into()),
    ];
    let mut values = vec![PollResult::of(&Ok::<(), AdminError>(())).as_str()];
    for error in errors {
        let label = PollResult::of(&Err::<(), _>(error())).as_str();
        assert_eq!(label, error().label());
        values.push(label);
    }
    assert_eq!(values, PollResult::ALL.iter().map(|r| r.as_str()).collect::<Vec<_>>(), "every value, once");
}

#[test]
fn reconcile_results_and_durations() {
    let metrics = Metrics::new();
    metrics.reconciled(&Ok(()), Duration::from_millis(300));
    metrics.reconciled(&Err(Error::Timeout(Duration::from_secs(60))), Duration::from_secs(60));
    metrics.reconciled(&Err(Error::TaskEnded("x")), Duration::from_secs(1));
    for result in ["ok", "failed", "timeout"] {
        assert_eq!(value(&metrics, "iop_operator_reconciles_total", &[("result", result)]), 1.0, "{result}");
    }
    assert_eq!(value(&metrics, "iop_operator_reconcile_duration_seconds_count", &[]), 3.0);
    assert_eq!(value(&metrics, "iop_operator_reconcile_duration_seconds_sum", &[]), 61.3);
    assert_eq!(value(&metrics, "iop_operator_reconcile_duration_seconds_bucket", &[("le", "0.4")]), 1.0);
}

#[test]
fn leader_gauge_and_certificates() {
    let metrics = Metrics::new();
    metrics.set_leader(true);
    assert_eq!(value(&metrics, "iop_operator_leader", &[]), 1.0);
    metrics.set_leader(false);
    assert_eq!(value(&metrics, "iop_operator_leader", &[]), 0.0);
    metrics.issued(CertKind::Node);
    metrics.issued(CertKind::Node);
    assert_eq!(value(&metrics, "iop_operator_certificates_issued_total", &[("kind", "node")]), 2.0);
    assert_eq!(value(&metrics, "iop_operator_certificates_issued_total", &[("kind", "ca")]), 0.0);
}

#[test]
fn a_write_dropped_unfinished_counts_as_a_timeout() {
    let metrics = Metrics::new();
    metrics.status_write(StatusKind::Provider, Writer::Mirror).finish(WriteResult::Ok);
    drop(metrics.status_write(StatusKind::Provider, Writer::Mirror));
    assert_eq!(status_writes(&metrics, "provider", "mirror", "ok"), 1.0);
    assert_eq!(status_writes(&metrics, "provider", "mirror", "timeout"), 1.0);
    assert_eq!(status_writes(&metrics, "provider", "mirror", "failed"), 0.0);
}

#[test]
fn each_writer_has_its_own_field_manager() {
    let managers: BTreeSet<&str> = Writer::ALL.iter().map(|w| w.field_manager()).collect();
    assert_eq!(managers.len(), Writer::ALL.len());
    assert_eq!(Writer::Mirror.field_manager(), "iop-operator/status");
}
