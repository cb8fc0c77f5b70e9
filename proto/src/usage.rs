//! Token usage as both sides of the wire read it: the one estimate of a
//! request's input tokens (the Edge's `count_tokens` answer without a
//! provider tokenizer, the node's charge for a prompt whose provider
//! reported no count), and the one bound on what a run may be charged.

use crate::pb;

/// An estimate of a request's input tokens: about four characters per
/// token over every message text, tool call and tool definition (the
/// common rule of thumb for English and code; exact counts need the
/// model's own tokenizer). At least 1.
pub fn estimate_input_tokens(messages: &[pb::ChatMessage], tools: &[pb::ToolDefinition]) -> u64 {
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

/// [`estimate_input_tokens`] of a run's request: an embedding run's
/// inputs, else its messages and tools.
pub fn estimate_request_input(request: &pb::RunRequest) -> u64 {
    match &request.embed {
        Some(embed) => (embed.inputs.iter().map(String::len).sum::<usize>().div_ceil(4) as u64).max(1),
        None => estimate_input_tokens(&request.messages, &request.tools),
    }
}

impl pb::Usage {
    /// Counts the provider reported.
    pub fn provider(prompt_tokens: u32, completion_tokens: u32, reasoning_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            reasoning_tokens,
            prompt_source: pb::UsageSource::Provider.into(),
            completion_source: pb::UsageSource::Provider.into(),
        }
    }
}

impl pb::Usage {
    /// Two runs of one answer together (a continued answer's): counts
    /// summed, each kind's source the less exact of the two.
    pub fn plus(&self, other: &pb::Usage) -> pb::Usage {
        let source = |a: i32, b: i32| source_of(a).max(source_of(b)) as i32;
        pb::Usage {
            prompt_tokens: self.prompt_tokens.saturating_add(other.prompt_tokens),
            completion_tokens: self.completion_tokens.saturating_add(other.completion_tokens),
            reasoning_tokens: self.reasoning_tokens.saturating_add(other.reasoning_tokens),
            prompt_source: source(self.prompt_source, other.prompt_source),
            completion_source: source(self.completion_source, other.completion_source),
        }
    }

    /// How the prompt count was obtained.
    pub fn input_source(&self) -> pb::UsageSource {
        source_of(self.prompt_source)
    }

    /// How the completion count was obtained.
    pub fn output_source(&self) -> pb::UsageSource {
        source_of(self.completion_source)
    }
}

/// A wire source, read once: unspecified (a node from before sources, or
/// an unknown value) is the provider's; the enum's order runs from exact
/// to estimated.
fn source_of(wire: i32) -> pb::UsageSource {
    match pb::UsageSource::try_from(wire) {
        Ok(pb::UsageSource::Unspecified) | Err(_) => pb::UsageSource::Provider,
        Ok(source) => source,
    }
}
