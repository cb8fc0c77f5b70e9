use super::*;

fn template() -> Template {
    Template::from_assignment(&pb::WorkspaceAssignment {
        r#ref: "site".into(),
        root: "/w/site".into(),
        operations: vec![Op::Read.into(), Op::List.into(), Op::Command.into()],
        commands: vec![
            pb::WorkspaceCommandTemplate {
                id: "test".into(),
                argv: vec!["make".into(), "test".into()],
                timeout_ms: 9,
                limits: Some(pb::CommandLimits { max_processes: 7, ..Default::default() }),
            },
            pb::WorkspaceCommandTemplate { id: "lint".into(), argv: vec!["make".into()], timeout_ms: 9, limits: None },
        ],
        env_allowlist: vec!["PATH".into(), "HOME".into()],
        limits: Some(pb::WorkspaceLimits {
            max_file_bytes: 100,
            max_list_entries: 10,
            max_output_bytes: 50,
            max_iterations: 4,
            wall_clock_ms: 1000,
        }),
        network: true,
    })
}

#[test]
fn the_edge_can_only_narrow_the_catalog() {
    let requested = pb::WorkspaceAuthority {
        // write is not in the catalog; 99 is no operation at all.
        operations: vec![Op::Read.into(), Op::Write.into(), Op::Command.into(), 99],
        command_ids: vec!["test".into(), "rm-rf".into()],
        env_names: vec!["PATH".into(), "AWS_SECRET_ACCESS_KEY".into()],
        limits: Some(pb::WorkspaceLimits {
            max_file_bytes: 1 << 40,
            max_list_entries: 5,
            max_output_bytes: 50,
            max_iterations: 100,
            wall_clock_ms: 10,
        }),
    };
    let granted = effective(&template(), &requested);
    assert_eq!(granted.operations, BTreeSet::from([Op::Read, Op::Command]));
    assert_eq!(granted.commands.keys().collect::<Vec<_>>(), ["test"]);
    assert_eq!(granted.commands["test"].argv, ["make", "test"], "argv comes from the catalog");
    let limits = granted.commands["test"].limits;
    assert_eq!(limits.max_processes, 7, "bounds come from the catalog");
    assert_eq!(
        limits.max_memory_bytes,
        iop_proto::config::CommandLimits::default_max_memory_bytes(),
        "0 is the default"
    );
    assert_eq!(template().commands["lint"].limits, iop_proto::config::CommandLimits::default());
    assert_eq!(granted.env_allowlist, ["PATH"]);
    assert_eq!(
        granted.limits,
        pb::WorkspaceLimits {
            max_file_bytes: 100,
            max_list_entries: 5,
            max_output_bytes: 50,
            max_iterations: 4,
            wall_clock_ms: 10
        }
    );
    assert_eq!(granted.to_wire().command_ids, ["test"]);
    assert!(granted.network, "the network grant is the catalog's, not the request's");
}

#[test]
fn an_empty_authority_grants_nothing_and_absent_limits_keep_the_catalogs() {
    let granted = effective(&template(), &pb::WorkspaceAuthority::default());
    assert!(granted.operations.is_empty() && granted.commands.is_empty() && granted.env_allowlist.is_empty());
    assert_eq!(granted.limits, template().limits);
    let bare = Template::from_assignment(&pb::WorkspaceAssignment::default());
    assert_eq!(bare.limits, iop_proto::config::WorkspaceLimits::default().into());
}
