//! What to answer, decided once per request whatever the API (see
//! *Content*, *Prefill continuation* and *Reasoning* in the [`super`] docs):
//! the echo, `words` and a prefill's continuation, the `call tool` call, a
//! script turn, reasoning ([`ReplyPlan`]); and the [`Reply`] that an API's
//! renderer turns into a body or a stream of [`Part`]s.

use axum::body::Bytes;
use serde_json::Value;

use super::api::{Api, ChatMessage};
use super::faults::LineEnd;
use super::scripts::ScriptTurn;

const ECHO_LIMIT_CHARS: usize = 200;
const TOOL_TRIGGER: &str = "call tool";
pub(super) const TOOL_CALL_ID: &str = "call_mock_0";

/// What to answer, decided once per request and rendered by either API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ReplyPlan {
    /// Reasoning pieces, streamed before the reply (empty unless asked for).
    pub(super) reasoning: Vec<String>,
    /// Text pieces, one per streamed chunk (empty for tool calls).
    pub(super) pieces: Vec<String>,
    pub(super) tool_calls: Vec<ToolCall>,
    pub(super) finish: Finish,
    pub(super) usage: Usage,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ToolCall {
    /// OpenAI's call id.
    pub(super) id: String,
    pub(super) name: String,
    /// The arguments' JSON text in two pieces, as OpenAI streams them.
    pub(super) argument_pieces: Vec<String>,
}

