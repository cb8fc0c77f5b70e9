//! Workspace tool calls as JSON: the one decoding of a call
//! ([`ToolCall`], strict: unknown fields are refused) and the one rendering
//! of its typed result ([`result_json`]) for whoever drives a workspace
//! (the admin diagnostic endpoint; the job loop of the single-request
//! coordinator).

use base64::Engine as _;
use iop_proto::pb::{self, workspace_tool_request::Op, workspace_tool_response::Result as R};
use serde::Deserialize;
use serde_json::{Value, json};

/// One call, as `{"op": "read", "path": "src/main.rs", ...}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum ToolCall {
    Read {
        path: String,
        #[serde(default)]
        offset: u64,
        /// 0 or absent: as much as the output limit allows.
        #[serde(default)]
        max_bytes: u64,
    },
    List {
        #[serde(default)]
        path: String,
        #[serde(default)]
        cursor: String,
    },
    Write {
        path: String,
        /// UTF-8 text.
        content: String,
        #[serde(default)]
        create_only: bool,
    },
    Delete {
        path: String,
    },
    Command {
        /// A command id of the workspace's template (never argv).
        command: String,
    },
}

impl ToolCall {
    pub fn operation(&self) -> pb::WorkspaceOperation {
        match self {
            Self::Read { .. } => pb::WorkspaceOperation::Read,
            Self::List { .. } => pb::WorkspaceOperation::List,
            Self::Write { .. } => pb::WorkspaceOperation::Write,
            Self::Delete { .. } => pb::WorkspaceOperation::Delete,
            Self::Command { .. } => pb::WorkspaceOperation::Command,
        }
    }

    /// Whether `authority` allows this call: its operation, and for a
    /// command its id. Checked before anything goes on the wire.
    pub fn allowed_by(&self, authority: &pb::WorkspaceAuthority) -> bool {
        let op: i32 = self.operation().into();
        authority.operations.contains(&op)
            && match self {
                Self::Command { command } => authority.command_ids.contains(command),
                _ => true,
            }
    }

    pub fn into_wire(self) -> Op {
        match self {
            Self::Read { path, offset, max_bytes } => Op::Read(pb::WorkspaceRead { path, offset, max_bytes }),
            Self::List { path, cursor } => Op::List(pb::WorkspaceList { path, cursor }),
            Self::Write { path, content, create_only } => {
                Op::Write(pb::WorkspaceWrite { path, content: content.into_bytes(), create_only })
            }
            Self::Delete { path } => Op::Delete(pb::WorkspaceDelete { path }),
            Self::Command { command } => Op::Command(pb::WorkspaceRunCommand { command_id: command }),
        }
    }
}

/// Text when it is UTF-8, else base64, with the encoding named.
fn bytes_json(bytes: &[u8]) -> (Value, &'static str) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (json!(text), "utf8"),
        Err(_) => (json!(base64::engine::general_purpose::STANDARD.encode(bytes)), "base64"),
    }
}

/// The typed result as JSON: `{"result": "ok" | <closed label>, ...}` plus
/// the operation's own fields. Never a path, argv or environment value.
pub fn result_json(response: &pb::WorkspaceToolResponse) -> Value {
    let result = response.result_label();
    match &response.result {
        Some(R::Read(r)) => {
            let (content, encoding) = bytes_json(&r.content);
            json!({"result": result, "content": content, "encoding": encoding, "truncated": r.truncated, "size": r.size})
        }
        Some(R::List(l)) => {
            let entries: Vec<Value> = l
                .entries
                .iter()
                .map(|e| {
                    let kind = match e.kind() {
                        pb::WorkspaceEntryKind::File => "file",
                        pb::WorkspaceEntryKind::Directory => "directory",
                        pb::WorkspaceEntryKind::Symlink => "symlink",
                        pb::WorkspaceEntryKind::Other | pb::WorkspaceEntryKind::Unspecified => "other",
                    };
                    json!({"name": e.name, "kind": kind})
                })
                .collect();
            let next = (!l.next_cursor.is_empty()).then_some(&l.next_cursor);
            json!({"result": result, "entries": entries, "next_cursor": next})
        }
        Some(R::Command(c)) => {
            let (output, encoding) = bytes_json(&c.output);
            json!({
                "result": result,
                "exit_code": c.exit_code,
                "signal": c.signal,
                "timed_out": c.timed_out,
                "cancelled": c.cancelled,
                "output": output,
                "encoding": encoding,
                "truncated": c.truncated,
                "duration_ms": c.duration_ms,
                // Which bound ended it (`processes`, `memory`, `cpu`,
                // `file_size`, `disk`), with `result: limit_exceeded`.
                "limit": c.limit_exceeded().label(),
            })
        }
        Some(R::Write(_) | R::Delete(_) | R::Error(_)) | None => json!({"result": result}),
    }
}

#[cfg(test)]
mod tests;
