use super::*;

fn reported(prompt: u32, completion: u32, reasoning: u32) -> pb::Usage {
    pb::Usage::provider(prompt, completion, reasoning)
}

fn bounds(input: u64, max_output: Option<u64>) -> Bounds {
    Bounds { input, max_output }
}

#[test]
fn a_report_within_its_bounds_is_charged_as_reported() {
    let (charge, clamped) = bounds(1_000, Some(100)).clamp(&reported(7, 5, 2), 40);
    assert_eq!(
        charge,
        Charge { input: 7, output: 5, reasoning: 2, input_source: Source::Provider, output_source: Source::Provider }
    );
    assert!(!clamped);
    assert_eq!(charge.billed(), 12);
}

#[test]
fn a_report_beyond_what_the_attempt_could_use_is_charged_the_bound() {
    let absurd = reported(u32::MAX, u32::MAX, u32::MAX);
    // No max_tokens: output at most a token per byte relayed, plus the slack.
    let (charge, clamped) = bounds(2_000, None).clamp(&absurd, 300);
    assert!(clamped);
    assert_eq!((charge.input, charge.output, charge.reasoning), (2_000, 300 + OUTPUT_SLACK, 300 + OUTPUT_SLACK));
    // max_tokens is tighter than the bytes relayed.
    let (charge, _) = bounds(2_000, Some(64)).clamp(&absurd, 10_000);
    assert_eq!(charge.output, 64);
    // Nothing relayed: only the slack.
    let (charge, clamped) = bounds(2_000, None).clamp(&reported(10, 17, 0), 0);
    assert_eq!((charge.output, clamped), (OUTPUT_SLACK, true));
}

#[test]
fn bounds_come_from_the_request() {
    let request = pb::RunRequest {
        messages: vec![pb::ChatMessage { content: "x".repeat(500), ..Default::default() }],
        options: Some(pb::GenerationOptions { max_tokens: Some(32), ..Default::default() }),
        ..Default::default()
    };
    let of_run = Bounds::of(&request, 0);
    assert!(of_run.input >= 500 + PROMPT_FRAMING, "{of_run:?}");
    assert_eq!(of_run.max_output, Some(32));
    // A tunnel's body, larger than the parsed request, bounds it.
    assert_eq!(Bounds::of(&request, 90_000).input, 90_000 + PROMPT_FRAMING);
    assert_eq!(Bounds::of(&pb::RunRequest::default(), 0).max_output, None);
}

#[test]
fn sources_are_read_per_kind() {
    let counted = pb::Usage {
        prompt_tokens: 30,
        completion_tokens: 12,
        reasoning_tokens: 0,
        prompt_source: pb::UsageSource::Estimated.into(),
        completion_source: pb::UsageSource::Counted.into(),
    };
    let (charge, _) = bounds(1_000, None).clamp(&counted, 100);
    assert_eq!((charge.input_source, charge.output_source), (Source::Estimated, Source::Counted));
    // A node from before sources: the provider's.
    let (charge, _) = bounds(1_000, None).clamp(&pb::Usage { prompt_tokens: 1, ..Default::default() }, 0);
    assert_eq!(charge.input_source, Source::Provider);
}

#[test]
fn the_ledger_totals_requests_and_charges_per_principal_and_model() {
    let ledger = UsageLedger::default();
    let charge = |input, output, reasoning, output_source| Charge {
        input,
        output,
        reasoning,
        input_source: Source::Provider,
        output_source,
    };
    ledger.request("a", "m1", false);
    ledger.charge("a", "m1", &charge(10, 4, 1, Source::Provider));
    ledger.request("a", "m2", true);
    // Two attempts of one request (a continued answer), one counted by its node.
    ledger.request("a", "m1", false);
    ledger.charge("a", "m1", &charge(1, 1, 0, Source::Provider));
    ledger.charge("a", "m1", &charge(0, 6, 0, Source::Counted));
    ledger.request("b", "unknown", true);
    let snapshot = ledger.snapshot();
    let a = &snapshot["principals"]["a"];
    assert_eq!(
        (a["requests"].as_u64(), a["errors"].as_u64(), a["input_tokens"].as_u64(), a["output_tokens"].as_u64()),
        (Some(3), Some(1), Some(11), Some(11))
    );
    assert_eq!((a["reasoning_tokens"].as_u64(), a["output_tokens_unreported"].as_u64()), (Some(1), Some(6)));
    assert_eq!(a["input_tokens_unreported"], 0);
    assert_eq!(a["models"]["m1"]["requests"], 2);
    assert_eq!(a["models"]["m2"]["errors"], 1);
    assert_eq!(snapshot["principals"]["b"]["models"]["unknown"]["requests"], 1);
    assert!(snapshot["since"].as_str().unwrap().ends_with('Z'));
}
