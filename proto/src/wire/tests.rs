use super::*;

#[test]
fn known_values_decode() {
    let kind: pb::AdapterKind = closed_enum("adapter", 2).unwrap();
    assert_eq!(kind, pb::AdapterKind::Openai);
}

#[test]
fn zero_and_unknown_values_are_typed_errors() {
    assert_eq!(closed_enum::<pb::AdapterKind>("adapter", 0), Err(WireError::Unspecified { field: "adapter" }));
    assert_eq!(
        closed_enum::<pb::AdapterKind>("adapter", 99),
        Err(WireError::UnknownEnumValue { field: "adapter", value: 99 })
    );
}

#[test]
fn terminal_events_are_recognised() {
    let completed = pb::RunEvent {
        seq: 3,
        event: Some(pb::run_event::Event::Completed(pb::RunCompleted { finish_reason: pb::FinishReason::Stop.into() })),
    };
    let text = pb::RunEvent { seq: 2, event: Some(pb::run_event::Event::Text(pb::TextDelta { text: "hi".into() })) };
    assert!(completed.is_terminal());
    assert!(!text.is_terminal());
    assert_eq!(completed.validate(), Ok(()));
    assert_eq!(text.validate(), Ok(()));
}

#[test]
fn evidence_pairs_fail_closed() {
    use pb::{LivenessClassification as C, ProviderHealth as H};
    assert_eq!(evidence_pair(H::Available.into(), C::RequestStalled.into()), (H::Available, C::RequestStalled));
    assert_eq!(
        evidence_pair(H::Unavailable.into(), C::ProviderUnhealthy.into()),
        (H::Unavailable, C::ProviderUnhealthy)
    );
    for (h, c) in [
        (H::Available.into(), C::ProviderUnhealthy.into()),
        (H::Unavailable.into(), C::RequestStalled.into()),
        (0, 0),
        (99, C::RequestStalled.into()),
        (H::Available.into(), 42),
    ] {
        assert_eq!(evidence_pair(h, c), (H::Unknown, C::HealthUnknown), "{h} {c}");
    }
    assert_eq!(classify(H::Available), C::RequestStalled);
    assert_eq!(classify(H::Unspecified), C::HealthUnknown);
}

#[test]
fn hop_by_hop_and_credential_headers_never_cross_a_tunnel() {
    for name in HOP_BY_HOP_HEADERS.iter().chain(CREDENTIAL_HEADERS) {
        assert!(!relayable_request_header(name), "{name}");
        assert!(!relayable_response_header(name), "{name}");
    }
    for name in ["Connection", "transfer-encoding", "Host", "Authorization", "x-api-key", "Content-Length"] {
        assert!(!relayable_request_header(name), "{name}");
        assert!(!relayable_response_header(name), "{name}");
    }
}

#[test]
fn tunnels_relay_only_allowlisted_headers() {
    for name in ["content-type", "Accept", "openai-beta", "anthropic-version", "anthropic-beta", "x-request-id"] {
        assert!(relayable_request_header(name), "{name}");
    }
    for name in [
        "x-forwarded-for",
        "forwarded",
        "x-real-ip",
        "x-http-method-override",
        "x-method-override",
        "metadata-flavor",
        "metadata",
        "x-aws-ec2-metadata-token",
        "x-google-metadata-request",
        "accept-encoding",
        "x-mock-faults",
        "origin",
    ] {
        assert!(!relayable_request_header(name), "{name}");
    }
    for name in [
        "Content-Type",
        "cache-control",
        "x-request-id",
        "retry-after",
        "x-ratelimit-remaining-tokens",
        "anthropic-ratelimit-requests-reset",
    ] {
        assert!(relayable_response_header(name), "{name}");
    }
    for name in ["set-cookie", "Set-Cookie", "openai-organization", "content-encoding", "server", "x-ratelimit-", "via"]
    {
        assert!(!relayable_response_header(name), "{name}");
    }
}

#[test]
fn tunnel_frames_are_validated() {
    use pb::provider_tunnel_frame::Frame;
    let frame = |f| pb::ProviderTunnelFrame { seq: 1, frame: Some(f) };
    assert!(frame(Frame::End(pb::TunnelEnd::default())).is_terminal());
    assert!(!frame(Frame::Body(vec![1])).is_terminal());
    assert!(frame(Frame::Head(pb::TunnelResponseHead { status: 200, headers: vec![] })).validate().is_ok());
    assert!(frame(Frame::Head(pb::TunnelResponseHead { status: 42, headers: vec![] })).validate().is_err());
    assert!(frame(Frame::Cancelled(pb::RunCancelled { reason: 9 })).validate().is_err());
    assert!(pb::ProviderTunnelFrame { seq: 1, frame: None }.validate().is_err());
}

#[test]
fn events_with_unknown_enums_or_missing_parts_are_invalid() {
    let finish = |v| pb::RunEvent {
        seq: 1,
        event: Some(pb::run_event::Event::Completed(pb::RunCompleted { finish_reason: v })),
    };
    assert_eq!(finish(0).validate(), Err(WireError::Unspecified { field: "completed.finish_reason" }));
    assert_eq!(finish(42).validate(), Err(WireError::UnknownEnumValue { field: "completed.finish_reason", value: 42 }));
    let failed = pb::RunEvent { seq: 1, event: Some(pb::run_event::Event::Failed(pb::RunFailed { failure: None })) };
    assert_eq!(failed.validate(), Err(WireError::MissingField { field: "failed.failure" }));
    assert_eq!(
        pb::RunEvent { seq: 1, event: None }.validate(),
        Err(WireError::MissingField { field: "run_event.event" })
    );
}
