//! A job's state graph, pure: one enum of states, one of events, and one
//! transition function ([`Job::apply`]). The driver (`super::run`) does the
//! I/O and feeds each outcome in as an event; what happens next is decided
//! here only.
//!
//! ```text
//! accepted -> planning -> working <-> internal_tool -> reviewing
//!          -> (repairing -> working)* -> finalizing -> completed
//! failed / cancelled from anywhere
//! ```
//!
//! Planning, reviewing and repairing may also call (read-only) tools: a
//! tool call saves the stage it was made in, and only its own result
//! resumes exactly that stage.

use std::time::{Duration, Instant};

/// A stage in which the model takes turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    Planning,
    Working,
    Reviewing,
    Repairing,
    Finalizing,
}

impl Stage {
    pub fn label(self) -> &'static str {
        match self {
            Self::Planning => "planning",
            Self::Working => "working",
            Self::Reviewing => "reviewing",
            Self::Repairing => "repairing",
            Self::Finalizing => "finalizing",
        }
    }

    /// Whether the stage may change the workspace (write, delete, command);
    /// the others get read and list only, and finalizing no tools at all.
    pub fn may_change(self) -> bool {
        self == Self::Working
    }

    pub fn has_tools(self) -> bool {
        self != Self::Finalizing
    }
}

/// The tool call a job waits for: its stage and ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub stage_id: String,
    pub tool_call_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    Accepted,
    InStage(Stage),
    /// A tool call of `resume` is running; its result goes back there.
    InternalTool {
        resume: Stage,
        pending: Pending,
    },
    Completed,
    Failed(JobFailure),
    Cancelled,
}

impl JobState {
    /// The state's name (`iop_edge_job_terminals_total{state}` and logs).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::InStage(stage) => stage.label(),
            Self::InternalTool { .. } => "internal_tool",
            Self::Completed => "completed",
            Self::Failed(_) => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Completed | Self::Failed(_) | Self::Cancelled)
    }
}

/// Why a job failed (closed; the client sees the label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum JobFailure {
    #[error("the stage used all its model turns")]
    IterationBudget,
    #[error("the stage's model output exceeded its budget")]
    OutputBudget,
    #[error("the stage ran past its deadline")]
    StageDeadline,
    #[error("the job ran past its wall clock")]
    WallClock,
    #[error("the model called a tool this stage may not use")]
    ToolDenied,
    #[error("the model's tool call was malformed")]
    MalformedToolCall,
    #[error("the model answered in finalizing with a tool call")]
    UnexpectedToolCall,
    #[error("the model call failed")]
    ModelFailed,
    #[error("the workspace's node connection ended")]
    WorkspaceLost,
    #[error("the workspace could not be opened")]
    WorkspaceOpenFailed,
    #[error("the workspace could not be cleaned up")]
    CleanupFailed,
    #[error("internal error")]
    Internal,
}

impl JobFailure {
    pub fn label(self) -> &'static str {
        match self {
            Self::IterationBudget => "iteration_budget_exhausted",
            Self::OutputBudget => "output_budget_exhausted",
            Self::StageDeadline => "stage_deadline_exceeded",
            Self::WallClock => "wall_clock_exceeded",
            Self::ToolDenied => "tool_denied",
            Self::MalformedToolCall => "malformed_tool_call",
            Self::UnexpectedToolCall => "unexpected_tool_call",
            Self::ModelFailed => "model_failed",
            Self::WorkspaceLost => "workspace_lost",
            Self::WorkspaceOpenFailed => "workspace_open_failed",
            Self::CleanupFailed => "cleanup_failed",
            Self::Internal => "internal",
        }
    }
}

/// What the reviewer decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Approve,
    Repair { notes: String },
}

impl Verdict {
    /// Strict: exactly `{"verdict": "approve" | "repair", "notes": "..."}`
    /// (whitespace and a ```json fence around it allowed); anything else is
    /// a repair with no notes.
    pub fn parse(text: &str) -> Self {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            verdict: String,
            #[serde(default)]
            notes: String,
        }
        let trimmed = text.trim();
        let unfenced = trimmed
            .strip_prefix("```json")
            .or_else(|| trimmed.strip_prefix("```"))
            .and_then(|t| t.strip_suffix("```"))
            .unwrap_or(trimmed)
            .trim();
        match serde_json::from_str::<Raw>(unfenced) {
            Ok(raw) if raw.verdict == "approve" => Self::Approve,
            Ok(raw) if raw.verdict == "repair" => Self::Repair { notes: raw.notes },
            _ => Self::Repair { notes: String::new() },
        }
    }
}

/// What happened, as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEvent {
    /// The workspace opened.
    Opened,
    /// The model answered the current stage with text.
    Answered {
        text: String,
    },
    /// The model asked for a tool call in the current stage.
    ToolCalled(Pending),
    /// A tool call's result arrived.
    ToolResult(Pending),
    Failed(JobFailure),
    Cancelled,
}

/// Why an event was not applied (the state is unchanged).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// A tool result for a call the job is not waiting for (repeated or
    /// stale identity): dropped and counted.
    #[error("a tool result for a call the job is not waiting for")]
    StaleToolResult,
    #[error("event {event} does not apply in state {state}")]
    NotApplicable { event: &'static str, state: &'static str },
}

