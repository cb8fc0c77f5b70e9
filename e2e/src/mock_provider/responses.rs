//! OpenAI Responses: a reply as `response` object, or as its typed
//! stream events (`response.created`, the output items with their deltas,
//! `response.completed`), each with its `sequence_number`.

use axum::body::Bytes;
use serde_json::{Value, json};

use super::openai::CREATED_UNIX;
use super::plan::{Finish, Part, Reply, ReplyPlan, ToolCall};

pub(super) fn full_body(reply: &Reply) -> Value {
    response(reply, status(reply.plan.finish), output(reply))
}

pub(super) fn stream_parts(reply: &Reply) -> Vec<Part> {
    let plan = &reply.plan;
    let mut events = Events::default();
    let mut parts = vec![Part::Lead(
        events.next("response.created", json!({ "response": response(reply, "in_progress", json!([])) })),
    )];
    let mut index = 0;
    if !plan.reasoning.is_empty() {
        let item = json!({ "type": "reasoning", "id": "rs_mock", "summary": [], "content": [] });
        parts.push(Part::Lead(
            events.next("response.output_item.added", json!({ "output_index": index, "item": item })),
        ));
        for piece in &plan.reasoning {
            let delta = json!({ "output_index": index, "item_id": "rs_mock", "content_index": 0, "delta": piece });
            parts.push(Part::Content(events.next("response.reasoning_text.delta", delta)));
        }
        let done = json!({ "output_index": index, "item": reasoning_item(plan) });
        parts.push(Part::Tail(events.next("response.output_item.done", done)));
        index += 1;
    }
    if plan.tool_calls.is_empty() {
        let item =
            json!({ "type": "message", "id": "msg_mock", "status": "in_progress", "role": "assistant", "content": [] });
        parts.push(Part::Lead(
            events.next("response.output_item.added", json!({ "output_index": index, "item": item })),
        ));
        let part = json!({ "type": "output_text", "text": "", "annotations": [] });
        let at = json!({ "output_index": index, "item_id": "msg_mock", "content_index": 0 });
        parts.push(Part::Lead(events.next("response.content_part.added", with(&at, "part", part))));
        for piece in &plan.pieces {
            parts.push(Part::Content(events.next("response.output_text.delta", with(&at, "delta", json!(piece)))));
        }
        parts.push(Part::Tail(events.next("response.output_text.done", with(&at, "text", json!(plan.text())))));
        let part = json!({ "type": "output_text", "text": plan.text(), "annotations": [] });
        parts.push(Part::Tail(events.next("response.content_part.done", with(&at, "part", part))));
        let done = json!({ "output_index": index, "item": message_item(plan) });
        parts.push(Part::Tail(events.next("response.output_item.done", done)));
    }
    for call in &plan.tool_calls {
        let mut item = call_item(call);
        item["arguments"] = json!("");
        item["status"] = json!("in_progress");
        parts.push(Part::Content(
            events.next("response.output_item.added", json!({ "output_index": index, "item": item })),
        ));
        for piece in &call.argument_pieces {
            let delta = json!({ "output_index": index, "item_id": format!("fc_{}", call.id), "delta": piece });
            parts.push(Part::Content(events.next("response.function_call_arguments.delta", delta)));
        }
        let done = json!({ "output_index": index, "item": call_item(call) });
        parts.push(Part::Tail(events.next("response.output_item.done", done)));
        index += 1;
    }
    let finished = response(reply, status(plan.finish), output(reply));
    let kind = if plan.finish == Finish::Length { "response.incomplete" } else { "response.completed" };
    parts.push(Part::Tail(events.next(kind, json!({ "response": finished }))));
    parts
}

/// Numbers the stream's events in order.
#[derive(Default)]
struct Events {
    sequence: u64,
}

impl Events {
    fn next(&mut self, kind: &str, mut data: Value) -> Bytes {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
    }
}

fn with(base: &Value, key: &str, value: Value) -> Value {
    let mut out = base.clone();
    out[key] = value;
    out
}

fn response(reply: &Reply, status: &str, output: Value) -> Value {
    let mut value = json!({
        "id": reply.id,
        "object": "response",
        "created_at": CREATED_UNIX,
        "status": status,
        "model": reply.model,
        "output": output,
        "usage": null,
    });
    if status != "in_progress" {
        let usage = reply.plan.usage;
        value["usage"] = json!({
            "input_tokens": usage.prompt,
            "output_tokens": usage.completion,
            "total_tokens": usage.prompt + usage.completion,
        });
    }
    if status == "incomplete" {
        value["incomplete_details"] = json!({ "reason": "max_output_tokens" });
    }
    value
}

fn status(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop | Finish::ToolCalls => "completed",
        Finish::Length => "incomplete",
    }
}

fn output(reply: &Reply) -> Value {
    let plan = &reply.plan;
    let mut items = Vec::new();
    if !plan.reasoning.is_empty() {
        items.push(reasoning_item(plan));
    }
    if plan.tool_calls.is_empty() {
        items.push(message_item(plan));
    }
    items.extend(plan.tool_calls.iter().map(call_item));
    Value::Array(items)
}

fn reasoning_item(plan: &ReplyPlan) -> Value {
    let content = json!([{ "type": "reasoning_text", "text": plan.reasoning_text() }]);
    json!({ "type": "reasoning", "id": "rs_mock", "summary": [], "content": content })
}

/// `incomplete` when cut at the token limit, as OpenAI marks it.
fn message_item(plan: &ReplyPlan) -> Value {
    let content = json!([{ "type": "output_text", "text": plan.text(), "annotations": [] }]);
    let status = status(plan.finish);
    json!({ "type": "message", "id": "msg_mock", "status": status, "role": "assistant", "content": content })
}

fn call_item(call: &ToolCall) -> Value {
    json!({
        "type": "function_call",
        "id": format!("fc_{}", call.id),
        "call_id": call.id,
        "name": call.name,
        "arguments": call.argument_pieces.concat(),
        "status": "completed",
    })
}
