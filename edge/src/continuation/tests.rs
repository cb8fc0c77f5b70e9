use super::*;
use pb::FailureKind;

fn text(s: &str) -> Event {
    Event::Text(pb::TextDelta { text: s.into() })
}
fn reasoning(s: &str) -> Event {
    Event::Reasoning(pb::ReasoningDelta { text: s.into() })
}
fn usage(prompt: u32, completion: u32) -> Event {
    Event::Usage(pb::Usage::provider(prompt, completion, 0))
}
fn started() -> Event {
    Event::Started(pb::RunStarted { model: "m".into(), ..Default::default() })
}
fn cut() -> pb::ExecutionFailure {
    pb::ExecutionFailure::new(FailureKind::ProviderUnreachable, "cut")
}
fn sent(events: Vec<Event>) -> (Splice, Vec<Event>) {
    let mut splice = Splice::default();
    let out = events.into_iter().filter_map(|e| splice.pass(e)).collect();
    (splice, out)
}

#[test]
fn the_prefill_is_every_text_the_client_got() {
    let (splice, out) = sent(vec![started(), reasoning("hm"), text("w1"), text(" w2")]);
    assert_eq!(out.len(), 4, "nothing of the first run is dropped");
    assert_eq!(splice.on_break(&cut(), 2), Ok("w1 w2".to_string()), "reasoning is no part of the prefill");
}

#[test]
fn only_plain_text_answers_broken_by_a_retryable_failure_continue() {
    let (splice, _) = sent(vec![started()]);
    assert_eq!(splice.on_break(&cut(), 2), Err(NotContinued::NotText), "no text yet");
    let (splice, _) = sent(vec![text("a"), reasoning("thinking")]);
    assert_eq!(splice.on_break(&cut(), 2), Err(NotContinued::NotText), "inside a reasoning block");
    let call = Event::ToolCall(pb::ToolCallDelta {
        index: 0,
        id: "c".into(),
        name: "f".into(),
        arguments_delta: "{\"q\":".into(),
    });
    let (splice, _) = sent(vec![text("a"), call.clone()]);
    assert_eq!(splice.on_break(&cut(), 2), Err(NotContinued::NotText), "inside a tool call");
    let (splice, _) = sent(vec![call, text("after")]);
    assert_eq!(splice.on_break(&cut(), 2), Err(NotContinued::NotText), "after a tool call");
    let (splice, _) = sent(vec![text("a")]);
    let deadline = pb::ExecutionFailure::new(FailureKind::DeadlineExceeded, "late");
    assert_eq!(splice.on_break(&deadline, 2), Err(NotContinued::NotRetryable));
    for kind in [FailureKind::TransportLost, FailureKind::ResponseStalled, FailureKind::ProviderProtocol] {
        assert!(splice.on_break(&pb::ExecutionFailure::new(kind, ""), 2).is_ok(), "{kind:?}");
    }
    assert_eq!(splice.on_break(&cut(), 0), Err(NotContinued::Limit));
}

#[test]
fn a_continuation_drops_its_start_and_reasoning_and_counts_toward_the_limit() {
    let (mut splice, _) = sent(vec![started(), text("w1")]);
    splice.continued("w1");
    assert_eq!(splice.pass(started()), None);
    assert_eq!(splice.pass(reasoning("again")), None);
    assert_eq!(splice.pass(text(" w2")), Some(text(" w2")));
    assert_eq!(splice.on_break(&cut(), 2), Ok("w1 w2".to_string()));
    assert_eq!(splice.on_break(&cut(), 1), Err(NotContinued::Limit));
}

