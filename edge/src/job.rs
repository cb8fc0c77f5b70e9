//! Single-request jobs: a client request with `iop-workspace: <ref>` makes
//! the model plan, work in the workspace through bounded tools, review its
//! work (and repair it), and answer.
//!
//! The admission (`crate::workspace::admit`) has frozen the owner node, its
//! ready generation and the authority before this starts; nothing is
//! re-selected later. Each model turn goes through the ordinary gate
//! (routing, admission, pre-first-byte retries, leases); each tool call
//! goes over the request's workspace call, one at a time. What happens next
//! is decided by the pure state graph in [`state`]. After the workspace
//! opened, every ending (success, failure, cancel) runs exactly one cleanup
//! before the answer leaves: a failed cleanup turns success into a failure,
//! a cancellation stays a cancellation.
//!
//! The job runs on its own task ([`spawn`]); the client's request holds a
//! handle whose drop (the client went away) cancels the job, which then
//! cancels its pending tool (a command's process group dies) and cleans up
//! before it ends.
//!
//! A revocation ends a job the same way: its caller is judged again
//! ([`standing`]) on every reload, when its key expires and before each
//! model turn and tool call; once it no longer may run in the workspace,
//! the job is cancelled, cleans up, and answers the typed error.

pub mod prompts;
pub mod slots;
pub mod standing;
pub mod state;
pub mod tools;

use std::sync::Arc;
use std::time::{Duration, Instant};

use iop_proto::pb::{self, run_event::Event};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::gate::{self, Answer, CommitPoint, Committed};
use crate::ingress::error::ApiError;
use crate::ingress::openai_chat::{CompletionAggregator, ResponseMeta};
use crate::metrics::{ResultLabels, StageLabels, StateLabels, ToolLabels};
use crate::state::EdgeState;
use crate::workspace::{self, Admitted, WorkspaceCall, WorkspaceError};
use standing::{Revocation, Standing};
use state::{Job, JobEvent, JobFailure, JobState, Pending, Stage, StageBudget, StagePlan};

/// How long the Edge waits for the node's cleanup of a job (it first waits
/// for a cancelled command's process group to end).
const CLEANUP_WAIT: Duration = Duration::from_secs(30);

/// What a job is asked to do.
pub struct JobSpec {
    pub id: String,
    /// Who asked: every model turn is theirs (their model list applies to a
    /// context fallback too).
    pub caller: crate::auth::Caller,
    /// The public model every turn runs on.
    pub model: String,
    /// The client's request, normalized: its messages and options.
    pub request: pb::RunRequest,
    pub admitted: Admitted,
    /// Its share of the workspace's and the principal's job limits, held
    /// until the job's task ends (after its cleanup).
    pub slot: slots::JobSlot,
}

/// How a job ended for its client.
#[derive(Debug)]
pub enum JobError {
    Failed(JobFailure),
    /// A model turn failed the way a plain request would (the provider's
    /// own error reaches the client).
    Model(ApiError),
    Cancelled,
    /// Its caller may no longer run jobs in `workspace`; the job was
    /// cancelled.
    Revoked {
        reason: Revocation,
        workspace: String,
    },
}

impl From<JobError> for ApiError {
    fn from(e: JobError) -> Self {
        match e {
            JobError::Failed(failure) => ApiError::Job(failure),
            JobError::Model(e) => e,
            // The door's own answer for the key now.
            JobError::Revoked { reason: Revocation::Key(failure), .. } => ApiError::Unauthenticated(failure),
            JobError::Revoked { reason: Revocation::GrantRemoved | Revocation::WorkspaceRemoved, workspace } => {
                ApiError::WorkspaceRevoked(workspace)
            }
            // Nobody is listening any more.
            JobError::Cancelled => ApiError::Internal,
        }
    }
}

/// Starts the job on its own task. The returned future resolves to the
/// answer as the gate would commit it; dropping it cancels the job.
pub fn spawn(
    state: Arc<EdgeState>,
    spec: JobSpec,
) -> impl std::future::Future<Output = Result<Committed, ApiError>> + Send + 'static {
    let cancel = CancellationToken::new();
    let stop_on_drop = cancel.clone().drop_guard();
    // The job's runs are traced under the request's span (`crate::trace`).
    let task = tokio::spawn(crate::trace::scope(crate::trace::current(), run(state, spec, cancel)));
    async move {
        let _stop_on_drop = stop_on_drop;
        match task.await {
            Ok(result) => result.map_err(ApiError::from),
            Err(_) => Err(ApiError::Internal),
        }
    }
}

