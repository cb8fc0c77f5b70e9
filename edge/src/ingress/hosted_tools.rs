//! Hosted tools: tools that run inside the API vendor's platform (OpenAI's
//! `web_search`, Anthropic's `web_search_20250305`, ...). No local provider
//! has them, and coding agents send them on every request by default, so a
//! request that names one is served without it (the response says so in
//! [`DROPPED_TOOLS_HEADER`]) unless the Edge is configured to refuse them
//! (`api.hosted_tools: refuse`).
//!
//! The kinds are a closed list, so the header, the log line and any label
//! carry only these names, never a client's string.

use super::error::ApiError;

/// The response header that lists the hosted tools a request named and the
/// model was not offered (comma-separated kinds, e.g. `web_search`).
pub const DROPPED_TOOLS_HEADER: &str = "iop-dropped-tools";

/// A hosted tool a request named: where (`tools[4]`, `tools.3`) and which kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedTool {
    pub path: String,
    pub kind: &'static str,
}

/// OpenAI's hosted tool types (Responses; Chat Completions has none in `tools`).
pub fn openai_kind(ty: &str) -> Option<&'static str> {
    Some(match ty {
        "web_search" | "web_search_preview" | "web_search_2025_08_26" | "web_search_preview_2025_03_11" => "web_search",
        "file_search" => "file_search",
        "code_interpreter" => "code_interpreter",
        "image_generation" => "image_generation",
        "computer_use_preview" | "computer" => "computer",
        "mcp" => "mcp",
        // Codex's deferred tool loading, done by the platform.
        "tool_search" => "tool_search",
        _ => return None,
    })
}

/// Anthropic's server tools: versioned types such as `web_search_20250305`.
/// Anthropic-defined client tools (`bash_*`, `text_editor_*`, `computer_*`,
/// `memory_*`) are not here: the client runs those, but they carry no schema
/// a local model could be given, so they stay refused.
pub fn anthropic_kind(ty: &str) -> Option<&'static str> {
    let versioned = |prefix: &str| {
        ty.strip_prefix(prefix).is_some_and(|date| !date.is_empty() && date.bytes().all(|b| b.is_ascii_digit()))
    };
    Some(if versioned("web_search_") {
        "web_search"
    } else if versioned("web_fetch_") {
        "web_fetch"
    } else if versioned("code_execution_") {
        "code_execution"
    } else if ty.starts_with("tool_search_tool_") {
        "tool_search"
    } else if ty == "mcp_toolset" {
        "mcp"
    } else {
        return None;
    })
}

/// The 400 a strict Edge answers for the first dropped tool.
pub fn refusal(tool: &DroppedTool) -> ApiError {
    ApiError::invalid_param(
        &tool.path,
        format!(
            "{}: `{}` is a hosted tool that runs only on the API vendor's platform; no provider behind this \
             gateway offers it (remove it from `tools`)",
            tool.path, tool.kind
        ),
    )
}

/// The header value: each kind once, in first-seen order.
pub fn header_value(tools: &[DroppedTool]) -> String {
    let mut kinds: Vec<&str> = Vec::new();
    for tool in tools {
        if !kinds.contains(&tool.kind) {
            kinds.push(tool.kind);
        }
    }
    kinds.join(", ")
}

#[cfg(test)]
mod tests;