/// llama.cpp's server repeats the prefill before the continuation.
#[test]
fn a_repeat_of_the_prefill_is_dropped_and_a_real_continuation_passes() {
    let continued = |prefill: &str, events: Vec<Event>| {
        let mut splice = Splice::default();
        splice.pass(text(prefill));
        splice.continued(prefill);
        let out: Vec<Event> = events.into_iter().filter_map(|e| splice.pass(e)).collect();
        let text: String =
            out.iter().filter_map(|e| if let Event::Text(t) = e { Some(t.text.clone()) } else { None }).collect();
        (text, out.len(), splice)
    };
    // The whole prefill in one piece, then more.
    let (got, _, splice) = continued("w1 w2", vec![started(), text("w1 w2 w3"), text(" w4")]);
    assert_eq!(got, " w3 w4");
    assert_eq!(splice.on_break(&cut(), 5), Ok("w1 w2 w3 w4".to_string()));
    // The prefill in pieces, then the continuation.
    let (got, _, _) = continued("w1 w2", vec![text("w1"), text(" w"), text("2"), text(" w3")]);
    assert_eq!(got, " w3");
    // No repeat (Ollama, the mock): everything passes.
    let (got, _, _) = continued("w1 w2", vec![text(" w3"), text(" w4")]);
    assert_eq!(got, " w3 w4");
    // Text that starts like the prefill and departs from it is the continuation, whole.
    let (got, _, _) = continued("w1 w2", vec![text("w1"), text("0 w11")]);
    assert_eq!(got, "w10 w11");
    // Only a part of the repeat before the end: dropped, the terminal passes.
    let done = Event::Completed(pb::RunCompleted { finish_reason: pb::FinishReason::Stop.into() });
    let (got, n, _) = continued("w1 w2", vec![text("w1"), usage(1, 1), done]);
    assert_eq!((got.as_str(), n), ("", 2), "usage and the terminal");
}

#[test]
fn usage_is_the_sum_over_the_answers_runs() {
    let (mut splice, out) = sent(vec![text("a"), usage(10, 3)]);
    assert_eq!(out[1], usage(10, 3), "one run: as reported");
    splice.continued("w1");
    assert_eq!(splice.pass(usage(13, 4)), Some(usage(23, 7)));
    assert_eq!(splice.pass(usage(13, 5)), Some(usage(23, 8)), "a run's latest usage replaces its earlier one");
    // A broken run that reported nothing: the continuation's alone.
    let (mut splice, _) = sent(vec![text("a")]);
    splice.continued("w1");
    assert_eq!(splice.pass(usage(13, 4)), Some(usage(13, 4)));
    // A broken run its node counted: summed, the sum as inexact as its least exact part.
    let counted = pb::Usage {
        prompt_tokens: 10,
        completion_tokens: 6,
        prompt_source: pb::UsageSource::Estimated.into(),
        completion_source: pb::UsageSource::Counted.into(),
        ..Default::default()
    };
    let (mut splice, _) = sent(vec![text("a"), Event::Usage(counted)]);
    splice.continued("w1");
    let Some(Event::Usage(sum)) = splice.pass(Event::Usage(pb::Usage::provider(16, 4, 0))) else { panic!() };
    assert_eq!((sum.prompt_tokens, sum.completion_tokens), (26, 10));
    assert_eq!((sum.input_source(), sum.output_source()), (pb::UsageSource::Estimated, pb::UsageSource::Counted));
}

#[test]
fn the_prefill_extends_a_clients_own_prefill() {
    let user = pb::ChatMessage { role: pb::Role::User.into(), content: "count".into(), ..Default::default() };
    let request = pb::RunRequest { messages: vec![user.clone()], ..Default::default() };
    let continued = with_prefill(request, "w1 w2");
    assert_eq!(continued.messages.len(), 2);
    assert_eq!(continued.messages[1].role(), pb::Role::Assistant);
    assert_eq!(continued.messages[1].content, "w1 w2");
    let own = pb::ChatMessage { role: pb::Role::Assistant.into(), content: "Sure: ".into(), ..Default::default() };
    let request = pb::RunRequest { messages: vec![user, own], ..Default::default() };
    let continued = with_prefill(request, "w1");
    assert_eq!(continued.messages.len(), 2);
    assert_eq!(continued.messages[1].content, "Sure: w1");
}

#[test]
fn only_a_route_with_a_continuation_provider_is_capable() {
    let mut config = crate::testing::one_provider_config("n1");
    let model = config.providers[0].models[0].name.clone();
    let declared = |p: &ProviderEntry| p.continuation.unwrap_or(false);
    assert!(!capable(&config, &model, declared));
    assert!(capable(&config, &model, |_| true), "as the node detected it");
    config.providers[0].continuation = Some(true);
    assert!(capable(&config, &model, declared));
    assert!(!capable(&config, "other", declared));
    config.limits.max_continuations = 0;
    assert!(!capable(&config, &model, declared), "0 turns continuation off");
}