/// Runs a job to its end, cleanup included.
pub async fn run(state: Arc<EdgeState>, spec: JobSpec, cancel: CancellationToken) -> Result<Committed, JobError> {
    let wall_clock =
        Instant::now() + Duration::from_millis(spec.admitted.authority.limits.map_or(0, |l| l.wall_clock_ms));
    let standing = Standing::new(&state.config, &spec.caller, &spec.admitted.reference);
    // Polled beside the work until the cleanup: cancels the job when its
    // caller is revoked.
    let mut watch = std::pin::pin!(standing.watch(&cancel));
    let opened = tokio::select! {
        _ = cancel.cancelled() => Err(JobError::Cancelled),
        opened = tokio::time::timeout_at(wall_clock.into(), open(&state, &spec)) => match opened {
            Ok(result) => result.map_err(|e| JobError::Failed(open_failure(e))),
            Err(_) => Err(JobError::Failed(JobFailure::WallClock)),
        },
        never = &mut watch => match never {},
    };
    let (call, effective) = match opened {
        Ok(opened) => opened,
        Err(e) => return Err(terminal(&state, &spec.id, revoked_or(&standing, &spec, e))),
    };
    let mut driver = Driver {
        state: &state,
        spec: &spec,
        standing: &standing,
        call,
        authority: effective,
        job: Job::new(StagePlan {
            plan: spec.admitted.stages.plan,
            review: spec.admitted.stages.review,
            max_repairs: spec.admitted.stages.max_repairs,
        }),
        conversation: conversation(&spec.request),
        usage: pb::Usage::default(),
        target_model: spec.model.clone(),
        tool_calls: 0,
        wall_clock,
        current: None,
    };
    let outcome = tokio::select! {
        biased;
        outcome = driver.drive(&cancel) => outcome,
        never = &mut watch => match never {},
    };
    let Driver { call, usage, target_model, .. } = driver;
    let cleaned = match tokio::time::timeout(CLEANUP_WAIT, call.cleanup()).await {
        Ok(Ok(response)) => workspace::cleanup_label(response.status),
        Ok(Err(e)) => e.label(),
        Err(_) => "timed_out",
    };
    state.metrics.job_cleanups.get_or_create(&ResultLabels { result: cleaned }).inc();
    let cleanup_ok = matches!(cleaned, "cleaned" | "nothing_to_clean");
    let outcome = match outcome {
        Ok(_) if !cleanup_ok => Err(JobError::Failed(JobFailure::CleanupFailed)),
        other => other,
    };
    let answer = outcome.map(|text| answer(target_model, text, usage));
    match answer {
        Ok(committed) => {
            count_terminal(&state, &spec.id, &JobState::Completed);
            Ok(committed)
        }
        Err(e) => Err(terminal(&state, &spec.id, revoked_or(&standing, &spec, e))),
    }
}

/// A job that ended without its answer because its caller was revoked
/// ends revoked, whatever else it saw: the same reload that revokes may
/// also close the node's session (a removed workspace), which the job can
/// notice first. Judged once more here for that.
fn revoked_or(standing: &Standing, spec: &JobSpec, e: JobError) -> JobError {
    // Records a revocation not seen yet (once revoked, stays revoked).
    standing.holds();
    match standing.revocation() {
        Some(reason) => JobError::Revoked { reason, workspace: spec.admitted.reference.clone() },
        None => e,
    }
}

/// Counts a job's ending (once per job) and passes its error on.
fn terminal(state: &EdgeState, id: &str, e: JobError) -> JobError {
    let ended = match &e {
        JobError::Cancelled | JobError::Revoked { .. } => JobState::Cancelled,
        JobError::Failed(failure) => JobState::Failed(*failure),
        JobError::Model(_) => JobState::Failed(JobFailure::ModelFailed),
    };
    if let JobError::Revoked { reason, .. } = &e {
        state.metrics.reason(&state.metrics.job_revoked, reason.label());
        tracing::info!(job = id, reason = reason.label(), "job revoked: its caller may no longer run it");
    }
    count_terminal(state, id, &ended);
    e
}

