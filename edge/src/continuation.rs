//! Mid-stream continuation: a committed streaming answer whose run breaks
//! after text goes on, in the same client stream, on a provider that
//! continues a prefilled assistant turn (`providers[].continuation`).
//!
//! The client has already been sent part of the answer, so the gate's
//! replay (`crate::gate`, before the commit point only) cannot help; a
//! continuation sends the original request again with the text sent so far
//! appended as the final assistant message (the prefill) and splices the
//! new run's events into the same stream. The splice sits below the three
//! APIs' streamers (it replaces the committed run as their event source), so
//! the client sees one answer in every API: one id, one message, its text
//! block still open (Anthropic block indexes and Responses output indexes
//! go on), one role chunk (Chat).
//!
//! What is continued ([`Splice::on_break`]): a break the gate would retry
//! before the commit (`retry::retryable`: cut, reset, stall, unreachable,
//! provider error status, node connection lost) after the answer has text,
//! while it is plain text: an answer with a tool call, or inside a
//! reasoning block, ends with the API's error event as before (a partial
//! answer is never presented as complete). So does a break with no capable
//! provider, past `limits.max_continuations`, past the request deadline, or
//! when the continuation itself fails before its first content.
//!
//! What the splice changes in the continuing run's events ([`Splice::pass`]):
//! - its `Started` is dropped (the answer started already);
//! - its reasoning is dropped: the answer being continued is text, and a
//!   reasoning block after text is not an answer any API shows;
//! - a repeat of the prefill at the start of its text is dropped: llama.cpp's
//!   server answers a prefilled turn with the prefill and then the
//!   continuation (Ollama sends only the continuation). Text that matches
//!   the prefill so far is held back; once it holds the whole prefill, that
//!   is dropped and the rest passes; as soon as it departs from it, all of it
//!   passes (it was the continuation). Held text that is still a part of
//!   the prefill when anything but text comes is dropped as a repeat;
//! - usage is reported once for the whole answer, the sum over its runs
//!   (what the Edge charges: each run is charged its own, however it
//!   ended; a broken run's is the node's count when its provider reported
//!   none): every prompt the providers read (a continuation's includes the
//!   prefilled answer) and every token they generated, reasoning a
//!   continuation dropped included;
//! - text, tool calls and the terminal pass as they come.
//!
//! The broken run is finished (its slot and lease released by its own
//! terminal) before the continuation is admitted, through `gate::execute`
//! like any request: its own lease and slot, its pre-commit retries,
//! restricted to continuation providers of the same public model, the
//! broken provider tried last, within what is left of the deadline.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use iop_proto::config::{EdgeConfig, ProviderEntry};
use iop_proto::pb::{self, run_event::Event};

use crate::auth::Caller;
use crate::gate::{self, Answer, CommitPoint, LiveRun};
use crate::ingress::error::ApiError;
use crate::ingress::transcript::{BlockKind, Transcript};
use crate::metrics::RecoveryLabels;
use crate::state::EdgeState;

/// Why a break was not continued (the metric's other label values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotContinued {
    /// The failure is one the gate would not retry either (deadline,
    /// invalid request, answer too large, ...).
    NotRetryable,
    /// No text yet, a tool call, or inside a reasoning block.
    NotText,
    /// `limits.max_continuations` reached.
    Limit,
    /// No provider of the model declares `continuation: true`, or none
    /// was eligible.
    NoCapableProvider,
    /// The continuation failed before its first content.
    Failed,
}

impl NotContinued {
    pub fn label(self) -> &'static str {
        match self {
            Self::NotRetryable => "not_retryable",
            Self::NotText => "not_text",
            Self::Limit => "limit",
            Self::NoCapableProvider => "no_capable_provider",
            Self::Failed => "failed",
        }
    }
}

/// The label of a break that was continued.
pub const CONTINUED: &str = "continued";

/// What the client was sent of the answer so far, and the usage across
/// runs. Pure: events in, events out.
#[derive(Debug, Default)]
pub struct Splice {
    transcript: Transcript,
    /// Continuations so far.
    continuations: u32,
    /// The usage of the runs before the current one, summed.
    before: pb::Usage,
    /// The current run's latest usage.
    now: pb::Usage,
    /// The prefill the continuing run may repeat first, and what of its
    /// text is held back as matching it so far.
    echo: Option<(String, String)>,
}

impl Splice {
    /// The event the client gets for `event` of the current run, if any.
    pub fn pass(&mut self, event: Event) -> Option<Event> {
        let event = match event {
            Event::Started(_) | Event::Reasoning(_) if self.continuations > 0 => return None,
            Event::Text(t) if self.echo.is_some() => Event::Text(pb::TextDelta { text: self.unrepeated(t.text)? }),
            Event::Usage(u) => {
                self.now = u;
                Event::Usage(self.before.plus(&u))
            }
            // Anything else ends a repeat: what was held of it is dropped.
            event => {
                self.echo = None;
                event
            }
        };
        if !matches!(event, Event::Failed(_) | Event::Cancelled(_) | Event::Completed(_)) {
            self.transcript.push(&event);
        }
        Some(event)
    }

