//! The normalized run events the adapters produce, and the sink they go to.

use iop_proto::pb;

/// Sink for the non-terminal events of a run (Started, Text, ToolCall, Usage).
/// The caller adds seq numbers and the terminal.
pub type EventSink = tokio::sync::mpsc::Sender<pb::run_event::Event>;

pub(super) type Events = Vec<pb::run_event::Event>;

pub(super) fn started(model: &str) -> pb::run_event::Event {
    pb::run_event::Event::Started(pb::RunStarted { model: model.to_owned(), ..Default::default() })
}

pub(super) fn text(text: &str) -> pb::run_event::Event {
    pb::run_event::Event::Text(pb::TextDelta { text: text.to_owned() })
}

pub(super) fn reasoning(text: &str) -> pb::run_event::Event {
    pb::run_event::Event::Reasoning(pb::ReasoningDelta { text: text.to_owned() })
}

pub(super) fn tool_call(index: u32, id: &str, name: &str, arguments_delta: &str) -> pb::run_event::Event {
    pb::run_event::Event::ToolCall(pb::ToolCallDelta {
        index,
        id: id.to_owned(),
        name: name.to_owned(),
        arguments_delta: arguments_delta.to_owned(),
    })
}

pub(super) fn usage(prompt_tokens: u64, completion_tokens: u64) -> pb::run_event::Event {
    let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    pb::run_event::Event::Usage(pb::Usage::provider(clamp(prompt_tokens), clamp(completion_tokens), 0))
}