/// The job's one terminal count and log line (its id, state and closed
/// reason; never a tool, argument, path or result).
fn count_terminal(state: &EdgeState, id: &str, ended: &JobState) {
    state.metrics.job_terminals.get_or_create(&StateLabels { state: ended.label() }).inc();
    match ended {
        JobState::Failed(failure) => {
            tracing::info!(job = id, state = ended.label(), reason = failure.label(), "job ended")
        }
        _ => tracing::info!(job = id, state = ended.label(), "job ended"),
    }
}

async fn open(state: &EdgeState, spec: &JobSpec) -> Result<(WorkspaceCall, pb::WorkspaceAuthority), WorkspaceError> {
    let mut call = WorkspaceCall::start(state, &spec.admitted, &spec.id).await?;
    let effective = call.open(&spec.admitted.reference, &spec.admitted.authority).await?;
    Ok((call, effective))
}

fn open_failure(e: WorkspaceError) -> JobFailure {
    match e {
        WorkspaceError::Fenced | WorkspaceError::NodeNotReady | WorkspaceError::CallEnded => JobFailure::WorkspaceLost,
        WorkspaceError::UnknownWorkspace
        | WorkspaceError::AttachTimeout
        | WorkspaceError::OpenRefused(_)
        | WorkspaceError::Protocol => JobFailure::WorkspaceOpenFailed,
    }
}

/// The job's system message, then the client's conversation.
fn conversation(request: &pb::RunRequest) -> Vec<pb::ChatMessage> {
    std::iter::once(message(pb::Role::System, prompts::SYSTEM.into())).chain(request.messages.iter().cloned()).collect()
}

/// The final answer as the gate would have committed it: the finalizing
/// text and the usage summed over every model turn.
fn answer(target_model: String, text: String, usage: pb::Usage) -> Committed {
    let events = vec![
        Event::Started(pb::RunStarted { model: target_model.clone(), ..Default::default() }),
        Event::Text(pb::TextDelta { text }),
        Event::Usage(usage),
        Event::Completed(pb::RunCompleted { finish_reason: pb::FinishReason::Stop.into() }),
    ];
    Committed { target_model, answer: Answer::Normalized { buffered: events, rest: None }, context_window: None }
}

/// One model turn's answer.
struct Turn {
    text: String,
    /// (the model's id, name, arguments JSON), in order.
    tool_calls: Vec<(String, String, String)>,
}

struct Driver<'a> {
    state: &'a Arc<EdgeState>,
    spec: &'a JobSpec,
    /// Judged before each model turn and tool call.
    standing: &'a Standing<'a>,
    call: WorkspaceCall,
    /// What the node granted.
    authority: pb::WorkspaceAuthority,
    job: Job,
    conversation: Vec<pb::ChatMessage>,
    usage: pb::Usage,
    target_model: String,
    /// Tool calls so far (numbers the job's own call ids).
    tool_calls: u64,
    wall_clock: Instant,
    current: Option<Visit>,
}