    /// The continuing run's text past a repeat of the prefill, if any yet.
    fn unrepeated(&mut self, text: String) -> Option<String> {
        let (prefill, held) = self.echo.as_mut()?;
        held.push_str(&text);
        if held.len() >= prefill.len() {
            let (prefill, held) = self.echo.take()?;
            let rest = held.strip_prefix(prefill.as_str()).map_or(held.clone(), str::to_string);
            return (!rest.is_empty()).then_some(rest);
        }
        if prefill.starts_with(held.as_str()) {
            return None;
        }
        self.echo.take().map(|(_, held)| held)
    }

    /// Whether a run that failed with `failure` is continued: the prefill
    /// (the answer's text so far), or why not.
    pub fn on_break(&self, failure: &pb::ExecutionFailure, max: u32) -> Result<String, NotContinued> {
        if !crate::retry::retryable(failure) {
            return Err(NotContinued::NotRetryable);
        }
        let blocks = self.transcript.blocks();
        let in_reasoning =
            blocks.last().is_some_and(|b| b.kind == BlockKind::Reasoning && self.transcript.is_open(blocks.len() - 1));
        let text = self.transcript.joined(&BlockKind::Text);
        if text.is_empty() || self.transcript.has_tool_calls() || in_reasoning {
            return Err(NotContinued::NotText);
        }
        if self.continuations >= max {
            return Err(NotContinued::Limit);
        }
        Ok(text)
    }

    /// A continuation committed with `prefill` (the final assistant
    /// message it was sent): its events are the current run's now.
    pub fn continued(&mut self, prefill: &str) {
        self.echo = (!prefill.is_empty()).then(|| (prefill.to_string(), String::new()));
        self.continuations += 1;
        self.before = self.before.plus(&std::mem::take(&mut self.now));
    }
}

/// `request` with `text` as the answer's prefill: appended to the request's
/// own final assistant message (a client's prefill, which the answer
/// already continued), else as a new final assistant message. Pure.
pub fn with_prefill(mut request: pb::RunRequest, text: &str) -> pb::RunRequest {
    match request.messages.last_mut() {
        Some(last) if last.role() == pb::Role::Assistant && last.tool_calls.is_empty() => {
            last.content.push_str(text);
        }
        _ => request.messages.push(pb::ChatMessage {
            role: pb::Role::Assistant.into(),
            content: text.to_string(),
            ..Default::default()
        }),
    }
    request
}

/// Whether any provider of `model` continues prefills (`continues`, which
/// reads the config and what the nodes detected:
/// `residency::ResidencyTable::continues`) and continuations are allowed
/// at all. Pure.
pub fn capable(config: &EdgeConfig, model: &str, continues: impl Fn(&ProviderEntry) -> bool) -> bool {
    config.limits.max_continuations > 0
        && crate::route::candidates(config, model).is_some_and(|providers| providers.iter().any(|p| continues(p)))
}

/// What a continuation needs to run a streaming request again.
pub struct Again {
    state: Arc<EdgeState>,
    caller: Caller,
    model: String,
    /// Kept only when the route could continue (a copy of the request
    /// costs memory): otherwise a break counts as `no_capable_provider`.
    request: Option<pb::RunRequest>,
    max: u32,
    /// The request's span: a continuation's is its child.
    trace: Option<iop_telemetry::SpanContext>,
}

impl Again {
    /// For a streaming request of `caller` for `model`, under the config
    /// it was admitted with.
    pub fn new(state: &Arc<EdgeState>, caller: &Caller, model: &str, request: &pb::RunRequest) -> Self {
        let config = state.config.current();
        Self {
            state: state.clone(),
            caller: caller.clone(),
            model: model.to_string(),
            request: capable(&config, model, |p| state.routing.residency.continues(&state.registry, p))
                .then(|| request.clone()),
            max: config.limits.max_continuations,
            trace: None,
        }
    }

    /// Continuations are traced under `parent` (the request's span).
    pub fn traced(mut self, parent: Option<iop_telemetry::SpanContext>) -> Self {
        self.trace = parent;
        self
    }
}

/// A committed answer's events for the client: the events buffered before
/// the commit, then the live run, continued on a break when it may be.
pub struct Source {
    pending: VecDeque<Event>,
    live: Option<LiveRun<pb::RunEvent>>,
    splice: Splice,
    again: Option<Again>,
    /// Providers whose runs broke in this answer: tried last.
    broken: HashMap<String, bool>,
    /// The provider answering now (kept after its run ended, for the
    /// failed-stream log line).
    provider: Option<String>,
}

impl Source {
    pub fn new(buffered: Vec<Event>, live: Option<LiveRun<pb::RunEvent>>, again: Option<Again>) -> Self {
        let provider = live.as_ref().map(|l| l.provider_id().to_string());
        Self { pending: buffered.into(), live, splice: Splice::default(), again, broken: HashMap::new(), provider }
    }

