//! Ollama's API (`/api/*`) as the mock renders it: the model list, a chat
//! reply as NDJSON chunks or one body, and an embeddings answer.

use axum::body::Bytes;
use serde_json::{Value, json};

use super::embeddings::EmbedPlan;
use super::plan::{Finish, Part, Reply, ToolCall};
use super::residency::MODEL_NAME;

const CREATED_AT: &str = "2026-01-01T00:00:00Z";

pub(super) fn tags() -> Value {
    json!({ "models": [{
        "name": MODEL_NAME,
        "model": MODEL_NAME,
        "modified_at": CREATED_AT,
        "size": 0,
        "digest": MODEL_NAME,
        "details": {},
    }] })
}

pub(super) fn stream_parts(reply: &Reply) -> Vec<Part> {
    let thinking = reply.plan.reasoning.iter().map(|piece| thinking(assistant(""), piece));
    let pieces = reply.plan.pieces.iter().map(|piece| assistant(piece));
    let mut parts: Vec<Part> =
        thinking.chain(pieces).map(|message| Part::Content(line(&chunk(reply, message)))).collect();
    if !reply.plan.tool_calls.is_empty() {
        parts.push(Part::Content(line(&chunk(reply, tool_message(&reply.plan.tool_calls)))));
    }
    parts.push(Part::Tail(line(&done(reply, assistant("")))));
    parts
}

pub(super) fn full_body(reply: &Reply) -> Value {
    let message = match reply.plan.tool_calls.as_slice() {
        [] => assistant(&reply.plan.text()),
        calls => tool_message(calls),
    };
    match reply.plan.reasoning.as_slice() {
        [] => done(reply, message),
        _ => done(reply, thinking(message, &reply.plan.reasoning_text())),
    }
}

pub(super) fn embed(model: &str, plan: &EmbedPlan) -> Value {
    json!({
        "model": model,
        "embeddings": plan.vectors,
        "total_duration": 0,
        "load_duration": 0,
        "prompt_eval_count": plan.prompt_tokens,
    })
}

fn assistant(content: &str) -> Value {
    json!({ "role": "assistant", "content": content })
}

fn thinking(mut message: Value, thinking: &str) -> Value {
    message["thinking"] = json!(thinking);
    message
}

fn tool_message(calls: &[ToolCall]) -> Value {
    let tool_calls: Vec<Value> = calls
        .iter()
        .map(|call| {
            let arguments: Value =
                serde_json::from_str(&call.argument_pieces.concat()).expect("tool arguments are JSON");
            json!({ "function": { "name": call.name, "arguments": arguments } })
        })
        .collect();
    json!({ "role": "assistant", "content": "", "tool_calls": tool_calls })
}

fn chunk(reply: &Reply, message: Value) -> Value {
    json!({ "model": reply.model, "created_at": CREATED_AT, "message": message, "done": false })
}

fn done(reply: &Reply, message: Value) -> Value {
    let done_reason = match reply.plan.finish {
        Finish::Length => "length",
        Finish::Stop | Finish::ToolCalls => "stop",
    };
    json!({
        "model": reply.model,
        "created_at": CREATED_AT,
        "message": message,
        "done": true,
        "done_reason": done_reason,
        "total_duration": 0,
        "prompt_eval_count": reply.plan.usage.prompt,
        "eval_count": reply.plan.usage.completion,
    })
}

fn line(value: &Value) -> Bytes {
    Bytes::from(format!("{value}\n"))
}
