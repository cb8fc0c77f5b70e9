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