impl Driver<'_> {
    /// Runs the state graph to a terminal; the finalizing text on success.
    async fn drive(&mut self, cancel: &CancellationToken) -> Result<String, JobError> {
        self.apply(JobEvent::Opened);
        let limits = self.authority.limits.unwrap_or_default();
        let stage_timeout = Duration::from_millis(self.spec.admitted.stages.stage_timeout_ms);
        let mut visits = 0u32;
        let mut answer = String::new();
        loop {
            let stage = match self.job.state().clone() {
                JobState::InStage(stage) => stage,
                JobState::Completed => return Ok(answer),
                JobState::Failed(failure) => return Err(JobError::Failed(failure)),
                JobState::Cancelled => return Err(JobError::Cancelled),
                // Every event that leaves these is applied where it happens.
                JobState::Accepted | JobState::InternalTool { .. } => {
                    self.apply(JobEvent::Failed(JobFailure::Internal));
                    continue;
                }
            };
            if self.current.as_ref().is_none_or(|visit| visit.stage != stage) {
                self.end_visit();
                visits += 1;
                let now = Instant::now();
                let budget = StageBudget::new(
                    limits.max_iterations,
                    limits.max_output_bytes,
                    stage_timeout,
                    self.wall_clock,
                    now,
                );
                self.current = Some(Visit { stage, id: format!("{}-{visits}", stage.label()), budget, started: now });
                let instruction =
                    prompts::instruction(stage, &self.spec.admitted.stages.prompts, self.job.review_notes());
                self.conversation.push(message(pb::Role::User, instruction));
            }
            if !self.standing.holds() {
                cancel.cancel();
                self.apply(JobEvent::Cancelled);
                continue;
            }
            let visit = self.current.as_mut().expect("set above");
            if let Err(failure) = visit.budget.take_turn(Instant::now()) {
                self.apply(JobEvent::Failed(failure));
                continue;
            }
            let budget = visit.budget;
            let turn = tokio::select! {
                _ = cancel.cancelled() => Err(JobError::Cancelled),
                turn = tokio::time::timeout(budget.remaining(Instant::now()), self.model_turn(stage)) => match turn {
                    Ok(turn) => turn,
                    Err(_) => Err(JobError::Failed(budget.timed_out())),
                },
            };
            let turn = match turn {
                Ok(turn) => turn,
                Err(JobError::Model(e)) => {
                    self.apply(JobEvent::Failed(JobFailure::ModelFailed));
                    return Err(JobError::Model(e));
                }
                Err(JobError::Failed(failure)) => {
                    self.apply(JobEvent::Failed(failure));
                    continue;
                }
                // A revocation is told apart after the job ends (`revoked_or`).
                Err(JobError::Cancelled | JobError::Revoked { .. }) => {
                    self.apply(JobEvent::Cancelled);
                    continue;
                }
            };
            let spent = turn.text.len() + turn.tool_calls.iter().map(|(_, _, a)| a.len()).sum::<usize>();
            let visit = self.current.as_mut().expect("set above");
            if let Err(failure) = visit.budget.charge_output(spent as u64) {
                self.apply(JobEvent::Failed(failure));
                continue;
            }
            if turn.tool_calls.is_empty() {
                self.conversation.push(message(pb::Role::Assistant, turn.text.clone()));
                answer = turn.text.clone();
                self.apply(JobEvent::Answered { text: turn.text });
            } else {
                self.tools(stage, turn, cancel).await;
            }
        }
    }

    /// Runs a turn's tool calls one at a time, each result going back into
    /// the conversation; stops at the first that ends the job.
    async fn tools(&mut self, stage: Stage, turn: Turn, cancel: &CancellationToken) {
        let Some(Visit { id: stage_id, budget, .. }) = self.current.clone() else { return };
        let first = self.tool_calls + 1;
        self.tool_calls += turn.tool_calls.len() as u64;
        let calls: Vec<pb::ToolCall> = (first..)
            .zip(turn.tool_calls)
            .map(|(n, (id, name, arguments_json))| {
                let id = if id.is_empty() { format!("call_{n}") } else { id };
                pb::ToolCall { id, name, arguments_json }
            })
            .collect();
        self.conversation.push(pb::ChatMessage {
            role: pb::Role::Assistant.into(),
            content: turn.text,
            tool_calls: calls.clone(),
            ..Default::default()
        });
        for (n, call) in (first..).zip(calls) {
            // Nothing more reaches the workspace once the job is cancelled
            // or its caller revoked.
            if cancel.is_cancelled() || !self.standing.holds() {
                cancel.cancel();
                self.apply(JobEvent::Cancelled);
                return;
            }
            // The wire id is the job's own: model ids may repeat.
            let pending = Pending { stage_id: stage_id.clone(), tool_call_id: format!("t{n}") };
            self.apply(JobEvent::ToolCalled(pending.clone()));
            if !matches!(self.job.state(), JobState::InternalTool { .. }) {
                return;
            }
            let tool = tools::label(&call.name);
            let decoded = match tools::decode(&call.name, &call.arguments_json, stage, &self.authority) {
                Ok(decoded) => decoded,
                Err(failure) => {
                    self.count_tool(tool, failure.label());
                    self.apply(JobEvent::Failed(failure));
                    return;
                }
            };
            let op = decoded.into_wire();
            let remaining = budget.remaining(Instant::now());
            let answer =
                tokio::time::timeout(remaining, self.call.tool(&pending.stage_id, &pending.tool_call_id, op, cancel));
            let response = match answer.await {
                Ok(Ok(response)) => response,
                Ok(Err(e)) => {
                    self.count_tool(tool, e.label());
                    self.apply(JobEvent::Failed(JobFailure::WorkspaceLost));
                    return;
                }
                Err(_) => {
                    self.count_tool(tool, "timed_out");
                    self.apply(JobEvent::Failed(budget.timed_out()));
                    return;
                }
            };
            self.count_tool(tool, response.result_label());
            let answered = Pending { stage_id: response.stage_id.clone(), tool_call_id: response.tool_call_id.clone() };
            self.apply(JobEvent::ToolResult(answered));
            let mut result = message(pb::Role::Tool, crate::workspace::tools::result_json(&response).to_string());
            result.tool_call_id = call.id;
            self.conversation.push(result);
            if cancel.is_cancelled() {
                self.apply(JobEvent::Cancelled);
                return;
            }
        }
    }

    /// One model call for `stage`: the conversation so far and the stage's
    /// tools, through the ordinary gate.
    async fn model_turn(&mut self, stage: Stage) -> Result<Turn, JobError> {
        let request = pb::RunRequest {
            messages: self.conversation.clone(),
            tools: tools::definitions(stage, &self.authority),
            options: self.spec.request.options.clone(),
            stream: false,
            ..Default::default()
        };
        let committed =
            gate::execute(self.state, &self.spec.caller, &self.spec.model, request, None, CommitPoint::Terminal)
                .await
                .map_err(JobError::Model)?;
        let Answer::Normalized { buffered, rest: None } = committed.answer else {
            return Err(JobError::Model(ApiError::Internal));
        };
        self.target_model = committed.target_model.clone();
        // One definition of folding a run's events: the Chat aggregator's.
        let mut aggregator = CompletionAggregator::new(ResponseMeta::new(committed.target_model, 0));
        for event in &buffered {
            aggregator.push(event);
            if let Event::Usage(u) = event {
                self.usage.prompt_tokens += u.prompt_tokens;
                self.usage.completion_tokens += u.completion_tokens;
                self.usage.reasoning_tokens += u.reasoning_tokens;
            }
        }
        let body = aggregator.finish().map_err(JobError::Model)?;
        let message = &body["choices"][0]["message"];
        let text = message["content"].as_str().unwrap_or_default().to_string();
        let tool_calls = message["tool_calls"]
            .as_array()
            .map(|calls| {
                calls
                    .iter()
                    .map(|c| {
                        let field = |v: &Value| v.as_str().unwrap_or_default().to_string();
                        (field(&c["id"]), field(&c["function"]["name"]), field(&c["function"]["arguments"]))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Turn { text, tool_calls })
    }

    fn apply(&mut self, event: JobEvent) {
        if let Err(refused) = self.job.apply(event) {
            tracing::warn!(%refused, "job event not applied");
            let reason = match refused {
                state::Refused::StaleToolResult => "stale_tool_result",
                state::Refused::NotApplicable { .. } => "out_of_order",
            };
            self.state.metrics.reason(&self.state.metrics.workspace_dropped, reason);
        }
        if self.job.state().is_terminal() {
            self.end_visit();
        }
    }

    fn count_tool(&self, tool: &'static str, result: &'static str) {
        self.state.metrics.job_tool_calls.get_or_create(&ToolLabels { tool, result }).inc();
    }

    /// Records the time spent in the stage visit being left, if any.
    fn end_visit(&mut self) {
        if let Some(visit) = self.current.take() {
            let labels = StageLabels { stage: visit.stage.label() };
            self.state.metrics.job_stage_seconds.get_or_create(&labels).observe(visit.started.elapsed().as_secs_f64());
        }
    }
}

/// One visit of a stage: its id on the wire, budget and start.
#[derive(Clone)]
struct Visit {
    stage: Stage,
    id: String,
    budget: StageBudget,
    started: Instant,
}

fn message(role: pb::Role, content: String) -> pb::ChatMessage {
    pb::ChatMessage { role: role.into(), content, ..Default::default() }
}
