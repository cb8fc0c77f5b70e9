//! Scripted turns (see *Scripted turns* in the [`super`] docs): the script
//! file ([`Scripts`], loaded and checked once) and the
//! `iop-mock-script:<name>` marker that picks a script for a request.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::api::ChatMessage;

/// Prefix of the marker `iop-mock-script:<name>` that selects a script turn.
pub const SCRIPT_MARKER: &str = "iop-mock-script:";

/// Scripted turns by script name, loaded once from a script file (see the
/// module doc). Cursors live in the server, not here.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scripts {
    /// Every script has at least one turn.
    scripts: BTreeMap<String, Vec<ScriptTurn>>,
}

/// One scripted answer.
#[derive(Debug, Clone, PartialEq)]
pub enum ScriptTurn {
    Text(String),
    /// At least one call.
    ToolCalls(Vec<ScriptToolCall>),
}

/// One tool call of a [`ScriptTurn::ToolCalls`] turn.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptToolCall {
    pub name: String,
    /// A JSON object (`{}` when left out).
    #[serde(default)]
    pub arguments: serde_json::Map<String, Value>,
}

/// A script file that could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("cannot read script file {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("invalid script file: {0}")]
    Parse(String),
    #[error("script name `{0}` must match [A-Za-z0-9_-]+")]
    BadName(String),
    #[error("script `{0}` has no turns")]
    Empty(String),
    #[error("script `{script}`, turn {index} (0-based): {reason}")]
    BadTurn { script: String, index: usize, reason: &'static str },
}

/// The file as written; [`Scripts::from_yaml`] checks what serde cannot.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptFile {
    scripts: BTreeMap<String, Vec<RawTurn>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTurn {
    text: Option<String>,
    tool_calls: Option<Vec<ScriptToolCall>>,
}

impl Scripts {
    /// Reads and checks a script file.
    ///
    /// # Errors
    /// The file cannot be read, or see [`Scripts::from_yaml`].
    pub fn load(path: &Path) -> Result<Scripts, ScriptError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ScriptError::Read { path: path.to_owned(), source })?;
        Scripts::from_yaml(&text)
    }

    /// Parses and checks the YAML text of a script file.
    ///
    /// # Errors
    /// Invalid YAML or unknown fields, a bad script name, a script without
    /// turns, or a turn without exactly one of `text` and a non-empty `tool_calls`.
    pub fn from_yaml(text: &str) -> Result<Scripts, ScriptError> {
        let file: ScriptFile = serde_saphyr::from_str(text).map_err(|e| ScriptError::Parse(e.to_string()))?;
        let mut scripts = BTreeMap::new();
        for (name, raw) in file.scripts {
            if name.is_empty() || !name.chars().all(is_script_name_char) {
                return Err(ScriptError::BadName(name));
            }
            if raw.is_empty() {
                return Err(ScriptError::Empty(name));
            }
            let turns = raw
                .into_iter()
                .enumerate()
                .map(|(index, turn)| {
                    let bad = |reason| ScriptError::BadTurn { script: name.clone(), index, reason };
                    match (turn.text, turn.tool_calls) {
                        (Some(text), None) => Ok(ScriptTurn::Text(text)),
                        (None, Some(calls)) if calls.is_empty() => Err(bad("`tool_calls` is empty")),
                        (None, Some(calls)) => Ok(ScriptTurn::ToolCalls(calls)),
                        (Some(_), Some(_)) => Err(bad("has both `text` and `tool_calls`")),
                        (None, None) => Err(bad("needs `text` or `tool_calls`")),
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            scripts.insert(name, turns);
        }
        Ok(Scripts { scripts })
    }

    /// The script names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.scripts.keys().map(String::as_str)
    }

    /// The turn of script `name` for a cursor at `cursor` (past the end:
    /// the last turn); `None` if there is no such script.
    #[must_use]
    pub fn turn(&self, name: &str, cursor: u64) -> Option<&ScriptTurn> {
        let turns = self.scripts.get(name)?;
        let index = usize::try_from(cursor).unwrap_or(usize::MAX).min(turns.len() - 1);
        turns.get(index)
    }
}

fn is_script_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// The name in the first `iop-mock-script:<name>` marker with a non-empty name.
fn script_marker(text: &str) -> Option<&str> {
    text.match_indices(SCRIPT_MARKER).find_map(|(at, marker)| {
        let rest = &text[at + marker.len()..];
        let name = &rest[..rest.find(|c| !is_script_name_char(c)).unwrap_or(rest.len())];
        Some(name).filter(|name| !name.is_empty())
    })
}

/// The script the request's messages name, if any (the first marker counts).
pub(super) fn requested_script(messages: &[ChatMessage]) -> Option<String> {
    messages.iter().find_map(|m| script_marker(&m.text()).map(str::to_owned))
}

#[cfg(test)]
pub(super) mod tests {
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
}
