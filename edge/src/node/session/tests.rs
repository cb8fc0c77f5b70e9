use super::*;

#[test]
fn workspace_verdicts_cover_exactly_what_was_assigned() {
    let assigned: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .map(|r| pb::WorkspaceAssignment { r#ref: r.to_string(), root: format!("/w/{r}"), ..Default::default() })
        .collect();
    let status = |r: &str, state: i32| pb::WorkspaceStatus { r#ref: r.into(), state };
    let reported = [
        status("a", pb::WorkspaceState::Accepted.into()),
        status("b", pb::WorkspaceState::Symlink.into()),
        status("c", 99),
        status("not-assigned", pb::WorkspaceState::Accepted.into()),
    ];
    let verdicts = workspace_verdicts(&assigned, &reported);
    let expected: Vec<(&str, &str)> =
        vec![("a", "accepted"), ("b", "symlink"), ("c", "unknown_status"), ("d", "not_reported")];
    assert_eq!(verdicts.iter().map(|(k, v)| (k.as_str(), *v)).collect::<Vec<_>>(), expected);
}