/// The stages configured for a workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagePlan {
    pub plan: bool,
    pub review: bool,
    pub max_repairs: u32,
}

/// One job's state and what the transitions need to know.
#[derive(Debug, Clone)]
pub struct Job {
    state: JobState,
    plan: StagePlan,
    repairs: u32,
    /// The last reviewer's notes, for the repairing stage's prompt.
    notes: Option<String>,
}

impl Job {
    pub fn new(plan: StagePlan) -> Self {
        Self { state: JobState::Accepted, plan, repairs: 0, notes: None }
    }

    pub fn state(&self) -> &JobState {
        &self.state
    }

    pub fn repairs(&self) -> u32 {
        self.repairs
    }

    pub fn review_notes(&self) -> Option<&str> {
        self.notes.as_deref()
    }

    /// The transition function. A terminal state takes no further event.
    pub fn apply(&mut self, event: JobEvent) -> Result<&JobState, Refused> {
        use JobEvent as E;
        use JobState as S;
        let refused = |state: &JobState, event: &JobEvent| Refused::NotApplicable {
            event: match event {
                E::Opened => "opened",
                E::Answered { .. } => "answered",
                E::ToolCalled(_) => "tool_called",
                E::ToolResult(_) => "tool_result",
                E::Failed(_) => "failed",
                E::Cancelled => "cancelled",
            },
            state: state.label(),
        };
        let next = match (&self.state, event) {
            (state, event) if state.is_terminal() => return Err(refused(state, &event)),
            (_, E::Cancelled) => S::Cancelled,
            (_, E::Failed(failure)) => S::Failed(failure),
            (S::Accepted, E::Opened) => S::InStage(if self.plan.plan { Stage::Planning } else { Stage::Working }),
            (S::InStage(stage), E::ToolCalled(pending)) if stage.has_tools() => {
                S::InternalTool { resume: *stage, pending }
            }
            (S::InStage(Stage::Finalizing), E::ToolCalled(_)) => S::Failed(JobFailure::UnexpectedToolCall),
            (S::InternalTool { resume, pending }, E::ToolResult(result)) => {
                if *pending != result {
                    return Err(Refused::StaleToolResult);
                }
                S::InStage(*resume)
            }
            (_, E::ToolResult(_)) => return Err(Refused::StaleToolResult),
            (S::InStage(stage), E::Answered { text }) => match stage {
                Stage::Planning | Stage::Repairing => S::InStage(Stage::Working),
                Stage::Working if self.plan.review => S::InStage(Stage::Reviewing),
                Stage::Working => S::InStage(Stage::Finalizing),
                Stage::Reviewing => match Verdict::parse(&text) {
                    Verdict::Repair { notes } if self.repairs < self.plan.max_repairs => {
                        self.repairs += 1;
                        self.notes = Some(notes);
                        S::InStage(Stage::Repairing)
                    }
                    // Approved, or out of repairs: answer with the work done.
                    _ => S::InStage(Stage::Finalizing),
                },
                Stage::Finalizing => S::Completed,
            },
            (state, event) => return Err(refused(state, &event)),
        };
        self.state = next;
        Ok(&self.state)
    }
}

/// One stage's budget: model turns, model output bytes, and a deadline
/// (the earlier of the stage's own and the job's wall clock). Pure: the
/// caller passes the time.
#[derive(Debug, Clone, Copy)]
pub struct StageBudget {
    turns_left: u32,
    output_left: u64,
    deadline: Instant,
    wall_clock: Instant,
}

impl StageBudget {
    pub fn new(max_turns: u32, max_output: u64, stage_timeout: Duration, wall_clock: Instant, now: Instant) -> Self {
        Self {
            turns_left: max_turns,
            output_left: max_output,
            deadline: (now + stage_timeout).min(wall_clock),
            wall_clock,
        }
    }

    /// Takes one model turn, if the budget has one left at `now`.
    pub fn take_turn(&mut self, now: Instant) -> Result<(), JobFailure> {
        self.check_time(now)?;
        self.turns_left = self.turns_left.checked_sub(1).ok_or(JobFailure::IterationBudget)?;
        Ok(())
    }

    /// Charges `bytes` of model output.
    pub fn charge_output(&mut self, bytes: u64) -> Result<(), JobFailure> {
        self.output_left = self.output_left.checked_sub(bytes).ok_or(JobFailure::OutputBudget)?;
        Ok(())
    }

    pub fn check_time(&self, now: Instant) -> Result<(), JobFailure> {
        if now >= self.wall_clock {
            Err(JobFailure::WallClock)
        } else if now >= self.deadline {
            Err(JobFailure::StageDeadline)
        } else {
            Ok(())
        }
    }

    /// What the current step may still take.
    pub fn remaining(&self, now: Instant) -> Duration {
        self.deadline.saturating_duration_since(now)
    }

    pub fn timed_out(&self) -> JobFailure {
        if self.deadline >= self.wall_clock { JobFailure::WallClock } else { JobFailure::StageDeadline }
    }
}

#[cfg(test)]
mod tests;
