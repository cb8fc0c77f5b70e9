//! How a run's events become an answer: once, for every API.
//!
//! A [`Transcript`] takes run events in order and says what each did to the
//! answer as ordered [`Step`]s: the answer begins, a block opens, grows,
//! closes, the run completes or fails. The three APIs' streaming renderers
//! turn steps into their wire events; their non-streaming aggregators feed
//! the same transcript and render its blocks at the end. So a streamed
//! answer and the same answer in one piece cannot disagree (a property test
//! in `super::fuzz` checks it for all three APIs).
//!
//! One policy for blocks and tool calls:
//! - At most one block is open. Text continues an open text block, or
//!   closes the open block and opens a text block; reasoning the same with
//!   reasoning blocks.
//! - A tool-call piece continues the open tool call when it has the same
//!   run index and no other id; a piece with a new index, or a known index
//!   with a different id, closes the open block and opens a new call.
//! - A piece (no id) for a call whose block is already closed cannot be
//!   placed in a stream that went on (Anthropic blocks cannot be reopened,
//!   Responses items are done): the run fails as a provider protocol error,
//!   streamed or not.
//! - A call's id and name are what its first piece says (the block opened
//!   with them; later pieces add arguments only).
//! - A tool call's arguments must be empty or a JSON object when its block
//!   closes; otherwise the run fails the same way.
//! - Nothing after a terminal (completed, failed, cancelled) counts.

use std::collections::HashMap;

use iop_proto::pb;
use pb::run_event::Event;

use super::error::ApiError;
use super::outcome::{Terminal, failure_of, finish_reason};

/// What a block of the answer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockKind {
    Text,
    /// The model's reasoning, apart from the answer's text.
    Reasoning,
    /// `id` as the provider sent it (empty when it sent none: each API then
    /// makes one in its own format).
    ToolCall {
        id: String,
        name: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub kind: BlockKind,
    /// The text, or the call's arguments (JSON text).
    pub content: String,
}

impl Block {
    pub fn is_tool_call(&self) -> bool {
        matches!(self.kind, BlockKind::ToolCall { .. })
    }
}

/// What one run event did to the answer. A delta borrows its text from
/// the event, so rendering an event allocates nothing here.
#[derive(Debug, Clone, PartialEq)]
pub enum Step<'e> {
    /// The answer began: the first event of a run, unless it is a failure
    /// or a cancel.
    Begin,
    /// Block `i` opened (it is empty).
    Open(usize),
    /// Block `i` grew by this text.
    Delta(usize, &'e str),
    /// Block `i` is complete.
    Close(usize),
    /// The run completed; every block is closed.
    Complete {
        finish_reason: i32,
    },
    Fail(pb::ExecutionFailure),
    Cancel,
}

/// The steps of one event: at most four (begin, close, open, delta), so
/// they stay on the stack.
pub type Steps<'e> = smallvec::SmallVec<[Step<'e>; 4]>;

#[derive(Debug, Default)]
pub struct Transcript {
    blocks: Vec<Block>,
    open: Option<usize>,
    /// Run tool-call index -> the block of its latest call.
    calls: HashMap<u32, usize>,
    usage: Option<pb::Usage>,
    began: bool,
    terminal: Option<Terminal>,
}

impl Transcript {
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    pub fn block(&self, i: usize) -> &Block {
        &self.blocks[i]
    }

    /// Whether block `i` is still being generated.
    pub fn is_open(&self, i: usize) -> bool {
        self.open == Some(i)
    }

    pub fn usage(&self) -> Option<&pb::Usage> {
        self.usage.as_ref()
    }

    /// Every block of `kind`'s content, joined (all text, all reasoning).
    pub fn joined(&self, kind: &BlockKind) -> String {
        self.blocks.iter().filter(|b| b.kind == *kind).map(|b| b.content.as_str()).collect()
    }

    pub fn has_tool_calls(&self) -> bool {
        self.blocks.iter().any(Block::is_tool_call)
    }

    /// Position of tool-call block `i` among the tool calls (OpenAI Chat's
    /// `tool_calls[].index`).
    pub fn tool_ordinal(&self, i: usize) -> usize {
        self.blocks[..i].iter().filter(|b| b.is_tool_call()).count()
    }

    /// The finish reason once the run completed; otherwise the client's
    /// error (the run's failure, its cancellation, or no terminal at all).
    pub fn finish(&mut self) -> Result<i32, ApiError> {
        finish_reason(self.terminal.take())
    }

