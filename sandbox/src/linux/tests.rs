use super::*;

#[test]
fn every_refusal_compiles_into_a_filter_for_this_machine() {
    let rules = deny_rules().unwrap();
    let arch: TargetArch = std::env::consts::ARCH.try_into().unwrap();
    let filter =
        SeccompFilter::new(rules.into_iter().collect(), SeccompAction::Allow, SeccompAction::Errno(1), arch).unwrap();
    let program: BpfProgram = filter.try_into().unwrap();
    assert!(program.len() > 50, "{} instructions", program.len());
}

#[test]
fn gaps_follow_the_abi_and_what_the_process_could_do() {
    use crate::Gap::*;
    assert!(gaps(7, true, true).is_empty());
    assert_eq!(gaps(5, true, true), [SignalScope]);
    assert_eq!(gaps(3, false, false), [SignalScope, Tcp, ReservedWritable, BoundingSet]);
}
