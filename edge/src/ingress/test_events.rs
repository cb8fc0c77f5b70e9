//! Run-event builders for the renderer and aggregator tests of all three APIs.

use iop_proto::pb;
use pb::run_event::Event;

pub(super) fn text(s: &str) -> Event {
    Event::Text(pb::TextDelta { text: s.into() })
}

pub(super) fn tool(index: u32, id: &str, name: &str, args: &str) -> Event {
    Event::ToolCall(pb::ToolCallDelta { index, id: id.into(), name: name.into(), arguments_delta: args.into() })
}

pub(super) fn usage(prompt: u32, completion: u32) -> Event {
    Event::Usage(pb::Usage::provider(prompt, completion, 0))
}

pub(super) fn completed(reason: pb::FinishReason) -> Event {
    Event::Completed(pb::RunCompleted { finish_reason: reason.into() })
}

pub(super) fn started() -> Event {
    Event::Started(pb::RunStarted { model: "llama3.2:3b".into(), ..Default::default() })
}
