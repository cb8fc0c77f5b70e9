//! Client-facing APIs: parse each API into the normalized run shape and render
//! normalized run events back into that API's wire format.

#[cfg(test)]
mod answer_fuzz;
pub mod anthropic_messages;
pub mod embeddings;
pub mod error;
#[cfg(test)]
pub(crate) mod fuzz;
pub mod hosted_tools;
mod images;
mod json;
pub mod openai_chat;
mod openai_common;
pub mod openai_responses;
mod outcome;
#[cfg(test)]
mod test_events;
pub mod transcript;

/// An estimate of a request's input tokens: about four characters per
/// token over every message text, tool call and tool definition (the
/// common rule of thumb for English and code; exact counts need the
/// model's own tokenizer). At least 1.
pub fn estimate_input_tokens(messages: &[iop_proto::pb::ChatMessage], tools: &[iop_proto::pb::ToolDefinition]) -> u64 {
    let message_chars: usize = messages
        .iter()
        .map(|m| {
            m.content.chars().count()
                + m.tool_calls.iter().map(|c| c.name.len() + c.arguments_json.len()).sum::<usize>()
        })
        .sum();
    let tool_chars: usize = tools.iter().map(|t| t.name.len() + t.description.len() + t.parameters_json.len()).sum();
    // Each message and image costs a few tokens of framing besides its text.
    let framing = messages.len() * 4 + messages.iter().map(|m| m.images.len() * 85).sum::<usize>();
    (((message_chars + tool_chars).div_ceil(4) + framing) as u64).max(1)
}
