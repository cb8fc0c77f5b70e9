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
mod tests {
    use super::*;

    const FULL: StagePlan = StagePlan { plan: true, review: true, max_repairs: 1 };

    fn pending(stage: &str, id: &str) -> Pending {
        Pending { stage_id: stage.into(), tool_call_id: id.into() }
    }

    fn answered(text: &str) -> JobEvent {
        JobEvent::Answered { text: text.into() }
    }

    fn stage(job: &Job) -> &'static str {
        job.state().label()
    }

    #[test]
    fn the_full_graph_with_one_repair() {
        let mut job = Job::new(FULL);
        let mut path = vec![stage(&job)];
        let events = [
            JobEvent::Opened,
            JobEvent::ToolCalled(pending("planning-1", "t1")),
            JobEvent::ToolResult(pending("planning-1", "t1")),
            answered("the plan"),
            JobEvent::ToolCalled(pending("working-1", "t2")),
            JobEvent::ToolResult(pending("working-1", "t2")),
            answered("done"),
            answered(r#"{"verdict":"repair","notes":"fix the title"}"#),
            answered("repair plan"),
            answered("fixed"),
            answered("```json\n{\"verdict\": \"repair\", \"notes\": \"still\"}\n```"),
            answered("final answer"),
        ];
        for event in events {
            job.apply(event).unwrap();
            path.push(stage(&job));
        }
        assert_eq!(
            path,
            [
                "accepted",
                "planning",
                "internal_tool",
                "planning",
                "working",
                "internal_tool",
                "working",
                "reviewing",
                "repairing",
                "working",
                "reviewing",
                // Out of repairs: the job answers with the work it has.
                "finalizing",
                "completed",
            ]
        );
        assert_eq!(job.repairs(), 1);
        assert_eq!(job.review_notes(), Some("fix the title"));
    }

    #[test]
    fn without_plan_and_review_work_goes_straight_to_the_answer() {
        let mut job = Job::new(StagePlan { plan: false, review: false, max_repairs: 0 });
        job.apply(JobEvent::Opened).unwrap();
        assert_eq!(job.state(), &JobState::InStage(Stage::Working));
        job.apply(answered("done")).unwrap();
        assert_eq!(job.state(), &JobState::InStage(Stage::Finalizing));
        job.apply(answered("answer")).unwrap();
        assert_eq!(job.state(), &JobState::Completed);
    }

    #[test]
    fn a_result_resumes_only_the_saved_stage_and_stale_ones_change_nothing() {
        let mut job = Job::new(FULL);
        job.apply(JobEvent::Opened).unwrap();
        job.apply(JobEvent::ToolCalled(pending("planning-1", "t1"))).unwrap();
        let before = job.state().clone();
        for stale in [pending("planning-1", "t0"), pending("working-1", "t1"), pending("planning-2", "t1")] {
            assert_eq!(job.apply(JobEvent::ToolResult(stale)), Err(Refused::StaleToolResult));
            assert_eq!(job.state(), &before);
        }
        job.apply(JobEvent::ToolResult(pending("planning-1", "t1"))).unwrap();
        assert_eq!(job.state(), &JobState::InStage(Stage::Planning));
        // Repeated: the call is no longer pending.
        assert_eq!(job.apply(JobEvent::ToolResult(pending("planning-1", "t1"))), Err(Refused::StaleToolResult));
        // An answer while a tool runs is out of order.
        job.apply(JobEvent::ToolCalled(pending("planning-1", "t2"))).unwrap();
        assert!(matches!(job.apply(answered("x")), Err(Refused::NotApplicable { .. })));
    }

    #[test]
    fn failure_and_cancel_from_anywhere_and_terminals_are_final() {
        for steps in 0..4 {
            let mut job = Job::new(FULL);
            let events =
                [JobEvent::Opened, JobEvent::ToolCalled(pending("p", "t")), JobEvent::ToolResult(pending("p", "t"))];
            for event in events.into_iter().take(steps) {
                job.apply(event).unwrap();
            }
            let mut cancelled = job.clone();
            cancelled.apply(JobEvent::Cancelled).unwrap();
            assert_eq!(cancelled.state(), &JobState::Cancelled);
            job.apply(JobEvent::Failed(JobFailure::WorkspaceLost)).unwrap();
            assert_eq!(job.state(), &JobState::Failed(JobFailure::WorkspaceLost));
            assert!(job.apply(JobEvent::Cancelled).is_err(), "a failure stays a failure");
            assert!(cancelled.apply(JobEvent::Failed(JobFailure::CleanupFailed)).is_err(), "a cancel stays a cancel");
        }
        let mut finalizing = Job::new(StagePlan { plan: false, review: false, max_repairs: 0 });
        finalizing.apply(JobEvent::Opened).unwrap();
        finalizing.apply(answered("done")).unwrap();
        finalizing.apply(JobEvent::ToolCalled(pending("f", "t"))).unwrap();
        assert_eq!(finalizing.state(), &JobState::Failed(JobFailure::UnexpectedToolCall));
    }

    #[test]
    fn verdicts_are_strict_and_anything_else_is_a_repair() {
        assert_eq!(Verdict::parse(r#" {"verdict":"approve","notes":""} "#), Verdict::Approve);
        assert_eq!(Verdict::parse(r#"{"verdict":"approve"}"#), Verdict::Approve);
        let repair = |notes: &str| Verdict::Repair { notes: notes.into() };
        assert_eq!(Verdict::parse(r#"{"verdict":"repair","notes":"n"}"#), repair("n"));
        for malformed in ["approve", r#"{"verdict":"APPROVE"}"#, r#"{"verdict":"approve","extra":1}"#, "", "{"] {
            assert_eq!(Verdict::parse(malformed), repair(""), "{malformed}");
        }
    }

    #[test]
    fn budgets_count_turns_output_and_time() {
        let start = Instant::now();
        let wall = start + Duration::from_secs(100);
        let mut budget = StageBudget::new(2, 10, Duration::from_secs(10), wall, start);
        budget.take_turn(start).unwrap();
        budget.take_turn(start).unwrap();
        assert_eq!(budget.take_turn(start), Err(JobFailure::IterationBudget));
        budget.charge_output(10).unwrap();
        assert_eq!(budget.charge_output(1), Err(JobFailure::OutputBudget));
        assert_eq!(budget.check_time(start + Duration::from_secs(10)), Err(JobFailure::StageDeadline));
        assert_eq!(budget.timed_out(), JobFailure::StageDeadline);
        let late = StageBudget::new(5, 10, Duration::from_secs(10), start + Duration::from_secs(5), start);
        assert_eq!(late.check_time(start + Duration::from_secs(5)), Err(JobFailure::WallClock));
        assert_eq!(late.timed_out(), JobFailure::WallClock);
        assert_eq!(late.remaining(start), Duration::from_secs(5));
    }
}
