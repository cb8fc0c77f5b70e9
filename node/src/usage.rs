//! Token usage as providers report it: the one reading of a `usage` object
//! ([`ProviderUsage`], for normalized runs and tunnels alike) and the
//! reader that finds it in a tunnel's relayed answer ([`TunnelUsage`]), so
//! the Edge can account and limit tunnelled requests too
//! (`TunnelEnd.usage`); and what a run is charged when its provider
//! reported nothing, because the run was cut, cancelled or the provider
//! does not count ([`RunMeter`]).
//!
//! The forms read: OpenAI Chat Completions (`prompt_tokens`,
//! `completion_tokens`, `completion_tokens_details.reasoning_tokens`), OpenAI
//! Responses and Anthropic Messages (`input_tokens`, `output_tokens`,
//! `output_tokens_details.reasoning_tokens`). In a stream the last report
//! of each count wins: Anthropic sends `input_tokens` in `message_start`
//! and the running `output_tokens` in `message_delta`; OpenAI sends usage
//! once in its last chunk; Responses in `response.completed`.

use iop_proto::pb;
use serde::Deserialize;
use serde_json::Value;

/// A provider's `usage` object, in any of the forms above.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct ProviderUsage {
    #[serde(default, alias = "input_tokens")]
    pub prompt_tokens: Option<u64>,
    #[serde(default, alias = "output_tokens")]
    pub completion_tokens: Option<u64>,
    #[serde(default, alias = "output_tokens_details")]
    pub completion_tokens_details: Option<Details>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Details {
    #[serde(default)]
    pub reasoning_tokens: Option<u64>,
}

impl ProviderUsage {
    pub fn reasoning_tokens(&self) -> Option<u64> {
        self.completion_tokens_details.and_then(|d| d.reasoning_tokens)
    }

    /// Later counts replace earlier ones, one count at a time.
    fn merge(&mut self, later: ProviderUsage) {
        self.prompt_tokens = later.prompt_tokens.or(self.prompt_tokens);
        self.completion_tokens = later.completion_tokens.or(self.completion_tokens);
        if later.reasoning_tokens().is_some() {
            self.completion_tokens_details = later.completion_tokens_details;
        }
    }

    /// As the wire carries it (counts past `u32::MAX` are clamped).
    pub fn to_pb(self) -> pb::Usage {
        let clamp = |n: Option<u64>| u32::try_from(n.unwrap_or(0)).unwrap_or(u32::MAX);
        pb::Usage::provider(clamp(self.prompt_tokens), clamp(self.completion_tokens), clamp(self.reasoning_tokens()))
    }
}

/// The usage object(s) of one JSON value: its own `usage`, a Responses
/// event's `response.usage`, an Anthropic `message_start`'s
/// `message.usage`. Anything else (or a malformed usage) is none.
fn usages_in(value: &Value) -> impl Iterator<Item = ProviderUsage> + '_ {
    [value.get("usage"), value.pointer("/response/usage"), value.pointer("/message/usage")]
        .into_iter()
        .flatten()
        .filter_map(|u| ProviderUsage::deserialize(u).ok())
}

/// Longest SSE line or JSON body the reader keeps to look for usage; a
/// longer one is passed on unread (its usage, if any, is not counted).
const MAX_KEPT: usize = 1024 * 1024;

/// Reads the usage of a tunnel's answer from its body as it passes: an SSE
/// stream (`text/event-stream`) line by line, anything else as one JSON
/// body. Holds at most [`MAX_KEPT`] bytes; only lines that mention
/// `"usage"` are parsed.
#[derive(Debug)]
pub struct TunnelUsage {
    sse: bool,
    kept: Vec<u8>,
    /// The kept line or body outgrew [`MAX_KEPT`]: skip to the next line.
    overflowed: bool,
    found: Option<ProviderUsage>,
    /// SSE events that carry a piece of the answer (`"delta"`: Chat
    /// Completions chunks, Messages `content_block_delta`, Responses
    /// `*.delta`), the count charged when the answer reported no usage.
    deltas: u64,
}

impl TunnelUsage {
    /// For a response whose `Content-Type` is `content_type`.
    pub fn new(content_type: Option<&str>) -> Self {
        let sse = content_type.is_some_and(|t| t.trim_start().to_ascii_lowercase().starts_with("text/event-stream"));
        Self { sse, kept: Vec::new(), overflowed: false, found: None, deltas: 0 }
    }

    pub fn push(&mut self, mut chunk: &[u8]) {
        if !self.sse {
            self.keep(chunk);
            return;
        }
        while let Some(end) = chunk.iter().position(|&b| b == b'\n') {
            self.keep(&chunk[..end]);
            self.line();
            chunk = &chunk[end + 1..];
        }
        self.keep(chunk);
    }

    /// The usage the answer reported, if it reported any.
    pub fn finish(&mut self) -> Option<pb::Usage> {
        if self.sse {
            self.line();
        } else if !self.overflowed && mentions_usage(&self.kept) {
            let kept = std::mem::take(&mut self.kept);
            self.read(&kept);
        }
        self.found.map(ProviderUsage::to_pb)
    }

    /// What the answer relayed so far, for a tunnel whose provider reported
    /// no usage ([`unreported`]).
    pub fn deltas(&self) -> u64 {
        self.deltas
    }

    fn keep(&mut self, bytes: &[u8]) {
        if self.overflowed {
            return;
        }
        if self.kept.len() + bytes.len() > MAX_KEPT {
            self.overflowed = true;
            self.kept = Vec::new();
            return;
        }
        self.kept.extend_from_slice(bytes);
    }

