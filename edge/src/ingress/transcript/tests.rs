use super::*;
use crate::ingress::test_events::{completed, started, text, tool, usage};

fn run(events: &[Event]) -> (Transcript, Vec<Step<'_>>) {
    let mut transcript = Transcript::default();
    let steps = events.iter().flat_map(|e| transcript.push(e)).collect();
    (transcript, steps)
}

#[test]
fn blocks_open_grow_and_close_in_order() {
    let events = [
        started(),
        text("Hel"),
        text("lo"),
        tool(0, "c1", "lookup", "{\"q\":"),
        tool(0, "", "", "1}"),
        tool(1, "c2", "other", ""),
        text("after"),
        usage(3, 4),
        completed(pb::FinishReason::ToolCalls),
    ];
    let (mut transcript, steps) = run(&events);
    use Step::*;
    assert_eq!(
        steps,
        vec![
            Begin,
            Open(0),
            Delta(0, "Hel"),
            Delta(0, "lo"),
            Close(0),
            Open(1),
            Delta(1, "{\"q\":"),
            Delta(1, "1}"),
            Close(1),
            Open(2),
            Close(2),
            Open(3),
            Delta(3, "after"),
            Close(3),
            Complete { finish_reason: pb::FinishReason::ToolCalls.into() },
        ]
    );
    assert_eq!(transcript.blocks()[1].content, "{\"q\":1}");
    assert_eq!(transcript.blocks()[2].kind, BlockKind::ToolCall { id: "c2".into(), name: "other".into() });
    assert_eq!(transcript.tool_ordinal(2), 1);
    assert_eq!(transcript.usage().map(|u| u.completion_tokens), Some(4));
    assert_eq!(transcript.finish(), Ok(pb::FinishReason::ToolCalls.into()));
}

#[test]
fn a_known_index_with_a_new_id_is_a_new_call_and_a_late_piece_fails_the_run() {
    let events = [tool(0, "a", "f", "{}"), tool(0, "b", "f", "{}")];
    let (transcript, steps) = run(&events);
    assert_eq!(transcript.blocks().len(), 2, "{steps:?}");

    // A late piece: call 0 closed when call 1 opened.
    let events = [tool(0, "a", "f", "{"), tool(0, "", "", "}"), tool(1, "b", "g", "{}"), tool(0, "", "", "")];
    let (mut transcript, steps) = run(&events);
    assert!(matches!(steps.last(), Some(Step::Fail(f)) if f.kind() == pb::FailureKind::ProviderProtocol));
    assert!(transcript.push(&completed(pb::FinishReason::Stop)).is_empty(), "nothing after a terminal counts");
    assert!(transcript.finish().is_err());
}

#[test]
fn arguments_that_are_not_an_object_fail_the_run_when_the_call_closes() {
    for bad in ["[1]", "{", "\"x\""] {
        let events = [tool(0, "a", "f", bad), completed(pb::FinishReason::Stop)];
        let (mut transcript, steps) = run(&events);
        assert!(matches!(steps.last(), Some(Step::Fail(_))), "{bad}: {steps:?}");
        assert!(transcript.finish().is_err());
    }
    let (mut transcript, _) = run(&[tool(0, "a", "f", ""), completed(pb::FinishReason::Stop)]);
    assert!(transcript.finish().is_ok(), "no arguments at all is {{}}");
    assert_eq!(arguments_object(""), serde_json::json!({}));
}

#[test]
fn a_failure_or_cancel_first_does_not_begin_the_answer() {
    let failed = Event::Failed(pb::RunFailed { failure: None });
    let events = [failed];
    let (_, steps) = run(&events);
    assert!(matches!(steps.as_slice(), [Step::Fail(_)]));
    let events = [Event::Cancelled(pb::RunCancelled { reason: 0 })];
    let (mut transcript, steps) = run(&events);
    assert_eq!(steps, vec![Step::Cancel]);
    assert!(transcript.finish().is_err());
    let (mut transcript, _) = run(&[text("x")]);
    assert!(transcript.finish().is_err(), "no terminal at all is an error");
}
