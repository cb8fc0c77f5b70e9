//! The tool surface a job's model sees: `workspace_read`, `workspace_list`,
//! `workspace_write`, `workspace_delete` and `workspace_command`, each
//! offered only when the frozen authority grants its operation (and, for
//! the stages other than working, only read and list), with JSON schemas
//! narrowed to that authority (the command ids as an enum, the read size
//! capped). A call is decoded strictly (the same decoding as every other
//! workspace caller: `crate::workspace::tools::ToolCall`) and checked
//! against the authority before anything goes on the wire.

use iop_proto::pb::{self, WorkspaceOperation as Op};
use serde_json::{Value, json};

use super::state::{JobFailure, Stage};
use crate::workspace::tools::ToolCall;

const OPERATIONS: [Op; 5] = [Op::Read, Op::List, Op::Write, Op::Delete, Op::Command];

/// The model-facing name of an operation's tool.
pub fn tool_name(op: Op) -> &'static str {
    match op {
        Op::Read => "workspace_read",
        Op::List => "workspace_list",
        Op::Write => "workspace_write",
        Op::Delete => "workspace_delete",
        Op::Command => "workspace_command",
        Op::Unspecified => "unknown",
    }
}

fn operation(name: &str) -> Option<Op> {
    OPERATIONS.into_iter().find(|op| tool_name(*op) == name)
}

/// A model's tool name as a metric label: one of the five, or `unknown`.
pub fn label(name: &str) -> &'static str {
    operation(name).map_or("unknown", tool_name)
}

/// Whether `stage` may use `op` under `authority`.
fn offered(stage: Stage, authority: &pb::WorkspaceAuthority, op: Op) -> bool {
    let read_only = matches!(op, Op::Read | Op::List);
    stage.has_tools() && (read_only || stage.may_change()) && authority.operations.contains(&i32::from(op))
}

/// The tools offered in `stage`.
pub fn definitions(stage: Stage, authority: &pb::WorkspaceAuthority) -> Vec<pb::ToolDefinition> {
    let limits = authority.limits.unwrap_or_default();
    let path = json!({"type": "string", "description": "A path relative to the workspace root, e.g. `src/main.rs`."});
    OPERATIONS
        .into_iter()
        .filter(|op| offered(stage, authority, *op))
        .map(|op| {
            let (description, properties, required): (&str, Value, &[&str]) = match op {
                Op::Read => (
                    "Read a text file of the workspace (from `offset`, at most `max_bytes`).",
                    json!({
                        "path": path,
                        "offset": {"type": "integer", "minimum": 0},
                        "max_bytes": {"type": "integer", "minimum": 1, "maximum": limits.max_output_bytes},
                    }),
                    &["path"],
                ),
                Op::List => (
                    "List a directory of the workspace (the root when `path` is empty), in batches: pass \
                     `next_cursor` back as `cursor` for the next one.",
                    json!({"path": path, "cursor": {"type": "string"}}),
                    &[],
                ),
                Op::Write => (
                    "Write a whole file of the workspace (its directory must exist). With `create_only`, an \
                     existing file is an error.",
                    json!({
                        "path": path,
                        "content": {"type": "string", "maxLength": limits.max_file_bytes},
                        "create_only": {"type": "boolean"},
                    }),
                    &["path", "content"],
                ),
                Op::Delete => {
                    ("Delete a file or an empty directory of the workspace.", json!({"path": path}), &["path"])
                }
                Op::Command | Op::Unspecified => (
                    "Run one of the workspace's commands by id (no arguments) and get its exit code and output.",
                    json!({"command": {"type": "string", "enum": authority.command_ids}}),
                    &["command"],
                ),
            };
            let schema = json!({
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": false,
            });
            pb::ToolDefinition {
                name: tool_name(op).to_string(),
                description: description.to_string(),
                parameters_json: schema.to_string(),
            }
        })
        .collect()
}

/// A model's tool call as a workspace call, or why it may not run.
pub fn decode(
    name: &str,
    arguments_json: &str,
    stage: Stage,
    authority: &pb::WorkspaceAuthority,
) -> Result<ToolCall, JobFailure> {
    let op = operation(name).ok_or(JobFailure::ToolDenied)?;
    if !offered(stage, authority, op) {
        return Err(JobFailure::ToolDenied);
    }
    // Some models send "" for a call without arguments.
    let arguments = if arguments_json.trim().is_empty() { "{}" } else { arguments_json };
    let Ok(Value::Object(mut fields)) = serde_json::from_str::<Value>(arguments) else {
        return Err(JobFailure::MalformedToolCall);
    };
    if fields.contains_key("op") {
        return Err(JobFailure::MalformedToolCall);
    }
    let tag = name.strip_prefix("workspace_").unwrap_or(name);
    fields.insert("op".into(), json!(tag));
    let call: ToolCall = serde_json::from_value(Value::Object(fields)).map_err(|_| JobFailure::MalformedToolCall)?;
    if !call.allowed_by(authority) {
        return Err(JobFailure::ToolDenied);
    }
    Ok(call)
}

#[cfg(test)]
mod tests;