    /// One complete SSE line: `data: {json}` (NDJSON lines, without the
    /// prefix, are read the same).
    fn line(&mut self) {
        let line = std::mem::take(&mut self.kept);
        if line.starts_with(b"data:") && contains(&line, b"\"delta\"") {
            self.deltas += 1;
        }
        if !std::mem::replace(&mut self.overflowed, false) && mentions_usage(&line) {
            let data = line.strip_prefix(b"data:").unwrap_or(&line);
            self.read(data);
        }
    }

    fn read(&mut self, json: &[u8]) {
        let Ok(value) = serde_json::from_slice::<Value>(json.trim_ascii()) else { return };
        for usage in usages_in(&value) {
            self.found.get_or_insert_with(ProviderUsage::default).merge(usage);
        }
    }
}

/// What a normalized run relayed, for its charge however it ends: the
/// provider's last usage report, and otherwise the node's own count. Every
/// event the adapter emits passes [`RunMeter::observe`] before it is
/// coalesced or sent, so a client that left, a cut stream and a stall are
/// charged what the provider generated up to then.
#[derive(Debug, Default)]
pub struct RunMeter {
    /// The provider's last report.
    reported: Option<pb::Usage>,
    /// Non-empty content deltas (text, reasoning, tool-call pieces):
    /// providers stream one token per delta.
    deltas: u64,
}

impl RunMeter {
    pub fn observe(&mut self, event: &pb::run_event::Event) {
        use pb::run_event::Event;
        let delta = match event {
            Event::Usage(usage) => {
                self.reported = Some(*usage);
                false
            }
            Event::Text(t) => !t.text.is_empty(),
            Event::Reasoning(r) => !r.text.is_empty(),
            Event::ToolCall(c) => !c.arguments_delta.is_empty() || !c.name.is_empty(),
            _ => false,
        };
        self.deltas += u64::from(delta);
    }

    /// The usage to send before the run's terminal when the provider
    /// reported none: the streamed deltas counted, and `prompt` (the
    /// request's estimate, [`iop_proto::usage::estimate_input_tokens`])
    /// when the provider took the prompt in (`prompt_spent`). `None` when
    /// the provider reported its own (already sent) or there is nothing to
    /// charge.
    pub fn unreported(&self, prompt: u64, prompt_spent: bool) -> Option<pb::Usage> {
        match self.reported {
            Some(_) => None,
            None => unreported(prompt, prompt_spent, self.deltas),
        }
    }
}

/// The usage of an execution whose provider reported none: `deltas`
/// counted, and `prompt` (the request's estimate) when the provider took
/// the prompt in (`prompt_spent`). `None` when there is nothing to charge.
pub fn unreported(prompt: u64, prompt_spent: bool, deltas: u64) -> Option<pb::Usage> {
    let prompt = if prompt_spent { prompt } else { 0 };
    if prompt == 0 && deltas == 0 {
        return None;
    }
    let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    Some(pb::Usage {
        prompt_tokens: clamp(prompt),
        completion_tokens: clamp(deltas),
        reasoning_tokens: 0,
        prompt_source: pb::UsageSource::Estimated.into(),
        completion_source: pb::UsageSource::Counted.into(),
    })
}

/// Leaves the usage chunk the Edge asked for (and the client did not) out
/// of a relayed Chat Completions stream: the `data:` line whose chunk has
/// no choices and a usage, and the blank line ending its event. Every
/// other byte passes unchanged, a line at a time (a partial line waits for
/// its end, or passes once longer than [`MAX_KEPT`]: a usage chunk is
/// small).
#[derive(Debug, Default)]
pub struct UsageChunkFilter {
    partial: Vec<u8>,
    /// The partial line is passing unread (it outgrew [`MAX_KEPT`]).
    passing: bool,
    /// The event's `data:` line was left out: leave out its blank line too.
    dropped: bool,
}

impl UsageChunkFilter {
    /// What of `chunk` is relayed now.
    pub fn push(&mut self, mut chunk: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(chunk.len());
        while let Some(end) = chunk.iter().position(|&b| b == b'\n') {
            let (line, rest) = chunk.split_at(end + 1);
            chunk = rest;
            if std::mem::replace(&mut self.passing, false) {
                out.extend_from_slice(line);
                continue;
            }
            self.partial.extend_from_slice(line);
            let line = std::mem::take(&mut self.partial);
            self.line(line, &mut out);
        }
        if self.passing {
            out.extend_from_slice(chunk);
        } else {
            self.partial.extend_from_slice(chunk);
            if self.partial.len() > MAX_KEPT {
                out.append(&mut self.partial);
                self.passing = true;
            }
        }
        out
    }

    /// What is left once the body ended (a last line without its end).
    pub fn finish(self) -> Vec<u8> {
        self.partial
    }

    fn line(&mut self, line: Vec<u8>, out: &mut Vec<u8>) {
        if std::mem::replace(&mut self.dropped, false) && line.trim_ascii().is_empty() {
            return;
        }
        if is_usage_chunk(&line) {
            self.dropped = true;
            return;
        }
        out.extend_from_slice(&line);
    }
}

/// A Chat Completions stream's usage chunk: `data: {"choices": [], "usage": {...}}`.
fn is_usage_chunk(line: &[u8]) -> bool {
    let Some(data) = line.trim_ascii().strip_prefix(b"data:") else { return false };
    if !mentions_usage(data) {
        return false;
    }
    let Ok(chunk) = serde_json::from_slice::<Value>(data.trim_ascii()) else { return false };
    let no_choices = chunk.get("choices").and_then(Value::as_array).is_some_and(Vec::is_empty);
    no_choices && chunk.get("usage").is_some_and(Value::is_object)
}

fn mentions_usage(bytes: &[u8]) -> bool {
    contains(bytes, b"\"usage\"")
}

fn contains(bytes: &[u8], needle: &[u8]) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests;
