use super::*;

#[test]
fn stall_timeout_rule() {
    assert_eq!(response_stall_timeout(0), Ok(Duration::from_secs(300)));
    assert_eq!(response_stall_timeout(1_000), Ok(Duration::from_secs(1)));
    assert_eq!(response_stall_timeout(3_600_000), Ok(Duration::from_secs(3600)));
    for bad in [1, 999, 3_600_001] {
        assert_eq!(response_stall_timeout(bad), Err(StallTimeoutOutOfRange(bad)));
    }
}

#[test]
fn first_byte_timeout_rule() {
    assert_eq!(first_byte_timeout(0), Ok(Duration::from_secs(60)));
    assert_eq!(first_byte_timeout(1_000), Ok(Duration::from_secs(1)));
    assert_eq!(first_byte_timeout(3_600_000), Ok(Duration::from_secs(3600)));
    for bad in [1, 999, 3_600_001] {
        assert_eq!(first_byte_timeout(bad), Err(FirstByteTimeoutOutOfRange(bad)));
    }
}

#[test]
fn production_profile_is_30s_45s() {
    assert_eq!(HeartbeatProfile::default().interval, Duration::from_secs(30));
    assert_eq!(HeartbeatProfile::default().wait, Duration::from_secs(45));
}

#[test]
fn test_override_parses_and_validates() {
    let p = HeartbeatProfile::parse_test_override("100,300").unwrap();
    assert_eq!(p.interval, Duration::from_millis(100));
    assert_eq!(p.wait, Duration::from_millis(300));
    assert!(HeartbeatProfile::parse_test_override("300,100").is_err());
    assert!(HeartbeatProfile::parse_test_override("0,100").is_err());
    assert!(HeartbeatProfile::parse_test_override("abc").is_err());
}

#[test]
fn monitor_expires_only_after_the_wait_without_answers() {
    let profile = HeartbeatProfile::PRODUCTION;
    let t0 = Duration::ZERO;
    let mut m = HeartbeatMonitor::new(profile, t0);
    assert!(!m.expired(Duration::from_secs(45)));
    assert!(m.expired(Duration::from_secs(46)));
    m.heard(Duration::from_secs(40));
    assert!(!m.expired(Duration::from_secs(80)));
    assert!(m.expired(Duration::from_secs(86)));
    // an out-of-order, older observation never moves the deadline back
    m.heard(Duration::from_secs(10));
    assert_eq!(m.deadline(), Duration::from_secs(85));
    assert_eq!(m.next_ping(), 1);
    assert_eq!(m.next_ping(), 2);
}
