use super::*;
use serde_json::json;

pub(crate) const SCRIPT_FILE: &str = r#"
scripts:
  fix-readme:
    - tool_calls: [{name: workspace_read, arguments: {path: README.md}}]
    - text: "I read it."
    - tool_calls: [{name: workspace_write, arguments: {path: a.txt, content: "x"}}, {name: workspace_list, arguments: {}}]
    - text: '{"verdict":"approve","notes":"ok"}'
  greet:
    - text: "hi there friend"
"#;

#[test]
fn script_file_loads_and_turns_repeat_the_last() {
    let scripts = Scripts::from_yaml(SCRIPT_FILE).unwrap();
    assert_eq!(scripts.names().collect::<Vec<_>>(), ["fix-readme", "greet"]);
    let call = |name: &str, arguments: Value| ScriptToolCall {
        name: name.into(),
        arguments: arguments.as_object().unwrap().clone(),
    };
    assert_eq!(
        scripts.turn("fix-readme", 0),
        Some(&ScriptTurn::ToolCalls(vec![call("workspace_read", json!({ "path": "README.md" }))]))
    );
    assert_eq!(scripts.turn("fix-readme", 1), Some(&ScriptTurn::Text("I read it.".into())));
    assert_eq!(
        scripts.turn("fix-readme", 2),
        Some(&ScriptTurn::ToolCalls(vec![
            call("workspace_write", json!({ "path": "a.txt", "content": "x" })),
            call("workspace_list", json!({})),
        ]))
    );
    let last = ScriptTurn::Text(r#"{"verdict":"approve","notes":"ok"}"#.into());
    assert_eq!(scripts.turn("fix-readme", 3), Some(&last));
    assert_eq!(scripts.turn("fix-readme", 4), Some(&last));
    assert_eq!(scripts.turn("fix-readme", u64::MAX), Some(&last));
    assert_eq!(scripts.turn("nope", 0), None);
    assert_eq!(Scripts::from_yaml("scripts: {}\n").unwrap(), Scripts::default());
}

#[test]
fn malformed_script_files_are_typed_load_errors() {
    let bad_turn = |yaml: &str| match Scripts::from_yaml(yaml) {
        Err(ScriptError::BadTurn { script, index, reason }) => (script, index, reason),
        other => panic!("expected BadTurn for {yaml:?}, got {other:?}"),
    };
    let (script, index, _) = bad_turn("scripts:\n  s1:\n    - text: a\n    - {text: b, tool_calls: [{name: t}]}\n");
    assert_eq!((script.as_str(), index), ("s1", 1));
    let error = Scripts::from_yaml("scripts:\n  s1:\n    - text: a\n    - {text: b, tool_calls: [{name: t}]}\n")
        .unwrap_err()
        .to_string();
    assert!(error.contains("`s1`") && error.contains("turn 1"), "{error}");
    assert_eq!(bad_turn("scripts:\n  s2:\n    - {}\n").1, 0);
    assert_eq!(bad_turn("scripts:\n  s3:\n    - tool_calls: []\n").0, "s3");

    let parse = |yaml: &str| matches!(Scripts::from_yaml(yaml), Err(ScriptError::Parse(_)));
    assert!(parse("scripts: [\n"), "invalid YAML");
    assert!(parse("script: {}\n"), "unknown top-level field");
    assert!(parse("scripts:\n  s:\n    - txt: a\n"), "unknown turn field");
    assert!(parse("scripts:\n  s:\n    - tool_calls: [{name: t, args: {}}]\n"), "unknown call field");
    assert!(parse("scripts:\n  s:\n    - tool_calls: [{name: t, arguments: [1]}]\n"), "arguments not an object");
    assert!(
        matches!(Scripts::from_yaml("scripts:\n  a.b:\n    - text: x\n"), Err(ScriptError::BadName(n)) if n == "a.b")
    );
    assert!(matches!(Scripts::from_yaml("scripts:\n  e: []\n"), Err(ScriptError::Empty(n)) if n == "e"));

    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(Scripts::load(&dir.path().join("missing.yaml")), Err(ScriptError::Read { .. })));
    let path = dir.path().join("scripts.yaml");
    std::fs::write(&path, SCRIPT_FILE).unwrap();
    assert_eq!(Scripts::load(&path).unwrap(), Scripts::from_yaml(SCRIPT_FILE).unwrap());
}

#[test]
fn script_markers_are_found_anywhere_in_any_message() {
    assert_eq!(script_marker("please iop-mock-script:fix_readme-2, thanks"), Some("fix_readme-2"));
    assert_eq!(script_marker("iop-mock-script:"), None);
    assert_eq!(script_marker("iop-mock-script: x iop-mock-script:second"), Some("second"));
    assert_eq!(script_marker("iop-mock-script:a iop-mock-script:b"), Some("a"));
    let messages: Vec<ChatMessage> = serde_json::from_value(json!([
        { "role": "system", "content": "no marker" },
        { "role": "user", "content": [{ "type": "text", "text": "x" }, { "type": "text", "text": "iop-mock-script:s" }] },
        { "role": "user", "content": "iop-mock-script:later" },
    ]))
    .unwrap();
    assert_eq!(requested_script(&messages).as_deref(), Some("s"));
    assert_eq!(requested_script(&messages[..1]), None);
}
