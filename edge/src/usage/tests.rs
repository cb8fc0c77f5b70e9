use super::*;

fn usage(prompt: u32, completion: u32, reasoning: u32) -> pb::Usage {
    pb::Usage { prompt_tokens: prompt, completion_tokens: completion, reasoning_tokens: reasoning }
}

#[test]
fn tokens_read_a_usage_report_once() {
    assert_eq!(Tokens::of(None), Tokens::default());
    assert_eq!(Tokens::of(Some(&usage(7, 5, 2))), Tokens { input: 7, output: 5, reasoning: 2 });
    assert_eq!(Tokens::of(Some(&usage(7, 5, 9))).reasoning, 5, "reasoning is part of output");
    assert_eq!(Tokens::of(Some(&usage(u32::MAX, u32::MAX, 0))).billed(), 2 * u64::from(u32::MAX));
}

#[test]
fn the_ledger_totals_per_principal_and_model() {
    let ledger = UsageLedger::default();
    ledger.add("a", "m1", false, &Tokens::of(Some(&usage(10, 4, 1))));
    ledger.add("a", "m2", true, &Tokens::default());
    ledger.add("a", "m1", false, &Tokens::of(Some(&usage(1, 1, 0))));
    ledger.add("b", "unknown", true, &Tokens::default());
    let snapshot = ledger.snapshot();
    let a = &snapshot["principals"]["a"];
    assert_eq!(
        (a["requests"].as_u64(), a["errors"].as_u64(), a["input_tokens"].as_u64(), a["output_tokens"].as_u64()),
        (Some(3), Some(1), Some(11), Some(5))
    );
    assert_eq!(a["reasoning_tokens"], 1);
    assert_eq!(a["models"]["m1"]["requests"], 2);
    assert_eq!(a["models"]["m2"]["errors"], 1);
    assert_eq!(snapshot["principals"]["b"]["models"]["unknown"]["requests"], 1);
    assert!(snapshot["since"].as_str().unwrap().ends_with('Z'));
}
