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
    assert_eq!((c.type_.as_str(), c.status.as_str(), c.reason.as_str()), (CA_EXPIRING, "True", REASON_WITHIN_WINDOW));
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
