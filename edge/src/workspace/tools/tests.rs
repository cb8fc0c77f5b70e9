use super::*;

#[test]
fn calls_decode_strictly_and_are_checked_against_the_authority() {
    let call: ToolCall = serde_json::from_value(json!({"op": "read", "path": "a.txt"})).unwrap();
    assert_eq!(call, ToolCall::Read { path: "a.txt".into(), offset: 0, max_bytes: 0 });
    for bad in [
        json!({"op": "read"}),
        json!({"op": "read", "path": "a", "follow": true}),
        json!({"op": "chmod", "path": "a"}),
        json!({"op": "command", "argv": ["rm", "-rf", "/"]}),
    ] {
        assert!(serde_json::from_value::<ToolCall>(bad.clone()).is_err(), "{bad} must be refused");
    }
    let authority = pb::WorkspaceAuthority {
        operations: vec![pb::WorkspaceOperation::Read.into(), pb::WorkspaceOperation::Command.into()],
        command_ids: vec!["test".into()],
        ..Default::default()
    };
    assert!(call.allowed_by(&authority));
    assert!(ToolCall::Command { command: "test".into() }.allowed_by(&authority));
    assert!(!ToolCall::Command { command: "deploy".into() }.allowed_by(&authority));
    assert!(!ToolCall::Delete { path: "a".into() }.allowed_by(&authority));
}

#[test]
fn results_render_text_or_base64_and_closed_labels() {
    let response = |result| pb::WorkspaceToolResponse { result: Some(result), ..Default::default() };
    let text =
        result_json(&response(R::Read(pb::WorkspaceReadResult { content: b"hi".to_vec(), truncated: true, size: 9 })));
    assert_eq!(text, json!({"result": "ok", "content": "hi", "encoding": "utf8", "truncated": true, "size": 9}));
    let binary =
        result_json(&response(R::Read(pb::WorkspaceReadResult { content: vec![0xff, 0], ..Default::default() })));
    assert_eq!((binary["content"].as_str(), binary["encoding"].as_str()), (Some("/wA="), Some("base64")));
    let failed =
        result_json(&response(R::Command(pb::WorkspaceCommandResult { exit_code: Some(2), ..Default::default() })));
    assert_eq!(failed["result"], "exit_nonzero");
    assert_eq!(failed["limit"], Value::Null);
    let bounded = result_json(&response(R::Command(pb::WorkspaceCommandResult {
        signal: Some(9),
        limit_exceeded: pb::CommandLimit::Memory.into(),
        ..Default::default()
    })));
    assert_eq!((&bounded["result"], &bounded["limit"]), (&json!("limit_exceeded"), &json!("memory")));
    let denied =
        result_json(&response(R::Error(pb::WorkspaceToolError { code: pb::WorkspaceToolErrorCode::Symlink.into() })));
    assert_eq!(denied, json!({"result": "symlink"}));
}