    pub fn push<'e>(&mut self, event: &'e Event) -> Steps<'e> {
        let mut steps = Steps::new();
        if self.terminal.is_some() {
            return steps;
        }
        if !self.began && !matches!(event, Event::Failed(_) | Event::Cancelled(_)) {
            self.began = true;
            steps.push(Step::Begin);
        }
        match event {
            Event::Started(_) => {}
            Event::Text(t) => self.text(BlockKind::Text, &t.text, &mut steps),
            Event::Reasoning(r) => self.text(BlockKind::Reasoning, &r.text, &mut steps),
            Event::ToolCall(d) => self.tool_call(d, &mut steps),
            Event::Usage(u) => self.usage = Some(*u),
            // An embeddings run's answer is not a chat answer (see
            // `crate::http` embeddings).
            Event::Embeddings(_) => {}
            Event::Completed(c) => {
                self.close(&mut steps);
                if self.terminal.is_none() {
                    self.terminal = Some(Terminal::Completed { finish_reason: c.finish_reason });
                    steps.push(Step::Complete { finish_reason: c.finish_reason });
                }
            }
            Event::Failed(f) => self.fail(failure_of(f), &mut steps),
            Event::Cancelled(c) => {
                self.terminal = Some(Terminal::Cancelled { reason: c.reason });
                steps.push(Step::Cancel);
            }
        }
        steps
    }

    /// Text or reasoning: continues an open block of the same kind.
    fn text<'e>(&mut self, kind: BlockKind, text: &'e str, steps: &mut Steps<'e>) {
        if text.is_empty() {
            return;
        }
        let i = match self.open {
            Some(i) if self.blocks[i].kind == kind => i,
            _ => match self.open_block(kind, steps) {
                Some(i) => i,
                None => return,
            },
        };
        self.blocks[i].content.push_str(text);
        steps.push(Step::Delta(i, text));
    }

    fn tool_call<'e>(&mut self, d: &'e pb::ToolCallDelta, steps: &mut Steps<'e>) {
        let known = self.calls.get(&d.index).copied();
        let same_call = |block: &Block| match &block.kind {
            BlockKind::ToolCall { id, .. } => d.id.is_empty() || d.id == *id,
            BlockKind::Text | BlockKind::Reasoning => false,
        };
        let i = match known {
            Some(i) if self.open == Some(i) && same_call(&self.blocks[i]) => i,
            Some(i) if same_call(&self.blocks[i]) => {
                let message = "the provider sent a piece of a tool call after the call's block had closed";
                self.fail(pb::ExecutionFailure::new(pb::FailureKind::ProviderProtocol, message), steps);
                return;
            }
            _ => {
                let kind = BlockKind::ToolCall { id: d.id.clone(), name: d.name.clone() };
                let Some(i) = self.open_block(kind, steps) else { return };
                self.calls.insert(d.index, i);
                i
            }
        };
        if !d.arguments_delta.is_empty() {
            self.blocks[i].content.push_str(&d.arguments_delta);
            steps.push(Step::Delta(i, &d.arguments_delta));
        }
    }

    /// Closes the open block and opens a new one; `None` if closing failed
    /// the run.
    fn open_block(&mut self, kind: BlockKind, steps: &mut Steps<'_>) -> Option<usize> {
        self.close(steps);
        if self.terminal.is_some() {
            return None;
        }
        self.blocks.push(Block { kind, content: String::new() });
        let i = self.blocks.len() - 1;
        self.open = Some(i);
        steps.push(Step::Open(i));
        Some(i)
    }

    /// Closes the open block; a tool call whose arguments are not a JSON
    /// object fails the run instead.
    fn close(&mut self, steps: &mut Steps<'_>) {
        let Some(i) = self.open else { return };
        let block = &self.blocks[i];
        if let BlockKind::ToolCall { name, .. } = &block.kind
            && !arguments_are_an_object(&block.content)
        {
            let message = format!("the provider returned arguments for tool `{name}` that are not a JSON object");
            self.fail(pb::ExecutionFailure::new(pb::FailureKind::ProviderProtocol, message), steps);
            return;
        }
        self.open = None;
        steps.push(Step::Close(i));
    }

    /// Ends the run as failed; the open block (if any) stays open, so an
    /// API can show it as incomplete.
    fn fail(&mut self, failure: pb::ExecutionFailure, steps: &mut Steps<'_>) {
        self.terminal = Some(Terminal::Failed(failure.clone()));
        steps.push(Step::Fail(failure));
    }
}

/// The id each tool-call block goes by in one answer: the provider's, or
/// one made up once (in the API's own format) when it sent none.
#[derive(Debug, Default)]
pub struct CallIds(std::collections::BTreeMap<usize, String>);

impl CallIds {
    pub fn of(&mut self, transcript: &Transcript, i: usize, make_up: fn() -> String) -> String {
        let provider = match &transcript.block(i).kind {
            BlockKind::ToolCall { id, .. } => id.as_str(),
            BlockKind::Text | BlockKind::Reasoning => "",
        };
        self.0.entry(i).or_insert_with(|| if provider.is_empty() { make_up() } else { provider.to_string() }).clone()
    }
}

fn arguments_are_an_object(arguments: &str) -> bool {
    arguments.trim().is_empty() || matches!(serde_json::from_str(arguments), Ok(serde_json::Value::Object(_)))
}

/// A tool call's arguments as a JSON object (`{}` when there are none).
/// The transcript refused any other arguments when the block closed.
pub fn arguments_object(arguments: &str) -> serde_json::Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| serde_json::json!({}))
}

#[cfg(test)]
mod tests;
