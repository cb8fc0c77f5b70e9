//! The OpenAI API (`/v1/*`) as the mock renders it: the model list, a Chat
//! Completions reply as SSE chunks or one body, and an embeddings answer.

use axum::body::Bytes;
use serde_json::{Value, json};

use super::embeddings::{EmbedPlan, base64_f32s};
use super::plan::{Finish, Part, Reply, Usage};
use super::residency::MODEL_NAME;

pub(super) const CREATED_UNIX: u64 = 1_767_225_600;

pub(super) fn models() -> Value {
    let data = json!([{ "id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "iop-mock" }]);
    json!({ "object": "list", "data": data })
}

pub(super) fn stream_parts(reply: &Reply) -> Vec<Part> {
    let plan = &reply.plan;
    let mut parts = vec![Part::Lead(event(&chunk(reply, json!({ "role": "assistant", "content": "" }), None)))];
    for piece in &plan.reasoning {
        parts.push(Part::Content(event(&chunk(reply, json!({ "reasoning_content": piece }), None))));
    }
    for piece in &plan.pieces {
        parts.push(Part::Content(event(&chunk(reply, json!({ "content": piece }), None))));
    }
    for (index, call) in plan.tool_calls.iter().enumerate() {
        let head = json!({ "tool_calls": [{
            "index": index, "id": call.id, "type": "function",
            "function": { "name": call.name, "arguments": "" },
        }] });
        parts.push(Part::Content(event(&chunk(reply, head, None))));
        for piece in &call.argument_pieces {
            let delta = json!({ "tool_calls": [{ "index": index, "function": { "arguments": piece } }] });
            parts.push(Part::Content(event(&chunk(reply, delta, None))));
        }
    }
    parts.push(Part::Tail(event(&chunk(reply, json!({}), Some(finish_reason(plan.finish))))));
    if reply.include_usage {
        parts.push(Part::Tail(event(&envelope(reply, "chat.completion.chunk", json!([]), Some(usage(plan.usage))))));
    }
    if !reply.no_done {
        parts.push(Part::Tail(Bytes::from_static(b"data: [DONE]\n\n")));
    }
    parts
}

pub(super) fn full_body(reply: &Reply) -> Value {
    let plan = &reply.plan;
    let mut message = if plan.tool_calls.is_empty() {
        json!({ "role": "assistant", "content": plan.text() })
    } else {
        let tool_calls: Vec<Value> = plan
            .tool_calls
            .iter()
            .map(|call| {
                json!({
                    "id": call.id, "type": "function",
                    "function": { "name": call.name, "arguments": call.argument_pieces.concat() },
                })
            })
            .collect();
        json!({ "role": "assistant", "content": null, "tool_calls": tool_calls })
    };
    if !plan.reasoning.is_empty() {
        message["reasoning_content"] = json!(plan.reasoning_text());
    }
    let choices = json!([{
        "index": 0, "message": message, "logprobs": null, "finish_reason": finish_reason(plan.finish),
    }]);
    envelope(reply, "chat.completion", choices, Some(usage(plan.usage)))
}

pub(super) fn embeddings(model: &str, plan: &EmbedPlan) -> Value {
    let data: Vec<Value> = plan
        .vectors
        .iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = if plan.base64 { json!(base64_f32s(vector)) } else { json!(vector) };
            json!({ "object": "embedding", "index": index, "embedding": embedding })
        })
        .collect();
    let usage = json!({ "prompt_tokens": plan.prompt_tokens, "total_tokens": plan.prompt_tokens });
    json!({ "object": "list", "data": data, "model": model, "usage": usage })
}

fn chunk(reply: &Reply, delta: Value, finish: Option<&str>) -> Value {
    let choices = json!([{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish }]);
    envelope(reply, "chat.completion.chunk", choices, None)
}

fn envelope(reply: &Reply, object: &str, choices: Value, usage: Option<Value>) -> Value {
    let mut value = json!({
        "id": reply.id,
        "object": object,
        "created": CREATED_UNIX,
        "model": reply.model,
        "choices": choices,
    });
    if let Some(usage) = usage {
        value["usage"] = usage;
    }
    value
}

fn usage(usage: Usage) -> Value {
    json!({
        "prompt_tokens": usage.prompt,
        "completion_tokens": usage.completion,
        "total_tokens": usage.prompt + usage.completion,
    })
}

fn finish_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop => "stop",
        Finish::Length => "length",
        Finish::ToolCalls => "tool_calls",
    }
}

fn event(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}