impl ToolCall {
    fn new(id: String, name: &str, arguments: &str) -> Self {
        let mut middle = arguments.len() / 2;
        while !arguments.is_char_boundary(middle) {
            middle += 1;
        }
        let (head, tail) = arguments.split_at(middle);
        ToolCall { id, name: name.to_owned(), argument_pieces: vec![head.to_owned(), tail.to_owned()] }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Finish {
    Stop,
    Length,
    ToolCalls,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Usage {
    pub(super) prompt: u64,
    pub(super) completion: u64,
}

impl ReplyPlan {
    /// The echo (or `words`) reply, or the `call tool` call.
    /// `words`: N, and whether a continued prefill is repeated first.
    pub(super) fn echo(
        messages: &[ChatMessage],
        tools: &[Value],
        limit: Option<usize>,
        words: Option<(usize, bool)>,
    ) -> Self {
        let prompt = prompt_tokens(messages);
        if let Some(tool_call) = requested_tool_call(messages, tools) {
            return ReplyPlan {
                usage: Usage { prompt, completion: tool_call.argument_pieces.len() as u64 },
                reasoning: Vec::new(),
                pieces: Vec::new(),
                tool_calls: vec![tool_call],
                finish: Finish::ToolCalls,
            };
        }
        ReplyPlan::from_text(prompt, &reply_text(messages, words), limit)
    }

    /// A script turn; its tool calls get the ids `call_<first_call>`, … .
    pub(super) fn scripted(messages: &[ChatMessage], turn: &ScriptTurn, limit: Option<usize>, first_call: u64) -> Self {
        let prompt = prompt_tokens(messages);
        match turn {
            ScriptTurn::Text(text) => ReplyPlan::from_text(prompt, text, limit),
            ScriptTurn::ToolCalls(calls) => {
                let tool_calls: Vec<ToolCall> = (first_call..)
                    .zip(calls)
                    .map(|(n, call)| {
                        let arguments = Value::Object(call.arguments.clone()).to_string();
                        ToolCall::new(format!("call_{n}"), &call.name, &arguments)
                    })
                    .collect();
                ReplyPlan {
                    usage: Usage { prompt, completion: tool_calls.len() as u64 },
                    reasoning: Vec::new(),
                    pieces: Vec::new(),
                    tool_calls,
                    finish: Finish::ToolCalls,
                }
            }
        }
    }

    pub(super) fn from_text(prompt: u64, text: &str, limit: Option<usize>) -> Self {
        let mut pieces = split_pieces(text);
        let finish = match limit {
            Some(limit) if limit < pieces.len() => {
                pieces.truncate(limit);
                Finish::Length
            }
            _ => Finish::Stop,
        };
        ReplyPlan {
            usage: Usage { prompt, completion: pieces.len() as u64 },
            reasoning: Vec::new(),
            pieces,
            tool_calls: Vec::new(),
            finish,
        }
    }

    /// Reasoning `text` before the reply; its pieces count as completion tokens.
    pub(super) fn with_reasoning(mut self, text: &str) -> Self {
        self.reasoning = split_pieces(text);
        self.usage.completion += self.reasoning.len() as u64;
        self
    }

    pub(super) fn text(&self) -> String {
        self.pieces.concat()
    }

    pub(super) fn reasoning_text(&self) -> String {
        self.reasoning.concat()
    }

    pub(super) fn chunk_count(&self) -> usize {
        self.reasoning.len()
            + self.pieces.len()
            + self.tool_calls.iter().map(|call| call.argument_pieces.len()).sum::<usize>()
    }
}

/// Whitespace-separated words in all messages.
pub(super) fn prompt_tokens(messages: &[ChatMessage]) -> u64 {
    messages.iter().map(|m| m.text().split_whitespace().count() as u64).sum()
}

fn reply_text(messages: &[ChatMessage], words: Option<(usize, bool)>) -> String {
    if let Some((n, repeat)) = words {
        let reply = words_reply(messages, n);
        return match messages.last().filter(|m| repeat && m.role == "assistant") {
            Some(prefill) => prefill.text() + &reply,
            None => reply,
        };
    }
    let images: usize = messages.iter().map(ChatMessage::image_count).sum();
    let images = if images > 0 { format!(" [images: {images}]") } else { String::new() };
    format!("Hello from the IOP mock provider. You said: {}{images}", last_user_echo(messages))
}

/// `w1 … wN`, or its continuation after a prefilled assistant turn (see
/// *Prefill continuation*).
fn words_reply(messages: &[ChatMessage], n: usize) -> String {
    let prefill = messages.last().filter(|m| m.role == "assistant").map(ChatMessage::text).unwrap_or_default();
    let Some(k) = prefill_word(&prefill) else {
        return (1..=n).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ");
    };
    // A prefill that ends in whitespace already has the separator.
    let first = if prefill.ends_with(char::is_whitespace) { "" } else { " " };
    (k + 1..=n).enumerate().map(|(j, i)| format!("{}w{i}", if j == 0 { first } else { " " })).collect()
}

/// `K` when `text`'s last whitespace-separated word is `wK`.
fn prefill_word(text: &str) -> Option<usize> {
    text.split_whitespace().next_back()?.strip_prefix('w')?.parse().ok()
}

pub(super) fn reasoning_text(messages: &[ChatMessage]) -> String {
    format!("Thinking about: {}", last_user_echo(messages))
}

/// The last user message's text, cut to [`ECHO_LIMIT_CHARS`].
fn last_user_echo(messages: &[ChatMessage]) -> String {
    let last_user = messages.iter().rev().find(|m| m.role == "user").map(ChatMessage::text).unwrap_or_default();
    last_user.chars().take(ECHO_LIMIT_CHARS).collect()
}

/// Splits before every space (except at the start): the pieces concatenate
/// back to `text`.
fn split_pieces(text: &str) -> Vec<String> {
    let mut pieces: Vec<String> = Vec::new();
    for (i, ch) in text.char_indices() {
        match pieces.last_mut() {
            Some(piece) if !(ch == ' ' && i > 0) => piece.push(ch),
            _ => pieces.push(ch.to_string()),
        }
    }
    pieces
}

fn requested_tool_call(messages: &[ChatMessage], tools: &[Value]) -> Option<ToolCall> {
    let first_tool = tools.first()?;
    let last = messages.last()?;
    if last.role != "user" || !last.text().contains(TOOL_TRIGGER) {
        return None;
    }
    // Chat Completions nests the name under `function`; Responses does not.
    let name = first_tool.pointer("/function/name").or_else(|| first_tool.get("name"));
    let name = name.and_then(Value::as_str).unwrap_or("tool");
    let schema = first_tool.pointer("/function/parameters").or_else(|| first_tool.get("parameters"));
    let arguments = match schema.map(crate::schema_example::example_for_schema) {
        Some(arguments @ Value::Object(_)) => arguments,
        _ => Value::Object(Default::default()),
    };
    Some(ToolCall::new(TOOL_CALL_ID.to_owned(), name, &arguments.to_string()))
}

/// One request's answer, ready to render in its API's format.
pub(super) struct Reply {
    pub(super) api: Api,
    /// Echoed back verbatim (including any `@knobs` suffix).
    pub(super) model: String,
    /// OpenAI completion or response id.
    pub(super) id: String,
    pub(super) plan: ReplyPlan,
    pub(super) include_usage: bool,
    pub(super) no_done: bool,
    /// OpenAI streams: how SSE lines end.
    pub(super) line_end: LineEnd,
}

/// A rendered piece of a streaming body. Fault knobs count `Content` parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Part {
    /// Before the content (OpenAI's role chunk).
    Lead(Bytes),
    Content(Bytes),
    /// After the content (done line, finish/usage chunks, `[DONE]`).
    Tail(Bytes),
}

impl Part {
    pub(super) fn map(self, f: impl FnOnce(Bytes) -> Bytes) -> Part {
        match self {
            Part::Lead(b) => Part::Lead(f(b)),
            Part::Content(b) => Part::Content(f(b)),
            Part::Tail(b) => Part::Tail(f(b)),
        }
    }
}

#[cfg(test)]
mod tests;
