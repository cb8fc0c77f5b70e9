use super::*;

#[test]
fn admits_up_to_capacity_across_holders_and_frees_on_drop() {
    let admission = LocalAdmission::default();
    let other_session = admission.clone();
    admission.set_capacities([("p".to_string(), 2), ("q".to_string(), 1)]);
    let first = admission.admit("p").unwrap();
    let second = other_session.admit("p").unwrap();
    let refused = admission.admit("p").unwrap_err();
    assert_eq!(refused.kind(), pb::FailureKind::CapacityExhausted);
    assert!(refused.message.contains("`p`") && refused.message.contains("(2)"), "{}", refused.message);
    assert_eq!(admission.running("p"), 2);
    let _other_provider = admission.admit("q").expect("capacity is per provider");
    drop(first);
    let third = admission.admit("p").expect("a freed slot is taken again");
    drop((second, third));
    assert_eq!(admission.running("p"), 0);
    let _unlimited: Vec<_> = (0..100).map(|_| admission.admit("u").unwrap()).collect();
    assert_eq!(admission.running("u"), 100, "no capacity known: no node-side limit");
}

#[test]
fn a_new_capacity_applies_to_the_next_admission() {
    let admission = LocalAdmission::default();
    admission.set_capacities([("p".to_string(), 1)]);
    let held = admission.admit("p").unwrap();
    assert!(admission.admit("p").is_err());
    // A reload raised it (ProviderCapacities on any session).
    admission.set_capacities([("p".to_string(), 2)]);
    let _second = admission.admit("p").expect("the raised capacity");
    drop(held);
}