    /// The next event for the client; `None` after the terminal.
    pub async fn next(&mut self) -> Option<Event> {
        loop {
            let event = match self.pending.pop_front() {
                Some(event) => event,
                None => self.live.as_mut()?.next().await?,
            };
            if let Event::Failed(failed) = &event
                && let Some(again) = &self.again
            {
                let failure = failed.failure.clone().unwrap_or_default();
                match self.splice.on_break(&failure, again.max) {
                    Err(why) => {
                        // A failure no continuation could help is no break.
                        if why != NotContinued::NotRetryable {
                            count(again, why.label());
                            let provider = self.live.as_ref().map_or("-", LiveRun::provider_id);
                            tracing::info!(
                                broken = %provider,
                                model = %again.model,
                                result = why.label(),
                                "a stream broke and was not continued"
                            );
                        }
                    }
                    Ok(prefill) => {
                        if self.continue_with(&prefill).await {
                            continue;
                        }
                    }
                }
                self.live = None;
                return Some(event);
            }
            if let Some(event) = self.splice.pass(event) {
                return Some(event);
            }
        }
    }

    /// Admits and commits the continuation; whether it did.
    async fn continue_with(&mut self, prefill: &str) -> bool {
        let (Some(again), Some(live)) = (&self.again, self.live.take()) else { return false };
        let broken = live.provider_id().to_string();
        let Some(original) = &again.request else {
            count(again, NotContinued::NoCapableProvider.label());
            tracing::info!(broken = %broken, model = %again.model, result = "no_capable_provider", "a stream broke after text and was not continued");
            return false;
        };
        let deadline = live.deadline();
        // The broken run ended with its failure: its slot is free already.
        drop(live);
        self.broken.insert(broken.clone(), true);
        let request = with_prefill(original.clone(), prefill);
        let sent = request.messages.last().map(|m| m.content.clone()).unwrap_or_default();
        let scope = gate::Scope { deadline: Some(deadline), continuation_only: true, avoid: self.broken.clone() };
        let mut span = again.state.tracer.start("continuation", iop_telemetry::Kind::Internal, again.trace);
        span.set("iop.continuation", u64::from(self.splice.continuations) + 1);
        let execution = gate::execute_in(
            &again.state,
            &again.caller,
            &again.model,
            request,
            None,
            CommitPoint::FirstContent,
            scope,
        );
        let committed = crate::trace::scope(span.context(), execution).await;
        let result = match &committed {
            Ok(gate::Committed { answer: Answer::Normalized { .. }, .. }) => CONTINUED,
            Ok(_) => NotContinued::Failed.label(),
            Err(ApiError::NoProviderAvailable(_) | ApiError::ModelNotFound(_)) => {
                NotContinued::NoCapableProvider.label()
            }
            Err(_) => NotContinued::Failed.label(),
        };
        span.set("iop.continuation.result", result);
        if result != CONTINUED {
            span.fail(result);
        }
        drop(span);
        match committed {
            Ok(gate::Committed { answer: Answer::Normalized { buffered, rest }, .. }) => {
                let provider = rest.as_ref().map_or("-", LiveRun::provider_id).to_string();
                self.splice.continued(&sent);
                count(again, CONTINUED);
                tracing::info!(
                    broken = %broken,
                    provider = %provider,
                    model = %again.model,
                    continuation = self.splice.continuations,
                    prefill_chars = prefill.chars().count(),
                    "continued a stream that broke after text"
                );
                self.pending.extend(buffered);
                self.provider = rest.as_ref().map(|l| l.provider_id().to_string());
                self.live = rest;
                true
            }
            Ok(gate::Committed { answer: Answer::Tunnel { .. }, .. }) => {
                count(again, NotContinued::Failed.label());
                false
            }
            Err(error) => {
                let why = match error {
                    ApiError::NoProviderAvailable(_) | ApiError::ModelNotFound(_) => NotContinued::NoCapableProvider,
                    _ => NotContinued::Failed,
                };
                count(again, why.label());
                tracing::info!(
                    broken = %broken,
                    model = %again.model,
                    result = why.label(),
                    code = error.code(),
                    "a stream broke after text and was not continued"
                );
                false
            }
        }
    }

    /// The provider answering (or the last one that did).
    pub fn provider_id(&self) -> Option<&str> {
        self.provider.as_deref()
    }

    /// Gives up on the live run (see [`LiveRun::stop`]).
    pub fn stop(&mut self, reason: crate::core::lease::ReleaseReason) {
        self.pending.clear();
        if let Some(live) = self.live.take() {
            live.stop(reason);
        }
    }
}

fn count(again: &Again, result: &'static str) {
    again.state.metrics.continuations.get_or_create(&RecoveryLabels { result }).inc();
}

#[cfg(test)]
mod tests;
