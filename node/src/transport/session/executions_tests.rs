use super::*;

/// Issue 8 item 7: a duplicate id is refused and the first execution
/// keeps its cancel handle.
#[test]
fn a_duplicate_id_is_refused_and_the_first_keeps_its_cancel() {
    let executions = Executions::default();
    let first = executions.claim("r1").expect("a new id");
    assert!(executions.claim("r1").is_none(), "the duplicate is refused");
    executions.cancel("r1", pb::CancelReason::Deadline);
    assert!(first.is_cancelled(), "a cancel for the id reaches the first execution");
    assert_eq!(first.reason(), pb::CancelReason::Deadline);
    assert_eq!(executions.len(), 0);

    let again = executions.claim("r1").expect("free once cancelled");
    executions.finished("r1", &first);
    assert_eq!(executions.len(), 1, "an old execution's end frees only its own entry");
    executions.finished("r1", &again);
    assert_eq!(executions.len(), 0);
}
