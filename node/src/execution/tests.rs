use super::*;
use crate::adapter::AdapterKind;

fn providers() -> Providers {
    let target = ProviderTarget::new("p1", AdapterKind::Ollama, "m", "http://127.0.0.1:9").unwrap();
    Providers::from([("p1".to_owned(), Ok(target)), ("bad".to_owned(), Err("broken".to_owned()))])
}

fn assigned(provider_id: &str, adapter: pb::AdapterKind, stall: u64) -> Assigned<'_> {
    Assigned {
        provider_id,
        adapter: adapter.into(),
        target_model: "m",
        response_stall_timeout_ms: stall,
        first_byte_timeout_ms: 0,
    }
}

/// Issue 28 item 7: resets, cuts, 429s and 5xx are logged, nothing else.
#[test]
fn the_node_logs_resets_cuts_429s_and_5xx() {
    let failure = |kind: pb::FailureKind, status: u32| {
        let mut f = pb::ExecutionFailure::new(kind, "x");
        f.provider_status = status;
        f
    };
    for logged in [
        failure(pb::FailureKind::ProviderUnreachable, 0),
        failure(pb::FailureKind::ProviderStreamCut, 0),
        failure(pb::FailureKind::ProviderHttpStatus, 429),
        failure(pb::FailureKind::ProviderHttpStatus, 500),
        failure(pb::FailureKind::ProviderHttpStatus, 503),
    ] {
        assert!(logged_provider_failure(&logged), "{logged:?}");
    }
    for quiet in [
        failure(pb::FailureKind::ProviderHttpStatus, 400),
        failure(pb::FailureKind::ProviderHttpStatus, 404),
        failure(pb::FailureKind::ProviderProtocol, 0),
        failure(pb::FailureKind::InvalidRequest, 0),
        failure(pb::FailureKind::ResponseStalled, 0),
        pb::ExecutionFailure {
            provider_code: iop_proto::provider_error::UNSUPPORTED_CONTENT.into(),
            ..failure(pb::FailureKind::ProviderHttpStatus, 500)
        },
    ] {
        assert!(!logged_provider_failure(&quiet), "{quiet:?}");
    }
}

#[test]
fn validate_checks_provider_target_and_stall_timeout() {
    let providers = providers();
    let (target, timeouts) = validate(&providers, assigned("p1", pb::AdapterKind::Ollama, 0)).unwrap();
    assert_eq!(target.provider_id, "p1");
    assert_eq!(timeouts.stall, Duration::from_millis(iop_proto::liveness::DEFAULT_RESPONSE_STALL_TIMEOUT_MS));
    assert_eq!(timeouts.first_byte, Duration::from_millis(iop_proto::liveness::DEFAULT_FIRST_BYTE_TIMEOUT_MS));
    let (_, timeouts) = validate(&providers, assigned("p1", pb::AdapterKind::Ollama, 1500)).unwrap();
    assert_eq!(timeouts.stall, Duration::from_millis(1500));
    let first_byte = Assigned { first_byte_timeout_ms: 2500, ..assigned("p1", pb::AdapterKind::Ollama, 0) };
    assert_eq!(validate(&providers, first_byte).unwrap().1.first_byte, Duration::from_millis(2500));
    let bad = Assigned { first_byte_timeout_ms: 999, ..assigned("p1", pb::AdapterKind::Ollama, 0) };
    assert_eq!(validate(&providers, bad).unwrap_err(), Rejection::InvalidFirstByteTimeout(999));

    let err = |a| validate(&providers, a).unwrap_err();
    assert_eq!(err(assigned("nope", pb::AdapterKind::Ollama, 0)), Rejection::UnknownProvider("nope".into()));
    assert_eq!(err(assigned("bad", pb::AdapterKind::Ollama, 0)), Rejection::InvalidAssignment("bad".into()));
    assert_eq!(err(assigned("p1", pb::AdapterKind::Openai, 0)), Rejection::TargetMismatch);
    assert_eq!(
        err(Assigned { target_model: "other", ..assigned("p1", pb::AdapterKind::Ollama, 0) }),
        Rejection::TargetMismatch
    );
    let too_long = MAX_RESPONSE_STALL_TIMEOUT_MS + 1;
    assert_eq!(err(assigned("p1", pb::AdapterKind::Ollama, too_long)), Rejection::InvalidStallTimeout(too_long));
    // Issue 8 item 7: below a second is refused too, as the config does.
    for too_short in [1, 999] {
        assert_eq!(err(assigned("p1", pb::AdapterKind::Ollama, too_short)), Rejection::InvalidStallTimeout(too_short));
    }
    assert_eq!(err(assigned("nope", pb::AdapterKind::Ollama, 0)).to_failure().kind(), pb::FailureKind::InvalidRequest);
}

