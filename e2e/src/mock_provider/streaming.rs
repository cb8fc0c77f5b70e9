//! A streamed reply on the wire: the chunk-level fault knobs scheduled over
//! its rendered [`Part`]s (delays, `stall_after`, `cut_after`, malformed
//! chunks, `end_delay_ms`), and the lazily produced body that plays the
//! schedule and counts a stream as completed or aborted.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::{Body, Bytes};

use super::faults::{Faults, on};
use super::plan::Part;
use super::state::{AppState, Counters};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    Send(Bytes),
    Delay(Duration),
    /// Send nothing more until the server shuts down.
    Stall,
    /// End the body with an error (abnormal end on the wire).
    Cut,
}

/// Applies the chunk-level knobs to the rendered parts.
pub(super) fn schedule(parts: Vec<Part>, faults: &Faults, malformed: Bytes) -> VecDeque<Step> {
    let mut steps = VecDeque::new();
    let mut sent = 0usize;
    for part in parts {
        match part {
            Part::Lead(bytes) => steps.push_back(Step::Send(bytes)),
            Part::Content(bytes) => {
                if let Some(stop) = interruption(faults, sent, false) {
                    steps.push_back(stop);
                    return steps;
                }
                let delay = if sent == 0 { faults.first_token_delay_ms } else { faults.chunk_delay_ms };
                if let Some(ms) = delay.filter(|ms| *ms > 0) {
                    steps.push_back(Step::Delay(Duration::from_millis(ms)));
                }
                sent += 1;
                let bytes = if faults.malformed(sent) { malformed.clone() } else { bytes };
                steps.push_back(Step::Send(bytes));
            }
            Part::Tail(bytes) => {
                if let Some(stop) = interruption(faults, sent, true) {
                    steps.push_back(stop);
                    return steps;
                }
                if on(faults.malformed_end) {
                    steps.push_back(Step::Send(malformed));
                    return steps;
                }
                steps.push_back(Step::Send(bytes));
            }
        }
    }
    if let Some(ms) = faults.end_delay_ms.filter(|ms| *ms > 0) {
        steps.push_back(Step::Delay(Duration::from_millis(ms)));
    }
    steps
}

/// Stall or cut once `sent` content chunks are out; at the tail a set knob
/// always applies (the reply was shorter than N).
fn interruption(faults: &Faults, sent: usize, at_tail: bool) -> Option<Step> {
    let reached = |after: Option<usize>| after.is_some_and(|n| at_tail || sent >= n);
    if reached(faults.stall_after) {
        Some(Step::Stall)
    } else if reached(faults.cut_after) {
        Some(Step::Cut)
    } else {
        None
    }
}

/// The error that aborts a body for `cut_after`. It is returned one scheduler
/// turn late: hyper flushes what it has buffered while the body is pending,
/// whereas a body error closes the connection and discards unflushed bytes.
pub(super) async fn cut_error() -> io::Result<Bytes> {
    tokio::task::yield_now().await;
    Err(io::Error::other("cut_after fault"))
}

/// Counts a streaming body as completed once the mock produced all of it,
/// or as aborted if it is dropped before that (the client went away).
struct StreamGuard {
    counters: Arc<Counters>,
    finished: bool,
}

impl StreamGuard {
    fn finish(&mut self) {
        if !self.finished {
            self.finished = true;
            self.counters.completed_streams.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.counters.aborted_streams.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The state of a lazily produced streaming body.
pub(super) struct BodyScript {
    steps: VecDeque<Step>,
    guard: StreamGuard,
    state: AppState,
}

impl BodyScript {
    pub(super) fn new(steps: VecDeque<Step>, state: &AppState) -> Self {
        BodyScript {
            steps,
            guard: StreamGuard { counters: state.counters.clone(), finished: false },
            state: state.clone(),
        }
    }

    pub(super) fn into_body(self) -> Body {
        Body::from_stream(futures_util::stream::unfold(self, BodyScript::next))
    }

    async fn next(mut self) -> Option<(io::Result<Bytes>, Self)> {
        loop {
            let Some(step) = self.steps.pop_front() else {
                self.guard.finish();
                return None;
            };
            match step {
                Step::Delay(delay) => tokio::time::sleep(delay).await,
                Step::Send(bytes) => {
                    self.guard.counters.stream_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    if self.steps.is_empty() {
                        self.guard.finish();
                    }
                    return Some((Ok(bytes), self));
                }
                Step::Stall => {
                    self.state.until_stopping().await;
                    self.guard.finish();
                    let error = io::Error::other("mock provider shut down during a stall");
                    return Some((Err(error), self));
                }
                Step::Cut => {
                    self.guard.finish();
                    return Some((cut_error().await, self));
                }
            }
        }
    }
}
