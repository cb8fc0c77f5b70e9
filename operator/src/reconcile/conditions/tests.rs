use super::*;

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(seconds).unwrap()
}

#[test]
fn transition_time_moves_only_when_the_status_flips() {
    let first = next(&[], READY, Status::False, "NodeNotFound", "a", Some(1), at(100));
    assert_eq!(first.last_transition_time, Time(at(100)));

    // Same status, new reason, message and generation: time stays.
    let same = next(std::slice::from_ref(&first), READY, Status::False, "InvalidSpec", "b", Some(2), at(200));
    assert_eq!(same.last_transition_time, Time(at(100)));
    assert_eq!((same.reason.as_str(), same.message.as_str(), same.observed_generation), ("InvalidSpec", "b", Some(2)));

    // Flip: time moves.
    let flipped = next(&[same], READY, Status::True, "Accepted", "ok", Some(2), at(300));
    assert_eq!(flipped.last_transition_time, Time(at(300)));
    assert_eq!(flipped.status, "True");
}

#[test]
fn only_the_reconciles_own_conditions_are_compared() {
    let ready = next(&[], READY, Status::True, "Accepted", "", Some(1), at(100));
    let fallbacks = next(&[], CONTEXT_FALLBACKS_READY, Status::True, "Accepted", "", Some(1), at(100));
    let ca = next(&[], "CAExpiring", Status::True, "WithinRenewalWindow", "", None, at(100));
    // The status mirror's, on a NodeCatalog: not reconcile's to compare.
    let workspaces = next(&[], WORKSPACES_READY, Status::False, "WorkspaceRefused", "", Some(1), at(100));
    let bundle = next(&[], BUNDLE_CURRENT, Status::Unknown, "NotConnected", "", None, at(100));
    let desired = [ready.clone(), fallbacks.clone()];
    assert!(same_reconcile_conditions(&[ready.clone(), fallbacks.clone(), ca.clone()], &desired));
    assert!(same_reconcile_conditions(&[ca.clone(), ready.clone(), fallbacks.clone()], &desired));
    assert!(same_reconcile_conditions(&[ready.clone(), workspaces, bundle], std::slice::from_ref(&ready)));
    // One of its own is missing, extra, or different: not the same.
    assert!(!same_reconcile_conditions(&[ready.clone(), ca.clone()], &desired));
    assert!(!same_reconcile_conditions(&[ready.clone(), fallbacks.clone()], std::slice::from_ref(&ready)));
    let older = Condition { observed_generation: Some(0), ..ready.clone() };
    assert!(!same_reconcile_conditions(&[older, fallbacks], &desired));
}

#[test]
fn other_condition_types_do_not_count() {
    let other = next(&[], "Connected", Status::True, "Connected", "", None, at(100));
    let ready = next(&[other], READY, Status::True, "Accepted", "", None, at(200));
    assert_eq!(ready.last_transition_time, Time(at(200)));
}