fn text(t: &str) -> pb::run_event::Event {
    pb::run_event::Event::Text(pb::TextDelta { text: t.into() })
}

fn call(index: u32, id: &str, name: &str, arguments: &str) -> pb::run_event::Event {
    let delta = pb::ToolCallDelta { index, id: id.into(), name: name.into(), arguments_delta: arguments.into() };
    pb::run_event::Event::ToolCall(delta)
}

/// Feeds `items` through a coalescer and flushes it: what crosses the wire.
fn coalesced(enabled: bool, items: Vec<pb::run_event::Event>) -> Vec<pb::run_event::Event> {
    let mut coalescer = Coalescer::new(enabled);
    let mut out: Vec<_> = items.into_iter().filter_map(|item| coalescer.push::<pb::RunUplink>(item)).collect();
    out.extend(coalescer.flush());
    out
}

/// Issue 9: a client that does not stream gets its deltas merged, in
/// order, with nothing lost and nothing merged across kinds or calls.
#[test]
fn a_non_streaming_run_crosses_the_wire_as_merged_deltas() {
    use pb::run_event::Event;
    let started = Event::Started(pb::RunStarted { model: "m".into(), ..Default::default() });
    let usage = Event::Usage(pb::Usage { prompt_tokens: 3, completion_tokens: 4, ..Default::default() });
    let items = vec![
        started.clone(),
        text("Hel"),
        text("lo"),
        text(", world"),
        call(0, "c1", "f", "{\"a\""),
        call(0, "", "", ":1}"),
        call(1, "c2", "g", "{}"),
        usage.clone(),
    ];
    assert_eq!(
        coalesced(true, items.clone()),
        vec![started, text("Hello, world"), call(0, "c1", "f", "{\"a\":1}"), call(1, "c2", "g", "{}"), usage]
    );
    assert_eq!(coalesced(false, items.clone()), items, "a streaming client gets every delta as it came");
}

#[test]
fn merged_frames_are_bounded() {
    let chunk = "x".repeat(1000);
    let out = coalesced(true, (0..40).map(|_| text(&chunk)).collect());
    let sizes: Vec<usize> = out
        .iter()
        .map(|e| match e {
            pb::run_event::Event::Text(t) => t.text.len(),
            other => panic!("only text expected, got {other:?}"),
        })
        .collect();
    assert_eq!(sizes.iter().sum::<usize>(), 40_000, "nothing lost");
    assert_eq!(sizes.len(), 3, "{sizes:?}");
    assert!(sizes.iter().all(|&n| n <= COALESCE_BYTES + chunk.len()), "{sizes:?}");
}

#[test]
fn cancel_keeps_the_first_reason() {
    let cancel = Cancel::new();
    assert_eq!(cancel.reason(), pb::CancelReason::ClientDisconnected);
    assert!(!cancel.is_cancelled());
    let clone = cancel.clone();
    clone.cancel(pb::CancelReason::Deadline);
    cancel.cancel(pb::CancelReason::EdgeShutdown);
    assert!(cancel.is_cancelled());
    assert_eq!(cancel.reason(), pb::CancelReason::Deadline);
    assert!(cancel.same(&clone) && !cancel.same(&Cancel::new()));
}
