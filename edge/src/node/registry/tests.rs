use super::*;

fn session(generation: u64) -> Session {
    let (control, _rx) = mpsc::channel(1);
    Session::registered(generation, control)
}

#[test]
fn generations_strictly_increase() {
    let source = GenerationSource::default();
    let mut last = 0;
    for _ in 0..10_000 {
        let g = source.next();
        assert!(g > last);
        last = g;
    }
}

#[test]
fn only_the_current_connection_becomes_ready() {
    let registry = NodeRegistry::default();
    registry.register("mac-1", session(7));
    assert_eq!(registry.ready_generation("mac-1"), None, "registered is not ready");
    assert!(!registry.mark_ready("mac-1", 6), "stale generation cannot become ready");
    assert!(registry.mark_ready("mac-1", 7));
    assert_eq!(registry.ready_generation("mac-1"), Some(7));
    assert_eq!(registry.ready_generation("mac-2"), None);
    assert_eq!(registry.ready_count(), 1);
}

#[test]
fn a_replaced_session_is_returned_and_stale_removal_is_ignored() {
    let registry = NodeRegistry::default();
    assert!(registry.register("mac-1", session(1)).is_none());
    let old = registry.register("mac-1", session(2)).unwrap();
    assert_eq!(old.generation, 1);
    assert!(!registry.remove("mac-1", 1), "the old session's teardown must not remove the new one");
    assert!(registry.is_current("mac-1", 2));
    assert!(registry.remove("mac-1", 2));
    assert!(!registry.is_current("mac-1", 2));
}

/// `/admin/v1/nodes` shows the serial of the certificate the current
/// session presented, and none for a node without a session.
#[test]
fn the_snapshot_shows_the_serial_of_the_current_sessions_certificate() {
    let registry = NodeRegistry::default();
    registry.register("mac-1", Session { certificate_serial: "01ab".into(), ..session(1) });
    registry.register("mac-1", Session { certificate_serial: "02cd".into(), ..session(2) });
    let nodes = ["mac-1".to_string(), "mac-2".to_string()];
    let serials: Vec<_> = registry.snapshot(&nodes).into_iter().map(|n| n.certificate_serial).collect();
    assert_eq!(serials, [Some("02cd".to_string()), None], "the newer connection's; none without a session");
}
