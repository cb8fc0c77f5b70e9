use super::*;

fn authority(ops: &[Op]) -> pb::WorkspaceAuthority {
    pb::WorkspaceAuthority {
        operations: ops.iter().map(|op| i32::from(*op)).collect(),
        command_ids: vec!["test".into()],
        env_names: vec![],
        limits: Some(iop_proto::config::WorkspaceLimits::default().into()),
    }
}

fn names(tools: &[pb::ToolDefinition]) -> Vec<&str> {
    tools.iter().map(|t| t.name.as_str()).collect()
}

#[test]
fn tools_are_narrowed_to_the_authority_and_the_stage() {
    let all = authority(&OPERATIONS);
    assert_eq!(
        names(&definitions(Stage::Working, &all)),
        ["workspace_read", "workspace_list", "workspace_write", "workspace_delete", "workspace_command"]
    );
    for stage in [Stage::Planning, Stage::Reviewing, Stage::Repairing] {
        assert_eq!(names(&definitions(stage, &all)), ["workspace_read", "workspace_list"]);
    }
    assert!(definitions(Stage::Finalizing, &all).is_empty());
    assert_eq!(
        names(&definitions(Stage::Working, &authority(&[Op::List, Op::Command]))),
        ["workspace_list", "workspace_command"]
    );

    let command = definitions(Stage::Working, &all).pop().unwrap();
    let schema: Value = serde_json::from_str(&command.parameters_json).unwrap();
    assert_eq!(schema["properties"]["command"]["enum"], json!(["test"]));
    assert_eq!(schema["additionalProperties"], false);
}

#[test]
fn calls_are_decoded_strictly_and_checked_before_the_wire() {
    let all = authority(&OPERATIONS);
    let read = decode("workspace_read", r#"{"path":"a.txt","max_bytes":10}"#, Stage::Planning, &all);
    assert_eq!(read, Ok(ToolCall::Read { path: "a.txt".into(), offset: 0, max_bytes: 10 }));
    assert_eq!(
        decode("workspace_list", "", Stage::Reviewing, &all),
        Ok(ToolCall::List { path: String::new(), cursor: String::new() })
    );
    let cases = [
        ("workspace_write", r#"{"path":"a","content":"x"}"#, Stage::Planning, JobFailure::ToolDenied),
        ("workspace_read", r#"{"path":"a"}"#, Stage::Finalizing, JobFailure::ToolDenied),
        ("shell", r#"{"cmd":"rm -rf /"}"#, Stage::Working, JobFailure::ToolDenied),
        ("workspace_command", r#"{"command":"deploy"}"#, Stage::Working, JobFailure::ToolDenied),
        ("workspace_read", r#"{"path":"a","follow":true}"#, Stage::Working, JobFailure::MalformedToolCall),
        ("workspace_read", r#"{"op":"write","path":"a"}"#, Stage::Working, JobFailure::MalformedToolCall),
        ("workspace_read", r#"["a"]"#, Stage::Working, JobFailure::MalformedToolCall),
        ("workspace_read", "{", Stage::Working, JobFailure::MalformedToolCall),
        ("workspace_command", r#"{"command":"test","args":["-x"]}"#, Stage::Working, JobFailure::MalformedToolCall),
    ];
    for (name, arguments, stage, expected) in cases {
        assert_eq!(decode(name, arguments, stage, &all), Err(expected), "{name} {arguments}");
    }
    let read_only = authority(&[Op::Read]);
    assert_eq!(decode("workspace_delete", r#"{"path":"a"}"#, Stage::Working, &read_only), Err(JobFailure::ToolDenied));
}
