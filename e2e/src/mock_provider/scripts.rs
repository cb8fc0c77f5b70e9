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
pub(super) mod tests;
